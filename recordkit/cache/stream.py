"""Whole epochs through the cache: fetch the shards a reader needs next, ahead of it.

A :class:`Stream` serves one pass of a reader over a known order of shards (the
order in which the epoch plan first needs them). It keeps a *read-ahead window*:
the next shards of that order, as many as the cache budget holds beside the
shards the reader still reads. The window's shards are pinned by name in one
claim as they enter it (before they are fetched, so that no process evicts one
between its publish and its use), fetched by ``workers`` threads in order, and
let go (unpinned, marked consumed, so evicted first) when the reader says it is
done with them; the window then moves on. Room for a download is made by
evicting unpinned shards, consumed ones first. Readers ask through a *gate*
(``ShardSet.gate``; see ``gates``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from ..errors import CacheFullError
from ..format.manifest import ShardInfo
from .directory import BOOKKEEPING_SLACK, CacheDir
from .fetch import index_bound
from .locks import HeldFile

__all__ = ["POLL_S", "Stream", "StreamHost", "StreamStats", "footprint", "plan_capacity"]

log = logging.getLogger(__name__)

# A shard whose download failed is tried this many times (each try retries its
# reads per RetryOptions) before a reader waiting for it gets the error.
_TRIES = 3
_RETRY_S = 1.0
# How often blocked or waiting threads look again for changes made by other
# processes (an eviction, a released pin, a publish); this process's changes wake
# them at once.
POLL_S = 0.25
# Bytes kept free per shard of the order for the claim file and the state rows
# that the pass adds (the budget counts the bookkeeping).
_PER_SHARD_BOOKKEEPING = 512
_STATS_LOCK = threading.Lock()


class StreamHost(Protocol):
    """What a stream uses of its cache (``ShardCache``'s streams, ``reading.Streams``).

    Attributes:
        dir: the cache directory.
    """

    dir: CacheDir

    @property
    def max_bytes(self) -> int:
        """The cache's budget."""

    @property
    def retriable(self) -> tuple[type[BaseException], ...]:
        """The errors of :meth:`fetch` that a later try may not meet."""

    def info(self, rel: str) -> ShardInfo:
        """The catalog's entry for ``rel`` (a shard asked for outside the order)."""

    def fetch(self, info: ShardInfo) -> str:
        """Fetch one shard in this thread: ``"fetched"``, ``"present"`` (here already),
        ``"elsewhere"`` (another process fetches it) or ``"blocked"`` (no room: pinned
        shards fill the budget). Room is made by evicting any unpinned shard, consumed
        ones first.

        Raises:
            CacheFullError: the shard is larger than the budget, or the disk is full.
        """

    def ended(self, stream: Stream) -> None:
        """The stream closed (the cache's own fill workers may fetch again)."""

    def room_freed(self) -> None:
        """The stream let shards go: the cache's fill workers may look again."""


def footprint(info: ShardInfo) -> int:
    """The budget a shard takes in the cache: its bytes and a bound on its index."""
    return info.bytes + index_bound(info)


@dataclass
class StreamStats:
    """What whole-epoch reading through a cache did (cumulative; ``as_dict()`` to log).

    Attributes:
        fetched: shards downloaded for readers.
        fetched_bytes: their bytes.
        cached: shards a pass needed that were already in the cache.
        wait_seconds: time readers spent waiting for a shard to arrive (the
            network was slower than the reading); 0 when the read-ahead kept up.
        waits: how many times a reader had to wait.
        failures: downloads that failed and were tried again.
    """

    fetched: int = 0
    fetched_bytes: int = 0
    cached: int = 0
    wait_seconds: float = 0.0
    waits: int = 0
    failures: int = 0

    def add(self, **deltas: float) -> None:
        """Add to several counters at once, atomically."""
        with _STATS_LOCK:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, float]:
        """A consistent snapshot of the counters."""
        with _STATS_LOCK:
            return asdict(self)


