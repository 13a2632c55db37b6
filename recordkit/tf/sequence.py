"""SequenceExamples in ``recordkit.tf``: ``tf.io.parse_single_sequence_example``, whole.

Used by :mod:`recordkit.tf` alone. The feature specs come from the leading
records (each context feature and feature list a ``tf.io.RaggedFeature`` of the
kind it holds); TensorFlow's parser skips keys its spec does not name, so every
record is also checked, in a ``tf.numpy_function``, to hold no feature the spec
lacks and no kind that differs: a record is read whole or the pipeline fails
naming the feature, never read in part.

A dataset whose manifest says its records are SequenceExamples has a schema
counted over every record (``recordkit convert`` decoded each), so the specs
come from it and the records go to TensorFlow's parser unchecked, as a
manifest's Example schema goes to ``tf.io.parse_example``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from .._deps import require
from ..codec.sequence import SequenceSchema, decode_sequence_example
from ..errors import ManifestError, SchemaError
from ..format.framing import read_stream
from ..format.manifest import MANIFEST_NAME, Manifest

tf = require("tensorflow", extra="tf")

__all__ = ["manifest_specs", "parser", "pipeline", "specs"]

_INFER = 64
_DTYPES = {"int64": "int64", "float": "float32", "bytes": "string"}


def specs(files: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The kind of each context feature and feature list in the leading records."""
    context: dict[str, dict[str, str]] = {}
    lists: dict[str, dict[str, str]] = {}
    for path in files:
        with tf.io.gfile.GFile(path, "rb") as f:
            for record, payload in enumerate(itertools.islice(read_stream(f, path=path), _INFER)):
                ctx, fl = decode_sequence_example(payload)
                for name, (kind, _) in ctx.items():
                    if kind is not None:
                        context.setdefault(name, {}).setdefault(kind, f"{path}:?:{record}")
                for name, steps in fl.items():
                    for kind, _ in steps:
                        if kind is not None:
                            lists.setdefault(name, {}).setdefault(kind, f"{path}:?:{record}")
        break  # the first file's leading records, as Example inference reads them
    return _one_kind(context, "context feature"), _one_kind(lists, "feature list")


def manifest_specs(manifest: Manifest, root: str) -> tuple[dict[str, str], dict[str, str]]:
    """The kind of each context feature and feature list, from the manifest's schema.

    A name that holds no list in any record (only unset ``Feature``\\ s) is read
    as ``bytes``: TensorFlow reads an unset ``Feature`` as an empty list of any kind.

    Raises:
        ManifestError: the schema is not a SequenceExample schema.
        SchemaError: a name holds several kinds (TensorFlow parses one per name).
    """
    try:
        schema = SequenceSchema.from_json(manifest.schema)
    except SchemaError as exc:
        where = root.rstrip("/") + "/" + MANIFEST_NAME
        raise ManifestError(f"bad SequenceExample schema: {exc}", path=where) from exc
    out = []
    for part, what in (("context", "context feature"), ("feature_lists", "feature list")):
        specs = {}
        for name, kinds in schema.kinds(part).items():
            if len(kinds) > 1:
                raise SchemaError(
                    f"{what} {name!r} holds {' and '.join(kinds)} in {root} (its manifest's "
                    "schema), and TensorFlow parses one kind per feature: read it with "
                    "rk.Dataset or recordkit.torch, which keep each record as stored"
                )
            specs[name] = kinds[0] if kinds else "bytes"
        out.append(specs)
    return out[0], out[1]


def _one_kind(seen: dict[str, dict[str, str]], what: str) -> dict[str, str]:
    out = {}
    for name, kinds in seen.items():
        if len(kinds) > 1:
            where = ", ".join(f"{k} (first: {w})" for k, w in kinds.items())
            raise SchemaError(
                f"{what} {name!r} holds {where}; read it with "
                "rk.Dataset(path, sequence_example=True), which keeps each record as stored"
            )
        out[name] = next(iter(kinds))
    return out


def parser(context: dict[str, str], lists: dict[str, str], *, check: bool = True) -> Any:
    """A function: serialized SequenceExample -> ``{"context": ..., "feature_lists": ...}``.

    With ``check``, each record is first checked to hold nothing the specs lack.
    """
    ctx_spec = {n: tf.io.RaggedFeature(_DTYPES[k]) for n, k in context.items()}
    seq_spec = {n: tf.io.RaggedFeature(_DTYPES[k]) for n, k in lists.items()}

    def holds_nothing_else(payload: bytes) -> bytes:
        ctx, fl = decode_sequence_example(payload)
        for name, (kind, _) in ctx.items():
            if kind is not None and context.get(name) != kind:
                raise SchemaError(_unseen("context feature", name, kind, context.get(name)))
        for name, steps in fl.items():
            for kind, _ in steps:
                if kind is not None and lists.get(name) != kind:
                    raise SchemaError(_unseen("feature list", name, kind, lists.get(name)))
        return payload

    def parse(serialized: Any) -> dict[str, Any]:
        # The checked payload itself is parsed: a data dependency no optimizer prunes.
        checked = serialized
        if check:
            checked = tf.numpy_function(holds_nothing_else, [serialized], tf.string, stateful=False)
            checked.set_shape([])
        ctx, seq = tf.io.parse_single_sequence_example(
            checked, context_features=ctx_spec, sequence_features=seq_spec
        )
        return {"context": dict(ctx), "feature_lists": dict(seq)}

    return parse


def _unseen(what: str, name: str, kind: str, known: str | None) -> str:
    had = f"holds {known} in the leading records" if known else "is not in the leading records"
    return (
        f"a record holds {what} {name!r} as {kind}, which {had}; TensorFlow's parser "
        "would drop it: read these records with rk.Dataset(path, sequence_example=True)"
    )


def pipeline(
    files: list[str],
    batch_size: int | None,
    shuffle: bool,
    seed: int,
    shuffle_buffer: int,
    drop_remainder: bool,
    by_record: bool,
    input_context: Any,
    manifest: Manifest | None = None,
    root: str = "",
) -> Any:
    """SequenceExamples whole, through ``TFRecordDataset`` (``recordkit.tf.dataset``'s).

    ``manifest``: the dataset's at ``root``, whose schema gives the specs when it
    says the records are SequenceExamples.
    """
    if manifest is not None and manifest.sequence_example:
        parse = parser(*manifest_specs(manifest, root), check=False)
    else:
        parse = parser(*specs(files))
    ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, dtype=tf.string))
    if shuffle and len(files) > 1:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.flat_map(lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20))
    if by_record:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if batch_size is not None:
        ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
    return ds
