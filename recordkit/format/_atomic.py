"""Atomic local publishing: temp file in the same directory, fsync, rename."""

from __future__ import annotations

import contextlib
import os
import uuid

TMP_MARKER = ".tmp-"


def temp_name(path: str) -> str:
    """A unique temp name beside ``path``: ``name.tmp-<hex>`` (cleaned up on the next run)."""
    return f"{path}{TMP_MARKER}{uuid.uuid4().hex[:12]}"


def fsync_dir(directory: str) -> None:
    """Flush a directory entry so a rename survives a power cut (no-op where unsupported)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish(tmp: str, final: str) -> None:
    """Rename ``tmp`` over ``final`` and flush the directory."""
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
