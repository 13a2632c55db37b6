"""The reader-facing side of ``ShardCache``: epoch snapshots, whole-epoch streams, status.

:class:`Reading` is a base class of :class:`~recordkit.cache.ShardCache` (this module
does not import it): what it uses of the cache is declared below.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from ..errors import ShardNotFoundError
from ..format.manifest import ShardInfo
from ._dir import CacheDir, Scan
from ._locks import HeldFile
from ._reservation import Filler
from ._snapshot import Snapshot
from ._stream import Stream, StreamStats, fetch_one
from ._types import CacheEvents, CacheStatus

__all__ = ["POLL_S", "Reading"]

# How often idle or blocked fill workers, and snapshots waiting for shards, look again
# for work that other processes made possible (an eviction, a released pin, a shard
# published); in-process changes wake them at once.
POLL_S = 0.5


class Reading:
    """Snapshots (growing epochs), streams (whole epochs) and the status of a cache."""

    root: str
    dir: CacheDir
    remote_url: str
    max_bytes: int
    policy: str
    fill_workers: int
    events: CacheEvents
    stream_stats: StreamStats
    _filler: Filler
    _cv: threading.Condition
    _streams: set[Stream]
    _failure: BaseException | None

    if TYPE_CHECKING:  # the cache's own (see ShardCache)

        def catalog(self) -> list[ShardInfo]: ...

        def info(self, rel: str) -> ShardInfo: ...

        def fill_one(self, only: str | None = None) -> Literal["worked", "blocked", "idle"]: ...

        def _notify(self) -> None: ...

    # -- whole epochs --------------------------------------------------------------------------

    def stream(
        self,
        order: Sequence[ShardInfo],
        *,
        epoch: int | None = None,
        timeout: float | None = None,
        workers: int | None = None,
        capacity: int | None = None,
    ) -> Stream:
        """Fetch shards in the order a reader needs them, ahead of it (whole epochs).

        The returned :class:`~recordkit.cache._stream.Stream` pins a read-ahead
        window of the next shards of ``order`` (as many as the budget holds
        beside what the reader still reads), downloads them in order with
        ``workers`` threads (default ``fill_workers``, at least 1), evicting
        unpinned shards (consumed first) to make room, and moves the window on
        as the reader lets shards go (``stream.release``). While a stream runs,
        this cache's own fill workers fetch nothing else. ``stream.close()``
        when the pass ends.

        Args:
            order: the shards, in the order they are first needed.
            epoch: the epoch read (for the eviction policy).
            timeout: seconds a reader waits for one shard.
            workers: concurrent downloads.
            capacity: hold at most this many bytes of shards (and their indexes)
                in the window (default: all the budget leaves beside the cache's
                own files).
        """
        if self._filler.mode != "shards":
            raise ValueError(
                f"cache {self.root} is in producer mode: its shards are made while training "
                "runs, so an epoch cannot be planned over all of them (read it with growing "
                "epochs)"
            )
        stream = Stream(
            self,
            order,
            epoch=epoch,
            workers=workers or max(1, self.fill_workers),
            timeout=timeout,
            stats=self.stream_stats,
            capacity=capacity,
        )
        with self._cv:
            self._streams.add(stream)
        return stream

    def _stream_ended(self, stream: Stream) -> None:
        with self._cv:
            self._streams.discard(stream)
        self._notify()

    @property
    def _retriable(self) -> tuple[type[BaseException], ...]:
        return self._filler.retriable

    def _fetch_for_stream(self, info: ShardInfo) -> str:
        """Fetch one shard a stream needs (see ``_stream.fetch_one``)."""
        return fetch_one(
            self.dir,
            self._filler,
            info,
            max_bytes=self.max_bytes,
            policy=self.policy,
            events=self.events,
        )

    # -- reading -----------------------------------------------------------------------------

    def _complete_infos(self, scan: Scan) -> list[ShardInfo]:
        out = []
        records: dict[str, int] | None = None
        for info in self.catalog():
            if info.path in scan.complete:
                if info.crc32c is None:  # foreign: what the download found
                    if records is None:
                        records = self.dir.store.records()
                    size = scan.complete[info.path][0]
                    info = ShardInfo(info.path, records.get(info.path, 0), size, None)
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
                    present = self._complete_infos(self.dir.scan())
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
                delay = min(POLL_S, delay * 2)
        finally:
            if hold is not None:
                self.dir.release(hold)

    def _pin(self, chosen: list[ShardInfo], epoch: int | None) -> Snapshot:
        claim = self.dir.pin(
            [i.path for i in chosen], epoch=epoch, max_bytes=self.max_bytes, policy=self.policy
        )
        return Snapshot(
            self.dir, chosen, claim, epoch, self._filler.snapshot_manifest(chosen), self._notify
        )

    def status(self) -> CacheStatus:
        """What the cache directory holds now."""
        catalog = self.dir.load_catalog() or {}
        with self.dir.lock():
            scan = self.dir.rescan()
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
            mode=str(catalog.get("mode") or "shards"),
            format=catalog.get("format"),
            bookkeeping=scan.bookkeeping,
        )
