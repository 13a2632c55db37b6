"""Where datasets live: local directories, and any fsspec URL (the only fsspec user).

Local paths (and ``file://`` URLs) never import fsspec. Remote URLs are opened
lazily through fsspec with the caller's ``storage_options``; credentials and
endpoints come from fsspec's usual sources (e.g. ``AWS_ENDPOINT_URL``). Every
remote filesystem opened here gets the deadlines of a
:class:`~recordkit.retry.RetryPolicy` (connect and per-read inactivity), so no
request can hang for ever; the caller's own settings in ``storage_options`` win.

Publishing is atomic on both: locally a temp file in the same directory is
fsync'ed and renamed; remotely the file is staged on local disk, uploaded under
a temp key and then moved to its final key, so a reader listing the prefix
never sees a partial object under a final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from typing import Any, Protocol

from ._deps import require
from .format import TMP_MARKER, atomic_write_bytes, fsync_dir, temp_name
from .retry import DEFAULT_POLICY, RetryPolicy, classify

__all__ = [
    "DirectoryTarget",
    "Location",
    "is_remote",
    "open_target",
    "source_url",
    "strip_file_scheme",
    "version_of",
]

log = logging.getLogger(__name__)


def strip_file_scheme(url: str | os.PathLike[str]) -> str:
    """Return a local path for ``file://`` URLs and plain paths, unchanged otherwise."""
    url = os.fspath(url)
    return url[len("file://") :] if url.startswith("file://") else url


# What object stores and servers say changes with an object's content, best first:
# S3 (ETag, VersionId), GCS (generation, md5Hash, etag), Azure (etag), HTTP (ETag,
# Last-Modified, Content-MD5, Digest), and a modification time where that is all.
_VERSION_FIELDS = (
    "VersionId",
    "generation",
    "ETag",
    "etag",
    "md5Hash",
    "Content-MD5",
    "Digest",
    "crc32c",
    "LastModified",
    "Last-Modified",
    "last_modified",
    "updated",
    "mtime",
    "created",
)


def version_of(entry: dict[str, Any]) -> str:
    """An fsspec ``info`` entry's content identity (``"ETag=..."``), or ``""`` if none."""
    for field in _VERSION_FIELDS:
        value = entry.get(field)
        if value not in (None, ""):
            return f"{field}={value}"
    return ""


def source_url(url: str | os.PathLike[str]) -> str:
    """Where a source is, as a conversion's identity records it: a local path made
    absolute (``file://`` dropped), a URL as given without a trailing ``/``."""
    url = os.fspath(url)
    if is_remote(url):
        return url.rstrip("/")
    return os.path.abspath(strip_file_scheme(url))


def is_remote(url: str | os.PathLike[str]) -> bool:
    """True for URLs with a scheme other than ``file://`` (``s3://``, ``memory://``, ...)."""
    url = os.fspath(url)
    return "://" in url and not url.startswith("file://")


class DirectoryTarget(Protocol):
    """A directory a writer publishes files into, atomically."""

    root: str

    def staging_path(self, name: str) -> str:
        """A local path to write ``name``'s content to before :meth:`publish`."""

    def publish(self, staged: str, name: str) -> None:
        """Make the staged file visible as ``name``, all at once."""

    def discard(self, staged: str) -> None:
        """Remove a staged file that will not be published."""

    def write_bytes(self, name: str, data: bytes) -> None:
        """Publish ``data`` as ``name`` atomically."""

    def listdir(self) -> list[str]:
        """Names of the files directly in the directory (empty if it does not exist)."""

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""

    def close(self) -> None:
        """Release local staging space."""


class LocalDirectory:
    """A local directory; temp files are siblings of their final names."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def staging_path(self, name: str) -> str:
        return temp_name(os.path.join(self.root, name))

    def publish(self, staged: str, name: str) -> None:
        os.replace(staged, os.path.join(self.root, name))
        fsync_dir(self.root)

    def discard(self, staged: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)

    def write_bytes(self, name: str, data: bytes) -> None:
        atomic_write_bytes(os.path.join(self.root, name), data)

    def listdir(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.root, name))

    def close(self) -> None:
        pass


class FsspecDirectory:
    """A directory on any fsspec filesystem; files are staged in a local temp dir.

    Args:
        url: the directory's URL.
        storage_options: passed to fsspec.
        retry: whose deadlines every request gets.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        fsspec = require("fsspec", extra="s3")
        options = retry.storage_options(url, storage_options)
        self.fs, self.path = fsspec.core.url_to_fs(url, **options)
        self.root = url.rstrip("/")
        self.fs.makedirs(self.path, exist_ok=True)
        self._staging = tempfile.mkdtemp(prefix="recordkit-stage-")

    def _key(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def staging_path(self, name: str) -> str:
        return temp_name(os.path.join(self._staging, name))

    def publish(self, staged: str, name: str) -> None:
        tmp_key = temp_name(self._key(name))
        try:
            self.fs.put_file(staged, tmp_key)
            self.fs.mv(tmp_key, self._key(name))
        except BaseException:
            try:
                self.fs.rm_file(tmp_key)
            except Exception:  # the original error is the one worth raising
                log.debug("could not remove temp key %s", tmp_key, exc_info=True)
            raise
        finally:
            self.discard(staged)

    def discard(self, staged: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)

    def write_bytes(self, name: str, data: bytes) -> None:
        staged = self.staging_path(name)
        with open(staged, "wb") as f:
            f.write(data)
        self.publish(staged, name)

    def listdir(self) -> list[str]:
        try:
            entries = self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._key(name))

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)


