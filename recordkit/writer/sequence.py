"""A run of shards written one after another: the roll-over rule, in one place.

:class:`~recordkit.Writer`, each partition of a conversion (``recordkit
convert``, :func:`recordkit.write`) and the cache's producer all write through a
:class:`ShardSequence`; only the names and the limits differ.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..format.framing import OVERHEAD
from ..format.manifest import ShardInfo
from ..storage import DirectoryTarget
from .shard import ShardWriter

__all__ = ["ShardSequence", "shard_name"]

log = logging.getLogger(__name__)


def shard_name(prefix: str, number: int) -> str:
    """Shard ``number`` of a sequence: ``{prefix}-{number:05d}.tfrecord``."""
    return f"{prefix}-{number:05d}.tfrecord"


class ShardSequence:
    """Shards ``{prefix}-00000.tfrecord``, ``{prefix}-00001.tfrecord``, ... in ``target``.

    The roll-over rule: a record goes into the current shard unless that shard
    already holds a record and the record would take it past ``shard_size``
    bytes, or it already holds ``max_records`` records; then the shard is
    published (:class:`ShardWriter`: fsync, the index, then an atomic rename)
    and the next one begins. A record larger than ``shard_size`` gets a shard of
    its own. The same records in the same order give the same names and bytes.

    Call :meth:`close` (publish the last shard) or :meth:`discard` (drop the
    shard in progress) exactly once; shards already published stay. Not
    thread-safe.

    Args:
        target: the directory to publish into.
        prefix: the name prefix (``part`` or ``part-00003``).
        shard_size: roll over before a shard passes this many bytes (framed
            records); ``None``: never on size.
        max_records: roll over after this many records; ``None``: no limit.
        fsync: fsync each shard before publishing it.
        name: shard number -> file name (default ``{prefix}-{number:05d}.tfrecord``).
    """

    def __init__(
        self,
        target: DirectoryTarget,
        prefix: str,
        *,
        shard_size: int | None,
        max_records: int | None = None,
        fsync: bool = True,
        name: Callable[[int], str] | None = None,
    ) -> None:
        if shard_size is not None and shard_size <= 0:
            raise ValueError(f"shard_size must be positive or None, got {shard_size!r}")
        if max_records is not None and max_records <= 0:
            raise ValueError(f"max_records must be positive or None, got {max_records!r}")
        self.target = target
        self.prefix = prefix
        self.shard_size = shard_size
        self.max_records = max_records
        self.fsync = fsync
        self._name = name or (lambda n: shard_name(prefix, n))
        self._shards: list[ShardInfo] = []
        self._current: ShardWriter | None = None
        self.records = 0
        self.bytes = 0

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """The shards published so far, in order."""
        return tuple(self._shards)

    def write(self, payload: bytes | bytearray | memoryview) -> int:
        """Append one record (rolling over first if the rule says so); its framed size.

        ``payload`` must not change until the shard is published or discarded.
        """
        framed = len(payload) + OVERHEAD
        shard = self._current
        if shard is not None and (
            (
                self.shard_size is not None
                and shard.records
                and shard.bytes + framed > self.shard_size
            )
            or (self.max_records is not None and shard.records >= self.max_records)
        ):
            self._publish()
            shard = None
        if shard is None:
            name = self._name(len(self._shards))
            shard = self._current = ShardWriter(self.target, name, fsync=self.fsync)
        shard.write(payload)
        self.records += 1
        self.bytes += framed
        return framed

    def _publish(self) -> None:
        assert self._current is not None
        shard, self._current = self._current, None
        try:
            info = shard.publish()
        except BaseException:
            shard.discard()
            raise
        self._shards.append(info)
        log.debug("published %s (%d records, %d bytes)", info.path, info.records, info.bytes)

    def close(self) -> tuple[ShardInfo, ...]:
        """Publish the shard in progress; every shard of the sequence, in order."""
        if self._current is not None:
            self._publish()
        return tuple(self._shards)

    def discard(self) -> None:
        """Drop the shard in progress (nothing of it becomes visible)."""
        if self._current is not None:
            shard, self._current = self._current, None
            shard.discard()
