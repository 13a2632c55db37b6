"""The messages inside a ``tf.train.Example``, parsed into where their values lie.

A ``Features`` message (``map<string, Feature>``; an entry: key = 1, value = 2) is
read into ``spans[key] = [kind, runs]``: the ``oneof`` member its ``Feature`` sets
last (``"bytes"``, ``"float"``, ``"int64"``, or ``None``) and the byte runs of that
list's (merged) submessages. The value readers then turn runs into values (views
of the payload where the wire format allows). These follow protobuf's parser (a
repeated key replaces the earlier entry, repeated submessages merge, the last
``oneof`` member wins, scalars packed, unpacked or mixed) except that a field a
message does not define is an :class:`~recordkit.errors.UnknownFieldError`
(:func:`unknown_field`), never skipped.

Shared by :func:`~recordkit.codec.decode_example`, the ``SequenceExample`` codec
(``recordkit.codec.sequence``, whose :class:`Scope` names its own messages in
errors) and the reader's pure Python span parse (``recordkit.reader._fallback``),
so all three accept and refuse exactly the same payloads.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptRecordError, UnknownFieldError
from .wire import (
    FIXED32_1,
    KIND_OF_TAG,
    LEN1,
    LEN2,
    SMALL_RUN,
    VARINT1,
    WIRE_TYPES,
    decode_few_varints,
    decode_varints,
    malformed,
    read_len,
    read_varint,
    skip,
    tag_start,
)

__all__ = [
    "EXAMPLE",
    "Scope",
    "bytes_values",
    "entry_key",
    "float_values",
    "int64_values",
    "list_values",
    "parse_features",
    "scalar_runs",
    "unknown_field",
]

_F4 = np.dtype("<f4")
_U1 = np.dtype(np.uint8)


class Scope(NamedTuple):
    """How errors name the messages a parse is in (an Example's, or a SequenceExample's)."""

    message: str  # the message type read
    features: str  # its Features message
    feature: str  # what a map entry's key (or a list's name) names
    value: str  # what the entry's Feature message is called


EXAMPLE = Scope("tf.train.Example", "Example.features", "feature", "Feature")


def unknown_field(
    buf: memoryview, start: int, end: int, pos: int, tag: int, where: str, message: str
) -> CorruptRecordError:
    """The error for a field the message ``[start, end)`` does not define.

    ``pos`` is where the field's tag ended; a tag that is not a valid one (field
    number 0, wire type 6 or 7) is malformed rather than unknown.
    """
    at = tag_start(buf, start, end, pos)
    number, wire = tag >> 3, tag & 7
    if number == 0:
        return malformed("field number 0", at)
    if tag > 0xFFFF_FFFF:
        return malformed(f"tag {tag} out of range", at)
    if wire > 5:
        return malformed(f"unsupported wire type {wire}", at)
    return UnknownFieldError(
        f"field {number} ({WIRE_TYPES[wire]}) inside {where} at payload byte {at}, which "
        f"{message} does not define: TensorFlow would drop it silently, so the record is "
        "refused",
        field_number=number,
        wire_type=WIRE_TYPES[wire],
        where=where,
        message=message,
        at=at,
    )


def entry_key(buf: memoryview, start: int, stop: int) -> str:
    """The key of the map entry ``[start, stop)`` as an error names it (the last key
    field before anything unreadable; protobuf's default, the empty key, if none)."""
    key: Any = b""
    pos = start
    try:
        while pos < stop:
            tag, pos = read_varint(buf, pos, stop)
            if tag == LEN1:
                size, pos = read_len(buf, pos, stop)
                key = buf[pos : pos + size]
                pos += size
            else:
                pos = skip(buf, pos, stop, tag)
    except (CorruptRecordError, IndexError):
        pass
    return repr(str(key, "utf-8", "replace"))


def parse_features(
    buf: memoryview,
    pos: int,
    end: int,
    spans: dict[str, list[Any]],
    scope: Scope = EXAMPLE,
) -> None:
    """Record each map entry of a ``Features`` message as ``spans[key] = [kind, runs]``.

    The common layout (one key, one value holding one list) takes the inline
    fast paths; anything else, including protobuf's merge rules, the general ones.
    ``scope`` names the messages in errors.
    """
    varint_at, kinds = read_varint, KIND_OF_TAG
    start = pos
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag != LEN1:
            if tag > 0x7F:
                tag, pos = varint_at(buf, pos - 1, end)
            if tag != LEN1:
                raise unknown_field(buf, start, end, pos, tag, scope.features, scope.message)
        size = buf[pos]
        pos += 1
        if size > 0x7F:
            size, pos = varint_at(buf, pos - 1, end)
        if size > end - pos:
            raise malformed(f"length {size} runs past the end of its message", pos)
        stop = pos + size
        # A map entry: key = 1, value = 2; either may be absent, repeated or reordered.
        key: Any = b""
        key_at = entry_at = pos
        state: list[Any] = [None, None]
        while pos < stop:
            tag = buf[pos]
            pos += 1
            if tag > 0x7F:
                tag, pos = varint_at(buf, pos - 1, stop)
            if tag == LEN1:
                size = buf[pos]
                pos += 1
                if size > 0x7F:
                    size, pos = varint_at(buf, pos - 1, stop)
                if size > stop - pos:
                    raise malformed(f"length {size} runs past the end of its message", pos)
                key_at = pos
                pos += size
                key = buf[key_at:pos]
            elif tag == LEN2:
                size = buf[pos]
                pos += 1
                if size > 0x7F:
                    size, pos = varint_at(buf, pos - 1, stop)
                if size > stop - pos:
                    raise malformed(f"length {size} runs past the end of its message", pos)
                fstart, fend = pos, pos + size
                while pos < fend:  # the Feature: a oneof of three lists
                    tag = buf[pos]
                    pos += 1
                    if tag > 0x7F:
                        tag, pos = varint_at(buf, pos - 1, fend)
                    kind = kinds.get(tag)
                    if kind is None:
                        where = f"{scope.value} {entry_key(buf, entry_at, stop)}"
                        raise unknown_field(buf, fstart, fend, pos, tag, where, scope.message)
                    size = buf[pos]
                    pos += 1
                    if size > 0x7F:
                        size, pos = varint_at(buf, pos - 1, fend)
                    if size > fend - pos:
                        raise malformed(f"length {size} runs past the end of its message", pos)
                    if state[0] == kind:  # the same oneof member again: protobuf merges
                        state[1].append((pos, pos + size))
                    else:  # a different member replaces the one set before
                        state[0] = kind
                        state[1] = [(pos, pos + size)]
                    pos += size
            else:
                where = f"the map entry of {scope.feature} {entry_key(buf, entry_at, stop)}"
                raise unknown_field(buf, entry_at, stop, pos, tag, where, scope.message)
        try:
            spans[str(key, "utf-8")] = state
        except UnicodeDecodeError:
            raise malformed("feature key is not valid UTF-8", key_at) from None


def bytes_values(
    buf: memoryview, runs: list[tuple[int, int]], name: str = "", scope: Scope = EXAMPLE
) -> list[memoryview]:
    """The values of a (merged) ``BytesList``; ``name`` and ``scope`` name it in errors."""
    values: list[memoryview] = []
    append, varint_at = values.append, read_varint
    for start, end in runs:
        pos = start
        while pos < end:
            tag = buf[pos]
            pos += 1
            if tag > 0x7F:
                tag, pos = varint_at(buf, pos - 1, end)
            if tag == LEN1:
                size = buf[pos]
                pos += 1
                if size > 0x7F:
                    size, pos = varint_at(buf, pos - 1, end)
                if size > end - pos:
                    raise malformed(f"length {size} runs past the end of its message", pos)
                append(buf[pos : pos + size])
                pos += size
            else:
                where = f"the BytesList of {scope.feature} {name!r}"
                raise unknown_field(buf, start, end, pos, tag, where, scope.message)
    return values


def scalar_runs(
    buf: memoryview,
    runs: list[tuple[int, int]],
    packed: int,
    unpacked: int,
    name: str = "",
    scope: Scope = EXAMPLE,
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
                tag, pos = read_varint(buf, pos - 1, end)
            if tag == packed:
                size, pos = read_len(buf, pos, end)
                if size:
                    out.append((pos, pos + size))
                pos += size
            elif tag == unpacked:
                value = pos
                pos = skip(buf, pos, end, tag)
                out.append((value, pos))
            else:
                kind = "FloatList" if unpacked == FIXED32_1 else "Int64List"
                where = f"the {kind} of {scope.feature} {name!r}"
                raise unknown_field(buf, start, end, pos, tag, where, scope.message)
    return out


def float_values(
    buf: memoryview, runs: list[tuple[int, int]], name: str = "", scope: Scope = EXAMPLE
) -> np.ndarray:
    """The values of a (merged) ``FloatList``: a float32 array (a view when one packed run)."""
    runs = scalar_runs(buf, runs, LEN1, FIXED32_1, name, scope)
    for start, stop in runs:
        if (stop - start) & 3:
            raise malformed(f"packed floats of {stop - start} bytes (not a multiple of 4)", start)
    if len(runs) == 1:
        start, stop = runs[0]
        return np.frombuffer(buf, _F4, (stop - start) >> 2, start)
    if not runs:
        return np.empty(0, _F4)
    return np.frombuffer(b"".join([buf[a:b] for a, b in runs]), _F4)


def int64_values(
    buf: memoryview, runs: list[tuple[int, int]], name: str = "", scope: Scope = EXAMPLE
) -> np.ndarray:
    """The values of a (merged) ``Int64List``: an int64 array."""
    runs = scalar_runs(buf, runs, LEN1, VARINT1, name, scope)
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
                raise malformed("truncated varint in packed int64 values", stop - 1)
        data = b"".join([buf[a:b] for a, b in runs])
    if len(data) <= SMALL_RUN:
        return decode_few_varints(data, start)
    return decode_varints(np.frombuffer(data, _U1), start)


def list_values(
    buf: memoryview, state: list[Any], name: str = "", scope: Scope = EXAMPLE
) -> tuple[str | None, Any]:
    """``(kind, values)`` of a ``Feature`` parsed into ``[kind, runs]`` (by
    :func:`parse_features`); ``(None, None)`` when it sets no list."""
    kind, runs = state
    if kind is None:
        return (None, None)
    if kind == "bytes":
        return ("bytes", bytes_values(buf, runs, name, scope))
    if kind == "float":
        return ("float", float_values(buf, runs, name, scope))
    return ("int64", int64_values(buf, runs, name, scope))
