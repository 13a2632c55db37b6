"""``RecordDataset``: the iterable dataset (the batch layout is in recordkit/torch/__init__.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from .._deps import require

torch = require("torch", extra="torch")

from torch.utils.data import IterableDataset, get_worker_info  # noqa: E402

from .._origins import Origins, ordered_map  # noqa: E402
from ..codec.schema import Schema  # noqa: E402
from ..reader.buffers import BufferPool  # noqa: E402
from ..reader.decode import BatchDecoder  # noqa: E402
from ..reader.decoders import decoder_keywords, make_decoder  # noqa: E402
from ..reader.mix import make_mix, refuse_cache, sources  # noqa: E402
from ..reader.options import (  # noqa: E402
    CacheOptions,
    ReadOptions,
    check_whole_records,
    read_options,
)
from ..reader.pipeline import Chunk, ReaderStats, RecordReader  # noqa: E402
from ..reader.plan import EpochPlan, PlanOptions, Split  # noqa: E402
from ..reader.position import Pass, pass_key  # noqa: E402
from ..reader.process import ProcessReader  # noqa: E402
from ..reader.ragged import ragged_axes  # noqa: E402
from ..reader.select import take_split  # noqa: E402
from ..reader.sequence import read_whole  # noqa: E402
from ..reader.tfds import TFDSInfo  # noqa: E402
from .cache import EpochSource  # noqa: E402
from .collate import chunk_batches, chunk_samples, chunk_sequences, collate  # noqa: E402
from .devcopy import can_pin as _can_pin  # noqa: E402
from .devcopy import pinned_slab as _pinned_slab  # noqa: E402
from .distributed import cpus  # noqa: E402
from .state import Position, refuse_dispatch, refuse_worker_batches  # noqa: E402

if TYPE_CHECKING:
    from ..cache import ShardCache

log = logging.getLogger(__name__)

_POOL_LOCK = threading.Lock()


class RecordDataset(IterableDataset):  # type: ignore[type-arg]
    """Stream a recordkit dataset (or a folder of TFRecords) into PyTorch.

    The everyday settings are keywords; the tuning (threads, error handling, layouts,
    ranks, the loader process, ...) is one :class:`ReadOptions` given as
    ``options=``, which documents each field; the cache is ``cache=``.

    Args:
        path_or_url: a dataset directory, a folder of ``.tfrecord`` files, or one
            file, on local disk (remote URLs: fill a local copy or cache first);
            or a list of them, read as one (``docs/howto/mixing.md``): every
            record of each once per epoch, shuffled together; their schemas
            must agree on the features read (else a
            :class:`~recordkit.errors.SchemaError` naming the feature).
        batch_size: records per batch; ``None`` yields single samples.
        shuffle: a new seeded order every epoch that mixes sorted data like a
            uniform permutation while reading in blocks (see ``docs/howto/shuffle.md``).
        seed: shuffle seed.
        drop_last: make every rank see the same number of full batches (drops
            the tail of the shuffled epoch); without it every record is read
            exactly once and the last batch of a rank may be short.
        columns: read only these features.
        schema: overrides the manifest's (or the inferred) schema.
        transform: applied to each batch (or sample) before it is yielded, in
            the consuming thread (or DataLoader worker), or on
            ``ReadOptions.transform_threads`` threads. While it runs, the item's
            records are known (:class:`DecodeImages` names the
            ``file:offset:record`` of an image that does not decode).
        split: the split of a tensorflow-datasets folder (see
            :class:`recordkit.Dataset`): batches then hold tfds's dtypes and
            shapes (``Text`` as lists of ``str``), and ``columns`` names tfds's
            features. Such records are decoded on reader threads by the threaded
            path (not the native whole-task runner).
        records: read only these records, the same every epoch (shuffled among
            themselves): ``slice(0, 10_000)`` or a split string, ``"[:10%]"``,
            ``"[1000:2000]"``, ``"train[:10%]"`` (tensorflow-datasets' split
            syntax; the name is ``split=``). For a list of datasets, a list of
            one range (or ``None``) per dataset.
        cache: read the remote dataset through a shard cache: a
            :class:`recordkit.cache.ShardCache` (``path_or_url`` is then only a
            label), or a :class:`CacheOptions` (a cache made in ``dir``, within
            ``limit`` bytes; ``epochs``, ``timeout``). With ``torch.distributed``
            the ranks of growing epochs read the shards every rank's cache holds.
            See ``docs/cache.md``.
        options: the tuning, whole (:class:`ReadOptions`, which documents each
            field; those marked *tf* are refused here).

    Attributes:
        stats: a :class:`~recordkit.reader.pipeline.ReaderStats` of this process.
        read_options: the :class:`ReadOptions` it reads with.
        cache_options: the :class:`CacheOptions` of ``cache=``.
        plan_options: the :class:`~recordkit.reader.plan.PlanOptions` of its epoch plans.
        position: its ``Position`` (``recordkit/torch/state.py``) (epoch, pass, resume point).
        source: its ``EpochSource`` (``recordkit/torch/cache.py``) (each epoch's shards).
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        columns: Sequence[str] | None = None,
        schema: Schema | None = None,
        transform: Callable[[Any], Any] | None = None,
        split: str | None = None,
        records: slice | str | Sequence[slice | str | None] | None = None,
        cache: ShardCache | CacheOptions | None = None,
        options: ReadOptions | None = None,
    ) -> None:
        read = read_options(options, "recordkit.torch.RecordDataset")
        cached = CacheOptions.of(cache)
        check_whole_records(read, schema, columns)
        paths, label = sources(path_or_url)
        self.paths, self.path = paths, label
        split, records = take_split(split, records)
        if cached.used:
            refuse_cache(label, paths, records, read.weights, read.epoch_records)
            if split is not None or read.decode_images:
                raise ValueError(
                    f"{label}: split= and decode_images= are for a local tensorflow-datasets "
                    "folder, not a dataset read through a shard cache"
                )
        self.read_options = read
        self.cache_options = cached
        self.split = split
        self.sequence_example = read.sequence_example  # or the manifest's word (below)
        if read.sequence_example or read.raw:
            schema = Schema({})  # opens foreign data without inferring an Example schema
        given = schema
        self.plan_options = PlanOptions(
            shuffle=shuffle,
            seed=seed,
            block_records=read.block_records,
            window_blocks=read.window_blocks,
            batch_size=batch_size,
            drop_last=drop_last,
        )
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self.stats = ReaderStats()
        self.position = Position(read.rank, read.world_size)
        self._pool: BufferPool | None = None  # batch buffers, per process (_buffers)
        self._pool_pid = -1
        self.source = EpochSource(
            paths,
            label,
            self.position,
            read,
            cached,
            columns=self.columns,
            split=split,
            shuffle=shuffle,
        )
        if schema is not None:  # opening with it: foreign data is not inferred (and refused)
            self.source.schema = schema
        shards = self.source.open()  # fail early, in the main process, on a bad path or schema
        if not read.sequence_example:  # a dataset of SequenceExamples says so in its manifest
            self.sequence_example = read_whole(
                label, False, shards, given, self.columns, read.decode_images
            )
        self.schema = self.source.schema = schema or shards.schema
        self._decoder()  # validates columns against the schema
        mix = make_mix(
            shards, records=records, weights=read.weights, epoch_records=read.epoch_records
        )
        self.plan_options = dataclasses.replace(self.plan_options, mix=mix)

    # -- the position and the shard source, held ---------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads.

        It advances by itself after a full pass, in this process or in ``DataLoader``
        workers (they share it with this object, persistent or not);
        :meth:`set_epoch` sets it.
        """
        return self.position.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.position.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its shuffle order), as ``DistributedSampler.set_epoch``.

        Raises:
            ValueError: called by Accelerate's ``DataLoaderDispatcher`` (which reads
                on the main process alone) while this dataset reads one rank's share.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        refuse_dispatch(sys._getframe(1), self.position.split().world_size)
        self.position.restart(epoch)

    def resume_point(self) -> int:
        """Units of the current epoch that the next pass skips (set by :meth:`load_state_dict`)."""
        return self.position.resume_point()

    @contextlib.contextmanager
    def worker_pass(self) -> Iterator[int]:
        """Start a pass whose iterating is done by copies of this dataset in worker processes.

        For loaders that run ``DataLoader`` workers (:class:`DataLoader` uses it):
        start the workers inside the ``with`` block. It fixes the epoch's shard set
        (cache mode) before they copy the dataset, yields the units already
        consumed (the resume point the copies start from), and spends the resume
        point when the block ends, so a later pass starts at the epoch's beginning.
        """
        position = self.position
        start = position.resume_point()
        self.source.start_epoch(position.epoch)
        if self.source.cache_epochs == "whole":  # this process streams the shards in
            plan = self._plan(position.epoch)
            self.source.begin_stream(plan, position.split(), start)
        position.fixed = True  # the copies read the set fixed here (cache mode)
        try:
            yield start
        finally:
            position.resume = None
            position.fixed = False

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
        return self.position.state(self.source, self.plan_options, consumed, epoch)

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
        self.position.load(state, self.source, self.plan_options)

    def close(self) -> None:
        """Release the cache pins and maps (and stop a cache made from ``CacheOptions.dir``)."""
        self.source.close()

    @property
    def cache(self) -> ShardCache | None:
        """The shard cache read through (``None``: none)."""
        return self.source.cache

    @property
    def cache_epochs(self) -> str | None:
        """``"whole"`` or ``"growing"`` through a shard cache, else ``None``."""
        return self.source.cache_epochs

    def _plan(self, epoch: int) -> EpochPlan:
        return self.source.plan(epoch, self.plan_options)

    def _view(self) -> Any:
        return self.source.view()

    # -- process-local state ---------------------------------------------------------

    def _buffers(self) -> BufferPool:
        """This process's batch buffers (made on first use in each process)."""
        if self._pool is None or self._pool_pid != os.getpid():
            with _POOL_LOCK:  # several threads may iterate one dataset
                if self._pool is None or self._pool_pid != os.getpid():
                    self._pool = self._make_pool()
                    self._pool_pid = os.getpid()
        assert self._pool is not None
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"], state["_pool_pid"] = None, -1  # the buffers stay in this process
        return state

    def _make_pool(self) -> BufferPool:
        if not self.read_options.pin_memory:
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
        return make_decoder(
            self.schema,
            self.read_options,
            self.columns,
            view=None if self._whole_records else self._view(),
            sequence_example=self.sequence_example,
            ragged_as=self._ragged_mode(),
        )

    @property
    def _whole_records(self) -> bool:
        """SequenceExamples or ``raw=True``: each record read whole."""
        return self.sequence_example or self.read_options.raw

    def _ragged_mode(self) -> Literal["padded", "list"]:
        if self.plan_options.batch_size and self._view() is None:
            return self.read_options.ragged_as
        return "list"

    # -- public API --------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches (or samples) this rank reads per epoch, over all its DataLoader workers."""
        split = self.position.split()
        units = self._plan(self.epoch).unit_count(split.rank, split.world_size)
        refuse_worker_batches(sys._getframe(1), units, self.plan_options.batch_size is None)
        return units

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is None:
            return self._iter_here()
        # In a DataLoader worker the pass starts now, when the worker makes its
        # iterator: the state the loader asks for before the first batch is its start.
        split = self.position.split()
        p = self._begin_worker_pass(split)
        return self._iter_pass(p, split)

    def _iter_here(self) -> Iterator[Any]:
        """A pass in this process (no DataLoader workers); it starts at the first ``next()``."""
        position = self.position
        epoch = position.epoch
        start = position.resume_point()
        self.source.start_epoch(epoch)  # cache mode: this epoch's shards (before resume goes)
        position.resume = None
        p = position.pass_ = Pass(epoch, start)
        yield from self._iter_pass(p, position.split())

    def _begin_worker_pass(self, split: Split) -> Pass:
        """A worker's pass: a restored position, or the rank's resume point dealt to it."""
        info = get_worker_info()
        assert info is not None
        position = self.position
        position.passes += 1
        restored = position.worker_resume
        if restored is not None:
            # saved after the epoch's last batch: this pass reads the next epoch
            count = self._plan(restored.epoch).unit_count(split.rank, split.world_size)
            key = pass_key(info.seed - info.id, position.passes, restored.epoch)
            restored = restored.restored(count, split.worker, split.num_workers, position.cell, key)
            epoch, first = restored.epoch, restored.next
            position.epoch = epoch  # every worker of the restored pass writes the same epoch
        else:
            epoch = position.epoch
            first = position.resume_point() + split.worker
        position.worker_resume = position.resume = None  # spent (here: persistent workers)
        if self.cache_epochs is not None and not position.fixed:
            raise RuntimeError(
                "a cached RecordDataset in DataLoader workers needs recordkit.torch.DataLoader "
                "(it takes each epoch's shards from the cache in the training process, or "
                "streams them in there for whole epochs); with another loader (torchdata's "
                "StatefulDataLoader) use num_workers=0: the dataset reads with threads"
            )
        key = pass_key(info.seed - info.id, position.passes, epoch)
        p = position.pass_ = Pass(epoch, first, split.num_workers, split.worker, key)
        if first >= self._plan(epoch).unit_count(split.rank, split.world_size):
            self._finish(p, split)  # nothing (left) to read: finished before it starts
        return p

    def _finish(self, p: Pass, split: Split) -> None:
        """This process handed over its last unit of the epoch (or had none): the epoch
        is over (a loop that takes exactly ``len(ds)`` items never asks for one more).
        A worker marks the shared epoch (the pass's last advances it); the training
        process reads the next epoch next, unless :meth:`set_epoch` chose another."""
        if p.finished:
            return
        p.finished = True
        position = self.position
        if p.key != 0:
            position.cell.finish(p.worker, split.num_workers, p.key, p.epoch)
            return
        if position.epoch == p.epoch:
            position.epoch = p.epoch + 1
        if position.pass_ is p:
            position.pass_ = None  # the state now points at the next epoch's start

    def _iter_pass(self, p: Pass, split: Split) -> Iterator[Any]:
        plan = self._plan(p.epoch)
        read = self.read_options
        threads = read.num_threads or max(1, cpus() // split.num_workers)
        reader: RecordReader | ProcessReader
        if read.reader_process:
            if self._whole_records:  # records read whole: on the threads
                raise ValueError("raw=True and sequence_example=True need reader_process=False")
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
            shards = self.source.open()
            reader = ProcessReader(
                self.path,
                self.schema,
                shards.fingerprint(),
                decoder=decoder_keywords(read, self.columns, ragged_as=self._ragged_mode()),
                num_threads=threads,
                prefetch=read.prefetch or 2 * threads,
                on_error=read.on_error,
                stats=self.stats,
                progress_timeout=read.loader_timeout,
                # through a cache the loader maps the cache's files: it gets the shard
                # set (with its gate, which waits for each shard in the loader)
                shards=shards if self.cache_epochs is not None or len(self.paths) > 1 else None,
            )
        else:
            reader = RecordReader(
                self.source.open(),
                self._decoder(),
                num_threads=threads,
                prefetch=read.prefetch or 2 * threads,
                on_error=read.on_error,
                pool=self._buffers(),
                stats=self.stats,
            )
        count = plan.unit_count(split.rank, split.world_size)
        units = range(p.next, count, p.step)
        batched = self.plan_options.batch_size is not None
        release = self.source.releaser(plan, split, p.next)
        # whole epochs: the stream this pass began (only it may end it)
        stream = self.source.stream() if p.key == 0 else None
        chunks = reader.read(plan, split, units)
        items = self._items(chunks, batched)

        def stop() -> None:
            items.close()
            chunks.close()
            if stream is not None:
                self.source.end_stream(stream)  # the stream stops; what is left unpinned

        try:
            for unit, item in items:
                p.next = unit + p.step
                if p.next >= count:
                    # The last unit: the pass is over before it is handed over. A
                    # loop that takes len(ds) items never asks for another, and
                    # keeps this generator until its next iter(), maybe after a
                    # new pass began: nothing of this one may be left to end then.
                    if release is not None:
                        release(unit)
                    stop()
                    self._finish(p, split)
                    yield item
                    return
                yield item
                if release is not None:
                    release(unit)  # batches are copies: a finished shard can go
        finally:
            stop()
        p.next = max(p.next, count)  # units left out whole (on_error="skip") are passed too
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
        shards = self.source.open()

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
        read = self.read_options
        ahead = 2 if read.reader_process else None
        mapped = ordered_map(self.transform, located(), read.transform_threads, ahead)
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
        if self.read_options.raw:
            return chunk_sequences(chunk, batched, self.stats, raw=True)
        if not batched:
            return chunk_samples(chunk, self.stats)
        padded = self._ragged_mode() == "padded"
        return chunk_batches(
            chunk,
            self.stats,
            ragged_axes(self.schema, self.columns) if padded else {},
            self.schema,
        )

    def collate(self, samples: Sequence[dict[str, Any]]) -> Any:
        """:func:`collate` with this dataset's schema and layout: a ``collate_fn`` batching
        as ``batch_size=N`` would (SequenceExamples and ``raw=True``: a list)."""
        if self._whole_records:
            return list(samples)
        view = self._view()
        schema = view.output_schema if view is not None else self.schema
        read = self.read_options
        return collate(
            samples, schema=schema, bytes_as=read.bytes_as or "padded", ragged_as=read.ragged_as
        )

    @property
    def tfds(self) -> TFDSInfo | None:
        """The tensorflow-datasets folder read (``None`` for other data): splits,
        features, ``class_names``."""
        view = self.source.open().view
        return view.info if view is not None else None
