"""What a reader gets at the start of an epoch: the complete shards, pinned."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ..format.manifest import Manifest, ShardInfo
from .directory import CacheDir
from .locks import HeldFile

__all__ = ["Snapshot"]


class Snapshot:
    """The complete shards of a cache at one moment, pinned until released.

    Made by :meth:`ShardCache.snapshot`. While a shard is pinned no process
    evicts it, so a reader can open (memory-map) every listed path. Release
    shards as soon as they are no longer mapped — :meth:`release` one,
    :meth:`close` all — so the filler can evict them to make room; a snapshot
    whose process dies releases its pins by itself.

    Attributes:
        root: the cache directory; shard paths are relative to it.
        epoch: the epoch this snapshot was taken for (``None``: not given).
        shards: the shards, in the remote dataset's order, as
            :class:`~recordkit.format.ShardInfo` (relative path, records,
            bytes, CRC32C — ``None`` for foreign TFRecords).
        manifest: the remote dataset's manifest (``None`` for foreign TFRecords).
    """

    def __init__(
        self,
        directory: CacheDir,
        shards: list[ShardInfo],
        pin: HeldFile,
        epoch: int | None,
        manifest: Manifest | None,
        notify: Callable[[], None],
    ) -> None:
        self._dir = directory
        self._notify = notify  # wakes the cache's fill workers: room may have been freed
        self._pin = pin
        self.root = directory.root
        self.epoch = epoch
        self.shards = shards
        self.manifest = manifest
        self._released: set[str] = set()

    @property
    def paths(self) -> list[str]:
        """Absolute local paths of the shards, in order."""
        return [self._dir.path(s.path) for s in self.shards]

    @property
    def schema_json(self) -> dict[str, Any] | None:
        """The schema in its JSON form (``recordkit.Schema.from_json``), if the remote has one."""
        return self.manifest.schema if self.manifest is not None else None

    @property
    def records(self) -> int:
        """The number of records in the snapshot's shards."""
        return sum(s.records for s in self.shards)

    def __len__(self) -> int:
        return len(self.shards)

    def fingerprint(self) -> str:
        """A short hash of the shard set, computed as ``ShardSet.fingerprint`` does."""
        h = hashlib.sha256()
        for s in self.shards:
            h.update(f"{s.path}\0{s.records}\0{s.bytes}\n".encode())
        return h.hexdigest()[:16]

    def _rel(self, shard: str | ShardInfo) -> str:
        if isinstance(shard, ShardInfo):
            return shard.path
        if os.path.isabs(shard):
            return os.path.relpath(shard, self.root).replace(os.sep, "/")
        return shard

    def mark_consumed(self, shard: str | ShardInfo, *, release: bool = False) -> None:
        """Record that this epoch has read ``shard`` (it becomes the first to evict).

        Args:
            shard: a listed shard (relative path, absolute path, or ShardInfo).
            release: also unpin it (do this only once it is no longer mapped).
        """
        rel = self._rel(shard)
        self._dir.touch([rel], epoch=self.epoch, consumed=True)
        if release:
            self.release(rel)
        self._notify()

    def release(self, shard: str | ShardInfo) -> None:
        """Unpin one shard (it may then be evicted; keep it pinned while it is mapped)."""
        rel = self._rel(shard)
        if rel not in self._released:
            self._released.add(rel)
            self._dir.unpin(self._pin, [rel])
            self._notify()

    def close(self) -> None:
        """Unpin every shard. Idempotent."""
        if self._pin.held:
            self._dir.release(self._pin)
            self._notify()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Snapshot({self.root!r}, epoch={self.epoch}, shards={len(self.shards)})"
