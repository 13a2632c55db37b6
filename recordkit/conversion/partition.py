"""One partition, in a writer subprocess: items in, published shards and a done-marker out.

Everything a task needs travels in a small, picklable :class:`PartitionTask`:
the source object (its location and options, never samples), the items, the
schema as JSON and the destination as ``(url, storage_options)``. The worker
builds its own filesystem, reads its items, writes shards through
:class:`~recordkit.writer.sequence.ShardSequence` (each shard published
atomically with its index) and, last, publishes a done-marker listing them. Only that list of
shard entries goes back to the parent (and, for ``tf.train.SequenceExample``
payloads, the :class:`~recordkit.codec.SequenceSchema` of what it wrote).

A source whose payloads are SequenceExamples (its ``payload_kind()`` says
``"sequence_example"``) implements ``sequence_records(item, found)``: like
``records``, but it decodes every payload whole, refuses one that does not
decode (naming file, offset and record) and adds each to ``found``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..codec.schema import Schema
from ..codec.sequence import SequenceSchema
from ..errors import NO_SPACE, DiskFullError, add_note
from ..format.framing import OVERHEAD
from ..format.manifest import SEQUENCE_EXAMPLE, ShardInfo
from ..retry import RetryPolicy
from ..storage import open_target
from ..writer.sequence import ShardSequence

__all__ = ["PartitionResult", "PartitionTask", "Reporter", "Tally", "run_partition", "write_items"]

log = logging.getLogger(__name__)

STATE_DIR = ".recordkit-convert"

#: ``report(items, source_bytes, records)``: progress deltas from inside a partition.
Reporter = Callable[[int, int, int], None]


@dataclass(frozen=True, slots=True)
class PartitionTask:
    """A partition to convert, as it crosses to a worker (pickled; small).

    Attributes:
        index: the partition number.
        items: its source items.
        source: the ``recordkit.converters.Source`` (location and options only).
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
        payload: the records' payload kind (``"example"``, ``"sequence_example"``).
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
    payload: str = "example"


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What a partition published.

    Attributes:
        index: the partition number.
        shards: its shards, in order.
        items: source items read.
        size: source bytes read (the items' sizes).
        attempts: how many attempts it took.
        skipped: source rows the source left out on purpose (a tabular
            converter's ``nulls="skip"``).
        schema: for SequenceExample payloads, the ``SequenceSchema`` JSON of the
            records written (``None`` for Examples).
    """

    index: int
    shards: tuple[ShardInfo, ...]
    items: int
    size: int
    attempts: int = 1
    skipped: int = 0
    schema: dict[str, Any] | None = None

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
        if self.skipped:
            doc["skipped"] = self.skipped
        if self.schema is not None:
            doc["schema"] = self.schema
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
            schema = doc.get("schema")
            if schema is not None:
                SequenceSchema.from_json(schema)  # a marker that is not one is redone
            result = cls(
                int(doc["partition"]),
                shards,
                int(doc["items"]),
                int(doc["size"]),
                skipped=int(doc.get("skipped", 0)),
                schema=schema,
            )
            return str(doc["fingerprint"]), result
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:  # SchemaError too
            raise ValueError(f"malformed done-marker: {exc!r}") from exc


class Tally:
    """Forwards progress to ``report`` and remembers it, so an attempt that is
    retried (or redone) can take back what it counted: :meth:`undo`.

    Args:
        report: where the progress goes.
    """

    def __init__(self, report: Reporter) -> None:
        self.report = report
        self.done = [0, 0, 0]

    def __call__(self, items: int, size: int, records: int) -> None:
        self.done[0] += items
        self.done[1] += size
        self.done[2] += records
        self.report(items, size, records)

    def undo(self) -> None:
        """Report minus everything counted so far, and start from zero."""
        if any(self.done):
            self.report(-self.done[0], -self.done[1], -self.done[2])
        self.done = [0, 0, 0]


def write_items(
    shards: ShardSequence,
    source: Any,
    items: Sequence[Any],
    schema: Schema,
    report: Reporter,
    *,
    before_write: Callable[[int, int], None] | None = None,
    sequences: SequenceSchema | None = None,
) -> int:
    """Write the records of ``items`` (a source's, in order) into ``shards``.

    ``report(1, item.size, records)`` follows each item. An error from the
    source gets a note naming the item (``while converting source item
    'f03.jsonl'``; a source may call its items something else through an
    ``item_label`` attribute). ``before_write(framed_size, item_number)`` runs
    before each record and may raise to stop (the cache's reservation cap).
    With ``sequences`` the records are SequenceExamples: the source's
    ``sequence_records(item, sequences)`` yields them, each counted into it.

    Returns the source rows left out on purpose (a tabular converter's
    ``nulls="skip"``): a source's ``records()`` may return an iterator with a
    ``skipped`` count, read once it is exhausted.
    """
    label = getattr(source, "item_label", "source item")
    skipped = 0
    for n, item in enumerate(items):
        records = 0
        try:
            if sequences is not None:
                payloads = source.sequence_records(item, sequences)
            else:
                payloads = source.records(item, schema)
            for payload in payloads:
                if before_write is not None:
                    before_write(len(payload) + OVERHEAD, n)
                shards.write(payload)
                records += 1
        except Exception as exc:
            add_note(exc, f"while converting {label} {item.key!r}")
            raise
        left_out = int(getattr(payloads, "skipped", 0))
        if left_out:
            log.info("%s: %d source row(s) left out on purpose", item.key, left_out)
            skipped += left_out
        report(1, int(item.size), records)
    return skipped


def _write(
    task: PartitionTask, report: Reporter
) -> tuple[tuple[ShardInfo, ...], SequenceSchema | None, int]:
    """Write the partition's shards; return them, the SequenceExamples' schema (``None``
    for Examples) and the source rows left out on purpose."""
    schema = Schema.from_json(task.schema)
    found = SequenceSchema() if task.payload == SEQUENCE_EXAMPLE else None
    target = open_target(task.dst, task.storage_options)
    shards = ShardSequence(
        target,
        task.shard_prefix,
        shard_size=task.shard_size,
        max_records=task.max_records,
        fsync=task.fsync,
    )
    try:
        skipped = write_items(shards, task.source, task.items, schema, report, sequences=found)
        return shards.close(), found, skipped
    finally:
        shards.discard()  # what an error left in progress (nothing after close)
        target.close()


def run_partition(task: PartitionTask, report: Reporter | None = None) -> PartitionResult:
    """Convert one partition, publish its shards and its done-marker; return what it wrote.

    Transient remote errors (see :func:`recordkit.retry.is_transient`) retry the
    whole partition after a backoff, as ``task.retry`` says: it rewrites the same
    names with the same bytes, so a retry is safe. A full disk raises :class:`DiskFullError`.
    """
    report = report or (lambda items, size, records: None)
    tallies: list[Tally] = []

    def attempt() -> tuple[Any, Any, int]:
        if tallies:
            tallies[-1].undo()  # the retry counts its items again
        tallies.append(Tally(report))
        try:
            return _write(task, tallies[-1])
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise DiskFullError(
                    f"no space left on the device writing partition {task.index} to "
                    f"{task.dst}: free some space and rerun; the partitions already "
                    "published are kept",
                    errno=exc.errno,
                ) from exc
            raise

    shards, found, skipped = task.retry.call(attempt, what=f"partition {task.index}")
    result = PartitionResult(
        task.index,
        shards,
        items=len(task.items),
        size=sum(int(i.size) for i in task.items),
        attempts=len(tallies),
        skipped=skipped,
        schema=None if found is None else found.to_json(),
    )
    state_url = f"{task.dst.rstrip('/')}/{STATE_DIR}"
    with contextlib.closing(open_target(state_url, task.storage_options)) as state:
        state.write_bytes(task.marker, result.marker_bytes(task.fingerprint))
    return result
