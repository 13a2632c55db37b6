"""Reading shard maps safely: a shard that shrinks is an error, not a SIGBUS.

Two defences, used by every reader (``docs/howto/corrupt-data.md`` says what each
covers, and which reader reads what through which):

- :func:`check_size`: the size of the map's file now (one ``fstat``) compared with the
  size the map (and the validated index) has, before a record or a batch is read. A
  file that grew is not an error.
- :func:`read` and :func:`crc32c`: the copy and the CRC made by ``recordkit.native._ext``
  inside its SIGBUS guard, where a page that vanishes mid-read becomes
  :class:`~recordkit.errors.ShardChangedError`. Without the extension (no C compiler,
  or ``RECORDKIT_NO_NATIVE=1``) they are plain Python reads after a :func:`check_size`.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from ..errors import ShardChangedError
from ..native import ext
from .crc import crc32c as _package_crc32c

__all__ = [
    "GUARDED",
    "MapFault",
    "changed",
    "changed_in_batch",
    "check_size",
    "crc32c",
    "current_size",
    "gather_u64",
    "map_of",
    "read",
    "shrunk",
]


class _NeverRaised(BufferError):
    """Stands in for ``recordkit.native._ext.MapFault`` without the extension."""


_native = ext
GUARDED: bool = _native is not None
"""Whether reads of a map go through the native SIGBUS guard in this process."""

MapFault: type[BufferError] = _native.MapFault if _native is not None else _NeverRaised
"""What a guarded native call raises when a page vanishes: ``args == (message, at, offset)``."""


def map_of(buf: Any) -> mmap.mmap | None:
    """The memory map behind ``buf`` (an ``mmap``, or a ``memoryview`` of one), else None."""
    if isinstance(buf, mmap.mmap):
        return buf
    if isinstance(buf, memoryview) and isinstance(buf.obj, mmap.mmap):
        return buf.obj
    return None


def current_size(buf: Any) -> int | None:
    """The size now of the file mapped behind ``buf``; None when it is not a map (or closed)."""
    m = map_of(buf)
    if m is None:
        return None
    try:
        return m.size()
    except (OSError, ValueError):  # closed, or a map that keeps no descriptor
        return None


def shrunk(buf: Any) -> bool:
    """Whether the file behind a map (``buf``, or the map behind a view) is now shorter than it."""
    m = map_of(buf)
    if m is None:
        return False
    size = current_size(m)
    return size is not None and size < len(m)


def changed(
    buf: Any,
    *,
    path: str | None = None,
    offset: int | None = None,
    record: int | None = None,
    expected: int | None = None,
) -> ShardChangedError:
    """The error for a shard that changed under ``buf``, saying its size now and then."""
    m = map_of(buf)
    if expected is None:
        expected = len(m) if m is not None and not m.closed else None
    size = current_size(buf)
    if size is not None and size != expected:
        reason = f"shard is {size} bytes, its index says {expected}: it changed while being read"
    else:  # a page vanished, yet the file has its size again (rewritten in place)
        now = "" if size is None else f", and has {size} again"
        reason = (
            f"a page of the shard vanished while it was read (its index says {expected} "
            f"bytes{now}): it changed while being read"
        )
    return ShardChangedError(reason, path=path, offset=offset, record=record)


def check_size(
    buf: Any,
    expected: int | None = None,
    path: str | None = None,
    *,
    offset: int | None = None,
    record: int | None = None,
) -> None:
    """Raise :class:`~recordkit.errors.ShardChangedError` if the file behind a map shrank.

    Args:
        buf: an ``mmap`` or a ``memoryview`` of one (anything else is not checked:
            it cannot change under us).
        expected: the size the shard must have (default: the map's length, which
            is the size the index was validated against).
        path, offset, record: where, for the error.
    """
    m = map_of(buf)
    if m is None:
        return
    size = current_size(m)
    if expected is None:
        expected = len(m)
    if size is not None and size < expected:
        raise changed(m, path=path, offset=offset, record=record, expected=expected)


def read(
    buf: Any,
    start: int,
    length: int,
    *,
    path: str | None = None,
    offset: int | None = None,
    record: int | None = None,
    check: bool = True,
) -> bytes:
    """A private copy of ``buf[start:start + length]`` (a map's size checked first).

    ``check=False`` skips the size check, for a caller that has just made it.

    Raises:
        ShardChangedError: the file behind the map shrank (before or, with the
            native extension, during the copy).
    """
    if check:
        check_size(buf, None, path, offset=offset, record=record)
    if _native is None:
        return bytes(memoryview(buf)[start : start + length])
    try:
        data: bytes = _native.read(buf, start, length)
    except MapFault:
        raise changed(buf, path=path, offset=offset, record=record) from None
    return data


def gather_u64(buf: Any, offsets: Any, *, path: str | None = None) -> Any:
    """The little-endian u64 at each of ``offsets`` in a map, read under the guard.

    ``None`` when ``buf`` is not a map or the native extension is not in use (the
    caller reads them itself). Offsets must lie 8 bytes inside the map.

    Raises:
        ShardChangedError: as :func:`read`, naming the first field the cut took.
    """
    if _native is None or map_of(buf) is None:
        return None
    starts = np.ascontiguousarray(offsets, dtype=np.int64)
    out = np.empty(len(starts), dtype="<u8")
    try:
        _native.gather(buf, starts, np.full(len(starts), 8, np.int64), out, 8)
    except MapFault as exc:
        row = exc.args[1] if len(exc.args) > 1 and exc.args[1] >= 0 else None
        offset = None if row is None else int(starts[row])
        raise changed(buf, path=path, offset=offset, record=row) from None
    return out.astype(np.uint64, copy=False)


def crc32c(
    data: Any,
    value: int = 0,
    *,
    path: str | None = None,
    offset: int | None = None,
    record: int | None = None,
) -> int:
    """:func:`recordkit.format.crc32c`, guarded when ``data`` is (a view of) a map.

    Raises:
        ShardChangedError: as :func:`read`.
    """
    if _native is None or map_of(data) is None:
        return _package_crc32c(data, value)
    try:
        return int(_native.crc32c(data, value))
    except MapFault:
        raise changed(data, path=path, offset=offset, record=record) from None


def changed_in_batch(
    buf: Any,
    offsets: np.ndarray,
    sizes: np.ndarray,
    path: str | None,
    records: np.ndarray | None,
    exc: BaseException,
) -> ShardChangedError:
    """The error naming the record a change of the shard under ``buf`` hit.

    That is the record holding the faulting byte (a native ``MapFault``), or the
    one a ``ShardChangedError`` from a per-record read names; failing those, the
    first record the file's new size cuts off, or the batch's first record.
    """
    size = current_size(buf)
    ends = offsets + sizes
    if isinstance(exc, ShardChangedError):
        hits = np.flatnonzero(offsets == exc.offset)
    else:
        at = int(exc.args[2]) if len(exc.args) > 2 else -1
        hits = np.flatnonzero((offsets <= at) & (at < ends)) if at >= 0 else offsets[:0]
    if not len(hits) and size is not None:
        hits = np.flatnonzero(ends > size)
    pos = int(hits[0]) if len(hits) else 0
    record = None if records is None else int(records[pos])
    return changed(buf, path=path, offset=int(offsets[pos]), record=record)
