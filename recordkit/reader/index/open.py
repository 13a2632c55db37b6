"""How a reader gets a shard's index: the sidecar (or its binary copy in the per-user
cache), else an entry of the per-user cache, else a CRC-checked scan; checked as
:mod:`recordkit.reader.index.shard_index` says, and rebuilt when it fails.

The sizes that choose a lazy parse and a binary copy are
:data:`~recordkit.reader.index.shard_index.LAZY_MIN_TEXT` and
:data:`~recordkit.reader.index.shard_index.BINARY_MIN_TEXT` (read from there at each call).
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Any

import numpy as np

from ...errors import InvalidIndexError, ShardNotFoundError
from ...format import DEFAULT_MAX_RECORD_BYTES
from ...format.index import (
    index_path,
    max_index_bytes,
    open_map,
    read_index_text,
    scan_buffer,
    write_index,
)
from . import shard_index as si  # its sizes and parser, read at each call
from . import store
from .shard_index import ShardIndex
from .text import map_text
from .text import native as _c

__all__ = ["cached_shard_index", "ensure_index", "load_index_file", "open_index"]

log = logging.getLogger(__name__)


def _text_bytes(index_file: str) -> int:
    try:
        return os.stat(index_file).st_size
    except OSError:
        return 0  # read_index_text says why


def _verify(index: ShardIndex, buf: Any, path: str, full: bool, records: int | None) -> None:
    """The checks of a loaded index that read the shard (see the module docstring)."""
    if full or (records is not None and index.records != records):
        # A count that disagrees with the manifest: the index is checked whole, so a
        # stale index is rebuilt rather than the manifest blamed.
        index.check_all(buf, path=path)
    else:
        index.spot_check(buf, path=path)


def load_index_file(
    index_file: str,
    buf: Any,
    *,
    path: str,
    full: bool = False,
    records: int | None = None,
    cache: bool = True,
) -> ShardIndex:
    """An index file (a sidecar or a cache entry) for the shard mapped as ``buf``.

    With ``cache``, the boundaries parsed from it before (by any process) come
    from the per-user cache's binary copy instead of a parse
    (:func:`recordkit.reader.index.store.cached_bounds`), and a parse leaves one.

    Raises:
        ShardNotFoundError: there is no such file.
        InvalidIndexError: it is not a regular file, too large, malformed, or does
            not match the shard (as far as it was checked: see the module docstring).
    """
    size = len(buf)
    text_bytes = _text_bytes(index_file)
    binary = cache and text_bytes >= si.BINARY_MIN_TEXT
    lazy = _c is not None and not full and text_bytes >= si.LAZY_MIN_TEXT
    index: ShardIndex | None = None
    shard_st = None
    if binary:  # the binary copy another process left, mapped
        try:
            shard_st = os.stat(path)
        except OSError:
            binary = False
    if binary:
        bounds = store.cached_bounds(path, index_file, size, shard_st)
        if bounds is not None:
            index = ShardIndex(bounds, source=index_file, copy_of=path)
            try:
                _verify(index, buf, path, full, records)
                return index
            except InvalidIndexError as exc:  # the copy's fault, not the text's
                log.warning("%s; dropping its binary copy and reading the text", exc)
                store.drop_bounds(path, shard_st)
                index = None
    text_st = None
    if index is None:
        max_bytes = max_index_bytes(size)
        data, text_st = map_text(index_file, max_bytes) if _c is not None else (None, None)
        if lazy:
            index = ShardIndex.from_text(data, size, source=index_file, records=records)
        if index is None:
            if data is None:
                data = read_index_text(index_file, max_bytes=max_bytes)
            bounds = si.parse_bounds(data, size, where=index_file, records=records)
            index = ShardIndex(bounds, source=index_file)
        del data  # a map of the text: kept by a lazy index only
    _verify(index, buf, path, full, records)
    if binary:  # for the next process: written while this one reads on
        whole = index  # (bounds fills in what the reader has not needed yet)
        store.store_bounds_soon(path, index_file, lambda: whole.bounds, text_st, shard_st)
    return index


def open_index(
    shard_path: str | os.PathLike[str],
    *,
    buf: bytes | mmap.mmap | None = None,
    write: bool = True,
    verify: bool = True,
    cache: bool = True,
    full: bool = False,
    records: int | None = None,
) -> ShardIndex:
    """The index of ``shard_path`` as a reader holds it, rebuilt when missing or stale.

    As :func:`ensure_index` (the sidecar, else the per-user
    cache, else a CRC-checked scan; written back beside the shard with
    ``write``), but compact and checked as the module docstring says.

    Args:
        shard_path: the shard file.
        buf: the shard already mapped (the map the records will be read from).
        write, verify, cache: as for :func:`ensure_index`.
        full: check every length field now (what ``ensure_index`` does).
        records: the record count the shard should have (the manifest's).
    """
    path = os.fspath(shard_path)
    own = buf is None
    if buf is None:
        buf = open_map(path)
    try:
        idx = index_path(path)
        regular = True
        if os.path.lexists(idx):
            try:
                return load_index_file(idx, buf, path=path, full=full, records=records, cache=cache)
            except (InvalidIndexError, ShardNotFoundError) as exc:
                log.warning("rebuilding index: %s", exc)
                # Never replace a FIFO or a device someone put there; use the index in memory.
                regular = not os.path.exists(idx) or os.path.isfile(idx)
        # An index written beside the shard is checked whole first: it will be trusted
        # as a sidecar, and by other readers (DALI, tfrecord) that check nothing.
        found = (
            cached_shard_index(path, buf, full=full or write, records=records) if cache else None
        )
        if found is not None and not write:
            return found
        if found is not None:
            entries = found.entries()
        else:
            entries = scan_buffer(buf, path, verify, DEFAULT_MAX_RECORD_BYTES)
        index = found or ShardIndex.from_entries(entries, len(buf))
        if write and not regular:
            log.info("not writing index %s over something that is not a file", idx)
        elif write:
            try:
                write_index(idx, entries)
                return index
            except OSError as exc:
                log.info("could not write index %s (%s); using the per-user cache", idx, exc)
        if cache and found is None:
            store.store_index(path, entries)
        return index
    finally:
        if own and isinstance(buf, mmap.mmap):
            buf.close()


def cached_shard_index(
    path: str, buf: bytes | memoryview | object, *, full: bool = False, records: int | None = None
) -> ShardIndex | None:
    """The per-user cache's index of the shard at ``path`` (mapped as ``buf``), checked
    as :func:`load_index_file` checks a sidecar (every length field with ``full``, else
    spread samples now and the rest per run); else ``None``. An entry that does not
    validate is removed (with a log line), so the caller rebuilds it."""
    entry = store.cached_entry(path)
    if entry is None:
        return None
    try:
        index = load_index_file(entry, buf, path=path, full=full, records=records)
    except ShardNotFoundError:
        return None
    except InvalidIndexError as exc:
        store.drop_entry(entry, exc)
        return None
    store.touch(entry)  # least recently used goes first
    return index


def ensure_index(
    shard_path: str | os.PathLike[str],
    *,
    buf: bytes | mmap.mmap | None = None,
    write: bool = True,
    verify: bool = True,
    cache: bool = True,
) -> np.ndarray:
    """Return a validated index for ``shard_path``, rebuilding it when missing or stale.

    An index beside the shard is used when it validates (every entry, every
    length field). Otherwise one from the per-user cache
    (:mod:`recordkit.reader.index.store`), validated the same way; else a
    CRC-checked scan builds it. Readers hold the compact form instead
    (:func:`open_index`).

    Args:
        shard_path: the shard file.
        buf: the shard already mapped (saves a second mmap).
        write: write a rebuilt index beside the shard (for shards recordkit
            wrote, or when the user asks). When it is ``False``, or the
            directory is read-only, the index goes to the per-user cache.
        verify: check payload CRCs while rebuilding.
        cache: use the per-user cache (``False``: the index lives in memory only
            unless written beside the shard).
    """
    index = open_index(shard_path, buf=buf, write=write, verify=verify, cache=cache, full=True)
    return index.entries()
