"""TFRecord framing: ``u64 length · u32 masked_crc(length) · payload · u32 masked_crc(payload)``.

All integers are little-endian. A zero-length payload is legal. Unlike
TensorFlow, a partial header at the end of a file is reported as truncation,
not taken as a clean end of file: silently losing the last record is how data
goes missing unnoticed.

On a memory map (or a view of one), :func:`read_header` and :func:`read_record`
check the file's size first and read the header, footer and payload CRC through
:mod:`recordkit.format.guard`: a shard truncated under the reader raises
:class:`~recordkit.errors.ShardChangedError`, never SIGBUS. The payload view they
return still points into the map: copy it with :func:`recordkit.format.guard.read`.
"""

from __future__ import annotations

import itertools
import mmap
import struct
from collections.abc import Iterator
from typing import BinaryIO

from ..errors import CorruptRecordError, RecordTooLargeError, TruncatedRecordError
from . import guard
from .compressed import compressed_error, sniff_compression
from .crc import mask, masked_crc32c

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "FOOTER_SIZE",
    "HEADER_SIZE",
    "OVERHEAD",
    "frame",
    "frame_header",
    "iter_records",
    "read_header",
    "read_record",
    "read_stream",
]

HEADER_SIZE = 12  # u64 length + u32 masked CRC of the length bytes
FOOTER_SIZE = 4  # u32 masked CRC of the payload
OVERHEAD = HEADER_SIZE + FOOTER_SIZE
# A length field beyond this is treated as corruption before anything is allocated.
# 2 GiB is TensorFlow's own practical ceiling for one proto; records near it are
# almost certainly a flipped high bit in the length.
DEFAULT_MAX_RECORD_BYTES = 2**31

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_HEADER = struct.Struct("<QI")

Buffer = bytes | bytearray | memoryview | mmap.mmap


def frame_header(length: int) -> bytes:
    """Return the 12-byte header for a payload of ``length`` bytes."""
    length_bytes = _U64.pack(length)
    return length_bytes + _U32.pack(masked_crc32c(length_bytes))


def frame(payload: Buffer) -> bytes:
    """Return ``payload`` framed as one TFRecord record (header + payload + footer)."""
    return b"".join((frame_header(len(payload)), payload, _U32.pack(masked_crc32c(payload))))


def _check_header(
    buf: Buffer,
    at: int,
    path: str | None,
    offset: int,
    record: int | None,
    max_record_bytes: int,
) -> int:
    """The payload length of the complete 12-byte header at ``buf[at:]``, after its
    CRC and size checks (errors name ``offset``, the header's place in the file)."""
    length, stored = _HEADER.unpack_from(buf, at)
    actual = masked_crc32c(memoryview(buf)[at : at + 8])  # no view outlives the call
    _check_crc("length", stored, actual, path, offset, record)
    if length > max_record_bytes:
        raise RecordTooLargeError(
            f"record length {length} exceeds max_record_bytes={max_record_bytes}",
            path=path,
            offset=offset,
            record=record,
        )
    return int(length)


def _check_payload(
    payload: Buffer, stored: int, path: str | None, offset: int, record: int | None
) -> None:
    actual = mask(guard.crc32c(payload, path=path, offset=offset, record=record))
    _check_crc("payload", stored, actual, path, offset, record)


def _check_crc(
    what: str, stored: int, actual: int, path: str | None, offset: int, record: int | None
) -> None:
    if stored != actual:
        raise CorruptRecordError(
            f"{what} CRC mismatch",
            path=path,
            offset=offset,
            record=record,
            expected_crc=stored,
            actual_crc=actual,
        )


