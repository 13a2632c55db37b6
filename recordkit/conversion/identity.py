"""A conversion's identity is its source: what a destination was made from, and how a
new plan differs from it.

A plan's fingerprint covers the source's location and every item's key, size and
content identity (:attr:`recordkit.conversion.plan.Partition.versions`: the file's
modification time, ETag, version id or a content hash). So that a refusal can say
*what* differs, the listing behind it is kept: in the state directory while a
conversion runs (:data:`STATE_LISTING`), and beside the manifest once it is done
(:data:`KEPT_LISTING`, a hidden file no reader looks at), zstd-compressed JSON:
``{"source": url, "files": {path: version}, "partitions": [[digest, [[key, size,
version], ...]], ...]}``.
"""

from __future__ import annotations

import json
from typing import Any

import zstandard

from .plan import Plan

__all__ = ["KEPT_LISTING", "STATE_LISTING", "difference", "listing", "load_listing"]

STATE_LISTING = "source.json.zst"
"""The plan's listing in the state directory (``.recordkit-convert/``) while it runs."""
KEPT_LISTING = ".recordkit-source.json.zst"
"""The listing a finished conversion leaves beside its manifest."""

_MAX_LISTING = 1 << 30  # decompressed: ~20 million items; a bigger one is not read


def listing(plan: Plan) -> bytes:
    """The plan's source and items, compressed (see the module docstring)."""
    doc = {
        "source": plan.source,
        "files": dict(plan.files),
        "partitions": [[p.digest(), p.identity()] for p in plan.partitions],
    }
    return zstandard.ZstdCompressor(level=3).compress(
        json.dumps(doc, separators=(",", ":")).encode()
    )


def load_listing(data: bytes | None) -> dict[str, Any] | None:
    """A listing written by :func:`listing` (``None`` if absent or unreadable)."""
    if not data:
        return None
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=_MAX_LISTING)
        doc = json.loads(raw)
    except (zstandard.ZstdError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def difference(old: dict[str, Any] | None, plan: Plan) -> str:
    """How ``plan`` differs from the listing ``old`` a destination was made from, in
    words: the other source, or the first item that differs; else the options."""
    if old is None:
        return "another source, schema or options (made by a recordkit that kept no listing)"
    before = str(old.get("source", ""))
    if before != plan.source:
        return f"it was made from {before or 'other inputs'}, this run reads {plan.source}"
    files_then, files_now = old.get("files") or {}, dict(plan.files)
    if files_then and files_now and files_then != files_now:
        for rel in sorted(set(files_then) | set(files_now)):
            was, is_ = files_then.get(rel), files_now.get(rel)
            if was != is_:
                name = rel or plan.source
                if was is None:
                    return f"{name!r} is new"
                if is_ is None:
                    return f"{name!r} is gone"
                return f"{name!r} changed since ({was} then, {is_} now)"
    then = [(str(d), rows) for d, rows in old.get("partitions", [])]
    now = [(p.digest(), p.identity()) for p in plan.partitions]
    old_rows = [tuple(r) for _, rows in then for r in rows]
    new_rows = [tuple(r) for _, rows in now for r in rows]
    for a, b in zip(old_rows, new_rows):
        if a != b:
            if a[0] != b[0]:
                return f"the items differ from {a[0]!r} (then) / {b[0]!r} (now) on"
            what = "size" if a[1] != b[1] else "content"
            return f"{b[0]!r} changed since ({what}: {_said(a)} then, {_said(b)} now)"
    if len(old_rows) != len(new_rows):
        more = new_rows[len(old_rows)] if len(new_rows) > len(old_rows) else None
        if more is not None:
            return f"{more[0]!r} is new ({len(new_rows)} items now, {len(old_rows)} then)"
        gone = old_rows[len(new_rows)]
        return f"{gone[0]!r} is gone ({len(new_rows)} items now, {len(old_rows)} then)"
    if [d for d, _ in then] != [d for d, _ in now]:
        return "the same items, cut into other partitions (other options)"
    return "the same source, with another schema or other options"


def _said(row: tuple[Any, ...]) -> str:
    size, version = row[1], row[2]
    return f"{size:,} bytes, {version}" if version else f"{size:,} bytes"
