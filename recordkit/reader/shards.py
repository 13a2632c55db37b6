"""Open a dataset's shards: memory maps plus validated indexes.

Shared by every reader. A shard is mapped once, read-only; its index is
validated against the mapping (or rebuilt by a CRC-checked scan), and records
are then addressed by ``(offset, framed size)`` straight into the map.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import mmap
import os
from dataclasses import dataclass
from itertools import islice

import numpy as np

from ..codec.example import decode_example
from ..codec.schema import Schema
from ..errors import ManifestError, RecordkitError, ShardNotFoundError
from ..format.framing import read_record
from ..format.index import INDEX_SUFFIX, ensure_index, open_map
from ..format.manifest import MANIFEST_NAME, Manifest, ShardInfo, read_manifest
from ..storage import is_remote, is_temp_name, strip_file_scheme

__all__ = ["MappedShard", "ShardSet", "find_shards", "open_shards"]

log = logging.getLogger(__name__)

# How many leading records to look at when inferring a foreign dataset's schema.
_INFER_RECORDS = 64
_SHARD_PATTERNS = ("*.tfrecord", "*.tfrecords", "*.tfrecord-*", "*.tfrecords-*")


def find_shards(root: str) -> list[str]:
    """Shard files in a directory without a manifest, sorted by name.

    Takes ``*.tfrecord``, ``*.tfrecords`` and TensorFlow's ``*.tfrecord-00000-of-00010``
    names; skips indexes and the temp files of interrupted writers.
    """
    found: set[str] = set()
    for pattern in _SHARD_PATTERNS:
        found.update(glob.glob(os.path.join(glob.escape(root), pattern)))
    return sorted(
        os.path.relpath(p, root)
        for p in found
        if not p.endswith(INDEX_SUFFIX) and not is_temp_name(os.path.basename(p))
    )


class MappedShard:
    """A shard mapped read-only, with its validated index as NumPy arrays.

    Attributes:
        info: the manifest entry (or one made up for a foreign shard).
        path: absolute file path.
        buf: the ``mmap`` (``b""`` for an empty file).
        nbytes: the file size in bytes (still known after :meth:`close`).
        offsets: int64 record offsets.
        sizes: int64 framed record sizes.
    """

    __slots__ = ("buf", "info", "nbytes", "offsets", "path", "sizes")

    def __init__(self, root: str, info: ShardInfo, *, write_index: bool = True) -> None:
        self.info = info
        self.path = os.path.join(root, info.path)
        self.buf: mmap.mmap | bytes = open_map(self.path)
        self.nbytes = len(self.buf)  # still known after close()
        try:
            listed = info.crc32c is not None  # from a manifest, so sizes are known
            if listed and info.bytes != len(self.buf):
                raise ManifestError(
                    f"shard is {len(self.buf)} bytes, the manifest says {info.bytes}",
                    path=self.path,
                )
            entries = ensure_index(self.path, buf=self.buf, write=write_index)
            if listed and len(entries) != info.records:
                raise ManifestError(
                    f"shard has {len(entries)} records, the manifest says {info.records}",
                    path=self.path,
                )
        except BaseException:
            self.close()
            raise
        self.offsets = np.ascontiguousarray(entries[:, 0])
        self.sizes = np.ascontiguousarray(entries[:, 1])

    @property
    def records(self) -> int:
        return len(self.offsets)

    def payload(self, i: int, *, verify: bool = True) -> memoryview:
        """The payload of record ``i`` as a view into the map (CRC-checked)."""
        return read_record(
            self.buf,
            int(self.offsets[i]),
            path=self.path,
            record=i,
            verify=verify,
            expected_size=int(self.sizes[i]),
        )

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap) and not self.buf.closed:
            try:
                self.buf.close()
            except BufferError:
                # Someone still holds a view (a batch in flight, a traceback);
                # the map is released when the last view goes.
                log.debug("%s still has live views; leaving the unmap to GC", self.path)


@dataclass
class ShardSet:
    """The opened shards of a dataset.

    Attributes:
        root: the dataset directory.
        manifest: the manifest, or ``None`` for a directory without one.
        shards: mapped shards in dataset order.
        schema: the schema (given, from the manifest, or inferred).
    """

    root: str
    manifest: Manifest | None
    shards: list[MappedShard]
    schema: Schema

    @property
    def counts(self) -> np.ndarray:
        """Records per shard, int64."""
        return np.array([s.records for s in self.shards], dtype=np.int64)

    @property
    def avg_record_bytes(self) -> float:
        """Mean framed record size (1.0 for an empty set)."""
        count = sum(s.records for s in self.shards)
        return sum(s.nbytes for s in self.shards) / count if count else 1.0

    def fingerprint(self) -> str:
        """A short hash of the shard set (paths, record counts, sizes) for resume checks."""
        h = hashlib.sha256()
        for s in self.shards:
            h.update(f"{s.info.path}\0{s.records}\0{s.nbytes}\n".encode())
        return h.hexdigest()[:16]

    def close(self) -> None:
        for s in self.shards:
            s.close()


def _shard_infos(path: str) -> tuple[str, Manifest | None, list[ShardInfo]]:
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, MANIFEST_NAME)):
            manifest = read_manifest(path)
            return path, manifest, list(manifest.shards)
        infos = [ShardInfo(p, 0, 0) for p in find_shards(path)]
        if not infos:
            raise ShardNotFoundError(f"no manifest and no .tfrecord files in {path}")
        return path, None, infos
    if os.path.isfile(path):
        return os.path.dirname(path), None, [ShardInfo(os.path.basename(path), 0, 0)]
    raise ShardNotFoundError(f"no such dataset: {path}")


def open_shards(
    path: str | os.PathLike[str], schema: Schema | None = None, *, write_index: bool = True
) -> ShardSet:
    """Map every shard of a dataset directory, a folder of TFRecords, or one file.

    Raises:
        ShardNotFoundError: the path, or a shard the manifest lists, does not exist.
        ManifestError: the manifest is malformed or disagrees with the shards.
    """
    if is_remote(path):
        raise ShardNotFoundError(
            f"{os.fspath(path)!r} is remote: recordkit reads local shards; copy or cache "
            "them to local disk first"
        )
    root, manifest, infos = _shard_infos(os.path.abspath(strip_file_scheme(path)))
    shards: list[MappedShard] = []
    try:
        for info in infos:
            shards.append(MappedShard(root, info, write_index=write_index))
        if schema is None:
            schema = (
                Schema.from_json(manifest.schema) if manifest is not None else _infer(root, shards)
            )
    except BaseException:
        for s in shards:
            s.close()
        raise
    return ShardSet(root=root, manifest=manifest, shards=shards, schema=schema)


def _infer(root: str, shards: list[MappedShard]) -> Schema:
    payloads = (s.payload(i) for s in shards for i in range(s.records))
    examples = [decode_example(p) for p in islice(payloads, _INFER_RECORDS)]
    if not examples:
        raise RecordkitError(f"cannot infer a schema from {root}: it has no records")
    schema = Schema.infer(examples)
    log.info("inferred schema from %d records: %r", len(examples), schema)
    return schema
