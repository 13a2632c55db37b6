"""A shard's index as the readers hold it: compact, checked when loaded and per run.

The ``.idx`` sidecar stays DALI's text (:mod:`recordkit.format.index`). A reader loads
it into a :class:`ShardIndex`: the ``n + 1`` record boundaries (record ``i`` spans
``[bounds[i], bounds[i + 1])``), ``uint32`` below 4 GiB: **4 bytes a record**.

When it is checked is the "Index sidecar" section of ``docs/format.md``: at load
against the shard's size (a text under :data:`LAZY_MIN_TEXT` parsed whole, a longer one
a block of lines at a time as its records are first located; then
:data:`SPOT_CHECKS` spread length fields), and per run of records (:func:`run_shift`),
before any record of the run is located: every length field of the run, once per load,
failing with :class:`~recordkit.errors.InvalidIndexError` naming the index file, record
and offset. The native task runner takes :meth:`ShardIndex.lookup` instead (it checks
each length field as it frames the record; a mismatch sends the task to the reference
path, whose :meth:`ShardIndex.locate` checks the runs and raises). A missing or failing
index is rebuilt (:mod:`recordkit.reader.index.open`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ...errors import InvalidIndexError
from ...format import OVERHEAD, guard
from ...format.index import check_lengths, entry_error, max_index_bytes, read_index_text
from . import store
from .text import (
    FILL_RECORDS,
    FILL_SHIFT,
    Pending,
    block_count,
    native_call,
    parse_bounds,
    status_error,
)
from .text import native as _c

__all__ = [
    "BINARY_MIN_TEXT",
    "LAZY_MIN_TEXT",
    "RUN_BYTES",
    "RUN_RECORDS",
    "SPOT_CHECKS",
    "ShardIndex",
    "parse_bounds",  # open.py calls it from here (tests replace it)
]

log = logging.getLogger(__name__)
_READ_TEXT = threading.Lock()  # one thread replaces a failed copy's boundaries

RUN_BYTES = 4096
"""A run is the records of about this many shard bytes (a page), at most :data:`RUN_RECORDS`."""
RUN_RECORDS = 256
"""The most records whose length fields are checked together (a power of two)."""
SPOT_CHECKS = 16
"""Length fields checked when an index is loaded (spread over the shard)."""
_ONE_RUN_COPY = 64 << 10  # a single run is checked from one copy of up to this many bytes
LAZY_MIN_TEXT = 64 << 10
"""Index texts this long or longer are parsed a block of lines at a time, as their
records are first located (shorter ones are parsed whole at load: ~30 µs)."""
BINARY_MIN_TEXT = 128 << 10
"""Index texts this long or longer get a binary copy in the per-user cache (shorter
ones parse in less time than the copy takes to find and read: ~0.1 ms)."""


class ShardIndex:
    """The index of one shard, compact, its length fields checked per run.

    Args:
        bounds: the ``n + 1`` record boundaries, checked against the shard's size
            (:func:`parse_bounds`).
        source: the index file it came from, for errors (``None``: built by a scan).
        checked: whether every length field is known to match already.
        copy_of: the shard whose binary copy in the per-user cache ``bounds`` came
            from: a check that fails drops the copy and reads ``source`` instead,
            rather than blaming it (:meth:`_read_text_instead`).

    Attributes:
        bounds: as given (read-only).
        source: as given.
    """

    __slots__ = (
        "_all_checked",
        "_bounds",
        "_checked",
        "_copy",
        "_filled",
        "_pending",
        "_shift",
        "_size",
        "_unfilled",
        "source",
    )

    def __init__(
        self,
        bounds: np.ndarray,
        *,
        source: str | None = None,
        checked: bool = False,
        pending: Pending | None = None,
        size: int | None = None,
        copy_of: str | None = None,
    ) -> None:
        if len(bounds) < 1:
            raise ValueError("an index has at least one boundary (the shard's size)")
        if pending is None:
            bounds.flags.writeable = False
        self._bounds = bounds
        self.source = source
        n = len(bounds) - 1
        self._size = int(bounds[-1]) if size is None else size
        self._shift = run_shift(self._size, n)
        self._checked = np.full((n + (1 << self._shift) - 1) >> self._shift, checked, dtype=bool)
        self._all_checked = checked or not n  # then no record needs a look at the array
        #: blocks of FILL_RECORDS boundaries filled in from ``pending`` (None: all are)
        self._pending = pending
        self._filled = None if pending is None else np.zeros(block_count(n), dtype=np.uint8)
        self._unfilled = 0 if pending is None else block_count(n)
        #: the shard whose binary copy the boundaries came from (None: parsed or scanned)
        self._copy = copy_of

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

    @classmethod
    def from_text(
        cls, text: Any, size: int, *, source: str, records: int | None = None
    ) -> ShardIndex | None:
        """An index parsed from ``text`` (a map of an index file) a block of
        :data:`FILL_RECORDS` lines at a time, when its records are first located.

        At load the lines are counted and the first and last blocks parsed (the
        first offset is 0, the last record ends at the shard's ``size``).
        ``None`` when the lines are not ``records`` (or none): the caller parses
        the text whole, which says what is wrong.
        """
        directory = np.empty(((len(text) + 1) // 5 >> FILL_SHIFT) + 2, dtype=np.uint64)
        lines = native_call(_c.index_scan, source, text, FILL_SHIFT, directory)
        if lines < 1 or (records is not None and lines != records):
            return None
        bounds = np.empty(lines + 1, dtype=np.uint32 if size < 1 << 32 else np.uint64)
        pending = Pending(text, directory[: block_count(lines)].copy())
        index = cls(bounds, source=source, pending=pending, size=size)
        index._fill(np.array([0, lines - 1], dtype=np.int64))
        return index

    @property
    def bounds(self) -> np.ndarray:
        """The ``n + 1`` record boundaries (read-only; all of them filled in first).

        Raises:
            InvalidIndexError: a line not parsed before is malformed or does not fit.
        """
        self._fill(None)
        return self._bounds

    @property
    def records(self) -> int:
        return len(self._bounds) - 1

    @property
    def nbytes(self) -> int:
        """The shard's size, as the index says (the last boundary)."""
        return self._size

    @property
    def memory(self) -> int:
        """Bytes this index holds in memory (its boundaries and marks; a map of the
        text it fills from, or of a binary copy, is the page cache's)."""
        extra = 0
        pending, filled = self._pending, self._filled
        if pending is not None and filled is not None:
            extra = filled.nbytes + pending.directory.nbytes
        return int(self._bounds.nbytes + self._checked.nbytes + extra)

    @property
    def complete(self) -> bool:
        """Whether every boundary is filled in (nothing left to parse or copy)."""
        return self._pending is None

    def _need(self, records: np.ndarray) -> None:
        """Fill in the boundaries of ``records`` (and of the record after each)."""
        if self._pending is not None:
            self._fill(np.ascontiguousarray(records, dtype=np.int64))

    def _need_span(self, first: int, stop: int) -> None:
        """Fill in the boundaries of records ``first`` to ``stop - 1`` (and of ``stop``)."""
        if self._pending is not None and stop > first:  # a record in each block
            self._fill(np.arange(first & -FILL_RECORDS, stop, FILL_RECORDS, dtype=np.int64))

    def _fill(self, wanted: np.ndarray | None) -> None:
        pending, filled = self._pending, self._filled
        if pending is None or filled is None:
            return
        status, line, a, b, newly = pending.fill(
            self.records, self._size, self._bounds, filled, wanted, self.source
        )
        if status != _c.INDEX_OK:
            raise status_error(status, line, a, b, pending.data, self._size, self.source)
        self._unfilled -= newly  # racing threads may both count a block: then all() says
        if wanted is None or (self._unfilled <= 0 and filled.all()):
            self._pending = None  # all filled in: the map goes with its last user

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
        self._need(recs)
        self.check(recs, buf, path=path)
        start = self._bounds[recs]
        return start.astype(np.int64), np.subtract(self._bounds[recs + 1], start, dtype=np.int64)

    def lookup(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The int64 offsets and framed sizes of ``records``, their length fields unread.

        For the native task runner, which checks each record's length field as it
        frames the record (see the module docs). Each entry is still checked to
        lie inside the shard with a size of at least 16 (boundaries from a binary
        copy included); ``None`` when one does not (the caller takes
        :meth:`locate`, which says which).
        """
        recs = np.asarray(records, dtype=np.int64)
        self._need(recs)
        start = self._bounds[recs].astype(np.int64)
        sizes = self._bounds[recs + 1].astype(np.int64) - start
        if len(recs) and (int(sizes.min()) < OVERHEAD or int((start + sizes).max()) > self.nbytes):
            return None
        return start, sizes

    def entry(self, record: int, buf: Any, *, path: str | None = None) -> tuple[int, int]:
        """One record's ``(offset, framed size)``, its run checked first."""
        if record < 0:
            record += self.records
        if not 0 <= record < self.records:
            raise IndexError(f"record {record} of a shard of {self.records}")
        self._need_span(record, record + 1)
        run = record >> self._shift
        if not self._all_checked and not self._checked[run]:
            self._retrying(self._check_runs, np.array([run]), buf, path, np.array([record]))
        start = int(self._bounds[record])
        return start, int(self._bounds[record + 1]) - start

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
            self._retrying(self._check_runs, np.unique(todo), buf, path, records)

    def check_all(self, buf: Any, *, path: str | None = None) -> None:
        """Check every length field not checked yet."""
        todo = np.flatnonzero(~self._checked)
        if len(todo):
            self._retrying(self._check_runs, todo, buf, path)

    def spot_check(self, buf: Any, *, path: str | None = None) -> None:
        """Check :data:`SPOT_CHECKS` length fields spread over the shard (first and last too)."""
        n = self.records
        if not n:
            return
        if n <= SPOT_CHECKS:
            recs = np.arange(n, dtype=np.int64)
        else:  # distinct: (n - 1) / (SPOT_CHECKS - 1) > 1
            recs = np.arange(SPOT_CHECKS, dtype=np.int64) * (n - 1) // (SPOT_CHECKS - 1)
        self._retrying(self._check_entries_once, recs, buf, path)

    def _retrying(self, check: Any, *args: Any) -> None:
        """``check(*args)``, again on the text's boundaries if a binary copy's failed."""
        bounds = self._bounds
        try:
            check(*args)
        except InvalidIndexError:
            if not self._read_text_instead(bounds):
                raise
            check(*args)

    def _read_text_instead(self, failed: np.ndarray) -> bool:
        """Boundaries from a binary copy failed a check (``failed``, the array they
        were checked in): drop the copy, parse the text it was made from and go on
        with that (every run to be checked again). ``False`` when they did not come
        from a copy (the text is at fault: the caller raises)."""
        with _READ_TEXT:
            if self._bounds is not failed:
                return True  # another thread has done it
            shard = self._copy
            if shard is None or self.source is None:
                return False
            store.drop_bounds(shard)
            data = read_index_text(self.source, max_bytes=max_index_bytes(self._size))
            bounds = parse_bounds(data, self._size, where=self.source, records=self.records)
            bounds.flags.writeable = False
            log.warning(
                "the binary copy of the index of %s did not fit the shard: dropped, %s read",
                shard,
                self.source,
            )
            self._checked = np.zeros_like(self._checked)
            self._all_checked = not self.records
            self._copy = None
            self._bounds = bounds
            return True

    def _check_entries_once(self, recs: np.ndarray | None, buf: Any, path: str | None) -> None:
        """Check records ``recs`` (``None``: all): sizes >= 16, inside the shard (so
        boundaries that came from a binary copy are as checked as parsed ones), then
        their length fields."""
        if recs is None:
            b = self.bounds.astype(np.int64)
            start, sizes = b[:-1], np.diff(b)
        else:
            self._need(recs)
            start = self._bounds[recs].astype(np.int64)
            sizes = self._bounds[recs + 1].astype(np.int64) - start
        bad = (sizes < OVERHEAD) | (start + sizes > self.nbytes)
        if bad.any():
            i = int(np.argmax(bad))
            rec = i if recs is None else int(recs[i])
            raise entry_error(int(start[i]), int(sizes[i]), rec, self.nbytes, self.source)
        check_lengths(start, sizes, buf, path=path, where=self.source, records=recs)

    def _check_runs(self, runs: np.ndarray, buf: Any, path: str | None, wanted: Any = None) -> None:
        if wanted is not None and guard.shrunk(buf):  # name a record asked for, if cut
            asked = np.asarray(wanted, dtype=np.int64)
            self._need(asked)
            cut = self._bounds[asked + 1] > (guard.current_size(buf) or 0)
            if cut.any():
                i = int(asked[np.argmax(cut)])
                raise guard.changed(buf, path=path, offset=int(self._bounds[i]), record=i)
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
        stop = min(first + (1 << self._shift), self.records)
        self._need_span(first, stop)
        b = self._bounds[first : stop + 1].astype(np.int64)
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
        self._check_entries_once(recs, buf, path)  # _retrying reads the text on failure


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
