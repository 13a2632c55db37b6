"""Where datasets live: local directories, and any fsspec URL (the only fsspec user).

Local paths (and ``file://`` URLs) never import fsspec. Remote URLs are opened
lazily through fsspec with the caller's ``storage_options``; credentials and
endpoints come from fsspec's usual sources (e.g. ``AWS_ENDPOINT_URL``).

Publishing is atomic on both: locally a temp file in the same directory is
fsync'ed and renamed; remotely the file is staged on local disk, uploaded under
a temp key and then moved to its final key, so a reader listing the prefix
never sees a partial object under a final name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from typing import Any, Protocol

from ._deps import require
from .format._atomic import TMP_MARKER, atomic_write_bytes, fsync_dir, temp_name

__all__ = ["DirectoryTarget", "is_remote", "open_target", "strip_file_scheme"]

log = logging.getLogger(__name__)


def strip_file_scheme(url: str | os.PathLike[str]) -> str:
    """Return a local path for ``file://`` URLs and plain paths, unchanged otherwise."""
    url = os.fspath(url)
    return url[len("file://") :] if url.startswith("file://") else url


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
    """A directory on any fsspec filesystem; files are staged in a local temp dir."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        fsspec = require("fsspec", extra="s3")
        self.fs, self.path = fsspec.core.url_to_fs(url, **(storage_options or {}))
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
