"""``ShardCache``: background workers fill a budgeted local directory from a remote."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol

from .._units import parse_size
from ..errors import RecordkitError, ShardNotFoundError
from ..format.index import INDEX_SUFFIX
from ..format.manifest import Manifest, ShardInfo
from ..storage import is_remote
from . import _fill
from ._dir import POLICIES, CacheDir, Scan
from ._errors import CacheFullError, DownloadError
from ._locks import HeldFile
from ._remote import Remote, RetryOptions
from ._snapshot import Snapshot

__all__ = ["CacheEvents", "CacheStatus", "ShardCache"]

log = logging.getLogger(__name__)

Policy = Literal["consumed-lru", "lru"]
# How often idle or blocked fill workers look again for work that other processes
# made possible (an eviction, a released pin); in-process changes wake them at once.
_POLL_S = 0.5
# A shard whose download failed (after its read retries) waits this long, doubling
# with each failure, before the next try.
_COOLDOWN_S = 5.0
_MAX_COOLDOWN_S = 300.0


class CacheEvents(Protocol):
    """What a cache reports as it works (the CLI shows it with tqdm; tests check budgets).

    Every method may be called from a fill worker thread; keep them quick.
    """

    def downloaded(self, nbytes: int) -> None:
        """``nbytes`` more arrived from the remote."""

    def published(self, shard: ShardInfo, used: int) -> None:
        """``shard`` became visible; ``used`` is the cache's size right after."""

    def evicted(self, path: str) -> None:
        """A shard was removed to make room."""


