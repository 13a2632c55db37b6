"""A per-user cache of indexes: text for shards recordkit did not write, binary for all.

The store keeps files and hands back paths and arrays; what an index is, and how a
text entry is loaded and checked, is :mod:`recordkit.reader.index.open`'s. Where it
is, its bound and what users see: ``RECORDKIT_INDEX_CACHE`` and
``RECORDKIT_INDEX_CACHE_BYTES`` in ``docs/reference/environment.md``; how binary
copies are checked: ``docs/format.md``.

Text entries: reading someone else's TFRecords must not write into their folder (a
tensorflow-datasets ``data_dir``, a read-only share), so an index rebuilt for such a
shard goes here, keyed by the shard's absolute path, size and ``mtime_ns`` (a shard
rewritten in place gets a new key; the stale entry ages out), written atomically
(temp file, fsync, rename), and validated against the shard like any index.

Binary entries (``bounds/*.bnd``): the boundaries a reader parsed from an index text
(a 56-byte header, then ``n + 1`` little-endian ``uint32``, or ``uint64`` past 4 GiB),
one per shard, keyed by its absolute path (``os.fsencode``), size, ``mtime_ns`` and
inode; the header names the text it was parsed from (size, ``mtime_ns``, inode), and a
copy of another text is a miss that the next parse replaces. Derived data: written
without fsync (a torn or lost file fails the checks), on a background thread, keyed by
the files as they were then, into the directory as it was when the write was asked for.

Bounded: a write that takes a directory (the text entries, or ``bounds/``) past the
limit removes the least recently used entries (a hit sets its access time, leaving the
modification time that a copy's header names) down to 90% of it, so a full cache is
listed once per tenth of its size written. Each process lists a directory once and
then adds what it writes (opening 100k foreign shards is O(shards)); an estimate past
the limit lists it again. Temp files older than an hour (dead writers) go at a listing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import InvalidIndexError
from ...format import TMP_MARKER, temp_name
from ...format.index import write_index
from . import text  # its native module (None without one), read at each call

__all__ = [
    "ENV_INDEX_CACHE",
    "ENV_INDEX_CACHE_BYTES",
    "cache_dir",
    "cache_limit",
    "cached_bounds",
    "cached_entry",
    "drop_bounds",
    "drop_entry",
    "store_bounds_soon",
    "store_index",
    "touch",
    "wait_stored",
]

log = logging.getLogger(__name__)

ENV_INDEX_CACHE = "RECORDKIT_INDEX_CACHE"
ENV_INDEX_CACHE_BYTES = "RECORDKIT_INDEX_CACHE_BYTES"
# 1 GiB: an index line is about 20 bytes, so this covers ~50M records of
# foreign data before the least recently used indexes are dropped (and rebuilt
# by a scan when next needed). Small against the data it indexes.
_DEFAULT_LIMIT = 1 << 30
_OFF = "off"
_LOW_WATER = 0.9  # a trim leaves the directory at this share of the limit
_STALE_TMP_S = 3600  # a temp file this old is a dead process's: removed by a trim
_BOUNDS_SUFFIX = ".bnd"
_BOUNDS_MAGIC = b"RKBNDS02"
# magic, records, shard bytes, item size; the text it was parsed from: size, mtime_ns, inode
_BOUNDS_HEADER = struct.Struct("<8sQQI4xQQQ")

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
    # os.fsencode: a path that is not UTF-8 (surrogate-escaped) keys as its bytes
    key = os.fsencode(os.path.abspath(path)) + f"\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return os.path.join(directory, hashlib.sha256(key).hexdigest()[:40] + ".idx")


def touch(entry: str) -> None:
    """Mark ``entry`` used now: its access time (the LRU order of a trim). Its
    modification time stays what it was written with: a binary copy made from a
    text entry is checked against the text's ``mtime_ns``."""
    with contextlib.suppress(OSError):
        st = os.stat(entry)
        os.utime(entry, ns=(time.time_ns(), st.st_mtime_ns))


def cached_entry(path: str) -> str | None:
    """Where the cache keeps the index text of the shard at ``path`` as it is now
    (its path, size and ``mtime_ns``): ``None`` when the cache is off or the shard
    cannot be stat'ed. The entry may not exist (a miss)."""
    directory = cache_dir()
    if directory is None:
        return None
    try:
        return _entry(directory, path, os.stat(path))
    except OSError:
        return None


def drop_entry(entry: str, why: Exception) -> None:
    """Remove a text entry that did not validate against its shard (``why``), logged."""
    log.warning("dropping cached index: %s", why)
    with contextlib.suppress(OSError):
        os.unlink(entry)


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
        _account(directory, entry)
    except OSError as exc:
        log.info(
            "could not cache the index of %s in %s (%s); using it in memory", path, directory, exc
        )
        return None
    return entry


