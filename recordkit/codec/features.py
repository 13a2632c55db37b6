"""Feature types of a schema and their ``tf.train.Example`` form.

Feature types and how each is stored in the Example:

- :class:`Bytes` ``()``: one ``bytes_list`` value; ``(n,)`` or ``(None,)``: a list.
- :class:`Int64`, :class:`Float32`: the values flattened in C order into an
  ``int64_list`` / ``float_list`` (so ``tf.io.parse_example`` reads them natively).
- :class:`Tensor`: one ``bytes_list`` value holding the array's C-order,
  little-endian raw bytes, or a zstd frame of them with ``compression="zstd"``.

Shapes are tuples of non-negative ints and ``None`` (a dimension that varies
from record to record); the stored values are flat, and :mod:`recordkit.codec.shapes`
says how a record's shape is recovered from them.

Every feature is required unless it has a ``default=``: a record without it
(no key, or a key with no list set) then reads as the default, and a sample
without it (or with ``None``) is written without it. A fixed shape takes any
default of that shape (a scalar is broadcast); a shape with ``None`` dims only
an empty one (``default=[]``: absent reads as no values, as TensorFlow's
``RaggedFeature`` reads it).

Encoding validates a sample against the schema and raises
:class:`~recordkit.errors.SchemaError` naming the feature. Decoding a record
that does not fit raises :class:`~recordkit.errors.CorruptRecordError` without
a location; the caller adds it with ``err.located(path, offset, record)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import DTypeLike

from ..errors import CorruptRecordError, SchemaError
from .budget import DecodeBudget
from .compression import zstd_compress
from .example import as_int64, decode_example, encode_example
from .json_values import default_to_json
from .shapes import (
    NO_LIST,
    Features,
    Shape,
    check_shape,
    companion_shape,
    fmt_shape,
    resolve_shape,
    stored_values,
)

__all__ = ["INFERRED", "REQUIRED", "TYPES", "Bytes", "FeatureType", "Float32", "Int64", "Tensor"]


class _Required:
    """The ``default`` of a feature every record must hold (the default ``default``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"

    def __reduce__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

# Fixed-size dtypes whose raw bytes mean the same thing on every platform
# (long double and friends do not, and object arrays are pointers).
_TENSOR_DTYPES = frozenset(
    ["bool", "float16", "float32", "float64", "complex64", "complex128"]
    + [f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)]
)
_COMPRESSIONS = (None, "zstd")
_BYTES_LIKE = (bytes, bytearray, memoryview)


