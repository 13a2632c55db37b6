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

Decoding follows the protobuf parser's semantics, so that a record means the
same thing here as in ``tf.io.parse_example``: a repeated map key replaces the
earlier entry, repeated occurrences of the same message field merge, the last
member of the ``oneof`` set wins, and repeated scalars are accepted packed,
unpacked or mixed. One departure, on purpose: protobuf skips a field that the
message does not define (an unknown field number, or a known one with another
wire type), and so would drop whatever it holds without a word; here it is an
:class:`~recordkit.errors.UnknownFieldError` naming the field, its wire type and
where it sits. Values are views into the payload where the wire format allows it.
Anything malformed raises :class:`~recordkit.errors.CorruptRecordError` naming
the payload byte; no length read from the payload is used before it is checked
against the payload's end.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptRecordError, SchemaError, SequenceExampleError, UnknownFieldError

__all__ = ["KINDS", "decode_example", "encode_example"]

KINDS = ("bytes", "float", "int64")

# Tag bytes (field_number << 3 | wire_type) of the fields this codec knows.
_LEN1 = 0x0A  # field 1, length-delimited
_LEN2 = 0x12  # field 2, length-delimited
_LEN3 = 0x1A  # field 3, length-delimited
_VARINT1 = 0x08  # field 1, varint (unpacked int64)
_FIXED32_1 = 0x0D  # field 1, 32-bit (unpacked float)

_KIND_OF_TAG = {_LEN1: "bytes", _LEN2: "float", _LEN3: "int64"}
_F4 = np.dtype("<f4")
_U1 = np.dtype(np.uint8)
_BYTES_TYPES = (bytes, bytearray, memoryview)


def _bad(what: str, pos: int) -> CorruptRecordError:
    return CorruptRecordError(f"malformed tf.train.Example: {what} at payload byte {pos}")


# --------------------------------------------------------------------------- unknown fields

_WIRE_NAMES = ("varint", "64-bit", "length-delimited", "group start", "group end", "32-bit")


class _Scope(NamedTuple):
    """How errors name the messages a parse is in (an Example's, or a SequenceExample's)."""

    message: str  # the message type read
    features: str  # its Features message
    feature: str  # what a map entry's key (or a list's name) names
    value: str  # what the entry's Feature message is called


_EXAMPLE = _Scope("tf.train.Example", "Example.features", "feature", "Feature")


def _unknown(
    buf: memoryview, start: int, end: int, pos: int, tag: int, where: str, message: str
) -> CorruptRecordError:
    """The error for a field the message ``[start, end)`` does not define.

    ``pos`` is where the field's tag ended; a tag that is not a valid one (field
    number 0, wire type 6 or 7) is malformed rather than unknown.
    """
    at = _tag_start(buf, start, end, pos)
    number, wire = tag >> 3, tag & 7
    if number == 0:
        return _bad("field number 0", at)
    if tag > 0xFFFF_FFFF:
        return _bad(f"tag {tag} out of range", at)
    if wire > 5:
        return _bad(f"unsupported wire type {wire}", at)
    return UnknownFieldError(
        f"field {number} ({_WIRE_NAMES[wire]}) inside {where} at payload byte {at}, which "
        f"{message} does not define: TensorFlow would drop it silently, so the record is "
        "refused",
        field_number=number,
        wire_type=_WIRE_NAMES[wire],
        where=where,
        message=message,
        at=at,
    )


def _tag_start(buf: memoryview, start: int, end: int, pos: int) -> int:
    """Where the tag that ends at ``pos`` starts: found by walking the message from
    ``start`` (the fields before it parsed), so a tag written in more bytes than it
    needs is located exactly too."""
    at = start
    try:
        while at < pos:
            tag, after = _read_varint(buf, at, end)
            if after == pos:
                return at
            at = _skip(buf, after, end, tag)
    except (CorruptRecordError, IndexError):
        pass
    return pos - 1  # not reached for a tag the parsers read


def _entry_key(buf: memoryview, start: int, stop: int) -> str:
    """The key of the map entry ``[start, stop)`` as an error names it (the last key
    field before anything unreadable; protobuf's default, the empty key, if none)."""
    key: Any = b""
    pos = start
    try:
        while pos < stop:
            tag, pos = _read_varint(buf, pos, stop)
            if tag == _LEN1:
                size, pos = _read_len(buf, pos, stop)
                key = buf[pos : pos + size]
                pos += size
            else:
                pos = _skip(buf, pos, stop, tag)
    except (CorruptRecordError, IndexError):
        pass
    return repr(str(key, "utf-8", "replace"))


