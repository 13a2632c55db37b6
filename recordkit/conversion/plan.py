"""Planning a conversion: a pure function from the source's items to partitions.

Partition ``i`` covers a contiguous run of items and always writes the same
shards, ``{prefix}-{i:05d}-{k:05d}.tfrecord`` for ``k = 0, 1, ...``, with the
same bytes, whichever engine, worker count or attempt runs it. The plan's
fingerprint (a SHA-256 of everything that decides the output) lets a rerun
recognise its own partial output and resume it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._units import parse_size
from ..codec.schema import Schema, Tensor
from ..format import TMP_MARKER
from ..format.manifest import FORMAT_VERSION, PAYLOAD_KINDS
from ..retry import RetryPolicy

__all__ = ["ConvertOptions", "Partition", "Plan", "make_plan"]

_COMPRESSIONS = (None, "zstd")


@dataclass(frozen=True, slots=True)
class ConvertOptions:
    """What decides the output bytes of a conversion (engines and workers do not).

    Attributes:
        shard_size: roll over to a new shard before one would pass this many
            bytes (int or ``"256MiB"``), as :class:`~recordkit.Writer` does.
        max_records: also roll over after this many records (``None``: no limit).
        partition_bytes: the source bytes one partition covers, the unit of
            parallel work and of resume; ``None`` means ``shard_size``, so a
            partition usually writes about one shard.
        partition_items: at most this many items per partition. 65,536 keeps a
            partition of tiny files (or of sizeless HTTP listings) a few minutes'
            work, so a killed run loses little.
        compress: ``"zstd"`` stores every ``Tensor`` feature zstd-compressed.
        prefix: shard name prefix.
        fsync: fsync each shard before publishing it.
        retries: attempts after the first for a partition (or the listing)
            that hit a transient remote error (connection reset, timeout, 5xx);
            3 rides out a blip. See :attr:`retry_policy`.
        retry_backoff: seconds before the first retry, doubled each time.
    """

    shard_size: int | str = "256MiB"
    max_records: int | None = None
    partition_bytes: int | str | None = None
    partition_items: int = 65536
    compress: str | None = None
    prefix: str = "part"
    fsync: bool = True
    retries: int = 3
    retry_backoff: float = 1.0

    def __post_init__(self) -> None:
        shard_size = parse_size(self.shard_size)
        if shard_size <= 0:
            raise ValueError(f"shard_size must be positive, got {self.shard_size!r}")
        object.__setattr__(self, "shard_size", shard_size)
        if self.partition_bytes is not None:
            partition_bytes = parse_size(self.partition_bytes)
            if partition_bytes <= 0:
                raise ValueError(f"partition_bytes must be positive, got {self.partition_bytes}")
            object.__setattr__(self, "partition_bytes", partition_bytes)
        if self.max_records is not None and self.max_records <= 0:
            raise ValueError(f"max_records must be positive or None, got {self.max_records!r}")
        if self.partition_items <= 0:
            raise ValueError(f"partition_items must be positive, got {self.partition_items!r}")
        if self.compress not in _COMPRESSIONS:
            raise ValueError(f"compress must be one of {_COMPRESSIONS}, got {self.compress!r}")
        if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
            raise ValueError(f"prefix must be a plain file name prefix, got {self.prefix!r}")
        if TMP_MARKER in self.prefix:  # its shards would be taken for temp files, and removed
            raise ValueError(f"prefix must not contain {TMP_MARKER!r}, got {self.prefix!r}")
        if self.retries < 0 or self.retry_backoff < 0:
            raise ValueError(
                f"retries and retry_backoff must be >= 0, got {self.retries}, {self.retry_backoff}"
            )

    @property
    def retry_policy(self) -> RetryPolicy:
        """These settings as the one :class:`~recordkit.retry.RetryPolicy` that runs
        the retries (``retries + 1`` tries, ``retry_backoff`` doubled each time)."""
        last = self.retry_backoff * 2.0 ** min(max(0, self.retries - 1), 32)
        return RetryPolicy(attempts=self.retries + 1, backoff=self.retry_backoff, max_backoff=last)

    @property
    def shard_bytes(self) -> int:
        """``shard_size`` in bytes."""
        return int(self.shard_size)


@dataclass(frozen=True, slots=True)
class Partition:
    """A contiguous run of source items, written by one task.

    Attributes:
        index: the partition number (in shard names).
        items: the source items (:class:`recordkit.converters.Item`).
        versions: each item's content identity (its file's modification time, ETag,
            version id or content hash; ``""`` where the source says none).
    """

    index: int
    items: tuple[Any, ...]
    versions: tuple[str, ...] = ()

    def identity(self) -> list[list[Any]]:
        """``[key, size, version]`` of each item: what a rerun compares."""
        versions = self.versions or ("",) * len(self.items)
        return [[i.key, int(i.size), v] for i, v in zip(self.items, versions)]

    def digest(self) -> str:
        """A short hash of :meth:`identity` (and the items' refs)."""
        doc = [[*row, list(i.ref)] for row, i in zip(self.identity(), self.items)]
        blob = json.dumps(doc, separators=(",", ":"), default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def size(self) -> int:
        """Source bytes covered."""
        return sum(int(i.size) for i in self.items)

    def describe(self, limit: int = 3) -> str:
        """The items, for error notes: ``a.jsonl, b.jsonl, ... (12 items)``."""
        keys = [i.key for i in self.items[:limit]]
        more = f", ... ({len(self.items)} items)" if len(self.items) > limit else ""
        return ", ".join(keys) + more


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a conversion will write, decided before anything is written.

    Attributes:
        format: the converter name.
        schema: the schema records are written with.
        metadata: the manifest metadata (the source's, plus ``convert``).
        partitions: the partitions in order.
        options: the :class:`ConvertOptions`.
        fingerprint: SHA-256 hex of all the above; the same plan, the same output.
        payload: what the records are (``"example"``, ``"sequence_example"``:
            then ``schema`` is empty and the manifest's schema is a
            ``SequenceSchema`` the partitions build from every record).
        source: where the items come from (an absolute path or a URL; ``""``
            for the inputs of ``recordkit.write``).
        frame: SHA-256 hex of everything but the items (the source's location,
            format, schema, metadata, options): partitions of plans with the same
            frame and the same items write the same shards.
        files: ``(path, version)`` of every file the source listed (what a refusal
            names when one changed; the items' versions are in the fingerprint).
    """

    format: str
    schema: Schema
    metadata: Mapping[str, Any]
    partitions: tuple[Partition, ...]
    options: ConvertOptions
    fingerprint: str = field(default="")
    payload: str = "example"
    source: str = ""
    frame: str = ""
    files: tuple[tuple[str, str], ...] = ()

    @property
    def items(self) -> int:
        """Source items in all partitions."""
        return sum(len(p.items) for p in self.partitions)

    @property
    def size(self) -> int:
        """Source bytes in all partitions."""
        return sum(p.size for p in self.partitions)

    def shard_prefix(self, partition: int) -> str:
        """The name prefix of partition ``partition``'s shards: ``part-00003``."""
        return f"{self.options.prefix}-{partition:05d}"

    def marker_name(self, partition: int) -> str:
        """The done-marker a published partition leaves in the state directory."""
        return f"{self.shard_prefix(partition)}.done.json"

    def partition_key(self, partition: int) -> str:
        """What partition ``partition``'s done-marker records: the frame, the index and
        the partition's items as they are now. A rerun keeps a published partition
        only if its key is the same (its items unchanged, content included)."""
        digest = self.partitions[partition].digest()
        return hashlib.sha256(f"{self.frame}:{partition}:{digest}".encode()).hexdigest()


def _with_compression(schema: Schema, compress: str | None) -> Schema:
    if compress is None:
        return schema
    features = {
        name: replace(ftype, compression=compress) if isinstance(ftype, Tensor) else ftype
        for name, ftype in schema.features.items()
    }
    return Schema(features)


def _split(items: Sequence[Any], max_bytes: int, max_items: int) -> list[tuple[Any, ...]]:
    groups: list[tuple[Any, ...]] = []
    current: list[Any] = []
    current_bytes = 0
    for item in items:
        size = int(item.size)
        if current and (current_bytes + size > max_bytes or len(current) >= max_items):
            groups.append(tuple(current))
            current, current_bytes = [], 0
        current.append(item)
        current_bytes += size
    if current:
        groups.append(tuple(current))
    return groups


def make_plan(
    fmt: str,
    items: Sequence[Any],
    schema: Schema,
    metadata: Mapping[str, Any],
    options: ConvertOptions,
    payload: str = "example",
    *,
    source: str = "",
    version: Callable[[Any], str] | None = None,
    files: Mapping[str, str] | None = None,
) -> Plan:
    """Cut ``items`` into partitions and fingerprint the result. Pure: no I/O, no clock.

    Args:
        fmt: the converter name.
        items: the source's items in order (each with ``key``, ``size``, ``ref``).
        schema: the schema (``options.compress`` is applied to its tensors here).
        metadata: the source's manifest metadata (JSON-ready).
        options: the output options.
        payload: the records' payload kind (``recordkit.format.manifest.PAYLOAD_KINDS``).
        source: where the items come from (absolute), part of the fingerprint.
        version: an item's content identity (``Source.item_version``), part of
            the fingerprint: a source regenerated at the same names and sizes is
            another conversion.
        files: the versions of the source's files (``Source.versions``), kept to
            say which changed.
    """
    if payload not in PAYLOAD_KINDS:
        raise ValueError(f"payload must be one of {PAYLOAD_KINDS}, got {payload!r}")
    schema = _with_compression(schema, options.compress)
    max_bytes = int(options.partition_bytes or options.shard_bytes)
    groups = _split(items, max_bytes, options.partition_items)
    partitions = tuple(
        Partition(i, g, tuple(version(item) for item in g) if version else ())
        for i, g in enumerate(groups)
    )
    doc = {
        "format_version": FORMAT_VERSION,
        "format": fmt,
        "schema": schema.to_json(),
        "metadata": dict(metadata),
        "options": {
            "shard_size": options.shard_bytes,
            "max_records": options.max_records,
            "prefix": options.prefix,
        },
        "partitions": [[[i.key, int(i.size), list(i.ref)] for i in p.items] for p in partitions],
    }
    if payload != "example":  # the plans of Example conversions keep their fingerprints
        doc["payload"] = payload
    if source or version:  # what the items are, where from
        doc["source"] = source
        doc["versions"] = [list(p.versions) for p in partitions]
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()
    fingerprint = hashlib.sha256(blob).hexdigest()
    frame_doc = {k: v for k, v in doc.items() if k not in ("partitions", "versions")}
    frame_blob = json.dumps(frame_doc, sort_keys=True, separators=(",", ":"), default=str)
    frame = hashlib.sha256(frame_blob.encode()).hexdigest()
    convert: dict[str, Any] = {"from": fmt, "plan": fingerprint}
    if source:
        convert["source"] = source
    full_metadata = {**metadata, "convert": convert}
    listed = tuple(sorted((files or {}).items()))
    return Plan(
        fmt, schema, full_metadata, partitions, options, fingerprint, payload, source, frame, listed
    )