def read_header(
    buf: Buffer,
    offset: int,
    *,
    path: str | None = None,
    record: int | None = None,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> int:
    """Check the header at ``offset`` and return the payload length.

    Raises:
        TruncatedRecordError: the header or the payload it announces runs past the end.
        CorruptRecordError: the length CRC does not match.
        RecordTooLargeError: the length exceeds ``max_record_bytes``.
        ShardChangedError: ``buf`` is a map whose file shrank.
    """
    try:
        return _read_header(buf, offset, path, record, max_record_bytes)
    except CorruptRecordError:
        _changed_instead(buf, path, offset, record)
        raise


def _changed_instead(buf: Buffer, path: str | None, offset: int, record: int | None) -> None:
    """Bad bytes read from a map whose file has since shrunk are that change, not
    corruption (the rest of a page past the new end of file reads as zeros): say so."""
    if guard.shrunk(buf):
        raise guard.changed(buf, path=path, offset=offset, record=record) from None


def _read_header(
    buf: Buffer, offset: int, path: str | None, record: int | None, max_record_bytes: int
) -> int:
    end = len(buf)
    if offset + HEADER_SIZE > end:
        raise TruncatedRecordError(
            f"partial record header: {end - offset} of {HEADER_SIZE} bytes before end of file",
            path=path,
            offset=offset,
            record=record,
        )
    if guard.map_of(buf) is None:
        length = _check_header(buf, offset, path, offset, record, max_record_bytes)
    else:  # a map: size checked, then the 12 bytes copied under the guard
        guard.check_size(buf, None, path, offset=offset, record=record)
        header = guard.read(
            buf, offset, HEADER_SIZE, path=path, offset=offset, record=record, check=False
        )
        length = _check_header(header, 0, path, offset, record, max_record_bytes)
    if offset + OVERHEAD + length > end:
        raise TruncatedRecordError(
            f"record of {length} bytes needs {OVERHEAD + length} bytes, "
            f"only {end - offset} before end of file",
            path=path,
            offset=offset,
            record=record,
        )
    return int(length)


def read_record(
    buf: Buffer,
    offset: int,
    *,
    path: str | None = None,
    record: int | None = None,
    verify: bool = True,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    expected_size: int | None = None,
) -> memoryview:
    """Return the payload of the record at ``offset`` as a zero-copy ``memoryview``.

    Args:
        buf: the shard's bytes, usually an ``mmap``.
        offset: byte offset of the record's header.
        path: file name for error messages.
        record: record number for error messages.
        verify: check the payload CRC (the length CRC is always checked).
        max_record_bytes: reject length fields larger than this before reading.
        expected_size: the framed size from an index entry; a mismatch with the
            length field is corruption (or a stale index).

    Raises:
        CorruptRecordError: see :func:`read_header`; a payload CRC mismatch.
        ShardChangedError: ``buf`` is a map whose file shrank.
    """
    try:
        return _read_record(buf, offset, path, record, verify, max_record_bytes, expected_size)
    except CorruptRecordError:
        _changed_instead(buf, path, offset, record)
        raise


def _read_record(
    buf: Buffer,
    offset: int,
    path: str | None,
    record: int | None,
    verify: bool,
    max_record_bytes: int,
    expected_size: int | None,
) -> memoryview:
    length = _read_header(buf, offset, path, record, max_record_bytes)
    if expected_size is not None and expected_size != length + OVERHEAD:
        raise CorruptRecordError(
            f"length field says {length + OVERHEAD} framed bytes, index says {expected_size}",
            path=path,
            offset=offset,
            record=record,
        )
    start = offset + HEADER_SIZE
    payload = memoryview(buf)[start : start + length]
    if verify:
        at = start + length
        if guard.map_of(buf) is None:
            (stored,) = _U32.unpack_from(buf, at)
        else:
            footer = guard.read(
                buf, at, FOOTER_SIZE, path=path, offset=offset, record=record, check=False
            )
            (stored,) = _U32.unpack(footer)
        try:
            _check_payload(payload, stored, path, offset, record)
        except CorruptRecordError:
            # The traceback keeps this frame: a live view would keep the map from closing.
            payload.release()
            raise
    return payload


def iter_records(
    buf: Buffer,
    *,
    path: str | None = None,
    verify: bool = True,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(offset, payload)`` for every record in ``buf``, in file order.

    Payloads are zero-copy views: copy them before the buffer is closed.
    """
    offset, record, end = 0, 0, len(buf)
    while offset < end:
        payload = read_record(
            buf, offset, path=path, record=record, verify=verify, max_record_bytes=max_record_bytes
        )
        yield offset, payload
        offset += len(payload) + OVERHEAD
        record += 1


def _read_exact(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes: fewer only at the end of the stream."""
    chunks, got = [], 0
    while got < n:
        chunk = f.read(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_stream(
    f: BinaryIO,
    *,
    path: str | None = None,
    verify: bool = True,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> Iterator[bytes]:
    """Yield the payload of every record of a file object, in order, as it streams by.

    For files that cannot be mapped (remote objects, gzip streams): the same
    checks as :func:`read_record`, and the same errors, with offsets counted in
    the (uncompressed) stream. A file that is itself GZIP/ZLIB-compressed (not
    opened through :func:`~recordkit.format.open_stream`) raises
    :class:`~recordkit.errors.CompressedTFRecordError`.
    """
    offset = 0
    for record in itertools.count():
        header = _read_exact(f, HEADER_SIZE)
        if not header:
            return
        if record == 0:
            kind = sniff_compression(header)
            if kind is not None:  # a GZIP/ZLIB file read as plain: say so, never "corrupt"
                raise compressed_error(str(path), kind)
        if len(header) < HEADER_SIZE:
            raise TruncatedRecordError(
                f"partial record header: {len(header)} of {HEADER_SIZE} bytes before end of file",
                path=path,
                offset=offset,
                record=record,
            )
        length = _check_header(header, 0, path, offset, record, max_record_bytes)
        payload = _read_exact(f, length)
        footer = _read_exact(f, FOOTER_SIZE)
        if len(payload) < length or len(footer) < FOOTER_SIZE:
            raise TruncatedRecordError(
                f"record of {length} bytes cut short by the end of file",
                path=path,
                offset=offset,
                record=record,
            )
        if verify:
            _check_payload(payload, _U32.unpack(footer)[0], path, offset, record)
        yield payload
        offset += length + OVERHEAD
