"""A per-user cache of indexes for shards recordkit did not write.

Reading someone else's TFRecords must not write into their folder (a
tensorflow-datasets ``data_dir``, a read-only share, a colleague's home). An
index rebuilt for such a shard goes here instead, keyed by the shard's
absolute path, size and ``mtime_ns``: a shard rewritten in place gets a new
key, and the stale entry ages out.

Where: ``$RECORDKIT_INDEX_CACHE`` if set (``off`` keeps indexes in memory
only), else ``$XDG_CACHE_HOME/recordkit/index``, else
``~/.cache/recordkit/index``. The directory is created private (mode 0700).

Entries are the ordinary index text (the ``.idx`` format), written atomically
(temp file, fsync, rename), and never trusted blindly: a hit is validated
against the shard like any index, and one that fails is rebuilt.

Bounded: when a write takes the directory past ``$RECORDKIT_INDEX_CACHE_BYTES``
(default 1 GiB, about 50 million records' worth of index lines), the least
recently used entries (by mtime; a hit touches its entry) are removed until it
fits. Each process lists the directory once and then adds what it writes, so
opening 100k foreign shards costs O(shards), not a listing per shard; a
process that sees the estimate pass the limit lists it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading

import numpy as np

from ..errors import InvalidIndexError, ShardNotFoundError
from ._atomic import TMP_MARKER
from .index import write_index
from .shard_index import ShardIndex, load_index_file

__all__ = [
    "ENV_INDEX_CACHE",
    "ENV_INDEX_CACHE_BYTES",
    "cache_dir",
    "cache_limit",
    "cached_index",
    "cached_shard_index",
    "store_index",
]

log = logging.getLogger(__name__)

ENV_INDEX_CACHE = "RECORDKIT_INDEX_CACHE"
ENV_INDEX_CACHE_BYTES = "RECORDKIT_INDEX_CACHE_BYTES"
# 1 GiB: an index line is about 20 bytes, so this covers ~50M records of
# foreign data before the least recently used indexes are dropped (and rebuilt
# by a scan when next needed). Small against the data it indexes.
_DEFAULT_LIMIT = 1 << 30
_OFF = "off"

# directory -> bytes it holds, as far as this process knows (listed once, then
# what this process wrote added); guarded by _LOCK.
_KNOWN: dict[str, int] = {}
_LOCK = threading.Lock()


def cache_dir() -> str | None:
    """The cache directory, or ``None`` when ``RECORDKIT_INDEX_CACHE=off``."""
    value = os.environ.get(ENV_INDEX_CACHE, "").strip()
    if value.lower() == _OFF:
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "recordkit", "index")


def cache_limit() -> int:
    """The most bytes the cache directory holds (``RECORDKIT_INDEX_CACHE_BYTES``)."""
    value = os.environ.get(ENV_INDEX_CACHE_BYTES, "").strip()
    if not value:
        return _DEFAULT_LIMIT
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{ENV_INDEX_CACHE_BYTES} must be an integer >= 0, got {value!r}")
    return n


def _entry(directory: str, path: str, st: os.stat_result) -> str:
    key = f"{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return os.path.join(directory, hashlib.sha256(key).hexdigest()[:40] + ".idx")


def cached_index(path: str, buf: bytes | memoryview | object) -> np.ndarray | None:
    """A cached index for the shard at ``path`` (mapped as ``buf``), validated; else ``None``.

    Every entry and length field is checked (:func:`recordkit.format.validate_index`).
    An entry that does not validate is removed (with a log line) and ``None``
    returned, so the caller rebuilds it.
    """
    found = cached_shard_index(path, buf, full=True)
    return None if found is None else found.entries()


def cached_shard_index(
    path: str, buf: bytes | memoryview | object, *, full: bool = False, records: int | None = None
) -> ShardIndex | None:
    """:func:`cached_index` in the compact form readers hold, checked as
    :func:`recordkit.format.shard_index.load_index_file` checks a sidecar (every
    length field with ``full``, else spread samples now and the rest per run)."""
    directory = cache_dir()
    if directory is None:
        return None
    try:
        entry = _entry(directory, path, os.stat(path))
    except OSError:
        return None
    try:
        index = load_index_file(entry, buf, path=path, full=full, records=records)
    except ShardNotFoundError:
        return None
    except InvalidIndexError as exc:
        log.warning("dropping cached index: %s", exc)
        with contextlib.suppress(OSError):
            os.unlink(entry)
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # least recently used goes first
    return index


def store_index(path: str, entries: np.ndarray) -> str | None:
    """Put ``entries`` in the cache for the shard at ``path``; return the entry written.

    Best effort: a cache that cannot be written (read-only home, full disk) is
    logged and the index stays in memory (``None`` returned).
    """
    directory = cache_dir()
    if directory is None:
        return None
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        entry = _entry(directory, path, os.stat(path))
        write_index(entry, entries)
        limit = cache_limit()
        with _LOCK:
            known = _KNOWN.get(directory)
            if known is None:  # first write here from this process: list it (and trim)
                known = _trim(directory, limit, keep=entry)
            else:
                known += os.stat(entry).st_size
                if known > limit:
                    known = _trim(directory, limit, keep=entry)
            _KNOWN[directory] = known
    except OSError as exc:
        log.info(
            "could not cache the index of %s in %s (%s); using it in memory", path, directory, exc
        )
        return None
    return entry


def _trim(directory: str, limit: int, *, keep: str) -> int:
    """Remove least-recently-used entries until the directory holds at most ``limit``
    bytes (``keep`` stays); return the bytes it holds then."""
    files = []
    total = 0
    with os.scandir(directory) as it:
        for e in it:
            if not e.is_file(follow_symlinks=False):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:  # another process trimmed it
                continue
            if TMP_MARKER in e.name:
                continue  # another process's write in flight
            files.append((st.st_mtime_ns, st.st_size, e.path))
            total += st.st_size
    files.sort()
    for _, size, p in files:
        if total <= limit:
            break
        if p == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
        log.debug("index cache over %d bytes: removed %s", limit, p)
        total -= size
    return total
