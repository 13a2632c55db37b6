"""The two ``tf.data`` graphs under every ``recordkit.tf`` pipeline (used by the builders
of :mod:`recordkit.tf.build`).

:func:`planned`: epochs of the epoch plan, epoch and task numbers from
``Dataset.range`` (what ``tf.train.Checkpoint`` saves), one stateless
``tf.numpy_function`` per task, which either decodes the task in C
(:mod:`recordkit.tf.native`: dense and ragged tensors, batches cut from each task) or
hands its records on serialized. :func:`native`: ``TFRecordDataset`` over a list of
shards with a parallel interleave, in chunks of records. Serialized records end in
``parse_example`` (or a record-by-record parse where images, tfds features or ragged
values need it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._deps import require
from ..codec import Schema
from ..codec.limits import DecodeLimits
from ..format.manifest import Manifest
from .decode import decoder as _decoder
from .decode import fast as _fast
from .files import avg_record_bytes, feature_spec
from .images import ImagesStep
from .native import NativeTasks
from .tasks import PlanTasks

tf = require("tensorflow", extra="tf")

__all__ = ["Passes", "native", "no_model_thread", "planned", "record_parser"]

# Records read as one chunk (one element between the reader threads and the
# rest of the pipeline): up to this many records or bytes; records of at least
# _CHUNK_MIN_RECORD bytes (mean) are not chunked.
_CHUNK_RECORDS = 1024
_CHUNK_BYTES = 1 << 20
_CHUNK_MIN_RECORD = 64 << 10
# Native task reads at once, one per CPU (C with the GIL released): AUTOTUNE, measured,
# sometimes settled on one at a time.
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
# Read-ahead per open shard (TFRecordDataset's buffer_size): big sequential reads.
_READ_BUFFER = 8 << 20


class Passes:
    """Which epochs each pass over (iteration of) one ``recordkit.tf`` dataset reads.

    A pass reads ``epochs`` epochs from the one after the last epoch any pass of
    this dataset began: ``for e in range(3): for b in ds`` and Keras ``fit`` read
    a new order every epoch, and the order stays a pure function of the seed,
    the epoch number and the position. The pass takes its first epoch when its
    first element is asked for (an iterator made and dropped unread, as Keras'
    epoch iterator does at the end of each epoch, takes none), and that number
    is part of the iterator's state, which ``tf.train.Checkpoint`` saves: a
    restored iterator continues its own epochs, and the pass after it starts
    after the last epoch it read. :func:`set_epoch` chooses the next pass's epoch.

    Args:
        first: the first pass's first epoch.
        per_pass: epochs a pass reads (``None``: endless).
    """

    def __init__(self, first: int, per_pass: int | None) -> None:
        self.first = first
        self.per_pass = per_pass
        self._lock = threading.Lock()
        self._next = first  # the next pass's first epoch, unless a later one was read
        self._seen = first - 1  # the last epoch a pass began or read

    def begin(self, _: Any) -> Any:
        """A pass asks for its first element: its first epoch."""
        with self._lock:
            first = max(self._next, self._seen + 1)
            span = self.per_pass or 1
            self._next = first + span
            self._seen = max(self._seen, first + span - 1)
            return np.int64(first)

    def saw(self, epoch: int) -> None:
        """A pass read (or, at its end, passed) ``epoch``: the next pass starts after it."""
        with self._lock:
            self._seen = max(self._seen, epoch)

    def set(self, epoch: int) -> None:
        """The next pass starts at ``epoch``, whatever was read before."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        with self._lock:
            self._next = epoch
            self._seen = epoch - 1

    @property
    def next(self) -> int:
        """The first epoch the next pass reads."""
        with self._lock:
            return max(self._next, self._seen + 1)


