"""PyTorch integration: a memory-mapped, thread-based ``IterableDataset``.

``RecordDataset`` reads shards through ``mmap`` and their indexes, and a pool of
reader threads verifies CRCs, decodes and assembles whole batches in native code
with the GIL released, off the training thread. Output order is a pure function
of (seed, epoch, rank, world size, shard set) — see :mod:`recordkit.reader.plan` —
and, with ``batch_size`` set, does not depend on the number of ``DataLoader``
workers or reader threads.

Batch layout (``batch_size`` set): a ``dict`` of ``torch.Tensor``, one per feature:

- fixed-shape ``Int64`` / ``Float32`` / ``Tensor`` features: ``(batch, *shape)``;
- ``Bytes()``: a zero-padded ``uint8`` tensor ``(batch, longest)`` plus
  ``"{name}/lengths"`` (``int64``, ``(batch,)``), with ``bytes_as="padded"`` (the
  default: one copy, no Python objects per record); a ``list`` of ``bytes`` with
  ``bytes_as="list"``;
- features with ``None`` in their shape, and ``Bytes`` lists: a ``list`` with one
  tensor (or list of ``bytes``) per record.

Without ``batch_size`` the dataset yields single samples: every number feature a
tensor of its shape (0-d for scalars, the record's own shape where it has ``None``
dims), ``Bytes()`` as ``bytes``, ``Bytes`` lists as lists of ``bytes``. Let recordkit
batch (faster, and the order is independent of workers), or batch samples with
``DataLoader(ds, batch_size=N, collate_fn=ds.collate)``, which gives the same layout;
a plain ``DataLoader`` collates fixed-shape features and ``Bytes()`` (as a list).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ._deps import require

torch = require("torch", extra="torch")

from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402

from ._devcopy import can_pin as _can_pin  # noqa: E402
from ._devcopy import pinned_slab as _pinned_slab  # noqa: E402
from ._origins import Origins, ordered_map  # noqa: E402
from ._torch_collate import chunk_batches, chunk_samples, chunk_sequences, collate  # noqa: E402
from ._torch_images import DecodeImages  # noqa: E402
from ._torch_loader import DataLoader  # noqa: E402
from ._torch_map import RecordMapDataset  # noqa: E402
from .codec.limits import DecodeLimits  # noqa: E402
from .codec.schema import Schema  # noqa: E402
from .prefetch import DevicePrefetcher  # noqa: E402
from .reader.buffers import BufferPool  # noqa: E402
from .reader.decode import BatchDecoder  # noqa: E402
from .reader.epochs import CacheEpochs, WholeEpochs, open_cache  # noqa: E402
from .reader.local import OPEN_LOCK as _OPEN_LOCK  # noqa: E402
from .reader.local import ProcessLocalShards  # noqa: E402
from .reader.mix import make_mix, open_sources, refuse_cache, sources  # noqa: E402
from .reader.pipeline import Chunk, OnError, ReaderStats, RecordReader  # noqa: E402
from .reader.plan import EpochPlan, PlanOptions, Split  # noqa: E402
from .reader.position import (  # noqa: E402
    RESUME_KEYS,
    EpochCell,
    Pass,
    WorkerPosition,
    check_state,
    check_worker,
    pass_key,
    saved_state,
)
from .reader.process import DEFAULT_PROGRESS_TIMEOUT, ProcessReader  # noqa: E402
from .reader.select import take_split  # noqa: E402
from .reader.sequence import SequenceBatchDecoder, read_whole  # noqa: E402
from .reader.shards import ShardSet  # noqa: E402
from .reader.tfds import TFDSBatchDecoder, TFDSInfo  # noqa: E402

if TYPE_CHECKING:
    from .cache import ShardCache

__all__ = [
    "DataLoader",
    "DecodeImages",
    "DevicePrefetcher",
    "RecordDataset",
    "RecordMapDataset",
    "collate",
]

log = logging.getLogger(__name__)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _smallest(value: int) -> int:
    """The smallest of every ``torch.distributed`` rank's ``value`` (or ``value`` alone)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def _common_shards(paths: list[str]) -> set[str]:
    """The shards every ``torch.distributed`` rank has (each rank's cache differs).

    Exchanged as JSON bytes in uint8 tensors (no pickling), so every rank plans
    the epoch over the same shard set.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return set(paths)
    data = torch.frombuffer(bytearray(json.dumps(sorted(paths)).encode()), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
    width = int(max(int(x) for x in sizes))
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[: len(data)] = data
    gathered = [torch.zeros(width, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(gathered, padded)
    common = set(paths)
    for g, n in zip(gathered, sizes):
        common &= set(json.loads(bytes(g[: int(n)].tolist()).decode()))
    return common


class RecordDataset(ProcessLocalShards, IterableDataset):  # type: ignore[type-arg]
    """Stream a recordkit dataset (or a folder of TFRecords) into PyTorch.

    Args:
        path_or_url: a dataset directory, a folder of ``.tfrecord`` files, or one
            file, on local disk (remote URLs: fill a local copy or cache first);
            or a list of them, read as one (``docs/howto/mixing.md``): every
            record of each once per epoch, shuffled together; their schemas
            must agree on the features read (else a
            :class:`~recordkit.errors.SchemaError` naming the feature).
        records: read only these records, the same every epoch (shuffled among
            themselves): ``slice(0, 10_000)`` or a split string, ``"[:10%]"``,
            ``"[1000:2000]"``, ``"train[:10%]"`` (tensorflow-datasets' split
            syntax; the name is ``split=``). For a list of datasets, a list of
            one range (or ``None``) per dataset.
        weights: with a list of datasets, sample them in these proportions: an
            epoch of ``epoch_records`` records of which each dataset gives its
            share, a smaller one repeated (each pass a fresh permutation,
            without replacement within a pass), a larger one subsampled
            (different records each epoch); see ``docs/howto/mixing.md``.
        epoch_records: records per epoch with ``weights`` (default: the datasets'
            records together); alone, natural proportions.
        batch_size: records per batch; ``None`` yields single samples.
        shuffle: a new seeded order every epoch that mixes sorted data like a
            uniform permutation while reading in blocks (see ``docs/howto/shuffle.md``).
        seed: shuffle seed.
        num_threads: reader threads; default: the CPUs this process may use,
            divided among ``DataLoader`` workers.
        drop_last: make every rank see the same number of full batches (drops
            the tail of the shuffled epoch); without it every record is read
            exactly once and the last batch of a rank may be short.
        on_error: corrupt records: ``"raise"`` (default) raises
            :class:`~recordkit.errors.CorruptRecordError` naming file, offset and
            record; ``"skip"`` leaves them out (a batch is then short) and counts
            them in :attr:`stats`; ``"warn"`` does the same with a ``RuntimeWarning``.
        columns: read only these features.
        transform: applied to each batch (or sample) before it is yielded, in
            the consuming thread (or DataLoader worker), or on
            ``transform_threads`` threads. While it runs, the item's records are
            known (:class:`DecodeImages` names the ``file:offset:record`` of an
            image that does not decode).
        transform_threads: run ``transform`` on this many threads, up to twice
            as many items ahead of the consumer (two with ``reader_process``,
            whose shared-memory slots they hold), in order (``0``, the default:
            in the consuming thread). For a transform that releases the GIL,
            such as :class:`DecodeImages`, this takes it off the training thread.
        bytes_as: ``"padded"`` or ``"list"``, for ``Bytes()`` features in batches.
        verify: check payload CRCs (length CRCs are always checked).
        limits: the bytes one record's zstd values, and one reader task's, may
            decompress to (default: derived from the schema; see
            :class:`~recordkit.codec.DecodeLimits`); a record over it is a
            :class:`~recordkit.errors.RecordTooLargeError` (``on_error`` applies).
        schema: overrides the manifest's (or the inferred) schema.
        block_records: records per shuffle block (0: about 64 KiB worth).
        window_blocks: blocks whose records are mixed together (8192).
        prefetch: decode tasks in flight ahead of the consumer (default: 2 per thread).
        pin_memory: decode straight into page-locked (pinned) buffers, so a batch
            can be copied to the GPU asynchronously with no staging copy (see
            :class:`DevicePrefetcher`). Only in the process that iterates
            without ``DataLoader`` workers, and only where an accelerator is
            present; elsewhere ordinary memory is used (logged at INFO).
        reader_process: decode in a separate spawned loader process (its own
            GIL) that hands chunks over through shared memory, zero-copy and
            without pickling arrays (:mod:`recordkit.reader.process`); for a
            training step whose Python holds the GIL. ``num_threads`` then
            defaults to all CPUs (the threads run in that process). Not inside
            ``DataLoader`` workers. Keep (``clone()``) batches you hold on to
            across many steps: a few chunks' worth may be held at a time.
        loader_timeout: with ``reader_process``: seconds the training process
            waits for the loader's next chunk before it kills the loader and
            raises :class:`~recordkit.errors.LoaderTimeoutError` (a stopped or
            wedged loader); default 300, which one stall of a hard NFS mount
            (about 180 s) does not trip; ``None``: wait forever.
        rank: this process's rank; default ``torch.distributed``'s, else 0.
        world_size: number of ranks; default ``torch.distributed``'s, else 1.
        cache: read the remote dataset through this
            :class:`recordkit.cache.ShardCache`; ``path_or_url`` is then only a
            label. How epochs read it: ``cache_epochs``. See ``docs/cache.md``.
        cache_dir: instead of ``cache``: cache the remote ``path_or_url`` in
            this directory, with ``cache_limit`` bytes (e.g. ``"50GiB"``).
        cache_limit: the disk budget for ``cache_dir``.
        cache_epochs: ``"whole"`` (default): every epoch reads every record of
            the remote dataset in the plan's order; the shards the plan needs
            next are fetched ahead of the readers within the budget (a
            read-ahead window), those the epoch is done with are evicted first,
            and ``len()`` is the whole dataset's. The remote needs a manifest.
            Shuffled under a budget smaller than the dataset, the epoch is read
            in shard windows sized from the budget (``docs/howto/shuffle.md``).
            ``"growing"``: each epoch reads the shards complete in the cache
            when it starts (a started cache fills in the background), so epochs
            grow as the cache fills; each epoch says at WARNING how much it
            reads. With ``torch.distributed`` the ranks read the shards every
            rank's cache holds.
        cache_timeout: seconds a reader waits for one shard (whole epochs) or
            an epoch start for a first complete shard (growing epochs);
            ``None``: no limit.
        partial: read a directory where a write did not finish (the shards it
            published, with a WARNING) instead of raising
            :class:`~recordkit.errors.IncompleteDatasetError`.
        split: the split of a tensorflow-datasets folder (see
            :class:`recordkit.Dataset`): batches then hold tfds's dtypes and
            shapes (``Text`` as lists of ``str``), and ``columns`` names tfds's
            features. Such records are decoded on reader threads by the threaded
            path (not the native whole-task runner).
        decode_images: in a tensorflow-datasets folder, decode ``Image``
            features to ``uint8`` arrays on the reader threads (Pillow).
        sequence_example: the records are ``tf.train.SequenceExample`` messages: read
            each whole, as :class:`recordkit.Dataset` does with the same option
            (``{"context": {name: value}, "feature_lists": {name: [step, ...]}}``,
            number lists as tensors, bytes lists as ``list[bytes]``, steps ragged),
            decoded on the reader threads. With ``batch_size`` a batch is a
            ``list`` of such samples (pad them in ``transform``). Without it, a
            SequenceExample is a :class:`~recordkit.errors.SequenceExampleError`,
            never its context alone. Implied when the manifest says the records
            are SequenceExamples (``recordkit convert`` of them).

    Attributes:
        stats: a :class:`~recordkit.reader.pipeline.ReaderStats` of this process.
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        num_threads: int | None = None,
        drop_last: bool = False,
        on_error: OnError = "raise",
        columns: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        transform_threads: int = 0,
        bytes_as: Literal["padded", "list"] = "padded",
        verify: bool = True,
        limits: DecodeLimits | None = None,
        schema: Schema | None = None,
        block_records: int = 0,
        window_blocks: int = 8192,
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pin_memory: bool = False,
        reader_process: bool = False,
        loader_timeout: float | None = DEFAULT_PROGRESS_TIMEOUT,
        cache: ShardCache | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        cache_epochs: Literal["whole", "growing"] = "whole",
        cache_timeout: float | None = 600.0,
        partial: bool = False,
        split: str | None = None,
        decode_images: bool = False,
        sequence_example: bool = False,
        records: slice | str | Sequence[slice | str | None] | None = None,
        weights: Sequence[float] | None = None,
        epoch_records: int | None = None,
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "skip", "warn"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', got {on_error!r}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
        self.paths, self.path = sources(path_or_url)
        split, records = take_split(split, records)
        if cache is not None or cache_dir is not None:
            refuse_cache(self.path, self.paths, records, weights, epoch_records)
        self.partial = partial
        self.split = split
        self.decode_images = decode_images
        self.sequence_example = sequence_example
        if sequence_example:
            if schema is not None or columns is not None or decode_images:
                raise ValueError(
                    "sequence_example=True reads records whole: no schema, columns or decode_images"
                )
            schema = Schema({})  # opens foreign data without inferring an Example schema
        given = schema
        self.options = PlanOptions(
            shuffle=shuffle,
            seed=seed,
            block_records=block_records,
            window_blocks=window_blocks,
            batch_size=batch_size,
            drop_last=drop_last,
        )
        self.num_threads = num_threads
        self.on_error: OnError = on_error
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        if transform_threads < 0:
            raise ValueError(f"transform_threads must be >= 0, got {transform_threads}")
        self.transform_threads = transform_threads
        self.bytes_as = bytes_as
        self.verify = verify
        self.limits = limits
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.reader_process = reader_process
        if loader_timeout is not None and not loader_timeout > 0:
            raise ValueError(f"loader_timeout must be > 0 or None, got {loader_timeout!r}")
        self.loader_timeout = loader_timeout
        self._rank, self._world = rank, world_size
        self._cell = EpochCell(0)  # shared with DataLoader workers' copies
        self.stats = ReaderStats()
        self._resume: tuple[int, int] | None = None  # a rank's (epoch, units consumed)
        self._worker_resume: WorkerPosition | None = None  # loaded in a DataLoader worker
        self._pass: Pass | None = None  # the pass this process reads (or left unfinished)
        self._passes = 0  # passes started in this process: a persistent worker's pass id
        self._fixed = False  # in worker_pass(): the epoch's shard set is fixed for the workers
        if (cache is not None or cache_dir is not None) and (split is not None or decode_images):
            raise ValueError(
                f"{self.path}: split= and decode_images= are for a local tensorflow-datasets "
                "folder, not a dataset read through a shard cache"
            )
        self._init_cache(cache, cache_dir, cache_limit, cache_timeout, cache_epochs)
        if schema is not None:  # opening with it: foreign data is not inferred (and refused)
            self.schema = schema
        shards = self._open()  # fail early, in the main process, on a bad path or schema
        if not sequence_example:  # a dataset of SequenceExamples says so in its manifest
            self.sequence_example = read_whole(
                self.path, False, shards, given, columns, decode_images
            )
        self.schema = schema or shards.schema
        self._decoder()  # validates columns against the schema
        mix = make_mix(shards, records=records, weights=weights, epoch_records=epoch_records)
        self.options = dataclasses.replace(self.options, mix=mix)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if "_epochs" in state:  # workers read the epoch's set; the training process pins it
            state["cache"] = state["_epochs"] = None
        if "_whole" in state:  # ... or streams the shards in (the shard set's gate waits)
            state["_whole"] = None
        return state

    # -- the shard cache ---------------------------------------------------------------

    def _init_cache(
        self,
        cache: ShardCache | None,
        cache_dir: str | os.PathLike[str] | None,
        cache_limit: int | str | None,
        timeout: float | None,
        mode: str,
    ) -> None:
        source = open_cache(
            self.path,
            cache=cache,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            timeout=timeout,
            mode=mode,
            agree=_common_shards,
            agree_min=_smallest,
        )
        self._whole = source if isinstance(source, WholeEpochs) else None
        self._epochs = source if isinstance(source, CacheEpochs) else None
        self.cache: ShardCache | None = source.cache if source is not None else None
        self.cache_epochs: str | None = mode if source is not None else None
        self._window = self._whole.window_bytes(self.options.shuffle) if self._whole else 0
        # growing epochs: the shard set changes per epoch (also true in workers, which
        # have no cache); whole epochs read one fixed set, the remote's whole catalog
        self._cached = self._epochs is not None
        self._fresh = False  # the epoch taken last is not yet started
        self._resume_shards: list[str] | None = None

    def close(self) -> None:
        """Release the cache pins and maps (and stop a cache made from ``cache_dir``)."""
        self._let_go()
        if self._epochs is not None:
            self._epochs.close()
        if self._whole is not None:
            self._whole.close()

    def _let_go(self) -> None:
        """Unmap this process's shards, then unpin them (in that order: never unmapped
        after an eviction could have unlinked them)."""
        with _OPEN_LOCK:  # the next _open() maps anew
            if self._shards is not None and self._pid == os.getpid():
                self._shards.close()
            self._shards = None
        if self._epochs is not None:
            self._epochs.let_go()

    def _open_shards(self) -> ShardSet:
        if self._whole is not None:
            return self._whole.shard_set(getattr(self, "schema", None))
        if not self._cached:
            return open_sources(
                self.paths,
                getattr(self, "schema", None),
                columns=self.columns,
                partial=getattr(self, "partial", False),
                split=self.split,
            )
        if self._epochs is None:
            raise RuntimeError(
                "a cached RecordDataset in DataLoader workers needs recordkit.torch.DataLoader "
                "(it fixes each epoch's shard set in the training process)"
            )
        epoch = self.epoch
        want = self._resume_shards if self._resume and self._resume[0] == epoch else None
        taken = self._epochs.take(epoch, want)
        self._fresh = True
        return ShardSet(taken.root, taken.manifest, taken.infos, getattr(self, "schema", None))

    def _start_epoch(self, epoch: int) -> None:
        """At the start of a pass in the training process: rescan the cache (growing
        epochs), or end the last pass's stream (whole epochs)."""
        if self._whole is not None and get_worker_info() is None:
            self._whole.end()
        if self._epochs is None or get_worker_info() is not None:
            return
        current = self._epochs.current
        if not (self._fresh and current is not None and current.epoch == epoch):
            self._let_go()  # the last set goes first: this epoch's may have to displace it
            self._open()
        self._fresh = False

    def _releaser(self, plan: EpochPlan, split: Split, start: int) -> Callable[[int], None] | None:
        """Cache mode: unmap and unpin each shard once this rank has read its last unit.

        Whole epochs start the pass here (the stream that fetches ahead); in a
        DataLoader worker or the loader process only this process's maps go.
        """
        if self._whole is not None and get_worker_info() is None:
            begun = self._whole.begin(plan, split.rank, split.world_size, start, self._open())
            return begun.release
        if self.cache_epochs == "whole":  # a worker: the training process streams and pins
            shards = self._open()
            last = plan.last_units(split.rank, split.world_size, len(shards))
            order = iter(np.argsort(last, kind="stable").tolist())
            pending = [next(order, None)]

            def unmap(unit: int) -> None:
                while pending[0] is not None and last[pending[0]] <= unit:
                    shards.evict(pending[0])
                    pending[0] = next(order, None)

            return unmap
        if self._epochs is None or get_worker_info() is not None:
            return None  # a DataLoader worker: the training process holds the pins
        shards = self._open()
        last = plan.last_units(split.rank, split.world_size, len(shards))
        return self._epochs.releaser(last, start, shards.evict)

    # -- process-local state ---------------------------------------------------------

    def _opened(self) -> None:
        self._pool = self._make_pool()  # batch buffers are per process too

    def _make_pool(self) -> BufferPool:
        if not self.pin_memory:
            return BufferPool()
        if get_worker_info() is not None:
            log.info("pin_memory: not in DataLoader workers (batches cross processes)")
        elif not _can_pin():
            log.info("pin_memory: no accelerator, so batches use ordinary memory")
        else:
            # Every array pinned (min_bytes=0): a batch then needs no staging copy.
            return BufferPool(allocate=_pinned_slab, min_bytes=0)
        return BufferPool()

    def _decoder(self) -> BatchDecoder:
        if self.sequence_example:
            return SequenceBatchDecoder(verify=self.verify)
        view = self._view()
        if view is not None:
            return TFDSBatchDecoder(
                view,
                columns=self.columns,
                verify=self.verify,
                bytes_as=self.bytes_as,
                limits=self.limits,
            )
        return BatchDecoder(
            self.schema,
            columns=self.columns,
            verify=self.verify,
            bytes_as=self.bytes_as,
            limits=self.limits,
        )

    def _split(self) -> Split:
        rank, world = self._rank, self._world
        if rank is None or world is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world = dist.get_world_size() if world is None else world
        info = get_worker_info()
        return Split(
            rank=rank or 0,
            world_size=world or 1,
            worker=info.id if info else 0,
            num_workers=info.num_workers if info else 1,
        )

    def _plan(self, epoch: int) -> EpochPlan:
        shards = self._open()
        options = self.options
        if self._window:
            options = dataclasses.replace(options, shard_window_bytes=self._window)
        return EpochPlan(
            shards.counts,
            options,
            epoch,
            avg_record_bytes=shards.avg_record_bytes,
            shard_bytes=shards.nbytes,
        )

    # -- public API --------------------------------------------------------------------

    def resume_point(self) -> int:
        """Units of the current epoch that the next pass skips (set by :meth:`load_state_dict`)."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1]
        return 0

    @contextlib.contextmanager
    def worker_pass(self) -> Iterator[int]:
        """Start a pass whose iterating is done by copies of this dataset in worker processes.

        For loaders that run ``DataLoader`` workers (:class:`DataLoader` uses it):
        start the workers inside the ``with`` block. It fixes the epoch's shard set
        (cache mode) before they copy the dataset, yields the units already
        consumed (the resume point the copies start from), and spends the resume
        point when the block ends, so a later pass starts at the epoch's beginning.
        """
        start = self.resume_point()
        self._start_epoch(self.epoch)
        if self._whole is not None:  # whole epochs: this process streams the shards in
            split = self._split()
            plan = self._plan(self.epoch)
            self._whole.begin(plan, split.rank, split.world_size, start, self._open())
        self._fixed = True  # the copies read the set fixed here (cache mode)
        try:
            yield start
        finally:
            self._resume = None
            self._fixed = False

    def _delivered(self, unit: int) -> None:
        """A loader with workers yielded unit ``unit`` of this rank (whole epochs: the
        shards that no later unit reads can go)."""
        if self._whole is not None and self._whole.pass_ is not None:
            self._whole.pass_.release(unit)

    def _end_pass(self) -> None:
        """A loader with workers ended its pass (whole epochs: the stream stops)."""
        if self._whole is not None:
            self._whole.end()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads.

        It advances by itself after a full pass, in this process or in ``DataLoader``
        workers (they share it with this object, persistent or not);
        :meth:`set_epoch` sets it.
        """
        return self._cell.get()

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._cell.set(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its shuffle order), as ``DistributedSampler.set_epoch``."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch
        self._pass = None

    def __len__(self) -> int:
        """Batches (or samples) this rank reads per epoch, over all its DataLoader workers."""
        split = self._split()
        return self._plan(self.epoch).unit_count(split.rank, split.world_size)

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is None:
            return self._iter_here()
        # In a DataLoader worker the pass starts now, when the worker makes its
        # iterator: the state the loader asks for before the first batch is its start.
        split = self._split()
        p = self._begin_worker_pass(split)
        return self._iter_pass(p, split)

    def _iter_here(self) -> Iterator[Any]:
        """A pass in this process (no DataLoader workers); it starts at the first ``next()``."""
        epoch = self.epoch
        start = self.resume_point()
        self._start_epoch(epoch)  # cache mode: this epoch's shards (before _resume goes)
        self._resume = None
        p = self._pass = Pass(epoch, start)
        yield from self._iter_pass(p, self._split())
        if self.epoch == epoch:
            self.epoch = epoch + 1  # a full pass: the next iteration reads the next epoch
        if self._pass is p:
            self._pass = None  # the state now points at the next epoch's start

    def _begin_worker_pass(self, split: Split) -> Pass:
        """A worker's pass: a restored position, or the rank's resume point dealt to it."""
        info = get_worker_info()
        assert info is not None
        self._passes += 1
        if self._worker_resume is not None:
            epoch, first = self._worker_resume.epoch, self._worker_resume.next
        else:
            epoch = self.epoch
            first = self.resume_point() + split.worker
        self._worker_resume = self._resume = None  # spent (in this copy: persistent workers)
        if self.cache_epochs is not None and not self._fixed:
            raise RuntimeError(
                "a cached RecordDataset in DataLoader workers needs recordkit.torch.DataLoader "
                "(it takes each epoch's shards from the cache in the training process, or "
                "streams them in there for whole epochs); with another loader (torchdata's "
                "StatefulDataLoader) use num_workers=0: the dataset reads with threads"
            )
        key = pass_key(info.seed - info.id, self._passes, epoch)
        p = self._pass = Pass(epoch, first, split.num_workers, split.worker, key)
        if first >= self._plan(epoch).unit_count(split.rank, split.world_size):
            self._finish(p, split)  # nothing (left) to read: finished before it starts
        return p

    def _finish(self, p: Pass, split: Split) -> None:
        """This worker handed over its last unit of the epoch (or had none)."""
        if not p.finished:
            p.finished = True
            self._cell.finish(p.worker, split.num_workers, p.key, p.epoch)

    def _iter_pass(self, p: Pass, split: Split) -> Iterator[Any]:
        plan = self._plan(p.epoch)
        threads = self.num_threads or max(1, _cpus() // split.num_workers)
        reader: RecordReader | ProcessReader
        if self.reader_process:
            if self.sequence_example:
                raise ValueError("reader_process=True does not read SequenceExamples yet")
            if self._view() is not None:
                raise ValueError(
                    "reader_process=True does not read tensorflow-datasets folders yet; "
                    "convert the split (recordkit convert --from tfrecord DIR DEST -o "
                    "split=NAME) or read it with threads"
                )
            if get_worker_info() is not None:
                raise ValueError(
                    "reader_process=True inside DataLoader workers: use one or the other"
                )
            shards = self._open()
            reader = ProcessReader(
                self.path,
                self.schema,
                shards.fingerprint(),
                decoder={
                    "columns": self.columns,
                    "verify": self.verify,
                    "bytes_as": self.bytes_as,
                    "limits": self.limits,
                },
                num_threads=threads,
                prefetch=self.prefetch or 2 * threads,
                on_error=self.on_error,
                stats=self.stats,
                progress_timeout=self.loader_timeout,
                # through a cache the loader maps the cache's files: it gets the shard
                # set (with its gate, which waits for each shard in the loader)
                shards=shards if self.cache_epochs is not None or len(self.paths) > 1 else None,
            )
        else:
            reader = RecordReader(
                self._open(),
                self._decoder(),
                num_threads=threads,
                prefetch=self.prefetch or 2 * threads,
                on_error=self.on_error,
                pool=self._pool,
                stats=self.stats,
            )
        count = plan.unit_count(split.rank, split.world_size)
        units = range(p.next, count, p.step)
        batched = self.options.batch_size is not None
        release = self._releaser(plan, split, p.next)
        worker = p.key != 0
        chunks = reader.read(plan, split, units)
        items = self._items(chunks, batched)
        try:
            for unit, item in items:
                p.next = unit + p.step
                if worker and p.next >= count:
                    # Before handing it over: the loader may yield it and stop
                    # (a restore that fast-forwards) without asking for more.
                    self._finish(p, split)
                yield item
                if release is not None:
                    release(unit)  # batches are copies: a finished shard can go
        finally:
            items.close()
            chunks.close()
            if self._whole is not None and get_worker_info() is None:
                self._whole.end()  # the stream stops; what is left unpinned
        p.next = max(p.next, count)  # units left out whole (on_error="skip") are passed too
        if worker:
            self._finish(p, split)

    def _items(
        self, chunks: Iterator[Chunk], batched: bool
    ) -> Generator[tuple[int, Any], None, None]:
        """``(unit, item)`` from the chunks, transformed (with their origins current)."""
        if self.transform is None:
            for chunk in chunks:
                for unit, item, _ in self._chunk_items(chunk, batched):
                    yield unit, item
            return
        shards = self._open()

        def located() -> Iterator[tuple[int, Any, Origins | None]]:
            for chunk in chunks:
                ids, recs = chunk.shard_ids, chunk.records
                for unit, item, (lo, hi) in self._chunk_items(chunk, batched):
                    origins = None
                    if ids is not None and recs is not None:
                        origins = Origins(shards, ids[lo:hi], recs[lo:hi])
                    yield unit, item, origins

        # The loader process hands chunks over in a few shared-memory slots, each held
        # while a batch made from it lives: items waiting for the transform hold them too.
        ahead = 2 if self.reader_process else None
        mapped = ordered_map(self.transform, located(), self.transform_threads, ahead)
        try:
            yield from mapped
        finally:
            mapped.close()

    def _chunk_items(
        self, chunk: Chunk, batched: bool
    ) -> Iterator[tuple[int, Any, tuple[int, int]]]:
        """``(unit, item, (lo, hi))``: the chunk's batches or samples and their rows."""
        if self.sequence_example:
            return chunk_sequences(chunk, batched, self.stats)
        return (chunk_batches if batched else chunk_samples)(chunk, self.stats)

    def collate(self, samples: Sequence[dict[str, Any]]) -> Any:
        """:func:`collate` with this dataset's schema and ``bytes_as``: a ``collate_fn``
        that batches its samples as ``batch_size=N`` would (SequenceExamples: a list)."""
        if self.sequence_example:
            return list(samples)
        view = self._view()
        schema = view.output_schema if view is not None else self.schema
        return collate(samples, schema=schema, bytes_as=self.bytes_as)

    @property
    def tfds(self) -> TFDSInfo | None:
        """The tensorflow-datasets folder read (``None`` for other data): splits,
        features, ``class_names``."""
        view = self._open().view
        return view.info if view is not None else None

    def state_dict(self, consumed: int | None = None, epoch: int | None = None) -> dict[str, Any]:
        """The position to resume from: epoch and units (batches or samples) consumed.

        In a ``DataLoader`` worker (torchdata's ``StatefulDataLoader`` asks each
        worker after each batch), the state is that worker's own position, under
        ``"worker"``: ``{"id", "num_workers", "next"}`` (the next unit it reads), with
        ``"consumed"`` ``None``; it resumes only in the same worker of as many.

        Args:
            consumed: units of this epoch consumed so far. Leave it out when this
                object is iterated directly (it counts itself); :class:`DataLoader`
                passes it when workers do the iterating.
            epoch: with ``consumed``, the epoch they belong to (default: :attr:`epoch`).
        """
        shards = self._open()
        split = self._split()
        worker = None
        if consumed is not None:
            epoch = self.epoch if epoch is None else epoch
        elif get_worker_info() is not None:
            p = self._pass or self._next_worker_pass(split)
            epoch = p.epoch
            worker = {"id": split.worker, "num_workers": split.num_workers, "next": p.next}
        elif self._pass is not None:
            epoch, consumed = self._pass.epoch, self._pass.next
        else:
            epoch, consumed = self.epoch, self.resume_point()
        return saved_state(
            epoch=epoch,
            consumed=consumed,
            worker=worker,
            options=self.options,
            world_size=split.world_size,
            fingerprint=shards.fingerprint(),
            shard_paths=[info.path for info in shards.infos] if self._cached else None,
            shard_window_bytes=self._window,
        )

    def _next_worker_pass(self, split: Split) -> WorkerPosition:
        """Where this worker's next pass would start (its state before it begins)."""
        if self._worker_resume is not None:
            return self._worker_resume
        return WorkerPosition(self.epoch, self.resume_point() + split.worker)

    def _adopt_window(self, saved: int) -> None:
        """Resume with the shard windows the state was saved with (the order depends
        on them), if this cache's budget holds two of them (or, for none, the dataset)."""
        if saved == self._window:
            return
        whole = self._whole
        if whole is None:
            raise ValueError(
                f"cannot resume: the state was saved reading through a shard cache in shard "
                f"windows of {saved:,} bytes (a different order); read through the cache again"
            )
        if (saved == 0 and whole.fits) or (saved and 2 * saved <= whole.capacity):
            log.info(
                "resuming with the saved shard windows of %s bytes (this budget gives %s)",
                f"{saved:,}",
                f"{self._window:,}",
            )
            self._window = saved
            return
        raise ValueError(
            f"cannot resume: the state was saved reading shard windows of {saved:,} bytes "
            f"(0: the whole dataset at once), which the cache budget of "
            f"{whole.cache.max_bytes:,} cannot hold; give cache_limit at least the "
            "budget it was saved with"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration starts at the first unit not consumed.

        Elastic: a state saved at one world size resumes at another with the same
        global batch (``batch_size * world_size``), e.g. 8 ranks of 32 as 4 of 64:
        the epoch's order is the same, and the ranks start after the global
        batches consumed. A worker's state (see :meth:`state_dict`) resumes in
        the same worker of as many workers, as torchdata's ``StatefulDataLoader``
        restores it.

        Raises:
            ValueError: the state was saved with another shard set, seed, shuffle
                options or global batch, where "the next unseen record" is undefined;
                or it is a worker's state loaded elsewhere than in that worker.
        """
        worker = state.get("worker")
        if worker is not None:
            info = get_worker_info()
            check_worker(worker, None if info is None else (info.id, info.num_workers))
        keys: tuple[str, ...] = RESUME_KEYS
        if not self._cached:
            keys += ("shards",)
        elif state.get("shard_paths") is None:
            raise ValueError("cannot resume a cached dataset from a state saved without a cache")
        else:
            self._resume_shards = list(state["shard_paths"])
            self._fresh = False  # the next pass takes exactly the saved shards
        check_state(state, self.state_dict(consumed=0), keys)
        self._adopt_window(state.get("shard_window_bytes", 0))
        epoch = int(state["epoch"])
        self.epoch = epoch  # in a worker, every restored worker writes the same epoch
        self._pass = None
        if worker is not None:
            self._worker_resume = WorkerPosition(epoch, int(worker["next"]))
            self._resume = None
        else:
            self._resume = (epoch, int(state["consumed"]))
