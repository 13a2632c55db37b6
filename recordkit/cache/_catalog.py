"""The saved catalog's shape (``.recordkit-cache/catalog.json``), checked before use.

The catalog is read back from disk — after a restart, or when the remote cannot be
reached — so it may be another program's file or a damaged one. Every field a
filler reads is checked here, once, so a bad one means "no catalog" (logged), never
a ``TypeError`` or ``KeyError`` deep in a filler.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import RecordkitError
from ..format.manifest import Manifest, ShardInfo

__all__ = ["catalog_problem"]


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