# --------------------------------------------------------------------------- varints

_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def varint(n: int) -> bytes:
    """Encode a non-negative int (< 2**64) as a protobuf varint."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode_varints(values: np.ndarray) -> Any:
    """Encode a flat int64 array as concatenated varints, vectorised over the array.

    Negative values are their two's complement as uint64, so always 10 bytes,
    which is what protobuf writes for int64 (not zigzag; that is sint64).
    """
    if not values.size:
        return b""
    u: Any = values.view(np.uint64)
    top = int(u.max())
    if top < 0x80:
        return values.astype(_U1)
    nbytes = np.ones(u.shape, np.intp)
    for k in range(1, (top.bit_length() + 6) // 7):
        nbytes += u >= (1 << (7 * k))
    ends = np.cumsum(nbytes)
    out = np.empty(int(ends[-1]), _U1)
    # Write byte k of every varint that has one, then drop the ones that ended.
    idx, rest = ends - nbytes, nbytes - 1
    while u.size:
        more = rest > 0
        out[idx] = (u & 0x7F).astype(_U1) | (more.astype(_U1) << 7)
        idx, u, rest = idx[more] + 1, u[more] >> 7, rest[more] - 1
    return out


def _decode_varints(raw: np.ndarray, at: int) -> np.ndarray:
    """Decode concatenated varints (a packed int64 field) without a Python loop.

    Args:
        raw: the field's bytes as a uint8 array.
        at: payload offset of ``raw[0]``, for error messages.
    """
    if raw.max() < 0x80:  # every value in [0, 127]: one byte each
        return raw.astype(np.int64)
    last = raw < 0x80
    if not last[-1]:
        raise _bad("truncated varint in packed int64 values", at + raw.size - 1)
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.max() > 10:
        first = int(np.flatnonzero(lens > 10)[0])
        raise _bad("varint longer than 10 bytes in packed int64 values", at + int(starts[first]))
    # OR in byte k of every varint that has one; a uint64 shift by 63 drops the
    # bits of a 10th byte past bit 64, as protobuf does.
    values = (raw[starts] & 0x7F).astype(np.uint64)
    for k in range(1, int(lens.max())):
        has = np.flatnonzero(lens > k)
        values[has] |= (raw[starts[has] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values.view(np.int64)


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
        data = _encode_varints(as_int64(values, name))
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
                tag, pos = _read_varint(buf, pos - 1, end)
            if tag == _LEN1:
                size, pos = _read_len(buf, pos, end)
                _parse_features(buf, pos, pos + size, spans)
                pos += size
            elif tag == _LEN2:
                # SequenceExample.feature_lists: reading field 1 (its context) alone as
                # an Example would drop every step, silently. Never a partial sample.
                raise SequenceExampleError(
                    "payload is a tf.train.SequenceExample (it has feature_lists), not a "
                    "tf.train.Example, and reading its context alone would drop every feature "
                    "list; read it whole with rk.Dataset(path, sequence_example=True)"
                )
            else:
                raise _unknown(buf, 0, end, pos, tag, "the Example", _EXAMPLE.message)
        for name, (kind, runs) in spans.items():
            if keys is not None and name not in keys:
                continue
            if kind is None:
                out[name] = (None, None)
            elif kind == "bytes":
                out[name] = ("bytes", _bytes_values(buf, runs, name))
            elif kind == "float":
                out[name] = ("float", _float_values(buf, runs, name))
            else:
                out[name] = ("int64", _int64_values(buf, runs, name))
    except IndexError:
        raise _bad("truncated field", end) from None
    return out


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a varint of at most 10 bytes at ``pos``; bits past 64 are dropped, as protobuf does."""
    if end - pos > 2:  # lengths up to 2 MiB: no loop
        b0 = buf[pos]
        if b0 < 0x80:
            return b0, pos + 1
        b1 = buf[pos + 1]
        if b1 < 0x80:
            return (b0 & 0x7F) | b1 << 7, pos + 2
        b2 = buf[pos + 2]
        if b2 < 0x80:
            return (b0 & 0x7F) | (b1 & 0x7F) << 7 | b2 << 14, pos + 3
    result = shift = 0
    start = pos
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFF_FFFF_FFFF_FFFF, pos
        shift += 7
        if shift == 70:
            raise _bad("varint longer than 10 bytes", start)
    raise _bad("truncated varint", start)


