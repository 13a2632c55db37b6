"""Growing epochs through the shard cache (``CacheOptions(epochs="growing")``).

:class:`CacheEpochs`: at the start of each epoch it takes the shards the cache holds
complete (a :class:`~recordkit.cache.Snapshot`, so they stay pinned while they are
read), agrees on them with the other ranks, and lets them go as the reader is done
with them; it says at WARNING how much of the dataset the epoch reads.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..format.manifest import Manifest, ShardInfo

if TYPE_CHECKING:
    from ..cache import ShardCache, Snapshot

__all__ = ["Agree", "CacheEpochs", "EpochShards"]

# The one documented logger of reading through the cache (docs/cache.md), both modes.
log = logging.getLogger("recordkit.reader.epochs")

# Given every rank's shard paths, the ones all ranks have (see recordkit.torch).
Agree = Callable[[list[str]], set[str]]


@dataclass(frozen=True)
class EpochShards:
    """The shards one epoch reads: relative paths under ``root``, in dataset order."""

    epoch: int
    root: str
    manifest: Manifest | None
    infos: tuple[ShardInfo, ...]

    @property
    def paths(self) -> list[str]:
        """The shards' absolute paths."""
        return [os.path.join(self.root, info.path) for info in self.infos]


class CacheEpochs:
    """Takes each epoch's shards from a :class:`~recordkit.cache.ShardCache`.

    Args:
        cache: a started cache (or a reader-only one).
        timeout: seconds an epoch start waits for a first complete shard.
        owned: stop the cache when this object is garbage collected or closed.
        agree: for several ranks, returns the shard paths every rank holds.

    Attributes:
        current: the epoch taken last, until :meth:`let_go`.
    """

    def __init__(
        self,
        cache: ShardCache,
        *,
        timeout: float | None,
        owned: bool = False,
        agree: Agree | None = None,
    ) -> None:
        self.cache = cache
        self.timeout = timeout
        self.owned = owned
        self.agree = agree
        self.current: EpochShards | None = None
        self._snap: Snapshot | None = None
        if owned:
            self._stop = weakref.finalize(self, cache.stop)

    @property
    def root(self) -> str:
        return str(self.cache.root)

    def take(self, epoch: int, shards: Sequence[str] | None = None) -> EpochShards:
        """Pin and return epoch ``epoch``'s shards (the last epoch's are let go first);
        ``shards``: exactly these (a resume), the cache fetching any it lacks first."""
        self.let_go()  # with a full budget, this epoch's shards may have to displace them
        snap = self.cache.snapshot(epoch, shards=shards, timeout=self.timeout)
        have = [info.path for info in snap.shards]
        agreed = set(have) if self.agree is None else self.agree(have)
        infos = tuple(info for info in snap.shards if info.path in agreed)
        for info in snap.shards:
            if info.path not in agreed:
                snap.release(info)
        self._snap = snap
        self.current = EpochShards(epoch, self.root, snap.manifest, infos)
        self._say(epoch, infos)
        return self.current

    def _say(self, epoch: int, infos: Sequence[ShardInfo]) -> None:
        """How much of the dataset this epoch reads: WARNING while it is a part.

        WARNING, because a partial epoch is the one thing a user of the default
        settings must see (Python's root logger shows WARNING and above when
        logging is not configured); INFO once the epoch reads everything.
        """
        catalog = self.cache.catalog()
        records = sum(i.records for i in infos)
        if self.cache.manifest is not None:  # counts known up front
            total = sum(i.records for i in catalog)
            share = records / total if total else 1.0
        else:
            share = len(infos) / len(catalog) if catalog else 1.0
        level = logging.INFO if len(infos) >= len(catalog) else logging.WARNING
        log.log(
            level,
            "epoch %d reads %d of %d shards (%d%%, %s records) from the cache %s "
            "(growing epochs: each epoch reads the shards cached when it starts)",
            epoch,
            len(infos),
            len(catalog),
            int(share * 100),
            f"{records:,}",
            self.root,
        )

    def mark_consumed(self, shard: ShardInfo | str, *, release: bool = False) -> None:
        """This epoch is done with ``shard`` (evicted first); ``release`` unpins it too."""
        if self._snap is not None:
            self._snap.mark_consumed(shard, release=release)

    def releaser(
        self, last_unit: np.ndarray, start: int, unmap: Callable[[int], None]
    ) -> Callable[[int], None]:
        """A callback for each unit read: unmaps and lets go of each shard read to its end.

        Args:
            last_unit: for each shard of :attr:`current`, the last unit that reads
                it (-1 for none).
            start: the first unit of this pass (a resume point); shards done before
                it are let go now.
            unmap: unmaps shard ``i`` (before it is unpinned: an evicted file is
                never still mapped).
        """
        current = self.current
        assert current is not None
        order = iter(np.argsort(last_unit, kind="stable").tolist())
        pending = [next(order, None)]

        def release(unit: int) -> None:  # every shard whose last unit is <= unit
            while pending[0] is not None and last_unit[pending[0]] <= unit:
                unmap(pending[0])
                self.mark_consumed(current.infos[pending[0]], release=True)
                pending[0] = next(order, None)

        release(start - 1)  # shards this rank does not read, or read before a resume point
        return release

    def let_go(self) -> None:
        """Unpin the current epoch's shards."""
        if self._snap is not None:
            self._snap.close()
            self._snap = None
        self.current = None

    def close(self) -> None:
        """Let go, and stop the cache if this object made it."""
        self.let_go()
        if self.owned:
            self._stop()

    def __getstate__(self) -> Any:
        raise TypeError("CacheEpochs stays in the process that reads the cache")