class FeatureBase:
    """Shared behaviour of the feature types (each a frozen, slotted dataclass)."""

    __slots__ = ()
    type_name: ClassVar[str]  # the "type" in the JSON form
    shape: Shape
    default: Any
    _key: bytes | None  # the default as an Example holding it: what eq and hash compare

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", check_shape(self, self.shape))
        self._set_default()

    def __repr__(self) -> str:
        return _repr(self, fmt_shape(self.shape) if self.shape else "")

    @property
    def required(self) -> bool:
        """Whether every record must hold this feature (no ``default=``)."""
        return self.default is REQUIRED

    def _set_default(self) -> None:
        """Check ``default`` against the type and shape; keep it as a decoded value."""
        if self.default is REQUIRED:
            object.__setattr__(self, "_key", None)
            return
        value = self.default
        what = f"{type(self).__name__}({fmt_shape(self.shape) if self.shape else ''})"
        if value is None:
            raise SchemaError(f"{what}: default=None; leave default out for a required feature")
        if isinstance(self, Tensor) and np.dtype(self.dtype).kind == "c":
            raise SchemaError(f"{what}: a complex tensor has no default (JSON has no complex)")
        if None in self.shape and not isinstance(value, (str, *_BYTES_LIKE)) and not np.size(value):
            # default=[]: the empty value of the shape (its None dims 0), in the feature's dtype
            empty = tuple(0 if d is None else d for d in self.shape)
            kind = {Int64: np.int64, Float32: np.float32}.get(type(self))  # type: ignore[call-overload]
            value = [] if isinstance(self, Bytes) else np.zeros(empty, kind or self.dtype)
        elif self.shape and None not in self.shape and np.ndim(value) == 0:
            if isinstance(self, Bytes):
                value = [value] * self.shape[0]
            elif not isinstance(value, (str, *_BYTES_LIKE)):
                full = np.full(cast("tuple[int, ...]", self.shape), value)
                value = full if isinstance(value, np.generic) else full.tolist()  # weak ints
        out: Features = {}
        try:
            self._encode("default", value, out)
        except SchemaError as exc:
            why = str(exc).removeprefix("feature 'default': ")
            raise SchemaError(f"{what}: default {self.default!r} does not fit: {why}") from None
        key = encode_example(out)  # the default as a record holds it, read back as one would
        budget = DecodeBudget(1 << 62, 1 << 62)
        decoded = self._decode_present("default", decode_example(key), True, budget)
        size = len(decoded) if isinstance(decoded, list) else np.size(decoded)
        if None in self.shape and size:
            raise SchemaError(
                f"{what}: a feature with None dims can only default to an empty value "
                f"(default=[]: a record without it reads as no values), got {self.default!r}"
            )
        if isinstance(decoded, np.ndarray):
            decoded.flags.writeable = False
        elif isinstance(decoded, list):
            decoded = tuple(decoded)
        object.__setattr__(self, "default", decoded)
        object.__setattr__(self, "_key", key)

    def default_value(self) -> tuple[str, Any]:
        """The default as stored in a record: ``(kind, values)`` (``decode_example``'s form)."""
        if self.default is REQUIRED:
            raise SchemaError(f"{self!r} is required: it has no default")
        out: Features = {}
        self._encode("default", self._given(True), out)
        return out["default"]

    def _given(self, copy: bool) -> Any:
        """The default, as decoding a record without the feature returns it."""
        value = self.default
        if isinstance(value, tuple):
            return list(value)
        if isinstance(value, np.ndarray) and copy:
            return value.copy()
        return value

    def _decode(self, name: str, record: Features, copy: bool, budget: DecodeBudget) -> Any:
        # A record without the feature (or with no list set): the default answers.
        if self.default is not REQUIRED and record.get(name, NO_LIST)[0] is None:
            return self._given(copy)
        return self._decode_present(name, record, copy, budget)

    def _decode_present(self, name: str, record: Features, copy: bool, budget: DecodeBudget) -> Any:
        raise NotImplementedError

    def _repr_default(self) -> str:
        if self.default is REQUIRED:
            return ""
        value = self._given(False)
        shown = value.tolist() if isinstance(value, np.ndarray) else value
        return f"default={shown!r}"

    def _json_default(self, entry: dict[str, Any]) -> dict[str, Any]:
        if self.default is not REQUIRED:
            entry["default"] = default_to_json(self._given(False))
        return entry

    @property
    def shape_feature(self) -> bool:
        """Whether each record stores a companion ``"{name}/shape"`` int64 feature."""
        return self.shape.count(None) >= 2

    def to_json(self, name: str) -> dict[str, Any]:
        """This feature's entry in :meth:`Schema.to_json`."""
        return self._json_default({"name": name, "type": self.type_name, "shape": list(self.shape)})

    def zstd_bytes(self) -> tuple[int, bool]:
        """(bytes this feature's zstd value decompresses to in a record, whether that
        varies): what :class:`~recordkit.codec.DecodeLimits` allows by default. Only a
        zstd :class:`Tensor` has any."""
        return 0, False

    def min_record_bytes(self) -> int:
        """The fewest bytes a record holding a non-empty value of this feature needs.

        Every element takes at least one byte (a tensor element its dtype's
        size); ``None`` dims count as 1. A schema is refused when this exceeds
        the record limit, before any reader sizes a buffer from it.
        """
        itemsize = np.dtype(self.dtype).itemsize if isinstance(self, Tensor) else 1
        return math.prod(d for d in self.shape if d is not None) * itemsize

    def _check_given(self, name: str, given: tuple[int, ...]) -> None:
        if len(given) != len(self.shape) or any(
            want is not None and want != got for want, got in zip(self.shape, given)
        ):
            raise SchemaError(
                f"feature {name!r}: expected shape {fmt_shape(self.shape)}, got {fmt_shape(given)}"
            )