def _bounds_dir() -> str | None:
    """Where binary entries go: ``bounds/`` in the cache directory (its own budget)."""
    directory = cache_dir()
    return None if directory is None else os.path.join(directory, "bounds")


def _bounds_entry(directory: str, path: str, st: os.stat_result) -> str:
    """The one binary entry of the shard at ``path`` as ``st`` describes it (its path,
    size, ``mtime_ns`` and inode): a shard has one copy, whichever text it came from
    (the header says which, :func:`_text_identity`)."""
    key = (
        b"bounds\0"
        + os.fsencode(os.path.abspath(path))
        + f"\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}".encode()
    )
    return os.path.join(directory, hashlib.sha256(key).hexdigest()[:40] + _BOUNDS_SUFFIX)


def _text_identity(st: os.stat_result) -> tuple[int, int, int]:
    """What a copy's header records of the text it was parsed from."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def _bounds_dtype(shard_bytes: int) -> np.dtype:
    return np.dtype("<u4" if shard_bytes < 1 << 32 else "<u8")


def cached_bounds(
    path: str, index_file: str, shard_bytes: int, shard_st: os.stat_result | None = None
) -> np.ndarray | None:
    """The boundaries parsed from ``index_file`` for the shard at ``path``, if cached:
    mapped (the page cache's, no descriptor held) with the native extension, read
    without it.

    Only the header (the shard's size, the text it was parsed from as it is now), the
    length and the first and last boundary are checked here;
    :class:`~recordkit.reader.index.ShardIndex` checks the rest per run (and a
    copy that fails there is dropped and the text parsed instead). ``None`` on a miss
    (a copy of another text is one); an entry that does not fit is removed. Anything
    but a regular file is refused without being opened for reading.
    """
    directory = _bounds_dir()
    if directory is None:
        return None
    dtype = _bounds_dtype(shard_bytes)
    try:
        st = shard_st or os.stat(path)
        text = _text_identity(os.stat(index_file))
        entry = _bounds_entry(directory, path, st)
        # Non-blocking: a FIFO (or a device) at the key must not block the reader.
        fd = os.open(entry, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # a miss (or an unreadable cache: the text is parsed)
        return None
    bounds = None
    other_text = regular = False
    try:
        st_entry = os.fstat(fd)
        regular = stat.S_ISREG(st_entry.st_mode)
        head = os.pread(fd, _BOUNDS_HEADER.size, 0) if regular else b""
        if len(head) == _BOUNDS_HEADER.size:
            magic, records, size, itemsize, *made_from = _BOUNDS_HEADER.unpack(head)
            want = _BOUNDS_HEADER.size + (records + 1) * dtype.itemsize
            fits = magic == _BOUNDS_MAGIC and size == shard_bytes and records <= shard_bytes // 16
            fits = fits and itemsize == dtype.itemsize and st_entry.st_size == want
            other_text = fits and tuple(made_from) != text
            if fits and not other_text:
                bounds = _load_bounds(fd, dtype, records + 1)
    except OSError:
        bounds = None
    finally:
        os.close(fd)
    if other_text:
        return None  # made from another text: replaced once this one is parsed
    if bounds is None or int(bounds[0]) != 0 or int(bounds[-1]) != shard_bytes:
        log.info("dropping cached index boundaries %s: they do not fit %s", entry, path)
        if regular:  # never remove a FIFO or a device someone put there
            with contextlib.suppress(OSError):
                os.unlink(entry)
        return None
    touch(entry)  # least recently used goes first
    out: np.ndarray = bounds.astype(bounds.dtype.newbyteorder("="), copy=False)
    return out


def _load_bounds(fd: int, dtype: np.dtype, count: int) -> np.ndarray:
    c = text.native  # the native module: maps without a descriptor
    if c is not None:
        return np.frombuffer(c.map_fd(fd), dtype=dtype, count=count, offset=_BOUNDS_HEADER.size)
    with open(fd, "rb", closefd=False) as f:
        f.seek(_BOUNDS_HEADER.size)
        return np.fromfile(f, dtype=dtype, count=count)


def _write_bounds(
    directory: str,
    path: str,
    shard_st: os.stat_result,
    text_st: os.stat_result,
    bounds: np.ndarray,
) -> str | None:
    shard_bytes = int(bounds[-1])
    dtype = _bounds_dtype(shard_bytes)
    entry = _bounds_entry(directory, path, shard_st)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = temp_name(entry)
        try:
            with open(tmp, "wb") as f:
                f.write(
                    _BOUNDS_HEADER.pack(
                        _BOUNDS_MAGIC,
                        len(bounds) - 1,
                        shard_bytes,
                        dtype.itemsize,
                        *_text_identity(text_st),
                    )
                )
                f.write(np.ascontiguousarray(bounds, dtype=dtype).tobytes())
            os.replace(tmp, entry)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _account(directory, entry)
    except OSError as exc:
        log.info("could not cache the index boundaries of %s in %s (%s)", path, directory, exc)
        return None
    return entry


# Binary copies are written on one background thread (store_bounds_soon): the reader
# that parsed the text goes on to its first records meanwhile.
_soon: ThreadPoolExecutor | None = None
_soon_pid = 0
_soon_lock = threading.Lock()


def _soon_pool() -> ThreadPoolExecutor:
    global _soon, _soon_pid
    with _soon_lock:
        if _soon is None or _soon_pid != os.getpid():  # a forked child has no such thread
            _soon = ThreadPoolExecutor(
                1, thread_name_prefix="recordkit-index-store", initializer=_lowest_priority
            )
            _soon_pid = os.getpid()
        return _soon


def store_bounds_soon(
    path: str,
    index_file: str,
    bounds: Callable[[], np.ndarray],
    text_st: os.stat_result | None = None,
    shard_st: os.stat_result | None = None,
) -> None:
    """Keep the boundaries ``bounds()`` returns, parsed from ``index_file`` for the shard
    at ``path``, on a background thread (:func:`wait_stored` waits for it); best effort,
    like :func:`store_index`, and without fsync (the entry is checked when read).

    The copy is for the next process, so nobody waits for it; a process that exits
    first finishes the writes it queued (the interpreter joins the thread at exit).
    Where it goes and what it is keyed on are taken now: the cache directory, the
    shard as it was mapped (``shard_st``) and the text as it was read (``text_st``;
    else both are stat'ed now), so a text replaced meanwhile never gets this parse as
    its copy, and a write that waits behind others lands where it was asked for. An
    index loaded a block at a time is filled in whole there first, at the lowest CPU
    priority (after the reader's own work, on a busy machine); one whose text turns
    out malformed there gets no copy (its reader raises if it reaches the bad line).
    """
    directory = _bounds_dir()
    if directory is None:
        return
    try:
        text_st = text_st or os.stat(index_file)
        shard_st = shard_st or os.stat(path)
    except OSError:
        return  # gone: nothing to key a copy on
    job = (directory, path, shard_st, text_st, bounds)
    try:
        _soon_pool().submit(_complete_and_write, *job)
    except RuntimeError:  # the interpreter is shutting down: no new threads
        _complete_and_write(*job)


def _complete_and_write(
    directory: str,
    path: str,
    shard_st: os.stat_result,
    text_st: os.stat_result,
    bounds: Callable[[], np.ndarray],
) -> str | None:
    try:
        whole = bounds()  # fills in what the reader has not needed yet
    except InvalidIndexError as exc:
        log.info("no binary copy of the index of %s: %s", path, exc)
        return None
    return _write_bounds(directory, path, shard_st, text_st, whole)


def _lowest_priority() -> None:
    """The copies' thread yields the CPU to everything else (Linux: per thread)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def wait_stored() -> None:
    """Wait for the binary copies :func:`store_bounds_soon` queued in this process
    (one thread writes them in order: what is queued after them is reached last)."""
    _soon_pool().submit(lambda: None).result()


def _after_fork_in_child() -> None:
    global _soon_lock
    _soon_lock = threading.Lock()  # a parent's thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def drop_bounds(path: str, shard_st: os.stat_result | None = None) -> None:
    """Remove the binary entry of the shard at ``path`` (it failed a check)."""
    directory = _bounds_dir()
    if directory is None:
        return
    with contextlib.suppress(OSError):
        entry = _bounds_entry(directory, path, shard_st or os.stat(path))
        if stat.S_ISREG(os.lstat(entry).st_mode):
            os.unlink(entry)


def _account(directory: str, entry: str) -> None:
    """Add a written entry to what this process knows the directory holds; trim past the limit."""
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


def _trim(directory: str, limit: int, *, keep: str) -> int:
    """Remove least-recently-used entries until the directory holds at most 90% of
    ``limit`` bytes if it holds more than ``limit`` (``keep`` stays), and temp files
    of writes that died; return the bytes it holds then."""
    files = []
    total = 0
    now = time.time()
    with os.scandir(directory) as it:
        for e in it:
            if not e.is_file(follow_symlinks=False):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:  # another process trimmed it
                continue
            if TMP_MARKER in e.name:  # another process's write in flight, or a dead one's
                if now - st.st_mtime > _STALE_TMP_S:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
                continue
            # the last use (a hit sets the access time, touch; a write sets both)
            files.append((max(st.st_atime_ns, st.st_mtime_ns), st.st_size, e.path))
            total += st.st_size
    if total <= limit:
        return total
    files.sort()
    target = int(limit * _LOW_WATER)
    for _, size, p in files:
        if total <= target:
            break
        if p == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
        log.debug("index cache over %d bytes: removed %s", limit, p)
        total -= size
    return total
