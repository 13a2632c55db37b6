"""Feature shapes, and how a record's shape is recovered from its flat values.

Shapes are tuples of non-negative ints and ``None`` (a dimension that varies
from record to record). The stored values are flat, so the shape of a record
is recovered by this rule (:func:`resolve_shape`):

- **no** ``None``: the element count must equal the product of the dims;
- **exactly one** ``None``: that dim is the element count divided by the
  product of the others (which must divide it; a zero-sized fixed dim next to
  a ``None`` is refused, as the ``None`` could not be recovered);
- **two or more** ``None``: the record also stores an int64 companion feature
  ``f"{name}/shape"`` holding its full shape. A schema in which another
  feature is named like a companion is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from ..errors import CorruptRecordError, SchemaError

__all__ = [
    "NO_LIST",
    "Features",
    "Shape",
    "check_shape",
    "companion_shape",
    "fmt_shape",
    "resolve_shape",
    "stored_values",
]

Shape = tuple[int | None, ...]
Features = dict[str, tuple[str | None, Any]]
NO_LIST: tuple[None, None] = (None, None)
"""What a record without a feature (or with no list set) holds for it."""


def fmt_shape(shape: Sequence[int | None]) -> str:
    """A shape as Python writes a tuple: ``(3,)``, ``(None, 2)``."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_shape(owner: object, shape: Any) -> Shape:
    """``shape`` as a tuple of ints >= 0 and ``None``, or a SchemaError naming ``owner``'s type."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise SchemaError(f"{type(owner).__name__}: shape must be a tuple, got {shape!r}")
    dims: list[int | None] = []
    for dim in shape:
        if dim is None:
            dims.append(None)
        elif isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) and dim >= 0:
            dims.append(int(dim))
        else:
            raise SchemaError(
                f"{type(owner).__name__}: shape dims must be ints >= 0 or None, got {shape!r}"
            )
    if dims.count(None) == 1 and 0 in dims:
        raise SchemaError(
            f"{type(owner).__name__}: shape {fmt_shape(dims)} has a zero dim next to a single "
            "None, so the None dim could not be recovered from the element count; "
            "use None for the zero dim too (the full shape is then stored)"
        )
    return tuple(dims)


def resolve_shape(name: str, shape: Shape, count: int, record: Features) -> tuple[int, ...]:
    """The record's shape for ``count`` stored elements of feature ``name``, by the rule."""
    if None not in shape:
        fixed = cast("tuple[int, ...]", shape)
        if count != math.prod(fixed):
            raise CorruptRecordError(
                f"feature {name!r}: expected {math.prod(fixed)} elements for shape "
                f"{fmt_shape(shape)}, the record has {count}"
            )
        return fixed
    if shape.count(None) >= 2:
        full = companion_shape(name, shape, record)
        if math.prod(full) != count:
            raise CorruptRecordError(
                f"feature {name!r}: stored shape {fmt_shape(full)} does not hold {count} elements"
            )
        return full
    known = math.prod(d for d in shape if d is not None)
    if count % known:
        raise CorruptRecordError(
            f"feature {name!r}: {count} elements do not fit shape {fmt_shape(shape)}"
        )
    return tuple(count // known if d is None else d for d in shape)


def companion_shape(name: str, shape: Shape, record: Features) -> tuple[int, ...]:
    """The full shape a record stores in ``f"{name}/shape"``, checked against ``shape``."""
    key = f"{name}/shape"
    full = stored_values(key, "int64", record)
    if len(full) != len(shape) or (full < 0).any():
        raise CorruptRecordError(
            f"feature {name!r}: companion {key!r} holds {full.tolist()}, "
            f"not a shape of rank {len(shape)}"
        )
    dims = tuple(int(d) for d in full)
    if any(want is not None and want != got for want, got in zip(shape, dims)):
        raise CorruptRecordError(
            f"feature {name!r}: stored shape {fmt_shape(dims)} does not match {fmt_shape(shape)}"
        )
    return dims


def stored_values(name: str, kind: str, record: Features) -> Any:
    """The values of a feature of the given wire kind, or a CorruptRecordError."""
    entry = record.get(name)
    if entry is None:
        raise CorruptRecordError(f"feature {name!r} is missing from the record")
    got, values = entry
    if got == kind:
        return values
    if got is None:  # a Feature with no list set reads as empty, as in TensorFlow
        return [] if kind == "bytes" else np.empty(0, np.float32 if kind == "float" else np.int64)
    raise CorruptRecordError(f"feature {name!r}: expected a {kind} list, the record has {got}")