def _read_len(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a length prefix and check that the bytes it claims are all there."""
    size, pos = _read_varint(buf, pos, end)
    if size > end - pos:
        raise _bad(f"length {size} runs past the end of its message", pos)
    return size, pos


def _skip(buf: memoryview, pos: int, end: int, tag: int) -> int:
    """Skip the value of a field whose tag has just been read."""
    wire = tag & 7
    if tag >> 3 == 0:
        raise _bad("field number 0", pos - 1)
    if tag > 0xFFFF_FFFF:
        raise _bad(f"tag {tag} out of range", pos - 1)
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 2:
        size, pos = _read_len(buf, pos, end)
        return pos + size
    width = 8 if wire == 1 else 4 if wire == 5 else 0
    if not width:
        raise _bad(f"unsupported wire type {wire}", pos - 1)
    if width > end - pos:
        raise _bad(f"{width}-byte field runs past the end of its message", pos)
    return pos + width


def _parse_features(
    buf: memoryview,
    pos: int,
    end: int,
    spans: dict[str, list[Any]],
    scope: _Scope = _EXAMPLE,
) -> None:
    """Record each map entry of a ``Features`` message as ``spans[key] = [kind, runs]``.

    The common layout (one key, one value holding one list) takes the inline
    fast paths; anything else, including protobuf's merge rules, the general ones.
    ``scope`` names the messages in errors.
    """
    read_varint, kinds = _read_varint, _KIND_OF_TAG
    start = pos
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag != _LEN1:
            if tag > 0x7F:
                tag, pos = read_varint(buf, pos - 1, end)
            if tag != _LEN1:
                raise _unknown(buf, start, end, pos, tag, scope.features, scope.message)
        size = buf[pos]
        pos += 1
        if size > 0x7F:
            size, pos = read_varint(buf, pos - 1, end)
        if size > end - pos:
            raise _bad(f"length {size} runs past the end of its message", pos)
        stop = pos + size
        # A map entry: key = 1, value = 2; either may be absent, repeated or reordered.
        key: Any = b""
        key_at = entry_at = pos
        state: list[Any] = [None, None]
        while pos < stop:
            tag = buf[pos]
            pos += 1
            if tag > 0x7F:
                tag, pos = read_varint(buf, pos - 1, stop)
            if tag == _LEN1:
                size = buf[pos]
                pos += 1
                if size > 0x7F:
                    size, pos = read_varint(buf, pos - 1, stop)
                if size > stop - pos:
                    raise _bad(f"length {size} runs past the end of its message", pos)
                key_at = pos
                pos += size
                key = buf[key_at:pos]
            elif tag == _LEN2:
                size = buf[pos]
                pos += 1
                if size > 0x7F:
                    size, pos = read_varint(buf, pos - 1, stop)
                if size > stop - pos:
                    raise _bad(f"length {size} runs past the end of its message", pos)
                fstart, fend = pos, pos + size
                while pos < fend:  # the Feature: a oneof of three lists
                    tag = buf[pos]
                    pos += 1
                    if tag > 0x7F:
                        tag, pos = read_varint(buf, pos - 1, fend)
                    kind = kinds.get(tag)
                    if kind is None:
                        where = f"{scope.value} {_entry_key(buf, entry_at, stop)}"
                        raise _unknown(buf, fstart, fend, pos, tag, where, scope.message)
                    size = buf[pos]
                    pos += 1
                    if size > 0x7F:
                        size, pos = read_varint(buf, pos - 1, fend)
                    if size > fend - pos:
                        raise _bad(f"length {size} runs past the end of its message", pos)
                    if state[0] == kind:  # the same oneof member again: protobuf merges
                        state[1].append((pos, pos + size))
                    else:  # a different member replaces the one set before
                        state[0] = kind
                        state[1] = [(pos, pos + size)]
                    pos += size
            else:
                where = f"the map entry of {scope.feature} {_entry_key(buf, entry_at, stop)}"
                raise _unknown(buf, entry_at, stop, pos, tag, where, scope.message)
        try:
            spans[str(key, "utf-8")] = state
        except UnicodeDecodeError:
            raise _bad("feature key is not valid UTF-8", key_at) from None


def _bytes_values(
    buf: memoryview, runs: list[tuple[int, int]], name: str = "", scope: _Scope = _EXAMPLE
) -> list[memoryview]:
    """The values of a (merged) ``BytesList``; ``name`` and ``scope`` name it in errors."""
    values: list[memoryview] = []
    append, read_varint = values.append, _read_varint
    for start, end in runs:
        pos = start
        while pos < end:
            tag = buf[pos]
            pos += 1
            if tag > 0x7F:
                tag, pos = read_varint(buf, pos - 1, end)
            if tag == _LEN1:
                size = buf[pos]
                pos += 1
                if size > 0x7F:
                    size, pos = read_varint(buf, pos - 1, end)
                if size > end - pos:
                    raise _bad(f"length {size} runs past the end of its message", pos)
                append(buf[pos : pos + size])
                pos += size
            else:
                where = f"the BytesList of {scope.feature} {name!r}"
                raise _unknown(buf, start, end, pos, tag, where, scope.message)
    return values


def _scalar_runs(
    buf: memoryview,
    runs: list[tuple[int, int]],
    packed: int,
    unpacked: int,
    name: str = "",
    scope: _Scope = _EXAMPLE,
) -> list[tuple[int, int]]:
    """The byte runs holding a repeated scalar's values, packed or not.

    ``unpacked`` is the tag of one unpacked value (``0x0D``: a ``FloatList``'s,
    ``0x08``: an ``Int64List``'s); ``name`` and ``scope`` name the list in errors.
    """
    out = []
    for start, end in runs:
        pos = start
        while pos < end:
            tag = buf[pos]
            pos += 1
            if tag > 0x7F:
                tag, pos = _read_varint(buf, pos - 1, end)
            if tag == packed:
                size, pos = _read_len(buf, pos, end)
                if size:
                    out.append((pos, pos + size))
                pos += size
            elif tag == unpacked:
                value = pos
                pos = _skip(buf, pos, end, tag)
                out.append((value, pos))
            else:
                kind = "FloatList" if unpacked == _FIXED32_1 else "Int64List"
                where = f"the {kind} of {scope.feature} {name!r}"
                raise _unknown(buf, start, end, pos, tag, where, scope.message)
    return out


def _float_values(
    buf: memoryview, runs: list[tuple[int, int]], name: str = "", scope: _Scope = _EXAMPLE
) -> np.ndarray:
    runs = _scalar_runs(buf, runs, _LEN1, _FIXED32_1, name, scope)
    for start, stop in runs:
        if (stop - start) & 3:
            raise _bad(f"packed floats of {stop - start} bytes (not a multiple of 4)", start)
    if len(runs) == 1:
        start, stop = runs[0]
        return np.frombuffer(buf, _F4, (stop - start) >> 2, start)
    if not runs:
        return np.empty(0, _F4)
    return np.frombuffer(b"".join([buf[a:b] for a, b in runs]), _F4)


def _int64_values(
    buf: memoryview, runs: list[tuple[int, int]], name: str = "", scope: _Scope = _EXAMPLE
) -> np.ndarray:
    runs = _scalar_runs(buf, runs, _LEN1, _VARINT1, name, scope)
    if not runs:
        return np.empty(0, np.int64)
    if len(runs) == 1:
        start, stop = runs[0]
        data: Any = buf[start:stop]
    else:
        start, stop = runs[0][0], 0
        for _, stop in runs:
            # Each run must end on a whole varint before runs are joined for decoding.
            if buf[stop - 1] > 0x7F:
                raise _bad("truncated varint in packed int64 values", stop - 1)
        data = b"".join([buf[a:b] for a, b in runs])
    if len(data) <= _SMALL_RUN:
        return _decode_few_varints(data, start)
    return _decode_varints(np.frombuffer(data, _U1), start)


# Below this many bytes a Python loop beats numpy's fixed cost per call (~10 µs
# for the general varint path); labels and short lists are the common case.
_SMALL_RUN = 48


def _decode_few_varints(data: Any, at: int) -> np.ndarray:
    values = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            value &= 0xFFFF_FFFF_FFFF_FFFF
            values.append(value - (1 << 64) if value >> 63 else value)
            value = shift = 0
        else:
            shift += 7
            if shift == 70:
                raise _bad("varint longer than 10 bytes in packed int64 values", at)
    if shift:
        raise _bad("truncated varint in packed int64 values", at + len(data) - 1)
    return np.array(values, np.int64)
