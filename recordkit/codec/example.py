"""A hand-written ``tf.train.Example`` wire codec (no TensorFlow, no protobuf runtime).

The messages, from ``tensorflow/core/example/{example,feature}.proto``::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }   // entry: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Encoding writes exactly what protobuf's serializer writes for the same map order:
every map entry carries its key and value fields (even when empty), an empty
list is still a present, zero-length ``*_list`` submessage, scalars are packed.
Protobuf does not keep map insertion order (upb and C++ serialize in hash order,
or in sorted order with ``deterministic=True``), so byte equality holds for the
order the protobuf serializer happened to choose; parsed content is equal for
any order.

Decoding follows the protobuf parser's semantics (:mod:`recordkit.codec.messages`
says which), so that a record means the same thing here as in ``tf.io.parse_example``,
except that a field a message does not define is an
:class:`~recordkit.errors.UnknownFieldError`, never skipped. Values are views into
the payload where the wire format allows it.
Anything malformed raises :class:`~recordkit.errors.CorruptRecordError` naming
the payload byte; no length read from the payload is used before it is checked
against the payload's end.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

import numpy as np

from ..errors import SchemaError, SequenceExampleError
from .messages import EXAMPLE, list_values, parse_features, unknown_field
from .wire import LEN1, LEN2, encode_varints, malformed, read_len, read_varint, varint

__all__ = ["KINDS", "as_int64", "decode_example", "encode_example", "varint"]

KINDS = ("bytes", "float", "int64")


_F4 = np.dtype("<f4")
_U1 = np.dtype(np.uint8)
_BYTES_TYPES = (bytes, bytearray, memoryview)


# --------------------------------------------------------------------------- encode


def encode_example(features: Mapping[str, tuple[str | None, Any]]) -> bytes:
    """Serialize features as a ``tf.train.Example``, in the mapping's order.

    Args:
        features: feature name -> ``(kind, values)``. For ``"bytes"``, a sequence of
            bytes-like objects; for ``"float"``, anything ``np.asarray`` turns into
            float32; for ``"int64"``, integers (a numpy integer array, a list of
            ints, or a scalar). Any shape is flattened in C order. A kind of
            ``None`` writes a ``Feature`` with no list set (values are ignored).

    Returns:
        The serialized ``Example``.

    Raises:
        SchemaError: a name that is not a ``str``, an unknown kind, or values that
            do not convert to the kind without loss.
    """
    parts: list[Any] = [b""]  # the Features header goes here once its size is known
    append, extend = parts.append, parts.extend
    total = 0
    for name, item in features.items():
        if not isinstance(name, str):
            raise SchemaError(f"feature names must be str, got {name!r}")
        try:
            kind, values = item
        except (TypeError, ValueError):
            raise SchemaError(
                f"feature {name!r}: expected a (kind, values) pair, got {item!r}"
            ) from None
        if kind == "bytes":
            body, size = _bytes_body(name, values)
            list_tag = b"\x0a"
        elif kind == "int64":
            body, size = _int64_body(name, values)
            list_tag = b"\x1a"
        elif kind == "float":
            body, size = _float_body(name, values)
            list_tag = b"\x12"
        elif kind is None:
            body, size = [], -1
        else:
            raise SchemaError(
                f"feature {name!r}: kind must be one of {KINDS} or None, got {kind!r}"
            )
        key = name.encode("utf-8")
        if size < 0:
            head = b"\x12\x00"
            feature_size = 0
        else:
            head = list_tag + varint(size)
            feature_size = len(head) + size
            head = b"\x12" + varint(feature_size) + head
        entry_size = 1 + len(varint(len(key))) + len(key) + 1 + len(varint(feature_size))
        entry_size += feature_size
        append(b"\x0a" + varint(entry_size) + b"\x0a" + varint(len(key)) + key + head)
        extend(body)
        total += 1 + len(varint(entry_size)) + entry_size
    parts[0] = b"\x0a" + varint(total)
    # One join: each value, however large, is copied exactly once.
    return b"".join(parts)


def _bytes_body(name: str, values: Any) -> tuple[list[Any], int]:
    if isinstance(values, (*_BYTES_TYPES, str)):
        raise SchemaError(
            f"feature {name!r}: bytes values must be a sequence of bytes-like objects, "
            f"got a single {type(values).__name__}"
        )
    body: list[Any] = []
    size = 0
    try:
        for value in values:
            if isinstance(value, (bytes, bytearray)):
                n = len(value)
            else:
                view = memoryview(value)
                if not view.c_contiguous:
                    raise SchemaError(f"feature {name!r}: bytes value is not contiguous")
                n = view.nbytes
            head = b"\x0a" + varint(n)
            body.append(head)
            body.append(value)
            size += len(head) + n
    except TypeError as exc:
        raise SchemaError(
            f"feature {name!r}: bytes values must be bytes-like objects ({exc})"
        ) from None
    return body, size


def _float_body(name: str, values: Any) -> tuple[list[Any], int]:
    try:
        arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"feature {name!r}: values do not convert to float32 ({exc})") from None
    if arr.dtype.kind not in "biuf":  # numpy would parse strings; protobuf would not
        raise SchemaError(f"feature {name!r}: expected numbers, got values of dtype {arr.dtype}")
    if arr.dtype != _F4:
        # Overflow to inf is what protobuf's float field does with a large double.
        with np.errstate(over="ignore"):
            arr = arr.astype(_F4)
    arr = np.ascontiguousarray(arr).ravel()
    n = arr.nbytes
    if n == 0:
        return [], 0
    head = b"\x0a" + varint(n)
    return [head, arr], len(head) + n


def _int64_body(name: str, values: Any) -> tuple[list[Any], int]:
    # A label is usually one Python int: a pure-Python path beats numpy's setup cost.
    if type(values) is int and -(1 << 63) <= values < (1 << 63):
        data = varint(values & 0xFFFF_FFFF_FFFF_FFFF)
    else:
        data = encode_varints(as_int64(values, name))
    n = len(data)
    if n == 0:
        return [], 0
    head = b"\x0a" + varint(n)
    return [head, data], len(head) + n


def as_int64(values: Any, name: str) -> np.ndarray:
    """Return ``values`` as a flat int64 array, refusing any value that would change.

    Args:
        values: integers, or floats with no fractional part, within int64 range.
        name: the feature name, for error messages.

    Raises:
        SchemaError: a fractional, non-finite or out-of-range value, or a non-number.
    """
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SchemaError(f"feature {name!r}: values do not convert to int64 ({exc})") from None
    kind = arr.dtype.kind
    if kind in "bi" or (kind == "u" and arr.dtype.itemsize < 8):
        return np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)
    if kind == "u":
        if arr.size and arr.max() > np.iinfo(np.int64).max:
            raise SchemaError(f"feature {name!r}: value {arr.max()} is out of int64 range")
        return arr.astype(np.int64).reshape(-1)
    if kind == "f":
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(arr) & (arr == np.trunc(arr)) & (arr >= -(2.0**63)) & (arr < 2.0**63)
        if not ok.all():
            bad = arr.reshape(-1)[np.flatnonzero(~ok.reshape(-1))[0]]
            raise SchemaError(f"feature {name!r}: {bad.item()!r} is not an int64 value")
        return arr.astype(np.int64).reshape(-1)
    if kind == "O":  # Python ints beyond 64 bits, or mixed objects
        flat = arr.reshape(-1)
        for value in flat:
            if not isinstance(value, (int, np.integer)) or not -(1 << 63) <= value < (1 << 63):
                raise SchemaError(f"feature {name!r}: {value!r} is not an int64 value")
        return flat.astype(np.int64)
    raise SchemaError(f"feature {name!r}: expected integers, got values of dtype {arr.dtype}")


# --------------------------------------------------------------------------- decode


def decode_example(
    payload: bytes | bytearray | memoryview, *, keys: Container[str] | None = None
) -> dict[str, tuple[str | None, Any]]:
    """Parse a serialized ``tf.train.Example``.

    Args:
        payload: the serialized message; values returned are views into it.
        keys: if given, only these features are materialized: the structure of
            every feature is still parsed and checked (the map entries and the
            ``Feature`` messages), the values of the others are not (their lists
            are neither decoded nor looked into).

    Returns:
        Feature name -> ``(kind, values)``: ``("bytes", list[memoryview])``,
        ``("float", float32 ndarray)``, ``("int64", int64 ndarray)``, or
        ``(None, None)`` for a ``Feature`` with no list set. Float arrays are
        zero-copy views when the floats are packed in one run.

    Raises:
        UnknownFieldError: the payload holds a field its message does not define.
        SequenceExampleError: the payload is a ``SequenceExample`` (it has feature lists).
        CorruptRecordError: the payload is not a well-formed ``Example``.
    """
    buf = memoryview(payload)
    if buf.ndim != 1 or buf.itemsize != 1:
        buf = buf.cast("B")
    end = len(buf)
    spans: dict[str, list[Any]] = {}
    pos = 0
    out: dict[str, tuple[str | None, Any]] = {}
    # The parsers read a length byte before checking it against its message's
    # end (the check right after catches an overrun inside the payload); only a
    # read at the very end of the payload can raise IndexError.
    try:
        while pos < end:
            tag = buf[pos]
            pos += 1
            if tag > 0x7F:
                tag, pos = read_varint(buf, pos - 1, end)
            if tag == LEN1:
                size, pos = read_len(buf, pos, end)
                parse_features(buf, pos, pos + size, spans)
                pos += size
            elif tag == LEN2:
                # SequenceExample.feature_lists: reading field 1 (its context) alone as
                # an Example would drop every step, silently. Never a partial sample.
                raise SequenceExampleError(
                    "payload is a tf.train.SequenceExample (it has feature_lists), not a "
                    "tf.train.Example, and reading its context alone would drop every feature "
                    "list; read it whole with rk.Dataset(path, sequence_example=True)"
                )
            else:
                raise unknown_field(buf, 0, end, pos, tag, "the Example", EXAMPLE.message)
        for name, state in spans.items():
            if keys is None or name in keys:
                out[name] = list_values(buf, state, name)
    except IndexError:
        raise malformed("truncated field", end) from None
    return out
