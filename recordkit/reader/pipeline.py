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
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from ..errors import CorruptRecordError
from ..format.framing import OVERHEAD
from .buffers import BufferPool
from .decode import BatchDecoder
from .plan import EpochPlan, Split
from .shards import ShardSet

__all__ = ["Chunk", "OnError", "ReaderStats", "RecordReader"]

log = logging.getLogger(__name__)

OnError = Literal["raise", "skip", "warn"]
Columns = dict[str, Any]


# Scheduling priority of the runner's threads (see _reader_nice); measured in
# docs/performance.md (GIL pressure).
_DEFAULT_NICE = 10

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
    """

    records: int = 0
    bytes: int = 0
    batches: int = 0
    skipped: int = 0
    wait_seconds: float = 0.0
    decode_seconds: float = 0.0

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
    """

    units: np.ndarray
    columns: Columns
    rows: int


@dataclass
class _Prepared:
    """A runner task as submitted: its shards, records, outputs and row units."""

    bufs: tuple[Any, ...]
    rec: np.ndarray
    outs: tuple[np.ndarray, ...]
    unit_of_row: np.ndarray
    n: int
    nbytes: int


@dataclass
class _Done:
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
        # Row widths to allocate for each padded bytes feature in runner tasks: the
        # widest value seen so far, with headroom; a wider one sends its task to
        # the reference path, which is exact, and widens the guess.
        self._widths: list[int] = [0] * len(decoder.bytes_features)
        self.native_fallbacks = 0  # runner tasks decoded the reference way instead

    # -- one task, on a reader thread ------------------------------------------------

    def _decode_task(self, plan: EpochPlan, split: Split, units: Sequence[int]) -> _Done:
        t0 = time.perf_counter()
        positions, lengths = plan.unit_positions(split, units)
        unit_of_row = np.repeat(np.asarray(units, dtype=np.int64), lengths)
        shard_ids, records = plan.resolve(positions)
        bounds = _runs(shard_ids)
        kept = np.ones(len(records), dtype=bool)
        parts: list[tuple[Columns, int]] = []
        nbytes = 0
        skipped: list[CorruptRecordError] = []
        for lo, hi in bounds:
            shard = self.shards.shards[int(shard_ids[lo])]
            recs = records[lo:hi]
            offsets, sizes = shard.offsets[recs], shard.sizes[recs]
            alloc = self.pool.alloc if len(bounds) == 1 else None
            batch = self.decoder.decode(
                shard.buf, offsets, sizes, alloc=alloc, path=shard.path, records=recs
            )
            nbytes += batch.nbytes
            for pos, err in batch.bad:
                located = err.located(shard.path, int(offsets[pos]), int(recs[pos]))
                if self.on_error == "raise":
                    raise located
                skipped.append(located)
                kept[lo + pos] = False
            if batch.n:
                parts.append((batch.columns, batch.n))
        columns, rows = _concat(parts, self.pool.alloc) if parts else ({}, 0)
        chunk = Chunk(units=unit_of_row[kept], columns=columns, rows=rows)
        return _Done(chunk, nbytes, skipped, time.perf_counter() - t0)

    # -- the consumer side -------------------------------------------------------------

    def _tasks(self, plan: EpochPlan, units: range) -> Iterator[range]:
        size = plan.options.batch_size or 1
        per_record = max(self._avg_bytes, 1.0)
        per_task = max(1, min(self.task_records // size, int(self.task_bytes / per_record) // size))
        step = units.step
        for first in range(units.start, units.stop, per_task * step):
            yield range(first, min(first + per_task * step, units.stop), step)

    def read(self, plan: EpochPlan, split: Split, units: range) -> Generator[Chunk, None, None]:
        """Yield decoded chunks covering ``units`` in order (chunks with no rows included).

        Stops the threads when the iterator is closed or garbage collected.
        """
        if self.native_tasks:
            return self._read_native(plan, split, units)
        return self._read_python(plan, split, units)

    def _prepare(self, plan: EpochPlan, split: Split, units: Sequence[int]) -> _Prepared:
        """Locate a task's records and allocate its outputs (on the consumer thread)."""
        positions, lengths = plan.unit_positions(split, units)
        unit_of_row = np.repeat(np.asarray(units, dtype=np.int64), lengths)
        shard_ids, records = plan.resolve(positions)
        n = len(records)
        rec = np.empty((n, 3), dtype=np.int64)
        bufs: list[Any] = []
        slot: dict[int, int] = {}
        for lo, hi in _runs(shard_ids):
            sid = int(shard_ids[lo])
            if sid not in slot:
                slot[sid] = len(bufs)
                bufs.append(self.shards.shards[sid].buf)
            shard = self.shards.shards[sid]
            recs = records[lo:hi]
            rec[lo:hi, 0] = slot[sid]
            rec[lo:hi, 1] = shard.offsets[recs]
            rec[lo:hi, 2] = shard.sizes[recs]
        widest = int(rec[:, 2].max()) - OVERHEAD if n else 0  # the longest payload
        widths = []
        for seen in self._widths:
            guess = widest if not seen else min(widest, seen + (seen >> 2) + 64)
            widths.append(max(guess, 0))
        outs = self.decoder.runner_outputs(n, widths, self.pool.alloc)
        return _Prepared(tuple(bufs), rec, outs, unit_of_row, n, int(rec[:, 2].sum()))

    def _read_native(
        self, plan: EpochPlan, split: Split, units: range
    ) -> Generator[Chunk, None, None]:
        tasks = self._tasks(plan, units)
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
        pending: deque[tuple[range, _Prepared, int]] = deque()

        def refill() -> None:
            while len(pending) < self.prefetch:
                task = next(tasks, None)
                if task is None:
                    return
                prep = self._prepare(plan, split, task)
                pending.append((task, prep, runner.submit(prep.bufs, prep.rec, prep.outs)))

        try:
            refill()
            while pending:
                task, prep, task_id = pending.popleft()
                t0 = time.perf_counter()
                ok, widths, seconds = runner.wait(task_id)
                waited = time.perf_counter() - t0
                refill()
                if ok:
                    columns = self.decoder.runner_columns(prep.outs, widths, prep.n)
                    done = _Done(Chunk(prep.unit_of_row, columns, prep.n), prep.nbytes, [], seconds)
                else:  # a record the fast path does not take: the reference path, here
                    self.native_fallbacks += 1
                    done = self._decode_task(plan, split, task)
                for k, name in enumerate(self.decoder.bytes_features):
                    col = done.chunk.columns.get(name)  # absent when every record was skipped
                    if col is not None:
                        self._widths[k] = max(self._widths[k], col.shape[1])
                self._account(done, waited)
                yield done.chunk
        finally:
            runner.close()
            runner.drop()  # waits for a task in progress; the shards are then let go
            for t in threads:
                t.join()

    def _read_python(
        self, plan: EpochPlan, split: Split, units: range
    ) -> Generator[Chunk, None, None]:
        tasks = self._tasks(plan, units)
        executor = ThreadPoolExecutor(self.num_threads, thread_name_prefix="recordkit-reader")
        pending: deque[Future[_Done]] = deque()

        def refill() -> None:
            while len(pending) < self.prefetch:
                task = next(tasks, None)
                if task is None:
                    return
                pending.append(executor.submit(self._decode_task, plan, split, task))

        try:
            refill()
            while pending:
                future = pending.popleft()
                t0 = time.perf_counter()
                done = future.result()
                waited = time.perf_counter() - t0
                refill()
                self._account(done, waited)
                yield done.chunk
        finally:
            for future in pending:
                future.cancel()
            executor.shutdown(wait=True, cancel_futures=True)

    def _account(self, done: _Done, waited: float) -> None:
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


def _runs(shard_ids: np.ndarray) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` runs of equal shard ids (a task's records, shard by shard)."""
    edges = (np.flatnonzero(np.diff(shard_ids)) + 1).tolist()
    return list(zip([0, *edges], [*edges, len(shard_ids)], strict=True))


def _reader_nice() -> int:
    """How much the runner's threads lower their scheduling priority (``nice``).

    The training thread waits on the reader threads only when they are behind; when
    they are ahead, every slice of CPU they take from it delays the step. So on
    Linux they add 10 to their ``nice`` value by default: on a busy machine the training
    thread's Python goes first, and the readers take the rest (all of it while the
    training thread waits on data or the accelerator). ``RECORDKIT_READER_NICE``
    sets another value; 0 keeps the process's priority. Other systems: unchanged
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


def _concat(
    parts: list[tuple[Columns, int]], alloc: Callable[[tuple[int, ...], Any], np.ndarray]
) -> tuple[Columns, int]:
    """Join the per-shard pieces of one batch (most batches have one piece)."""
    if len(parts) == 1:
        return parts[0]
    rows = sum(n for _, n in parts)
    out: Columns = {}
    for key, first in parts[0][0].items():
        pieces = [cols[key] for cols, _ in parts]
        if isinstance(first, np.ndarray):
            if first.ndim == 2 and any(p.shape[1] != first.shape[1] for p in pieces):
                # padded bytes of different widths: pad to the widest, with zeros
                width = max(p.shape[1] for p in pieces)
                joined = alloc((rows, width), first.dtype)
                row = 0
                for p in pieces:
                    joined[row : row + len(p), : p.shape[1]] = p
                    joined[row : row + len(p), p.shape[1] :] = 0
                    row += len(p)
            else:
                joined = alloc((rows, *first.shape[1:]), first.dtype)
                np.concatenate(pieces, out=joined)
            out[key] = joined
        else:
            out[key] = [v for p in pieces for v in p]
    return out, rows
