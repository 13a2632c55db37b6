"""The manifest ``recordkit.json``: what a complete dataset holds.

Written last and atomically, so its presence means "every shard listed is
published". It records the format version, the schema (as JSON), and for every
shard its path relative to the dataset root, record count, byte size and the
CRC32C of the whole file (so a copy can be checked without decoding).
"""

from __future__ import annotations

import builtins
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import ManifestError, ShardNotFoundError
from ._atomic import atomic_write_bytes

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "Manifest", "ShardInfo", "read_manifest"]

MANIFEST_NAME = "recordkit.json"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as the manifest lists it.

    Attributes:
        path: the shard's path relative to the dataset root, with ``/`` separators.
        records: number of records.
        bytes: file size in bytes.
        crc32c: CRC32C (unmasked) of the whole file, or ``None`` when unknown
            (a foreign shard listed without a manifest).
    """

    path: str
    records: int
    bytes: int
    crc32c: int | None = None

    def __post_init__(self) -> None:
        if not self.path or self.path.startswith("/") or ".." in self.path.split("/"):
            raise ManifestError(f"shard path must be relative inside the dataset: {self.path!r}")
        if self.records < 0 or self.bytes < 0:
            raise ManifestError(f"negative records/bytes for shard {self.path!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "records": self.records,
            "bytes": self.bytes,
            "crc32c": self.crc32c,
        }


@dataclass(frozen=True, slots=True)
class Manifest:
    """A dataset's manifest.

    Attributes:
        schema: the schema in its JSON form (see ``Schema.to_json``).
        shards: the shards in dataset order.
        format_version: the on-disk format version (currently 1).
        metadata: free-form JSON-serialisable user metadata (e.g. class names).
        created_by: the writing library and version.
    """

    schema: dict[str, Any]
    shards: tuple[ShardInfo, ...]
    format_version: int = FORMAT_VERSION
    metadata: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "recordkit",
            "format_version": self.format_version,
            "created_by": self.created_by,
            "records": self.records,
            "bytes": self.bytes,
            "schema": self.schema,
            "metadata": self.metadata,
            "shards": [s.to_json() for s in self.shards],
        }

    def dumps(self) -> builtins.bytes:
        return (json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    def write(self, root: str | os.PathLike[str]) -> None:
        """Write ``root/recordkit.json`` atomically."""
        atomic_write_bytes(os.path.join(os.fspath(root), MANIFEST_NAME), self.dumps())

    @classmethod
    def loads(cls, data: builtins.bytes | str, *, path: str | None = None) -> Manifest:
        """Parse manifest JSON, checking its structure and version."""
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"not valid JSON: {exc}", path=path) from exc
        if not isinstance(doc, dict) or doc.get("format") != "recordkit":
            raise ManifestError('not a recordkit manifest (no "format": "recordkit")', path=path)
        version = doc.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"format_version {version!r} is not supported (this recordkit reads "
                f"{FORMAT_VERSION}); upgrade recordkit",
                path=path,
            )
        try:
            shards = tuple(
                ShardInfo(
                    path=str(s["path"]),
                    records=int(s["records"]),
                    bytes=int(s["bytes"]),
                    crc32c=None if s.get("crc32c") is None else int(s["crc32c"]),
                )
                for s in doc["shards"]
            )
            schema = doc["schema"]
            metadata = doc.get("metadata") or {}
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}", path=path) from exc
        if not isinstance(schema, dict) or not isinstance(metadata, dict):
            raise ManifestError("schema and metadata must be JSON objects", path=path)
        if len({s.path for s in shards}) != len(shards):
            raise ManifestError("a shard is listed twice", path=path)
        return cls(
            schema=schema,
            shards=shards,
            format_version=version,
            metadata=metadata,
            created_by=str(doc.get("created_by", "")),
        )


def read_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Read ``root/recordkit.json``.

    Raises:
        ShardNotFoundError: there is no manifest (the dataset is incomplete or foreign).
        ManifestError: it exists but is malformed or of an unknown version.
    """
    path = os.path.join(os.fspath(root), MANIFEST_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"no manifest at {path}") from exc
    return Manifest.loads(data, path=path)
