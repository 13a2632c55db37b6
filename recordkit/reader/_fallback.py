"""Pure Python/NumPy twins of the functions in ``recordkit.native._ext``.

Used when the C extension was not built (no compiler at install time) or when
``RECORDKIT_NO_NATIVE=1`` is set. Every function gives exactly the results of
its native twin (the tests run both and compare), only slower: ~15 µs of
Python per record instead of well under one.

The wire parsing reuses the reference codec's own parsers
(:mod:`recordkit.codec.messages`, :mod:`recordkit.codec.wire`), so what this module
accepts or rejects is by construction what :func:`~recordkit.codec.decode_example`
does; the CRCs are :mod:`recordkit.format.crc`'s. The framing checks stay a twin of
their own (``_check_frame``): the batch functions report a status code per record,
in the order of :func:`~recordkit.format.read_record`'s checks, where it raises. The
status codes and span kinds are the contract's (:mod:`recordkit.reader._contract`).
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import numpy as np

from ..codec.messages import parse_features, scalar_runs
from ..codec.wire import (
    FIXED32_1,
    LEN1,
    LEN2,
    SMALL_RUN,
    VARINT1,
    decode_few_varints,
    decode_varints,
    read_len,
    read_varint,
)
from ..errors import CorruptRecordError
from ..format import crc
from ..format.framing import DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, OVERHEAD
from ._contract import (  # the constants the native twin defines (recordkit/native/recordkit.h)
    KIND_ABSENT,
    KIND_BYTES,
    KIND_COMPLEX,
    KIND_FLOAT,
    KIND_INT64,
    KIND_NONE,
    STATUS_LENGTH_CRC,
    STATUS_LENGTH_MISMATCH,
    STATUS_MALFORMED,
    STATUS_OK,
    STATUS_OUT_OF_BOUNDS,
    STATUS_PAYLOAD_CRC,
    STATUS_TOO_LARGE,
    STATUS_TRUNCATED,
    STATUS_UNEXPECTED,
)

__all__ = [
    "CRC32C_IMPL",
    "KIND_ABSENT",
    "KIND_BYTES",
    "KIND_COMPLEX",
    "KIND_FLOAT",
    "KIND_INT64",
    "KIND_NONE",
    "STATUS_LENGTH_CRC",
    "STATUS_LENGTH_MISMATCH",
    "STATUS_MALFORMED",
    "STATUS_OK",
    "STATUS_OUT_OF_BOUNDS",
    "STATUS_PAYLOAD_CRC",
    "STATUS_TOO_LARGE",
    "STATUS_TRUNCATED",
    "STATUS_UNEXPECTED",
    "MapFault",
    "bytes_lists",
    "crc32c",
    "gather",
    "gather_verified",
    "parse_batch",
    "read",
    "varints",
]

CRC32C_IMPL = "crc32c package"

_KIND_CODES = {"bytes": KIND_BYTES, "float": KIND_FLOAT, "int64": KIND_INT64}
_HEADER = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_NO_SPANS = (0, 0, 0, 0)


class MapFault(BufferError):
    """The native twin's error for a page that vanished under a guarded read.

    Never raised here: these functions read maps through Python and NumPy, which
    cannot be guarded (a vanished page is SIGBUS). Readers check a map's size
    before they read (:func:`recordkit.format.guard.check_size`) instead.
    """


def read(buf: Any, start: int, length: int, /) -> bytes:
    """A copy of ``buf[start:start + length]``; see ``recordkit.native._ext.read``."""
    view = _bytes_view(buf)
    if start < 0 or length < 0 or start > len(view) or length > len(view) - start:
        raise ValueError(
            f"span start {start} length {length} is outside the buffer ({len(view)} bytes)"
        )
    return bytes(view[start : start + length])


def crc32c(data: Any, value: int = 0, /) -> int:
    """CRC-32C of ``data`` continuing from ``value`` (:func:`recordkit.format.crc32c`:
    the ``crc32c`` package)."""
    return int(crc.crc32c(data, value))


def _bytes_view(buf: Any) -> memoryview:
    view = memoryview(buf)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return view


def _int64s(obj: Any, what: str) -> np.ndarray:
    arr = np.asarray(memoryview(obj))  # a buffer, as the native twin requires
    if arr.ndim != 1 or arr.dtype != np.int64:
        raise ValueError(
            f"{what} must be a 1-d buffer of native int64, got {arr.dtype} {arr.shape}"
        )
    return arr


def parse_batch(
    buf: Any,
    offsets: Any,
    sizes: Any,
    keys: tuple[bytes, ...],
    verify: bool,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    expect: Any = None,
    /,
) -> tuple[bytearray, bytearray]:
    """Check the framing of n records and locate the features named by ``keys``.

    See ``recordkit.native._ext.parse_batch``: returns ``status`` (n native int32)
    and ``spans`` (n*F*4 native int64, ``(kind, count, start, nbytes)`` per
    record and key, all zero for records whose status is an error). ``expect``:
    ``(kind, count, nbytes)`` int64 triples for the first keys (-1: any); a
    well-formed record that differs gets ``STATUS_UNEXPECTED``.
    """
    view = _bytes_view(buf)
    offs, lens = _int64s(offsets, "offsets"), _int64s(sizes, "sizes")
    if len(offs) != len(lens):
        raise ValueError(f"offsets has {len(offs)} records, sizes {len(lens)}")
    if not isinstance(keys, tuple) or not all(type(k) is bytes for k in keys):
        raise TypeError("keys must be a tuple of bytes")
    if len(set(keys)) != len(keys):
        raise ValueError("keys has a duplicate")
    if max_record_bytes < 0:
        raise ValueError("max_record_bytes must be >= 0")
    want: list[tuple[int, int, int]] = []
    if expect is not None:
        triples = memoryview(expect)
        if triples.itemsize != 8 or triples.format.lstrip("@=<") not in ("q", "l"):
            raise ValueError("expect must hold native int64 triples")
        if not triples.c_contiguous or triples.nbytes % 24:
            raise ValueError("expect must be a C-contiguous buffer of int64 triples")
        flat = struct.unpack(f"={triples.nbytes // 8}q", triples.tobytes())
        want = list(zip(flat[0::3], flat[1::3], flat[2::3]))
        if len(want) > len(keys):
            raise ValueError(f"expect has {len(want)} triples for {len(keys)} keys")
    # A key that is not valid UTF-8 can never match: a record with such a key is malformed.
    wanted: dict[str, int] = {}
    for k, key in enumerate(keys):
        with contextlib.suppress(UnicodeDecodeError):
            wanted[key.decode("utf-8")] = k
    nkeys = len(keys)
    status: list[int] = []
    spans: list[tuple[int, int, int, int]] = []
    for offset, size in zip(offs.tolist(), lens.tolist()):
        code, start, length = _check_frame(view, offset, size, verify, max_record_bytes)
        record = [_NO_SPANS] * nkeys
        if code == STATUS_OK:
            try:
                record = _parse_record(view, start, start + length, wanted, nkeys)
            except (CorruptRecordError, IndexError):  # IndexError: a read past the payload
                code = STATUS_MALFORMED
            else:
                if _unexpected(record, want):
                    code = STATUS_UNEXPECTED
        status.append(code)
        spans.extend(record)
    return (
        bytearray(np.array(status, np.int32).tobytes()),
        bytearray(np.array(spans, np.int64).reshape(-1, 4).tobytes()),
    )


def _unexpected(record: list[tuple[int, int, int, int]], want: list[tuple[int, int, int]]) -> bool:
    for (kind, count, _, nbytes), (w_kind, w_count, w_nbytes) in zip(record, want):
        if (
            (w_kind >= 0 and kind != w_kind)
            or (w_count >= 0 and count != w_count)
            or (w_nbytes >= 0 and nbytes != w_nbytes)
        ):
            return True
    return False


def _check_frame(
    view: memoryview, offset: int, size: int, verify: bool, max_len: int
) -> tuple[int, int, int]:
    """The checks of :func:`recordkit.format.read_record`, in its order, as a status code."""
    end = len(view)
    if offset < 0 or offset > end:
        return STATUS_OUT_OF_BOUNDS, 0, 0
    if end - offset < HEADER_SIZE:
        return STATUS_TRUNCATED, 0, 0
    length, stored = _HEADER.unpack_from(view, offset)
    if crc.masked_crc32c(view[offset : offset + 8]) != stored:
        return STATUS_LENGTH_CRC, 0, 0
    if length > max_len:
        return STATUS_TOO_LARGE, 0, 0
    if length > end - offset - OVERHEAD:
        return STATUS_TRUNCATED, 0, 0
    if size != length + OVERHEAD:
        return STATUS_LENGTH_MISMATCH, 0, 0
    start = offset + HEADER_SIZE
    if (
        verify
        and crc.masked_crc32c(view[start : start + length])
        != _U32.unpack_from(view, start + length)[0]
    ):
        return STATUS_PAYLOAD_CRC, 0, 0
    return STATUS_OK, start, length


def _parse_record(
    view: memoryview, start: int, stop: int, wanted: dict[str, int], nkeys: int
) -> list[tuple[int, int, int, int]]:
    # The payload as its own view, so positions and bounds are the reference's.
    payload = view[start:stop]
    end = len(payload)
    entries: dict[str, list[Any]] = {}
    pos = 0
    while pos < end:  # the top level of decode_example
        tag, pos = read_varint(payload, pos, end)
        if tag == LEN1:  # Example.features
            size, pos = read_len(payload, pos, end)
            parse_features(payload, pos, pos + size, entries)
            pos += size
        elif tag == LEN2:  # a SequenceExample's feature_lists: the reference says so
            raise CorruptRecordError("SequenceExample")
        else:  # a field the Example does not define: the reference names it
            raise CorruptRecordError("unknown field")
    out = [_NO_SPANS] * nkeys
    for name, k in wanted.items():
        entry = entries.get(name)
        if entry is not None:
            kind, count, first, nbytes = _span(payload, entry[0], entry[1])
            out[k] = (kind, count, first + start if count else 0, nbytes)
    return out


def _span(payload: memoryview, kind: str | None, runs: list[tuple[int, int]]) -> tuple[int, ...]:
    """``(kind, count, first, nbytes)`` of one feature; positions relative to the payload."""
    if kind is None:
        return KIND_NONE, 0, 0, 0
    if kind == "bytes":
        return _bytes_span(payload, runs)
    if kind == "float":
        chunks = scalar_runs(payload, runs, LEN1, FIXED32_1)
        count = 0
        for a, b in chunks:
            if (b - a) & 3:
                raise CorruptRecordError("packed floats not a multiple of 4 bytes")
            count += (b - a) >> 2
    else:
        chunks = scalar_runs(payload, runs, LEN1, VARINT1)
        count = sum(_count_varints(payload, a, b) for a, b in chunks)
    code = _KIND_CODES[kind] | (KIND_COMPLEX if len(chunks) > 1 else 0)
    if not chunks:
        return code, 0, 0, 0
    a, b = chunks[0]
    return code, count, a, b - a


def _bytes_span(payload: memoryview, runs: list[tuple[int, int]]) -> tuple[int, ...]:
    count = first = nbytes = 0
    for pos, end in runs:
        while pos < end:
            tag, pos = read_varint(payload, pos, end)
            if tag == LEN1:
                size, pos = read_len(payload, pos, end)
                if not count:
                    first, nbytes = pos, size
                count += 1
                pos += size
            else:  # a field the BytesList does not define: the reference names it
                raise CorruptRecordError("unknown field")
    return KIND_BYTES | (KIND_COMPLEX if len(runs) > 1 else 0), count, first, nbytes


def _count_varints(payload: memoryview, start: int, stop: int) -> int:
    """The number of varints in a packed run; it must end on a varint of at most 10 bytes."""
    if stop - start <= 16:  # a label or a short list: cheaper than numpy's set-up
        count = run = 0
        for byte in payload[start:stop]:
            if byte < 0x80:
                count, run = count + 1, 0
            elif run == 9:
                raise CorruptRecordError("varint longer than 10 bytes in packed int64 values")
            else:
                run += 1
        if run:
            raise CorruptRecordError("truncated varint in packed int64 values")
        return count
    raw = np.frombuffer(payload, np.uint8, stop - start, start)
    last = raw < 0x80
    if not last[-1]:
        raise CorruptRecordError("truncated varint in packed int64 values")
    ends = np.flatnonzero(last)
    if ends[0] >= 10 or (len(ends) > 1 and np.diff(ends).max() > 10):
        raise CorruptRecordError("varint longer than 10 bytes in packed int64 values")
    return len(ends)


def _out_bytes(out: Any) -> tuple[np.ndarray, memoryview]:
    """A writable uint8 array over ``out``'s memory, and ``out``'s own view."""
    view = memoryview(out)
    if view.readonly:
        raise TypeError("out must be a writable buffer")
    if not view.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not view.nbytes:  # memoryview cannot cast views with a zero in their shape
        return np.empty(0, np.uint8), view
    flat = view if view.ndim == 1 and view.format == "B" else view.cast("B")
    return np.frombuffer(flat, np.uint8), view


def gather(buf: Any, starts: Any, lengths: Any, out: Any, row_bytes: int, /) -> None:
    """Copy ``buf[starts[i]:starts[i] + lengths[i]]`` into row i of ``out``, zero the rest.

    See ``recordkit.native._ext.gather``.
    """
    src = np.frombuffer(_bytes_view(buf), np.uint8)
    s, ls = _int64s(starts, "starts"), _int64s(lengths, "lengths")
    dst, _ = _out_bytes(out)
    n = len(s)
    if len(ls) != n:
        raise ValueError(f"starts has {n} rows, lengths {len(ls)}")
    if row_bytes < 0 or dst.size != n * row_bytes:
        raise ValueError(f"out has {dst.size} bytes, expected {n} rows of {row_bytes}")
    bad = (ls < 0) | (ls > row_bytes) | (s < 0) | (s > src.size) | (ls > src.size - s)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"row {i}: span start {s[i]} length {ls[i]} is outside the buffer "
            f"({src.size} bytes) or longer than row_bytes={row_bytes}"
        )
    rows = dst.reshape(n, row_bytes)
    for i, (a, length) in enumerate(zip(s.tolist(), ls.tolist())):
        rows[i, :length] = src[a : a + length]
        rows[i, length:] = 0


def gather_verified(
    buf: Any, offsets: Any, sizes: Any, starts: Any, lengths: Any, out: Any, row_bytes: int, /
) -> bytearray:
    """:func:`gather`, also checking the payload CRC of the record each span lies in.

    See ``recordkit.native._ext.gather_verified``: returns n native int32, 0 or
    ``STATUS_PAYLOAD_CRC``; a span of nonzero length must lie in its payload.
    """
    view = _bytes_view(buf)
    src = np.frombuffer(view, np.uint8)
    o, z = _int64s(offsets, "offsets"), _int64s(sizes, "sizes")
    s, ls = _int64s(starts, "starts"), _int64s(lengths, "lengths")
    dst, _ = _out_bytes(out)
    n = len(s)
    if not len(ls) == len(o) == len(z) == n:
        raise ValueError("offsets, sizes, starts and lengths differ in length")
    if row_bytes < 0 or dst.size != n * row_bytes:
        raise ValueError(f"out has {dst.size} bytes, expected {n} rows of {row_bytes}")
    with np.errstate(over="ignore"):  # rows that overflow are already out of bounds
        bad = (o < 0) | (z < OVERHEAD) | (o > src.size) | (z > src.size - o)
        bad |= (ls < 0) | (ls > row_bytes)
        bad |= (ls != 0) & ((s < o + HEADER_SIZE) | (s > o + z - 4 - ls))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"row {i}: record (offset {o[i]}, size {z[i]}) is outside the buffer, or its span "
            f"(start {s[i]}, length {ls[i]}) is outside its payload or row_bytes={row_bytes}"
        )
    rows = dst.reshape(n, row_bytes)
    status = []
    for i, (offset, size, a, length) in enumerate(
        zip(o.tolist(), z.tolist(), s.tolist(), ls.tolist())
    ):
        rows[i, :length] = src[a : a + length]
        rows[i, length:] = 0
        end = offset + size - 4
        ok = crc.masked_crc32c(view[offset + HEADER_SIZE : end]) == _U32.unpack_from(view, end)[0]
        status.append(STATUS_OK if ok else STATUS_PAYLOAD_CRC)
    return bytearray(np.array(status, np.int32).tobytes())


def varints(buf: Any, starts: Any, nbytes: Any, counts: Any, out: Any, /) -> None:
    """Decode the packed int64 varint spans of n records, in order, into ``out``.

    See ``recordkit.native._ext.varints``.
    """
    src = np.frombuffer(_bytes_view(buf), np.uint8)
    s, nb, c = _int64s(starts, "starts"), _int64s(nbytes, "nbytes"), _int64s(counts, "counts")
    if not len(s) == len(nb) == len(c):
        raise ValueError(
            f"starts, nbytes and counts differ in length ({len(s)}, {len(nb)}, {len(c)})"
        )
    raw, view = _out_bytes(out)
    if view.itemsize != 8 or view.format.lstrip("@=<") not in ("q", "l"):
        raise ValueError("out must be a buffer of native int64")
    if (c < 0).any():
        raise ValueError(f"counts[{int(np.flatnonzero(c < 0)[0])}] is invalid")
    dst = raw.view(np.int64)
    if dst.size != int(c.sum()):
        raise ValueError(f"out holds {dst.size} values, counts sum to {int(c.sum())}")
    at = 0
    for i, (a, size, count) in enumerate(zip(s.tolist(), nb.tolist(), c.tolist())):
        if size < 0 or a < 0 or a > src.size or size > src.size - a:
            raise ValueError(f"record {i}: the span is outside the buffer")
        values = _varint_values(src[a : a + size], i)
        if values.size != count:
            more = "more" if values.size > count else "fewer"
            raise ValueError(f"record {i}: the span holds {more} values than its count")
        dst[at : at + count] = values
        at += count


def _varint_values(raw: np.ndarray, record: int) -> np.ndarray:
    if not raw.size:
        return np.empty(0, np.int64)
    try:
        if raw[-1] > 0x7F:
            raise CorruptRecordError("truncated varint")
        if raw.size <= SMALL_RUN:  # the reference's own split between its two decoders
            return decode_few_varints(raw.tobytes(), 0)
        return decode_varints(raw, 0)
    except CorruptRecordError:
        raise ValueError(
            f"record {record}: a varint is truncated or longer than 10 bytes"
        ) from None


def bytes_lists(buf: Any, starts: Any, nbytes: Any, counts: Any, /) -> list[Any]:
    """The values of n ``BytesList``s as ``bytes``: n lists (``counts`` ``None``: the n
    first values, flat). See ``recordkit.native._ext.bytes_lists``."""
    view = _bytes_view(buf)
    s, nb = _int64s(starts, "starts"), _int64s(nbytes, "nbytes")
    c = _int64s(counts, "counts") if counts is not None else None
    if len(nb) != len(s) or (c is not None and len(c) != len(s)):
        lens = f"{len(s)}, {len(nb)}, {len(s) if c is None else len(c)}"
        raise ValueError(f"starts, nbytes and counts differ in length ({lens})")
    if c is not None and (c < 0).any():
        i = int(np.flatnonzero(c < 0)[0])
        raise ValueError(f"counts[{i}] = {int(c[i])} is invalid")
    end = len(view)
    out: list[Any] = []
    for i, (start, size) in enumerate(zip(s.tolist(), nb.tolist())):
        count = 1 if c is None else int(c[i])
        values: list[bytes] = []
        if count and (size < 0 or start < 0 or start > end or size > end - start):
            raise ValueError(f"record {i}: the span is outside the buffer")
        for k in range(count):
            if k:  # the next value: BytesList.value (0x0A), its length, its bytes
                pos = start + size
                try:
                    tag, pos = read_varint(view, pos, end)
                except CorruptRecordError:
                    tag = -1
                if tag != LEN1:
                    why = "a value after the first is not framed as BytesList.value"
                    raise ValueError(f"record {i}: {why}")
                try:
                    size, start = read_len(view, pos, end)
                except CorruptRecordError:
                    why = "a value runs past the end of the buffer"
                    raise ValueError(f"record {i}: {why}") from None
            values.append(bytes(view[start : start + size]))
        out.append(values if c is not None else values[0])
    return out
