"""Opening several shards at once, on a pool of threads (``ShardSet.acquire_many``).

A shard's first open loads its index: the text read, parsed in C without the GIL,
checked. A reader's first task of a shuffle touches many shards at once, so their
opens run side by side on this process's pool (one per process: a forked child
makes its own).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .mapped import MappedShard

__all__ = ["PARALLEL_MIN_RECORDS", "open_all"]

PARALLEL_MIN_RECORDS = 16384
"""Shards of at least this many records are opened on the pool when a reader needs
several at once (``ShardSet.acquire_many``): their index text takes ~0.1 ms or more
to parse, more than handing the work to a thread costs."""

# Shards opened together (ShardSet.acquire_many) are opened on this many threads: the
# CPUs this process may use (an index parse is CPU work), at most _OPEN_THREADS.
_OPEN_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _opener() -> ThreadPoolExecutor:
    """The process's pool of shard-opening threads (a forked child makes its own)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            try:
                cpus = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cpus = os.cpu_count() or 1
            _pool = ThreadPoolExecutor(
                max_workers=max(2, min(cpus, _OPEN_THREADS)), thread_name_prefix="recordkit-open"
            )
            _pool_pid = os.getpid()
        return _pool


def open_all(
    open_one: Callable[[int], MappedShard],
    settle: Callable[[dict[int, MappedShard | None]], None],
    ids: Sequence[int],
) -> tuple[dict[int, MappedShard], BaseException | None]:
    """Shards ``ids`` opened by ``open_one`` on the pool's threads: those opened, and
    the first failure in ``ids`` order (``None`` if none).

    Every open is waited for, even after one fails or the caller is interrupted
    (no thread is left opening a map nobody will close); an interrupted caller
    closes what was opened and re-raises.
    """
    pool = _opener()
    futures = [(i, pool.submit(open_one, i)) for i in ids]
    opened: dict[int, MappedShard] = {}
    failure: BaseException | None = None
    try:
        for i, future in futures:
            try:
                opened[i] = future.result()
            except Exception as exc:  # each open has its own outcome
                if failure is None:
                    failure = exc
    except BaseException:  # interrupted while waiting: finish, let go, re-raise
        concurrent.futures.wait([f for _, f in futures])
        for _, future in futures:
            if not future.cancelled() and future.exception() is None:
                future.result().close()
        settle(dict.fromkeys(ids))  # whoever waits for these opens is told they failed
        raise
    return opened, failure


def _after_fork_in_child() -> None:
    global _pool_lock
    _pool_lock = threading.Lock()  # a parent's thread may have held it; the pool is remade


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
