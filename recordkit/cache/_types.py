"""The cache's small types: its events protocol, its status, what a filler is told."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..format.manifest import ShardInfo

__all__ = ["CacheEvents", "CacheStatus", "FillContext", "NoEvents"]


class CacheEvents(Protocol):
    """What a cache reports as it works (the CLI shows it with tqdm; tests check budgets).

    Every method may be called from a fill worker thread; keep them quick.
    """

    def downloaded(self, nbytes: int) -> None:
        """``nbytes`` more arrived from the remote."""

    def published(self, shard: ShardInfo, used: int) -> None:
        """``shard`` became visible; ``used`` is the cache's size right after."""

    def evicted(self, path: str) -> None:
        """A shard was removed to make room."""


class NoEvents:
    """Events that go nowhere (the default)."""

    def downloaded(self, nbytes: int) -> None:
        pass

    def published(self, shard: ShardInfo, used: int) -> None:
        pass

    def evicted(self, path: str) -> None:
        pass


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