def planned(
    tasks: PlanTasks,
    schema: Schema,
    names: list[str],
    batch_size: int | None,
    epoch: int,
    epochs: int | None,
    limits: DecodeLimits | None,
    images: ImagesStep | None = None,
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    dense: NativeTasks | None = None,
) -> tuple[Any, Passes]:
    """Passes of epochs of the plan: epoch and task numbers from ``Dataset.range``,
    records per task; and the :class:`Passes` that numbers each pass's epochs.

    ``finish`` (a tensorflow-datasets split's) maps each decoded record, and
    ``images`` decodes its images; either makes the path record by record.
    ``dense`` (:mod:`recordkit.tf.native`) decodes each task into its tensors in
    C, with no ``parse_example``.

    The only iterator state is positions in ``range`` datasets (the pass's first
    epoch among them, and the records already split off a task), which
    ``tf.train.Checkpoint(iterator=...)`` saves; every task's records are a pure
    function of its epoch and number. The dataset is prefetched inside the pass,
    so that making an iterator reads nothing (nor takes an epoch) until it is used.
    """
    autotune = tf.data.AUTOTUNE
    spec = feature_spec(schema, names)
    fast = _fast(schema, names) and images is None and finish is None and dense is None
    per_pass = 0 if not tasks.tasks else epochs  # nothing to read: endless would never yield
    passes = Passes(epoch, per_pass)

    def read_task(e: Any, t: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        passes.saw(int(e))
        return tasks.read(e, t)

    def read(e: Any, t: Any) -> Any:
        buf, starts, lengths = tf.numpy_function(
            read_task, [e, t], [tf.string, tf.int64, tf.int64], stateful=False
        )
        records = tf.strings.substr(buf[0], starts, lengths)
        records.set_shape([None])
        if images is None:
            return records
        n = tf.shape(records, out_type=tf.int64)[0]  # each record's place: epoch, task, row
        return records, tf.fill([n], e), tf.fill([n], t), tf.range(n)

    def announced(e: Any, t: Any) -> Any:
        t = tf.numpy_function(tasks.announce, [e, t], tf.int64, stateful=False)
        t.set_shape([])
        return t

    def one_epoch(e: Any) -> Any:
        ds = tf.data.Dataset.range(tasks.tasks)
        if tasks.feed is not None:  # in stream order: where a pass starts (whole epochs)
            ds = ds.map(lambda t: announced(e, t))
        if dense is not None:
            read_dense = dense.element
            # ragged features cut into batches by slices (see NativeTasks.batches)
            cut = batch_size is not None and tasks.task_units > 1 and bool(dense.lists)
            ds = ds.map(
                lambda t: read_dense(e, t, passes.saw, flat=cut),
                num_parallel_calls=_CPUS,
                deterministic=True,
            )
            # A task of one batch is that batch: rebatch would copy it (every string too).
            # Tasks are whole units: only an epoch's last batch can be short.
            if batch_size is None:
                ds = ds.unbatch()
            elif tasks.task_units == 1:
                return ds
            elif cut:
                ds = ds.flat_map(lambda el: dense.batches(el, batch_size))
            else:
                ds = ds.rebatch(batch_size)
            # Padded rows are as wide as the task's widest value: each batch (record) is cut
            # to its own here, before the prefetch (as a stage after it: W2 -25%, measured).
            # A record's ragged values come out of unbatch as a ragged spec of rank 0: the
            # map makes them the dense tensors parse_example gives.
            if dense.padded or (batch_size is None and dense.lists):
                return ds.map(dense.trimmed)
            return ds
        ds = ds.map(lambda t: read(e, t), num_parallel_calls=autotune, deterministic=True)
        if fast:
            # tasks are whole units: only an epoch's last batch can be short
            return ds.rebatch(batch_size) if batch_size is not None else ds
        parse = record_parser(schema, names, spec, limits, images, finish)
        ds = ds.unbatch().map(parse, num_parallel_calls=autotune, deterministic=True)
        return ds.ragged_batch(batch_size) if batch_size is not None else ds

    def passed(e: Any) -> Any:
        passes.saw(int(e))
        tasks.release()  # the pass read its last task: its buffers go back to the system
        if dense is not None:
            dense.release()
        return np.int64(int(e))

    def one_pass(first: Any) -> Any:
        if per_pass is None:
            numbers = tf.data.Dataset.counter(first)
        else:
            numbers = tf.data.Dataset.range(first, first + per_pass)
            # Asked for at the end of the pass (or by read-ahead): a pass restored
            # at its very end reads no task, but the next pass still starts after it.
            last = first + per_pass - 1
            end = tf.data.Dataset.range(1).map(
                lambda _: tf.numpy_function(passed, [last], tf.int64, stateful=False)
            )
            numbers = numbers.concatenate(end.filter(lambda _: False))
        ds = numbers.flat_map(one_epoch)
        if fast:
            decode = _decoder(schema, names, batched=True, limits=limits)
            ds = ds.map(
                lambda s: decode(tf.io.parse_example(s, spec)),
                num_parallel_calls=autotune,
                deterministic=True,
            )
            if batch_size is None:
                ds = ds.unbatch()
        return ds.prefetch(autotune)

    # stateful=False: the number a pass takes is saved with the iterator, never drawn
    # again on restore, so the pipeline's state is all in the checkpoint.
    first = tf.data.Dataset.range(1).map(
        lambda i: tf.numpy_function(passes.begin, [i], tf.int64, stateful=False)
    )
    ds = first.flat_map(one_pass)
    opts = tf.data.Options()
    opts.experimental_optimization.inject_prefetch = False  # a prefetch would take an epoch
    no_model_thread(opts)
    ds = ds.with_options(opts)
    # batches (or records without a batch size) per epoch, times epochs; flat_map hides it
    length = tf.data.INFINITE_CARDINALITY if per_pass is None else tasks.units * per_pass
    return ds.apply(tf.data.experimental.assert_cardinality(length)), passes


def no_model_thread(opts: Any) -> Any:
    """No autotuning model thread: dropping an iterator (every pass's end: Keras makes one
    per epoch) waits for that thread's next wake-up, 10 ms after the start and then at
    doubling intervals: measured 0 to 300 ms, a W1 epoch of 0.3 s taking 0.64 (a bare
    ``tf.data`` map pipeline too). ``AUTOTUNE`` then means one call per CPU for a map and
    the prefetch's own buffer sizing; the native path's reads are one per CPU anyway.
    W1/W2 read as fast or faster without it (docs/performance.md;
    ``benchmarks/pass_end_bench.py`` measures the drops). Returns ``opts``."""
    opts.autotune.enabled = False
    return opts


def record_parser(
    schema: Schema,
    names: list[str],
    spec: dict[str, Any],
    limits: DecodeLimits | None,
    images: ImagesStep | None,
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[..., dict[str, Any]]:
    """``(record, *position) -> element``: parse one record (and decode its images, or
    finish a tensorflow-datasets record)."""
    decode = _decoder(schema, names, batched=False, limits=limits)

    def parse(record: Any, *position: Any) -> dict[str, Any]:
        element = decode(tf.io.parse_single_example(record, spec))
        if finish is not None:
            element = finish(element)
        return element if images is None else images(element, position)

    return parse


def native(
    files: list[str],
    manifest: Manifest | None,
    schema: Schema,
    names: list[str],
    spec: dict[str, Any],
    counts: dict[str, int] | None,
    by_record: bool,
    epoch_files: Callable[[], Any] | None,
    *,
    batch_size: int | None,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int,
    drop_remainder: bool,
    input_context: Any,
    deterministic: bool,
    num_parallel_reads: int | None,
    limits: DecodeLimits | None,
    images: ImagesStep | None = None,
) -> Any:
    """One epoch through ``TFRecordDataset``: the order without shuffle, the cache, gs://."""
    autotune = tf.data.AUTOTUNE
    if num_parallel_reads is None:
        num_parallel_reads = 4
    cycle = max(1, min(num_parallel_reads, len(files)))
    avg = (
        manifest.bytes / manifest.records
        if manifest and manifest.records
        else avg_record_bytes(files[0])
    )
    # Small records are handed over in chunks; a big record is worth its own element
    # (chunking it would only add a copy).
    chunk = 1 if avg >= _CHUNK_MIN_RECORD else int(min(_CHUNK_RECORDS, _CHUNK_BYTES // avg))
    if epoch_files is not None:  # a new shard list, from the cache, every iteration
        ds = tf.data.Dataset.from_generator(
            epoch_files, output_signature=tf.TensorSpec([], tf.string)
        )
    else:
        ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, dtype=tf.string))
    if shuffle and len(files) > 1 and epoch_files is None:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)

    # Shards are read in chunks of consecutive serialized records: a parallel
    # interleave then hands over one tensor per chunk instead of one per record.
    def read(f: Any) -> Any:
        records = tf.data.TFRecordDataset(f, buffer_size=_READ_BUFFER)
        if images is not None:  # each record with its place: file and record number
            records = records.enumerate().map(lambda n, r: (r, f, n))
        return records.batch(chunk) if chunk > 1 else records

    if cycle == 1:  # shard after shard, in dataset order
        ds = ds.flat_map(read)
    else:  # chunks alternate between ``cycle`` shards read in parallel
        ds = ds.interleave(
            read,
            cycle_length=cycle,
            block_length=1,
            num_parallel_calls=cycle,  # one reader thread per open shard, as TFRecordDataset
            deterministic=deterministic,
        )
    opts = tf.data.Options()
    opts.deterministic = deterministic
    ds = ds.with_options(opts)
    fast = _fast(schema, names) and images is None
    per_record = by_record or shuffle or not fast or chunk == 1
    if per_record:
        if chunk > 1:
            ds = ds.unbatch()
        if by_record:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    if fast:
        decode = _decoder(schema, names, batched=True, limits=limits)
        if batch_size is not None:
            if per_record:
                ds = ds.batch(batch_size, drop_remainder=drop_remainder)
            else:
                ds = ds.rebatch(batch_size, drop_remainder=drop_remainder)
        elif per_record:
            ds = ds.batch(chunk)
        ds = ds.map(
            lambda s: decode(tf.io.parse_example(s, spec)),
            num_parallel_calls=autotune,
            deterministic=deterministic,
        )
        if batch_size is None:
            ds = ds.unbatch()
    else:
        parse = record_parser(schema, names, spec, limits, images)
        ds = ds.map(parse, num_parallel_calls=autotune, deterministic=deterministic)
        if batch_size is not None:
            ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    if counts is not None:  # len(ds) and Keras' steps per epoch
        records = sum(counts[f] for f in files)
        if by_record:
            p, i = input_context.num_input_pipelines, input_context.input_pipeline_id
            records = max(0, records - i + p - 1) // p
        if batch_size is not None:
            records = records // batch_size if drop_remainder else -(-records // batch_size)
        ds = ds.apply(tf.data.experimental.assert_cardinality(records))
    return ds