class Stream:
    """Fetches one pass's shards in the order it needs them, within the cache budget.

    Made by :meth:`ShardCache.stream`; see the module docs.

    Args:
        cache: what the stream uses of its cache.
        order: the shards, in the order the reader first needs them (each once).
        epoch: the epoch (for the eviction policy's "consumed this epoch").
        workers: concurrent downloads.
        timeout: seconds a reader waits for one shard before :class:`TimeoutError`.
        stats: counters to add to.
        capacity: the most shard bytes (indexes included) the window holds; default,
            and at most, what the budget holds beside the cache's own files.

    Attributes:
        capacity: the window's bytes, as used.
        task_limit: the most shard bytes one reader task may touch (half the
            window, so that the next task's shards fit beside a task's).
    """

    def __init__(
        self,
        cache: StreamHost,
        order: Sequence[ShardInfo],
        *,
        epoch: int | None,
        workers: int,
        timeout: float | None,
        stats: StreamStats,
        capacity: int | None = None,
    ) -> None:
        self.cache = cache
        self.dir: CacheDir = cache.dir
        self.epoch = epoch
        self.timeout = timeout
        self.stats = stats
        self._order = [i.path for i in order]
        self._position = {rel: k for k, rel in enumerate(self._order)}
        self._info = {i.path: i for i in order}
        self._fp = {i.path: footprint(i) for i in order}
        self._next = 0  # the next shard of the order to enter the window
        self._front: collections.deque[str] = collections.deque()  # asked for out of order
        self._admitted: set[str] = set()  # in the window (pinned), until let go
        self._present: set[str] = set()  # ... and complete in the cache
        self._elsewhere: set[str] = set()  # ... being fetched by another process
        self._queue: collections.deque[str] = collections.deque()  # to fetch, in order
        self._fetching: set[str] = set()
        self._failed: dict[str, BaseException] = {}
        self._tries: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._releases: list[str] = []
        self._window_bytes = 0  # the footprints of the admitted shards
        self._error: BaseException | None = None
        self._closed = False
        self._arrived_once = False  # a shard of this pass is here (downloads go parallel)
        self._dirty = True
        self._cv = threading.Condition()
        with self.dir.lock():
            scan = self.dir.scan()
            self.capacity = (
                cache.max_bytes
                - self.dir.fixed_bytes(scan)
                - _PER_SHARD_BOOKKEEPING * len(self._order)
            )
            if capacity is not None:
                self.capacity = min(self.capacity, capacity)
            self._claim: HeldFile = self.dir.pin([], epoch=epoch)
        self.task_limit = max(1, self.capacity // 2)
        self._threads = [
            threading.Thread(target=self._schedule, name="recordkit-stream", daemon=True)
        ] + [
            threading.Thread(target=self._fetch, name=f"recordkit-stream-fetch-{k}", daemon=True)
            for k in range(max(1, workers))
        ]
        for t in self._threads:
            t.start()

    # -- the reader's side ---------------------------------------------------------------------

    def ready(self, rel: str) -> bool:
        """Whether shard ``rel`` is complete in the cache and pinned for this pass."""
        with self._cv:
            return rel in self._present

    def wait(self, rel: str) -> float:
        """Block until ``rel`` is ready; returns the seconds waited.

        A shard outside the rest of the order (a read the plan did not predict)
        is fetched next.

        Raises:
            CacheFullError: the shard cannot fit in the budget.
            DownloadError: its download failed ``3`` times.
            TimeoutError: not ready within ``timeout``.
        """
        with self._cv:
            if rel in self._present:
                return 0.0
            t0 = time.monotonic()
            later = self._position.get(rel, -1) >= self._next
            if rel not in self._admitted and rel not in self._front and not later:
                self._front.append(rel)
                self._info.setdefault(rel, self.cache.info(rel))
                self._fp.setdefault(rel, footprint(self._info[rel]))
                self._dirty = True
                self._cv.notify_all()
            while rel not in self._present:
                if self._error is not None:
                    raise self._error
                if rel in self._failed:
                    raise self._failed[rel]
                if self._closed:
                    raise RuntimeError(f"the stream was closed while waiting for {rel}")
                left = None if self.timeout is None else self.timeout - (time.monotonic() - t0)
                if left is not None and left <= 0:
                    raise TimeoutError(self._stuck(rel))
                self._cv.wait(POLL_S if left is None else min(POLL_S, left))
            waited = time.monotonic() - t0
        self.stats.add(wait_seconds=waited, waits=1)
        return waited

    def _stuck(self, rel: str) -> str:
        return (
            f"cache {self.dir.root}: shard {rel} did not arrive within {self.timeout} s; "
            f"the read-ahead window holds {len(self._admitted)} shard(s), "
            f"{self._window_bytes:,} of {self.capacity:,} bytes, {len(self._present)} of "
            f"them here, {len(self._fetching)} downloading, {len(self._elsewhere)} being "
            "fetched by another process (a slow remote? other readers' pins filling "
            "the budget? or the shards one read needs at once do not fit in it: raise "
            "the budget)"
        )

    def release(self, rels: Iterable[str]) -> None:
        """The reader is done with these shards (unmapped): unpin them, consumed."""
        with self._cv:
            new = [r for r in rels if r in self._admitted]
            if new:
                self._releases.extend(new)
                self._dirty = True
                self._cv.notify_all()

    def close(self) -> None:
        """Stop fetching and unpin everything. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(60.0)
                if t.is_alive():
                    log.warning("stream thread %s did not stop within 60 s", t.name)
        self.cache.ended(self)
        consumed = [r for r in self._releases if r in self._present]
        if consumed:
            self.dir.touch(consumed, epoch=self.epoch, consumed=True)
        self.dir.release(self._claim)

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the stream (a shard that cannot fit the budget)."""
        return self._error

    # -- the window ----------------------------------------------------------------------------

    def _schedule(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._dirty and not self._closed:
                        self._cv.wait(POLL_S if self._elsewhere else None)
                        if self._elsewhere:
                            break
                    if self._closed:
                        return
                    self._dirty = False
                    releases, self._releases = self._releases, []
                    for rel in releases:
                        self._admitted.discard(rel)
                        self._present.discard(rel)
                        self._window_bytes -= self._fp[rel]
                    admit = self._admit()
                self._apply(releases, admit)
        except BaseException as exc:  # handed to the waiting readers
            log.error("cache stream stopped: %r", exc)
            with self._cv:
                self._error = exc
                self._cv.notify_all()

    def _admit(self) -> list[str]:
        """The shards that enter the window now (in order), within the capacity."""
        out: list[str] = []

        def fits(rel: str) -> bool:
            size = self._fp[rel]
            return not self._admitted or self._window_bytes + size <= self.capacity

        def take(rel: str) -> None:
            out.append(rel)
            self._admitted.add(rel)
            self._window_bytes += self._fp[rel]

        while self._front:
            rel = self._front[0]
            if rel in self._admitted:
                self._front.popleft()
            elif fits(rel):
                take(self._front.popleft())
            else:
                return out
        while self._next < len(self._order):
            rel = self._order[self._next]
            if rel in self._admitted:
                self._next += 1
                continue
            if not fits(rel):
                break
            take(rel)
            self._next += 1
        return out

    def _apply(self, releases: list[str], admit: list[str]) -> None:
        """Unpin and pin in one claim update; find which new shards are here already."""
        with self.dir.lock():
            if releases or admit:
                pinned = set(self._claim.content["shards"])
                pinned.difference_update(releases)
                pinned.update(admit)
                self._claim.update(shards=sorted(pinned))
            present = self.dir.store.present() if admit or self._elsewhere else {}
            if releases:
                self.dir.touch(releases, epoch=self.epoch, consumed=True)
        with self._cv:
            for rel in admit:
                if rel in present:
                    self._present.add(rel)
                else:
                    self._queue.append(rel)
            arrived = [r for r in self._elsewhere if r in present]
            self._present.update(arrived)
            self._elsewhere.difference_update(arrived)
            cached = sum(1 for r in admit if r in present)
            if admit or arrived:
                self._cv.notify_all()
        if cached:
            self.stats.add(cached=cached)
        if releases:
            self.cache.room_freed()  # room for the cache's own fill workers too

    # -- fetching ------------------------------------------------------------------------------

    def _take(self) -> str | None:
        """The next shard to download (in order), waiting for one; ``None`` when closed.

        Until a first shard of the pass is here, one download at a time: parallel
        downloads share the link, and the reader waits for the first one alone.
        """
        with self._cv:
            while not self._closed:
                now = time.monotonic()
                if self._fetching and not self._present and not self._arrived_once:
                    self._cv.wait(POLL_S)
                    continue
                for k, rel in enumerate(self._queue):
                    if self._retry_at.get(rel, 0.0) <= now:
                        del self._queue[k]
                        self._fetching.add(rel)
                        return rel
                self._cv.wait(POLL_S if self._queue else None)
            return None

    def _fetch(self) -> None:
        while (rel := self._take()) is not None:
            try:
                outcome = self.cache.fetch(self._info[rel])
            except CacheFullError as exc:
                with self._cv:
                    self._fetching.discard(rel)
                    self._error = exc
                    self._closed = True
                    self._cv.notify_all()
                return
            except self.cache.retriable as exc:
                self._failure(rel, exc)
                continue
            except BaseException as exc:  # handed to the waiting readers
                self._failure(rel, exc, final=True)
                continue
            with self._cv:
                self._fetching.discard(rel)
                if rel not in self._admitted:  # let go while it came (a closed pass)
                    pass
                elif outcome in ("fetched", "present"):
                    self._present.add(rel)
                    self._arrived_once = True
                    self._cv.notify_all()
                elif outcome == "elsewhere":
                    self._elsewhere.add(rel)
                    self._dirty = True
                    self._cv.notify_all()
                else:  # "blocked": no room yet (others' pins); try again soon
                    self._queue.appendleft(rel)
                    self._retry_at[rel] = time.monotonic() + POLL_S
            if outcome == "fetched":
                self.stats.add(fetched=1, fetched_bytes=self._info[rel].bytes)

    def _failure(self, rel: str, exc: BaseException, *, final: bool = False) -> None:
        with self._cv:
            self._fetching.discard(rel)
            tries = self._tries[rel] = self._tries.get(rel, 0) + 1
            if final or tries >= _TRIES:
                self._failed[rel] = exc
                log.error("could not fetch %s (%d tries): %s", rel, tries, exc)
            else:
                wait = _RETRY_S * 2 ** (tries - 1)
                log.warning("could not fetch %s (retrying in %.0f s): %s", rel, wait, exc)
                self._retry_at[rel] = time.monotonic() + wait
                self._queue.appendleft(rel)
            self._cv.notify_all()
        self.stats.add(failures=1)

    def __repr__(self) -> str:
        return (
            f"Stream({self.dir.root!r}, epoch={self.epoch}, {self._next}/{len(self._order)} "
            f"shards admitted, window {self._window_bytes:,}/{self.capacity:,} bytes)"
        )


def plan_capacity(max_bytes: int, shards: int) -> int:
    """What a cache of ``max_bytes`` holds for shards, as the epoch plan counts it.

    A pure function of the budget and the number of shards (so that every rank
    and every resumed run makes the same plan): the budget less a bound on the
    bookkeeping (256 KiB and 2 KiB a shard, above the ~600 bytes a shard measured)
    and the slack kept free.
    """
    return max_bytes - BOOKKEEPING_SLACK - (256 << 10) - 2048 * shards