def _repr(ftype: FeatureBase, *args: str) -> str:
    parts = [a for a in (*args, ftype._repr_default()) if a]
    return f"{type(ftype).__name__}({', '.join(parts)})"


def _to_bytes(name: str, value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, _BYTES_LIKE):
        return value
    raise SchemaError(f"feature {name!r}: expected bytes or str, got {type(value).__name__}")


@dataclass(frozen=True, slots=True, repr=False)
class Bytes(FeatureBase):
    """Bytes: one value (``shape=()``) or a list of ``n`` / any number (``(None,)``) of them.

    Encoding accepts ``bytes``, ``bytearray``, ``memoryview`` and ``str`` (stored
    as UTF-8). Decoding gives ``memoryview`` slices of the record (``bytes``
    with ``copy=True``).

    Attributes:
        shape: ``()``, ``(n,)`` or ``(None,)``.
    """

    type_name: ClassVar[str] = "bytes"
    shape: Shape = ()
    default: Any = field(default=REQUIRED, compare=False)
    _key: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        shape = check_shape(self, self.shape)
        if len(shape) > 1:
            raise SchemaError(f"Bytes: shape must be (), (n,) or (None,), got {shape!r}")
        object.__setattr__(self, "shape", shape)
        self._set_default()

    def _encode(self, name: str, value: Any, out: Features) -> None:
        if not self.shape:
            out[name] = ("bytes", [_to_bytes(name, value)])
            return
        if isinstance(value, (str, *_BYTES_LIKE)) or not isinstance(value, Iterable):
            raise SchemaError(
                f"feature {name!r}: expected a list of bytes for shape {fmt_shape(self.shape)}, "
                f"got {type(value).__name__}"
            )
        items = [_to_bytes(name, v) for v in value]
        self._check_given(name, (len(items),))
        out[name] = ("bytes", items)

    def _decode_present(self, name: str, record: Features, copy: bool, budget: DecodeBudget) -> Any:
        values = stored_values(name, "bytes", record)
        if self.shape:
            resolve_shape(name, self.shape, len(values), record)
            return [bytes(v) for v in values] if copy else values
        if len(values) != 1:
            raise CorruptRecordError(
                f"feature {name!r}: expected one bytes value, the record has {len(values)}"
            )
        return bytes(values[0]) if copy else values[0]


@dataclass(frozen=True, slots=True, repr=False)
class Int64(FeatureBase):
    """64-bit signed integers of any shape, stored flat in an ``int64_list``.

    Encoding accepts integers and integral floats within int64 range.

    Attributes:
        shape: the array shape; ``()`` for one value.
    """

    type_name: ClassVar[str] = "int64"
    shape: Shape = ()
    default: Any = field(default=REQUIRED, compare=False)
    _key: bytes | None = field(default=None, init=False, repr=False)

    def _encode(self, name: str, value: Any, out: Features) -> None:
        if type(value) is int and not self.shape:  # a plain label: skip numpy
            out[name] = ("int64", value)
            return
        arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
        self._check_given(name, arr.shape)
        out[name] = ("int64", as_int64(arr, name))
        _put_shape(self, name, arr.shape, out)

    def _decode_present(self, name: str, record: Features, copy: bool, budget: DecodeBudget) -> Any:
        values = stored_values(name, "int64", record)
        # Decoded varints are always a fresh array, so there is nothing to copy.
        return values.reshape(resolve_shape(name, self.shape, len(values), record))


