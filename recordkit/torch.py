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
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ._deps import require

torch = require("torch", extra="torch")

from torch.utils.data import DataLoader as _TorchDataLoader  # noqa: E402
from torch.utils.data import Dataset as _TorchDataset  # noqa: E402
from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402

from ._devcopy import can_pin as _can_pin  # noqa: E402
from ._devcopy import pinned_slab as _pinned_slab  # noqa: E402
from ._torch_collate import collate  # noqa: E402
from .codec.limits import DecodeLimits  # noqa: E402
from .codec.schema import Schema  # noqa: E402
from .prefetch import DevicePrefetcher  # noqa: E402
from .reader.buffers import BufferPool  # noqa: E402
from .reader.decode import BatchDecoder  # noqa: E402
from .reader.epochs import CacheEpochs, WholeEpochs, open_cache  # noqa: E402
from .reader.pipeline import Chunk, OnError, ReaderStats, RecordReader  # noqa: E402
from .reader.plan import EpochPlan, PlanOptions, Split  # noqa: E402
from .reader.process import DEFAULT_PROGRESS_TIMEOUT, ProcessReader  # noqa: E402
from .reader.shards import ShardSet, open_shards  # noqa: E402

if TYPE_CHECKING:
    from .cache import ShardCache

__all__ = [
    "DataLoader",
    "DevicePrefetcher",
    "RecordDataset",
    "RecordMapDataset",
    "collate",
]

log = logging.getLogger(__name__)

# 2: the hierarchical block shuffle and global-batch split (version 1's order differs).
_STATE_VERSION = 2
# Guards (re)opening the shard maps of a dataset object; opening is rare (once per
# process), so one lock for all datasets is enough.
_OPEN_LOCK = threading.Lock()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _to_torch(value: Any) -> Any:
    if isinstance(value, np.generic) and not isinstance(value, np.flexible):
        return torch.from_numpy(np.array(value))  # a scalar feature: a 0-d tensor, as documented
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:  # torch warns on read-only arrays; copy those few
            value = value.copy()
        return torch.from_numpy(value)
    if isinstance(value, list):
        return [_to_torch(v) for v in value]
    return value


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


