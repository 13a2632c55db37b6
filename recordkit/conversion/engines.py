"""Engines run partition tasks: in this process, in local writer processes, on Dask or Ray.

Every engine runs the same :func:`~recordkit.conversion.partition.run_partition`
on the same tasks, so their output is byte-identical. An engine yields
``(task, PartitionResult or exception)`` as partitions finish and forwards
progress to a callback; it never stops at the first failure, so every failure
can be reported together. A writer that dies is an exception for its own
partition (a :class:`ConvertError` that says so), never a hang.

The engines are :class:`InlineEngine` (``workers=0``: in this process, for debugging,
tests and ``memory://`` URLs), :class:`~recordkit.conversion.pool.LocalEngine` (the
default), :class:`DaskEngine` and :class:`~recordkit.conversion.ray_engine.RayEngine`;
:func:`make_engine` picks one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .partition import PartitionTask, Reporter, run_partition
from .pool import LocalEngine
from .ray_engine import RayEngine, check_address

__all__ = [
    "ENGINES",
    "DaskEngine",
    "Engine",
    "InlineEngine",
    "LocalEngine",
    "RayEngine",
    "make_engine",
]

#: The engine names :func:`recordkit.conversion` takes.
ENGINES = ("local", "dask", "ray")
#: The engines whose workers run in other processes, maybe on other machines.
CLUSTERS = ("dask", "ray")

Outcome = tuple[PartitionTask, Any]

log = logging.getLogger("recordkit.conversion")


class Engine(Protocol):
    """Runs partition tasks; see the module doc."""

    def run(self, tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
        """Yield ``(task, PartitionResult or exception)`` as each partition finishes;
        ``report(items, source_bytes, records)`` receives progress meanwhile."""
        ...


@dataclass(frozen=True, slots=True)
class InlineEngine:
    """Run the tasks one by one in this process (``workers=0``)."""

    def run(self, tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
        """See :class:`Engine`."""
        for task in tasks:
            try:
                yield task, run_partition(task, report)
            except Exception as exc:
                yield task, exc


@dataclass(frozen=True, slots=True)
class DaskEngine:
    """Run the tasks on a ``dask.distributed`` cluster.

    Args:
        scheduler: a scheduler address (``tcp://host:8786``); ``None`` starts a
            ``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1.
        workers: the LocalCluster's size when no scheduler is given.
        task_retries: Dask retries of a task whose worker died or that raised.
        cluster_factory: makes the cluster instead (tests).
    """

    scheduler: str | None = None
    workers: int = 1
    task_retries: int = 2
    cluster_factory: Callable[[], Any] | None = None

    def run(self, tasks: Sequence[PartitionTask], report: Reporter) -> Iterator[Outcome]:
        """See :class:`Engine`; progress arrives once per finished partition."""
        from .._deps import require

        distributed = require("distributed", extra="dask")
        cluster = None
        if self.scheduler is None:
            factory = self.cluster_factory or (lambda: _local_cluster(distributed, self.workers))
            cluster = factory()
            client = distributed.Client(cluster)
        else:
            client = distributed.Client(self.scheduler, timeout="30s")
        try:
            futures = {}
            for t in tasks:
                key = f"recordkit-convert-{t.fingerprint[:12]}-{t.index:05d}"
                future = client.submit(
                    run_partition, t, key=key, retries=self.task_retries, pure=False
                )
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


def make_engine(
    name: str,
    *,
    workers: int | None,
    scheduler: str | None = None,
    inactivity_timeout: float | None = 900.0,
    urls: Sequence[str] = (),
) -> Engine:
    """The engine for ``convert(engine=name, workers=..., ...)``.

    ``"dask"`` is a :class:`DaskEngine` (``workers`` sizes a LocalCluster when
    no scheduler is given); ``"ray"`` a :class:`RayEngine` whose address is
    ``scheduler`` (``workers`` sizes a local Ray when it starts one);
    ``"local"`` is an :class:`InlineEngine` for ``workers=0`` (and whenever one of
    ``urls``, the run's source and destination, is ``memory://``, which other processes
    cannot see) and a :class:`LocalEngine` otherwise. ``workers=None``: ``os.cpu_count()``.
    """
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    in_memory = [u for u in urls if u.startswith("memory://")]
    if in_memory and name in CLUSTERS:
        raise ValueError(
            f"{in_memory[0]} lives in this process; {name.capitalize()} workers cannot see it"
        )
    if in_memory and workers:
        log.info("%s lives in this process: converting in it (workers=0)", in_memory[0])
        workers = 0
    if scheduler is not None:
        if name not in CLUSTERS:
            raise ValueError(
                f"scheduler={scheduler!r} is a cluster's address; it needs engine='dask' "
                f"or engine='ray', not {name!r}"
            )
        check_address(name, scheduler)
    if name in CLUSTERS:  # a missing extra is said before anything is written
        _installed(*{"dask": ("distributed", "dask"), "ray": ("ray", "ray")}[name])
    if name == "dask":
        return DaskEngine(scheduler=scheduler, workers=max(1, workers))
    if name == "ray":
        return RayEngine(address=scheduler, workers=max(1, workers))
    if workers == 0:
        return InlineEngine()
    return LocalEngine(workers=workers, inactivity_timeout=inactivity_timeout)


def _installed(module: str, extra: str) -> None:
    """Raise :class:`MissingDependencyError` naming ``extra`` unless ``module`` can be
    imported (found, not imported: the engine imports it when it runs)."""
    from .._deps import require

    if importlib.util.find_spec(module) is None:
        require(module, extra=extra)
