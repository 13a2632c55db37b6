"""One shard, mapped: :class:`MappedShard` (re-exported by :mod:`recordkit.reader.shards`)."""

from __future__ import annotations

import logging
import mmap
import os
from typing import Any

import numpy as np

from ..errors import ManifestError, ShardChangedError
from ..format.framing import read_record
from ..format.index import map_file
from ..format.manifest import ShardInfo
from .index import ShardIndex, open_index

__all__ = ["MappedShard"]

log = logging.getLogger("recordkit.reader.shards")  # the name its messages always had


class MappedShard:
    """A shard mapped read-only, with its index in the compact form readers hold.

    Opening checks the file against what the shard set expects (size and record
    count, from the manifest or from counting): a mismatch is a
    :class:`~recordkit.errors.ManifestError` for a manifest's shard, a
    :class:`~recordkit.errors.ShardChangedError` otherwise. The index is loaded
    and checked as :mod:`recordkit.reader.index.shard_index` says: whole against the
    file's size now, and each run of records' length fields before any record of
    the run is located (:meth:`locate`, :meth:`entry`, ``offsets``, ``sizes``).

    Attributes:
        info: the manifest entry (or one made up for a foreign shard).
        path: absolute file path.
        buf: the ``mmap`` (``b""`` for an empty file).
        nbytes: the file size in bytes (still known after :meth:`close`).
        index: the :class:`~recordkit.reader.index.ShardIndex`.
    """

    __slots__ = ("buf", "identity", "index", "info", "nbytes", "path", "pins")

    def __init__(
        self,
        root: str,
        info: ShardInfo,
        *,
        write_index: bool = False,
        listed: bool = True,
        counted_by: str | None = None,
        kept: tuple[tuple[int, ...], ShardIndex] | None = None,
    ) -> None:
        self.info = info
        self.path = os.path.join(root, info.path)
        self.pins = 0  # readers holding it (ShardSet.acquire); guarded by the set's lock
        self.buf: mmap.mmap | bytes
        self.buf, st = map_file(self.path)
        self.nbytes = len(self.buf)  # still known after close()
        #: the file mapped: device, inode, size, modification time (an index loaded for
        #: it serves a later map of the same file: ``kept``)
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        mismatch = ManifestError if listed else ShardChangedError
        what = "the manifest says" if listed else "it had when the dataset was opened"
        if counted_by is not None:  # counts from another program's metadata
            mismatch, what = ManifestError, f"{counted_by} says"
        try:
            if info.bytes != self.nbytes:
                raise mismatch(f"shard is {self.nbytes} bytes, {what} {info.bytes}", path=self.path)
            # A manifest's shards are ours: a lost index goes back beside them. A foreign
            # shard's goes to the per-user cache unless the user asked for it beside.
            if kept is not None and kept[0] == self.identity:  # mapped before, unchanged
                self.index = kept[1]
            else:
                self.index = open_index(
                    self.path, buf=self.buf, write=write_index or listed, records=info.records
                )
            if self.index.records != info.records:
                raise mismatch(
                    f"shard has {self.index.records} records, {what} {info.records}",
                    path=self.path,
                )
        except BaseException:
            self.close()
            raise

    @property
    def records(self) -> int:
        return self.index.records

    def locate(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The int64 offsets and framed sizes of ``records`` (their index runs checked)."""
        return self.index.locate(records, self.buf, path=self.path)

    def lookup(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`locate`, for a reader that checks each record's length field
        against its size as it frames it (the native runner): runs are not checked
        here (an entry outside the shard still raises, as :meth:`locate` does)."""
        found = self.index.lookup(records)
        return found if found is not None else self.locate(records)

    def entry(self, record: int) -> tuple[int, int]:
        """One record's ``(offset, framed size)`` (its index run checked)."""
        return self.index.entry(record, self.buf, path=self.path)

    @property
    def offsets(self) -> _Column:
        """``shard.offsets[records]``: int64 offsets, as :meth:`locate` gives them."""
        return _Column(self, 0)

    @property
    def sizes(self) -> _Column:
        """``shard.sizes[records]``: int64 framed sizes, as :meth:`locate` gives them."""
        return _Column(self, 1)

    def check(self) -> None:
        """Raise :class:`~recordkit.errors.ShardChangedError` if the file has shrunk.

        One ``fstat`` on the map's own descriptor; readers call it before each
        task, so a shard truncated under a reader is an error, not a ``SIGBUS``
        (native copies are guarded against a page vanishing mid-task as well).
        """
        if isinstance(self.buf, mmap.mmap) and not self.buf.closed:
            size = self.buf.size()
            if size < self.nbytes:
                raise ShardChangedError(
                    f"shard is {size} bytes, its index says {self.nbytes}: it changed while "
                    "being read",
                    path=self.path,
                    offset=size,
                )

    def payload(self, i: int, *, verify: bool = True) -> memoryview:
        """The payload of record ``i`` as a view into the map (CRC-checked)."""
        offset, size = self.entry(i)
        return read_record(
            self.buf, offset, path=self.path, record=i, verify=verify, expected_size=size
        )

    def close(self) -> bool:
        """Unmap; ``False`` if a view still holds the map (it goes with the last view)."""
        if isinstance(self.buf, mmap.mmap) and not self.buf.closed:
            try:
                self.buf.close()
            except BufferError:
                # Someone still holds a view (a native task, a batch, a traceback).
                log.debug("%s still has live views; leaving the unmap to GC", self.path)
                return False
        return True


class _Column:
    """One column of a shard's index, indexed like the int64 arrays it replaced.

    ``column[i]`` is an int, ``column[records]`` an int64 array; either way the
    index runs of the records are checked first, so no location leaves the index
    unchecked.
    """

    __slots__ = ("_k", "_shard")

    def __init__(self, shard: MappedShard, k: int) -> None:
        self._shard, self._k = shard, k

    def __len__(self) -> int:
        return self._shard.records

    def __getitem__(self, records: Any) -> Any:
        if isinstance(records, (int, np.integer)):
            return self._shard.entry(int(records))[self._k]
        return self._shard.locate(np.asarray(records, dtype=np.int64))[self._k]
