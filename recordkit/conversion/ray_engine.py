"""The Ray engine: partitions run as Ray tasks, on a cluster or on a Ray started for the run.

The tasks are the engines' own (:func:`~recordkit.conversion.partition.run_partition`
on a :class:`PartitionTask`), so the output is byte-identical to the local engine's.
Which Ray runs them:

1. ``address`` given (``ray://head:10001``, ``head:6379``, ``auto``): that
   cluster; this process connects for the run and disconnects after it;
2. else the Ray this process is already connected to (the caller ran
   ``ray.init``, with the ``runtime_env`` it wants): it is used and left connected;
3. else the ``RAY_ADDRESS`` environment variable (``ray job submit`` sets it for
   its driver): as 1;
4. else a local Ray of ``workers`` CPUs is started (never one found running on
   this machine: ``address="local"``) and shut down after the run.

Ray retries a task whose worker died (``task_retries`` times); a retry rewrites
the same names with the same bytes, and the run removes what the dead attempt
left before it publishes the manifest. An exception raised in a task comes back
as the local engine's do: its own type with its notes, or a :class:`ConvertError`
with its summary and notes when it cannot be pickled; its ``__cause__`` is the
remote traceback. Progress arrives once per finished partition, as with Dask.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._deps import require
from .._procs import RemoteTraceback, pack_exception
from ..errors import ConvertError, add_note
from .partition import PartitionResult, PartitionTask, Reporter, run_partition

__all__ = ["RayEngine"]

log = logging.getLogger(__name__)

Outcome = tuple[PartitionTask, Any]

# After the run stops early (an error, Ctrl-C): how long unfinished tasks, cancelled, are
# given to end before the destination's lease is released.
_CANCEL_WAIT_S = 10.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True, slots=True)
class RayEngine:
    """Run the tasks as Ray tasks (one CPU each); see the module doc for which Ray.

    Args:
        address: the Ray cluster to connect to (``ray://head:10001`` through Ray
            Client, ``head:6379`` from a node of the cluster, ``auto``); ``None``:
            this process's Ray, else ``RAY_ADDRESS``, else a local Ray started for the run.
        workers: the CPUs of a local Ray started for the run (tasks at once).
        task_retries: Ray retries of a task whose worker died (an exception
            raised by the partition is not retried: transient remote errors are
            already retried inside it, and a data error would fail again).
    """

    address: str | None = None
    workers: int = 1
    task_retries: int = 2

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1 for the Ray engine, got {self.workers}")
        if self.task_retries < 0:
            raise ValueError(f"task_retries must be >= 0, got {self.task_retries}")
        if self.address is not None:
            check_address("ray", self.address)

    def run(self, tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
        """Yield ``(task, PartitionResult or exception)`` as partitions finish."""
        ray = require("ray", extra="ray")
        connected = self._connect(ray)
        try:
            yield from self._run(ray, tasks, report)
        finally:
            if connected:
                ray.shutdown()

    def _connect(self, ray: Any) -> bool:
        """Connect to the Ray the module doc says; whether this call connected (and so
        disconnects after the run)."""
        if ray.is_initialized():
            if self.address is not None:
                raise ConvertError(
                    f"this process is already connected to Ray (ray.init was called), so it "
                    f"cannot connect to {self.address!r}: leave the address out to run on "
                    "that Ray, or call ray.shutdown() first"
                )
            log.info("running the partitions on the Ray this process is connected to")
            return False
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address:
            if self.address is None:
                check_address("ray", address, "RAY_ADDRESS")
            log.info("connecting to the Ray cluster at %s", address)
            ray.init(address=address)
        else:
            log.info("starting a local Ray with %d CPU(s) for the run", self.workers)
            ray.init(address="local", num_cpus=self.workers, include_dashboard=False)
        return True

    def _run(self, ray: Any, tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
        remote = ray.remote(_partition)
        refs: dict[Any, PartitionTask] = {}
        for t in tasks:
            name = f"recordkit-convert-{t.fingerprint[:12]}-{t.index:05d}"
            options = remote.options(num_cpus=1, max_retries=self.task_retries, name=name)
            refs[options.remote(t)] = t
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    task = refs[ref]
                    try:
                        result: PartitionResult = ray.get(ref)
                    except Exception as exc:
                        yield task, self._failure(ray, task, exc)
                        continue
                    report(result.items, result.size, result.records)
                    yield task, result
        finally:
            if pending:  # stopped early: the tasks must not write on after the lease goes
                log.warning("cancelling %d unfinished Ray task(s)", len(pending))
                for ref in pending:
                    ray.cancel(ref, force=True)
                _, left = ray.wait(pending, num_returns=len(pending), timeout=_CANCEL_WAIT_S)
                if left:
                    log.warning("%d cancelled Ray task(s) still running", len(left))

    def _failure(self, ray: Any, task: PartitionTask, exc: Exception) -> Exception:
        """What ``ray.get`` raised for ``task``, as the local engine reports it."""
        errors = ray.exceptions
        if isinstance(exc, errors.RayTaskError):
            cause = exc.cause
            if isinstance(cause, Exception) and not isinstance(cause, errors.RayError):
                # ray.get raises a copy that is also of the cause's class; its text is
                # the remote traceback (coloured for a terminal).
                text = getattr(exc, "traceback_str", None) or str(exc)
                cause.__cause__ = RemoteTraceback(_ANSI.sub("", str(text)))
                return cause
        died = (errors.WorkerCrashedError, errors.NodeDiedError, errors.OutOfMemoryError)
        if isinstance(exc, died):
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            tries = self.task_retries + 1
            return ConvertError(
                f"partition {task.index}: its Ray worker died ({why}), "
                f"{tries} time{'s' if tries > 1 else ''}; out of memory, or killed?"
            )
        err = ConvertError(f"partition {task.index} failed on Ray: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err


def _partition(task: PartitionTask) -> PartitionResult:
    """In a Ray worker: :func:`run_partition`; an exception that cannot cross to the
    driver (it does not pickle) crosses as a :class:`ConvertError` with its summary and
    notes, as from the local engine's writers."""
    try:
        return run_partition(task)
    except Exception as exc:
        blob, summary, notes, _ = pack_exception(exc)
        if blob is not None:
            raise
        portable = ConvertError(summary)
        for note in notes:
            add_note(portable, note)
        raise portable from exc


def check_address(engine: str, address: str, where: str = "scheduler") -> None:
    """Refuse a cluster address meant for the other engine (``ValueError`` naming it)."""
    if engine == "ray" and address.startswith(("tcp://", "tls://")):
        raise ValueError(
            f"{where}={address!r} is a Dask scheduler's address; a Ray cluster's is "
            "ray://HEAD:10001, HEAD:6379 or auto (or use engine='dask')"
        )
    if engine == "dask" and address.startswith("ray://"):
        raise ValueError(
            f"{where}={address!r} is a Ray cluster's address; a Dask scheduler's is "
            "tcp://HOST:8786 (or use engine='ray')"
        )
