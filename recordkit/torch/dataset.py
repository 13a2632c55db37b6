"""``RecordDataset``: the iterable dataset (the batch layout is in recordkit/torch/__init__.py)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from .._deps import require

torch = require("torch", extra="torch")

from torch.utils.data import get_worker_info  # noqa: E402

from .._origins import Origins, ordered_map  # noqa: E402
from ..codec.limits import DecodeLimits  # noqa: E402
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
from ..reader.plan import PlanOptions, Split  # noqa: E402
from ..reader.position import EpochCell, Pass, WorkerPosition, pass_key  # noqa: E402
from ..reader.process import ProcessReader  # noqa: E402
from ..reader.ragged import ragged_axes  # noqa: E402
from ..reader.select import take_split  # noqa: E402
from ..reader.sequence import read_whole  # noqa: E402
from ..reader.tfds import TFDSInfo  # noqa: E402
from .collate import chunk_batches, chunk_samples, chunk_sequences, collate  # noqa: E402
from .devcopy import can_pin as _can_pin  # noqa: E402
from .devcopy import pinned_slab as _pinned_slab  # noqa: E402
from .distributed import cpus  # noqa: E402
from .state import Positioned, refuse_worker_batches  # noqa: E402

if TYPE_CHECKING:
    from ..cache import ShardCache

log = logging.getLogger(__name__)


class RecordDataset(Positioned):
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
        options: the tuning, whole (:class:`ReadOptions`; its fields marked *tf*
            are refused here). ``sequence_example=True`` reads
            ``tf.train.SequenceExample`` messages whole, as :class:`recordkit.Dataset`
            does (``{"context": {name: value}, "feature_lists": {name: [step, ...]}}``,
            number lists as tensors, bytes lists as ``list[bytes]``, steps ragged),
            decoded on the reader threads; with ``batch_size`` a batch is a ``list``
            of such samples (pad them in ``transform``). Without it, a
            SequenceExample is a :class:`~recordkit.errors.SequenceExampleError`,
            never its context alone. Implied when the manifest says the records
            are SequenceExamples (``recordkit convert`` of them).

    Attributes:
        stats: a :class:`~recordkit.reader.pipeline.ReaderStats` of this process.
        read_options: the :class:`ReadOptions` it reads with.
        cache_options: the :class:`CacheOptions` of ``cache=``.
    """

    # Documented here: these are defined in the bases, by subject (the cache, the position).
    close = Positioned.close
    epoch = Positioned.epoch
    set_epoch = Positioned.set_epoch
    resume_point = Positioned.resume_point
    worker_pass = Positioned.worker_pass
    state_dict = Positioned.state_dict
    load_state_dict = Positioned.load_state_dict

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
        super().__init__()
        self.paths, self.path = sources(path_or_url)
        split, records = take_split(split, records)
        if cached.used:
            refuse_cache(self.path, self.paths, records, read.weights, read.epoch_records)
        self.read_options = read
        self.cache_options = cached
        self.split = split
        self.sequence_example = read.sequence_example  # or the manifest's word (below)
        if read.sequence_example or read.raw:
            schema = Schema({})  # opens foreign data without inferring an Example schema
        given = schema
        self.options = PlanOptions(
            shuffle=shuffle,
            seed=seed,
            block_records=read.block_records,
            window_blocks=read.window_blocks,
            batch_size=batch_size,
            drop_last=drop_last,
        )
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        self._rank, self._world = read.rank, read.world_size
        self._cell = EpochCell(0)  # shared with DataLoader workers' copies
        self.stats = ReaderStats()
        self._resume: tuple[int, int] | None = None  # a rank's (epoch, units consumed)
        self._worker_resume: WorkerPosition | None = None  # loaded in a DataLoader worker
        self._pass: Pass | None = None  # the pass this process reads (or left unfinished)
        self._passes = 0  # passes started in this process: a persistent worker's pass id
        self._fixed = False  # in worker_pass(): the epoch's shard set is fixed for the workers
        if cached.used and (split is not None or read.decode_images):
            raise ValueError(
                f"{self.path}: split= and decode_images= are for a local tensorflow-datasets "
                "folder, not a dataset read through a shard cache"
            )
        self._init_cache(cached)
        if schema is not None:  # opening with it: foreign data is not inferred (and refused)
            self.schema = schema
        shards = self._open()  # fail early, in the main process, on a bad path or schema
        if not read.sequence_example:  # a dataset of SequenceExamples says so in its manifest
            self.sequence_example = read_whole(
                self.path, False, shards, given, self.columns, read.decode_images
            )
        self.schema = schema or shards.schema
        self._decoder()  # validates columns against the schema
        mix = make_mix(
            shards, records=records, weights=read.weights, epoch_records=read.epoch_records
        )
        self.options = dataclasses.replace(self.options, mix=mix)

    # What the shard set and the tensorflow-datasets view read from the options.
    @property
    def partial(self) -> bool:
        return self.read_options.partial

    @property
    def decode_images(self) -> bool:
        return bool(self.read_options.decode_images)

    @property
    def limits(self) -> DecodeLimits | None:
        return self.read_options.limits

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if "_epochs" in state:  # workers read the epoch's set; the training process pins it
            state["cache"] = state["_epochs"] = None
        if "_whole" in state:  # ... or streams the shards in (the shard set's gate waits)
            state["_whole"] = None
        return state

    # -- process-local state ---------------------------------------------------------

    def _opened(self) -> None:
        self._pool = self._make_pool()  # batch buffers are per process too

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
        if self.options.batch_size and self._view() is None:
            return self.read_options.ragged_as
        return "list"

    # -- public API --------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches (or samples) this rank reads per epoch, over all its DataLoader workers."""
        split = self._split()
        units = self._plan(self.epoch).unit_count(split.rank, split.world_size)
        refuse_worker_batches(sys._getframe(1), units, self.options.batch_size is None)
        return units

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

    def _begin_worker_pass(self, split: Split) -> Pass:
        """A worker's pass: a restored position, or the rank's resume point dealt to it."""
        info = get_worker_info()
        assert info is not None
        self._passes += 1
        restored = self._worker_resume
        if restored is not None:
            # saved after the epoch's last batch: this pass reads the next epoch
            count = self._plan(restored.epoch).unit_count(split.rank, split.world_size)
            key = pass_key(info.seed - info.id, self._passes, restored.epoch)
            restored = restored.restored(count, split.worker, split.num_workers, self._cell, key)
            epoch, first = restored.epoch, restored.next
            self.epoch = epoch  # every worker of the restored pass writes the same epoch
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
        """This process handed over its last unit of the epoch (or had none): the epoch
        is over (a loop that takes exactly ``len(ds)`` items never asks for one more).
        A worker marks the shared epoch (the pass's last advances it); the training
        process reads the next epoch next, unless :meth:`set_epoch` chose another."""
        if p.finished:
            return
        p.finished = True
        if p.key != 0:
            self._cell.finish(p.worker, split.num_workers, p.key, p.epoch)
            return
        if self.epoch == p.epoch:
            self.epoch = p.epoch + 1
        if self._pass is p:
            self._pass = None  # the state now points at the next epoch's start

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
            shards = self._open()
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
                self._open(),
                self._decoder(),
                num_threads=threads,
                prefetch=read.prefetch or 2 * threads,
                on_error=read.on_error,
                pool=self._pool,
                stats=self.stats,
            )
        count = plan.unit_count(split.rank, split.world_size)
        units = range(p.next, count, p.step)
        batched = self.options.batch_size is not None
        release = self._releaser(plan, split, p.next)
        # whole epochs: the stream this pass began (only it may end it)
        stream = self._whole.pass_ if self._whole is not None and p.key == 0 else None
        chunks = reader.read(plan, split, units)
        items = self._items(chunks, batched)

        def stop() -> None:
            items.close()
            chunks.close()
            if stream is not None and self._whole is not None and self._whole.pass_ is stream:
                self._whole.end()  # the stream stops; what is left unpinned

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
            chunk, self.stats, ragged_axes(self.schema, self.columns) if padded else {}
        )

    def collate(self, samples: Sequence[dict[str, Any]]) -> Any:
        """:func:`collate` with this dataset's schema and layout: a ``collate_fn`` batching
        as ``batch_size=N`` would (SequenceExamples and ``raw=True``: a list)."""
        if self._whole_records:
            return list(samples)
        view = self._view()
        schema = view.output_schema if view is not None else self.schema
        read = self.read_options
        return collate(samples, schema=schema, bytes_as=read.bytes_as, ragged_as=read.ragged_as)

    @property
    def tfds(self) -> TFDSInfo | None:
        """The tensorflow-datasets folder read (``None`` for other data): splits,
        features, ``class_names``."""
        view = self._open().view
        return view.info if view is not None else None
