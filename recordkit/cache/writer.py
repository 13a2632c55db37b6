"""Producer mode's writer side: converting one partition into one staged shard, in a
writer process (or inline), and the processes themselves.

:func:`produce` converts a :class:`ProduceTask`'s source items into the
reservation's temp names, never past the reservation (``cap``): a record that
would pass it raises :class:`OutgrewError` with the temp files removed. It runs
in a writer process that :class:`WriterPool` starts and reuses; only the task
goes in and a plain-data outcome comes out (see :func:`run_task`), so no
exception object and no sample ever crosses the pipe.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .._procs import Child, Deadline, receive
from ..codec.schema import Schema
from ..conversion import Tally, write_items
from ..errors import OutgrewError
from ..retry import RetryPolicy, is_transient
from ..writer.sequence import ShardSequence
from .staged import Staged, discard, is_disk_full, staged_names

__all__ = ["ProduceTask", "WriterPool", "produce", "run_task"]

log = logging.getLogger(__name__)

# Progress crosses the pipe at most this often per writer.
_REPORT_EVERY_S = 0.2
# How often a fill thread waiting on its writer looks at the process and the clock.
_POLL_S = 0.25


# -- the writer side (in a writer process, or inline) ------------------------------------------


@dataclass(frozen=True, slots=True)
class ProduceTask:
    """One partition to convert into one staged shard (pickled into a writer; small).

    Attributes:
        path: the shard, relative to the cache root.
        final: its absolute final path; the temp names derive from it and ``lease_id``.
        lease_id: the reservation's id (temp files named after it count as reserved).
        cap: the most bytes the shard and its index may take together.
        items: the partition's source items.
        source: the ``recordkit.converters.Source`` (its location and options, never samples).
        schema: the schema in JSON form.
        fsync: fsync the shard and the index before handing them back.
        retry: how transient source errors are retried (the whole partition again).
    """

    path: str
    final: str
    lease_id: str
    cap: int
    items: tuple[Any, ...]
    source: Any
    schema: dict[str, Any]
    fsync: bool
    retry: RetryPolicy


class _StagedTarget:
    """A :class:`ShardWriter` target that leaves the shard and its index under the
    lease's temp names: the cache publishes them itself, under its lock."""

    def __init__(self, staged: tuple[str, str], fsync: bool) -> None:
        self.staged = staged
        self.fsync = fsync
        self.root = os.path.dirname(staged[0])

    def staging_path(self, name: str) -> str:
        return self.staged[0]

    def publish(self, staged: str, name: str) -> None:
        pass  # stays staged: the cache renames it into place after the budget check

    def discard(self, staged: str) -> None:
        discard(self.staged)

    def write_bytes(self, name: str, data: bytes) -> None:  # the index
        fd = os.open(self.staged[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def listdir(self) -> list[str]:
        return []

    def remove(self, name: str) -> None:
        pass

    def close(self) -> None:
        pass


def _write(
    task: ProduceTask,
    schema: Schema,
    staged: tuple[str, str],
    report: Callable[[int, int, int], None],
) -> Staged:
    shards = ShardSequence(
        _StagedTarget(staged, task.fsync),  # one shard, so the name is the staged one
        os.path.basename(task.final),
        shard_size=None,  # a partition is one shard, bounded by the reservation instead
        fsync=task.fsync,
        name=lambda _: os.path.basename(task.final),
    )
    index_bytes = 0
    source_done = [0]

    def within_cap(framed: int, item: int) -> None:
        nonlocal index_bytes
        line = len(str(shards.bytes)) + len(str(framed)) + 2  # "offset size\n"
        if shards.bytes + framed + index_bytes + line > task.cap:
            raise OutgrewError(task.cap, item, source_done[0])
        index_bytes += line

    def progress(items: int, size: int, records: int) -> None:
        source_done[0] += size
        report(items, size, records)

    try:
        write_items(shards, task.source, task.items, schema, progress, before_write=within_cap)
        (info,) = shards.close()
    finally:
        shards.discard()  # what an error left in progress (nothing after close)
    return Staged(
        staged[0],
        staged[1],
        info.bytes,
        os.path.getsize(staged[1]),
        info.records,
        int(info.crc32c or 0),
    )


def produce(task: ProduceTask, report: Callable[[int], None]) -> Staged:
    """Convert ``task``'s partition into its staged shard and index; return them.

    ``report(source_bytes)`` is called as items finish. Transient source errors
    retry the whole partition after a backoff (the same bytes come out); the
    bytes a failed attempt reported are taken back (``report(-n)``) first.

    Raises:
        OutgrewError: the output would pass ``task.cap`` (temp files removed).
        OSError: local write errors, ``ENOSPC`` among them (temp files removed).
        Exception: the source's own errors (``SchemaError``, ``SourceError``, ...).
    """
    staged = staged_names(task.final, task.lease_id)
    os.makedirs(os.path.dirname(task.final), exist_ok=True)
    schema = Schema.from_json(task.schema)
    tallies: list[Tally] = []

    def attempt() -> Staged:
        if tallies:
            tallies[-1].undo()  # the retry reads the same items again
        tallies.append(Tally(lambda items, size, records: report(size)))
        try:
            return _write(task, schema, staged, tallies[-1])
        except BaseException:
            discard(staged)
            raise

    def worth_retrying(exc: BaseException) -> bool:
        return not isinstance(exc, OutgrewError) and is_transient(exc)

    return task.retry.call(attempt, what=f"{task.path}: source", retry_if=worth_retrying)


def run_task(task: ProduceTask, report: Callable[[int], None]) -> tuple[Any, ...]:
    """:func:`produce`, its outcome as plain data (what crosses the pipe):
    ``("done", Staged)``, ``("outgrew", cap, items_done, source_done)``,
    ``("full", errno, strerror)`` or ``("error", summary, traceback text)``."""
    try:
        return ("done", produce(task, report))
    except OutgrewError as exc:
        return ("outgrew", exc.cap, exc.items_done, exc.source_done)
    except Exception as exc:
        if is_disk_full(exc):
            assert isinstance(exc, OSError)
            return ("full", exc.errno, exc.strerror or str(exc))
        notes = "; ".join(getattr(exc, "__notes__", []))
        summary = f"{type(exc).__name__}: {exc}" + (f" ({notes})" if notes else "")
        return ("error", summary, "".join(traceback.format_exception(exc)))


class _PipeProgress:
    """Sums source bytes and sends them to the cache at most every ``_REPORT_EVERY_S``."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.pending = 0
        self.last = time.monotonic()

    def __call__(self, nbytes: int) -> None:
        self.pending += nbytes
        if time.monotonic() - self.last >= _REPORT_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.conn.send(("progress", self.pending))
        self.pending = 0
        self.last = time.monotonic()


def _writer_main(conn: Connection) -> None:
    """A writer process (see :mod:`recordkit._procs`): tasks in, outcomes out, until
    ``None`` or EOF."""
    while True:
        try:
            task = receive(conn)
        except (EOFError, OSError):
            return
        except Exception as exc:  # the task does not unpickle here (a class it cannot import)
            text = "".join(traceback.format_exception(exc))
            conn.send(("error", f"cannot load the task: {type(exc).__name__}: {exc}", text))
            continue
        if task is None:
            return
        progress = _PipeProgress(conn)
        outcome = run_task(task, progress)
        progress.flush()
        conn.send(outcome)


# -- the cache side: writer processes ---------------------------------------------------------


class _WriterProcess:
    """One writer process (:class:`recordkit._procs.Child`): a fresh interpreter that
    imports this module only, never the user's ``__main__`` unless a task names it."""

    def __init__(self) -> None:
        self.child = Child(f"{__name__}:_writer_main", what="writer process")

    def run(
        self,
        task: ProduceTask,
        on_bytes: Callable[[int], None],
        *,
        timeout: float | None,
        abandon: Callable[[], bool],
    ) -> tuple[Any, ...]:
        """Hand ``task`` over and wait for its outcome (see :func:`run_task`), or
        ``("died", reason)`` / ``("silent", seconds)`` / ``("abandoned",)``."""
        if not self.child.send(task):
            return self._died()
        deadline = Deadline(timeout)
        conn = self.child.conn
        while True:
            if conn.poll(deadline.poll(_POLL_S)):
                try:
                    msg: tuple[Any, ...] = conn.recv()
                except (EOFError, OSError):
                    return self._died()
                deadline.touch()
                if msg[0] != "progress":
                    return msg
                on_bytes(int(msg[1]))
            elif not self.child.alive():
                return self._died()
            elif abandon():
                self.child.stop("the cache is stopping")
                return ("abandoned",)
            elif deadline.expired():
                self.child.stop(f"no progress for {timeout:.0f} s")
                return ("silent", timeout)

    def _died(self) -> tuple[Any, ...]:
        reason = self.child.reason()
        log.warning("writer process %d died (%s)", self.child.pid, reason)
        self.child.conn.close()
        return ("died", reason)


class WriterPool:
    """Writer processes, reused from partition to partition.

    A fill thread takes an idle writer (or spawns one) for each partition, so
    there are as many as threads filling at once; a writer that died, was
    stopped or went silent is replaced by a fresh one next time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_WriterProcess] = []
        self._all: set[_WriterProcess] = set()

    def run(
        self,
        task: ProduceTask,
        on_bytes: Callable[[int], None],
        *,
        timeout: float | None,
        abandon: Callable[[], bool],
    ) -> tuple[Any, ...]:
        """Run ``task`` in a writer process; see :meth:`_WriterProcess.run`."""
        with self._lock:
            writer = self._idle.pop() if self._idle else None
        if writer is None:
            writer = _WriterProcess()
            with self._lock:
                self._all.add(writer)
        outcome: tuple[Any, ...] = ("interrupted",)
        try:
            outcome = writer.run(task, on_bytes, timeout=timeout, abandon=abandon)
        finally:
            healthy = outcome[0] in ("done", "outgrew", "full", "error") and writer.child.alive()
            with self._lock:
                if healthy:
                    self._idle.append(writer)
                else:
                    self._all.discard(writer)
            if not healthy:
                writer.child.stop(f"its partition ended with {outcome[0]}")
        return outcome

    def close(self) -> None:
        """Stop every writer process (idle ones exit at once)."""
        with self._lock:
            writers = list(self._all)
            self._all.clear()
            self._idle.clear()
        for w in writers:
            w.child.close()  # ask it to exit (join), then stop it if it does not
