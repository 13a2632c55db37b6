"""The cache's fill machinery (:class:`FillWorkers`): threads that fill entries in the fill
order, and the retry state of the entries whose fill failed; and :class:`Part`, what each
part of the cache is given."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..errors import CacheFullError
from ..format.manifest import ShardInfo
from ..retry import DEFAULT_POLICY, RetryPolicy
from .catalog import Catalog
from .directory import CacheDir
from .reservation import Filler, Reservation
from .scan import Scan
from .shared import Budget, Wakeup

__all__ = ["POLL_S", "FillWorkers", "Part"]

log = logging.getLogger(__name__)

# How often idle or blocked fill workers, and snapshots waiting for shards, look again
# for work that other processes made possible (an eviction, a released pin, a shard
# published); in-process changes wake them at once.
POLL_S = 0.5

Outcome = Literal["worked", "blocked", "idle"]


@dataclass(eq=False)
class Part:
    """The pieces a part of :class:`~recordkit.cache.ShardCache` is given (never the cache).

    Args:
        dir: the cache directory.
        _filler: lists and fills the entries.
        _catalog: the entries and their fill order.
        _budget: the budget, policy and events (shared with the cache).
        _wakeup: the cache's in-process wake-up.
    """

    dir: CacheDir
    _filler: Filler
    _catalog: Catalog
    _budget: Budget
    _wakeup: Wakeup

    def _reserve(
        self, info: ShardInfo, scan: Scan, *, displace: bool, abandoning: Callable[[], bool]
    ) -> Reservation | None:
        """Reserve the room the filler needs to fill ``info`` (under the directory lock,
        ``scan`` taken under it), evicting as the budget's policy allows; ``None`` when
        no room can be made now. ``displace``: see :meth:`CacheDir.victims`.

        Raises:
            CacheFullError: the entry cannot fit in the whole budget.
        """
        budget = self._budget
        capacity = max(0, budget.max_bytes - self.dir.fixed_bytes(scan))
        lease = self.dir.reserve(
            info.path,
            self._filler.need(info, self.dir.store, capacity),
            max_bytes=budget.max_bytes,
            policy=budget.policy,
            displace=displace,
            on_evict=budget.events.evicted,
        )
        if lease is None:
            return None
        return Reservation(
            self.dir, lease, info.path, budget, capacity=capacity, abandoning=abandoning
        )


@dataclass(eq=False)
class FillWorkers(Part):
    """Fill threads and what they remember of failed entries (see ``ShardCache.fill``).

    Args:
        retry: the retry policy (``None``: the default one).
        workers: the number of background threads :meth:`start` runs.
        streaming: whether whole-epoch streams run (then they decide what comes next).

    Attributes:
        threads: the background fill threads now running.
        failure: the error that stopped them (a full disk, a shard over budget).
        errors: every failed fill so far (each was retried).
        failed: entries whose last fill failed and that are still missing.
        budget_full: whether the last :meth:`fill` stopped on a full budget.
    """

    retry: RetryPolicy | None = field(kw_only=True)
    workers: int = field(kw_only=True)
    streaming: Callable[[], bool] = field(kw_only=True)

    def __post_init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self._idents: set[int] = set()  # threads whose work stop() abandons
        self._stop = threading.Event()
        self.failure: BaseException | None = None
        self._cooldown: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._last: dict[int, tuple[str, int]] = {}  # worker -> (last outcome, gen then)
        self.errors: list[BaseException] = []
        self.failed: dict[str, BaseException] = {}
        self.budget_full = False
        self._give_up: int | None = None  # fill(): failed fills after which an entry waits

    @property
    def _policy(self) -> RetryPolicy:
        return self.retry or DEFAULT_POLICY

    # -- background threads --------------------------------------------------------------------

    def start(self) -> None:
        """Start the background threads (unless they run)."""
        self._stop.clear()
        self.failure = None
        self._last.clear()
        for i in range(self.workers if self.threads == [] else 0):
            t = threading.Thread(target=self._worker, name=f"recordkit-cache-fill-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self, timeout: float | None) -> None:
        """Stop the threads (work in progress is abandoned); the filler closes once
        none is left."""
        self._stop.set()
        self._wakeup.wake.set()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                log.warning("fill worker %s did not stop within %s s", t.name, timeout)
        self.threads = [t for t in self.threads if t.is_alive()]
        if not self.threads:
            self._filler.close()

    def wait_settled(self, timeout: float | None) -> bool:
        """See ``ShardCache.wait_settled``."""
        target = self._wakeup.gen
        n = len(self.threads)

        def settled() -> bool:
            last = list(self._last.values())
            return self.failure is not None or (
                len(last) >= n and all(o != "worked" and g >= target for o, g in last)
            )

        with self._wakeup.cv:
            return self._wakeup.cv.wait_for(settled, timeout)

    def _abandoning(self) -> bool:
        """True in a fill thread once the cache is stopping (its work in progress may go)."""
        return self._stop.is_set() and threading.get_ident() in self._idents

    def _worker(self) -> None:
        me = threading.get_ident()
        self._idents.add(me)
        try:
            self._work()
        finally:
            self._idents.discard(me)

    def _work(self) -> None:
        delay = 0.01
        me = threading.get_ident()
        wakeup = self._wakeup
        while not self._stop.is_set():
            gen = wakeup.gen
            try:
                outcome = self.fill_one()
            except CacheFullError as exc:
                log.error("cache fill stopped: %s", exc)
                self.failure = exc
                self._stop.set()
                with wakeup.cv:
                    wakeup.cv.notify_all()
                return
            except Exception as exc:  # a remote that is down for good: keep trying, slowly
                log.error("cache fill error: %r", exc)
                self.errors.append(exc)
                outcome = "blocked"
            with wakeup.cv:
                self._last[me] = (outcome, gen)
                wakeup.cv.notify_all()
            if outcome == "worked":
                delay = 0.01
                continue
            wakeup.wake.wait(min(delay, POLL_S))
            wakeup.wake.clear()
            delay = min(POLL_S, delay * 2)

    # -- one entry -----------------------------------------------------------------------------

    def _free(self, leased: set[str]) -> Callable[[ShardInfo], bool]:
        now = time.monotonic()
        give_up, failures, cooldown = self._give_up, self._failures, self._cooldown

        def free(info: ShardInfo) -> bool:
            return (
                info.path not in leased
                and cooldown.get(info.path, 0) <= now
                and (give_up is None or failures.get(info.path, 0) < give_up)
            )

        return free

    def fill_one(self, only: str | None = None) -> Outcome:
        """See ``ShardCache.fill_one``."""
        known = self._catalog.known()
        if only is None and self.streaming():
            return "idle"  # whole-epoch readers decide what comes next
        with self.dir.lock():
            scan = self.dir.scan()
            leased, present = scan.leased, scan.complete
            if only is not None:
                wanted = known.get(only)
                ok = wanted is not None and only not in present and only not in leased
                info = wanted if ok else None
            else:
                seen = self.dir.store.seen(absent=True)  # evicted shards: how often fetched
                info = self._catalog.next(present, seen, self._free(leased))
            if info is None:
                return "idle"
            # a shard a reader asks for (a resume) may displace any unpinned one
            room = self._reserve(info, scan, displace=only is None, abandoning=self._abandoning)
            if room is None:
                return "blocked"
        try:
            self._filler.fill(info, room)
        except self._filler.retriable as exc:
            # Retried later, less and less often: the remote may recover, a corrupt
            # object may be rewritten. Meanwhile the other shards go ahead.
            fails = self._failures[info.path] = self._failures.get(info.path, 0) + 1
            wait = self._policy.cooldown_after(fails)
            self._cooldown[info.path] = time.monotonic() + wait
            self.errors.append(exc)
            self.failed[info.path] = exc
            verb = "fetch" if self._filler.mode == "shards" else "produce"
            log.error("could not %s %s (retrying in %.0f s): %s", verb, info.path, wait, exc)
        finally:
            room.release()
        return "worked"

    # -- filling in the calling thread ---------------------------------------------------------

    def fill(self) -> int:
        """See ``ShardCache.fill`` (the directory is collected first, by the cache)."""
        failures: list[BaseException] = []
        outcomes: list[str] = []

        def run() -> None:
            self._idents.add(threading.get_ident())
            try:
                while (outcome := self.fill_one()) == "worked" and not self._stop.is_set():
                    pass
                outcomes.append(outcome)
            except BaseException as exc:
                failures.append(exc)
                self._stop.set()
            finally:
                self._idents.discard(threading.get_ident())

        self._give_up = self._policy.shard_attempts
        try:
            while True:
                outcomes.clear()
                threads = [threading.Thread(target=run) for _ in range(max(1, self.workers))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wait = self._retry_wait()
                if failures or self._stop.is_set() or "blocked" in outcomes or wait is None:
                    break
                self._stop.wait(wait)  # a failed shard's cooldown: the fill is not done yet
        finally:
            self._give_up = None
        self.budget_full = "blocked" in outcomes
        self._stop.clear()
        if not self.threads:
            self._filler.close()  # no writer processes idle beside a finished fill
        if failures:
            raise failures[0]
        with self.dir.lock():
            return len(self.dir.scan().complete)

    def _retry_wait(self) -> float | None:
        """Seconds until a missing entry that failed fewer than ``shard_attempts`` times
        may be tried again (0 if now), or ``None`` if there is none."""
        limit = self._policy.shard_attempts
        with self.dir.lock():
            present = self.dir.scan().complete
        for rel in list(self.failed):
            if rel in present:
                del self.failed[rel]
        due = [
            self._cooldown[rel]
            for rel, n in self._failures.items()
            if rel not in present and n < limit and rel in self._cooldown
        ]
        return max(0.0, min(due) - time.monotonic()) if due else None
