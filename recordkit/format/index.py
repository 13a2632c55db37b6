"""The index sidecar: one ``"{offset} {framed_size}\\n"`` line per record, the text
format of NVIDIA DALI's ``tfrecord2idx`` and of the ``tfrecord`` PyPI package
(``docs/format.md``, Index sidecar). The index of ``part-00000.tfrecord`` is
``part-00000.tfrecord.idx`` beside it.

An index is never trusted blindly (:func:`validate_index`); :func:`scan_index` builds
one by a CRC-checked scan over a memory map (through the page cache, not into Python
memory). This module is the bytes; how a reader opens, keeps and rebuilds an index
(``ensure_index``, the per-user store) is :mod:`recordkit.reader.index`.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterable

import numpy as np

from ..errors import CorruptRecordError, InvalidIndexError, ShardNotFoundError
from . import guard
from ._atomic import atomic_write_bytes
from ._files import open_regular, read_regular
from .compressed import compressed_error, sniff_compression
from .framing import DEFAULT_MAX_RECORD_BYTES, OVERHEAD, read_header, read_record

__all__ = [
    "INDEX_SUFFIX",
    "check_entries",
    "check_lengths",
    "end_error",
    "entries_from_sizes",
    "entry_error",
    "format_index",
    "index_error",
    "index_path",
    "load_index",
    "map_file",
    "max_index_bytes",
    "open_map",
    "parse_index",
    "read_index_text",
    "scan_buffer",
    "scan_index",
    "validate_index",
    "write_index",
]

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".idx"
# The longest index line: two 19-digit numbers, a space and a newline. An index
# of a shard of n bytes has at most n // 16 lines, so it is never longer than this
# many bytes per 16 shard bytes (plus one line); a longer one is refused unread.
_MAX_LINE = 40
_DIGIT0, _DIGIT9, _SPACE, _NEWLINE = 48, 57, 32, 10


def index_path(shard_path: str | os.PathLike[str]) -> str:
    """Return the index sidecar path for ``shard_path`` (the shard name plus ``.idx``)."""
    return os.fspath(shard_path) + INDEX_SUFFIX


def _shard_error(reason: str, path: str) -> CorruptRecordError:
    return CorruptRecordError(f"shard {reason}", path=path, offset=0)


def index_error(reason: str, path: str) -> InvalidIndexError:
    """An index file that is not a regular file, or too large (``read_regular``'s refusals)."""
    return InvalidIndexError(f"index {reason}", path=path)


def open_map(path: str | os.PathLike[str]) -> mmap.mmap | bytes:
    """Memory-map ``path`` read-only (``b""`` for an empty file, which mmap rejects).

    Raises:
        ShardNotFoundError: there is no such file.
        CorruptRecordError: it is a directory, FIFO or device, not a regular file
            (checked without blocking: a FIFO is never opened for reading).
    """
    return map_file(path)[0]


def map_file(path: str | os.PathLike[str]) -> tuple[mmap.mmap | bytes, os.stat_result]:
    """:func:`open_map`, and the ``fstat`` of the very file it mapped."""
    path = os.fspath(path)
    try:
        fd = open_regular(path, _shard_error)
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"shard not found: {path}") from exc
    try:
        st = os.fstat(fd)
        if st.st_size == 0:
            return b"", st
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), st
    finally:
        os.close(fd)


