"""A shard's index as the readers hold it: compact, checked when loaded and per run.

The ``.idx`` sidecar stays the text of DALI and the ``tfrecord`` package
(:mod:`recordkit.format.index`). A reader that maps a shard loads its index into
a :class:`ShardIndex`: the ``n + 1`` record boundaries (record ``i`` spans
``[bounds[i], bounds[i + 1])``), ``uint32`` for a shard below 4 GiB and
``uint64`` above, so **4 bytes a record** (8 past 4 GiB) instead of the 16 of
two ``int64`` columns. Sizes are implied by the boundaries.

When it is checked (``docs/format.md`` says the same for users):

- **At load, the whole index, against the shard's size**: every line strictly
  ``"{offset} {size}"``; the first offset 0; each offset the previous one plus its
  size (contiguous, so increasing); every size >= 16; the last record ending at
  the file size; and, for a shard the manifest lists, as many records as it
  says (else every length field is checked before blaming the manifest). One
  pass in C (``recordkit/_index.c``, about 1 ns a byte of text), or NumPy
  without it. Then the length fields of 16 records spread over the shard
  (first and last included) are compared with their sizes: an index left from another shard
  of the same size fails here, before anything is read, and is rebuilt.
- **Per run of records, before any record of the run is located**: the u64
  length field of every record of the run equals its size minus 16 (read
  through the SIGBUS guard). A run is about 4 KiB of the shard (64 records of
  64 bytes, one record of 4 KiB or more; at most 256 records), so its fields
  lie on the pages that reading one of its records touches anyway. A run that fails raises
  :class:`~recordkit.errors.InvalidIndexError` naming the index file, record
  and offset; no record of that run has been returned. Runs are checked once
  per load. So the first batch of a shuffle pays for the runs it touches, not
  for every record of every shard it touches (and a shard on a cold disk is not
  read whole to check its index). The native task runner takes :meth:`ShardIndex.lookup`
  instead: it compares every record's length field (and its CRC) with the index's size
  as it frames the record, before any value of the task is returned, and a task with
  a mismatch goes to the reference path, whose :meth:`ShardIndex.locate` checks the
  runs and raises the error above.

A missing or failing index is rebuilt as :func:`recordkit.format.ensure_index`
always did (per-user cache, else a CRC-checked scan, which checks every length
field: nothing is left to check per run).
"""

from __future__ import annotations

import importlib
import logging
import mmap
import os
from typing import Any

import numpy as np

from ..errors import InvalidIndexError, ShardNotFoundError
from . import guard
from .framing import DEFAULT_MAX_RECORD_BYTES, OVERHEAD
from .index import (
    _scan,
    check_entries,
    check_lengths,
    end_error,
    entry_error,
    index_path,
    max_index_bytes,
    open_map,
    parse_index,
    read_index_text,
    write_index,
)

__all__ = [
    "BINARY_MIN_TEXT",
    "RUN_BYTES",
    "RUN_RECORDS",
    "SPOT_CHECKS",
    "ShardIndex",
    "load_index_file",
    "open_index",
    "parse_bounds",
]

log = logging.getLogger(__name__)

RUN_BYTES = 4096
"""A run is the records of about this many shard bytes (a page), at most :data:`RUN_RECORDS`."""
RUN_RECORDS = 256
"""The most records whose length fields are checked together (a power of two)."""
SPOT_CHECKS = 16
"""Length fields checked when an index is loaded (spread over the shard)."""
_ONE_RUN_COPY = 64 << 10  # a single run is checked from one copy of up to this many bytes
BINARY_MIN_TEXT = 128 << 10
"""Index texts this long or longer get a binary copy in the per-user cache (shorter
ones parse in less time than the copy takes to find and read: ~0.1 ms)."""

_WHY = {1: "unexpected byte {byte!r}", 2: "expected 'offset size' per line", 3: "empty field"}
_WHY[4] = "number too large"