@dataclass(frozen=True, slots=True, repr=False)
class Float32(FeatureBase):
    """32-bit floats of any shape, stored flat in a ``float_list``.

    Encoding accepts bools, integers and floats; a finite value beyond float32
    range is refused rather than turned into infinity.

    Attributes:
        shape: the array shape; ``()`` for one value.
    """

    type_name: ClassVar[str] = "float32"
    shape: Shape = ()
    default: Any = field(default=REQUIRED, compare=False)
    _key: bytes | None = field(default=None, init=False, repr=False)

    def _encode(self, name: str, value: Any, out: Features) -> None:
        arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
        if arr.dtype.kind not in "biuf":
            raise SchemaError(f"feature {name!r}: expected numbers, got dtype {arr.dtype}")
        self._check_given(name, arr.shape)
        if arr.dtype == np.float32:
            flat = arr
        elif arr.dtype.kind != "f" or arr.dtype.itemsize < 4:  # ints never overflow float32
            flat = arr.astype(np.float32)
        else:
            try:
                with np.errstate(over="raise"):
                    flat = arr.astype(np.float32)
            except FloatingPointError:
                raise SchemaError(f"feature {name!r}: a value is out of float32 range") from None
        out[name] = ("float", flat)
        _put_shape(self, name, arr.shape, out)

    def _decode_present(self, name: str, record: Features, copy: bool, budget: DecodeBudget) -> Any:
        values = stored_values(name, "float", record)
        values = values.reshape(resolve_shape(name, self.shape, len(values), record))
        if copy:
            return values.copy()
        values.flags.writeable = False  # a view of the record, which may be a shared mmap
        return values


def _put_shape(ftype: FeatureBase, name: str, shape: tuple[int, ...], out: Features) -> None:
    if ftype.shape_feature:
        out[f"{name}/shape"] = ("int64", list(shape))


