"""One shard at a time: framed records into a staged file, published with its index."""

from __future__ import annotations

import os
import struct

from ..format.crc import crc32c, masked_crc32c
from ..format.framing import OVERHEAD, frame_header
from ..format.index import INDEX_SUFFIX, entries_from_sizes, format_index
from ..format.manifest import ShardInfo
from ..storage import DirectoryTarget

__all__ = ["ShardWriter"]

_U32 = struct.Struct("<I")
# Small records are gathered and written with one writev per ~1 MiB; large ones
# go straight from the caller's buffer to the kernel with no intermediate copy.
_FLUSH_BYTES = 1 << 20
_IOV_MAX = 512


class ShardWriter:
    """Writes one shard file; call :meth:`publish` or :meth:`discard` exactly once.

    The shard is written to a staged temp file. :meth:`publish` flushes and
    fsyncs it, publishes the index first and then renames the shard into place,
    so a reader that sees a shard can always find its index. Nothing about a
    shard is visible before that. Not thread-safe.

    Args:
        target: the directory to publish into.
        name: the shard's final file name, e.g. ``part-00000.tfrecord``.
        fsync: flush the shard to stable storage before publishing it.
    """

    def __init__(self, target: DirectoryTarget, name: str, *, fsync: bool = True) -> None:
        self.target = target
        self.name = name
        self.fsync = fsync
        self._staged = target.staging_path(name)
        self._fd = os.open(self._staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_bytes = 0
        self._sizes: list[int] = []
        self._file_crc = 0
        self.bytes = 0

    @property
    def records(self) -> int:
        return len(self._sizes)

    def write(self, payload: bytes | bytearray | memoryview) -> int:
        """Append one record; return its framed size. ``payload`` must not change until flushed."""
        header = frame_header(len(payload))
        footer = _U32.pack(masked_crc32c(payload))
        crc = crc32c(header, self._file_crc)
        crc = crc32c(payload, crc)
        self._file_crc = crc32c(footer, crc)
        self._pending += (header, payload, footer)
        framed = len(payload) + OVERHEAD
        self._pending_bytes += framed
        self._sizes.append(framed)
        self.bytes += framed
        if self._pending_bytes >= _FLUSH_BYTES or len(self._pending) >= _IOV_MAX:
            self._flush()
        return framed

    def _flush(self) -> None:
        parts = self._pending
        while parts:
            written = os.writev(self._fd, parts)
            # writev may write less than asked (signals, quotas): resume after the written bytes.
            while parts and written >= len(parts[0]):
                written -= len(parts[0])
                parts = parts[1:]
            if parts and written:
                parts = [memoryview(parts[0])[written:], *parts[1:]]
        self._pending = []
        self._pending_bytes = 0

    def publish(self) -> ShardInfo:
        """Flush, fsync, publish the index and then the shard; return its manifest entry."""
        self._flush()
        if self.fsync:
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        entries = entries_from_sizes(self._sizes)
        self.target.write_bytes(self.name + INDEX_SUFFIX, format_index(entries))
        self.target.publish(self._staged, self.name)
        return ShardInfo(
            path=self.name, records=self.records, bytes=self.bytes, crc32c=self._file_crc
        )

    def discard(self) -> None:
        """Drop the staged file; nothing becomes visible."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.target.discard(self._staged)
