"""The local engine: partitions run in writer processes on this machine (the default).

Each writer is a :class:`recordkit._procs.Child`, a fresh interpreter that
imports only what its tasks need (the user's script only when a task names a
function defined there), exits when this process dies, and ignores Ctrl-C (this
process stops it). A writer takes one :class:`PartitionTask` at a time and
sends back batched progress and then the :class:`PartitionResult` or the
exception (pickled when it can be, else its summary, notes and traceback).
Writers are reused from partition to partition; one that dies fails only the
partition it was converting, and a fresh one takes the next.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from .._procs import Child, Deadline, pack_exception, receive, stop_all, unpack_exception
from ..errors import ConvertError
from .partition import PartitionTask, Reporter, run_partition

__all__ = ["LocalEngine"]

log = logging.getLogger(__name__)

Outcome = tuple[PartitionTask, Any]

# Progress crosses the connection at most this often per writer.
_REPORT_EVERY_S = 0.2
# How long the parent waits for a message before it looks at the clock again.
_POLL_S = 0.25
# A writer asked to exit after the last partition: seconds before it is terminated.
_JOIN_S = 5.0
_ENTRY = f"{__name__}:_writer"


# -- in a writer process ----------------------------------------------------------------------


class _PipeReporter:
    """Sums progress and sends it to the parent every ``_REPORT_EVERY_S``."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pending = [0, 0, 0]
        self.last = time.monotonic()

    def __call__(self, items: int, size: int, records: int) -> None:
        p = self.pending
        p[0], p[1], p[2] = p[0] + items, p[1] + size, p[2] + records
        if time.monotonic() - self.last >= _REPORT_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if any(self.pending):
            self.conn.send(("progress", tuple(self.pending)))
        self.pending = [0, 0, 0]
        self.last = time.monotonic()


def _writer(conn: Connection) -> None:
    """A writer process: tasks in, ``("done", result)`` or ``("failed", packed)`` out,
    until ``None`` or EOF."""
    while True:
        try:
            task = receive(conn)
        except (EOFError, OSError):
            return
        except Exception as exc:  # it does not unpickle here (a class it cannot import)
            conn.send(("failed", pack_exception(exc)))
            continue
        if task is None:
            return
        reporter = _PipeReporter(conn)
        msg: tuple[str, Any]
        try:
            msg = ("done", run_partition(task, reporter))
        except Exception as exc:
            msg = ("failed", pack_exception(exc))
        reporter.flush()
        conn.send(msg)


# -- in this process --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LocalEngine:
    """Run partitions in ``workers`` writer processes on this machine.

    Args:
        workers: writer processes (at most one per partition is started).
        inactivity_timeout: stop every writer and raise :class:`ConvertError`
            when none reports progress for this many seconds (``None``: never).
    """

    workers: int
    inactivity_timeout: float | None = 900.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1 for the local engine, got {self.workers}")
        Deadline(self.inactivity_timeout)  # validates it

    def run(self, tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
        """Yield ``(task, PartitionResult or exception)`` as partitions finish."""
        queue = collections.deque(tasks)
        busy: dict[Child, PartitionTask] = {}
        idle: list[Child] = []
        deadline = Deadline(self.inactivity_timeout)
        stopped = False
        try:
            while queue or busy:
                while queue and len(busy) < self.workers:
                    task = queue.popleft()
                    child, failed = self._hand_over(idle.pop() if idle else None, task)
                    if failed is not None:
                        idle.append(child)
                        yield task, failed
                    else:
                        busy[child] = task
                if not busy:
                    continue
                ready = wait([c.conn for c in busy], timeout=deadline.poll(_POLL_S))
                for child in [c for c in busy if c.conn in ready]:
                    try:
                        msg = child.conn.recv()
                    except (EOFError, OSError):
                        task = busy.pop(child)
                        yield task, self._died(child, task)
                        continue
                    deadline.touch()
                    if msg[0] == "progress":
                        report(*msg[1])
                        continue
                    task = busy.pop(child)
                    idle.append(child)
                    if msg[0] == "done":
                        yield task, msg[1]
                    else:
                        yield task, unpack_exception(msg[1], ConvertError)
                if deadline.expired():
                    stopped = True
                    stop_all([*busy, *idle], f"no progress for {self.inactivity_timeout:.0f} s")
                    raise ConvertError(
                        f"no progress for {self.inactivity_timeout:.0f} s from the writer "
                        f"processes; stopped them ({len(busy) + len(queue)} partition(s) "
                        "unfinished; rerun to resume)"
                    )
        except BaseException as exc:
            if not stopped:
                # Ctrl-C is the user's own doing: the caller reports it in one line.
                quiet = isinstance(exc, (KeyboardInterrupt, GeneratorExit))
                why = "interrupted" if quiet else f"stopping on {type(exc).__name__}"
                stop_all([*busy, *idle], why, level=logging.DEBUG if quiet else logging.WARNING)
                stopped = True
            raise
        finally:
            if not stopped:
                for child in idle:
                    child.send(None)
                stop_all(idle, "asked to exit", join=_JOIN_S)

    @staticmethod
    def _hand_over(child: Child | None, task: PartitionTask) -> tuple[Child, Exception | None]:
        """Send ``task`` to ``child`` (or a new writer if that one died idle); the
        writer, and the error if the task cannot be pickled."""
        for _ in range(2):
            if child is None:
                child = Child(_ENTRY, what="writer process")
            try:
                child.conn.send(task)
            except OSError:  # it died while idle: a fresh one takes the task
                child.stop("its connection broke")
                child = None
                continue
            except Exception as exc:  # a source that does not pickle
                return child, ConvertError(
                    f"partition {task.index} cannot be sent to a writer process: "
                    f"{type(exc).__name__}: {exc}"
                )
            return child, None
        raise ConvertError("writer processes die as soon as they start; see the log above")

    @staticmethod
    def _died(child: Child, task: PartitionTask) -> ConvertError:
        reason = child.reason()
        log.warning(
            "writer process %d died (%s) converting partition %d", child.pid, reason, task.index
        )
        child.conn.close()
        return ConvertError(
            f"partition {task.index}: its writer process died ({reason}); out of memory, or killed?"
        )
