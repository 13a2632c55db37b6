"""Engines run partition tasks: a local process pool (default) or a Dask cluster.

Both run the same :func:`~recordkit.convert.partition.run_partition` on the same
tasks, so their output is byte-identical. An engine yields ``(task, result or
exception)`` as partitions finish and forwards progress to a callback; it
never stops at the first failure, so all failures can be reported together.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import logging
import multiprocessing
import os
import queue as queue_mod
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._errors import ConvertError
from .partition import PartitionResult, PartitionTask, Reporter, run_partition

__all__ = ["run_dask", "run_inline", "run_local"]

log = logging.getLogger(__name__)

Outcome = tuple[PartitionTask, "PartitionResult | BaseException"]

# Progress messages are batched: at most one per this many seconds per worker.
_REPORT_EVERY_S = 0.2


def run_inline(tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
    """Run the tasks one by one in this process (``workers=0``: debugging, tests)."""
    for task in tasks:
        try:
            yield task, run_partition(task, report)
        except Exception as exc:
            yield task, exc


# --- the local process pool -------------------------------------------------------------

_queue: Any = None  # set in each worker by _init_worker


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (a killed parent leaves no orphans)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:  # elsewhere (and as a second line): poll the parent
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="recordkit-parent-watch", daemon=True).start()


def _init_worker(progress_queue: Any, parent: int, level: int) -> None:
    global _queue
    _queue = progress_queue
    # Ctrl-C reaches the whole process group: the parent stops the workers (SIGTERM);
    # a KeyboardInterrupt traceback from each of them would bury its one-line summary.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s[%(process)d]: %(message)s")


class _QueueReporter:
    """Sums progress and sends it to the parent every ``_REPORT_EVERY_S``."""

    def __init__(self) -> None:
        self.pending = [0, 0, 0]
        self.last = time.monotonic()

    def __call__(self, items: int, size: int, records: int) -> None:
        self.pending = [self.pending[0] + items, self.pending[1] + size, self.pending[2] + records]
        if time.monotonic() - self.last >= _REPORT_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if any(self.pending) and _queue is not None:
            _queue.put(tuple(self.pending))
        self.pending = [0, 0, 0]
        self.last = time.monotonic()


def _run_in_worker(task: PartitionTask) -> PartitionResult:
    reporter = _QueueReporter()
    try:
        return run_partition(task, reporter)
    finally:
        reporter.flush()


def _stop_workers(pool: cf.ProcessPoolExecutor, level: int = logging.WARNING) -> None:
    """terminate -> join -> kill, with a log line at each step."""
    procs = list(getattr(pool, "_processes", {}).values())  # no public handle on them
    log.log(level, "stopping %d writer process(es): terminate", len(procs))
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    if alive:
        log.warning("%d writer process(es) ignored SIGTERM: kill", len(alive))
        for p in alive:
            with contextlib.suppress(Exception):
                p.kill()
            p.join(5.0)
    pool.shutdown(wait=False, cancel_futures=True)


def run_local(
    tasks: Sequence[PartitionTask],
    report: Reporter,
    *,
    workers: int,
    inactivity_timeout: float | None,
) -> Iterator[Outcome]:
    """Run the tasks in ``workers`` spawned writer processes.

    Each worker builds its own filesystem and reads its own samples; only tasks
    (item lists) go in and shard lists come out. Workers die with this process
    (``PR_SET_PDEATHSIG`` on Linux, a parent watch elsewhere). If no progress
    arrives for ``inactivity_timeout`` seconds the workers are stopped and a
    :class:`ConvertError` is raised.
    """
    ctx = multiprocessing.get_context("spawn")
    progress: Any = ctx.Queue()
    level = logging.getLogger("recordkit").getEffectiveLevel()
    pool = cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_init_worker,
        initargs=(progress, os.getpid(), level),
    )
    stopped = False
    try:
        pending = {pool.submit(_run_in_worker, t): t for t in tasks}
        last = time.monotonic()
        while pending:
            done, _ = cf.wait(pending, timeout=0.25, return_when=cf.FIRST_COMPLETED)
            while True:
                try:
                    delta = progress.get_nowait()
                except queue_mod.Empty:
                    break
                report(*delta)
                last = time.monotonic()
            for future in done:
                task = pending.pop(future)
                last = time.monotonic()
                exc = future.exception()
                yield task, (exc if exc is not None else future.result())
            if inactivity_timeout is not None and time.monotonic() - last > inactivity_timeout:
                stopped = True
                _stop_workers(pool)
                raise ConvertError(
                    f"no progress for {inactivity_timeout:.0f} s from the writer processes; "
                    f"stopped them ({len(pending)} partition(s) unfinished; rerun to resume)"
                )
    except BaseException as exc:
        if not stopped:
            # Ctrl-C is the user's own doing: the caller reports it in one line.
            interrupted = isinstance(exc, KeyboardInterrupt)
            _stop_workers(pool, logging.DEBUG if interrupted else logging.WARNING)
            stopped = True
        raise
    finally:
        if not stopped:
            pool.shutdown(wait=True)
        progress.close()
        progress.join_thread()


# --- Dask -------------------------------------------------------------------------------


def run_dask(
    tasks: Sequence[PartitionTask],
    report: Reporter,
    *,
    scheduler: str | None,
    workers: int,
    task_retries: int = 2,
    cluster_factory: Callable[[], Any] | None = None,
) -> Iterator[Outcome]:
    """Run the tasks on a ``dask.distributed`` cluster.

    Args:
        tasks: the partitions to run.
        report: progress callback (called once per finished partition).
        scheduler: a scheduler address (``tcp://host:8786``); ``None`` starts a
            ``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1.
        workers: the LocalCluster's size when no scheduler is given.
        task_retries: Dask retries of a task whose worker died or that raised.
    """
    from .._deps import require

    distributed = require("distributed", extra="dask")
    cluster = None
    if scheduler is None:
        cluster = (cluster_factory or (lambda: _local_cluster(distributed, workers)))()
        client = distributed.Client(cluster)
    else:
        client = distributed.Client(scheduler, timeout="30s")
    try:
        futures = {}
        for t in tasks:
            key = f"recordkit-convert-{t.fingerprint[:12]}-{t.index:05d}"
            future = client.submit(run_partition, t, key=key, retries=task_retries, pure=False)
            futures[future] = t
        for future in distributed.as_completed(futures):
            task = futures[future]
            try:
                result = future.result()
            except Exception as exc:
                yield task, exc
                continue
            report(result.items, result.size, result.records)
            yield task, result
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _local_cluster(distributed: Any, workers: int) -> Any:
    return distributed.LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    )
