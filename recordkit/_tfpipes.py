"""The two ``tf.data`` graphs under every ``recordkit.tf`` pipeline (used by the builders
of :mod:`recordkit._tfbuild`).

:func:`planned`: epochs of the epoch plan, epoch and task numbers from
``Dataset.range`` (what ``tf.train.Checkpoint`` saves), one stateless
``tf.numpy_function`` per task. :func:`native`: ``TFRecordDataset`` over a list of
shards with a parallel interleave, in chunks of records. Both end in
``parse_example`` (or a record-by-record parse where images, tfds features or
ragged values need it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._deps import require
from ._tfdecode import decoder as _decoder
from ._tfdecode import fast as _fast
from ._tffiles import avg_record_bytes, feature_spec
from ._tfimages import ImagesStep
from ._tftasks import PlanTasks
from .codec import Schema
from .codec.limits import DecodeLimits
from .format.manifest import Manifest

tf = require("tensorflow", extra="tf")

__all__ = ["native", "planned", "record_parser"]

# Records read as one chunk (one element between the reader threads and the
# rest of the pipeline): up to this many records or bytes; records of at least
# _CHUNK_MIN_RECORD bytes (mean) are not chunked.
_CHUNK_RECORDS = 1024
_CHUNK_BYTES = 1 << 20
_CHUNK_MIN_RECORD = 64 << 10
# Read-ahead per open shard (TFRecordDataset's buffer_size): big sequential reads.
_READ_BUFFER = 8 << 20


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
) -> Any:
    """Epochs of the plan: epoch and task numbers from ``Dataset.range``, records per task.

    ``finish`` (a tensorflow-datasets split's) maps each decoded record, and
    ``images`` decodes its images; either makes the path record by record.

    The only iterator state is positions in ``range`` datasets (and the records
    already split off a task), which ``tf.train.Checkpoint(iterator=...)``
    saves; every task's records are a pure function of its epoch and number.
    """
    autotune = tf.data.AUTOTUNE
    spec = feature_spec(schema, names)
    fast = _fast(schema, names) and images is None and finish is None

    def read(e: Any, t: Any) -> Any:
        buf, starts, lengths = tf.numpy_function(
            tasks.read, [e, t], [tf.string, tf.int64, tf.int64], stateful=False
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
        ds = ds.map(lambda t: read(e, t), num_parallel_calls=autotune, deterministic=True)
        if fast:
            # tasks are whole units: only an epoch's last batch can be short
            return ds.rebatch(batch_size) if batch_size is not None else ds
        parse = record_parser(schema, names, spec, limits, images, finish)
        ds = ds.unbatch().map(parse, num_parallel_calls=autotune, deterministic=True)
        return ds.ragged_batch(batch_size) if batch_size is not None else ds

    if not tasks.tasks:  # nothing to read: endless empty epochs would never yield
        epochs = 0
    if epochs is None:
        numbers = tf.data.Dataset.counter(epoch)
    else:
        numbers = tf.data.Dataset.range(epoch, epoch + epochs)
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
    # batches (or records without a batch size) per epoch, times epochs; flat_map hides it
    length = tf.data.INFINITE_CARDINALITY if epochs is None else tasks.units * epochs
    return ds.apply(tf.data.experimental.assert_cardinality(length))


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