class _ProcessLocalShards:
    """Shard maps (and what hangs off them) live in one process each.

    DataLoader workers, forked or spawned, get a copy of the dataset with its
    shard set (counts and sizes, no maps: ``ShardSet`` maps on demand in each
    process) and make their own buffer pool on first use.
    """

    path: str
    schema: Schema
    _shards: ShardSet | None = None
    _pid = -1

    def _open(self) -> ShardSet:
        shards = self._shards
        if shards is not None and self._pid == os.getpid():
            return shards
        with _OPEN_LOCK:  # several threads may iterate one dataset: open once
            if self._shards is None or self._pid != os.getpid():
                shards = self._shards if self._shards is not None else self._open_shards()
                self._opened()  # before publishing: a thread that sees the shards sees the rest
                self._shards = shards
                self._pid = os.getpid()
            assert self._shards is not None
            return self._shards

    def _open_shards(self) -> ShardSet:
        return open_shards(
            self.path, getattr(self, "schema", None), partial=getattr(self, "partial", False)
        )

    def _opened(self) -> None:
        """Called in each process after its maps are opened."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"] = -1  # the shard set pickles without its maps; the pool stays here
        state.pop("_pool", None)
        if "_epochs" in state:  # workers read the epoch's set; the training process pins it
            state["cache"] = state["_epochs"] = None
        if "_whole" in state:  # ... or streams the shards in (the shard set's gate waits)
            state["_whole"] = None
        return state


class RecordDataset(_ProcessLocalShards, IterableDataset):  # type: ignore[type-arg]
    """Stream a recordkit dataset (or a folder of TFRecords) into PyTorch.

    Args:
        path_or_url: a dataset directory, a folder of ``.tfrecord`` files, or one
            file, on local disk (remote URLs: fill a local copy or cache first).
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
            the consuming thread (or DataLoader worker).
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

    Attributes:
        stats: a :class:`~recordkit.reader.pipeline.ReaderStats` of this process.
        epoch: the epoch the next iteration reads; advances by itself after a
            full pass in this process; set it with :meth:`set_epoch` (needed with
            a plain ``DataLoader`` with workers; :class:`DataLoader` does it).
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
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "skip", "warn"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', got {on_error!r}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {num_threads}")
        self.path = os.fspath(path_or_url)
        self.partial = partial
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
        self.epoch = 0
        self.stats = ReaderStats()
        self._resume: tuple[int, int] | None = None  # (epoch, units consumed)
        self._next_unit = 0
        self._init_cache(cache, cache_dir, cache_limit, cache_timeout, cache_epochs)
        if schema is not None:  # opening with it: foreign data is not inferred (and refused)
            self.schema = schema
        shards = self._open()  # fail early, in the main process, on a bad path or schema
        self.schema = schema or shards.schema
        self._decoder()  # validates columns against the schema

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
            return open_shards(
                self.path, getattr(self, "schema", None), partial=getattr(self, "partial", False)
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
        try:
            yield start
        finally:
            self._resume = None

    def _delivered(self, unit: int) -> None:
        """A loader with workers yielded unit ``unit`` of this rank (whole epochs: the
        shards that no later unit reads can go)."""
        if self._whole is not None and self._whole.pass_ is not None:
            self._whole.pass_.release(unit)

    def _end_pass(self) -> None:
        """A loader with workers ended its pass (whole epochs: the stream stops)."""
        if self._whole is not None:
            self._whole.end()

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its shuffle order), as ``DistributedSampler.set_epoch``."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch
        self._next_unit = 0

    def __len__(self) -> int:
        """Batches (or samples) this rank reads per epoch, over all its DataLoader workers."""
        split = self._split()
        return self._plan(self.epoch).unit_count(split.rank, split.world_size)

    def __iter__(self) -> Iterator[Any]:
        split = self._split()
        epoch = self.epoch
        start = 0
        if self._resume is not None and self._resume[0] == epoch:
            start = self._resume[1]
        self._start_epoch(epoch)  # cache mode: this epoch's shards (before _resume goes)
        if get_worker_info() is None:
            self._resume = None  # a worker's copy cannot clear the parent's; DataLoader does
        plan = self._plan(epoch)
        threads = self.num_threads or max(1, _cpus() // split.num_workers)
        reader: RecordReader | ProcessReader
        if self.reader_process:
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
                shards=shards if self.cache_epochs is not None else None,
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
        units = plan.units(split, start)
        self._next_unit = start
        batched = self.options.batch_size is not None
        release = self._releaser(plan, split, start)
        chunks = reader.read(plan, split, units)
        try:
            for chunk in chunks:
                items = self._batches(chunk) if batched else self._samples(chunk)
                for unit, item in items:
                    self._next_unit = unit + 1
                    if self.transform is not None:
                        item = self.transform(item)
                    yield item
                    if release is not None:
                        release(unit)  # batches are copies: a finished shard can go
        finally:
            chunks.close()
            if self._whole is not None and get_worker_info() is None:
                self._whole.end()  # the stream stops; what is left unpinned
        if get_worker_info() is None and self.epoch == epoch:
            self.epoch = epoch + 1  # a full pass: the next iteration reads the next epoch
            self._next_unit = 0

    def _batches(self, chunk: Chunk) -> Iterator[tuple[int, dict[str, Any]]]:
        if not chunk.rows:
            return
        # Per-chunk work is done once, vectorised: the consuming thread shares the
        # GIL with the training step, so its per-batch Python must stay tiny.
        edges = np.flatnonzero(np.diff(chunk.units)) + 1
        starts = np.concatenate(([0], edges))
        ends = np.concatenate((edges, [chunk.rows])).tolist()
        tensors = {name: _to_torch(value) for name, value in chunk.columns.items()}
        widths = {
            name: np.maximum.reduceat(lengths, starts).tolist()
            for name, value in chunk.columns.items()
            if isinstance(value, np.ndarray)
            and value.ndim == 2
            and isinstance(lengths := chunk.columns.get(name + "/lengths"), np.ndarray)
        }
        unit_ids = chunk.units[starts].tolist()
        for b, (lo, hi) in enumerate(zip(starts.tolist(), ends)):
            batch = {name: t[lo:hi] for name, t in tensors.items()}
            for name, w in widths.items():
                batch[name] = batch[name][:, : w[b]]  # trim to this batch's longest value
            self.stats.add(records=hi - lo, batches=1)
            yield unit_ids[b], batch

    def _samples(self, chunk: Chunk) -> Iterator[tuple[int, dict[str, Any]]]:
        cols = chunk.columns
        names = [n for n in cols if not (n.endswith("/lengths") and n[: -len("/lengths")] in cols)]
        for i in range(chunk.rows):
            sample = {}
            for name in names:
                value = cols[name]
                lengths = cols.get(name + "/lengths")
                if lengths is not None:
                    sample[name] = value[i, : int(lengths[i])].tobytes()
                else:
                    sample[name] = _to_torch(value[i])
            self.stats.add(records=1, batches=1)
            yield int(chunk.units[i]), sample

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """:func:`collate` with this dataset's schema and ``bytes_as``: a ``collate_fn``
        that batches its samples as ``batch_size=N`` would."""
        return collate(samples, schema=self.schema, bytes_as=self.bytes_as)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """The position to resume from: epoch and units (batches or samples) consumed.

        Args:
            consumed: units of this epoch consumed so far. Leave it out when this
                object is iterated directly (it counts itself); :class:`DataLoader`
                passes it when workers do the iterating.
        """
        shards = self._open()
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "consumed": self._next_unit if consumed is None else consumed,
            "seed": self.options.seed,
            "shuffle": self.options.shuffle,
            "block_records": self.options.block_records,
            "window_blocks": self.options.window_blocks,
            "batch_size": self.options.batch_size,
            "drop_last": self.options.drop_last,
            "world_size": self._split().world_size,
            # the order depends on the global batch, not on how many ranks share it
            "global_batch": (self.options.batch_size or 1) * self._split().world_size,
            "shards": shards.fingerprint(),
            # with a cache the shard set changes per epoch: a resume takes these again
            "shard_paths": [info.path for info in shards.infos] if self._cached else None,
            # whole epochs through a cache smaller than the dataset: the shard windows
            "shard_window_bytes": self._window,
        }

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
        batches consumed.

        Raises:
            ValueError: the state was saved with another shard set, seed, shuffle
                options or global batch, where "the next unseen record" is undefined.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"unsupported state version {state.get('version')!r} (this recordkit saves "
                f"{_STATE_VERSION}; an older version's epoch order differs)"
            )
        mine = self.state_dict()
        self._adopt_window(state.get("shard_window_bytes", 0))
        keys = ["seed", "shuffle", "block_records", "window_blocks", "drop_last", "global_batch"]
        if not self._cached:
            keys.append("shards")
        elif state.get("shard_paths") is None:
            raise ValueError("cannot resume a cached dataset from a state saved without a cache")
        else:
            self._resume_shards = list(state["shard_paths"])
            self._fresh = False  # the next pass takes exactly the saved shards
        for key in keys:
            if state[key] != mine[key]:
                raise ValueError(
                    f"cannot resume: {key} was {state[key]!r} when saved, is {mine[key]!r} now"
                )
        self.epoch = int(state["epoch"])
        self._resume = (self.epoch, int(state["consumed"]))
        self._next_unit = int(state["consumed"])


