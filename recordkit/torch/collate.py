"""Batches and samples as torch tensors: from decoded chunks, and ``recordkit.torch.collate``.

Imported only by :mod:`recordkit.torch` (it imports torch).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from ..codec.features import Bytes
from ..codec.schema import Schema
from ..reader.pipeline import Chunk, ReaderStats
from ..reader.ragged import check_ragged_as, ragged_axes, trim, widest
from ..reader.sequence import SAMPLE

__all__ = [
    "chunk_batches",
    "chunk_samples",
    "chunk_sequences",
    "collate",
    "sequence_sample",
    "to_torch",
]


def to_torch(value: Any) -> Any:
    """A decoded value as torch: arrays as tensors (0-d for scalars), lists element-wise."""
    if isinstance(value, np.generic) and not isinstance(value, np.flexible):
        return torch.from_numpy(np.array(value))  # a scalar feature: a 0-d tensor, as documented
    if isinstance(value, np.ndarray):
        if not value.flags.writeable:  # torch warns on read-only arrays; copy those few
            value = value.copy()
        return torch.from_numpy(value)
    if isinstance(value, list):
        return [to_torch(v) for v in value]
    return value


def _no_arrays(schema: Schema | None, name: str, value: Any) -> bool:
    """Whether a column is a list of ``Bytes`` values (bytes, or lists of bytes): nothing
    in it for :func:`to_torch` to convert, and a look at each value costs the consuming
    thread about 0.5 us a value."""
    return (
        schema is not None
        and isinstance(value, list)
        and name in schema
        and isinstance(schema[name], Bytes)
    )


def sequence_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """A whole SequenceExample sample with its number lists as tensors."""
    return {
        "context": {k: to_torch(v) for k, v in sample["context"].items()},
        "feature_lists": {k: to_torch(v) for k, v in sample["feature_lists"].items()},
    }


# Each item comes with the chunk rows it holds, ``(lo, hi)``: ``recordkit.torch`` slices
# the chunk's shard ids and record numbers with them, so a transform that fails on an
# item can name its record (``recordkit._origins``).
Rows = tuple[int, int]


def chunk_batches(
    chunk: Chunk,
    stats: ReaderStats,
    ragged: Mapping[str, tuple[int, ...]] | None = None,
    schema: Schema | None = None,
) -> Iterator[tuple[int, dict[str, Any], Rows]]:
    """The batches (``(unit, batch, rows)``) of a decoded chunk: views of its tensors.

    ``ragged``: the padded ragged features (name -> their ``None`` dims), each cut
    to its batch's widest record as padded bytes are. ``schema``: the chunk's, if
    known: a ``Bytes`` feature's column that is a list (lists of bytes,
    ``bytes_as="list"``) holds no array, so it is passed on without a look at each value.
    """
    ragged = ragged or {}
    if not chunk.rows:
        return
    # Per-chunk work is done once, vectorised: the consuming thread shares the
    # GIL with the training step, so its per-batch Python must stay tiny.
    edges = np.flatnonzero(np.diff(chunk.units)) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [chunk.rows])).tolist()
    tensors = {
        name: value if _no_arrays(schema, name, value) else to_torch(value)
        for name, value in chunk.columns.items()
    }
    widths = {
        name: widest(lengths, starts)
        for name, value in chunk.columns.items()
        if isinstance(value, np.ndarray)
        and value.ndim >= 2
        and isinstance(lengths := chunk.columns.get(name + "/lengths"), np.ndarray)
    }
    unit_ids = chunk.units[starts].tolist()
    for b, (lo, hi) in enumerate(zip(starts.tolist(), ends)):
        batch = {name: t[lo:hi] for name, t in tensors.items()}
        for name, w in widths.items():  # trim to this batch's longest value
            batch[name] = trim(batch[name], ragged.get(name, (0,)), w[b])
        stats.add(records=hi - lo, batches=1)
        yield unit_ids[b], batch, (lo, hi)


def chunk_samples(chunk: Chunk, stats: ReaderStats) -> Iterator[tuple[int, dict[str, Any], Rows]]:
    """The samples (``(unit, sample, rows)``) of a decoded chunk; ``Bytes()`` as ``bytes``."""
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
                sample[name] = to_torch(value[i])
        stats.add(records=1, batches=1)
        yield int(chunk.units[i]), sample, (i, i + 1)


def chunk_sequences(
    chunk: Chunk, batched: bool, stats: ReaderStats, *, raw: bool = False
) -> Iterator[tuple[int, Any, Rows]]:
    """Whole samples (dicts of tensors), one by one or as lists per unit: SequenceExamples,
    or (``raw``) Examples as stored."""
    samples = chunk.columns.get(SAMPLE, [])
    units = chunk.units.tolist()
    out: list[dict[str, Any]] = []
    lo = 0
    for i, sample in enumerate(samples):
        item = {k: to_torch(v) for k, v in sample.items()} if raw else sequence_sample(sample)
        if not batched:
            stats.add(records=1, batches=1)
            yield units[i], item, (i, i + 1)
            continue
        out.append(item)
        if i + 1 == len(samples) or units[i + 1] != units[i]:
            stats.add(records=len(out), batches=1)
            yield units[i], out, (lo, i + 1)
            out = []
            lo = i + 1


def _variable(schema: Schema | None, name: str) -> bool | None:
    """Whether the schema gives ``name`` a ``None`` dim (``None``: no schema says)."""
    if schema is None or name not in schema.features:
        return None
    return None in schema.features[name].shape


def _bytes(values: list[Any], name: str, bytes_as: str, out: dict[str, Any]) -> None:
    if bytes_as == "list":
        out[name] = [bytes(v) for v in values]
        return
    lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
    padded = np.zeros((len(values), int(lengths.max(initial=0))), np.uint8)
    for row, value in enumerate(values):
        padded[row, : len(value)] = np.frombuffer(value, np.uint8)
    out[name] = torch.from_numpy(padded)
    out[name + "/lengths"] = torch.from_numpy(lengths)


def _pad(tensors: list[Any], name: str, axes: tuple[int, ...], out: dict[str, Any]) -> None:
    """Ragged tensors as one zero-padded tensor and their lengths (recordkit.reader.ragged)."""
    shapes = torch.tensor([tuple(t.shape) for t in tensors], dtype=torch.int64)
    top = shapes.amax(dim=0).tolist()
    padded = tensors[0].new_zeros((len(tensors), *top))
    for row, t in enumerate(tensors):
        padded[(row, *(slice(0, d) for d in t.shape))] = t
    lengths = shapes[:, list(axes)]
    out[name] = padded
    out[name + "/lengths"] = lengths[:, 0].contiguous() if len(axes) == 1 else lengths


def collate(
    samples: Sequence[Mapping[str, Any]],
    *,
    schema: Schema | None = None,
    bytes_as: Literal["padded", "list"] = "padded",
    ragged_as: Literal["padded", "list"] = "padded",
) -> dict[str, Any]:
    """Collate samples of ``RecordDataset(batch_size=None)`` into one batch.

    The batch has the layout ``RecordDataset(batch_size=N)`` yields (the table in
    ``docs/pytorch.md``): fixed-shape numbers stacked ``(N, *shape)``; ``Bytes()``
    zero-padded ``uint8 (N, longest)`` plus ``"{name}/lengths"`` (or a list of
    ``bytes`` with ``bytes_as="list"``); numbers with a ``None`` dim zero-padded
    plus ``"{name}/lengths"`` (``recordkit.reader.ragged``; a list of N tensors
    with ``ragged_as="list"``); ``Bytes`` lists as a list of N values. Use it as
    a ``DataLoader``'s ``collate_fn``; ``RecordDataset.collate`` is this function
    with the dataset's schema, ``bytes_as`` and ``ragged_as`` bound.

    Args:
        samples: dicts with the same keys.
        schema: says which features are variable-length. Without it a feature
            whose tensors differ in shape within this batch comes as a list and
            one whose tensors agree is stacked, so give it where lengths vary.
        bytes_as: ``"padded"`` or ``"list"``, for ``Bytes()`` features.
        ragged_as: ``"padded"`` or ``"list"``, for number features with ``None``
            dims (those the schema says; without one, lists).

    Raises:
        ValueError: the samples do not have the same keys, or a bad ``bytes_as``
            or ``ragged_as``.
    """
    if bytes_as not in ("padded", "list"):
        raise ValueError(f"bytes_as must be 'padded' or 'list', got {bytes_as!r}")
    check_ragged_as(ragged_as)
    axes = ragged_axes(schema) if schema and ragged_as == "padded" else {}
    if not samples:
        return {}
    names = list(samples[0])
    out: dict[str, Any] = {}
    for i, sample in enumerate(samples):
        if list(sample) != names:
            raise ValueError(f"sample {i} has keys {list(sample)}, sample 0 has {names}")
    for name in names:
        values = [s[name] for s in samples]
        first = values[0]
        feature = schema.features.get(name) if schema is not None else None
        if isinstance(first, (bytes, bytearray, memoryview)) and (
            feature is None or isinstance(feature, Bytes)
        ):
            _bytes(values, name, bytes_as, out)
        elif isinstance(first, (list, str)):
            out[name] = values  # Bytes lists, text (tfds Text): one value per record
        else:
            tensors = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]
            variable = _variable(schema, name)
            if variable is None:
                variable = len({tuple(t.shape) for t in tensors}) > 1
            if variable and name in axes:
                _pad(tensors, name, axes[name], out)
            else:
                out[name] = tensors if variable else torch.stack(tensors)
    return out