@dataclass(frozen=True, slots=True, repr=False)
class Tensor(FeatureBase):
    """An n-d array stored as one bytes value: its raw little-endian C-order bytes.

    Decoding gives a read-only ``np.frombuffer`` view of the record when
    uncompressed (an owned, writable array with ``copy=True``). Encoding casts
    numpy arrays with numpy's ``same_kind`` rule, and Python ints by value; an
    integer that does not fit the dtype is refused, never wrapped around.

    Attributes:
        dtype: a fixed-size numeric or bool dtype (``bool``, ``intN``, ``uintN``,
            ``float16/32/64``, ``complex64/128``); normalized to a little-endian
            ``np.dtype``.
        shape: the array shape, with ``None`` for dims that vary per record.
        compression: ``None`` or ``"zstd"`` (one zstd frame per value, level 3).
    """

    type_name: ClassVar[str] = "tensor"
    dtype: DTypeLike
    shape: Shape
    compression: str | None = None
    default: Any = field(default=REQUIRED, compare=False)
    _key: bytes | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            dtype = np.dtype(self.dtype)
        except Exception:  # TypeError, ValueError, even SyntaxError for strings like "01"
            raise SchemaError(f"Tensor: {self.dtype!r} is not a numpy dtype") from None
        if dtype.name not in _TENSOR_DTYPES or dtype.fields is not None:
            raise SchemaError(
                f"Tensor: dtype must be one of {sorted(_TENSOR_DTYPES)}, got {self.dtype!r}"
            )
        if self.compression not in _COMPRESSIONS:
            raise SchemaError(
                f"Tensor: compression must be one of {_COMPRESSIONS}, got {self.compression!r}"
            )
        object.__setattr__(self, "dtype", dtype.newbyteorder("<"))
        object.__setattr__(self, "shape", check_shape(self, self.shape))
        self._set_default()

    def __repr__(self) -> str:
        extra = f"compression={self.compression!r}" if self.compression else ""
        return _repr(self, repr(np.dtype(self.dtype).name), fmt_shape(self.shape), extra)

    def to_json(self, name: str) -> dict[str, Any]:
        """This feature's entry in :meth:`Schema.to_json`."""
        entry = {
            "name": name,
            "type": self.type_name,
            "dtype": np.dtype(self.dtype).name,
            "shape": list(self.shape),
            "compression": self.compression,
        }
        return self._json_default(entry)

    def zstd_bytes(self) -> tuple[int, bool]:
        """(its decompressed bytes per record, whether its shape varies); ``(0, False)``
        uncompressed."""
        if not self.compression:
            return 0, False
        if None in self.shape:
            return 0, True
        return math.prod(cast("tuple[int, ...]", self.shape)) * np.dtype(self.dtype).itemsize, False

    def _encode(self, name: str, value: Any, out: Features) -> None:
        dtype = np.dtype(self.dtype)
        typed = isinstance(value, (np.ndarray, np.generic))
        arr = value if isinstance(value, np.ndarray) else np.asarray(value)
        # Python ints carry no dtype (numpy would call them int64), so they are
        # checked by value below instead of by numpy's casting rule.
        weak_int = not typed and arr.dtype.kind in "iu" and dtype.kind in "iu"
        if not weak_int and not np.can_cast(arr.dtype, dtype, "same_kind"):
            raise SchemaError(
                f"feature {name!r}: cannot store dtype {arr.dtype} as {dtype.name} "
                "(only same-kind casts are allowed)"
            )
        self._check_given(name, arr.shape)
        if dtype.kind in "iu" and arr.size and not np.can_cast(arr.dtype, dtype, "safe"):
            info = np.iinfo(dtype)
            low, high = arr.min(), arr.max()
            if low < info.min or high > info.max:
                bad = low if low < info.min else high
                raise SchemaError(f"feature {name!r}: {bad} is out of {dtype.name} range")
        if dtype.kind in "fc" and arr.dtype.kind in "fc" and arr.dtype.itemsize > dtype.itemsize:
            try:
                with np.errstate(over="raise"):
                    arr = arr.astype(dtype)
            except FloatingPointError:
                raise SchemaError(
                    f"feature {name!r}: a value is out of {dtype.name} range"
                ) from None
        data = np.ascontiguousarray(arr, dtype=dtype).ravel().view(np.uint8)
        out[name] = ("bytes", [zstd_compress(data) if self.compression else data])
        _put_shape(self, name, arr.shape, out)

    def _decode_present(self, name: str, record: Features, copy: bool, budget: DecodeBudget) -> Any:
        values = stored_values(name, "bytes", record)
        if len(values) != 1:
            raise CorruptRecordError(
                f"feature {name!r}: expected one tensor value, the record has {len(values)}"
            )
        dtype = np.dtype(self.dtype)
        shape: tuple[int, ...] | None = None
        if self.shape_feature:
            shape = companion_shape(name, self.shape, record)
        elif None not in self.shape:
            shape = cast("tuple[int, ...]", self.shape)
        data = values[0]
        expected = None if shape is None else math.prod(shape) * dtype.itemsize
        if self.compression:
            data = budget.decompress(name, data, expected)
        elif expected is not None and len(data) != expected:
            raise CorruptRecordError(
                f"feature {name!r}: expected {expected} bytes for "
                f"{dtype.name}{fmt_shape(shape or ())}, the record has {len(data)}"
            )
        if len(data) % dtype.itemsize:
            raise CorruptRecordError(
                f"feature {name!r}: {len(data)} bytes is not a whole number of {dtype.name}"
            )
        arr = np.frombuffer(data, dtype)
        if shape is None:
            shape = resolve_shape(name, self.shape, arr.size, record)
        arr = arr.reshape(shape)
        if copy:
            return arr.copy()
        arr.flags.writeable = False  # a view of the record, which may be a shared mmap
        return arr


FeatureType = Bytes | Int64 | Float32 | Tensor
"""The feature types, as the schema names them."""
INFERRED: dict[str, type[Bytes | Int64 | Float32]] = {
    "bytes": Bytes,
    "int64": Int64,
    "float": Float32,
}
"""The type a record's list of each wire kind suggests (``Schema.infer``)."""
TYPES: dict[str, type[FeatureType]] = {t.type_name: t for t in (Bytes, Int64, Float32, Tensor)}
"""Each type by its ``type_name``, the ``"type"`` of the JSON form."""
