"""The records of one ``recordkit.tf`` task, read from the epoch plan (no TensorFlow here).

A *task* is a run of consecutive units (batches, or single records) of one
input pipeline's share of an epoch: :class:`PlanTasks` computes its records
from :class:`~recordkit.reader.plan.EpochPlan` (a pure function of the seed,
the epoch, the pipeline id and count, and the task number), verifies their
framing and CRCs and copies their payloads into one flat buffer, so that
TensorFlow crosses into Python once per task of thousands of records, not once
per record. ``recordkit.tf`` splits the buffer with ``tf.strings.substr``.

The copy is one native ``gather`` per shard the task touches (GIL released,
under the SIGBUS guard), one shard held at a time, so a task stays within the
shard set's map budget however many shards it touches. Before it, one native
``parse_batch`` checks every record's framing, CRCs and Example structure, and
the values of the features TensorFlow will parse (``keys``): TensorFlow's parser
skips a field that a message does not define, so such a record is refused here,
by name (an :class:`~recordkit.errors.UnknownFieldError` naming file, offset
and record), as every recordkit reader refuses it. Records go out in rows
of ``row`` bytes, a record taking ``ceil(length / row)`` consecutive rows;
``row`` is the dataset's mean payload (at least 64 bytes): records of one size
take one row each, and whatever the spread of sizes the padding is under one
row per record. Each reading thread keeps its buffer for its next task; at a pass's
end :meth:`PlanTasks.release` lets them all go.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..codec import decode_example
from ..errors import CorruptRecordError
from ..format import guard
from ..format.framing import DEFAULT_MAX_RECORD_BYTES, HEADER_SIZE, OVERHEAD
from ..native import ext
from ..reader.plan import EpochPlan, PlanOptions, Split
from ..reader.shards import ShardSet

__all__ = ["PlanTasks", "groups"]

# None without a C compiler or with RECORDKIT_NO_NATIVE=1: per-record reads
_native = ext

# A task holds about this many records or bytes, in whole units.
_TASK_RECORDS = 4096
_TASK_BYTES = 4 << 20
_PLANS_KEPT = 4
# Rows are at least this long: a dataset of tiny records with a few big ones
# would otherwise cut the big ones into very many rows.
_MIN_ROW = 64  # epochs whose plans are kept (parallel calls overlap epoch ends)


class PlanTasks:
    """One input pipeline's tasks of every epoch.

    Args:
        shards: the shard set (maps opened on demand within its budget).
        options: the plan's options (shuffle, seed, batch size, drop_last).
        pipeline: this pipeline's id (the plan's rank).
        pipelines: the number of input pipelines (the plan's world size).
        keys: the features TensorFlow parses from the records (their values are
            checked too; the structure of every feature always is).
        feed: told when a task starts and ends (``begin(epoch, task)``,
            ``done(epoch, task)``): whole epochs through a shard cache fetch the
            shards ahead and let each go once the tasks before it are done.
        task_bytes: a task holds at most about this many bytes of records
            (default 4 MiB); through a shard cache, a fraction of what it holds,
            so that a task's shards fit beside the next ones'.
    """

    def __init__(
        self,
        shards: ShardSet,
        options: PlanOptions,
        pipeline: int,
        pipelines: int,
        keys: Iterable[str] = (),
        feed: Any = None,
        task_bytes: int = _TASK_BYTES,
    ) -> None:
        self.shards = shards
        self.feed = feed
        self.keys = frozenset(keys)
        # surrogatepass: a name no record can hold (a lone surrogate) still gets a key
        self._keys = tuple(sorted(k.encode("utf-8", "surrogatepass") for k in self.keys))
        self.options = options
        self.split = Split(rank=pipeline, world_size=pipelines)
        self._lock = threading.Lock()
        self._plans: OrderedDict[int, EpochPlan] = OrderedDict()
        # Each calling thread's output buffer, by thread id (release() lets them all go).
        self._buffers: dict[int, np.ndarray] = {}
        self._buffers_lock = threading.Lock()
        first = self.plan(0)
        #: units (batches, or records without a batch size) this pipeline reads per epoch
        self.units = first.unit_count(pipeline, pipelines)
        unit = options.batch_size or 1
        per_task = min(_TASK_RECORDS, max(1, int(task_bytes / max(shards.avg_record_bytes, 1))))
        self.task_units = max(1, per_task // unit)
        #: tasks per epoch (the same every epoch: the shard set is fixed)
        self.tasks = -(-self.units // self.task_units)
        #: bytes per row of a task's buffer (see the module docs)
        self.row = max(_MIN_ROW, round(shards.avg_record_bytes) - OVERHEAD)

    def plan(self, epoch: int) -> EpochPlan:
        """The epoch's plan (the last few are kept)."""
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is None:
                plan = EpochPlan(
                    self.shards.counts,
                    self.options,
                    epoch,
                    avg_record_bytes=self.shards.avg_record_bytes,
                    shard_bytes=self.shards.nbytes,
                )
                self._plans[epoch] = plan
                while len(self._plans) > _PLANS_KEPT:
                    self._plans.popitem(last=False)
            return plan

    def records(self, epoch: int, task: int) -> tuple[np.ndarray, np.ndarray]:
        """``(shard ids, record numbers)`` of a task, in stream order."""
        plan = self.plan(int(epoch))
        first = int(task) * self.task_units
        units = range(first, min(self.units, first + self.task_units))
        positions, _ = plan.unit_positions(self.split, units)
        return plan.resolve(positions)

    def announce(self, epoch: Any, task: Any) -> Any:
        """Task ``task`` of ``epoch`` comes next in the stream: returns ``task``.

        Called in stream order (a sequential stage before the parallel reads), so
        that a feed knows where an epoch's pass starts; without a feed, nothing.
        """
        if self.feed is not None:
            self.feed.announce(int(epoch), int(task))
        return np.int64(int(task))

    def read(self, epoch: Any, task: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A task's payloads: ``(buffer, starts, lengths)``.

        ``buffer`` is a one-element ``S`` array (it becomes a ``tf.string`` of
        shape ``[1]`` without a copy in NumPy), and record ``i`` is
        ``buffer[0][starts[i] : starts[i] + lengths[i]]``. Its memory is this
        thread's and is reused by its next call: TensorFlow copies a string
        result before the call returns.

        Raises:
            CorruptRecordError: a record's framing or CRC is bad, or its payload is
                not an Example recordkit reads whole (``UnknownFieldError``,
                ``SequenceExampleError``, ...), naming file, offset and record.
            ShardChangedError: a shard shrank under the reader.
        """
        if self.feed is None:
            return self._read(int(epoch), int(task))
        self.feed.begin(int(epoch), int(task))
        try:
            return self._read(int(epoch), int(task))
        finally:
            self.feed.done(int(epoch), int(task))

    def _read(self, epoch: int, task: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shard, rec = self.records(epoch, task)
        n, row = len(rec), self.row
        starts = np.empty(n, np.int64)  # where each record went in the buffer
        length = np.empty(n, np.int64)
        at = 0  # rows filled: records are laid out shard by shard
        flat = None  # the buffer so far (a release() meanwhile does not take it away)
        # One shard held at a time, so a task never holds more maps than the budget.
        for s, idx in groups(shard):
            with self.shards.use(s) as m:
                m.check()
                r = rec[idx]
                _verify(m, r, self._keys, self.keys)
                size = m.sizes[r] - OVERHEAD
                rows = -(-size // row)
                end = at + int(rows.sum())
                flat = self._buffer(end * row + 1, keep=at * row, held=flat)
                out = flat[at * row : end * row].reshape(-1, row)
                _gather(m, m.offsets[r] + HEADER_SIZE, size, rows, row, out)
            starts[idx] = (at + np.cumsum(rows) - rows) * row
            length[idx] = size
            at = end
        total = at * row
        flat = self._buffer(total + 1, keep=total, held=flat)
        flat[total] = 0xFF  # NumPy's S type drops trailing NULs: a nonzero last byte keeps them
        return flat[: total + 1].view(f"S{total + 1}"), starts, length

    def _buffer(self, size: int, keep: int, held: np.ndarray | None) -> np.ndarray:
        """This thread's output buffer, of at least ``size`` bytes, the first ``keep`` of
        ``held`` (the buffer the task has filled so far, if any) in it.

        Reused, not made anew: first-touching fresh pages costs ~2.6 µs per 4 KiB.
        """
        me = threading.get_ident()
        with self._buffers_lock:
            buf = self._buffers.get(me) if held is None else held
        if buf is None or len(buf) < size:
            grown = np.empty(max(size, 2 * len(buf)) if buf is not None else size, np.uint8)
            if buf is not None and keep:
                grown[:keep] = buf[:keep]
            buf = grown
            with self._buffers_lock:
                self._buffers[me] = buf
        return buf

    def release(self) -> None:
        """Let go of every thread's output buffer (a pass read its last task: the memory
        goes back to the system; the next pass's reads make new ones)."""
        with self._buffers_lock:
            self._buffers.clear()

    @property
    def buffers(self) -> int:
        """The output buffers held (one per thread that read a task since the last release)."""
        with self._buffers_lock:
            return len(self._buffers)


def groups(shard: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The positions of each shard's records, shard by shard (stable)."""
    if len(shard) and shard[0] == shard[-1] and not np.any(shard != shard[0]):
        return [(int(shard[0]), np.arange(len(shard)))]
    order = np.argsort(shard, kind="stable")
    ids = shard[order]
    edges = np.flatnonzero(np.diff(ids)) + 1
    lo = [0, *edges.tolist()]
    hi = [*edges.tolist(), len(ids)]
    return [(int(ids[a]), order[a:b]) for a, b in zip(lo, hi) if b > a]


def _verify(m: Any, r: np.ndarray, keys: tuple[bytes, ...], names: frozenset[str]) -> None:
    """Check the framing, both CRCs and the payload (as :func:`_reference` does) of
    records ``r`` of a mapped shard."""
    if _native is None or guard.map_of(m.buf) is None:
        for i in r.tolist():
            _reference(m, i, names)
        return
    offsets, sizes = m.offsets[r], m.sizes[r]
    try:
        status, _ = _native.parse_batch(m.buf, offsets, sizes, keys, True, DEFAULT_MAX_RECORD_BYTES)
    except guard.MapFault:
        raise guard.changed(m.buf, path=m.path) from None
    bad = np.flatnonzero(np.frombuffer(status, np.intc))
    if len(bad):
        _reference(m, int(r[bad[0]]), names)  # names file, offset and record
        raise AssertionError("parse_batch and the reference disagree")  # pragma: no cover


def _reference(m: Any, i: int, names: frozenset[str]) -> None:
    """Record ``i`` read and parsed the reference way: the exact error, if any.

    The payload is parsed as an Example (the values of ``names`` decoded), so a
    field that a message does not define is an ``UnknownFieldError`` here, where
    TensorFlow's parser would skip it.
    """
    payload = m.payload(i)  # read_record: framing and CRCs
    offset = int(m.offsets[i])
    data = guard.read(payload, 0, len(payload), path=m.path, offset=offset, record=i, check=False)
    del payload  # a private copy is parsed: no view of the map outlives the call
    try:
        decode_example(data, keys=names)
    except CorruptRecordError as exc:
        raise exc.located(m.path, offset, i) from None


def _gather(
    m: Any, src: np.ndarray, length: np.ndarray, rows: np.ndarray, row: int, out: np.ndarray
) -> None:
    """Copy payloads into consecutive rows of ``out``, ``rows[i]`` rows for payload ``i``."""
    first = np.repeat(src, rows)
    k = np.arange(len(first), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
    starts = first + k * row
    lengths = np.minimum(row, np.repeat(length, rows) - k * row)
    if _native is None or guard.map_of(m.buf) is None:
        view = np.frombuffer(m.buf, np.uint8) if len(m.buf) else np.empty(0, np.uint8)
        for j, (s, n) in enumerate(zip(starts.tolist(), lengths.tolist())):
            out[j, :n] = view[s : s + n]
        return
    try:
        _native.gather(m.buf, starts, lengths, out, row)
    except guard.MapFault:
        raise guard.changed(m.buf, path=m.path) from None
