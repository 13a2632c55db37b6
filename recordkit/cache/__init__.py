"""A remote-to-local shard cache that grows while training runs, with eviction.

For datasets larger than the local disk: background workers copy shards of a
remote dataset (an fsspec URL such as ``s3://bucket/train``, or a path) into a
local directory that never holds more than ``max_bytes``; readers take, at each
epoch start, every shard that is complete by then, so early epochs see a sample
of the data and later ones more of it. When the budget is full, shards that
were already read this epoch are evicted first, then the least recently used;
a shard a reader has pinned is never evicted::

    from recordkit.cache import ShardCache

    with ShardCache("s3://bucket/train", "/scratch/cache", max_bytes="50GiB") as cache:
        for epoch in range(10):
            with cache.snapshot(epoch) as snap:           # pins what is there now
                for path in snap.paths:                   # complete, verified shards
                    ...                                   # map and read it
                    snap.mark_consumed(path, release=True)  # unmapped: may be evicted

Reader protocol (what ``recordkit.torch`` and ``recordkit.tf`` call):

1. ``snap = cache.snapshot(epoch, min_shards=1, timeout=...)`` at the start of
   each epoch. ``snap.shards`` lists :class:`~recordkit.format.ShardInfo` in
   the remote dataset's order (relative paths under ``snap.root``),
   ``snap.paths`` the absolute paths, ``snap.manifest`` the remote manifest
   (its schema). The epoch plan is a function of that list, so an epoch is
   deterministic given its shard set; ``snap.fingerprint()`` hashes it as
   ``ShardSet.fingerprint`` does. To read them (mapped on demand)::

       ShardSet(snap.root, snap.manifest, snap.shards, schema)

2. ``snap.mark_consumed(shard)`` after a shard is read; ``release=True`` (or
   ``snap.release(shard)``) once it is no longer mapped; ``snap.close()`` at
   epoch end. Pins of a process that dies are released by the kernel.
3. For an exact resume, save ``[s.path for s in snap.shards]`` in the
   ``state_dict`` and call ``cache.snapshot(epoch, shards=saved)``: missing
   shards are fetched first.

That is how readers read *growing* epochs. *Whole* epochs (the readers'
default) read every shard every epoch instead: ``cache.stream(order,
epoch=...)`` returns a :class:`Stream` that fetches the shards in the order the
reader first needs them, ahead of it and within the budget (a read-ahead window
pinned by name), and moves on as the reader releases them;
``cache.stream_stats`` (:class:`StreamStats`) counts what streams did.

Producer mode: when the remote holds raw samples rather than shards,
``ShardCache(src, local_dir, max_bytes=..., format="jsonl")`` (any converter
name; or the settings whole, ``producer=ProducerOptions(format="jsonl", ...)``)
converts them into local shards in writer processes while training runs, one shard
per partition of the conversion plan, under the same budget and eviction rules;
readers use it unchanged. See ``docs/cache.md``.

Processes that only read (DataLoader workers, other local ranks) open the
same directory with ``ShardCache(None, local_dir, max_bytes=...)`` and never
call ``start()``. Everything is coordinated with ``flock`` file locks, so one
machine's processes share one directory safely; a directory left by a killed
process is rescanned by ``start()`` and its temp files removed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers; at run time the names load on first use (below)
    from ..errors import CacheFullError, DownloadError, ProduceError
    from .producer_options import ProducerOptions
    from .remote import RetryOptions
    from .shard_cache import ShardCache
    from .shared import CacheEvents, CacheStatus
    from .snapshot import Snapshot
    from .stream import Stream, StreamStats

# Loaded on first use, so that a writer process, which imports only
# ``recordkit.cache.writer``, does not load the cache (sqlite3, the fill machinery).
_WHERE = {
    "CacheEvents": ".shared",
    "CacheFullError": "..errors",
    "CacheStatus": ".shared",
    "DownloadError": "..errors",
    "ProduceError": "..errors",
    "ProducerOptions": ".producer_options",
    "RetryOptions": ".remote",
    "ShardCache": ".shard_cache",
    "Snapshot": ".snapshot",
    "Stream": ".stream",
    "StreamStats": ".stream",
}

__all__ = [
    "CacheEvents",
    "CacheFullError",
    "CacheStatus",
    "DownloadError",
    "ProduceError",
    "ProducerOptions",
    "RetryOptions",
    "ShardCache",
    "Snapshot",
    "Stream",
    "StreamStats",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
