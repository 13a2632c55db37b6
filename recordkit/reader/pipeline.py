"""The thread pool that reads, verifies, decodes and batches off the consuming thread.

Work is handed over in big pieces: a task is as many whole units (batches, or
single records) as fit in ``task_records`` records or ``task_bytes`` bytes (at
least one), so a thread wakes up once per many records and the native decoder
releases the GIL for large calls. Results are consumed strictly in submission order, so
the output order never depends on thread timing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ..errors import CorruptRecordError
from ..format.framing import OVERHEAD
from ._contract import WidthGuess
from ._tasks import (
    Columns,
    Task,
    concat,
    groups_by_shard,
    pieces,
    take,
    units_within,
)
from .buffers import BufferPool
from .decode import BatchDecoder
from .plan import EpochPlan, Split
from .shards import MappedShard, ShardSet

__all__ = ["Chunk", "OnError", "ReaderStats", "RecordReader"]

log = logging.getLogger(__name__)

OnError = Literal["raise", "skip", "warn"]


_DEFAULT_NICE = 10  # see _reader_nice

# One lock for every ReaderStats: updates are per task or per batch, so it is never
# contended, and a module-level lock keeps the dataclass picklable (DataLoader workers).
_STATS_LOCK = threading.Lock()


@dataclass
class ReaderStats:
    """Counters a training loop can log (``dataset.stats.as_dict()``).

    Safe to update from several threads (reader threads, several iterators of one
    dataset, free-threaded CPython): :meth:`add` updates under a lock.

    Attributes:
        records: records delivered.
        bytes: framed bytes read for them (skipped records included).
        batches: units delivered (batches, or samples without batching).
        skipped: corrupt records skipped (``on_error="skip"`` or ``"warn"``).
        wait_seconds: time the consuming thread spent waiting for data.
        decode_seconds: time reader threads spent verifying and decoding (summed over threads).
        remote_wait_seconds: the part of ``wait_seconds`` spent waiting for shards
            still on their way from remote storage (whole epochs through a shard
            cache): 0 while the cache's read-ahead keeps up, so training waits for
            the network only when the network is slower than training.
    """

    records: int = 0
    bytes: int = 0
    batches: int = 0
    skipped: int = 0
    wait_seconds: float = 0.0
    decode_seconds: float = 0.0
    remote_wait_seconds: float = 0.0

    def add(self, **deltas: float) -> None:
        """Add to several counters at once, atomically: ``stats.add(records=64, batches=1)``."""
        with _STATS_LOCK:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, float]:
        """A consistent snapshot of the counters."""
        with _STATS_LOCK:
            return asdict(self)

    def reset(self) -> None:
        """Set every counter back to zero."""
        with _STATS_LOCK:
            for name, value in asdict(ReaderStats()).items():
                setattr(self, name, value)


@dataclass
class Chunk:
    """Decoded records of one task: ``columns`` rows belong to ``units`` in order.

    Attributes:
        units: for each kept row, the unit (batch or sample) it belongs to.
        columns: feature name -> batch array (or list for variable shapes).
        rows: number of kept rows.
        shard_ids: for each kept row, its shard (an index into the shard set),
            so a transform can name the record it fails on (``None``: unknown).
        records: for each kept row, its record number within that shard.
    """

    units: np.ndarray
    columns: Columns
    rows: int
    shard_ids: np.ndarray | None = None
    records: np.ndarray | None = None


@dataclass
class _Prepared:
    """A runner submission (a task, or a piece of one): its shards, records, outputs."""

    bufs: tuple[Any, ...]
    held: tuple[MappedShard, ...]
    rec: np.ndarray
    outs: tuple[np.ndarray, ...]
    rows: np.ndarray | None  # the task's rows this piece decodes (None: all, in order)
    n: int
    nbytes: int


@dataclass
class TaskDone:
    chunk: Chunk
    nbytes: int
    skipped: list[CorruptRecordError]
    seconds: float


class RecordReader:
    """Decode the units of an epoch plan with a pool of threads, in order.

    Args:
        shards: the opened shard set.
        decoder: the batch decoder (schema, columns, verify, bytes layout).
        num_threads: reader threads.
        prefetch: tasks in flight ahead of the consumer.
        on_error: ``"raise"`` stops at the first corrupt record; ``"skip"``
            leaves it out and counts it; ``"warn"`` also emits a warning.
        pool: where batch arrays come from (reused buffers).
        task_records: a task takes whole units until it holds this many records...
        task_bytes: ...or this many bytes, whichever comes first.
        stats: counters to update.
        native_tasks: decode each task in one native call on threads that never
            take the GIL (see ``BatchDecoder.runner``); ``None`` (default) does
            so whenever the schema allows (unless ``RECORDKIT_NATIVE_TASKS=0``),
            ``False`` never (tests compare both).
    """

    def __init__(
        self,
        shards: ShardSet,
        decoder: BatchDecoder,
        *,
        num_threads: int,
        prefetch: int,
        on_error: OnError = "raise",
        pool: BufferPool | None = None,
        task_records: int = 4096,
        task_bytes: int = 8 << 20,
        stats: ReaderStats | None = None,
        native_tasks: bool | None = None,
    ) -> None:
        if on_error not in ("raise", "skip", "warn"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', got {on_error!r}")
        if num_threads < 1 or prefetch < 1:
            raise ValueError(
                f"num_threads and prefetch must be >= 1, got {num_threads}, {prefetch}"
            )
        self.shards = shards
        self.decoder = decoder
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.on_error = on_error
        self.pool = pool or BufferPool()
        self.task_records = task_records
        self.task_bytes = task_bytes
        self.stats = stats or ReaderStats()
        self._avg_bytes = shards.avg_record_bytes
        if native_tasks is None:  # the environment may turn it off (diagnosis, benchmarks)
            native_tasks = os.environ.get("RECORDKIT_NATIVE_TASKS", "").strip() != "0"
        self.native_tasks = native_tasks and decoder.runner() is not None
        # Row widths to allocate for each padded bytes feature in runner tasks.
        self._widths = WidthGuess(decoder.bytes_features)
        self.native_fallbacks = 0  # runner tasks decoded the reference way instead

    # -- one task, on a reader thread ------------------------------------------------

    def _decode_task(self, task: Task) -> TaskDone:
        t0 = time.perf_counter()
        shard_ids, records, unit_of_row = task.shard_ids, task.records, task.unit_of_row
        groups = task.groups  # a shuffled task reads each shard's records in one call
        kept = np.ones(len(records), dtype=bool)
        parts: list[tuple[Columns, int]] = []
        rows_of_parts: list[np.ndarray] = []
        nbytes = 0
        skipped: list[CorruptRecordError] = []
        for sid, rows in groups:
            recs = records[rows]
            with self.shards.use(sid) as shard:
                offsets, sizes = shard.locate(recs)
                alloc = self.pool.alloc if len(groups) == 1 else None
                batch = self.decoder.decode(
                    shard.buf, offsets, sizes, alloc=alloc, path=shard.path, records=recs
                )
            nbytes += batch.nbytes
            ok = np.ones(len(rows), dtype=bool)
            for pos, err in batch.bad:
                located = err.located(shard.path, int(offsets[pos]), int(recs[pos]))
                if self.on_error == "raise":
                    raise located
                skipped.append(located)
                ok[pos] = False
            kept[rows[~ok]] = False
            if batch.n:
                parts.append((batch.columns, batch.n))
                rows_of_parts.append(rows[ok])
        columns, n = concat(parts, self.pool.alloc) if parts else ({}, 0)
        if len(parts) > 1:  # back from shard order to the task's order
            where = np.concatenate(rows_of_parts)
            if (np.diff(where) < 0).any():
                columns = take(columns, np.argsort(where, kind="stable"))
        chunk = Chunk(unit_of_row[kept], columns, n, shard_ids[kept], records[kept])
        return TaskDone(chunk, nbytes, skipped, time.perf_counter() - t0)

    # -- the consumer side -------------------------------------------------------------

    def _tasks(self, plan: EpochPlan, split: Split, units: range) -> Iterator[Task]:
        """The units in tasks of about ``task_records`` / ``task_bytes``, located.

        A task also touches at most half the map budget's shards where whole units
        allow (at least one unit); a unit that touches more is decoded in pieces.
        Slow start: the first task is a sixteenth of that (at least one unit), each
        next one twice the one before: the first batch waits for its own records,
        not for fifteen more batches' pages faulted in from shards all over a shuffle.
        """
        size = plan.options.batch_size or 1
        per_record = max(self._avg_bytes, 1.0)
        full = max(1, min(self.task_records // size, int(self.task_bytes / per_record) // size))
        per_task = max(1, full // 16)
        cap = max(1, self.shards.max_open // 2)
        gate = self.shards.gate
        limit = gate.limit if gate is not None else 0
        step = units.step
        first = units.start
        while first < units.stop:
            task = self._locate(
                plan, split, range(first, min(first + per_task * step, units.stop), step)
            )
            if task.nshards > cap and len(task.units) > 1:
                task = self._locate(plan, split, task.units[: units_within(task, cap)])
            if limit and len(task.units) > 1:  # a cache holds what a task touches at once
                k = units_within(task, limit, self.shards.nbytes)
                if k < len(task.units):
                    task = self._locate(plan, split, task.units[:k])
            yield task
            first = task.units.stop
            per_task = min(full, per_task * 2)

    @staticmethod
    def _locate(plan: EpochPlan, split: Split, units: range) -> Task:
        positions, lengths = plan.unit_positions(split, units)
        shard_ids, records = plan.resolve(positions)
        unit_of_row = np.repeat(np.asarray(units, dtype=np.int64), lengths)
        return Task(units, unit_of_row, shard_ids, records, groups_by_shard(shard_ids))

    def read(self, plan: EpochPlan, split: Split, units: range) -> Generator[Chunk, None, None]:
        """Yield decoded chunks covering ``units`` in order (chunks with no rows included).

        Stops the threads when the iterator is closed or garbage collected.
        """
        if self.native_tasks:
            return self._read_native(plan, split, units)
        return self._read_python(plan, split, units)

    def _prepare(self, task: Task, rows: np.ndarray | None) -> _Prepared:
        """Map a piece's shards (held until it is done) and allocate its outputs.

        ``rows``: the task's rows this piece decodes (``None``: all, in order).
        """
        shard_ids, records, groups = task.shard_ids, task.records, task.groups
        if rows is not None:
            shard_ids, records = shard_ids[rows], records[rows]
            groups = groups_by_shard(shard_ids)
        n = len(records)
        rec = np.empty((n, 3), dtype=np.int64)  # the runner's record table (see _contract)
        held: list[MappedShard] = []  # released once the runner is done with the piece
        try:
            # Shards not mapped yet are opened together (their indexes load in parallel).
            held = self.shards.acquire_many([sid for sid, _ in groups])
            for slot, (shard, (_, at)) in enumerate(zip(held, groups)):
                rec[at, 0] = slot
                # unchecked runs: the runner checks each length field (ShardIndex.lookup)
                rec[at, 1], rec[at, 2] = shard.lookup(records[at])
        except BaseException:
            self._release(held)
            raise
        widest = int(rec[:, 2].max()) - OVERHEAD if n else 0  # the longest payload
        widths = self._widths.widths(widest)
        outs = self.decoder.runner_outputs(n, widths, self.pool.alloc)
        bufs = tuple(shard.buf for shard in held)
        return _Prepared(bufs, tuple(held), rec, outs, rows, n, int(rec[:, 2].sum()))

    def _release(self, held: Sequence[MappedShard]) -> None:
        for shard in held:
            self.shards.release(shard)

    def _read_native(
        self, plan: EpochPlan, split: Split, units: range
    ) -> Generator[Chunk, None, None]:
        tasks = self._tasks(plan, split, units)
        runner = self.decoder.runner()
        assert runner is not None  # native_tasks is only set when there is one
        nice = _reader_nice()

        def work() -> None:
            if nice:
                # Linux: a thread id names just that thread. Lowering one's own
                # priority needs no privilege; it ends with the thread (per epoch).
                try:
                    tid = threading.get_native_id()
                    mine = os.getpriority(os.PRIO_PROCESS, tid)
                    os.setpriority(os.PRIO_PROCESS, tid, min(19, mine + nice))
                except OSError as exc:
                    log.debug("could not lower the reader threads' priority: %s", exc)
            runner.work()

        threads = [
            threading.Thread(target=work, name=f"recordkit-reader-{i}", daemon=True)
            for i in range(self.num_threads)
        ]
        for t in threads:
            t.start()
        # a task touching more than half the map budget's shards goes in pieces (_join)
        cap = max(1, self.shards.max_open // 2)
        jobs = ((task, rows) for task in tasks for rows in pieces(task, cap))
        pending: deque[tuple[Task, _Prepared, int]] = deque()
        upcoming: list[tuple[Task, np.ndarray | None] | None] = [next(jobs, None)]

        # Slow start: one task in flight until the first chunk is out, one more after
        # each chunk, up to `prefetch`: the first batch waits for one task's
        # preparation (index loads, length-field checks, maps) and the next one's,
        # not for `prefetch` of them.
        depth = [1]
        chunks = 0  # yielded so far

        def refill(wait: bool) -> None:
            # Admission: pieces in flight hold their shards mapped; one more is
            # submitted only while that stays within the map budget (one always is),
            # and only once its shards are here (a cache may be fetching them): with
            # ``wait`` and nothing pending it waits for them, else it waits its turn.
            held = sum(len(prep.held) for _, prep, _ in pending)
            while len(pending) < depth[0]:
                job = upcoming[0]
                if job is None:
                    return
                task, rows = job
                if (
                    pending
                    and held + (task.nshards if rows is None else cap) > self.shards.max_open
                ):
                    return
                if not self._arrived(task, rows, waiting=wait and not pending):
                    return
                upcoming[0] = next(jobs, None)
                prep = self._prepare(task, rows)
                held += len(prep.held)
                try:
                    task_id = runner.submit(prep.bufs, prep.rec, prep.outs)
                except BaseException:
                    self._release(prep.held)
                    raise
                pending.append((task, prep, task_id))

        try:
            refill(True)
            done_parts: list[tuple[_Prepared, bool, Any, float]] = []
            waited = 0.0
            while pending:
                task, prep, task_id = pending.popleft()
                t0 = time.perf_counter()
                try:
                    ok, widths, seconds = runner.wait(task_id)
                finally:
                    self._release(prep.held)
                waited += time.perf_counter() - t0
                depth[0] = min(self.prefetch, chunks + 1)
                refill(False)  # the chunk in hand goes out first: its reader may let shards go
                done_parts.append((prep, ok, widths, seconds))
                if sum(p.n for p, _, _, _ in done_parts) < len(task.records):
                    if not pending:
                        refill(True)
                    continue  # more pieces of this task to come
                done = self._join(task, done_parts)
                done_parts = []
                self._widths.observe(done.chunk.columns)
                self._account(done, waited)
                waited = 0.0
                yield done.chunk
                chunks += 1
                if not pending:
                    refill(True)
        finally:
            runner.close()
            runner.drop()  # waits for a task in progress; the shards are then let go
            for t in threads:
                t.join()
            for _, prep, _ in pending:
                self._release(prep.held)

    def _join(self, task: Task, parts: list[tuple[_Prepared, bool, Any, float]]) -> TaskDone:
        """A task's chunk from its runner pieces (or the reference path if one refused)."""
        seconds = sum(s for _, _, _, s in parts)
        nbytes = sum(p.nbytes for p, _, _, _ in parts)
        if not all(ok for _, ok, _, _ in parts):  # a record the fast path does not take
            self.native_fallbacks += 1
            return self._decode_task(task)
        cols = [(self.decoder.runner_columns(p.outs, w, p.n), p.n) for p, _, w, _ in parts]
        if len(parts) == 1 and parts[0][0].rows is None:
            columns = cols[0][0]
        else:  # pieces are grouped by shard: back to the task's order
            columns, _ = concat(cols, self.pool.alloc)
            where = np.concatenate([p.rows for p, _, _, _ in parts if p.rows is not None])
            columns = take(columns, np.argsort(where, kind="stable"))
        chunk = Chunk(task.unit_of_row, columns, len(task.records), task.shard_ids, task.records)
        return TaskDone(chunk, nbytes, [], seconds)

    def _read_python(
        self, plan: EpochPlan, split: Split, units: range
    ) -> Generator[Chunk, None, None]:
        tasks = self._tasks(plan, split, units)
        executor = ThreadPoolExecutor(self.num_threads, thread_name_prefix="recordkit-reader")
        pending: deque[Future[TaskDone]] = deque()

        upcoming: list[Task | None] = [None]
        depth = [1]  # slow start, as _read_native
        chunks = 0

        def refill(wait: bool) -> None:
            while len(pending) < depth[0]:
                task = upcoming[0]
                if task is None:
                    return
                if not self._arrived(task, None, waiting=wait and not pending):
                    return
                upcoming[0] = next(tasks, None)
                pending.append(executor.submit(self._decode_task, task))

        try:
            upcoming[0] = next(tasks, None)
            refill(True)
            while pending:
                future = pending.popleft()
                t0 = time.perf_counter()
                done = future.result()
                waited = time.perf_counter() - t0
                depth[0] = min(self.prefetch, chunks + 1)
                refill(False)  # the chunk in hand goes out first: its reader may let shards go
                self._account(done, waited)
                yield done.chunk
                chunks += 1
                if not pending:
                    refill(True)
        finally:
            for future in pending:
                future.cancel()
            executor.shutdown(wait=True, cancel_futures=True)

    def _arrived(self, task: Task, rows: np.ndarray | None, *, waiting: bool) -> bool:
        """Whether a task's shards can be mapped now (a cache may still be fetching
        them); with ``waiting`` (nothing else to hand out), wait until they can."""
        ids = task.shard_ids if rows is None else task.shard_ids[rows]
        if self.shards.gate is None:
            return True
        unique = np.unique(ids).tolist()
        if self.shards.ready(unique):
            return True
        if not waiting:
            return False
        waited = self.shards.wait(unique)
        self.stats.add(remote_wait_seconds=waited, wait_seconds=waited)
        return True

    def _account(self, done: TaskDone, waited: float) -> None:
        self.stats.add(
            wait_seconds=waited,
            decode_seconds=done.seconds,
            bytes=done.nbytes,
            skipped=len(done.skipped),
        )
        for err in done.skipped:
            if self.on_error == "warn":
                warnings.warn(f"skipping corrupt record: {err}", RuntimeWarning, stacklevel=3)
            else:
                log.debug("skipped corrupt record: %s", err)


def _reader_nice() -> int:
    """How much the runner's threads add to their ``nice`` value: ``RECORDKIT_READER_NICE``
    (``docs/reference/environment.md``; default 10, measured in ``docs/performance.md``).
    The training thread waits on them only when they are behind, and when they are
    ahead every slice of CPU they take delays the step. 0 on systems other than Linux
    (there ``setpriority`` cannot name a thread).
    """
    if sys.platform != "linux":
        return 0
    value = os.environ.get("RECORDKIT_READER_NICE", "").strip()
    if not value:
        return _DEFAULT_NICE
    try:
        nice = int(value)
    except ValueError:
        raise ValueError(f"RECORDKIT_READER_NICE must be an integer 0..19, got {value!r}") from None
    if not 0 <= nice <= 19:
        raise ValueError(f"RECORDKIT_READER_NICE must be an integer 0..19, got {value!r}")
    return nice
