"""``recordkit.Dataset``: the reference reader (in order, or random access by index).

This is the simple, obviously-correct reader the fast ones are checked against:
it memory-maps each shard, validates (or rebuilds) its index, checks every CRC
and decodes one record at a time on the calling thread.
"""

from __future__ import annotations

import bisect
import glob
import logging
import mmap
import os
from collections.abc import Iterator
from itertools import islice
from types import TracebackType
from typing import Any

import numpy as np

from .codec.example import decode_example
from .codec.schema import Schema
from .errors import CorruptRecordError, ManifestError, RecordkitError, ShardNotFoundError
from .format.framing import read_record
from .format.index import INDEX_SUFFIX, ensure_index, open_map
from .format.manifest import MANIFEST_NAME, Manifest, ShardInfo, read_manifest
from .storage import is_remote, is_temp_name, strip_file_scheme

__all__ = ["Dataset", "find_shards"]

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


class _Shard:
    """A mapped shard with its validated index."""

    __slots__ = ("buf", "info", "offsets", "path", "sizes")

    def __init__(self, root: str, info: ShardInfo, *, write_index: bool) -> None:
        self.info = info
        self.path = os.path.join(root, info.path)
        self.buf = open_map(self.path)
        if info.bytes != len(self.buf) and info.crc32c is not None:
            raise ManifestError(
                f"shard is {len(self.buf)} bytes, the manifest says {info.bytes}",
                path=self.path,
            )
        entries = ensure_index(self.path, buf=self.buf, write=write_index)
        if info.crc32c is not None and len(entries) != info.records:
            raise ManifestError(
                f"shard has {len(entries)} records, the manifest says {info.records}",
                path=self.path,
            )
        self.offsets = entries[:, 0].tolist()
        self.sizes = entries[:, 1].tolist()

    def payload(self, i: int) -> memoryview:
        return read_record(
            self.buf, self.offsets[i], path=self.path, record=i, expected_size=self.sizes[i]
        )

    def close(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            try:
                self.buf.close()
            except BufferError:
                # A caller still holds a view (e.g. in a traceback); the map is
                # released when that view is collected.
                log.debug("%s still has live views; leaving the unmap to GC", self.path)


class Dataset:
    """Read a recordkit dataset, a folder of foreign TFRecords, or a single shard.

    ``len(ds)`` is the number of records, ``ds[i]`` decodes record ``i`` (global
    over shards in dataset order, negative indices count from the end), and
    iterating yields every record in order. Each sample is a ``dict``: ``Bytes``
    features as ``bytes`` (a list of ``bytes`` for list shapes), numeric and
    ``Tensor`` features as NumPy arrays of the feature's shape (0-d for scalars).
    Samples own their memory; they stay valid after :meth:`close`.

    Args:
        path: a dataset directory (with ``recordkit.json``), a directory of
            ``.tfrecord`` files without one, or one ``.tfrecord`` file.
        schema: overrides the manifest's schema; required for nothing, but for
            foreign data it saves inferring one from the first records.
        write_index: write rebuilt indexes beside foreign shards (best effort).

    Raises:
        ShardNotFoundError: the path, or a shard the manifest lists, does not exist.
        ManifestError: the manifest is malformed or disagrees with the shards.
        CorruptRecordError: on reading a corrupt record (names file, offset, record).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: Schema | None = None,
        *,
        write_index: bool = True,
    ) -> None:
        if is_remote(path):
            raise ShardNotFoundError(
                f"recordkit.Dataset reads local paths; for {os.fspath(path)!r} fill a local "
                "cache first (recordkit cache fill) or use a streaming reader"
            )
        path = os.path.abspath(strip_file_scheme(path))
        self.manifest: Manifest | None = None
        if os.path.isdir(path):
            self.root = path
            if os.path.exists(os.path.join(path, MANIFEST_NAME)):
                self.manifest = read_manifest(path)
                infos = list(self.manifest.shards)
            else:
                infos = [ShardInfo(p, 0, 0) for p in find_shards(path)]
                if not infos:
                    raise ShardNotFoundError(f"no manifest and no .tfrecord files in {path}")
        elif os.path.isfile(path):
            self.root = os.path.dirname(path)
            infos = [ShardInfo(os.path.basename(path), 0, 0)]
        else:
            raise ShardNotFoundError(f"no such dataset: {path}")
        self._shards: list[_Shard] = []
        try:
            for info in infos:
                self._shards.append(_Shard(self.root, info, write_index=write_index))
        except BaseException:
            self.close()
            raise
        self._starts = [0]
        for s in self._shards:
            self._starts.append(self._starts[-1] + len(s.offsets))
        if schema is not None:
            self.schema = schema
        elif self.manifest is not None:
            self.schema = Schema.from_json(self.manifest.schema)
        else:
            self.schema = self._infer_schema()

    def _infer_schema(self) -> Schema:
        payloads = islice(self._iter_payloads(), _INFER_RECORDS)
        examples = [decode_example(p) for _, _, p in payloads]
        if not examples:
            raise RecordkitError(f"cannot infer a schema from {self.root}: it has no records")
        schema = Schema.infer(examples)
        log.info("inferred schema from %d records: %r", len(examples), schema)
        return schema

    @property
    def shards(self) -> list[ShardInfo]:
        """The shards in dataset order (record counts and sizes as found on disk)."""
        return [
            ShardInfo(s.info.path, len(s.offsets), len(s.buf), s.info.crc32c) for s in self._shards
        ]

    @property
    def metadata(self) -> dict[str, Any]:
        """The manifest's metadata (empty for foreign data)."""
        return dict(self.manifest.metadata) if self.manifest else {}

    def __len__(self) -> int:
        return self._starts[-1]

    def _iter_payloads(self) -> Iterator[tuple[_Shard, int, memoryview]]:
        for shard in self._shards:
            for i in range(len(shard.offsets)):
                yield shard, i, shard.payload(i)

    def _decode(self, shard: _Shard, i: int, payload: memoryview) -> dict[str, Any]:
        try:
            return self.schema.decode(payload, copy=True)
        except CorruptRecordError as exc:
            raise exc.located(shard.path, shard.offsets[i], i) from exc

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard, i, payload in self._iter_payloads():
            yield self._decode(shard, i, payload)

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self)
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"Dataset indices must be integers, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"record {index} out of range for a dataset of {n} records")
        index = int(index) % n
        s = bisect.bisect_right(self._starts, index) - 1
        shard = self._shards[s]
        i = index - self._starts[s]
        return self._decode(shard, i, shard.payload(i))

    def close(self) -> None:
        """Unmap every shard."""
        for s in self._shards:
            s.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Dataset({self.root!r}, shards={len(self._shards)}, records={len(self)}, "
            f"schema={self.schema!r})"
        )
