"""One partition, in a writer subprocess: items in, published shards and a done-marker out.

Everything a task needs travels in a small, picklable :class:`PartitionTask`:
the source object (its location and options, never samples), the items, the
schema as JSON and the destination as ``(url, storage_options)``. The worker
builds its own filesystem, reads its items, writes shards through
:class:`~recordkit.writer.ShardWriter` (each published atomically with its
index) and, last, publishes a done-marker listing them. Only that list of
shard entries goes back to the parent.
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..codec.schema import Schema
from ..format.manifest import ShardInfo
from ..retry import RetryPolicy
from ..storage import open_target
from ..writer.shard import ShardWriter
from ._errors import DiskFullError, add_note

__all__ = ["PartitionResult", "PartitionTask", "run_partition"]

log = logging.getLogger(__name__)

STATE_DIR = ".recordkit-convert"
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}

#: ``report(items, source_bytes, records)``: progress deltas from inside a partition.
Reporter = Callable[[int, int, int], None]


@dataclass(frozen=True, slots=True)
class PartitionTask:
    """A partition to convert, as it crosses to a worker (pickled; small).

    Attributes:
        index: the partition number.
        items: its source items.
        source: the ``converters.Source`` (location and options only).
        schema: the schema in JSON form.
        dst: the dataset URL or path.
        storage_options: fsspec options for ``dst``.
        shard_prefix: ``part-00003``; shards are ``{shard_prefix}-{k:05d}.tfrecord``.
        marker: the done-marker's name in the state directory.
        fingerprint: the plan fingerprint written into the marker.
        shard_size: roll-over size in bytes.
        max_records: roll-over record count, or ``None``.
        fsync: fsync shards before publishing.
        retry: how transient errors are retried (the whole partition again).
    """

    index: int
    items: tuple[Any, ...]
    source: Any
    schema: dict[str, Any]
    dst: str
    storage_options: dict[str, Any]
    shard_prefix: str
    marker: str
    fingerprint: str
    shard_size: int
    max_records: int | None
    fsync: bool
    retry: RetryPolicy


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What a partition published.

    Attributes:
        index: the partition number.
        shards: its shards, in order.
        items: source items read.
        size: source bytes read (the items' sizes).
        attempts: how many attempts it took.
    """

    index: int
    shards: tuple[ShardInfo, ...]
    items: int
    size: int
    attempts: int = 1

    @property
    def records(self) -> int:
        """Records written."""
        return sum(s.records for s in self.shards)

    def marker_bytes(self, fingerprint: str) -> bytes:
        """The done-marker's content (deterministic JSON)."""
        doc = {
            "fingerprint": fingerprint,
            "partition": self.index,
            "items": self.items,
            "size": self.size,
            "shards": [s.to_json() for s in self.shards],
        }
        return (json.dumps(doc, sort_keys=True) + "\n").encode()

    @classmethod
    def from_marker(cls, data: bytes) -> tuple[str, PartitionResult]:
        """Parse a done-marker; return ``(fingerprint, result)``. ``ValueError`` if malformed."""
        try:
            doc = json.loads(data)
            shards = tuple(
                ShardInfo(s["path"], int(s["records"]), int(s["bytes"]), int(s["crc32c"]))
                for s in doc["shards"]
            )
            result = cls(int(doc["partition"]), shards, int(doc["items"]), int(doc["size"]))
            return str(doc["fingerprint"]), result
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed done-marker: {exc!r}") from exc


def _noop(items: int, size: int, records: int) -> None:
    pass


class _Counter:
    """Forwards progress and remembers it, so a retried attempt can take it back."""

    def __init__(self, report: Reporter) -> None:
        self.report = report
        self.done = [0, 0, 0]

    def __call__(self, items: int, size: int, records: int) -> None:
        self.done[0] += items
        self.done[1] += size
        self.done[2] += records
        self.report(items, size, records)

    def undo(self) -> None:
        self.report(-self.done[0], -self.done[1], -self.done[2])


def _write(task: PartitionTask, report: Reporter) -> tuple[ShardInfo, ...]:
    schema = Schema.from_json(task.schema)
    target = open_target(task.dst, task.storage_options)
    shards: list[ShardInfo] = []
    current: ShardWriter | None = None
    try:
        for item in task.items:
            records = 0
            try:
                for payload in task.source.records(item, schema):
                    framed = len(payload) + 16
                    if current is not None and (
                        (current.records and current.bytes + framed > task.shard_size)
                        or (task.max_records is not None and current.records >= task.max_records)
                    ):
                        shards.append(current.publish())
                        current = None
                    if current is None:
                        name = f"{task.shard_prefix}-{len(shards):05d}.tfrecord"
                        current = ShardWriter(target, name, fsync=task.fsync)
                    current.write(payload)
                    records += 1
            except Exception as exc:
                add_note(exc, f"while converting source item {item.key!r}")
                raise
            report(1, int(item.size), records)
        if current is not None:
            shards.append(current.publish())
            current = None
        return tuple(shards)
    finally:
        if current is not None:
            current.discard()
        target.close()


def run_partition(task: PartitionTask, report: Reporter | None = None) -> PartitionResult:
    """Convert one partition, publish its shards and its done-marker; return what it wrote.

    Transient remote errors (see ``is_transient``) retry the whole partition
    after a backoff: it rewrites the same names with the same bytes, so a retry
    is safe. A full disk raises :class:`DiskFullError`.
    """
    report = report or _noop
    counters: list[_Counter] = []

    def attempt() -> tuple[ShardInfo, ...]:
        if counters:
            counters[-1].undo()  # the retry counts its items again
        counters.append(_Counter(report))
        try:
            return _write(task, counters[-1])
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise DiskFullError(
                    f"no space left on the device writing partition {task.index} to "
                    f"{task.dst}: free some space and rerun; the partitions already "
                    "published are kept"
                ) from exc
            raise

    shards = task.retry.call(attempt, what=f"partition {task.index}")
    result = PartitionResult(
        task.index,
        shards,
        items=len(task.items),
        size=sum(int(i.size) for i in task.items),
        attempts=len(counters),
    )
    state = open_target(f"{task.dst.rstrip('/')}/{STATE_DIR}", task.storage_options)
    try:
        state.write_bytes(task.marker, result.marker_bytes(task.fingerprint))
    finally:
        state.close()
    return result
