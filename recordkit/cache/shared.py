"""The cache's small types: its events protocol, its status, what a filler is told, and
what the cache's parts share (its budget rules, the wake-up of its waiting threads)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from ..format.manifest import ShardInfo

__all__ = ["Budget", "CacheEvents", "CacheStatus", "FillContext", "NoEvents", "Wakeup"]


class CacheEvents(Protocol):
    """What a cache reports as it works (the CLI shows it with tqdm; tests check budgets).

    Every method may be called from a fill worker thread; keep them quick.
    """

    def downloaded(self, nbytes: int) -> None:
        """``nbytes`` more arrived from the remote."""
        return None

    def published(self, shard: ShardInfo, used: int) -> None:
        """``shard`` became visible; ``used`` is the cache's size right after."""
        return None

    def evicted(self, path: str) -> None:
        """A shard was removed to make room."""
        return None


class NoEvents(CacheEvents):
    """Events that go nowhere (the default): the protocol's methods."""


@dataclass(slots=True)
class Budget:
    """The rules a cache fills and evicts by, one object shared by the cache's parts
    (so that events set after the cache is made, as the command line does, reach them).

    Attributes:
        max_bytes: the disk budget.
        policy: the eviction policy (``"consumed-lru"`` or ``"lru"``).
        events: where publishes, evictions and downloaded bytes are reported.
    """

    max_bytes: int
    policy: str
    events: CacheEvents


class Wakeup:
    """How one process's threads of a cache tell each other that something changed.

    Attributes:
        cv: the condition the cache's waiting threads wait on, notified when a fill
            worker finishes a step (snapshots waiting for shards wake up).
        gen: bumped by every :meth:`notify`.
        wake: set to wake idle fill workers.
    """

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.gen = 0
        self.wake = threading.Event()

    def notify(self) -> None:
        """Something in this process freed room (a release, a consumption): look again."""
        with self.cv:
            self.gen += 1
        self.wake.set()


@dataclass(frozen=True, slots=True)
class FillContext:
    """What a filler knows of the cache it fills.

    Attributes:
        remote_url: the remote (or the raw source in producer mode).
        storage_options: fsspec options for it.
        max_bytes: the cache's budget.
        fill_workers: the number of fill threads (0: fill in the calling thread).
        chunk_bytes: the size of each ranged read.
    """

    remote_url: str
    storage_options: dict[str, Any] | None
    max_bytes: int
    fill_workers: int
    chunk_bytes: int


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """A cache directory at one moment (``recordkit cache status``).

    Attributes:
        root: the cache directory.
        remote: the remote URL the cache was filled from (``None`` if never).
        max_bytes: the budget last configured (``None`` if unknown).
        used: bytes counted against the budget.
        complete: complete shards present.
        remote_shards: shards the remote lists (``None`` if unknown).
        downloading: reservations of downloads in progress.
        pinned: shards pinned by live readers.
        orphans: temp files and half-evicted indexes awaiting gc.
        mode: ``"shards"`` (copies of a remote dataset's shards) or
            ``"producer"`` (shards converted from raw samples).
        format: the converter of producer mode (``None`` in shard mode).
        bookkeeping: bytes of the cache's own files under ``.recordkit-cache/``
            (the state database and its WAL, the catalog, lock and claim files);
            part of ``used``.
    """

    root: str
    remote: str | None
    max_bytes: int | None
    used: int
    complete: int
    remote_shards: int | None
    downloading: int
    pinned: int
    orphans: int
    mode: str = "shards"
    format: str | None = None
    bookkeeping: int = 0
