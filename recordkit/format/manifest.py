"""The manifest ``recordkit.json``: what a complete dataset holds.

Written last and atomically, so its presence means "every shard listed is
published". It records the format version, the payload kind, the schema (as
JSON), and for every shard its path relative to the dataset root, record count,
byte size and the CRC32C of the whole file (so a copy can be checked without
decoding).

The payload kind says what each record is: ``"example"`` (a ``tf.train.Example``,
the default, and then not written) or ``"sequence_example"`` (a
``tf.train.SequenceExample``, read whole; the schema is then a
:class:`recordkit.codec.SequenceSchema`'s JSON). A kind this version
does not know is refused, never read as Examples.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ManifestError, ShardNotFoundError
from ._atomic import atomic_write_bytes
from ._files import read_regular
from .framing import DEFAULT_MAX_RECORD_BYTES

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_DEPTH",
    "PAYLOAD_KINDS",
    "SEQUENCE_EXAMPLE",
    "Manifest",
    "ShardInfo",
    "normalize_shard_path",
    "read_manifest",
]

MANIFEST_NAME = "recordkit.json"
# The file names read as shards in a folder without a manifest (ours and foreign TFRecords).
SHARD_PATTERNS = ("*.tfrecord", "*.tfrecords", "*.tfrecord-*", "*.tfrecords-*")
FORMAT_VERSION = 1
#: What a record's payload is: a tf.train.Example, or a tf.train.SequenceExample.
SEQUENCE_EXAMPLE = "sequence_example"
PAYLOAD_KINDS = ("example", SEQUENCE_EXAMPLE)
# A manifest is ~110 bytes per shard plus the schema and metadata: 256 MiB holds
# two million shards and a large class list, and parsing it stays within a few GB.
MAX_MANIFEST_BYTES = 256 << 20
# Ours nest 5 deep (document, schema, features, feature, shape); the rest is
# user metadata. CPython's json gives RecursionError near 1000 levels.
MAX_MANIFEST_DEPTH = 64

# A backslash and the byte after it: with escapes gone, every quote left opens or
# closes a string. One linear pass; the pattern cannot backtrack.
_JSON_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


def normalize_shard_path(path: str) -> str:
    """The canonical form of a shard path relative to the dataset root.

    ``./a``, ``a``, ``b/../a`` and ``a//`` are all ``a``, so a shard cannot be
    listed twice under two spellings.

    Raises:
        ManifestError: an empty path, ``.``, an absolute path, one that escapes
            the root (``..`` after normalising), or one holding a NUL byte.
    """
    if not isinstance(path, str):
        raise ManifestError(f"shard path must be a string, got {path!r}")
    if "\x00" in path:
        raise ManifestError(f"shard path {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise ManifestError(f"shard path {path!r} is absolute; it must be relative to the dataset")
    norm = posixpath.normpath(path) if path else ""
    if norm in ("", "."):
        raise ManifestError(f"shard path {path!r} names no file inside the dataset")
    if norm == ".." or norm.startswith("../"):
        raise ManifestError(f"shard path {path!r} escapes the dataset directory")
    return norm


def _json_depth(data: builtins.bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text, found without parsing it.

    Escapes are dropped and everything but quotes and brackets deleted (C passes
    over the text); a bracket after an odd number of quotes is inside a string.
    The depth is then a running sum of +1 per opening and -1 per closing bracket.
    About 25 ms for the 11 MB manifest of 100,000 shards.
    """
    if b"\\" in data:
        data = _JSON_ESCAPE.sub(b"", data)
    kept = np.frombuffer(data.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    quote = kept == ord('"')
    outside = (np.cumsum(quote, dtype=np.int64) & 1) == 0
    steps = (kept == ord("[")).astype(np.int64) + (kept == ord("{"))
    steps -= (kept == ord("]")) + (kept == ord("}"))
    steps[~outside] = 0
    return int(np.cumsum(steps).max()) if len(steps) else 0


def _check_schema_claims(schema: dict[str, Any], path: str | None) -> None:
    """Refuse fixed shapes that claim more bytes per record than any record may hold.

    Readers size their batch buffers from the schema before they read a record,
    so ``shape [1 << 40]`` must fail here, naming the feature, not later as an
    attempt to allocate terabytes. Every element takes at least one byte (a
    tensor element its dtype's size); ``None`` dims count as 1. Entries of the
    wrong form are left to the schema's own validation.
    """
    features = schema.get("features")
    for entry in features if isinstance(features, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            continue
        dims = entry["shape"]
        if not all(d is None or (type(d) is int and d >= 0) for d in dims):
            continue
        itemsize = 1
        if entry.get("type") == "tensor":
            try:
                itemsize = np.dtype(entry.get("dtype")).itemsize or 1
            except Exception:  # TypeError, ValueError, SyntaxError ("01"): the schema says
                continue
        claim = math.prod(d for d in dims if d is not None) * itemsize
        if claim > DEFAULT_MAX_RECORD_BYTES:
            raise ManifestError(
                f"schema feature {entry.get('name')!r}: shape {dims} claims {claim} bytes "
                f"per record, more than the record limit of {DEFAULT_MAX_RECORD_BYTES}",
                path=path,
            )


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
        object.__setattr__(self, "path", normalize_shard_path(self.path))
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
        payload: what each record is, one of ``PAYLOAD_KINDS``: ``"example"``
            (``schema`` is a ``Schema``'s JSON) or ``"sequence_example"``
            (``schema`` is a ``SequenceSchema``'s JSON).
    """

    schema: dict[str, Any]
    shards: tuple[ShardInfo, ...]
    format_version: int = FORMAT_VERSION
    metadata: dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    payload: str = "example"

    def __post_init__(self) -> None:
        if self.payload not in PAYLOAD_KINDS:
            raise ManifestError(
                f"payload {self.payload!r} is not a kind this recordkit reads "
                f"({', '.join(PAYLOAD_KINDS)}); upgrade recordkit"
            )

    @property
    def sequence_example(self) -> bool:
        """Whether the records are ``tf.train.SequenceExample``\\ s (read whole)."""
        return self.payload == SEQUENCE_EXAMPLE

    @property
    def generation(self) -> str:
        """A short hash of everything this manifest describes.

        Every shard's name, records, bytes and CRC32C, the schema, payload and
        metadata: written again with the same records, a dataset is the same
        generation; anything else is another (``recordkit.reader.generation``).
        """
        doc = {k: v for k, v in self.to_json().items() if k != "created_by"}
        blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": "recordkit",
            "format_version": self.format_version,
            "created_by": self.created_by,
            "records": self.records,
            "bytes": self.bytes,
        }
        if self.payload != "example":  # Example manifests stay as they always were
            doc["payload"] = self.payload
        doc |= {
            "schema": self.schema,
            "metadata": self.metadata,
            "shards": [s.to_json() for s in self.shards],
        }
        return doc

    def dumps(self) -> builtins.bytes:
        return (json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    def write(self, root: str | os.PathLike[str]) -> None:
        """Write ``root/recordkit.json`` atomically."""
        atomic_write_bytes(os.path.join(os.fspath(root), MANIFEST_NAME), self.dumps())

    @classmethod
    def loads(cls, data: builtins.bytes | str, *, path: str | None = None) -> Manifest:
        """Parse manifest JSON, checking its size, nesting, structure and version.

        Raises:
            ManifestError: naming ``path``: over ``MAX_MANIFEST_BYTES`` or nested
                deeper than ``MAX_MANIFEST_DEPTH`` (both checked before parsing),
                not JSON, an unknown version, a malformed or repeated shard entry
                (paths compare after ``normalize_shard_path``), or a schema
                whose fixed shapes claim more than a record may hold.
        """
        raw = data.encode("utf-8") if isinstance(data, str) else builtins.bytes(data)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"manifest is {len(raw)} bytes, over the limit of {MAX_MANIFEST_BYTES}", path=path
            )
        depth = _json_depth(raw)
        if depth > MAX_MANIFEST_DEPTH:
            raise ManifestError(
                f"manifest JSON nests {depth} levels deep, over the limit of {MAX_MANIFEST_DEPTH}",
                path=path,
            )
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
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
        shards = _shard_infos(doc.get("shards"), path)
        schema = doc.get("schema")
        metadata = doc.get("metadata") or {}
        if not isinstance(schema, dict) or not isinstance(metadata, dict):
            raise ManifestError("schema and metadata must be JSON objects", path=path)
        payload = doc.get("payload", "example")
        if payload not in PAYLOAD_KINDS:
            raise ManifestError(
                f"payload {payload!r} is not a kind this recordkit reads "
                f"({', '.join(PAYLOAD_KINDS)}); upgrade recordkit",
                path=path,
            )
        _check_schema_claims(schema, path)
        return cls(
            schema=schema,
            shards=shards,
            format_version=version,
            metadata=metadata,
            created_by=str(doc.get("created_by", "")),
            payload=payload,
        )


def _shard_infos(entries: Any, path: str | None) -> tuple[ShardInfo, ...]:
    if not isinstance(entries, list):
        raise ManifestError('"shards" must be a JSON list', path=path)
    try:  # the fast path; on any problem, the entry-by-entry walk below names it
        shards = tuple(
            ShardInfo(
                path=s["path"],
                records=int(s["records"]),
                bytes=int(s["bytes"]),
                crc32c=None if s.get("crc32c") is None else int(s["crc32c"]),
            )
            for s in entries
        )
    except (ManifestError, KeyError, TypeError, ValueError, OverflowError, AttributeError):
        shards = ()
    if len(shards) != len(entries) or len({s.path for s in shards}) != len(shards):
        _name_the_bad_entry(entries, path)
    for i, info in enumerate(shards):  # one pass of comparisons: ~10 ms at 100k shards
        if not (
            0 <= 16 * info.records <= info.bytes < 1 << 62
            and (info.records == 0) == (info.bytes == 0)
            and (info.crc32c is None or 0 <= info.crc32c < 1 << 32)
        ):
            raise ManifestError(f"shards[{i}] ({info.path!r}): {_impossible(info)}", path=path)
    return shards


def _impossible(s: ShardInfo) -> str:
    """Why no shard can have these numbers (a reader that trusted them would read too few
    records — a shard said to hold none is never opened — or overflow its int64 arrays)."""
    if s.crc32c is not None and not 0 <= s.crc32c < 1 << 32:
        return f"a CRC32C of {s.crc32c} is not 32 bits"
    return (
        f"{s.records} record(s) cannot take {s.bytes} bytes (each record takes 16 bytes "
        "or more, and a shard of none takes 0)"
    )


def _name_the_bad_entry(entries: list[Any], path: str | None) -> None:
    """Raise the ManifestError that names the first bad or repeated entry of ``shards``."""
    first: dict[str, int] = {}
    for i, s in enumerate(entries):
        try:
            if not isinstance(s, dict) or not isinstance(s.get("path"), str):
                raise TypeError("each shard must be an object with a string path")
            info = ShardInfo(
                path=s["path"],
                records=int(s["records"]),
                bytes=int(s["bytes"]),
                crc32c=None if s.get("crc32c") is None else int(s["crc32c"]),
            )
        except ManifestError as exc:
            raise ManifestError(f"shards[{i}]: {exc.reason}", path=path) from exc
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ManifestError(f"shards[{i}]: malformed entry: {exc!r}", path=path) from exc
        if info.path in first:
            j = first[info.path]
            raise ManifestError(
                f"shards[{i}] ({s['path']!r}) is shards[{j}] ({entries[j]['path']!r}) "
                "again: a shard is listed twice",
                path=path,
            )
        first[info.path] = i
    raise AssertionError("_name_the_bad_entry found nothing wrong")  # pragma: no cover


def _manifest_error(reason: str, path: str) -> ManifestError:
    return ManifestError(f"manifest {reason}", path=path)


def read_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Read ``root/recordkit.json``.

    The file must be a regular file (a FIFO or a directory there is refused
    without blocking) of at most ``MAX_MANIFEST_BYTES``.

    Raises:
        ShardNotFoundError: there is no manifest (the dataset is incomplete or foreign).
        ManifestError: it exists but is not a regular file, too large, malformed
            or of an unknown version.
    """
    path = os.path.join(os.fspath(root), MANIFEST_NAME)
    try:
        data = read_regular(path, _manifest_error, max_bytes=MAX_MANIFEST_BYTES, what="manifest")
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"no manifest at {path}") from exc
    return Manifest.loads(data, path=path)
