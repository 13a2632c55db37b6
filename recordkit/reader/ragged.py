"""Ragged numbers in batches: padded with zeros, with each record's sizes beside them.

A number feature with ``None`` dims (``Int64((None,))``, ``Float32((None, 3))``,
``Tensor("uint8", (None, None, 3))``) has a shape of its own in each record. In a
batch of ``n`` records, ``ragged_as="padded"`` gives

- ``name``: an array ``(n, *widest)``, each ``None`` dim as wide as the batch's
  widest record in it, zeros past a record's own size;
- ``name + "/lengths"``: ``int64``, each record's size in its ``None`` dims:
  ``(n,)`` for one ``None`` dim, ``(n, k)`` for ``k`` of them (in shape order).

A record's values are ``value[i][tuple(slice(0, s) for s in its sizes)]`` over
the ``None`` dims (fixed dims whole); for the common ``(None, ...)`` shape,
``value[i, : lengths[i]]``. ``ragged_as="list"`` gives a list of ``n`` arrays instead.

Padded rather than nested tensors: ``docs/pytorch.md`` says why. A reader pads to the
widest record of its decoding task; :func:`trim` cuts each batch to its own widest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codec import Bytes, FeatureType, Float32, Int64, Schema
from ..errors import SchemaError
from ._contract import Alloc, allocate

__all__ = [
    "RAGGED_AS",
    "check_ragged_as",
    "first_dim_ragged",
    "number_dtype",
    "pad",
    "ragged_axes",
    "trim",
    "widest",
]

RAGGED_AS = ("padded", "list")
_I64 = np.dtype(np.int64)


def check_ragged_as(ragged_as: str) -> None:
    """Raise ``ValueError`` unless ``ragged_as`` is ``"padded"`` or ``"list"``."""
    if ragged_as not in RAGGED_AS:
        raise ValueError(f"ragged_as must be 'padded' or 'list', got {ragged_as!r}")


def ragged_axes(schema: Schema, columns: Sequence[str] | None = None) -> dict[str, tuple[int, ...]]:
    """The ragged number features of ``schema`` (of ``columns``): name -> their ``None`` dims.

    Raises:
        SchemaError: a feature's ``"/lengths"`` name is taken by another feature.
    """
    out: dict[str, tuple[int, ...]] = {}
    for name in schema.names if columns is None else columns:
        ftype = schema[name]
        if isinstance(ftype, Bytes) or None not in ftype.shape:
            continue
        if name + "/lengths" in schema:
            raise SchemaError(
                f"feature {name + '/lengths'!r} collides with the lengths of ragged feature "
                f"{name!r}; use ragged_as='list'"
            )
        out[name] = tuple(i for i, d in enumerate(ftype.shape) if d is None)
    return out


def first_dim_ragged(ftype: FeatureType) -> tuple[int, ...] | None:
    """The dims after the first of a number feature whose only ``None`` is its first dim,
    none of them 0, uncompressed (``Int64((None,))``: ``()``; ``Float32((None, 4))``:
    ``(4,)``), whose values a record holds as one list; else ``None``."""
    shape = ftype.shape
    if isinstance(ftype, Bytes) or not shape or shape[0] is not None:
        return None
    inner = tuple(d for d in shape[1:] if d is not None)
    if len(inner) != len(shape) - 1 or 0 in inner or getattr(ftype, "compression", None):
        return None
    return inner


def number_dtype(ftype: FeatureType) -> np.dtype[Any]:
    """The dtype a number feature decodes to."""
    if isinstance(ftype, Int64):
        return _I64
    if isinstance(ftype, Float32):
        return np.dtype("<f4")
    return np.dtype(ftype.dtype)  # type: ignore[union-attr]  # a Tensor


def pad(
    values: Sequence[np.ndarray],
    shape: Sequence[int | None],
    dtype: Any,
    alloc: Alloc | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(padded, lengths)`` of one column of per-record arrays (see the module docs).

    ``values`` have the feature's ``shape`` (its ``None`` dims any size; no records
    give ``(0, *shape)`` with ``None`` as 0); ``alloc`` allocates both outputs
    (default ``np.empty``).
    """
    alloc = alloc or np.empty
    n = len(values)
    axes = [i for i, d in enumerate(shape) if d is None]
    sizes = np.array([v.shape for v in values], _I64).reshape(n, len(shape))
    top = tuple(int(d) for d in sizes.max(axis=0)) if n else tuple(d or 0 for d in shape)
    out = allocate(alloc, (n, *top), np.dtype(dtype))
    out[...] = 0
    for row, value in enumerate(values):
        out[(row, *(slice(0, d) for d in value.shape))] = value
    picked = sizes[:, axes]
    lengths = allocate(alloc, (n,) if len(axes) == 1 else (n, len(axes)), _I64)
    lengths[...] = picked[:, 0] if len(axes) == 1 else picked
    return out, lengths


def widest(lengths: np.ndarray, starts: np.ndarray) -> list[Any]:
    """Per batch (rows from each of ``starts`` to the next), its widest sizes."""
    return np.maximum.reduceat(lengths, starts, axis=0).tolist() if len(lengths) else []


def trim(value: Any, axes: tuple[int, ...], widths: Any) -> Any:
    """A padded batch ``value`` cut to ``widths`` (one int, or one per ``None`` dim)."""
    sizes = widths if isinstance(widths, list) else [widths]
    index: list[slice] = [slice(None)] * (value.ndim)
    for axis, size in zip(axes, sizes, strict=True):
        index[axis + 1] = slice(0, int(size))
    return value[tuple(index)]
