"""Errors of the shard cache (subclasses of :class:`recordkit.errors.RecordkitError`).

::

    RecordkitError
    ├── CacheFullError (OSError)    the budget or the disk cannot hold a shard, even
    │                               after evicting every shard that may be evicted
    ├── DownloadError (OSError)     a remote read that failed after its retries, or
    │                               returned the wrong length, size or CRC
    └── ProduceError (RuntimeError) producer mode: a partition's writer failed (source
                                    error after its retries), died or stopped responding
"""

from __future__ import annotations

import errno

from ..errors import RecordkitError

__all__ = ["CacheFullError", "DownloadError", "ProduceError"]


class CacheFullError(RecordkitError, OSError):
    """The cache cannot make room for a shard.

    Raised when a shard is larger than the whole budget, or when the disk itself
    is full (``ENOSPC``) and evicting unpinned shards did not free enough space.
    Shards that readers have pinned are never evicted to make room.

    Attributes:
        path: the shard that did not fit (relative to the cache root).
        needed: the bytes it needs.
    """

    def __init__(self, reason: str, *, path: str | None = None, needed: int | None = None):
        super().__init__(errno.ENOSPC, reason)
        self.reason = reason
        self.path = path
        self.needed = needed

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_full, (self.reason, self.path, self.needed))


def _rebuild_full(reason: str, path: str | None, needed: int | None) -> CacheFullError:
    return CacheFullError(reason, path=path, needed=needed)


class DownloadError(RecordkitError, OSError):
    """A shard or index could not be fetched intact from the remote.

    The message names the remote URL and, for a ranged read, the byte range.
    Nothing of a failed download is ever published into the cache.

    Attributes:
        url: the remote file.
        offset: the first byte of the failed read, when it was a ranged read.
    """

    def __init__(self, reason: str, *, url: str | None = None, offset: int | None = None):
        super().__init__(errno.EIO, reason)
        self.reason = reason
        self.url = url
        self.offset = offset

    def __str__(self) -> str:
        where = self.url or "<remote>"
        if self.offset is not None:
            where = f"{where}@{self.offset}"
        return f"{where}: {self.reason}"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_download, (self.reason, self.url, self.offset))


def _rebuild_download(reason: str, url: str | None, offset: int | None) -> DownloadError:
    return DownloadError(reason, url=url, offset=offset)


class ProduceError(RecordkitError, RuntimeError):
    """Producer mode: a partition could not be turned into a shard this time.

    The writer raised (a source error, after its retries for transient ones),
    its process died (killed, out of memory) or reported no progress for the
    cache's ``inactivity_timeout``. Nothing of it is published; the partition is
    tried again later, less and less often, while the others go ahead. The
    message names the partition, its shard and its first source items; the
    writer's traceback, when there is one, is in :attr:`details`.

    Attributes:
        path: the partition's shard (relative to the cache root).
        details: the writer's traceback text, or ``""``.
    """

    def __init__(self, reason: str, *, path: str | None = None, details: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path
        self.details = details

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_produce, (self.reason, self.path, self.details))


def _rebuild_produce(reason: str, path: str | None, details: str) -> ProduceError:
    return ProduceError(reason, path=path, details=details)
