"""Reading the remote side of a cache: its manifest or listing, and byte ranges.

Every read is checked, and retried under the one
:class:`~recordkit.retry.RetryPolicy` while the failure is transient or the bytes
are wrong; what the remote answers decides the rest (:func:`recordkit.retry.classify`).
A ranged read must return exactly the bytes asked for; the remote's catalog is read
twice per try and the two reads must agree; only an answer that says "not there"
means the dataset has no manifest, and a failure that outlasts the retries is an
error (``docs/howto/remote.md``, "When the remote misbehaves", says what each answer
means). All I/O goes through :class:`recordkit.storage.Location`: plain local paths
with ``os.pread`` (no fsspec), any other URL through fsspec, imported on first use.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import AccessDeniedError, DownloadError, ManifestError, ShardNotFoundError
from ..format.index import INDEX_SUFFIX
from ..format.manifest import MANIFEST_NAME, SHARD_PATTERNS, Manifest, ShardInfo
from ..retry import DEFAULT_POLICY, RetryPolicy, classify, describe
from ..storage import Location, is_remote, is_temp_name, strip_file_scheme

__all__ = ["Remote", "RetryOptions", "is_shard_name"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

RetryOptions = RetryPolicy
"""The cache's name for :class:`recordkit.retry.RetryPolicy` (the one retry policy)."""


def _worth_retrying(exc: BaseException) -> bool:
    """Wrong bytes (a short read, a manifest that does not parse, two reads that
    differ) and transient failures; not a missing file, a refusal or a bug."""
    return isinstance(exc, (DownloadError, ManifestError)) or classify(exc) == "transient"