class _NoEvents:
    def downloaded(self, nbytes: int) -> None:
        pass

    def published(self, shard: ShardInfo, used: int) -> None:
        pass

    def evicted(self, path: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """A cache directory at one moment (``recordkit cache status``).

    Attributes:
        root: the cache directory.
        remote: the remote URL the cache was filled from (``None`` if never).
        max_bytes: the budget last configured (``None`` if unknown).
        used: bytes counted against the budget.
        complete: complete shards present.
        remote_shards: shards the remote lists (``None`` if unknown).
        downloading: reservations of downloads in progress.
        pinned: shards pinned by live readers.
        orphans: temp files and half-evicted indexes awaiting gc.
    """

    root: str
    remote: str | None
    max_bytes: int | None
    used: int
    complete: int
    remote_shards: int | None
    downloading: int
    pinned: int
    orphans: int


class ShardCache:
    """A local, size-limited copy of a remote dataset's shards, filled in the background.

    ``start()`` launches ``fill_workers`` threads that download the shards this
    cache has seen least (seeded order among equals) into ``local_dir``: each
    through a temp file, checked for size, CRC32C and index, then published
    atomically (index first). The disk budget ``max_bytes`` is never exceeded —
    space is reserved before a download begins, so temp files count — and when
    it is full the policy evicts (unlinks) shards that no reader pins.

    Readers call :meth:`snapshot` at each epoch start and read the shards it
    lists; see :mod:`recordkit.cache` for the protocol. Several processes may
    share one ``local_dir`` (DataLoader workers, local ranks, a separate
    ``recordkit cache fill``): every change happens under a file lock, and a
    process that dies releases its reservations and pins by itself.

    Args:
        remote: the dataset to cache: an fsspec URL or a local path, holding a
            recordkit manifest or a folder of ``.tfrecord`` files. ``None``
            opens ``local_dir`` as a reader only (no filling), using the remote
            recorded there.
        local_dir: the cache directory (created if missing; rescanned and
            cleaned when reused after a crash).
        max_bytes: the disk budget, an int or a string such as ``"50GiB"``.
        fill_workers: concurrent downloads. Two keep a link busy while one
            worker verifies and publishes; object stores reward a few more.
        policy: ``"consumed-lru"`` (default) evicts shards consumed in the
            current epoch first, then the least recently used, and lets the
            filler displace only shards read at least once since they arrived;
            ``"lru"`` evicts least recently used and lets the filler displace any
            unpinned shard.
        storage_options: passed to fsspec for the remote.
        retry: how remote reads are retried (:class:`RetryOptions`).
        chunk_bytes: the size of each ranged read. 8 MiB is large enough that
            per-request latency is amortised, small enough that a retry after a
            cut-off response repeats little.
        seed: orders shards that have been seen equally often.
        events: receives progress callbacks (:class:`CacheEvents`).
    """

    def __init__(
        self,
        remote: str | os.PathLike[str] | None,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int | str,
        fill_workers: int = 2,
        policy: Policy = "consumed-lru",
        storage_options: dict[str, Any] | None = None,
        retry: RetryOptions | None = None,
        chunk_bytes: int | str = "8MiB",
        seed: int = 0,
        events: CacheEvents | None = None,
    ) -> None:
        self.max_bytes = parse_size(max_bytes)
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes!r}")
        if fill_workers < 0:
            raise ValueError(f"fill_workers must be >= 0, got {fill_workers}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.chunk_bytes = parse_size(chunk_bytes)
        if self.chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes!r}")
        self.dir = CacheDir(local_dir)
        self.root = self.dir.root
        self.fill_workers = fill_workers
        self.policy: Policy = policy
        self.seed = seed
        self.events: CacheEvents = events or _NoEvents()
        self._storage_options = storage_options
        self._retry = retry
        if remote is None:
            catalog = self.dir.load_catalog()
            if catalog is None:
                raise ShardNotFoundError(f"{self.root} is not a cache (no catalog); give remote")
            self.remote_url = str(catalog["remote"])
        else:
            url = os.fspath(remote)
            self.remote_url = url if is_remote(url) else os.path.abspath(url)
        self._remote: Remote | None = None
        self._manifest: Manifest | None = None
        self._infos: list[ShardInfo] | None = None
        self._remote_index: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._failure: BaseException | None = None
        self._cooldown: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._cv = threading.Condition()
        self._gen = 0  # bumped by every in-process change that may unblock the workers
        self._last: dict[int, tuple[str, int]] = {}  # worker -> (last outcome, _gen then)
        self._state_lock = threading.Lock()
        self.errors: list[BaseException] = []

    # -- the remote's catalog ------------------------------------------------------------------

    @property
    def remote(self) -> Remote:
        """The remote dataset's reader (built on first use; retries per ``retry``)."""
        if self._remote is None:
            self._remote = Remote(self.remote_url, self._storage_options, retry=self._retry)
        return self._remote

    def catalog(self) -> list[ShardInfo]:
        """The remote's shards (fetched once; from the cache's saved copy when offline)."""
        if self._infos is None:
            try:
                manifest, infos = self.remote.listing()
                names = set()
                if manifest is None:
                    names = {i.path for i in infos}
                    found = {n for n, _ in self.remote._list_files()}
                    self._remote_index = {n for n in names if n + INDEX_SUFFIX in found}
                else:
                    self._remote_index = {i.path for i in infos}
                self.dir.save_catalog(
                    {
                        "remote": self.remote_url,
                        "max_bytes": self.max_bytes,
                        "manifest": None if manifest is None else manifest.to_json(),
                        "shards": [i.to_json() for i in infos],
                        "remote_index": sorted(self._remote_index),
                    }
                )
            except (DownloadError, OSError) as exc:
                saved = self.dir.load_catalog()
                if saved is None or saved.get("remote") != self.remote_url:
                    raise
                log.warning(
                    "remote %s unreachable (%r); using the saved catalog", self.remote_url, exc
                )
                manifest = None
                if saved.get("manifest") is not None:
                    manifest = Manifest.loads(json.dumps(saved["manifest"]))
                infos = [ShardInfo(**s) for s in saved["shards"]]
                self._remote_index = set(saved.get("remote_index", []))
            self._manifest, self._infos = manifest, infos
        return self._infos

    def _known(self) -> dict[str, ShardInfo]:
        return {i.path: i for i in self.catalog()}

    def _order_key(self, state: dict[str, Any]) -> Callable[[ShardInfo], tuple[int, int]]:
        meta = state["shards"]

        def key(info: ShardInfo) -> tuple[int, int]:
            seen = int(meta.get(info.path, {}).get("seen", 0))
            return (seen, zlib.crc32(f"{self.seed}:{info.path}".encode()))

        return key

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ShardCache:
        """Rescan and clean the directory, then start the fill workers. Returns ``self``."""
        self.gc()
        self._stop.clear()
        self._failure = None
        self._last.clear()
        for i in range(self.fill_workers if self._threads == [] else 0):
            t = threading.Thread(target=self._worker, name=f"recordkit-cache-fill-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop the fill workers (downloads in progress are abandoned and cleaned up)."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout)
            if t.is_alive():
                log.warning("fill worker %s did not stop within %s s", t.name, timeout)
        self._threads = [t for t in self._threads if t.is_alive()]

    def __enter__(self) -> ShardCache:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the fill workers (a full disk, a shard over budget)."""
        return self._failure

    def gc(self) -> list[str]:
        """Remove orphans left by dead processes and shards the remote no longer has."""
        known = self._known()
        fetched = self.dir.load_state()["shards"]

        def keep(rel: str, size: int) -> bool:
            info = known.get(rel)
            if info is None or info.crc32c is None:
                return info is not None
            crc = fetched.get(rel, {}).get("crc32c")  # what the download had
            return info.bytes == size and crc in (None, info.crc32c)

        return self.dir.gc(keep)

    def shrink(self, max_bytes: int | str) -> list[str]:
        """Evict unpinned shards (in eviction order) until the cache uses at most
        ``max_bytes``; returns the evicted shards."""
        limit = parse_size(max_bytes)
        evicted: list[str] = []
        with self.dir.lock():
            scan = self.dir.scan()
            state = self.dir.load_state()
            for rel in self.dir.victims(scan, state, self.policy, displace=False):
                if scan.used <= limit:
                    break
                scan.used -= sum(scan.complete[rel])
                self.dir.evict(rel)
                evicted.append(rel)
        return evicted

    # -- filling ---------------------------------------------------------------------------------

    def _notify(self) -> None:
        """Something in this process freed room (a release, a consumption): look again."""
        with self._cv:
            self._gen += 1
        self._wake.set()

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until the fill workers have nothing they may do (all shards present, or
        the budget full of shards they may not displace), counting only from changes
        made in this process before the call. Returns False on timeout."""
        target = self._gen
        n = len(self._threads)

        def settled() -> bool:
            last = list(self._last.values())
            return self._failure is not None or (
                len(last) >= n and all(o != "worked" and g >= target for o, g in last)
            )

        with self._cv:
            return self._cv.wait_for(settled, timeout)

    def _worker(self) -> None:
        delay = 0.01
        me = threading.get_ident()
        while not self._stop.is_set():
            gen = self._gen
            try:
                outcome = self.fill_one()
            except CacheFullError as exc:
                log.error("cache fill stopped: %s", exc)
                self._failure = exc
                self._stop.set()
                with self._cv:
                    self._cv.notify_all()
                return
            except Exception as exc:  # a remote that is down for good: keep trying, slowly
                log.error("cache fill error: %r", exc)
                self.errors.append(exc)
                outcome = "blocked"
            with self._cv:
                self._last[me] = (outcome, gen)
                self._cv.notify_all()
            if outcome == "worked":
                delay = 0.01
                continue
            self._wake.wait(min(delay, _POLL_S))
            self._wake.clear()
            delay = min(_POLL_S, delay * 2)

    def fill_one(self, only: str | None = None) -> Literal["worked", "blocked", "idle"]:
        """Download one shard now, in this thread.

        Args:
            only: this shard (a relative path); default: the next one by the fill order.

        Returns:
            ``"worked"`` (a shard was fetched, or a download failed and will be
            retried later), ``"blocked"`` (no room: pinned or unread shards fill
            the budget), or ``"idle"`` (nothing left to fetch).

        Raises:
            CacheFullError: the shard exceeds the budget, or the disk is full
                even after eviction.
        """
        infos = self.catalog()
        with self.dir.lock():
            scan = self.dir.scan()
            state = self.dir.load_state()
            busy = scan.leased | set(scan.complete)
            now = time.monotonic()
            todo = [
                i
                for i in infos
                if i.path not in busy
                and (only == i.path if only is not None else self._cooldown.get(i.path, 0) <= now)
            ]
            if not todo:
                return "idle"
            info = min(todo, key=self._order_key(state))
            need = info.bytes + _fill.index_bound(info)
            evicting = [r for r in self.dir.victims(scan, state, self.policy, displace=True)]
            lease = self.dir.reserve(
                info.path,
                need,
                max_bytes=self.max_bytes,
                policy=self.policy,
                # a shard a reader asks for (a resume) may displace any unpinned one
                displace=only is None,
                scan=scan,
                state=state,
            )
            if lease is None:
                return "blocked"
            for rel in evicting:
                if rel not in scan.complete:
                    self.events.evicted(rel)
        try:
            self._fetch(info, lease)
        except DownloadError as exc:
            # Retried later, less and less often: the remote may recover, a corrupt
            # object may be rewritten. Meanwhile the other shards go ahead.
            fails = self._failures[info.path] = self._failures.get(info.path, 0) + 1
            wait = min(_MAX_COOLDOWN_S, _COOLDOWN_S * 2 ** (fails - 1))
            self._cooldown[info.path] = time.monotonic() + wait
            self.errors.append(exc)
            log.error("could not fetch %s (retrying in %.0f s): %s", info.path, wait, exc)
        finally:
            self.dir.release(lease)
        return "worked"

    def _fetch(self, info: ShardInfo, lease: HeldFile) -> None:
        final = self.dir.path(info.path)
        lease_id = str(lease.content["id"])
        for attempt in (1, 2):
            try:
                staged = _fill.download(
                    self.remote,
                    info,
                    final,
                    lease_id,
                    chunk_bytes=self.chunk_bytes,
                    has_remote_index=info.path in self._remote_index,
                    on_bytes=self.events.downloaded,
                )
                break
            except OSError as exc:
                if not _fill.is_disk_full(exc) or isinstance(exc, RecordkitError):
                    raise
                if attempt == 2 or not self._free_disk(int(lease.content["bytes"])):
                    raise CacheFullError(
                        f"the disk under {self.root} is full ({exc.strerror}) and evicting "
                        "unpinned shards did not free enough space",
                        path=info.path,
                        needed=int(lease.content["bytes"]),
                    ) from exc
        total = staged.bytes + staged.index_bytes
        if not self.dir.grow(lease, total, max_bytes=self.max_bytes, policy=self.policy):
            _fill.discard((staged.shard, staged.index))
            raise CacheFullError(
                f"its index made it {total} bytes and no room could be made", path=info.path
            )
        extra = {"records": staged.records, "crc32c": staged.crc32c}
        scan = self.dir.publish(lease, info.path, staged.shard, staged.index, extra)
        self.events.published(
            ShardInfo(info.path, staged.records, staged.bytes, info.crc32c), scan.used
        )

    def _free_disk(self, nbytes: int) -> bool:
        with self.dir.lock():
            scan = self.dir.scan()
            victims = self.dir.victims(scan, self.dir.load_state(), self.policy, displace=True)
            freed = 0
            for rel in victims:
                if freed >= nbytes:
                    break
                freed += sum(scan.complete[rel])
                self.dir.evict(rel)
                self.events.evicted(rel)
            return freed >= nbytes

    def fill(self) -> int:
        """Fill in this thread (with ``fill_workers`` threads) until nothing is left to do.

        Stops when every remote shard is present, or when the budget is full of
        shards the policy may not displace. Returns the number of shards present.

        Raises:
            CacheFullError: as :meth:`fill_one`.
        """
        self.gc()
        failures: list[BaseException] = []

        def run() -> None:
            try:
                while self.fill_one() == "worked" and not self._stop.is_set():
                    pass
            except BaseException as exc:
                failures.append(exc)
                self._stop.set()

        threads = [threading.Thread(target=run) for _ in range(max(1, self.fill_workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._stop.clear()
        if failures:
            raise failures[0]
        with self.dir.lock():
            return len(self.dir.scan().complete)

    # -- reading -----------------------------------------------------------------------------

    def _complete_infos(self, scan: Scan, state: dict[str, Any]) -> list[ShardInfo]:
        out = []
        for info in self.catalog():
            if info.path in scan.complete:
                if info.crc32c is None:  # foreign: what the download found
                    meta = state["shards"].get(info.path, {})
                    size = scan.complete[info.path][0]
                    info = ShardInfo(info.path, int(meta.get("records", 0)), size, None)
                out.append(info)
        return out

    def snapshot(
        self,
        epoch: int | None = None,
        *,
        min_shards: int = 1,
        shards: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> Snapshot:
        """Pin and list the complete shards now present (call it at each epoch start).

        Args:
            epoch: the epoch about to be read; a larger epoch than any before
                starts a new epoch for the eviction policy.
            min_shards: wait until at least this many shards are complete (or
                all the remote has, if fewer).
            shards: exactly these shards (relative paths) — for an exact resume
                from a ``state_dict``; missing ones are fetched in this thread.
            timeout: seconds to wait; ``None`` waits as long as it takes.

        Raises:
            TimeoutError: not enough shards before ``timeout``.
            CacheFullError: the fill workers stopped on a full cache/disk.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        infos = self.catalog()
        if shards is not None:
            want = list(shards)
            unknown = set(want) - {i.path for i in infos}
            if unknown:
                raise ShardNotFoundError(
                    f"not in the remote {self.remote_url}: {sorted(unknown)[:5]}"
                )
        else:
            want = None
        delay = 0.01
        hold: HeldFile | None = None  # the wanted shards already here, while the rest come
        try:
            while True:
                with self.dir.lock():
                    scan = self.dir.scan()
                    state = self.dir.load_state()
                    present = self._complete_infos(scan, state)
                    if want is not None:
                        have = {i.path for i in present}
                        missing = [p for p in want if p not in have]
                        if not missing:
                            chosen = [i for i in present if i.path in set(want)]
                            return self._pin(chosen, epoch)
                        if hold is not None:
                            self.dir.release(hold)
                        hold = self.dir.pin([p for p in want if p in have])
                    elif len(present) >= min(min_shards, len(infos)):
                        return self._pin(present, epoch)
                if self._failure is not None:
                    raise self._failure
                if want is not None:
                    for rel in missing:
                        if self.fill_one(only=rel) == "worked":
                            delay = 0.01
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"cache {self.root}: {len(present)} shard(s) ready after {timeout} s "
                        f"({'the ones asked for' if want is not None else min_shards} needed)"
                    )
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                with self._cv:  # a fill worker of this process wakes us when it publishes
                    self._cv.wait(delay if left is None else min(delay, left))
                delay = min(_POLL_S, delay * 2)
        finally:
            if hold is not None:
                self.dir.release(hold)

    def _pin(self, chosen: list[ShardInfo], epoch: int | None) -> Snapshot:
        claim = self.dir.pin([i.path for i in chosen], epoch=epoch)
        return Snapshot(self, chosen, claim, epoch, self._manifest)

    def status(self) -> CacheStatus:
        """What the cache directory holds now."""
        catalog = self.dir.load_catalog() or {}
        with self.dir.lock():
            scan = self.dir.scan()
        return CacheStatus(
            root=self.root,
            remote=catalog.get("remote"),
            max_bytes=self.max_bytes,
            used=scan.used,
            complete=len(scan.complete),
            remote_shards=len(catalog["shards"]) if "shards" in catalog else None,
            downloading=len(scan.leases),
            pinned=len(scan.pinned),
            orphans=len(scan.orphans),
        )

    def __repr__(self) -> str:
        return f"ShardCache({self.remote_url!r}, {self.root!r}, max_bytes={self.max_bytes})"
