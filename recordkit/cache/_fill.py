"""Downloading one shard: ranged reads into a temp file, checked, then published.

Order of work for a shard (nothing is visible in the cache until the last step):

1. Ranged reads of ``chunk_bytes`` each, every one length-checked and retried,
   appended to ``NAME.tmp-<lease>`` while a running CRC32C is kept.
2. The total size and the CRC32C are compared with the remote manifest.
3. The index is the remote ``.idx`` if there is one and it validates against the
   downloaded bytes, else a CRC-checked scan; foreign shards (no manifest CRC)
   are always scanned with every record CRC checked. The record count must
   match the manifest.
4. Both files are fsync'ed; the index and then the shard are renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptRecordError, InvalidIndexError
from ..format._atomic import TMP_MARKER
from ..format.crc import crc32c
from ..format.index import (
    INDEX_SUFFIX,
    format_index,
    open_map,
    parse_index,
    scan_index,
    validate_index,
)
from ..format.manifest import ShardInfo
from ._errors import DownloadError
from ._remote import Remote

log = logging.getLogger(__name__)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a seam where tests inject ``ENOSPC``)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


@dataclass
class Staged:
    """A verified download waiting to be published."""

    shard: str
    index: str
    bytes: int
    index_bytes: int
    records: int
    crc32c: int


def index_bound(info: ShardInfo) -> int:
    """An upper bound on the index size of a manifest shard (exact sizes come later)."""
    digits = len(str(max(info.bytes, 1)))
    return max(info.records, 1) * (2 * digits + 2)


def staged_names(final: str, lease_id: str) -> tuple[str, str]:
    """Temp names of a download's shard and index (the lease id ties them to it)."""
    return f"{final}{TMP_MARKER}{lease_id}", f"{final}{INDEX_SUFFIX}{TMP_MARKER}{lease_id}"


def discard(staged: tuple[str, str]) -> None:
    """Remove a download's temp files."""
    for p in staged:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def download(
    remote: Remote,
    info: ShardInfo,
    final: str,
    lease_id: str,
    *,
    chunk_bytes: int,
    has_remote_index: bool,
    on_bytes: object = None,
) -> Staged:
    """Fetch ``info`` into temp files beside ``final`` and verify it (see the module doc).

    Raises:
        DownloadError: the remote failed after retries, or the bytes are wrong.
        OSError: local write errors (``ENOSPC`` among them); temp files are removed.
    """
    os.makedirs(os.path.dirname(final), exist_ok=True)
    staged = staged_names(final, lease_id)
    try:
        size = info.bytes
        crc = 0
        fd = os.open(staged[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for start in range(0, size, chunk_bytes):
                data = remote.read_range(info.path, start, min(size, start + chunk_bytes))
                crc = crc32c(data, crc)
                _write_all(fd, data)
                if callable(on_bytes):
                    on_bytes(len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        url = remote.full(info.path)
        if os.path.getsize(staged[0]) != size:
            raise DownloadError(
                f"downloaded {os.path.getsize(staged[0])} bytes, expected {size}", url=url
            )
        if info.crc32c is not None and crc != info.crc32c:
            raise DownloadError(
                f"CRC32C of the download is {crc:#010x}, the manifest says {info.crc32c:#010x}",
                url=url,
            )
        entries = _index_for(remote, info, staged[0], has_remote_index)
        if info.crc32c is not None and len(entries) != info.records:
            raise DownloadError(
                f"the shard has {len(entries)} records, the manifest says {info.records}", url=url
            )
        text = format_index(entries)
        fd = os.open(staged[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, text)
            os.fsync(fd)
        finally:
            os.close(fd)
        return Staged(staged[0], staged[1], size, len(text), len(entries), crc)
    except BaseException:
        discard(staged)
        raise


def _index_for(remote: Remote, info: ShardInfo, path: str, has_remote_index: bool) -> np.ndarray:
    url = remote.full(info.path)
    foreign = info.crc32c is None
    if has_remote_index and not foreign:
        data = remote.read_all(info.path + INDEX_SUFFIX)
        buf = open_map(path)
        try:
            entries = parse_index(data, path=url + INDEX_SUFFIX)
            validate_index(entries, buf, path=path, index_file=url + INDEX_SUFFIX)
            return entries
        except InvalidIndexError as exc:
            log.warning("remote index does not match the shard, rebuilding it: %s", exc)
        finally:
            if not isinstance(buf, bytes):
                buf.close()
    try:
        # Foreign shards have no whole-file CRC to check against: check every record's.
        return scan_index(path, verify=True)
    except CorruptRecordError as exc:
        raise DownloadError(f"downloaded shard is corrupt: {exc}", url=url) from exc


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that means the disk (or quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
