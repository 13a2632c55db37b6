"""Opening files that other people wrote: regular files only, sizes bounded.

A sidecar path (``.idx``, ``recordkit.json``) or a shard path can name a FIFO, a
directory or a device. ``open()`` on a FIFO blocks until a writer appears (for
ever, on a shared file system), and a directory gives ``IsADirectoryError``. So
these files are opened with ``O_NONBLOCK`` (which makes opening a FIFO return at
once), checked with ``fstat`` to be regular files, and only then read or mapped.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

from ..errors import RecordkitError

__all__ = ["map_regular", "open_regular", "read_regular"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)

# Builds the error for ``path``: ``error(reason, path)``.
ErrorFactory = Callable[[str, str], RecordkitError]


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str, error: ErrorFactory) -> int:
    """Open ``path`` read-only and return its descriptor, if it is a regular file.

    Raises:
        FileNotFoundError: ``path`` does not exist (callers turn it into their own error).
        RecordkitError: ``path`` is a directory, FIFO, socket or device, or cannot be
            opened at all (a symlink loop, a file where a directory should be, no
            permission, a name too long) (from ``error``).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError as exc:  # some systems refuse O_RDONLY on a directory
        raise error("is a directory, not a file", path) from exc
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"cannot be opened: {exc.strerror or exc}", path) from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"is {_kind(mode)}, not a regular file; refused", path)
        os.set_blocking(fd, True)  # no effect on a regular file; reads below may block normally
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, error: ErrorFactory, *, max_bytes: int, what: str) -> bytes:
    """The whole content of the regular file ``path``, refused when over ``max_bytes``.

    The size is checked by ``fstat`` before anything is read, and again while
    reading (a file that grows underneath is still cut off at ``max_bytes + 1``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        RecordkitError: not a regular file, or larger than ``max_bytes`` (from ``error``).
    """
    fd = open_regular(path, error)
    with open(fd, "rb", closefd=True) as f:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise error(f"{what} is {size} bytes, over the limit of {max_bytes}", path)
        parts = [f.read(size)]  # read() of n preallocates n: ask only for what fstat saw
        total = len(parts[0])
        while total <= max_bytes and (more := f.read(min(1 << 20, max_bytes + 1 - total))):
            parts.append(more)  # the file grew after fstat
            total += len(more)
    if total > max_bytes:
        raise error(f"{what} grew past the limit of {max_bytes} bytes while read", path)
    return b"".join(parts) if len(parts) > 1 else parts[0]


def map_regular(
    path: str, error: ErrorFactory, mapper: Callable[[int], Any], *, max_bytes: int, what: str
) -> tuple[Any, os.stat_result]:
    """``mapper(fd)`` of the regular file ``path`` (a map of it), and its ``fstat``;
    refused when over ``max_bytes``: what :func:`read_regular` checks, unread.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        RecordkitError: not a regular file, or larger than ``max_bytes`` (from ``error``).
    """
    fd = open_regular(path, error)
    try:
        st = os.fstat(fd)
        if st.st_size > max_bytes:
            raise error(f"{what} is {st.st_size} bytes, over the limit of {max_bytes}", path)
        return mapper(fd), st
    finally:
        os.close(fd)