def _answer(exc: BaseException) -> str:
    """What the remote said, for a message: ``HTTP 403``, ``NoSuchKey``, or the error."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is None:
            continue
        response = getattr(e, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            return str(response["Error"].get("Code"))
        status = getattr(e, "status", None)
        if isinstance(status, int):
            return f"HTTP {status}"
    return describe(exc)


def is_shard_name(name: str) -> bool:
    """True for the file names recordkit treats as shards (not indexes, not temp files)."""
    return (
        not name.endswith(INDEX_SUFFIX)
        and not is_temp_name(name)
        and any(fnmatch.fnmatchcase(name, p) for p in SHARD_PATTERNS)
    )


def _agreed(read: Callable[[], _T], what: str, url: str) -> Callable[[], _T]:
    """One try of "two answers that agree": ``read()`` until two successive answers are
    equal. The last answer is kept across tries, so a try after a failure needs one
    good read, not two; answers that differ are a :class:`DownloadError` (retried)."""
    last: list[_T] = []

    def once() -> _T:
        first = read()
        if last and last[0] == first:
            return first
        last[:] = [first]
        second = read()
        last[:] = [second]
        if second != first:
            raise DownloadError(f"two {what} of it differ", url=url)
        return first

    return once


class Remote:
    """A dataset directory to download from: a local path or an fsspec URL.

    Args:
        url: the dataset root (``s3://bucket/prefix``, ``https://host/data``, a path).
        storage_options: passed to fsspec.
        retry: how reads are retried, and their deadlines.
        sleep: the wait function between tries (tests pass a fast one).
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/") if is_remote(url) else os.path.abspath(strip_file_scheme(url))
        self.retry = retry or DEFAULT_POLICY
        self._sleep = sleep
        self._loc = Location(self.url, storage_options, self.retry)
        self._files: list[tuple[str, int | None]] | None = None

    def full(self, rel: str) -> str:
        """The URL (or path) of ``rel`` under the remote root."""
        return self._loc.join(rel) if self._loc.remote else os.path.join(self.url, rel)

    # -- retries -------------------------------------------------------------------------

    def _retrying(self, what: str, url: str, fn: Callable[[], _T], offset: int | None = None) -> _T:
        """``fn()`` under the retry policy; a failure that outlasts it becomes our error:
        :class:`ShardNotFoundError` (absent), :class:`AccessDeniedError` (refused),
        our own verdict on bad bytes, else :class:`DownloadError`."""
        try:
            return self.retry.call(
                fn, what=f"{what} of {url}", retry_if=_worth_retrying, sleep=self._sleep
            )
        except Exception as exc:
            kind = classify(exc)
            if kind == "absent":
                raise ShardNotFoundError(f"{url}: not found ({_answer(exc)})") from exc
            if kind == "forbidden":
                raise AccessDeniedError(
                    f"{what} refused ({_answer(exc)}): check the credentials and the "
                    "permissions (storage_options, or the usual environment variables)",
                    url=url,
                ) from exc
            if isinstance(exc, DownloadError):  # wrong bytes every time
                raise DownloadError(
                    f"{exc.reason} (in each of {self.retry.attempts} attempt(s))",
                    url=exc.url,
                    offset=exc.offset,
                ) from exc
            if isinstance(exc, ManifestError):
                raise
            tries = "(not retried)"
            if kind == "transient":
                tries = f"after {self.retry.attempts} attempt(s)"
            raise DownloadError(
                f"{what} failed {tries}: {describe(exc)}", url=url, offset=offset
            ) from exc

    # -- reads ---------------------------------------------------------------------------

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Exactly bytes ``[start, end)`` of ``rel``; anything else is retried, then an error."""
        url = self.full(rel)

        def once() -> bytes:
            data = self._loc.read_range(rel, start, end)
            if len(data) != end - start:
                raise DownloadError(
                    f"ranged read returned {len(data)} bytes, asked for {end - start} "
                    f"([{start}, {end}))",
                    url=url,
                    offset=start,
                )
            return data

        return self._retrying("ranged read", url, once, offset=start)

    def size(self, rel: str) -> int:
        """The remote file's size in bytes."""
        return int(self._retrying("stat", self.full(rel), lambda: self._loc.size(rel)))

    def agreed_size(self, rel: str) -> int:
        """The remote file's size from two requests that agree (retried until they do).

        Where nothing else says how large a file is (a folder of foreign TFRecords
        over HTTP), one answer is not enough: fsspec falls back to a ``GET`` when
        a ``HEAD`` fails, and a proxy that cuts a body short can make its
        ``Content-Length`` agree."""
        url = self.full(rel)
        return self._retrying("stat", url, _agreed(lambda: int(self._loc.size(rel)), "stats", url))

    def read_all(self, rel: str, size: int | None = None) -> bytes:
        """The whole file, in one request whose answer is seen (a 404 is
        :class:`ShardNotFoundError`, a 503 retried); with ``size``, checked against it."""
        url = self.full(rel)

        def once() -> bytes:
            data = self._loc.read_bytes(rel)
            if size is not None and len(data) != size:
                raise DownloadError(
                    f"read returned {len(data)} bytes, the file has {size}", url=url
                )
            return data

        return self._retrying("read", url, once)

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists under the remote root (only a 404 or ``NoSuchKey`` is no)."""
        return bool(self._retrying("stat", self.full(rel), lambda: self._loc.exists(rel)))

    # -- what the remote holds -------------------------------------------------------------

    def read_manifest(self) -> Manifest | None:
        """The remote's manifest, or ``None`` when the remote says it has none.

        Two reads must give the same bytes, and they must parse (a try reads
        until two agree, keeping the last good read across tries). A failure
        that outlasts the retries raises; only HTTP 404 or ``NoSuchKey`` gives
        ``None``.

        Raises:
            DownloadError: the manifest could not be read, or never read the same twice.
            AccessDeniedError: the remote refused access.
            ManifestError: it reads the same every time and is malformed.
        """
        url = self.full(MANIFEST_NAME)

        def read() -> bytes:
            data = self._loc.read_bytes(MANIFEST_NAME)
            Manifest.loads(data, path=url)  # a body that does not parse is not a read
            return data

        try:
            data = self._retrying("manifest read", url, _agreed(read, "reads", url))
        except ShardNotFoundError:
            return None
        return Manifest.loads(data, path=url)

    def files(self) -> list[tuple[str, int | None]]:
        """The files directly under the root with their sizes where the listing has
        them (HTTP listings do not), listed twice: the two listings must agree.
        Kept, so a second call does not list again.

        Raises:
            ShardNotFoundError: the root does not exist, or is empty.
        """
        if self._files is None:

            def read() -> list[tuple[str, int | None]]:
                found = self._loc.list_dir()
                if not found:
                    raise FileNotFoundError(self.url)
                return found

            self._files = self._retrying("listing", self.url, _agreed(read, "listings", self.url))
        return self._files

    def listing(self) -> tuple[Manifest | None, list[ShardInfo]]:
        """The remote manifest and its shards, or, without one, the shard files found.

        Foreign shards get ``records=0`` and ``crc32c=None`` (unknown until fetched).

        Raises:
            ShardNotFoundError: neither a manifest nor any shard file is there.
            ManifestError: the manifest is malformed.
            DownloadError: the remote failed after the retries (never taken for
                "no manifest").
            AccessDeniedError: the remote refused access.
        """
        manifest = self.read_manifest()
        if manifest is not None:
            return manifest, list(manifest.shards)
        try:
            files = self.files()
        except ShardNotFoundError as exc:
            raise ShardNotFoundError(f"no such dataset: {self.url}") from exc
        # each size a request of its own where the listing has none (HEADs, retried)
        infos = [
            ShardInfo(name, 0, self.agreed_size(name) if size is None else size)
            for name, size in files
            if is_shard_name(name)
        ]
        if not infos:
            raise ShardNotFoundError(f"no {MANIFEST_NAME} and no .tfrecord files at {self.url}")
        return None, infos
