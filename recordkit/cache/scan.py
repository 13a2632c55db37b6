"""What a look at a cache directory finds (:class:`Scan`), and the walk of its files.

:meth:`CacheDir.scan <recordkit.cache.directory.CacheDir.scan>` fills a :class:`Scan`
from the store and the claim files, per event; :func:`walk` sorts every file under
the directory into published shards, indexes, temp files and files that are not
the cache's (at ``start()``/``gc()`` and ``status()``, or after a crash).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..format import TMP_MARKER
from ..format.index import INDEX_SUFFIX
from .remote import is_shard_name

__all__ = ["META", "Scan", "is_temp", "walk"]

META = ".recordkit-cache"
_OUR_TEMP = re.compile(re.escape(TMP_MARKER) + "[0-9a-f]{12}$")


def is_temp(name: str) -> bool:
    """True for a temp file name the cache makes (``NAME.tmp-<12 hex digits>``)."""
    return _OUR_TEMP.search(name) is not None


@dataclass
class Scan:
    """The cache directory as it is now.

    Attributes:
        complete: published shards (shard and index present): path -> (shard bytes, index bytes).
        used: bytes counted against the budget (bookkeeping included, slack not).
        leases: live reservations by claim name.
        pinned: shards that some live reader pins (``None`` in it: pin everything).
        bookkeeping: bytes under ``.recordkit-cache/``.
        orphans: temp files and half-evicted indexes that no live process owns
            (found by :func:`walk` only).
        incomplete: shard files without an index (never left by recordkit itself;
            :func:`walk` only).
        foreign: bytes of files that are not the cache's (:func:`walk` only).
    """

    complete: dict[str, tuple[int, int]] = field(default_factory=dict)
    used: int = 0
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    pinned: set[str | None] = field(default_factory=set)
    bookkeeping: int = 0
    orphans: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    foreign: int = 0

    @property
    def leased(self) -> set[str]:
        return {str(c.get("shard")) for c in self.leases.values()}

    def is_pinned(self, rel: str) -> bool:
        return None in self.pinned or rel in self.pinned


def _files(root: str) -> Iterable[tuple[str, str, int]]:
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d != META]
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                size = os.lstat(full).st_size
            except FileNotFoundError:
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            yield rel, name, size


def walk(root: str, out: Scan) -> None:
    """Walk the files under ``root`` (not the bookkeeping) into ``out``, whose
    ``leases`` are read already: the complete and incomplete shards, the orphans,
    the bytes of files that are not the cache's, and every file's bytes in ``used``."""
    live_ids = {str(c.get("id")) for c in out.leases.values()}
    shards: dict[str, int] = {}
    indexes: dict[str, int] = {}
    for rel, name, size in _files(root):
        if is_temp(name):
            if name.rsplit(TMP_MARKER, 1)[1] in live_ids:
                continue  # counted through its reservation
            out.orphans.append(rel)
        elif name.endswith(INDEX_SUFFIX) and is_shard_name(name[: -len(INDEX_SUFFIX)]):
            indexes[rel[: -len(INDEX_SUFFIX)]] = size
        elif is_shard_name(name):
            shards[rel] = size
        else:
            out.foreign += size  # not ours: counted against the budget, never removed
        out.used += size
    leased = out.leased
    for rel, size in shards.items():
        if rel in indexes:
            out.complete[rel] = (size, indexes[rel])
        else:
            out.incomplete.append(rel)
    # An index without its shard: a publish in progress (leased) or an eviction cut short.
    out.orphans += [
        rel + INDEX_SUFFIX for rel in indexes if rel not in shards and rel not in leased
    ]
