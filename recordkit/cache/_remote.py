"""Reading the remote side of a cache: its manifest or listing, and byte ranges.

Every read is checked: a ranged read must return exactly the bytes asked for,
a whole-file read exactly the file's listed size, or it is a
:class:`DownloadError` and not data. Transient failures (a dropped connection,
a server that is down for a moment, a response cut short) are retried with
exponential backoff; a missing file or a refused permission is not retried.

All I/O goes through :class:`recordkit.storage.Location`: plain local paths
with ``os.pread`` (no fsspec), any other URL through fsspec, imported on first
use.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ShardNotFoundError
from ..format.index import INDEX_SUFFIX
from ..format.manifest import MANIFEST_NAME, Manifest, ShardInfo
from ..storage import Location, is_remote, is_temp_name, strip_file_scheme
from ._errors import DownloadError

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_SHARD_PATTERNS = ("*.tfrecord", "*.tfrecords", "*.tfrecord-*", "*.tfrecords-*")
# Errors that another attempt cannot fix.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True, slots=True)
class RetryOptions:
    """How remote reads are retried.

    Attributes:
        attempts: tries per read, the first included. 6 tries with the default
            backoff ride out about 15 s of a remote being unreachable, longer
            than the restart of an object-store endpoint or a load balancer.
        backoff: seconds before the second try; doubled after each failure.
        max_backoff: the longest wait between two tries.
    """

    attempts: int = 6
    backoff: float = 0.5
    max_backoff: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"backoff must be >= 0, got {self.backoff}, {self.max_backoff}")


def is_shard_name(name: str) -> bool:
    """True for the file names recordkit treats as shards (not indexes, not temp files)."""
    return (
        not name.endswith(INDEX_SUFFIX)
        and not is_temp_name(name)
        and any(fnmatch.fnmatchcase(name, p) for p in _SHARD_PATTERNS)
    )


class Remote:
    """A dataset directory to download from: a local path or an fsspec URL.

    Args:
        url: the dataset root (``s3://bucket/prefix``, ``https://host/data``, a path).
        storage_options: passed to fsspec.
        retry: how reads are retried.
        sleep: the wait function between tries (tests pass a fast one).
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/") if is_remote(url) else os.path.abspath(strip_file_scheme(url))
        self.retry = retry or RetryOptions()
        self._sleep = sleep
        self._loc = Location(self.url, storage_options)

    def full(self, rel: str) -> str:
        """The URL (or path) of ``rel`` under the remote root."""
        return self._loc.join(rel) if self._loc.remote else os.path.join(self.url, rel)

    # -- retries -------------------------------------------------------------------------

    def _retrying(self, what: str, url: str, fn: Callable[[], _T], offset: int | None = None) -> _T:
        delay = self.retry.backoff
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return fn()
            except _PERMANENT:
                raise
            except Exception as exc:
                if attempt == self.retry.attempts:
                    raise DownloadError(
                        f"{what} failed after {attempt} attempt(s): {exc!r}",
                        url=url,
                        offset=offset,
                    ) from exc
                log.warning(
                    "%s of %s failed (attempt %d/%d, retrying in %.1fs): %r",
                    what,
                    url,
                    attempt,
                    self.retry.attempts,
                    delay,
                    exc,
                )
                self._sleep(delay)
                delay = min(self.retry.max_backoff, delay * 2 if delay else 0.0)
        raise AssertionError("unreachable")

    # -- reads ---------------------------------------------------------------------------

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Exactly bytes ``[start, end)`` of ``rel``; anything else is retried, then an error."""
        url = self.full(rel)

        def once() -> bytes:
            data = self._raw_range(rel, start, end)
            if len(data) != end - start:
                raise DownloadError(
                    f"ranged read returned {len(data)} bytes, asked for {end - start} "
                    f"([{start}, {end}))",
                    url=url,
                    offset=start,
                )
            return data

        return self._retrying("ranged read", url, once, offset=start)

    def _raw_range(self, rel: str, start: int, end: int) -> bytes:
        return self._loc.read_range(rel, start, end)

    def size(self, rel: str) -> int:
        """The remote file's size in bytes."""
        return int(self._retrying("stat", self.full(rel), lambda: self._loc.size(rel)))

    def read_all(self, rel: str) -> bytes:
        """The whole file, checked against its listed size."""
        url = self.full(rel)

        def once() -> bytes:
            size = self._loc.size(rel)
            data = self._loc.read_bytes(rel)
            if len(data) != size:
                raise DownloadError(
                    f"read returned {len(data)} bytes, the file has {size}", url=url
                )
            return data

        return self._retrying("read", url, once)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists under the remote root."""
        return bool(self._retrying("stat", self.full(rel), lambda: self._loc.exists(rel)))

    # -- what the remote holds -------------------------------------------------------------

    def listing(self) -> tuple[Manifest | None, list[ShardInfo]]:
        """The remote manifest and its shards, or, without one, the shard files found.

        Foreign shards get ``records=0`` and ``crc32c=None`` (unknown until fetched).

        Raises:
            ShardNotFoundError: neither a manifest nor any shard file is there.
            ManifestError: the manifest is malformed.
        """
        try:
            data = self.read_all(MANIFEST_NAME)
        except FileNotFoundError:
            data = None
        if data is not None:
            manifest = Manifest.loads(data, path=self.full(MANIFEST_NAME))
            return manifest, list(manifest.shards)
        try:
            files = self._list_files()
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"no such dataset: {self.url}") from exc
        infos = [ShardInfo(name, 0, size) for name, size in files if is_shard_name(name)]
        if not infos:
            raise ShardNotFoundError(f"no {MANIFEST_NAME} and no .tfrecord files at {self.url}")
        return None, infos

    def _list_files(self) -> list[tuple[str, int]]:
        """The files directly under the root, with their sizes."""
        if not self._loc.isdir():
            raise FileNotFoundError(self.url)
        found = self._retrying("listing", self.url, self._loc.walk)
        return [(rel, size) for rel, size in found if "/" not in rel]
