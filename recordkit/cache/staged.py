"""Staged shards: the temp names a reservation's files live under until published.

Shared by the download filler (``fetch``), the writer processes (``writer``)
and the directory's bookkeeping (``directory``), which removes what a dead process
staged; it imports nothing of the cache, so a writer process stays light.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass

from ..format import TMP_MARKER
from ..format.index import INDEX_SUFFIX

__all__ = ["Staged", "discard", "is_disk_full", "staged_names"]


@dataclass
class Staged:
    """A verified shard and its index in their temp names, waiting to be published."""

    shard: str
    index: str
    bytes: int
    index_bytes: int
    records: int
    crc32c: int


def staged_names(final: str, lease_id: str) -> tuple[str, str]:
    """Temp names of a shard and its index (the reservation's id ties them to it)."""
    return f"{final}{TMP_MARKER}{lease_id}", f"{final}{INDEX_SUFFIX}{TMP_MARKER}{lease_id}"


def discard(staged: tuple[str, str]) -> list[str]:
    """Remove a staged shard's temp files; returns those that were there."""
    removed = []
    for p in staged:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
            removed.append(p)
    return removed


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that means the disk (or quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