class DataLoader(_TorchDataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` that can save and resume a :class:`RecordDataset`.

    With worker processes, the dataset object in the training process does not
    see what the workers read; this loader counts the batches it yields, so
    :meth:`state_dict` is exact, and advances the dataset's epoch after each
    full pass. ``batch_size`` defaults to ``None`` (the dataset batches).
    """

    def __init__(
        self, dataset: RecordDataset, *, batch_size: int | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(dataset, RecordDataset):
            raise TypeError("recordkit.torch.DataLoader takes a recordkit.torch.RecordDataset")
        if batch_size is not None:
            raise ValueError(
                "let the dataset batch: RecordDataset(..., batch_size=N) with "
                "DataLoader(batch_size=None); that is faster and keeps resume exact"
            )
        if kwargs.get("persistent_workers") and dataset.cache_epochs == "whole":
            raise ValueError(
                "persistent_workers=True with whole epochs through a cache: each pass's "
                "workers must start after the pass's stream (workers per pass instead)"
            )
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self._consumed = 0

    # A generator, not a _BaseDataLoaderIter: it wraps one to count what it yields.
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self.dataset
        assert isinstance(ds, RecordDataset)
        epoch = ds.epoch
        if self.num_workers > 0:
            with ds.worker_pass() as start:  # the workers copy the dataset in here
                it = super().__iter__()
        else:  # the dataset iterates in this process and resumes itself
            start, it = ds.resume_point(), super().__iter__()
        self._consumed = start
        try:
            for item in it:
                self._consumed += 1
                yield item
                if self.num_workers > 0:
                    ds._delivered(self._consumed - 1)
        finally:
            if self.num_workers > 0:
                ds._end_pass()
        # A full pass: the next one reads the next epoch (in-process, the dataset
        # has already advanced itself).
        if ds.epoch == epoch:
            ds.set_epoch(epoch + 1)
        self._consumed = 0

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches this loader has yielded (JSON-serialisable)."""
        ds = self.dataset
        assert isinstance(ds, RecordDataset)
        return ds.state_dict(consumed=self._consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass starts at the batch after it."""
        ds = self.dataset
        assert isinstance(ds, RecordDataset)
        ds.load_state_dict(state)
        self._consumed = int(state["consumed"])


class RecordMapDataset(_ProcessLocalShards, _TorchDataset):  # type: ignore[type-arg]
    """Random access to records by global index, for your own samplers.

    ``ds[i]`` decodes record ``i`` through the memory map into a ``dict`` of
    tensors (``Bytes()`` as ``bytes``); ``__getitems__`` decodes a whole list of
    indices in one native call, which ``DataLoader`` uses for batched sampling.

    Args:
        path: a dataset directory, a folder of ``.tfrecord`` files, or one file.
        columns: read only these features.
        transform: applied to each sample.
        verify: check payload CRCs.
        limits: the bytes a record's (and one ``__getitems__`` call's) zstd
            values may decompress to (see :class:`~recordkit.codec.DecodeLimits`).
        schema: overrides the manifest's (or the inferred) schema.
        partial: read a directory where a write did not finish (see
            :class:`RecordDataset`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        columns: Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        verify: bool = True,
        limits: DecodeLimits | None = None,
        schema: Schema | None = None,
        partial: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.partial = partial
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self.verify = verify
        if schema is not None:  # opening with it: foreign data is not inferred (and refused)
            self.schema = schema
        shards = self._open()
        self.schema = schema or shards.schema
        self._starts = np.concatenate(([0], np.cumsum(shards.counts)))
        self._dec = BatchDecoder(
            self.schema, columns=self.columns, verify=verify, bytes_as="list", limits=limits
        )

    def __len__(self) -> int:
        return int(self._starts[-1])

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """:func:`collate` with this dataset's schema: a ``collate_fn`` for ``DataLoader``."""
        return collate(samples, schema=self.schema)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        shards = self._open()
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"index out of range for a dataset of {n} records")
        idx = np.where(idx < 0, idx + n, idx)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        out: list[dict[str, Any]] = [{} for _ in range(len(idx))]
        for s in np.unique(which).tolist():
            rows = np.flatnonzero(which == s)
            recs = idx[rows] - self._starts[s]
            with shards.use(s) as shard:
                offsets, sizes = shard.offsets[recs], shard.sizes[recs]
                batch = self._dec.decode(shard.buf, offsets, sizes, path=shard.path, records=recs)
            if batch.bad:
                pos, err = batch.bad[0]
                raise err.located(shard.path, int(offsets[pos]), int(recs[pos]))
            for j, row in enumerate(rows.tolist()):
                out[row] = {k: _to_torch(v[j]) for k, v in batch.columns.items()}
        if self.transform is not None:
            out = [self.transform(x) for x in out]
        return out