def _native() -> Any:
    if os.environ.get("RECORDKIT_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module("recordkit._index")
    except ImportError:  # built without a C compiler: NumPy parses the same
        return None


_c: Any = _native()


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
    if _c is None:
        entries = parse_index(data, path=where)
        check_entries(entries, shard_size, where=where)
        out = np.empty(len(entries) + 1, dtype=dtype)
        out[:-1] = entries[:, 0]
        out[-1] = shard_size
        return out
    if records is None or records < 0 or records > len(data) // 5:  # a line is >= 5 bytes
        records = _lines(data)
    out = np.empty(records + 1, dtype=dtype)
    status, line, a, b = _c.parse(data, shard_size, out)
    if status == _c.COUNT:  # not the count expected: count, and parse again
        out = np.empty(_lines(data) + 1, dtype=dtype)
        status, line, a, b = _c.parse(data, shard_size, out)
    if status == _c.OK:
        return out
    if status == _c.MALFORMED:
        why = _WHY.get(b, "malformed").format(byte=data[a : a + 1])
        raise InvalidIndexError(f"malformed index line {line + 1}: {why}", path=where, record=line)
    if status == _c.ENTRY:
        raise entry_error(a, b, line, shard_size, where)
    if status == _c.END:
        raise end_error(a, line, shard_size, where)
    raise InvalidIndexError(f"malformed index: {line} lines, {a} expected", path=where)


def _lines(data: bytes) -> int:
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


class ShardIndex:
    """The index of one shard, compact, its length fields checked per run.

    Args:
        bounds: the ``n + 1`` record boundaries, checked against the shard's size
            (:func:`parse_bounds`).
        source: the index file it came from, for errors (``None``: built by a scan).
        checked: whether every length field is known to match already.

    Attributes:
        bounds: as given (read-only).
        source: as given.
    """

    __slots__ = ("_all_checked", "_checked", "_shift", "bounds", "source")

    def __init__(
        self, bounds: np.ndarray, *, source: str | None = None, checked: bool = False
    ) -> None:
        if len(bounds) < 1:
            raise ValueError("an index has at least one boundary (the shard's size)")
        bounds.flags.writeable = False
        self.bounds = bounds
        self.source = source
        n = len(bounds) - 1
        self._shift = run_shift(int(bounds[-1]), n)
        self._checked = np.full((n + (1 << self._shift) - 1) >> self._shift, checked, dtype=bool)
        self._all_checked = checked or not n  # then no record needs a look at the array

    @classmethod
    def from_entries(
        cls, entries: np.ndarray, size: int, *, source: str | None = None, checked: bool = True
    ) -> ShardIndex:
        """From ``(n, 2)`` ``(offset, framed size)`` entries already checked against
        the shard of ``size`` bytes (a scan's, or :func:`ensure_index`'s)."""
        bounds = np.empty(len(entries) + 1, dtype=np.uint32 if size < 1 << 32 else np.uint64)
        bounds[:-1] = entries[:, 0]
        bounds[-1] = size
        return cls(bounds, source=source, checked=checked)

    @property
    def records(self) -> int:
        return len(self.bounds) - 1

    @property
    def nbytes(self) -> int:
        """The shard's size, as the index says (the last boundary)."""
        return int(self.bounds[-1])

    @property
    def memory(self) -> int:
        """Bytes this index holds in memory (its boundaries and run marks)."""
        return int(self.bounds.nbytes + self._checked.nbytes)

    @property
    def run_records(self) -> int:
        """Records per run: their length fields are checked together, once."""
        return 1 << self._shift

    @property
    def unchecked_runs(self) -> int:
        """Runs (of :attr:`run_records` records) whose length fields are not checked yet."""
        return int(len(self._checked) - np.count_nonzero(self._checked))

    def entries(self) -> np.ndarray:
        """The ``(n, 2)`` int64 ``(offset, framed size)`` form (16 bytes a record)."""
        b = self.bounds.astype(np.int64)
        return np.stack([b[:-1], np.diff(b)], axis=1)

    def locate(
        self, records: np.ndarray, buf: Any, *, path: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The int64 offsets and framed sizes of ``records`` (record numbers in the shard).

        The runs they fall in are checked first (:meth:`check`).
        """
        recs = np.asarray(records, dtype=np.int64)
        if not self._all_checked:
            runs = recs >> self._shift
            todo = ~self._checked[runs]
            if todo.any():
                self._check_runs(np.unique(runs[todo]), buf, path, recs)
        start = self.bounds[recs]
        return start.astype(np.int64), np.subtract(self.bounds[recs + 1], start, dtype=np.int64)

    def lookup(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The int64 offsets and framed sizes of ``records``, their length fields unread.

        For a reader that compares each record's length field with its size as it
        frames the record, before returning it (the native task runner: a mismatch
        refuses the task, and the reader then takes :meth:`locate`, which raises
        ``InvalidIndexError`` naming the record). Each entry is still checked to
        lie inside the shard with a size of at least 16 (boundaries from a binary
        copy included); ``None`` when one does not (the caller takes
        :meth:`locate`, which says which).
        """
        recs = np.asarray(records, dtype=np.int64)
        start = self.bounds[recs].astype(np.int64)
        sizes = self.bounds[recs + 1].astype(np.int64) - start
        if len(recs) and (int(sizes.min()) < OVERHEAD or int((start + sizes).max()) > self.nbytes):
            return None
        return start, sizes

    def entry(self, record: int, buf: Any, *, path: str | None = None) -> tuple[int, int]:
        """One record's ``(offset, framed size)``, its run checked first."""
        if record < 0:
            record += self.records
        if not 0 <= record < self.records:
            raise IndexError(f"record {record} of a shard of {self.records}")
        run = record >> self._shift
        if not self._all_checked and not self._checked[run]:
            self._check_runs(np.array([run]), buf, path, np.array([record]))
        start = int(self.bounds[record])
        return start, int(self.bounds[record + 1]) - start

    def check(self, records: np.ndarray, buf: Any, *, path: str | None = None) -> None:
        """Check the length fields of the runs ``records`` fall in (once per run).

        Raises:
            InvalidIndexError: a length field disagrees with the index (stale index).
            ShardChangedError: the shard shrank under its map.
        """
        if self._all_checked:
            return
        runs = np.asarray(records, dtype=np.int64) >> self._shift
        todo = runs[~self._checked[runs]]
        if len(todo):
            self._check_runs(np.unique(todo), buf, path, records)

    def check_all(self, buf: Any, *, path: str | None = None) -> None:
        """Check every length field not checked yet."""
        todo = np.flatnonzero(~self._checked)
        if len(todo):
            self._check_runs(todo, buf, path)

    def spot_check(self, buf: Any, *, path: str | None = None) -> None:
        """Check :data:`SPOT_CHECKS` length fields spread over the shard (first and last too)."""
        n = self.records
        if not n:
            return
        if n <= SPOT_CHECKS:
            recs = np.arange(n, dtype=np.int64)
        else:  # distinct: (n - 1) / (SPOT_CHECKS - 1) > 1
            recs = np.arange(SPOT_CHECKS, dtype=np.int64) * (n - 1) // (SPOT_CHECKS - 1)
        self._check_entries(recs, buf, path)

    def _check_entries(self, recs: np.ndarray | None, buf: Any, path: str | None) -> None:
        """Check records ``recs`` (``None``: all): sizes >= 16, inside the shard (so
        boundaries that came from a binary copy are as checked as parsed ones), then
        their length fields."""
        if recs is None:
            b = self.bounds.astype(np.int64)
            start, sizes = b[:-1], np.diff(b)
        else:
            start = self.bounds[recs].astype(np.int64)
            sizes = self.bounds[recs + 1].astype(np.int64) - start
        bad = (sizes < OVERHEAD) | (start + sizes > self.nbytes)
        if bad.any():
            i = int(np.argmax(bad))
            rec = i if recs is None else int(recs[i])
            raise entry_error(int(start[i]), int(sizes[i]), rec, self.nbytes, self.source)
        check_lengths(start, sizes, buf, path=path, where=self.source, records=recs)

    def _check_runs(self, runs: np.ndarray, buf: Any, path: str | None, wanted: Any = None) -> None:
        if wanted is not None and guard.shrunk(buf):  # name a record asked for, if cut
            asked = np.asarray(wanted, dtype=np.int64)
            cut = self.bounds[asked + 1] > (guard.current_size(buf) or 0)
            if cut.any():
                i = int(asked[np.argmax(cut)])
                raise guard.changed(buf, path=path, offset=int(self.bounds[i]), record=i)
        if not (len(runs) == 1 and self._check_one_run(int(runs[0]), buf, path)):
            self._check_many_runs(runs, buf, path)
        # Only now: a thread that sees the mark may return these records. Racing
        # threads may check a run twice; the marks only ever go from False to True.
        self._checked[runs] = True
        if self._checked.all():
            self._all_checked = True

    def _check_one_run(self, run: int, buf: Any, path: str | None) -> bool:
        """One run, the cheap way (a random read: ~10 µs, not ~50 with array gathers):
        its bytes up to its last header in one guarded copy. ``False`` when those are
        too many to copy (a run with a huge record): the caller gathers instead."""
        first = run << self._shift
        b = self.bounds[first : min(first + (1 << self._shift), self.records) + 1].astype(np.int64)
        start, sizes = b[:-1], np.diff(b)
        bad = (sizes < OVERHEAD) | (b[1:] > self.nbytes)
        if bad.any():
            i = int(np.argmax(bad))
            raise entry_error(int(start[i]), int(sizes[i]), first + i, self.nbytes, self.source)
        lo, hi = int(start[0]), int(start[-1]) + 8  # through the last length field
        if hi - lo > _ONE_RUN_COPY or guard.shrunk(buf):
            return False  # (a shrunk map: the gather names the first record the cut took)
        span = guard.read(buf, lo, hi - lo, path=path, offset=lo, record=first, check=False)
        fields = np.frombuffer(span, np.uint8)[(start - lo)[:, None] + np.arange(8)]
        lengths = np.ascontiguousarray(fields).view("<u8").ravel()
        mismatch = lengths != (sizes - OVERHEAD).astype(np.uint64)
        if mismatch.any():
            i = int(np.argmax(mismatch))
            check_lengths(
                start[i : i + 1],
                sizes[i : i + 1],
                buf,
                path=path,
                where=self.source,
                records=np.array([first + i]),
            )
        return True

    def _check_many_runs(self, runs: np.ndarray, buf: Any, path: str | None) -> None:
        recs: np.ndarray | None = None  # all of them (check_all): no gathering of rows
        if len(runs) != len(self._checked):
            first = runs << self._shift
            count = np.minimum(first + (1 << self._shift), self.records) - first
            recs = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        self._check_entries(recs, buf, path)


def run_shift(nbytes: int, records: int) -> int:
    """log2 of the records per run of a shard: about :data:`RUN_BYTES` of it, 1 to 256.

    A run is checked the first time one of its records is read, so its length
    fields lie on the pages that read touches anyway: 64 records of 64 bytes,
    4 of 1 KiB, one record of 4 KiB or more.
    """
    if records <= 0 or nbytes <= 0:
        return 0
    per_run = RUN_BYTES * records // nbytes  # records in RUN_BYTES, at the mean size
    return min(max(per_run, 1).bit_length() - 1, RUN_RECORDS.bit_length() - 1)


def _text_bytes(index_file: str) -> int:
    try:
        return os.stat(index_file).st_size
    except OSError:
        return 0  # read_index_text says why


def _verify(index: ShardIndex, buf: Any, path: str, full: bool, records: int | None) -> None:
    """The checks of a loaded index that read the shard (see the module docstring)."""
    if full or (records is not None and index.records != records):
        # A count that disagrees with the manifest: the index is checked whole, so a
        # stale index is rebuilt rather than the manifest blamed.
        index.check_all(buf, path=path)
    else:
        index.spot_check(buf, path=path)


def load_index_file(
    index_file: str,
    buf: Any,
    *,
    path: str,
    full: bool = False,
    records: int | None = None,
    cache: bool = True,
) -> ShardIndex:
    """An index file (a sidecar or a cache entry) for the shard mapped as ``buf``.

    With ``cache``, the boundaries parsed from it before (by any process) come
    from the per-user cache's binary copy instead of a parse
    (:func:`recordkit.format.index_cache.cached_bounds`), and a parse leaves one.

    Raises:
        ShardNotFoundError: there is no such file.
        InvalidIndexError: it is not a regular file, too large, malformed, or does
            not match the shard (as far as it was checked: see the module docstring).
    """
    from . import index_cache  # it stores what this module parses

    size = len(buf)
    binary = cache and _text_bytes(index_file) >= BINARY_MIN_TEXT
    bounds = index_cache.cached_bounds(path, index_file, size) if binary else None
    parsed = bounds is None
    if bounds is None:
        data = read_index_text(index_file, max_bytes=max_index_bytes(size))
        bounds = parse_bounds(data, size, where=index_file, records=records)
        del data  # up to ~20 bytes a record: not kept past the parse
    index = ShardIndex(bounds, source=index_file)
    try:
        _verify(index, buf, path, full, records)
    except InvalidIndexError:
        if not parsed:  # the text it came from is as stale: both are rebuilt
            index_cache.drop_bounds(path, index_file)
        raise
    if parsed and binary:  # for the next process: written while this one reads on
        index_cache.store_bounds_soon(path, index_file, index.bounds)
    return index


def open_index(
    shard_path: str | os.PathLike[str],
    *,
    buf: bytes | mmap.mmap | None = None,
    write: bool = True,
    verify: bool = True,
    cache: bool = True,
    full: bool = False,
    records: int | None = None,
) -> ShardIndex:
    """The index of ``shard_path`` as a reader holds it, rebuilt when missing or stale.

    As :func:`recordkit.format.ensure_index` (the sidecar, else the per-user
    cache, else a CRC-checked scan; written back beside the shard with
    ``write``), but compact and checked as the module docstring says.

    Args:
        shard_path: the shard file.
        buf: the shard already mapped (the map the records will be read from).
        write, verify, cache: as for :func:`recordkit.format.ensure_index`.
        full: check every length field now (what ``ensure_index`` does).
        records: the record count the shard should have (the manifest's).
    """
    from . import index_cache  # the cache reads and writes indexes with this module

    path = os.fspath(shard_path)
    own = buf is None
    if buf is None:
        buf = open_map(path)
    try:
        idx = index_path(path)
        regular = True
        if os.path.lexists(idx):
            try:
                return load_index_file(idx, buf, path=path, full=full, records=records, cache=cache)
            except (InvalidIndexError, ShardNotFoundError) as exc:
                log.warning("rebuilding index: %s", exc)
                # Never replace a FIFO or a device someone put there; use the index in memory.
                regular = not os.path.exists(idx) or os.path.isfile(idx)
        # An index written beside the shard is checked whole first: it will be trusted
        # as a sidecar, and by other readers (DALI, tfrecord) that check nothing.
        found = (
            index_cache.cached_shard_index(path, buf, full=full or write, records=records)
            if cache
            else None
        )
        if found is not None and not write:
            return found
        if found is not None:
            entries = found.entries()
        else:
            entries = _scan(buf, path, verify, DEFAULT_MAX_RECORD_BYTES)
        index = found or ShardIndex.from_entries(entries, len(buf))
        if write and not regular:
            log.info("not writing index %s over something that is not a file", idx)
        elif write:
            try:
                write_index(idx, entries)
                return index
            except OSError as exc:
                log.info("could not write index %s (%s); using the per-user cache", idx, exc)
        if cache and found is None:
            index_cache.store_index(path, entries)
        return index
    finally:
        if own and isinstance(buf, mmap.mmap):
            buf.close()
