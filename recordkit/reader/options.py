"""The reading settings as frozen objects: :class:`ReadOptions` (tuning) and
:class:`CacheOptions` (reading through a shard cache).

The readers (``recordkit.torch.RecordDataset``, ``recordkit.tf.dataset``,
``recordkit.torch.RecordMapDataset``) take a few everyday keywords flat
(``batch_size``, ``shuffle``, ``seed``, ``drop_last``, ``columns``, ``schema``,
``split``, ``records``, ...) and everything else whole, as ``options=ReadOptions(...)``;
their cache as ``cache=``, a :class:`~recordkit.cache.ShardCache` or a
:class:`CacheOptions`. So every setting has exactly one place. The reader hands the
object down whole (to its shard source and its decoder, ``reader/decoders.py``, which
also derives the loader process's decoder settings from it).
Derive a variant with ``dataclasses.replace``::

    fast = ReadOptions(num_threads=8, prefetch=32)
    train = RecordDataset("data/train", batch_size=256, shuffle=True, options=fast)
    val = RecordDataset("data/val", batch_size=256, options=dataclasses.replace(fast, verify=False))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..codec.limits import DecodeLimits
from .ragged import check_ragged_as

__all__ = ["CacheOptions", "ReadOptions", "check_whole_records", "read_options"]

DEFAULT_LOADER_TIMEOUT = 300.0
"""Seconds the training process waits for the loader process's next chunk (see
``recordkit.reader.process.DEFAULT_PROGRESS_TIMEOUT``, the same number)."""

# Which reader reads which field (the rest are read by all): a field set for a reader
# that would ignore it is refused by name (``ReadOptions.check_reader``).
TORCH_ONLY = frozenset(
    {
        "on_error",
        "verify",
        "transform_threads",
        "ragged_as",
        "block_records",
        "window_blocks",
        "prefetch",
        "rank",
        "world_size",
        "pin_memory",
        "reader_process",
        "loader_timeout",
        "raw",
    }
)
TF_ONLY = frozenset({"shuffle_buffer", "deterministic"})
MAP_FIELDS = frozenset({"verify", "limits", "partial", "decode_images", "sequence_example"})
READERS = {
    "recordkit.torch.RecordDataset": "torch",
    "recordkit.tf.dataset": "tf",
    "recordkit.torch.RecordMapDataset": "map",
}


@dataclass(frozen=True)
class ReadOptions:
    """How a reader reads: the tuning of ``recordkit.torch.RecordDataset`` and
    ``recordkit.tf.dataset`` (the everyday settings are their keywords).

    The values are checked when the object is made (the bad value in the message).
    Fields marked *torch* are read by ``RecordDataset`` only, *tf* by
    ``recordkit.tf.dataset`` only; one set (not at its default) for the other
    reader is a ``ValueError`` naming it. ``RecordMapDataset`` reads ``verify``,
    ``limits``, ``partial``, ``decode_images`` and ``sequence_example``.

    Attributes:
        num_threads: reader threads. torch: default the CPUs this process may use,
            divided among ``DataLoader`` workers (all CPUs with ``reader_process``).
            tf: given, an unshuffled pipeline reads through TensorFlow's
            ``TFRecordDataset``, this many shards at once (default 4 for the schemas
            the native path does not take), their records alternating (chunks of
            up to 1024 records or 1 MiB: a fixed order, not the dataset's); ``1``
            reads shard after shard.
        on_error: *torch*. Corrupt records: ``"raise"`` (default) raises
            :class:`~recordkit.errors.CorruptRecordError` naming file, offset and
            record; ``"skip"`` leaves them out (a batch is then short) and counts
            them in ``stats``; ``"warn"`` does the same with a ``RuntimeWarning``.
        transform_threads: *torch*. Run ``transform`` on this many threads, up to
            twice as many items ahead of the consumer (two with ``reader_process``,
            whose shared-memory slots they hold), in order (``0``, the default: in
            the consuming thread). For a transform that releases the GIL, such as
            ``DecodeImages``, this takes it off the training thread.
        bytes_as: a ``Bytes()`` feature (one value per record) in batches:
            ``"padded"``, a zero-padded ``uint8`` tensor ``(N, longest)`` plus
            ``"{name}/lengths"`` (``int64 (N,)``); ``"list"``, the values as they are
            (torch: a list of ``bytes``; tf: a ``tf.string`` tensor ``(N,)``, what
            ``parse_example`` gives). ``None`` (the default): torch ``"padded"``, tf
            ``"list"``. Without ``batch_size``, tf's ``"padded"`` gives each record's
            value as ``uint8 (length,)`` and its length.
        ragged_as: *torch*. ``"padded"`` (with ``"{name}/lengths"``) or ``"list"``,
            for number features with ``None`` dims in batches.
        verify: *torch* (and ``RecordMapDataset``). Check payload CRCs (length
            CRCs are always checked).
        limits: the bytes one record's zstd values, and one reader task's, may
            decompress to (default: derived from the schema; see
            :class:`~recordkit.codec.DecodeLimits`); a record over it is a
            :class:`~recordkit.errors.RecordTooLargeError` (torch: ``on_error``
            applies; tf: it fails the pipeline before the value is allocated).
        block_records: *torch*. Records per shuffle block (0: about 64 KiB worth).
        window_blocks: *torch*. Blocks whose records are mixed together (8192).
        prefetch: *torch*. Decode tasks in flight ahead of the consumer (default: 2
            per thread).
        rank: *torch*. This process's rank; default ``torch.distributed``'s, else 0.
        world_size: *torch*. Number of ranks; default ``torch.distributed``'s, else 1.
        pin_memory: *torch*. Decode straight into page-locked (pinned) buffers, so a
            batch can be copied to the GPU asynchronously with no staging copy (see
            ``DevicePrefetcher``). Only in the process that iterates without
            ``DataLoader`` workers, and only where an accelerator is present;
            elsewhere ordinary memory is used (logged at INFO).
        reader_process: *torch*. Decode in a separate spawned loader process (its own
            GIL) that hands chunks over through shared memory, zero-copy and
            without pickling arrays (:mod:`recordkit.reader.process`); for a
            training step whose Python holds the GIL. Not inside ``DataLoader``
            workers. Keep (``clone()``) batches you hold on to across many steps: a
            few chunks' worth may be held at a time.
        loader_timeout: *torch*. With ``reader_process``: seconds the training process
            waits for the loader's next chunk before it kills the loader and raises
            :class:`~recordkit.errors.LoaderTimeoutError` (a stopped or wedged
            loader); default 300, which one stall of a hard NFS mount (about 180 s)
            does not trip; ``None``: wait forever.
        partial: read a directory where a write did not finish (the shards it
            published, with a WARNING) instead of raising
            :class:`~recordkit.errors.IncompleteDatasetError`.
        decode_images: ``True``: in a tensorflow-datasets folder, decode ``Image``
            features (torch: to ``uint8`` arrays on the reader threads, with Pillow;
            tf: with ``tf.io.decode_image``). tf also takes a name, names or an
            :class:`~recordkit.images.ImageOptions`: ``Bytes()`` features of any
            data holding encoded images, decoded per record into ``uint8``
            ``[H, W, C]`` (see ``recordkit.tf.dataset``); torch decodes those with
            the ``DecodeImages`` transform.
        sequence_example: the records are ``tf.train.SequenceExample`` messages,
            read whole; implied when the manifest says so (``recordkit convert`` of
            them). torch: as :class:`recordkit.Dataset` reads them (``{"context":
            {name: value}, "feature_lists": {name: [step, ...]}}``, number lists as
            tensors, bytes lists as ``list[bytes]``, steps ragged), decoded on the
            reader threads; with ``batch_size`` a batch is a ``list`` of such samples
            (pad them in ``transform``). Without it, a SequenceExample is a
            :class:`~recordkit.errors.SequenceExampleError`, never its context
            alone. tf: see ``recordkit.tf.dataset``.
        raw: *torch*. Read each Example as stored, as ``rk.Dataset(raw=True)`` does
            (its own keys, ``bytes`` lists as ``list[bytes]``, number lists as 1-d
            tensors), for foreign data no schema fits; with ``batch_size`` a batch
            is a ``list`` of such samples. No schema, columns or ``reader_process``.
        weights: with a list of datasets, sample them in these proportions: an
            epoch of ``epoch_records`` records of which each dataset gives its
            share, a smaller one repeated (each pass a fresh permutation, without
            replacement within a pass), a larger one subsampled (different records
            each epoch); see ``docs/howto/mixing.md``.
        epoch_records: records per epoch with ``weights`` (default: the datasets'
            records together); alone, natural proportions.
        shuffle_buffer: *tf*. Records in TensorFlow's shuffle buffer, used only
            where the plan is not (a growing shard cache, ``gs://``,
            SequenceExamples).
        deterministic: *tf*. Keep the order fixed; ``False`` lets TensorFlow trade
            order for speed where it interleaves files.
    """

    num_threads: int | None = None  # None: sized from the CPUs where the reader runs
    on_error: Literal["raise", "skip", "warn"] = "raise"  # silent loss is opt-in
    transform_threads: int = 0  # the consuming thread: no threads unless asked for
    bytes_as: Literal["padded", "list"] | None = None
    ragged_as: Literal["padded", "list"] = "padded"
    verify: bool = True  # a CRC costs little next to a silently corrupt batch
    limits: DecodeLimits | None = None  # None: derived from the schema
    block_records: int = 0  # 0: about 64 KiB of records per block (sequential reads)
    window_blocks: int = 8192  # enough blocks to mix sorted data like a permutation
    prefetch: int | None = None  # None: 2 per thread, which keeps every thread busy
    rank: int | None = None  # None: torch.distributed's
    world_size: int | None = None
    pin_memory: bool = False
    reader_process: bool = False
    loader_timeout: float | None = DEFAULT_LOADER_TIMEOUT
    partial: bool = False  # an unfinished write is an error unless asked for
    # Any: also an ImageOptions (recordkit.images sits a floor above the reader)
    decode_images: bool | str | Sequence[str] | Any = False
    sequence_example: bool = False
    raw: bool = False
    weights: Sequence[float] | None = None
    epoch_records: int | None = None
    shuffle_buffer: int = 10_000  # TensorFlow's buffer: ~10k records mix well, cost little
    deterministic: bool = True  # reproducible unless speed is asked for

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip", "warn"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', got {self.on_error!r}")
        if self.bytes_as not in (None, "padded", "list"):
            raise ValueError(f"bytes_as must be 'padded', 'list' or None, got {self.bytes_as!r}")
        check_ragged_as(self.ragged_as)
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}")
        if self.transform_threads < 0:
            raise ValueError(f"transform_threads must be >= 0, got {self.transform_threads}")
        if self.loader_timeout is not None and not self.loader_timeout > 0:
            raise ValueError(f"loader_timeout must be > 0 or None, got {self.loader_timeout!r}")
        if self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {self.shuffle_buffer}")
        if self.sequence_example and self.raw:
            raise ValueError("sequence_example=True and raw=True: choose one")
        if self.weights is not None:
            object.__setattr__(self, "weights", tuple(self.weights))

    def check_reader(self, reader: str) -> None:
        """Refuse the fields ``reader`` (a key of ``READERS``) would ignore, by name.

        Raises:
            ValueError: a field the reader does not read is set (not at its default).
        """
        kind = READERS[reader]
        if kind == "torch":
            unused = TF_ONLY
        elif kind == "tf":
            unused = TORCH_ONLY
        else:
            unused = frozenset(f.name for f in dataclasses.fields(self)) - MAP_FIELDS
        if kind != "tf" and not isinstance(self.decode_images, bool):
            raise ValueError(
                f"ReadOptions(decode_images={self.decode_images!r}): {reader} takes True or "
                "False (a tensorflow-datasets folder's Image features); decode named Bytes() "
                "features with the recordkit.torch.DecodeImages transform"
            )
        given = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name in unused and getattr(self, f.name) != f.default
        ]
        if given:
            raise ValueError(
                f"ReadOptions({', '.join(given)}): {reader} does not read "
                f"{'this setting' if len(given) == 1 else 'these settings'} "
                "(see the ReadOptions field docs for which reader reads which)"
            )


@dataclass(frozen=True)
class CacheOptions:
    """How a reader reads a remote dataset through a local shard cache it makes
    (``cache=CacheOptions(...)``; see ``docs/cache.md``). A reader given a
    :class:`~recordkit.cache.ShardCache` as ``cache=`` reads through that one,
    with the defaults below for ``epochs`` and ``timeout``.

    Attributes:
        dir: cache the remote path in this directory.
        limit: the disk budget for ``dir`` (bytes or ``"50GiB"``).
        epochs: ``"whole"`` (default): every epoch reads every record of the
            remote dataset in the plan's order; the shards the plan needs next are
            fetched ahead of the readers within the budget (a read-ahead window),
            those the epoch is done with are evicted first, and ``len()`` is the
            whole dataset's. The remote needs a manifest. Shuffled under a budget
            smaller than the dataset, the epoch is read in shard windows sized
            from the budget (``docs/howto/shuffle.md``). ``"growing"``: each epoch
            reads the shards complete in the cache when it starts (a started cache
            fills in the background), so epochs grow as the cache fills; each
            epoch says at WARNING how much it reads.
        timeout: seconds a reader waits for one shard (whole epochs) or an epoch
            start for a first complete shard (growing epochs); ``None``: no limit.
        cache: a :class:`recordkit.cache.ShardCache` to read through instead of
            ``dir`` (to give ``epochs`` or ``timeout`` with one).
    """

    dir: str | os.PathLike[str] | None = None
    limit: int | str | None = None
    epochs: Literal["whole", "growing"] = "whole"  # the plan's records, every epoch
    timeout: float | None = 600.0  # long enough for a slow remote shard, not forever
    cache: Any = None  # a ShardCache (Any: the cache package is not imported here)

    def __post_init__(self) -> None:
        # The messages name the settings as the docs do: cache_dir, cache_limit, ...
        if self.epochs not in ("whole", "growing"):
            raise ValueError(
                "CacheOptions(epochs=...): cache_epochs must be one of ('whole', 'growing'), "
                f"got {self.epochs!r}"
            )
        if self.cache is not None and self.dir is not None:
            raise ValueError("CacheOptions: give cache= (a ShardCache) or dir=, not both")
        if self.limit is not None and self.dir is None:
            raise ValueError(
                "CacheOptions(limit=...) without dir=: the cache_limit is the budget of a "
                "cache_dir (a ShardCache given as cache= has its own)"
            )
        if self.dir is not None and self.limit is None:
            raise ValueError(
                "CacheOptions(dir=...) needs limit=, the cache_limit (the disk budget, "
                "e.g. '50GiB')"
            )

    @classmethod
    def of(cls, cache: Any) -> CacheOptions:
        """The ``cache=`` argument of a reader as a :class:`CacheOptions`: ``None``
        (no cache), a ``CacheOptions``, or a ``ShardCache`` read with the defaults.

        Raises:
            TypeError: something else.
        """
        if cache is None:
            return cls()
        if isinstance(cache, cls):
            return cache
        from ..cache import ShardCache

        if isinstance(cache, ShardCache):
            return cls(cache=cache)
        raise TypeError(f"cache= takes a ShardCache or a CacheOptions, got {type(cache).__name__}")

    @property
    def used(self) -> bool:
        """Whether a cache is named (``cache`` or ``dir``)."""
        return self.cache is not None or self.dir is not None


def read_options(options: ReadOptions | None, reader: str) -> ReadOptions:
    """The ``options=`` argument of ``reader``: checked, ``None`` the defaults.

    Raises:
        TypeError: not a :class:`ReadOptions`.
        ValueError: a field ``reader`` does not read is set.
    """
    if options is None:
        return ReadOptions()
    if not isinstance(options, ReadOptions):
        raise TypeError(f"options= takes a ReadOptions, got {type(options).__name__}")
    options.check_reader(reader)
    return options


def check_whole_records(
    options: ReadOptions, schema: object | None, columns: Sequence[str] | None
) -> None:
    """Refuse what a reader of whole records (``sequence_example``, ``raw``) cannot
    take, and ``columns`` given as one string.

    Raises:
        ValueError: a schema, columns or decode_images with records read whole.
        TypeError: ``columns`` is a ``str``.
    """
    if (options.sequence_example or options.raw) and (
        schema is not None or columns is not None or options.decode_images
    ):
        what = "sequence_example=True" if options.sequence_example else "raw=True"
        raise ValueError(f"{what} reads records whole: no schema, columns or decode_images")
    if isinstance(columns, str):
        raise TypeError(f"columns must be a sequence of names, got {columns!r}")
