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

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..codec.schema import Schema
from ..convert import add_note
from ..format.framing import OVERHEAD
from ..retry import RetryPolicy, is_transient
from ..writer.shard import ShardWriter
from ._staged import Staged, discard, is_disk_full, staged_names

__all__ = ["OutgrewError", "ProduceTask", "WriterPool", "produce", "run_task"]

log = logging.getLogger(__name__)

# Progress crosses the pipe at most this often per writer.
_REPORT_EVERY_S = 0.2
# How often a fill thread waiting on its writer looks at the process and the clock.
_POLL_S = 0.25
# join -> terminate -> kill: seconds each step waits.
_STOP_WAIT_S = 5.0
# How often a writer checks that the cache's process is still there.
_PARENT_POLL_S = 0.5


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
        source: the ``converters.Source`` (its location and options, never samples).
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


class OutgrewError(Exception):
    """The partition's output would pass its reservation (it is redone with a larger one).

    Attributes:
        cap: the reservation it would have passed.
        items_done: source items fully written before that.
        source_done: their source bytes.
    """

    def __init__(self, cap: int, items_done: int, source_done: int) -> None:
        super().__init__(f"output would pass the reservation of {cap} bytes")
        self.cap, self.items_done, self.source_done = cap, items_done, source_done


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
    task: ProduceTask, schema: Schema, staged: tuple[str, str], report: Callable[[int], None]
) -> Staged:
    target = _StagedTarget(staged, task.fsync)
    writer = ShardWriter(target, os.path.basename(task.final), fsync=task.fsync)
    done = False
    try:
        index_bytes = source_done = 0
        for n, item in enumerate(task.items):
            try:
                for payload in task.source.records(item, schema):
                    framed = len(payload) + OVERHEAD
                    line = len(str(writer.bytes)) + len(str(framed)) + 2  # "offset size\n"
                    if writer.bytes + framed + index_bytes + line > task.cap:
                        raise OutgrewError(task.cap, n, source_done)
                    writer.write(payload)
                    index_bytes += line
            except OutgrewError:
                raise
            except Exception as exc:
                add_note(exc, f"while converting source item {item.key!r}")
                raise
            source_done += int(item.size)
            report(int(item.size))
        info = writer.publish()
        done = True
    finally:
        if not done:
            writer.discard()
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
    retry the whole partition after a backoff (the same bytes come out).

    Raises:
        OutgrewError: the output would pass ``task.cap`` (temp files removed).
        OSError: local write errors, ``ENOSPC`` among them (temp files removed).
        Exception: the source's own errors (``SchemaError``, ``SourceError``, ...).
    """
    staged = staged_names(task.final, task.lease_id)
    os.makedirs(os.path.dirname(task.final), exist_ok=True)
    schema = Schema.from_json(task.schema)

    def attempt() -> Staged:
        try:
            return _write(task, schema, staged, report)
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


def _watch_parent(parent: int) -> None:
    """Exit when the cache's process is gone (killed, even by SIGKILL): no orphan writes
    on. A poll, not ``PR_SET_PDEATHSIG``: that fires when the *thread* that started the
    process ends, and the cache's fill threads come and go while their writers are reused."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="recordkit-parent-watch", daemon=True).start()


def _writer_main() -> None:
    """A writer process (``python -c``): tasks in, outcomes out, until ``None`` or EOF.

    ``argv``: the parent's ``sys.path`` (JSON; set before this module is imported),
    the socket's file descriptor, the parent's pid, the log level.
    """
    from multiprocessing.connection import Connection

    fd, parent, level = (int(a) for a in sys.argv[2:5])
    _watch_parent(parent)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s[%(process)d]: %(message)s")
    conn = Connection(fd)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        progress = _PipeProgress(conn)
        outcome = run_task(task, progress)
        progress.flush()
        conn.send(outcome)


# -- the cache side: writer processes ---------------------------------------------------------

# Not multiprocessing's spawn: it runs the parent's ``__main__`` again in each child, and
# a training script without an ``if __name__ == "__main__":`` guard would then start its
# own training (and cache) in every writer. A writer needs only this module.
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from recordkit.cache._writer import _writer_main; _writer_main()"
)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


class _WriterProcess:
    """One writer process and the socket to it (a ``multiprocessing`` connection)."""

    def __init__(self, level: int) -> None:
        self.conn, child = multiprocessing.Pipe()
        fd = child.fileno()
        try:
            argv = [json.dumps(sys.path), str(fd), str(os.getpid()), str(level)]
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, *argv], pass_fds=(fd,))
        finally:
            child.close()
        self.pid = self.proc.pid
        log.debug("started writer process %d", self.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)

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
        try:
            self.conn.send(task)
        except OSError:
            return self._died()
        last = time.monotonic()
        while True:
            if self.conn.poll(_POLL_S):
                try:
                    msg: tuple[Any, ...] = self.conn.recv()
                except (EOFError, OSError):
                    return self._died()
                last = time.monotonic()
                if msg[0] != "progress":
                    return msg
                on_bytes(int(msg[1]))
            elif not self.alive():
                return self._died()
            elif abandon():
                self.stop("the cache is stopping")
                return ("abandoned",)
            elif timeout is not None and time.monotonic() - last > timeout:
                self.stop(f"no progress for {timeout:.0f} s")
                return ("silent", timeout)

    def _died(self) -> tuple[Any, ...]:
        self._join(_STOP_WAIT_S)
        reason = _exit_reason(self.proc.returncode)
        log.warning("writer process %d died (%s)", self.pid, reason)
        self.conn.close()
        return ("died", reason)

    def stop(self, why: str) -> None:
        """terminate -> join -> kill, with a log line at each step."""
        if self.alive():
            log.warning("writer process %d: %s: terminate", self.pid, why)
            self.proc.terminate()
            self._join(_STOP_WAIT_S)
        if self.alive():
            log.warning(
                "writer process %d ignored SIGTERM for %.0f s: kill", self.pid, _STOP_WAIT_S
            )
            self.proc.kill()
            self._join(_STOP_WAIT_S)
        self.conn.close()

    def close(self) -> None:
        """Ask the process to exit (join), then :meth:`stop` it if it does not."""
        if self.alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            log.debug("writer process %d: join", self.pid)
            self._join(_STOP_WAIT_S)
        self.stop(f"did not exit within {_STOP_WAIT_S:.0f} s")


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
            writer = _WriterProcess(logging.getLogger("recordkit").getEffectiveLevel())
            with self._lock:
                self._all.add(writer)
        outcome: tuple[Any, ...] = ("interrupted",)
        try:
            outcome = writer.run(task, on_bytes, timeout=timeout, abandon=abandon)
        finally:
            healthy = outcome[0] in ("done", "outgrew", "full", "error") and writer.alive()
            with self._lock:
                if healthy:
                    self._idle.append(writer)
                else:
                    self._all.discard(writer)
            if not healthy:
                writer.stop(f"its partition ended with {outcome[0]}")
        return outcome

    def close(self) -> None:
        """Stop every writer process (idle ones exit at once)."""
        with self._lock:
            writers = list(self._all)
            self._all.clear()
            self._idle.clear()
        for w in writers:
            w.close()
