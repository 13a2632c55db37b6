"""Where a ``recordkit.tf`` pipeline's records are: shard files, schemas, feature specs.

Local paths and ``gs://`` (TensorFlow's file system layer), a shard cache's epochs,
completeness, and the ``parse_example`` spec of a schema (imported by the builders of
:mod:`recordkit.tf.build` and re-exported by :mod:`recordkit.tf`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._deps import require
from ..codec import Bytes, Float32, Int64, Schema, Tensor
from ..errors import InvalidIndexError, SchemaError, ShardNotFoundError
from ..format import SHARD_PATTERNS, open_regular
from ..format.complete import check_complete
from ..format.index import INDEX_SUFFIX, parse_index
from ..format.manifest import MANIFEST_NAME, Manifest, read_manifest
from ..reader.finding import find_shards
from ..reader.growing import CacheEpochs
from ..reader.tfds import tfds_folder
from ..storage import is_temp_name, strip_file_scheme
from .decode import COMPANION as _COMPANION

tf = require("tensorflow", extra="tf")

__all__ = [
    "avg_record_bytes",
    "cached_files",
    "check_finished",
    "column_names",
    "feature_spec",
    "infer",
    "is_tfds",
    "join",
    "locate",
    "says_sequences",
    "shard_files",
]

# URL schemes TensorFlow's file system layer reads by itself.
_TF_NATIVE = ("gs://",)


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
    for name in column_names(schema, columns):
        ftype = schema[name]
        # A feature with a default: a record without it parses as the default (a fixed
        # shape), or as no values (None dims: a RaggedFeature reads absence so anyway).
        default = None if ftype.required else ftype.default_value()[1]
        if isinstance(ftype, Tensor):
            value = None if default is None else bytes(default[0])
            spec[name] = tf.io.FixedLenFeature([], tf.string, default_value=value)
        else:
            dtype = {Bytes: tf.string, Int64: tf.int64, Float32: tf.float32}[type(ftype)]
            if None in ftype.shape:
                spec[name] = tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
            else:
                if default is not None and not isinstance(ftype, Bytes):
                    default = np.asarray(default).reshape(ftype.shape)  # type: ignore[arg-type]
                elif default is not None:
                    default = [bytes(v) for v in default] if ftype.shape else bytes(default[0])
                spec[name] = tf.io.FixedLenFeature(list(ftype.shape), dtype, default)
        if ftype.shape_feature:
            rank = len(ftype.shape)
            zeros = None if ftype.required else [0] * rank  # absent: an empty value
            spec[name + _COMPANION] = tf.io.FixedLenFeature([rank], tf.int64, zeros)
    return spec


def column_names(schema: Schema, columns: Sequence[str] | None) -> list[str]:
    """The features to read, in schema order (all without ``columns``)."""
    if columns is None:
        return list(schema.names)
    missing = [c for c in columns if c not in schema]
    if missing:
        raise SchemaError(f"columns {missing} are not in the schema {list(schema.names)}")
    return [n for n in schema.names if n in set(columns)]


# -- where the shards are ----------------------------------------------------------------------


def _is_native(path: str) -> bool:
    return "://" not in path or path.startswith(_TF_NATIVE)


def join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if "://" in root else os.path.join(root, rel)


def locate(path: str, schema: Schema | None) -> tuple[list[str], Schema, Manifest | None]:
    """Shard paths (in manifest or name order), the schema, and the manifest if any."""
    path = strip_file_scheme(path)
    if not _is_native(path):
        raise ShardNotFoundError(
            f"{path!r}: TensorFlow cannot read this URL scheme itself; read it through "
            "recordkit's local shard cache (recordkit.cache), or copy the shards to local "
            "disk or gs://"
        )
    gfile = tf.io.gfile
    manifest_path = join(path, MANIFEST_NAME)
    local = "://" not in path
    if local and os.path.isdir(path) and os.path.lexists(manifest_path):
        # recordkit's own reading: a FIFO or a directory there is refused, never waited on
        manifest = read_manifest(path)
        files = [join(path, s.path) for s in manifest.shards]
        return files, Schema.from_json(manifest.schema) if schema is None else schema, manifest
    if not local and gfile.isdir(path) and gfile.exists(manifest_path):
        with gfile.GFile(manifest_path, "rb") as f:
            manifest = Manifest.loads(f.read(), path=manifest_path)
        files = [join(path, s.path) for s in manifest.shards]
        return files, Schema.from_json(manifest.schema) if schema is None else schema, manifest
    if gfile.isdir(path):
        if "://" in path:
            found = {p for pat in SHARD_PATTERNS for p in gfile.glob(join(path, pat))}
            names = sorted(
                os.path.basename(p)
                for p in found
                if not p.endswith(INDEX_SUFFIX) and not is_temp_name(os.path.basename(p))
            )
        else:
            names = find_shards(path)
        files = [join(path, n) for n in names]
    elif gfile.exists(path):
        files = [path]
    else:
        raise ShardNotFoundError(f"no such dataset: {path}")
    if not files:
        raise ShardNotFoundError(f"no manifest and no .tfrecord files in {path}")
    if schema is None:
        schema = infer(files[0])
    return files, schema, None


def says_sequences(path: str) -> bool:
    """A dataset whose manifest says its records are SequenceExamples (read whole)."""
    gfile = tf.io.gfile
    manifest_path = join(path, MANIFEST_NAME)
    if "://" not in path:  # recordkit's own reading: a FIFO there is refused, never waited on
        if os.path.isdir(path) and os.path.lexists(manifest_path):
            return read_manifest(path).sequence_example
        return False
    if not (_is_native(path) and gfile.isdir(path) and gfile.exists(manifest_path)):
        return False
    with gfile.GFile(manifest_path, "rb") as f:
        return Manifest.loads(f.read(), path=manifest_path).sequence_example


def check_finished(path: str, partial: bool) -> None:
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
            with gfile.GFile(join(path, rel), "rb") as f:
                return bytes(f.read(1 << 16))
        except tf.errors.NotFoundError:
            return None

    def listdir(rel: str) -> list[str]:
        try:
            return [n.rstrip("/") for n in gfile.listdir(join(path, rel) if rel else path)]
        except tf.errors.NotFoundError:
            return []

    check_complete(path, partial, read=read, listdir=listdir)


def _not_an_index(reason: str, path: str) -> InvalidIndexError:
    return InvalidIndexError(f"index {reason}", path=path)


def avg_record_bytes(path: str) -> float:
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


def infer(first: str) -> Schema:
    from ..codec.example import decode_example  # light: the codec is loaded already
    from ..format.framing import read_stream

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


def cached_files(
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
        schema = Schema.from_json(manifest.schema) if manifest else infer(first.paths[0])
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


def is_tfds(path: str) -> bool:
    """A local tensorflow-datasets folder (or shard) without a manifest of ours."""
    local = os.path.abspath(path)
    folder = local if os.path.isdir(local) else os.path.dirname(local)
    return (
        not os.path.exists(os.path.join(folder, MANIFEST_NAME)) and tfds_folder(local) is not None
    )
