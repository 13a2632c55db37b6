"""Whole datasets only: the in-progress marker, and the check every reader makes.

A write of ours (a :class:`~recordkit.Writer`, a ``recordkit convert``, a
:func:`recordkit.write`) puts :data:`MARKER_NAME` in the dataset directory before its
first byte and removes it only after ``recordkit.json`` is published; what readers
make of a directory with the marker, a manifest or neither is told in
``docs/format.md`` (whole datasets only). :func:`check_complete` refuses an unfinished
one by name unless the caller asks for ``partial=True``.

The marker is a small JSON object, written atomically through any target with
``write_bytes(name, data)`` and ``remove(name)``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import IncompleteDatasetError, RecordkitError
from ._files import open_regular
from .manifest import MANIFEST_NAME

__all__ = [
    "MARKER_NAME",
    "Incomplete",
    "check_complete",
    "find_incomplete",
    "mark_finished",
    "mark_started",
    "marker_bytes",
]

log = logging.getLogger(__name__)

MARKER_NAME = ".recordkit-writing.json"
_MAX_MARKER_BYTES = 1 << 16  # a marker is a few hundred bytes; refuse anything absurd
_CONVERT_HINT = "rerun the same `recordkit convert` command to finish it"
_WRITE_HINT = (
    "rerun the same `recordkit.write(...)` call (or `recordkit write` command) to finish it"
)
_WRITER_HINT = "write the dataset again (a Writer block that exits normally publishes it)"
_WRITERS = ("writer", "convert", "write")
_PARTIAL_HINT = "or pass `partial=True` (`--partial`) to read what is there"


class _Target(Protocol):
    def write_bytes(self, name: str, data: bytes) -> None: ...

    def remove(self, name: str) -> None: ...


def marker_bytes(
    writer: str,
    *,
    partitions: int | None = None,
    state_dir: str | None = None,
    done_suffix: str | None = None,
    error: str | None = None,
) -> bytes:
    """The marker's content.

    Args:
        writer: ``"writer"`` (a :class:`~recordkit.Writer`), ``"convert"`` or
            ``"write"`` (:func:`recordkit.write`, a conversion of a function's samples).
        partitions: a conversion's partition count.
        state_dir: a conversion's state directory (relative), which holds one
            file per published partition ending in ``done_suffix``.
        done_suffix: see ``state_dir``.
        error: why a Writer stopped, when it knows (``ValueError: ...``).
    """
    if writer not in _WRITERS:
        raise ValueError(f"writer must be one of {_WRITERS}, got {writer!r}")
    doc: dict[str, Any] = {
        "writer": writer,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if partitions is not None:
        doc.update(partitions=partitions, state_dir=state_dir, done_suffix=done_suffix)
    if error is not None:
        doc["error"] = error[:500]
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def mark_started(target: _Target, writer: str, **info: Any) -> None:
    """Publish the marker in ``target`` (before the first shard). See :func:`marker_bytes`."""
    target.write_bytes(MARKER_NAME, marker_bytes(writer, **info))


def mark_finished(target: _Target) -> None:
    """Remove the marker (after the manifest is published)."""
    target.remove(MARKER_NAME)


@dataclass(frozen=True, slots=True)
class Incomplete:
    """What the marker of an unfinished write says.

    Attributes:
        root: the dataset directory.
        writer: ``"writer"``, ``"convert"`` or ``"write"``.
        published: partitions published (a conversion) or shards published (a Writer).
        total: a conversion's partition count (``None`` for a Writer).
        error: why a Writer stopped, when it recorded it.
    """

    root: str
    writer: str
    published: int
    total: int | None
    error: str | None = None

    @property
    def progress(self) -> str:
        """``"24 of 64 partitions published"`` or ``"4 shards published"``."""
        from .._units import plural

        if self.total is not None:
            return f"{self.published} of {plural(self.total, 'partition')} published"
        return f"{plural(self.published, 'shard')} published, no manifest"

    def message(self) -> str:
        """The refusal, naming the folder, how far the write got and how to go on."""
        if self.writer == "convert":
            what, hint = "a conversion was interrupted here", _CONVERT_HINT
        elif self.writer == "write":
            what, hint = "a recordkit.write was interrupted here", _WRITE_HINT
        else:
            stopped = f"; it stopped on {self.error}" if self.error else ""
            what, hint = f"a Writer did not finish here{stopped}", _WRITER_HINT
        return f"{self.root}: {what} ({self.progress}): {hint}, {_PARTIAL_HINT}"


Reader = Callable[[str], "bytes | None"]
Lister = Callable[[str], "list[str]"]


def _local_read(root: str) -> Reader:
    def read(rel: str) -> bytes | None:
        path = os.path.join(root, rel)
        try:  # a FIFO there must not block every reader: regular files only
            fd = open_regular(path, _not_a_marker)
        except (FileNotFoundError, RecordkitError):
            return None  # none, or not one of ours (a directory, a FIFO, a symlink loop)
        with open(fd, "rb", closefd=True) as f:
            data = f.read(_MAX_MARKER_BYTES + 1)
        return b"" if len(data) > _MAX_MARKER_BYTES else data

    return read


def _not_a_marker(reason: str, path: str) -> RecordkitError:
    return IncompleteDatasetError(f"{path}: {reason}", path=path)


def _local_list(root: str) -> Lister:
    def listdir(rel: str) -> list[str]:
        try:
            return os.listdir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            return []

    return listdir


def find_incomplete(
    root: str | os.PathLike[str],
    *,
    read: Reader | None = None,
    listdir: Lister | None = None,
) -> Incomplete | None:
    """The unfinished write in directory ``root``, or ``None`` if there is none.

    ``None`` too when a manifest is there (it is written last). Local by
    default; pass ``read(rel) -> bytes | None`` and ``listdir(rel) -> names``
    for another file system.
    """
    root = os.fspath(root)
    read = read or _local_read(root)
    listdir = listdir or _local_list(root)
    # One failed open in the common case (no marker): no listing of a folder that
    # may hold 100k shards.
    data = read(MARKER_NAME)
    if data is None:
        return None
    names = listdir("")
    if MANIFEST_NAME in names:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
    except ValueError:
        # Still ours, and still unfinished: a garbled marker does not make it whole.
        doc = {"writer": "writer"}
    kind = doc.get("writer")
    if kind in ("convert", "write") and isinstance(doc.get("partitions"), int):
        suffix = str(doc.get("done_suffix") or ".done.json")
        state = listdir(str(doc.get("state_dir") or ""))
        done = sum(1 for n in state if n.endswith(suffix) and ".tmp-" not in n)
        return Incomplete(root, str(kind), done, int(doc["partitions"]))
    shards = sum(1 for n in names if n.endswith(".tfrecord") and ".tmp-" not in n)
    error = doc.get("error")
    return Incomplete(root, "writer", shards, None, error if isinstance(error, str) else None)


def check_complete(
    root: str | os.PathLike[str],
    partial: bool = False,
    *,
    read: Reader | None = None,
    listdir: Lister | None = None,
) -> Incomplete | None:
    """Refuse a directory where a write of ours did not finish.

    Args:
        root: the dataset directory (a file path is not a directory: ``None``).
        partial: read what is there anyway: log a WARNING that says how much,
            and return the :class:`Incomplete` instead of raising.
        read, listdir: see :func:`find_incomplete`.

    Returns:
        ``None`` for a whole dataset or a foreign folder; with ``partial`` the
        unfinished write found.

    Raises:
        IncompleteDatasetError: the marker is there, no manifest, not ``partial``.
    """
    found = find_incomplete(root, read=read, listdir=listdir)
    if found is None:
        return None
    if not partial:
        raise IncompleteDatasetError(found.message(), path=found.root)
    if found.total is not None:
        log.warning(
            "%s: partial=True: reads %d of %d partitions (the shards published so far)",
            found.root,
            found.published,
            found.total,
        )
    else:
        log.warning(
            "%s: partial=True: reads the %d shard(s) an unfinished Writer published",
            found.root,
            found.published,
        )
    return found
