"""The cache's catalog: what it may hold (:class:`Catalog`, with the order it fills them
in), and the saved catalog's shape (``.recordkit-cache/catalog.json``), checked before use.

The saved catalog is read back from disk — after a restart, or when the remote cannot
be reached — so it may be another program's file or a damaged one. Every field a
filler reads is checked here, once (:func:`catalog_problem`), so a bad one means "no
catalog" (logged), never a ``TypeError`` or ``KeyError`` deep in a filler.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import RecordkitError, ShardNotFoundError
from ..format.manifest import Manifest, ShardInfo

__all__ = ["Catalog", "catalog_problem"]


class Catalog:
    """What a cache may hold, listed once by its filler, and the order it fills them in.

    Args:
        listing: lists the entries (the filler's: the remote's shards, or a
            conversion plan's partitions).
        seed: orders entries that have been fetched equally often.
        remote_url: the remote, for messages.
    """

    def __init__(
        self, listing: Callable[[], list[ShardInfo]], *, seed: int, remote_url: str
    ) -> None:
        self._listing = listing
        self.seed = seed
        self.remote_url = remote_url
        self._infos: list[ShardInfo] | None = None
        self._tiebreak: dict[str, int] = {}
        self._by_path: dict[str, ShardInfo] = {}
        self._order: list[ShardInfo] = []  # the catalog by seeded hash
        self._cursor = 0  # every entry before it has been fetched at least once

    def entries(self) -> list[ShardInfo]:
        """The entries in dataset order (listed on first use)."""
        if self._infos is None:
            infos = self._listing()
            self._tiebreak = {i.path: zlib.crc32(f"{self.seed}:{i.path}".encode()) for i in infos}
            self._by_path = {i.path: i for i in infos}
            self._order = sorted(infos, key=lambda i: (self._tiebreak[i.path], i.path))
            self._cursor = 0
            self._infos = infos
        return self._infos

    def known(self) -> dict[str, ShardInfo]:
        """The entries by relative path."""
        self.entries()
        return self._by_path

    def info(self, rel: str) -> ShardInfo:
        """The entry for shard ``rel``.

        Raises:
            ShardNotFoundError: the remote does not list it.
        """
        info = self.known().get(rel)
        if info is None:
            raise ShardNotFoundError(f"not in the remote {self.remote_url}: {rel}")
        return info

    def next(
        self,
        present: Mapping[str, Any],
        seen: Mapping[str, int],
        free: Callable[[ShardInfo], bool],
    ) -> ShardInfo | None:
        """The next entry to fill: fetched least often first, then by seeded hash.

        ``present``: the entries in the cache; ``seen``: how often evicted ones were
        fetched; ``free(info)``: whether one may be filled now (not leased, not cooling
        down after a failure). While some entry was never fetched, the answer comes
        from a cursor over the hash order that only moves forward past entries
        already fetched, so the first pass over a catalog costs O(1) per decision,
        not O(shards); after it, one pass over the catalog picks among the entries
        fetched before.
        """
        self.entries()
        order = self._order

        def fetched(info: ShardInfo) -> bool:
            return info.path in present or info.path in seen

        while self._cursor < len(order) and fetched(order[self._cursor]):
            self._cursor += 1
        for k in range(self._cursor, len(order)):
            info = order[k]
            if not fetched(info) and free(info):
                return info
        again = [i for i in order if i.path not in present and free(i)]
        if not again:
            return None
        return min(again, key=lambda i: (seen.get(i.path, 0), self._tiebreak[i.path]))


def catalog_problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with a saved catalog's shape (another program's file, a damaged
    disk), or ``None``: every field a filler reads back is checked here, once."""
    if not isinstance(doc.get("remote"), str):
        return "no remote"
    shards = doc.get("shards")
    if not isinstance(shards, list):
        return "no list of shards"
    for s in shards:
        if not isinstance(s, dict) or not set(s) <= {"path", "records", "bytes", "crc32c"}:
            return f"a shard entry {str(s)[:80]}"
        crc = s.get("crc32c")
        ints = [s.get("records"), s.get("bytes")] + ([] if crc is None else [crc])
        if not all(type(v) is int and 0 <= v < 1 << 63 for v in ints):
            return f"a shard entry {str(s)[:80]}"
        if not isinstance(s.get("path"), str):
            return f"a shard entry {str(s)[:80]}"
        try:
            ShardInfo(s["path"], s["records"], s["bytes"], crc)
        except (RecordkitError, TypeError, ValueError, AttributeError) as exc:
            return str(exc)
    manifest = doc.get("manifest")
    if manifest is not None:
        try:
            Manifest.loads(json.dumps(manifest))
        except (RecordkitError, TypeError, ValueError) as exc:
            return f"its manifest: {exc}"
    mode = doc.get("mode", "shards")
    index = doc.get("remote_index", [])
    if mode not in ("shards", "producer"):
        return f"mode {str(mode)[:20]}"
    if not isinstance(index, list) or not all(isinstance(n, str) for n in index):
        return "remote_index"
    if not isinstance(doc.get("max_bytes", 0), (int, type(None))):
        return "max_bytes"
    if mode == "producer" and not (
        isinstance(doc.get("format"), str)
        and isinstance(doc.get("options"), dict)
        and isinstance(manifest, dict)
        and isinstance(doc.get("source_options") or {}, dict)
    ):
        return "producer mode's format, options or schema"
    return None
