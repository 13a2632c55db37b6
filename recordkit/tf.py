"""TensorFlow: read recordkit datasets into ``tf.data``, in the epoch plan's order.

:func:`dataset` builds a ``tf.data.Dataset`` from a dataset's manifest (or a
folder of foreign TFRecords plus a schema) with no Python in the per-record
path. Shuffled, or split over input pipelines, the records come in the order of
:class:`~recordkit.reader.plan.EpochPlan` (the one ``recordkit.torch`` reads):
epoch and task numbers from ``Dataset.range`` (positions that
``tf.train.Checkpoint`` saves), one stateless ``tf.numpy_function`` per task of
thousands of records that verifies and gathers them natively
(:mod:`recordkit._tftasks`), and ``tf.strings.substr`` to split them. One
unshuffled pipeline (and the shard cache, and ``gs://``) reads with
``TFRecordDataset`` over the shard list with a parallel interleave. Then
``tf.io.parse_example`` with a feature spec derived from the schema,
``tf.io.decode_raw`` for :class:`~recordkit.codec.Tensor` features, and
``prefetch(AUTOTUNE)``. :func:`feature_spec` gives that spec to users who build
their own pipeline.

What each feature becomes (``B`` = the batch dimension, absent without ``batch_size``):

=====================================  ==================================================
schema                                 element
=====================================  ==================================================
``Bytes()``                            ``tf.string`` ``[B]``
``Bytes((n,))``                        ``tf.string`` ``[B, n]``
``Bytes((None,))``                     ``tf.string`` ragged ``[B, None]``
``Int64(shape)`` / ``Float32(shape)``  ``tf.int64`` / ``tf.float32`` ``[B, *shape]``
``Tensor(dtype, shape)``               ``dtype`` ``[B, *shape]``
=====================================  ==================================================

A shape with ``None`` dims gives, batched, a ``tf.RaggedTensor`` whose ragged
dims are those ``None`` dims (per-record shapes are honoured: one ``None`` is
recovered from the element count, two or more from the ``name/shape``
companion feature). A zstd-compressed ``Tensor`` is decompressed in a
``tf.numpy_function`` -- the slow path: Python, under the GIL, once per record.

Remote datasets: paths TensorFlow reads natively (local paths and ``gs://``)
go straight to TensorFlow's file system layer; other URLs (``s3://``,
``http(s)://``, ...) raise an error naming the local shard cache, through which
they are read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from ._deps import require
from ._tfdecode import COMPANION as _COMPANION
from ._tfdecode import decoder as _decoder
from ._tfdecode import fast as _fast
from ._tfimages import ImagesStep, file_locator, images_step, task_locator
from ._tftasks import PlanTasks
from .codec import Bytes, Float32, Int64, Schema, Tensor
from .codec.limits import DecodeLimits
from .errors import InvalidIndexError, SchemaError, ShardNotFoundError
from .format import open_regular
from .format.complete import check_complete
from .format.index import INDEX_SUFFIX, parse_index
from .format.manifest import MANIFEST_NAME, Manifest, read_manifest
from .images import ImageOptions
from .reader.epochs import CacheEpochs, TaskFeed, WholeEpochs, open_cache
from .reader.plan import PlanOptions
from .reader.shards import open_shards
from .reader.tfds import tfds_folder
from .storage import is_temp_name, strip_file_scheme

tf = require("tensorflow", extra="tf")

__all__ = ["dataset", "feature_spec", "shard_files"]

# URL schemes TensorFlow's file system layer reads by itself.
_TF_NATIVE = ("gs://",)
# Records read as one chunk (one element between the reader threads and the
# rest of the pipeline): up to this many records or bytes; records of at least
# _CHUNK_MIN_RECORD bytes (mean) are not chunked.
_CHUNK_RECORDS = 1024
_CHUNK_BYTES = 1 << 20
_CHUNK_MIN_RECORD = 64 << 10
# Read-ahead per open shard (TFRecordDataset's buffer_size): big sequential reads.
_READ_BUFFER = 8 << 20


def feature_spec(schema: Schema, columns: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``tf.io.parse_example`` feature spec of a schema.

    Fixed shapes become ``tf.io.FixedLenFeature``; a shape with ``None`` dims
    becomes a ``tf.io.RaggedFeature`` holding the record's flat values (reshape
    them with the per-record shape, see the module docs), and for two or more
    ``None`` dims the ``"name/shape"`` companion is added as a fixed int64
    vector. :class:`~recordkit.codec.Tensor` values parse as one ``tf.string``
    holding the raw (or zstd) bytes, for ``tf.io.decode_raw``.

    Args:
        schema: the dataset's schema.
        columns: only these features (default: all).

    Raises:
        SchemaError: a column is not in the schema.
    """
    spec: dict[str, Any] = {}
    for name in _columns(schema, columns):
        ftype = schema[name]
        if isinstance(ftype, Tensor):
            spec[name] = tf.io.FixedLenFeature([], tf.string)
        else:
            dtype = {Bytes: tf.string, Int64: tf.int64, Float32: tf.float32}[type(ftype)]
            if None in ftype.shape:
                spec[name] = tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
            else:
                spec[name] = tf.io.FixedLenFeature(list(ftype.shape), dtype)
        if ftype.shape_feature:
            spec[name + _COMPANION] = tf.io.FixedLenFeature([len(ftype.shape)], tf.int64)
    return spec


