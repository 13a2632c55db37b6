"""A reservation: room in the cache's budget for filling one entry.

What a filler (``fetch.Fetcher``, ``produce.Producer``) gets instead of the
cache: it stages into :attr:`Reservation.staged`, runs its writes through
:meth:`Reservation.stage` (a full disk evicts and retries once), may
:meth:`~Reservation.grow` the room, and ends with :meth:`~Reservation.publish`
— or leaves, and the cache releases the room and the temp files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..errors import CacheFullError, RecordkitError
from ..format.manifest import Manifest, ShardInfo
from .directory import CacheDir
from .locks import HeldFile
from .shared import Budget, CacheEvents
from .staged import Staged, discard, is_disk_full, staged_names

__all__ = ["Filler", "Reservation", "ShardState"]

_T = TypeVar("_T")


class Reservation:
    """Room for one entry, held until published or released.

    Args:
        directory: the cache directory.
        lease: the reservation's claim (its file holds the id, shard and bytes).
        rel: the entry, relative to the cache root.
        budget: the cache's budget, eviction policy, and events (where publishes,
            evictions and downloaded bytes are reported: :attr:`events`).
        capacity: the most one entry may take: the budget less the bookkeeping
            (and files that are not the cache's), when the room was reserved.
        abandoning: True once the cache is stopping and this fill may be given up.
    """

    def __init__(
        self,
        directory: CacheDir,
        lease: HeldFile,
        rel: str,
        budget: Budget,
        *,
        capacity: int,
        abandoning: Callable[[], bool],
    ) -> None:
        self._dir = directory
        self._lease = lease
        self.rel = rel
        self._budget = budget
        self.capacity = capacity
        self.abandoning = abandoning

    @property
    def events(self) -> CacheEvents:
        """Where publishes, evictions and downloaded bytes are reported."""
        return self._budget.events

    @property
    def id(self) -> str:
        """The reservation's id (temp files named after it count as reserved)."""
        return str(self._lease.content["id"])

    @property
    def bytes(self) -> int:
        """The room reserved now."""
        return int(self._lease.content["bytes"])

    @property
    def final(self) -> str:
        """The entry's absolute path once published."""
        return self._dir.path(self.rel)

    @property
    def staged(self) -> tuple[str, str]:
        """The temp names of the shard and its index."""
        return staged_names(self.final, self.id)

    def stage(self, work: Callable[[], _T]) -> _T:
        """``work()``; on a full disk (``ENOSPC``) evict shards the policy may displace
        and try once more, then give up with :class:`CacheFullError`."""
        for attempt in (1, 2):
            try:
                return work()
            except OSError as exc:
                if not is_disk_full(exc) or isinstance(exc, RecordkitError):
                    raise
                freed = attempt == 1 and self._dir.make_room(
                    self.bytes,
                    max_bytes=self._budget.max_bytes,
                    policy=self._budget.policy,
                    on_evict=self.events.evicted,
                )
                if not freed:
                    raise CacheFullError(
                        f"the disk under {self._dir.root} is full ({exc.strerror}) and "
                        "evicting unpinned shards did not free enough space",
                        path=self.rel,
                        needed=self.bytes,
                    ) from exc
        raise AssertionError("unreachable")

    def grow(self, nbytes: int) -> bool:
        """Enlarge the room to ``nbytes`` (evicting if needed); False if it cannot."""
        return self._dir.grow(
            self._lease,
            nbytes,
            max_bytes=self._budget.max_bytes,
            policy=self._budget.policy,
            on_evict=self.events.evicted,
        )

    def publish(self, staged: Staged, extra: dict[str, Any], *, crc32c: int | None) -> None:
        """Publish a staged shard (index first) in place of the reservation.

        ``extra`` goes into the shard's state next to its records and CRC32C;
        ``crc32c`` is what the published event reports (``None``: not known in advance).

        Raises:
            CacheFullError: its index made it larger than the room, and no room
                could be made (the staged files are removed).
        """
        total = staged.bytes + staged.index_bytes
        if not self.grow(total):
            discard((staged.shard, staged.index))
            raise CacheFullError(
                f"its index made it {total} bytes and no room could be made", path=self.rel
            )
        extra = {"records": staged.records, "crc32c": staged.crc32c, **extra}
        scan = self._dir.publish(self._lease, self.rel, staged.shard, staged.index, extra)
        info = ShardInfo(self.rel, staged.records, staged.bytes, crc32c)
        self.events.published(info, scan.used)

    def release(self) -> None:
        """Give the room back (a no-op after a publish)."""
        self._dir.release(self._lease)


class ShardState(Protocol):
    """What a filler may read of the cache's per-shard state (``store.Store``)."""

    def meta(self, rel: str) -> dict[str, Any]:
        """What is known of one shard: its history and what its publish recorded."""

    def max_ratio(self, plan: str) -> float | None:
        """The largest output/source ratio of the shards ``plan`` produced."""


class Filler(Protocol):
    """How a cache's entries are listed and filled: shard mode or producer mode.

    A filler's :meth:`fill` stages the entry into the reservation's temp names,
    never past its bytes, and publishes it through :meth:`Reservation.publish`;
    the cache has reserved the room before and releases it after.
    """

    mode: str
    retriable: tuple[type[BaseException], ...]

    def catalog(self) -> list[ShardInfo]:
        """The entries the cache may hold, in dataset order."""

    def need(self, info: ShardInfo, state: ShardState, capacity: int) -> int:
        """The bytes to reserve before filling ``info`` (``capacity``: the most one
        entry may take, the budget less the bookkeeping)."""

    def fill(self, info: ShardInfo, room: Reservation) -> None:
        """Stage and publish ``info`` within ``room``; ``retriable`` errors retry later."""

    def keep(self, info: ShardInfo | None, size: int, meta: dict[str, Any], path: str) -> bool:
        """Whether a complete shard found in the directory (at ``path``) still belongs (gc)."""

    def snapshot_manifest(self, shards: list[ShardInfo]) -> Manifest | None:
        """The manifest readers get with a snapshot of ``shards`` (its schema)."""

    def close(self) -> None:
        """Release what filling holds (writer processes)."""
