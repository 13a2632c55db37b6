"""The protobuf wire format, as recordkit's codecs read and write it.

The primitives under the Example and SequenceExample codecs
(``recordkit.codec.example``, ``recordkit.codec.sequence``, and the span parse of
``recordkit.reader._fallback``, the pure Python twin of the C decoder): the tags of
the fields a ``tf.train.Example`` is made of, base-128 varints (one at a time, or
vectorised over a packed run), length prefixes checked against the end of their
message, and skipping a field by its wire type. A tag is ``field_number << 3 |
wire_type``; these messages use three wire types: 0 (varint), 2 (length-delimited)
and 5 (32-bit).

Every reader takes ``(buf, pos, end)``, a ``memoryview`` (or any sequence of byte
values) with the position to read at and the end of the enclosing message, and
returns ``(value, new position)``; nothing past ``end`` is read, and anything
malformed raises :class:`~recordkit.errors.CorruptRecordError` naming the payload
byte (:func:`malformed`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CorruptRecordError

__all__ = [
    "FIXED32_1",
    "KIND_OF_TAG",
    "LEN1",
    "LEN2",
    "LEN3",
    "SMALL_RUN",
    "VARINT1",
    "WIRE_TYPES",
    "decode_few_varints",
    "decode_varints",
    "encode_varints",
    "malformed",
    "read_len",
    "read_varint",
    "skip",
    "tag_start",
    "varint",
]

_U1 = np.dtype(np.uint8)

# Tag bytes (field_number << 3 | wire_type) of the fields the Example messages define.
LEN1 = 0x0A  # field 1, length-delimited
LEN2 = 0x12  # field 2, length-delimited
LEN3 = 0x1A  # field 3, length-delimited
VARINT1 = 0x08  # field 1, varint (unpacked int64)
FIXED32_1 = 0x0D  # field 1, 32-bit (unpacked float)

# A Feature's oneof: the tag of each list, by the kind it holds.
KIND_OF_TAG = {LEN1: "bytes", LEN2: "float", LEN3: "int64"}

# Wire type -> its name in error messages (6 and 7 are not wire types).
WIRE_TYPES = ("varint", "64-bit", "length-delimited", "group start", "group end", "32-bit")


def malformed(what: str, pos: int) -> CorruptRecordError:
    """The error for a payload that is not protobuf wire format at byte ``pos``."""
    return CorruptRecordError(f"malformed tf.train.Example: {what} at payload byte {pos}")


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


def encode_varints(values: np.ndarray) -> Any:
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


def decode_varints(raw: np.ndarray, at: int) -> np.ndarray:
    """Decode concatenated varints (a packed int64 field) without a Python loop.

    Args:
        raw: the field's bytes as a uint8 array.
        at: payload offset of ``raw[0]``, for error messages.
    """
    if raw.max() < 0x80:  # every value in [0, 127]: one byte each
        return raw.astype(np.int64)
    last = raw < 0x80
    if not last[-1]:
        raise malformed("truncated varint in packed int64 values", at + raw.size - 1)
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.max() > 10:
        first = int(np.flatnonzero(lens > 10)[0])
        raise malformed(
            "varint longer than 10 bytes in packed int64 values", at + int(starts[first])
        )
    # OR in byte k of every varint that has one; a uint64 shift by 63 drops the
    # bits of a 10th byte past bit 64, as protobuf does.
    values = (raw[starts] & 0x7F).astype(np.uint64)
    for k in range(1, int(lens.max())):
        has = np.flatnonzero(lens > k)
        values[has] |= (raw[starts[has] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values.view(np.int64)


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
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
            raise malformed("varint longer than 10 bytes", start)
    raise malformed("truncated varint", start)


def read_len(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a length prefix and check that the bytes it claims are all there."""
    size, pos = read_varint(buf, pos, end)
    if size > end - pos:
        raise malformed(f"length {size} runs past the end of its message", pos)
    return size, pos


def skip(buf: memoryview, pos: int, end: int, tag: int) -> int:
    """Skip the value of a field whose tag has just been read."""
    wire = tag & 7
    if tag >> 3 == 0:
        raise malformed("field number 0", pos - 1)
    if tag > 0xFFFF_FFFF:
        raise malformed(f"tag {tag} out of range", pos - 1)
    if wire == 0:
        return read_varint(buf, pos, end)[1]
    if wire == 2:
        size, pos = read_len(buf, pos, end)
        return pos + size
    width = 8 if wire == 1 else 4 if wire == 5 else 0
    if not width:
        raise malformed(f"unsupported wire type {wire}", pos - 1)
    if width > end - pos:
        raise malformed(f"{width}-byte field runs past the end of its message", pos)
    return pos + width


def tag_start(buf: memoryview, start: int, end: int, pos: int) -> int:
    """Where the tag that ends at ``pos`` starts: found by walking the message from
    ``start`` (the fields before it parsed), so a tag written in more bytes than it
    needs is located exactly too."""
    at = start
    try:
        while at < pos:
            tag, after = read_varint(buf, at, end)
            if after == pos:
                return at
            at = skip(buf, after, end, tag)
    except (CorruptRecordError, IndexError):
        pass
    return pos - 1  # not reached for a tag the parsers read


# Below this many bytes a Python loop beats numpy's fixed cost per call (~10 µs
# for the general varint path); labels and short lists are the common case.
SMALL_RUN = 48


def decode_few_varints(data: Any, at: int) -> np.ndarray:
    """:func:`decode_varints` for a short run (up to ``SMALL_RUN`` bytes), in a loop."""
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
                raise malformed("varint longer than 10 bytes in packed int64 values", at)
    if shift:
        raise malformed("truncated varint in packed int64 values", at + len(data) - 1)
    return np.array(values, np.int64)
