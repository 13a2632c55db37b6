"""Reading the remote side of a cache: its manifest or listing, and byte ranges.

Every read is checked: a ranged read must return exactly the bytes asked for,
a whole-file read exactly the file's listed size, or it is a
:class:`DownloadError` and not data. Transient failures (a dropped connection,
a server that is down for a moment, a response cut short) are retried with
exponential backoff; a missing file or a refused permission is not retried.

Plain local paths are read with ``os.pread`` (no fsspec), which keeps local
caches of local datasets (and the cache's own tests) light; any other URL goes
through fsspec, imported on first use.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._deps import require
from ..errors import ShardNotFoundError
from ..format.index import INDEX_SUFFIX
from ..format.manifest import MANIFEST_NAME, Manifest, ShardInfo
from ..storage import is_remote, is_temp_name, strip_file_scheme
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
        self._fs: Any = None
        if is_remote(url):
            fsspec = require("fsspec", extra="s3")
            self._fs, self._root = fsspec.core.url_to_fs(url, **(storage_options or {}))
            self._root = self._root.rstrip("/")

    def full(self, rel: str) -> str:
        """The URL (or path) of ``rel`` under the remote root."""
        return f"{self.url}/{rel}" if self._fs is not None else os.path.join(self.url, rel)

    def _key(self, rel: str) -> str:
        return f"{self._root}/{rel}" if self._fs is not None else os.path.join(self.url, rel)

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
        if self._fs is not None:
            return bytes(self._fs.cat_file(self._key(rel), start=start, end=end))
        with open(self._key(rel), "rb") as f:
            return os.pread(f.fileno(), end - start, start)

    def size(self, rel: str) -> int:
        """The remote file's size in bytes."""
        url = self.full(rel)
        if self._fs is not None:
            return int(self._retrying("stat", url, lambda: self._fs.info(self._key(rel))["size"]))
        return os.path.getsize(self._key(rel))

    def read_all(self, rel: str) -> bytes:
        """The whole file, checked against its listed size."""
        url = self.full(rel)

        def once() -> bytes:
            if self._fs is not None:
                size = int(self._fs.info(self._key(rel))["size"])
                data = bytes(self._fs.cat_file(self._key(rel)))
            else:
                with open(self._key(rel), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    data = f.read()
            if len(data) != size:
                raise DownloadError(
                    f"read returned {len(data)} bytes, the file has {size}", url=url
                )
            return data

        return self._retrying("read", url, once)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists under the remote root."""
        if self._fs is not None:
            return bool(
                self._retrying("stat", self.full(rel), lambda: self._fs.exists(self._key(rel)))
            )
        return os.path.exists(self._key(rel))

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
        if self._fs is None:
            return sorted(
                (n, os.path.getsize(os.path.join(self.url, n)))
                for n in os.listdir(self.url)
                if os.path.isfile(os.path.join(self.url, n))
            )

        def ls() -> list[tuple[str, int]]:
            self._fs.invalidate_cache(self._root)
            entries = self._fs.ls(self._root, detail=True)
            return sorted(
                (e["name"].rstrip("/").rsplit("/", 1)[-1], int(e.get("size") or 0))
                for e in entries
                if e.get("type") == "file"
            )

        return self._retrying("listing", self.url, ls)