def open_target(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> LocalDirectory | FsspecDirectory:
    """Return a :class:`DirectoryTarget` for a local path or an fsspec URL."""
    if is_remote(url):
        return FsspecDirectory(os.fspath(url), storage_options)
    return LocalDirectory(strip_file_scheme(url))


def is_temp_name(name: str) -> bool:
    """True for the temp files an interrupted writer leaves (``name.tmp-<hex>``)."""
    return TMP_MARKER in name


class Location:
    """A file or directory to read from, local or remote, that survives pickling.

    Holds only ``(url, storage_options)``; the filesystem is built on first use in
    each process (fsspec's async filesystems are not fork-safe, and a subprocess
    must not inherit a parent's sessions). Remote filesystems are private
    instances whose listing cache is dropped before every listing, so files that
    other processes published are seen.

    Args:
        url: a local path, ``file://`` URL, or any fsspec URL.
        storage_options: passed to fsspec for remote URLs.
        retry: the deadlines of every remote request (connect, per-read
            inactivity); see :class:`~recordkit.retry.RetryPolicy`. Retrying is
            the caller's: a :class:`Location` makes each request once.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self._fs: Any = None
        self._path = ""

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "retry": self.retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"], state["storage_options"], state.get("retry", DEFAULT_POLICY)
        )

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    @property
    def remote(self) -> bool:
        """True for remote URLs (anything but a local path or ``file://``)."""
        return is_remote(self.url)

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            fsspec = require("fsspec", extra="s3")
            opts = {"skip_instance_cache": True, **self.storage_options}
            opts = self.retry.storage_options(self.url, opts)
            self._fs, self._path = fsspec.core.url_to_fs(self.url, **opts)
        return self._fs, self._path

    def _local(self, rel: str = "") -> str:
        root = strip_file_scheme(self.url)
        return os.path.join(root, *rel.split("/")) if rel else root

    def _remote(self, rel: str = "") -> str:
        path = self._filesystem()[1]
        return f"{path.rstrip('/')}/{rel}" if rel else path

    def join(self, rel: str) -> str:
        """The URL (or path) of ``rel`` below this location."""
        return f"{self.url.rstrip('/')}/{rel}" if rel else self.url

    def child(self, rel: str) -> Location:
        """A :class:`Location` for ``rel`` below this one, with the same options."""
        return Location(self.join(rel), self.storage_options, self.retry)

    def exists(self, rel: str = "") -> bool:
        """Whether ``rel`` (or this location itself) exists.

        Only an answer that says "not there" (HTTP 404, S3 ``NoSuchKey``) is
        ``False``; a request that fails otherwise raises (fsspec's own
        ``exists()`` says ``False`` for a 503 over HTTP).
        """
        if not self.remote:
            return os.path.exists(self._local(rel))
        fs, _ = self._filesystem()
        fs.invalidate_cache()
        return self._remote_exists(fs, self._remote(rel))

    @staticmethod
    def _remote_exists(fs: Any, path: str) -> bool:
        try:
            fs.info(path)
        except Exception as exc:
            if classify(exc) == "absent":
                return False
            raise
        return True

    def isdir(self, rel: str = "") -> bool:
        """Whether ``rel`` (or this location itself) is a directory (a prefix, remotely)."""
        if not self.remote:
            return os.path.isdir(self._local(rel))
        fs, _ = self._filesystem()
        fs.invalidate_cache()
        return bool(fs.isdir(self._remote(rel)))

    def walk(self) -> list[tuple[str, int]]:
        """Every file below this directory as ``(relative posix path, size)``, sorted.

        A location that is a single file gives ``[("", size)]``, one that does not
        exist ``[]``. Temp files of
        interrupted writers are skipped.
        """
        return [(rel, size) for rel, size, _ in self.walk_versions()]

    def walk_versions(self) -> list[tuple[str, int, str]]:
        """:meth:`walk` with each file's content identity: ``(rel, size, version)``.

        The version is what the file system says changes with the content: the
        modification time locally (``mtime_ns=...``), the ETag, version id or
        generation remotely (``ETag=...``); for a server that gives none of these
        (an HTTP server without ``ETag`` or ``Last-Modified``) a SHA-256 of the
        content (``sha256=...``), read whole.
        """
        if not self.remote:
            root = self._local()
            if os.path.isfile(root):
                st = os.stat(root)
                return [("", st.st_size, f"mtime_ns={st.st_mtime_ns}")]
            if not os.path.isdir(root):
                return []
            found = []
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in filenames:
                    full = os.path.join(dirpath, name)
                    rel = os.path.relpath(full, root).replace(os.sep, "/")
                    st = os.stat(full)
                    found.append((rel, st.st_size, f"mtime_ns={st.st_mtime_ns}"))
        else:
            fs, path = self._filesystem()
            fs.invalidate_cache()
            if not fs.isdir(path):
                if not self._remote_exists(fs, path):
                    return []
                info = fs.info(path)
                return [("", int(info.get("size") or 0), self._version(fs, path, info))]
            base = path.rstrip("/") + "/"
            info = fs.find(path, detail=True)
            found = []
            for key, entry in info.items():
                if not key.startswith(base) or is_temp_name(key[len(base) :]):
                    continue
                if entry.get("size") is None or not version_of(entry):
                    # HTTP listings carry neither: one HEAD each says both
                    entry = {**entry, **fs.info(key)}
                version = self._version(fs, key, entry)
                found.append((key[len(base) :], int(entry.get("size") or 0), version))
        return sorted(f for f in found if not is_temp_name(f[0]))

    @staticmethod
    def _version(fs: Any, key: str, entry: dict[str, Any]) -> str:
        version = version_of(entry)
        if version:
            return version
        log.info("%s: the server says nothing that changes with its content: hashing it", key)
        digest = hashlib.sha256()
        with fs.open(key, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return f"sha256={digest.hexdigest()}"

    def list_dir(self) -> list[tuple[str, int | None]]:
        """The files directly in this directory as ``(name, size)``, sorted.

        The size is ``None`` where the listing does not carry it (HTTP listings).
        A directory that does not exist gives ``[]`` only when the answer says
        so (HTTP 404, S3 ``NoSuchKey``); any other failure raises. Temp files of
        interrupted writers are skipped.
        """
        found: list[tuple[str, int | None]] = []
        if not self.remote:
            try:
                entries = list(os.scandir(self._local()))
            except (FileNotFoundError, NotADirectoryError):
                return []
            for e in entries:
                with contextlib.suppress(FileNotFoundError):
                    if e.is_file():
                        found.append((e.name, e.stat().st_size))
        else:
            fs, path = self._filesystem()
            fs.invalidate_cache()
            try:
                listed = fs.ls(path, detail=True)
            except Exception as exc:
                if classify(exc) == "absent":
                    return []
                raise
            base = path.rstrip("/") + "/"
            for entry in listed:
                name = str(entry.get("name", "")).rstrip("/")
                rel = name[len(base) :] if name.startswith(base) else ""
                if entry.get("type") == "directory" or not rel or "/" in rel:
                    continue
                size = entry.get("size")
                found.append((rel, None if size is None else int(size)))
        return sorted((name, size) for name, size in found if not is_temp_name(name))

    def size(self, rel: str = "") -> int:
        """The size of the file ``rel`` (or of this location) in bytes."""
        if not self.remote:
            return os.path.getsize(self._local(rel))
        fs, _ = self._filesystem()
        return int(fs.size(self._remote(rel)))

    def open(self, rel: str = "", *, block_size: int | None = None) -> Any:
        """Open the file ``rel`` (or this location) for binary reading; seekable.

        Args:
            rel: a relative path below this location, ``""`` for the location itself.
            block_size: read-ahead of remote files (fsspec's default when ``None``).
        """
        if not self.remote:
            return open(self._local(rel), "rb")
        fs, _ = self._filesystem()
        kwargs = {} if block_size is None else {"block_size": block_size}
        return fs.open(self._remote(rel), "rb", **kwargs)

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the file ``rel`` (fewer only past its end: check)."""
        if not self.remote:
            with open(self._local(rel), "rb") as f:
                return os.pread(f.fileno(), end - start, start)
        fs, _ = self._filesystem()
        return bytes(fs.cat_file(self._remote(rel), start=start, end=end))

    def read_bytes(self, rel: str = "") -> bytes:
        """The whole content of the file ``rel`` (or of this location)."""
        if not self.remote:
            with open(self._local(rel), "rb") as f:
                return f.read()
        fs, _ = self._filesystem()
        return bytes(fs.cat_file(self._remote(rel)))
