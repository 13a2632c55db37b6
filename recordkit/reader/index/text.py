"""Index texts and binary copies read through the native extension: whole, or a
block of lines at a time (:mod:`recordkit.reader.index.shard_index` holds the index).
Without the extension NumPy parses whole texts (:func:`recordkit.format.parse_index`),
with the same results (``tests/reader/index/test_shard_index.py`` compares them).

A lazily loaded index (``ShardIndex.from_text``) keeps a map of its text (no file
descriptor held: ``recordkit.native._ext.map_fd``) and where every block of
:data:`FILL_RECORDS` lines starts; a block is parsed and checked the first time one
of its records is located (``recordkit/native/index.c`` says what is checked).
Every read of a map runs in the SIGBUS guard: a file cut short under its map is an
:class:`~recordkit.errors.InvalidIndexError`, not a crash.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import InvalidIndexError, ShardNotFoundError
from ...format import guard, map_regular
from ...format.index import check_entries, end_error, entry_error, index_error, parse_index
from ...native import ext

__all__ = ["FILL_RECORDS", "FILL_SHIFT", "parse_bounds"]

_WHY = {1: "unexpected byte {byte!r}", 2: "expected 'offset size' per line", 3: "empty field"}
_WHY[4] = "number too large"


# (a build from before it had the index functions: NumPy parses the same)
native: Any = ext if hasattr(ext, "index_fill") else None


def parse_bounds(
    data: bytes, shard_size: int, *, where: str | None = None, records: int | None = None
) -> np.ndarray:
    """Parse index text and check it against a shard of ``shard_size`` bytes.

    Returns the ``n + 1`` record boundaries (``uint32`` below 4 GiB, else
    ``uint64``). Every check of :func:`recordkit.format.check_entries` is made;
    the length fields are not read (the shard is not needed). ``records``: the
    lines expected (the manifest's count), which spares counting them first.

    Raises:
        InvalidIndexError: a malformed line, or an entry that does not fit the
            shard (naming ``where``, the line and the offset).
    """
    dtype = np.uint32 if shard_size < 1 << 32 else np.uint64
    if native is None:
        entries = parse_index(data, path=where)
        check_entries(entries, shard_size, where=where)
        out = np.empty(len(entries) + 1, dtype=dtype)
        out[:-1] = entries[:, 0]
        out[-1] = shard_size
        return out
    if records is None or records < 0 or records > len(data) // 5:  # a line is >= 5 bytes
        records = _lines(data, where)
    out = np.empty(records + 1, dtype=dtype)
    status, line, a, b = native_call(native.index_parse, where, data, shard_size, out)
    if status == native.INDEX_COUNT:  # not the count expected: count, and parse again
        out = np.empty(_lines(data, where) + 1, dtype=dtype)
        status, line, a, b = native_call(native.index_parse, where, data, shard_size, out)
    if status != native.INDEX_OK:
        raise status_error(status, line, a, b, data, shard_size, where)
    return out


def native_call(fn: Any, where: str | None, *args: Any) -> Any:
    """``fn(*args)``, a native call reading a map: a map cut short is an index error."""
    try:
        return fn(*args)
    except guard.MapFault as exc:  # args: message, block being filled (-1), offset in the map
        block = exc.args[1] if len(exc.args) > 1 and exc.args[1] >= 0 else None
        at = exc.args[2] if len(exc.args) > 2 and exc.args[2] >= 0 else None
        raise InvalidIndexError(
            "index file was cut short while being read (it changed)",
            path=where,
            offset=at,
            record=None if block is None else block << FILL_SHIFT,
        ) from None


def status_error(
    status: int, line: int, a: int, b: int, data: Any, shard_size: int, where: str | None
) -> InvalidIndexError:
    """The error a native parse or fill reported (see ``recordkit/native/index.c``)."""
    if status == native.INDEX_MALFORMED:
        why = _WHY.get(b, "malformed").format(byte=bytes(memoryview(data)[a : a + 1]))
        return InvalidIndexError(f"malformed index line {line + 1}: {why}", path=where, record=line)
    if status == native.INDEX_ENTRY:
        return entry_error(a, b, line, shard_size, where)
    if status == native.INDEX_END:
        return end_error(a, line, shard_size, where)
    return InvalidIndexError(f"malformed index: {line} lines, {a} expected", path=where)


FILL_SHIFT = 5
FILL_RECORDS = 1 << FILL_SHIFT
"""A lazily loaded index fills in its boundaries this many records at a time."""


def block_count(records: int) -> int:
    return (records + FILL_RECORDS - 1) >> FILL_SHIFT


class Pending:
    """Where a lazily loaded index's boundaries come from: a map of its text and
    where each block of :data:`FILL_RECORDS` lines starts (``directory``)."""

    __slots__ = ("data", "directory")

    def __init__(self, data: Any, directory: np.ndarray) -> None:
        self.data, self.directory = data, directory

    def fill(
        self,
        records: int,
        size: int,
        out: np.ndarray,
        filled: np.ndarray,
        wanted: np.ndarray | None,
        where: str | None,
    ) -> tuple[int, int, int, int, int]:
        """The blocks of ``wanted`` records (``None``: all) not ``filled`` yet, parsed
        into ``out`` and marked (native; see ``native/index.c``)."""
        args = (self.data, self.directory, FILL_SHIFT, records, size, out, filled, wanted)
        result: tuple[int, int, int, int, int] = native_call(native.index_fill, where, *args)
        return result


def _lines(data: Any, where: str | None = None) -> int:
    """Lines in an index text (the last may lack its newline)."""
    if isinstance(data, bytes) or native is None:
        text = bytes(data)
        return text.count(b"\n") + (1 if text and not text.endswith(b"\n") else 0)
    directory = np.empty(len(data) // (1 << 30) + 2, np.uint64)
    return int(native_call(native.index_scan, where, data, 30, directory))


def map_text(index_file: str, max_bytes: int) -> tuple[Any, os.stat_result]:
    """A map of an index file (no descriptor held) and its ``fstat``, refused as
    :func:`read_index_text` refuses."""
    try:
        return map_regular(
            index_file, index_error, native.map_fd, max_bytes=max_bytes, what="index"
        )
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"index not found: {index_file}") from exc