def scan_index(
    shard_path: str | os.PathLike[str],
    *,
    verify: bool = True,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> np.ndarray:
    """Walk a shard's records and return its index as an ``(n, 2)`` int64 array.

    Column 0 is the record's offset, column 1 its framed size. Every length CRC is
    checked; with ``verify`` every payload CRC too.

    Raises:
        CorruptRecordError: a record is corrupt or truncated (names file, offset, record).
        CompressedTFRecordError: the file is a GZIP- or ZLIB-compressed TFRecord.
    """
    path = os.fspath(shard_path)
    buf = open_map(path)
    try:
        return scan_buffer(buf, path, verify, max_record_bytes)
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def scan_buffer(
    buf: mmap.mmap | bytes, path: str, verify: bool, max_record_bytes: int
) -> np.ndarray:
    """:func:`scan_index` of a shard already mapped as ``buf`` (``path`` names it in errors)."""
    offsets: list[int] = []
    sizes: list[int] = []
    offset, record, end = 0, 0, len(buf)
    kind = sniff_compression(buf[:12]) if end else None
    if kind is not None:  # a GZIP/ZLIB file: CompressedTFRecordError, never "corrupt"
        raise compressed_error(path, kind)
    while offset < end:
        if verify:
            length = len(
                read_record(
                    buf, offset, path=path, record=record, max_record_bytes=max_record_bytes
                )
            )
        else:
            length = read_header(
                buf, offset, path=path, record=record, max_record_bytes=max_record_bytes
            )
        offsets.append(offset)
        sizes.append(length + OVERHEAD)
        offset += length + OVERHEAD
        record += 1
    return np.column_stack((offsets, sizes)).astype(np.int64)


def format_index(entries: np.ndarray) -> bytes:
    """Render index entries in the DALI / ``tfrecord`` text format."""
    return "".join(f"{o} {s}\n" for o, s in entries.tolist()).encode("ascii")


def write_index(path: str | os.PathLike[str], entries: np.ndarray) -> None:
    """Write an index file atomically (temp file, fsync, rename)."""
    atomic_write_bytes(os.fspath(path), format_index(entries))


def parse_index(data: bytes, *, path: str | None = None) -> np.ndarray:
    """Parse index text into an ``(n, 2)`` int64 array, strictly.

    Vectorised: a million lines parse in about 60 ms. Lines must be exactly two
    decimal numbers separated by one space; the final newline may be missing.

    Raises:
        InvalidIndexError: anything else (names the file and, where it can, the line).
    """
    if not data:
        return np.empty((0, 2), dtype=np.int64)
    if not data.endswith(b"\n"):
        data += b"\n"
    raw = np.frombuffer(data, dtype=np.uint8)
    is_sep = (raw == _SPACE) | (raw == _NEWLINE)
    bad = ~(is_sep | ((raw >= _DIGIT0) & (raw <= _DIGIT9)))
    if bad.any():
        pos = int(np.argmax(bad))
        raise _bad_line(path, data, pos, f"unexpected byte {data[pos : pos + 1]!r}")
    sep_pos = np.flatnonzero(is_sep)
    seps = raw[sep_pos]
    # Separators must alternate space, newline, ... and never touch each other,
    # which also rules out empty tokens and blank lines.
    if len(seps) % 2 or (seps[0::2] != _SPACE).any() or (seps[1::2] != _NEWLINE).any():
        pos = _first_misplaced(seps, sep_pos)
        raise _bad_line(path, data, pos, "expected 'offset size' per line")
    gaps = np.diff(np.concatenate(([-1], sep_pos)))
    if (gaps < 2).any():
        pos = int(sep_pos[int(np.argmax(gaps < 2))])
        raise _bad_line(path, data, pos, "empty field")
    # Numbers past 18 digits would overflow int64 silently in fromstring.
    if (gaps > 19).any():
        pos = int(sep_pos[int(np.argmax(gaps > 19))])
        raise _bad_line(path, data, pos, "number too large")
    values = np.fromstring(data, dtype=np.int64, sep=" ")
    return values.reshape(-1, 2)


def _first_misplaced(seps: np.ndarray, sep_pos: np.ndarray) -> int:
    expected = np.where(np.arange(len(seps)) % 2 == 0, _SPACE, _NEWLINE)
    wrong = np.flatnonzero(seps != expected)
    return int(sep_pos[wrong[0]]) if len(wrong) else int(sep_pos[-1])


def _bad_line(path: str | None, data: bytes, pos: int, why: str) -> InvalidIndexError:
    line = data.count(b"\n", 0, pos)
    return InvalidIndexError(f"malformed index line {line + 1}: {why}", path=path, record=line)


def max_index_bytes(shard_bytes: int) -> int:
    """The largest index a shard of ``shard_bytes`` bytes can have (one line per 16 bytes)."""
    return (shard_bytes // OVERHEAD + 1) * _MAX_LINE


def read_index_text(path: str, *, max_bytes: int | None = None) -> bytes:
    """The bytes of an index file, refused unread when it is larger than ``max_bytes``.

    Raises:
        ShardNotFoundError: there is no such file.
        InvalidIndexError: not a regular file (a FIFO or a directory is refused
            without blocking), or too large.
    """
    limit = (1 << 62) if max_bytes is None else max_bytes
    try:
        return read_regular(path, index_error, max_bytes=limit, what="index")
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"index not found: {path}") from exc


def load_index(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> np.ndarray:
    """Read and parse an index file (see :func:`parse_index`).

    Args:
        path: the ``.idx`` file; it must be a regular file (a FIFO or a
            directory is refused without blocking).
        max_bytes: refuse a larger file unread (``max_index_bytes`` of the
            shard's size, when it is known).

    Raises:
        ShardNotFoundError: there is no such file.
        InvalidIndexError: not a regular file, too large, or malformed.
    """
    path = os.fspath(path)
    return parse_index(read_index_text(path, max_bytes=max_bytes), path=path)


def validate_index(
    entries: np.ndarray,
    buf: bytes | mmap.mmap | memoryview,
    *,
    path: str | None = None,
    index_file: str | None = None,
) -> None:
    """Check that ``entries`` describe the shard in ``buf`` exactly.

    Entries must start at 0, be contiguous, have sizes >= 16, end at the file
    size (``check_entries``), and every record's length field must equal its
    size minus 16. The last check reads one 8-byte field per record through the
    page cache; it is what catches an index left over from a different shard of
    the same size.

    Raises:
        InvalidIndexError: naming the index file, the record and its offset.
        ShardChangedError: ``buf`` is a map whose file no longer has its size.
    """
    where = index_file or (index_path(path) if path else None)
    check_entries(entries, len(buf), where=where)
    if len(entries):
        check_lengths(entries[:, 0], entries[:, 1], buf, path=path, where=where)


def check_entries(entries: np.ndarray, size: int, *, where: str | None = None) -> None:
    """The checks of an index that need only the shard's size, not its bytes.

    Entries must start at 0, each must start where the one before ends, every size
    must be >= 16, and the last must end at ``size``.

    Raises:
        InvalidIndexError: naming the index file ``where``, the record and its offset.
    """
    n = len(entries)
    if n == 0:
        if size:
            raise end_error(0, 0, size, where)
        return
    offsets, sizes = entries[:, 0], entries[:, 1]
    expected_offsets = np.concatenate(([0], np.cumsum(sizes[:-1])))
    problems = (sizes < OVERHEAD) | (offsets != expected_offsets) | (offsets + sizes > size)
    if problems.any():
        i = int(np.argmax(problems))
        raise entry_error(int(offsets[i]), int(sizes[i]), i, size, where)
    end = int(offsets[-1] + sizes[-1])
    if end != size:
        raise end_error(end, n, size, where)


def entry_error(
    offset: int, size: int, record: int, shard: int, where: str | None
) -> InvalidIndexError:
    """An index entry that does not fit its shard of ``shard`` bytes."""
    return InvalidIndexError(
        f"index entry ({offset}, {size}) does not match the shard of {shard} bytes "
        "(stale or corrupt index)",
        path=where,
        offset=offset,
        record=record,
    )


def end_error(end: int, records: int, shard: int, where: str | None) -> InvalidIndexError:
    """An index whose ``records`` entries end at ``end``, not at the shard's size."""
    if not records:
        reason = f"index is empty but the shard has {shard} bytes"
        return InvalidIndexError(reason, path=where, offset=0, record=0)
    return InvalidIndexError(
        f"index covers {end} bytes but the shard has {shard} (stale index)",
        path=where,
        offset=end,
        record=records,
    )


def check_lengths(
    offsets: np.ndarray,
    sizes: np.ndarray,
    buf: bytes | mmap.mmap | memoryview,
    *,
    path: str | None = None,
    where: str | None = None,
    records: np.ndarray | None = None,
) -> None:
    """Check that the u64 length field at each offset says its framed size minus 16.

    The entries must lie inside ``buf`` (checked by :func:`check_entries`).
    ``records`` are their record numbers, for the error (default ``0..n-1``).

    Raises:
        InvalidIndexError: the first entry whose length field disagrees (stale index).
        ShardChangedError: ``buf`` is a map whose file shrank below an entry.
    """
    if not len(offsets):
        return
    if guard.shrunk(buf):  # a record the cut took: name the first
        cut = offsets + sizes > (guard.current_size(buf) or 0)
        if cut.any():
            i = int(np.argmax(cut))
            rec = i if records is None else int(records[i])
            raise guard.changed(buf, path=path, offset=int(offsets[i]), record=rec)
    lengths = guard.gather_u64(buf, offsets, path=path)
    if lengths is None:  # not a map, or no native guard: NumPy reads them
        raw = np.frombuffer(buf, dtype=np.uint8)
        lengths = np.zeros(len(offsets), dtype=np.uint64)
        for k in range(8):  # the little-endian u64 length fields, a byte column at a time
            lengths |= raw[offsets + k].astype(np.uint64) << np.uint64(8 * k)
        del raw  # an error's traceback must not keep the map exported (it could not close)
    mismatch = lengths != (sizes - OVERHEAD).astype(np.uint64)
    if mismatch.any():
        i = int(np.argmax(mismatch))
        raise InvalidIndexError(
            f"index says {int(sizes[i])} framed bytes, the length field says "
            f"{int(lengths[i]) + OVERHEAD} (stale index)",
            path=where,
            offset=int(offsets[i]),
            record=i if records is None else int(records[i]),
        )


def entries_from_sizes(sizes: Iterable[int]) -> np.ndarray:
    """Build index entries from framed sizes in file order (what a writer knows)."""
    s = np.fromiter(sizes, dtype=np.int64)
    out = np.empty((len(s), 2), dtype=np.int64)
    out[:, 1] = s
    out[:, 0] = np.cumsum(s) - s
    return out
