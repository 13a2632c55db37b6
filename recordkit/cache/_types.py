"""The cache's small types: its events protocol, its status, and the filler seam."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..format.manifest import Manifest, ShardInfo

if TYPE_CHECKING:
    from ._locks import HeldFile

__all__ = ["CacheEvents", "CacheStatus", "Filler", "NoEvents"]


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


class Filler(Protocol):
    """How a cache's entries are listed and filled: shard mode or producer mode.

    A filler's :meth:`fill` stages the entry into the lease's temp names
    (``_fill.staged_names``), never past the lease's bytes, and publishes it
    through ``ShardCache._publish``; the cache has reserved the room before.
    """

    mode: str
    retriable: tuple[type[BaseException], ...]

    def catalog(self) -> list[ShardInfo]:
        """The entries the cache may hold, in dataset order."""

    def need(self, info: ShardInfo, state: dict[str, Any]) -> int:
        """The bytes to reserve before filling ``info``."""

    def fill(self, info: ShardInfo, lease: HeldFile) -> None:
        """Stage and publish ``info`` within ``lease``; ``retriable`` errors retry later."""

    def keep(self, info: ShardInfo | None, size: int, meta: dict[str, Any]) -> bool:
        """Whether a complete shard found in the directory still belongs (gc)."""

    def snapshot_manifest(self, shards: list[ShardInfo]) -> Manifest | None:
        """The manifest readers get with a snapshot of ``shards`` (its schema)."""

    def close(self) -> None:
        """Release what filling holds (writer processes)."""


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