def _columns(schema: Schema, columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        return list(schema.names)
    missing = [c for c in columns if c not in schema]
    if missing:
        raise SchemaError(f"columns {missing} are not in the schema {list(schema.names)}")
    return [n for n in schema.names if n in set(columns)]


# -- where the shards are ----------------------------------------------------------------------


def _is_native(path: str) -> bool:
    return "://" not in path or path.startswith(_TF_NATIVE)


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if "://" in root else os.path.join(root, rel)


def _locate(path: str, schema: Schema | None) -> tuple[list[str], Schema, Manifest | None]:
    """Shard paths (in manifest or name order), the schema, and the manifest if any."""
    from .format import SHARD_PATTERNS
    from .reader.shards import find_shards  # folders of foreign TFRecords

    path = strip_file_scheme(path)
    if not _is_native(path):
        raise ShardNotFoundError(
            f"{path!r}: TensorFlow cannot read this URL scheme itself; read it through "
            "recordkit's local shard cache (recordkit.cache), or copy the shards to local "
            "disk or gs://"
        )
    gfile = tf.io.gfile
    manifest_path = _join(path, MANIFEST_NAME)
    local = "://" not in path
    if local and os.path.isdir(path) and os.path.lexists(manifest_path):
        # recordkit's own reading: a FIFO or a directory there is refused, never waited on
        manifest = read_manifest(path)
        files = [_join(path, s.path) for s in manifest.shards]
        return files, Schema.from_json(manifest.schema) if schema is None else schema, manifest
    if not local and gfile.isdir(path) and gfile.exists(manifest_path):
        with gfile.GFile(manifest_path, "rb") as f:
            manifest = Manifest.loads(f.read(), path=manifest_path)
        files = [_join(path, s.path) for s in manifest.shards]
        return files, Schema.from_json(manifest.schema) if schema is None else schema, manifest
    if gfile.isdir(path):
        if "://" in path:
            found = {p for pat in SHARD_PATTERNS for p in gfile.glob(_join(path, pat))}
            names = sorted(
                os.path.basename(p)
                for p in found
                if not p.endswith(INDEX_SUFFIX) and not is_temp_name(os.path.basename(p))
            )
        else:
            names = find_shards(path)
        files = [_join(path, n) for n in names]
    elif gfile.exists(path):
        files = [path]
    else:
        raise ShardNotFoundError(f"no such dataset: {path}")
    if not files:
        raise ShardNotFoundError(f"no manifest and no .tfrecord files in {path}")
    if schema is None:
        schema = _infer(files[0])
    return files, schema, None


def _says_sequences(path: str) -> bool:
    """A dataset whose manifest says its records are SequenceExamples (read whole)."""
    gfile = tf.io.gfile
    manifest_path = _join(path, MANIFEST_NAME)
    if "://" not in path:  # recordkit's own reading: a FIFO there is refused, never waited on
        if os.path.isdir(path) and os.path.lexists(manifest_path):
            return read_manifest(path).sequence_example
        return False
    if not (_is_native(path) and gfile.isdir(path) and gfile.exists(manifest_path)):
        return False
    with gfile.GFile(manifest_path, "rb") as f:
        return Manifest.loads(f.read(), path=manifest_path).sequence_example


def _check_complete(path: str, partial: bool) -> None:
    """Refuse an unfinished write of ours (through ``tf.io.gfile``, so ``gs://`` too)."""
    gfile = tf.io.gfile
    if "://" not in path:  # the local reading opens regular files only (a FIFO never blocks)
        if os.path.isdir(path):
            check_complete(path, partial)
        return
    if not _is_native(path) or not gfile.isdir(path):
        return

    def read(rel: str) -> bytes | None:
        try:
            with gfile.GFile(_join(path, rel), "rb") as f:
                return bytes(f.read(1 << 16))
        except tf.errors.NotFoundError:
            return None

    def listdir(rel: str) -> list[str]:
        try:
            return [n.rstrip("/") for n in gfile.listdir(_join(path, rel) if rel else path)]
        except tf.errors.NotFoundError:
            return []

    check_complete(path, partial, read=read, listdir=listdir)


def _not_an_index(reason: str, path: str) -> InvalidIndexError:
    return InvalidIndexError(f"index {reason}", path=path)


def _avg(path: str) -> float:
    """Mean framed record size of a foreign shard, from the head of its index if it has one."""
    try:
        if "://" in path:
            with tf.io.gfile.GFile(path + INDEX_SUFFIX, "rb") as f:
                head = f.read(1 << 20)
        else:  # only a regular file: an index that is a FIFO must not block
            fd = open_regular(path + INDEX_SUFFIX, _not_an_index)
            with open(fd, "rb", closefd=True) as f:
                head = f.read(1 << 20)
        entries = parse_index(head[: head.rfind(b"\n") + 1], path=path + INDEX_SUFFIX)
    except (tf.errors.OpError, OSError, InvalidIndexError):
        entries = None
    if entries is None or not len(entries):
        return 4096.0  # no usable index: assume small records
    return float(entries[:, 1].mean())


def _infer(first: str) -> Schema:
    from .codec.example import decode_example
    from .format.framing import read_stream

    with tf.io.gfile.GFile(first, "rb") as f:  # the leading records only
        examples = [decode_example(p) for p in itertools.islice(read_stream(f, path=first), 64)]
    if not examples:
        raise ShardNotFoundError(f"cannot infer a schema from {first}: it has no records")
    return Schema.infer(examples)


def shard_files(
    files: Sequence[str], num_pipelines: int, pipeline_id: int
) -> tuple[list[str], bool]:
    """This pipeline's share of ``files``: ``(files, by_record)``.

    With at least as many shards as pipelines each pipeline takes every
    ``num_pipelines``-th shard (whole files, no wasted reads); otherwise every
    pipeline reads all shards and keeps every ``num_pipelines``-th record
    (``by_record=True``). Either way every record goes to exactly one pipeline.
    """
    if num_pipelines < 1 or not 0 <= pipeline_id < num_pipelines:
        raise ValueError(f"bad input context: pipeline {pipeline_id} of {num_pipelines}")
    if len(files) >= num_pipelines:
        return list(files[pipeline_id::num_pipelines]), False
    return list(files), num_pipelines > 1


# -- the shard cache --------------------------------------------------------------------------


def _cached_files(
    epochs: CacheEpochs,
    schema: Schema | None,
    seed: int,
    shuffle: bool,
    input_context: Any,
) -> tuple[Callable[[], Any], list[str], Schema, Manifest | None]:
    """A generator of each epoch's shard paths (rescanning the cache), and the first set."""
    first = epochs.take(0)
    manifest = first.manifest
    if manifest is not None and manifest.sequence_example:
        epochs.close()  # lets the epoch's shards go (and stops a cache made for this call)
        raise ValueError(
            f"{epochs.cache.remote_url}: a manifest that says its records are SequenceExamples: "
            "they are read whole, not through a shard cache"
        )
    if schema is None:
        schema = Schema.from_json(manifest.schema) if manifest else _infer(first.paths[0])
    held: dict[str, Any] = {"epoch": 0, "first": first}

    def epoch_files() -> Any:
        epoch = held["epoch"]
        held["epoch"] = epoch + 1
        taken = held.pop("first", None)
        if taken is None:  # every later epoch: the last set is done with, then rescan
            for path in held.pop("read", []):
                epochs.mark_consumed(path)  # evicted first when the budget binds
            taken = epochs.take(epoch)
        paths = taken.paths
        if shuffle:
            rng = np.random.default_rng([seed, epoch])
            paths = [paths[i] for i in rng.permutation(len(paths))]
        if input_context is not None:
            paths = paths[input_context.input_pipeline_id :: input_context.num_input_pipelines]
        # TensorFlow reads ahead of this generator: the set stays pinned until the
        # next epoch starts.
        held["read"] = paths
        yield from paths

    return epoch_files, first.paths, schema, manifest


# -- the pipeline ------------------------------------------------------------------------------


def dataset(
    path_or_url: str | os.PathLike[str],
    *,
    batch_size: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    epochs: int | None = 1,
    shuffle_buffer: int = 10_000,
    drop_remainder: bool = False,
    columns: Sequence[str] | None = None,
    input_context: Any = None,
    deterministic: bool = True,
    schema: Schema | None = None,
    num_parallel_reads: int | None = None,
    cache: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    cache_epochs: Literal["whole", "growing"] = "whole",
    cache_timeout: float | None = 600.0,
    partial: bool = False,
    limits: DecodeLimits | None = None,
    split: str | None = None,
    decode_images: bool | str | Sequence[str] | ImageOptions | None = None,
    sequence_example: bool = False,
) -> Any:
    """A ``tf.data.Dataset`` of a recordkit dataset (or a folder of TFRecords).

    The order of every epoch is the epoch plan's
    (:class:`recordkit.reader.plan.EpochPlan`, the one ``recordkit.torch``
    reads): a pure function of ``seed``, the epoch number and the position,
    never of TensorFlow's random state, so ``tf.random.set_seed`` does not
    change it, and an iterator saved with ``tf.train.Checkpoint(iterator=it)``
    continues the same stream, mid-epoch and across epochs, in a new process.
    One unshuffled pipeline reads through TensorFlow's own ``TFRecordDataset``;
    ``docs/tensorflow.md`` says which path reads what.

    Args:
        path_or_url: a dataset directory (with ``recordkit.json``), a folder of
            TFRecord files, one file, or a ``gs://`` URL of any of these.
        batch_size: batch this many records (``parse_example`` on whole batches);
            ``None`` yields single records.
        shuffle: a new order every epoch, mixed like a uniform permutation on
            sorted data too (blocks of records in a keyed order, then records
            within windows of many blocks).
        seed: the shuffle seed (0 to 2**63 - 1).
        epoch: the number of the first epoch this dataset yields (the plan's
            epoch: with ``shuffle``, each epoch number has its own order).
        epochs: epochs one pass over the dataset yields, numbered ``epoch``,
            ``epoch + 1``, ...; ``None`` repeats without end. Iterating the
            dataset again starts again at ``epoch``: keep one iterator (and
            checkpoint it), or build the dataset with the next ``epoch``.
        shuffle_buffer: records in TensorFlow's shuffle buffer, used only where
            the plan is not (a shard cache, ``gs://``).
        drop_remainder: drop the last, smaller batch; with ``input_context``
            the shuffled epoch is cut to a multiple of the global batch
            (``batch_size`` times the number of pipelines), so every pipeline
            yields the same number of full batches.
        columns: decode only these features (default: all).
        input_context: a ``tf.distribute.InputContext``: pipelines split each
            epoch by global batch, as ``torch.distributed`` ranks do: pipeline
            *i* takes the *i*-th ``batch_size`` slice of each global batch.
            Each record is read by exactly one pipeline per epoch (the last,
            partial global batch is shared evenly unless ``drop_remainder``).
        deterministic: keep the order fixed; ``False`` lets TensorFlow trade
            order for speed where it interleaves files (the native path).
        schema: the schema of a foreign folder (default: inferred from its first
            records); overrides a manifest's.
        cache: read the remote dataset through this
            :class:`recordkit.cache.ShardCache`; ``path_or_url`` is then only a
            label. How epochs read it: ``cache_epochs``.
        cache_dir: instead of ``cache``: cache the remote ``path_or_url`` here,
            within ``cache_limit`` bytes.
        cache_limit: the disk budget for ``cache_dir`` (e.g. ``"50GiB"``).
        cache_epochs: ``"whole"`` (default): every epoch reads every record of
            the remote dataset in the plan's order (the records of
            ``recordkit.torch``), the shards fetched ahead of the readers within
            the budget and evicted once the epoch is done with them; the length
            is known and ``tf.train.Checkpoint`` resumes mid-epoch. One iterator
            at a time. ``"growing"``: each time the dataset is iterated (each
            epoch) it takes every complete shard a started cache holds then,
            pinned until the next epoch starts, so epochs grow as the cache
            fills (each says at WARNING how much it reads); ``input_context``
            then splits by shard only, the length is unknown, and the order is
            not the plan's. See ``docs/cache.md``.
        cache_timeout: seconds a reader waits for one shard (whole epochs), or
            an epoch start for a first complete shard (growing epochs).
        num_parallel_reads: on the native path, shards read at once (default
            4), in parallel; their records (small records: chunks of up to 1024
            records or 1 MiB) alternate, so the order is fixed but not the
            dataset order. ``1`` reads shard after shard, in the manifest's order.
        partial: read a directory where a write of ours did not finish (the
            shards it published, with a WARNING) instead of raising
            :class:`~recordkit.errors.IncompleteDatasetError`.
        limits: the bytes a zstd value may decompress to (its
            :class:`~recordkit.codec.DecodeLimits` ``record_bytes``; default
            derived from the schema); a value over it fails the pipeline with
            :class:`~recordkit.errors.RecordTooLargeError` before it is allocated.
        split: the split of a local tensorflow-datasets folder (needed when it
            has several; or give one of its shards): elements then hold tfds's
            dtypes and shapes, as ``tfds.load`` gives them (``columns`` names
            tfds's features). Read through the epoch plan, record by record.
        decode_images: ``Bytes()`` features holding encoded images (a name, names,
            or :class:`~recordkit.images.ImageOptions` for the channels and the
            key feature) to decode with ``tf.io.decode_image``, per record, into
            ``uint8`` ``[H, W, C]`` (``[B, None, None, C]`` ragged when batched:
            resize in a ``map`` with ``batch_size=None``, then batch). An image
            that does not decode fails the pipeline with TensorFlow's
            ``InvalidArgumentError`` carrying the
            :class:`~recordkit.errors.ImageDecodeError` message: the record's
            ``file:offset:record``, the feature, the source key (``path``) and
            why. Records are then read one by one (no vectorised batch parse).
            In a tensorflow-datasets folder, ``True`` decodes its ``Image``
            features with ``tf.io.decode_image`` (as tfds does).
        sequence_example: the records are ``tf.train.SequenceExample``
            messages: each element is ``{"context": {name: 1-d tensor},
            "feature_lists": {name: ragged [steps, None]}}`` from
            ``tf.io.parse_single_sequence_example``, with specs (each feature's
            kind) from the first file's leading records; a record holding a
            feature or kind they lack fails the pipeline by name instead of being
            read in part. Batches are ragged (``ragged_batch``). Files are read in
            order (shuffled with ``shuffle``: by file, then in a buffer of
            ``shuffle_buffer`` records); no ``schema``, ``columns`` or cache.
            Implied by a manifest that says the records are SequenceExamples
            (``recordkit convert`` of them): the specs are then its schema,
            which names every feature each record holds, and TensorFlow parses
            with no check per record.

    The dataset knows its length (``len(ds)``: batches, or records, of this
    pipeline, times ``epochs``) where there is a manifest or a local folder, so
    Keras knows the steps per epoch.

    Raises:
        ShardNotFoundError: no dataset at the path, or a URL TensorFlow cannot read.
        SchemaError: a column not in the schema.
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if shuffle_buffer < 1:
        raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be >= 1 or None, got {epochs}")
    pipelines, pipeline = 1, 0
    if input_context is not None:
        pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
        shard_files([], pipelines, pipeline)  # validates them
    if (cache is not None or cache_dir is not None) and (split is not None or decode_images):
        raise ValueError(
            f"{os.fspath(path_or_url)}: split= and decode_images= are for a local "
            "tensorflow-datasets folder, not a dataset read through a shard cache"
        )
    source = open_cache(
        os.fspath(path_or_url),
        cache=cache,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        timeout=cache_timeout,
        mode=cache_epochs,
    )
    if isinstance(source, WholeEpochs):
        assert source.manifest is not None
        if sequence_example or source.manifest.sequence_example:
            raise ValueError(
                f"{os.fspath(path_or_url)}: sequence_example=True, or a manifest that says its "
                "records are SequenceExamples: they are read whole, not through a shard cache"
            )
        schema = Schema.from_json(source.manifest.schema) if schema is None else schema
        options = PlanOptions(
            shuffle=shuffle,
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_remainder,
            shard_window_bytes=source.window_bytes(shuffle),
        )
        shards = source.shard_set(schema)
        # a task's records span at most two shard windows (a quarter of the budget)
        task_bytes = max(1, min(4 << 20, source.capacity // 4))
        names = _columns(schema, columns)
        keys = feature_spec(schema, names)
        tasks = PlanTasks(shards, options, pipeline, pipelines, keys, task_bytes=task_bytes)
        tasks.feed = TaskFeed(
            source,
            shards,
            tasks.plan,
            task_units=tasks.task_units,
            tasks=tasks.tasks,
            rank=pipeline,
            world_size=pipelines,
        )
        ds = _planned(tasks, schema, names, batch_size, epoch, epochs, limits)
        return ds.prefetch(tf.data.AUTOTUNE)
    growing = source
    path = strip_file_scheme(os.fspath(path_or_url))
    # decode_images=True: a tensorflow-datasets folder's Image features (its view knows
    # them); names or ImageOptions: Bytes() features of any other data.
    tfds_images = decode_images is True
    named_images = None if isinstance(decode_images, (bool, type(None))) else decode_images
    if sequence_example or (growing is None and _says_sequences(path)):
        if schema is not None or columns is not None or growing is not None:
            raise ValueError(
                f"{path}: sequence_example=True, or a manifest that says so: records are read "
                "whole: no schema, columns or cache"
            )
        if decode_images:
            raise ValueError(
                f"{path}: sequence_example=True, or a manifest that says so: records are read "
                "whole: no decode_images"
            )
        from ._tfsequence import pipeline as sequences

        _check_complete(path, partial)
        files, _, manifest = _locate(os.fspath(path_or_url), Schema({}))
        by_record = False
        if input_context is not None:
            files, by_record = shard_files(files, pipelines, pipeline)
        ds = sequences(
            files,
            batch_size,
            shuffle,
            seed,
            shuffle_buffer,
            drop_remainder,
            by_record,
            input_context,
            manifest,
            path,
        )
        if epochs != 1:
            ds = ds.repeat(epochs)
        return ds.prefetch(tf.data.AUTOTUNE)
    tfds = (
        growing is None
        and "://" not in path
        and (split is not None or tfds_images or _is_tfds(path))
    )
    if tfds or (growing is None and "://" not in path and (shuffle or pipelines > 1)):
        if not os.path.exists(path):
            raise ShardNotFoundError(f"no such dataset: {path}")
        shards = open_shards(path, schema, partial=partial, split=split)
        view = shards.view
        if tfds_images and view is None:
            raise ValueError(_TFDS_IMAGES_ONLY)
        if view is not None and named_images is not None:
            raise ValueError(
                "a tensorflow-datasets folder's Image features are decoded with "
                f"decode_images=True, not decode_images={decode_images!r}"
            )
        finish = None
        if view is not None:
            view = view.with_options(decode_images=tfds_images, limits=limits)
            names = view.stored_columns(columns) or list(shards.schema.names)
            finish = _tfds_finisher(view, columns)
        else:
            names = _columns(shards.schema, columns)
        options = PlanOptions(
            shuffle=shuffle, seed=seed, batch_size=batch_size, drop_last=drop_remainder
        )
        tasks = PlanTasks(shards, options, pipeline, pipelines, feature_spec(shards.schema, names))
        images = images_step(named_images, shards.schema, names, task_locator(tasks))
        ds = _planned(
            tasks, shards.schema, names, batch_size, epoch, epochs, limits, images, finish
        )
        return ds.prefetch(tf.data.AUTOTUNE)
    epoch_files = None
    if growing is not None:
        epoch_files, files, schema, manifest = _cached_files(
            growing, schema, seed, shuffle, input_context
        )
    else:
        _check_complete(strip_file_scheme(os.fspath(path_or_url)), partial)
        files, schema, manifest = _locate(os.fspath(path_or_url), schema)
    names = _columns(schema, columns)
    spec = feature_spec(schema, names)
    if tfds_images:  # a cache or a URL: never a tensorflow-datasets folder
        raise ValueError(_TFDS_IMAGES_ONLY)
    images = images_step(named_images, schema, names, file_locator)
    counts = dict(zip(files, (s.records for s in manifest.shards))) if manifest else None
    by_record = False
    if epoch_files is not None:
        counts = None  # the set changes from epoch to epoch
    elif input_context is not None:
        files, by_record = shard_files(files, pipelines, pipeline)
    ds = _native_pipeline(
        files,
        manifest,
        schema,
        names,
        spec,
        counts,
        by_record,
        epoch_files,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer=shuffle_buffer,
        drop_remainder=drop_remainder,
        input_context=input_context,
        deterministic=deterministic,
        num_parallel_reads=num_parallel_reads,
        limits=limits,
        images=images,
    )
    if epochs != 1:
        ds = ds.repeat(epochs)
    return ds.prefetch(tf.data.AUTOTUNE)


_TFDS_IMAGES_ONLY = (
    "decode_images=True is for tensorflow-datasets folders; name the Bytes() features "
    "that hold encoded images in other data (decode_images='image')"
)


def _is_tfds(path: str) -> bool:
    """A local tensorflow-datasets folder (or shard) without a manifest of ours."""
    local = os.path.abspath(path)
    folder = local if os.path.isdir(local) else os.path.dirname(local)
    return (
        not os.path.exists(os.path.join(folder, MANIFEST_NAME)) and tfds_folder(local) is not None
    )


def _tfds_finisher(view: Any, columns: Sequence[str] | None) -> Any:
    from ._tftfds import finisher

    return finisher(view, columns)


def _planned(
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

    def one_epoch(e: Any) -> Any:
        ds = tf.data.Dataset.range(tasks.tasks).map(
            lambda t: read(e, t), num_parallel_calls=autotune, deterministic=True
        )
        if fast:
            # tasks are whole units: only an epoch's last batch can be short
            return ds.rebatch(batch_size) if batch_size is not None else ds
        parse = _per_record(schema, names, spec, limits, images, finish)
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


def _per_record(
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


def _native_pipeline(
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
    avg = manifest.bytes / manifest.records if manifest and manifest.records else _avg(files[0])
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
        parse = _per_record(schema, names, spec, limits, images)
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
