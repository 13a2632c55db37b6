"""Shard mode's filler: downloading one shard by ranged reads into a temp file, checked,
then published (:class:`Fetcher`).

Order of work for a shard (nothing is visible in the cache until the last step):

1. Ranged reads of ``chunk_bytes`` each, every one length-checked and retried,
   appended to ``NAME.tmp-<lease>`` while a running CRC32C is kept.
2. The total size and the CRC32C are compared with the remote manifest.
3. The index is the remote ``.idx`` if there is one and it validates against the
   downloaded bytes, else (none there, unreadable after its retries, or not
   matching) a scan that checks every record's CRC; foreign shards (no
   manifest CRC) are always scanned so. The record count must match the manifest.
4. Both files are fsync'ed; the index and then the shard are renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import (
    AccessDeniedError,
    CorruptRecordError,
    DownloadError,
    InvalidIndexError,
    ShardNotFoundError,
)
from ..format.crc import crc32c, file_crc32c
from ..format.index import (
    INDEX_SUFFIX,
    format_index,
    open_map,
    parse_index,
    scan_index,
    validate_index,
)
from ..format.manifest import Manifest, ShardInfo
from .directory import CacheDir
from .remote import Remote
from .reservation import Reservation, ShardState
from .shared import FillContext
from .staged import Staged, discard, staged_names

__all__ = ["Fetcher", "download", "index_bound"]

log = logging.getLogger(__name__)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a seam where tests inject ``ENOSPC``)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def index_bound(info: ShardInfo) -> int:
    """An upper bound on the index size of a manifest shard (exact sizes come later)."""
    digits = len(str(max(info.bytes, 1)))
    return max(info.records, 1) * (2 * digits + 2)


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
    data = None
    if has_remote_index and not foreign:
        try:
            data = remote.read_all(info.path + INDEX_SUFFIX)
        except ShardNotFoundError:
            log.info("%s has no index: scanning the download", url)
        except (DownloadError, AccessDeniedError) as exc:
            log.warning("could not read the index of %s, scanning the download: %s", url, exc)
    if data is not None:
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


def _same_mode(
    saved: dict[str, Any] | None, manifest: Manifest | None, url: str, root: str
) -> None:
    """A cache made from a remote with a manifest stays one: a remote that says it
    has none now (HTTP 404) is not read as foreign TFRecords (which would change
    every sample's shapes and drop the checksums); the catalog saved with the
    manifest is used instead, as for a remote that cannot be reached."""
    if manifest is not None or saved is None or saved.get("remote") != url:
        return
    if saved.get("manifest") is not None:
        raise ShardNotFoundError(
            f"{url} has no recordkit.json now, but had one when the cache {root} was "
            "made (a dataset being rewritten?): wait for the write to finish, or remove "
            "the cache directory to cache the remote as it is now"
        )


class Fetcher:
    """Shard mode's :class:`~recordkit.cache.reservation.Filler`: the cache's catalog is the
    remote's manifest (or listing), and each entry is filled by downloading it (see the
    module doc; the other filler is producer mode's :class:`~.produce.Producer`).

    Args:
        context: the cache's settings a filler needs.
        directory: the cache directory (where the catalog is saved).
        remote: the remote's reader (built on first use by the cache).
    """

    mode = "shards"
    # A listed shard that is missing or refused for now may be there later (a
    # remote being uploaded, credentials being renewed): retried like a bad download.
    retriable: tuple[type[BaseException], ...] = (
        DownloadError,
        ShardNotFoundError,
        AccessDeniedError,
    )

    def __init__(
        self, context: FillContext, directory: CacheDir, remote: Callable[[], Remote]
    ) -> None:
        self.context = context
        self.dir = directory
        self._remote = remote
        self.manifest: Manifest | None = None
        self._remote_index: set[str] = set()

    def catalog(self) -> list[ShardInfo]:
        """The remote's shards, saved in the cache for offline restarts (and used then)."""
        url = self.context.remote_url
        saved = self.dir.load_catalog()
        try:
            manifest, infos = self._remote().listing()
            _same_mode(saved, manifest, url, self.dir.root)
            if manifest is None:
                names = {i.path for i in infos}
                found = {n for n, _ in self._remote().files()}
                self._remote_index = {n for n in names if n + INDEX_SUFFIX in found}
            else:
                self._remote_index = {i.path for i in infos}
            self.dir.save_catalog(
                {
                    "remote": url,
                    "max_bytes": self.context.max_bytes,
                    "mode": self.mode,
                    "manifest": None if manifest is None else manifest.to_json(),
                    "shards": [i.to_json() for i in infos],
                    "remote_index": sorted(self._remote_index),
                },
                max_bytes=self.context.max_bytes,
            )
        except (DownloadError, OSError) as exc:
            if saved is None or saved.get("remote") != url:
                raise
            log.warning("remote %s: %s; using the catalog saved in the cache", url, exc)
            manifest = None
            if saved.get("manifest") is not None:
                manifest = Manifest.loads(json.dumps(saved["manifest"]))
            infos = [ShardInfo(**s) for s in saved["shards"]]
            self._remote_index = set(saved.get("remote_index", []))
        self.manifest = manifest
        return infos

    def need(self, info: ShardInfo, state: ShardState, capacity: int) -> int:
        """The reservation a download of ``info`` starts with (its index may grow it)."""
        return info.bytes + index_bound(info)

    def fill(self, info: ShardInfo, room: Reservation) -> None:
        """Download ``info`` into the reservation's temp names, verify it, publish it."""
        staged = room.stage(
            lambda: download(
                self._remote(),
                info,
                room.final,
                room.id,
                chunk_bytes=self.context.chunk_bytes,
                has_remote_index=info.path in self._remote_index,
                on_bytes=room.events.downloaded,
            )
        )
        room.publish(staged, {}, crc32c=info.crc32c)

    def keep(self, info: ShardInfo | None, size: int, meta: dict[str, Any], path: str) -> bool:
        """Whether a shard found in the cache still matches the remote (else gc removes it).

        A copy the cache's state knows nothing of (re-adopted from the directory after
        the state was lost or damaged) is vouched for by nothing: it stays only if its
        bytes have the CRC32C the remote's manifest says now (read once, then recorded);
        a copy of a remote without a manifest (no CRC to compare with) is dropped and
        fetched again.
        """
        if info is None or info.bytes != size:
            return False
        if "crc32c" in meta:  # what this cache downloaded and checked
            return info.crc32c is None or meta["crc32c"] == info.crc32c
        if info.crc32c is None:
            log.info("%s: re-adopted with no checksum, the remote has none: fetched again", path)
            return False
        found = file_crc32c(path)
        if found != info.crc32c:
            log.warning(
                "%s: a re-adopted copy whose CRC32C (%#010x) is not the remote's now (%#010x): "
                "fetched again",
                path,
                found,
                info.crc32c,
            )
            return False
        self.dir.store.vouch(info.path, found)
        return True

    def snapshot_manifest(self, shards: list[ShardInfo]) -> Manifest | None:
        """What a snapshot hands readers as ``snap.manifest``: the remote's manifest."""
        return self.manifest

    def close(self) -> None:
        """Nothing to release (downloads run in the cache's threads)."""
