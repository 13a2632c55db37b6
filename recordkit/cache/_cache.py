"""``ShardCache``: background workers fill a budgeted local directory from a remote.

The cache itself owns what both modes share: the budget, reservations,
eviction, pins, the fill order, the worker threads and snapshots. What differs
between shard mode and producer mode is a *filler* (``_reservation.Filler``):
what the catalog's entries are, how much room filling one needs up front, and
how it is staged and published (``_fill.Fetcher`` downloads,
``_produce.Producer`` runs a conversion in a writer subprocess). A filler gets
the pieces it uses, never the cache: a :class:`~._types.FillContext` of
settings, the :class:`~._dir.CacheDir` for its catalog, and per entry a
:class:`~._reservation.Reservation` (stage with disk room, grow, publish).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .._keywords import accepts_options
from .._units import parse_size
from ..errors import ShardNotFoundError
from ..format.manifest import Manifest, ShardInfo
from ..retry import DEFAULT_POLICY
from ..storage import is_remote
from ._dir import POLICIES, CacheDir
from ._errors import CacheFullError
from ._fill import Fetcher
from ._producer_options import ProducerOptions, producer_options
from ._reading import POLL_S, Reading
from ._remote import Remote, RetryOptions
from ._reservation import Filler, Reservation
from ._stream import Stream, StreamStats
from ._types import CacheEvents, CacheStatus, FillContext, NoEvents

if TYPE_CHECKING:
    from ..codec.schema import Schema
    from ..conversion.plan import ConvertOptions

__all__ = ["CacheEvents", "CacheStatus", "ShardCache"]

log = logging.getLogger(__name__)

Policy = Literal["consumed-lru", "lru"]


class ShardCache(Reading):
    """A local, size-limited copy of a remote dataset's shards, filled in the background.

    ``start()`` launches ``fill_workers`` threads that download the shards this
    cache has seen least (seeded order among equals) into ``local_dir``: each
    through a temp file, checked for size, CRC32C and index, then published
    atomically (index first). The disk budget ``max_bytes`` is never exceeded —
    space is reserved before a download begins, so temp files count, and the
    cache's own bookkeeping (its sqlite state, catalog, lock and claim files)
    counts too — and when it is full the policy evicts (unlinks) shards that no
    reader pins.

    Readers call :meth:`snapshot` at each epoch start and read the shards it
    lists; see :mod:`recordkit.cache` for the protocol. Several processes may
    share one ``local_dir`` (DataLoader workers, local ranks, a separate
    ``recordkit cache fill``): every change happens under a file lock, and a
    process that dies releases its reservations and pins by itself.

    **Producer mode** (``format=`` a converter name): ``remote`` holds raw
    samples (JSONL, images, NumPy arrays, ... — any ``converters`` source) and
    the fill workers convert them as ``recordkit convert`` would, in writer
    processes (fresh interpreters, never forks), one shard
    ``part-PPPPP-00000.tfrecord`` per partition of the conversion plan. The
    budget is kept the same way: a partition's output size is estimated before
    it is written (from the output/source ratio of the partitions produced so
    far), reserved, and enforced as a hard cap on the writer; one that
    outgrows its reservation is redone with a larger one. See ``docs/cache.md``.

    Args:
        remote: the dataset to cache: an fsspec URL or a local path, holding a
            recordkit manifest or a folder of ``.tfrecord`` files (shard mode),
            or the raw samples (producer mode). ``None`` opens ``local_dir`` as
            a reader only (no filling), using the remote, mode and catalog
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
        retry: how remote reads are retried, their deadlines, and how long a
            shard whose download failed waits before the next try
            (:class:`RetryOptions`, the same class as
            :class:`recordkit.retry.RetryPolicy`).
        chunk_bytes: the size of each ranged read. 8 MiB is large enough that
            per-request latency is amortised, small enough that a retry after a
            cut-off response repeats little.
        seed: orders shards that have been seen equally often.
        events: receives progress callbacks (:class:`CacheEvents`).
        producer: producer mode's settings, whole (:class:`ProducerOptions`:
            the converter, schema, source and conversion options, the writers'
            inactivity timeout); ``None`` (default): shard mode, unless the
            flat keywords below ask for producer mode.
        format, schema, source_options, convert_options, inactivity_timeout:
            the fields of :class:`ProducerOptions` as flat keywords (``format``
            selects producer mode; the others need it). Not beside ``producer=``.
        shard_size, compress: shorthand for
            ``convert_options=ConvertOptions(shard_size=..., compress=...)``
            (the source bytes one partition, so one shard, covers: keep it a
            small fraction of ``max_bytes``; ``"zstd"`` compresses tensor
            features); not beside ``convert_options=``.

    Attributes:
        errors: every failed download or production so far (each was retried).
        failed: shards whose last download failed and that are still missing,
            with that error (what :meth:`fill` gave up on).
        budget_full: whether the last :meth:`fill` stopped because the budget
            was full of shards it may not displace.
    """

    # Documented here: the reader-facing methods are defined in the base, by subject.
    snapshot = Reading.snapshot
    stream = Reading.stream
    status = Reading.status

    @accepts_options
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
        format: str | None = None,
        schema: Schema | None = None,
        source_options: Mapping[str, Any] | None = None,
        shard_size: int | str = "256MiB",
        compress: str | None = None,
        convert_options: ConvertOptions | None = None,
        inactivity_timeout: float | None = 900.0,
        producer: ProducerOptions | None = None,
    ) -> None:
        producer = producer_options(
            producer,
            format=format,
            schema=schema,
            source_options=source_options,
            shard_size=shard_size,
            compress=compress,
            convert_options=convert_options,
            inactivity_timeout=inactivity_timeout,
        )
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
        self.events: CacheEvents = events or NoEvents()
        self._storage_options = storage_options
        self._retry = retry
        saved: dict[str, Any] | None = None
        if remote is None:
            saved = self.dir.load_catalog()
            if saved is None:
                raise ShardNotFoundError(f"{self.root} is not a cache (no catalog); give remote")
            if producer is not None:
                raise ValueError(
                    f"format needs a remote; a reader-only cache takes its mode from {self.root}"
                )
            self.remote_url = str(saved["remote"])
        else:
            url = os.fspath(remote)
            self.remote_url = url if is_remote(url) else os.path.abspath(url)
        self._remote: Remote | None = None
        self._infos: list[ShardInfo] | None = None
        self._tiebreak: dict[str, int] = {}
        self._by_path: dict[str, ShardInfo] = {}
        self._order: list[ShardInfo] = []  # the catalog by seeded hash
        self._cursor = 0  # every entry before it has been fetched at least once
        self._filler: Filler
        context = FillContext(
            remote_url=self.remote_url,
            storage_options=storage_options,
            max_bytes=self.max_bytes,
            fill_workers=fill_workers,
            chunk_bytes=self.chunk_bytes,
        )
        if producer is not None or (saved is not None and saved.get("mode") == "producer"):
            from ._produce import Producer  # the conversion machinery, only when needed

            self._filler = Producer(context, self.dir, producer=producer, saved=saved)
        else:
            self._filler = Fetcher(context, self.dir, lambda: self.remote)
        self._threads: list[threading.Thread] = []
        self._fill_idents: set[int] = set()  # threads whose work stop() abandons
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
        # the last failure of each shard that failed, until it is fetched
        self.failed: dict[str, BaseException] = {}
        self.budget_full = False  # whether the last fill() stopped on a full budget
        self._give_up: int | None = None  # fill(): failed downloads after which a shard waits
        self._streams: set[Stream] = set()  # whole-epoch readers' streams (they fetch first)
        #: what whole-epoch readers' streams did, over all passes (see :meth:`stream`)
        self.stream_stats = StreamStats()

    # -- the remote's catalog ------------------------------------------------------------------

    @property
    def remote(self) -> Remote:
        """The remote dataset's reader (built on first use; retries per ``retry``)."""
        if self._remote is None:
            self._remote = Remote(self.remote_url, self._storage_options, retry=self._retry)
        return self._remote

    @property
    def mode(self) -> str:
        """``"shards"`` (copies of a remote dataset's shards) or ``"producer"``."""
        return self._filler.mode

    def catalog(self) -> list[ShardInfo]:
        """What the cache may hold, listed once: the remote's shards, or in producer
        mode one entry per partition (``bytes`` is then the partition's source size).
        A cache whose remote is unreachable uses the copy saved in the directory."""
        if self._infos is None:
            infos = self._filler.catalog()
            self._tiebreak = {i.path: zlib.crc32(f"{self.seed}:{i.path}".encode()) for i in infos}
            self._by_path = {i.path: i for i in infos}
            self._order = sorted(infos, key=lambda i: (self._tiebreak[i.path], i.path))
            self._cursor = 0
            self._infos = infos
        return self._infos

    def _known(self) -> dict[str, ShardInfo]:
        self.catalog()
        return self._by_path

    def info(self, rel: str) -> ShardInfo:
        """The catalog's entry for shard ``rel``.

        Raises:
            ShardNotFoundError: the remote does not list it.
        """
        info = self._known().get(rel)
        if info is None:
            raise ShardNotFoundError(f"not in the remote {self.remote_url}: {rel}")
        return info

    @property
    def manifest(self) -> Manifest | None:
        """The remote dataset's manifest (``None`` for a folder of foreign TFRecords and
        in producer mode)."""
        self.catalog()
        if self._filler.mode != "shards":
            return None
        return self._filler.snapshot_manifest([])  # shard mode: the remote's

    def _next(self, present: Mapping[str, Any], leased: set[str]) -> ShardInfo | None:
        """The next shard to fetch: fetched least often first, then by seeded hash.

        While some shard was never fetched, the answer comes from a cursor over the
        hash order that only moves forward past shards already fetched, so the
        first pass over a catalog costs O(1) per decision, not O(shards); after it,
        one pass over the catalog picks among the shards fetched before.
        """
        now = time.monotonic()
        cooldown = self._cooldown
        seen = self.dir.store.seen(absent=True)  # evicted shards: how often fetched
        order = self._order

        def fetched(info: ShardInfo) -> bool:
            return info.path in present or info.path in seen

        give_up, failures = self._give_up, self._failures

        def free(info: ShardInfo) -> bool:
            return (
                info.path not in leased
                and cooldown.get(info.path, 0) <= now
                and (give_up is None or failures.get(info.path, 0) < give_up)
            )

        while self._cursor < len(order) and fetched(order[self._cursor]):
            self._cursor += 1
        for k in range(self._cursor, len(order)):
            info = order[k]
            if not fetched(info) and free(info):
                return info
        again = [i for i in order if i.path not in present and free(i)]
        if not again:
            return None
        return min(again, key=lambda i: (seen.get(i.path, 0), self._tiebreak[i.path]))

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
        """Stop the fill workers (downloads in progress are abandoned and cleaned up;
        in producer mode the writer processes are stopped too)."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout)
            if t.is_alive():
                log.warning("fill worker %s did not stop within %s s", t.name, timeout)
        self._threads = [t for t in self._threads if t.is_alive()]
        if not self._threads:
            self._filler.close()

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
        """Remove orphans left by dead processes and shards the remote no longer has
        (in producer mode: shards of another conversion plan)."""
        known = self._known()
        meta = self.dir.store.metas()

        def keep(rel: str, size: int) -> bool:
            return self._filler.keep(known.get(rel), size, meta.get(rel, {}), self.dir.path(rel))

        return self.dir.gc(keep)

    def shrink(self, max_bytes: int | str) -> list[str]:
        """Evict unpinned shards (in eviction order) until the cache uses at most
        ``max_bytes``; returns the evicted shards."""
        limit = parse_size(max_bytes)
        evicted: list[str] = []
        with self.dir.lock():
            scan = self.dir.scan()
            for rel, size in self.dir.victims(scan, self.policy, displace=False):
                if scan.used <= limit:
                    break
                scan.used -= size
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

    def _abandoning(self) -> bool:
        """True in a fill worker once the cache is stopping (its work in progress may go)."""
        return self._stop.is_set() and threading.get_ident() in self._fill_idents

    def _worker(self) -> None:
        me = threading.get_ident()
        self._fill_idents.add(me)
        try:
            self._work()
        finally:
            self._fill_idents.discard(me)

    def _work(self) -> None:
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
            self._wake.wait(min(delay, POLL_S))
            self._wake.clear()
            delay = min(POLL_S, delay * 2)

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
        known = self._known()
        if only is None and self._streams:
            return "idle"  # whole-epoch readers decide what comes next
        with self.dir.lock():
            scan = self.dir.scan()
            leased, present = scan.leased, scan.complete
            if only is not None:
                wanted = known.get(only)
                ok = wanted is not None and only not in present and only not in leased
                info = wanted if ok else None
            else:
                info = self._next(present, leased)
            if info is None:
                return "idle"
            capacity = max(0, self.max_bytes - self.dir.fixed_bytes(scan))
            lease = self.dir.reserve(
                info.path,
                self._filler.need(info, self.dir.store, capacity),
                max_bytes=self.max_bytes,
                policy=self.policy,
                # a shard a reader asks for (a resume) may displace any unpinned one
                displace=only is None,
                on_evict=self.events.evicted,
            )
            if lease is None:
                return "blocked"
        room = Reservation(
            self.dir,
            lease,
            info.path,
            max_bytes=self.max_bytes,
            capacity=capacity,
            policy=self.policy,
            events=self.events,
            abandoning=self._abandoning,
        )
        try:
            self._filler.fill(info, room)
        except self._filler.retriable as exc:
            # Retried later, less and less often: the remote may recover, a corrupt
            # object may be rewritten. Meanwhile the other shards go ahead.
            fails = self._failures[info.path] = self._failures.get(info.path, 0) + 1
            wait = (self._retry or DEFAULT_POLICY).cooldown_after(fails)
            self._cooldown[info.path] = time.monotonic() + wait
            self.errors.append(exc)
            self.failed[info.path] = exc
            verb = "fetch" if self._filler.mode == "shards" else "produce"
            log.error("could not %s %s (retrying in %.0f s): %s", verb, info.path, wait, exc)
        finally:
            room.release()
        return "worked"

    def fill(self) -> int:
        """Fill in this thread (with ``fill_workers`` threads) until nothing is left to do.

        Stops when every remote shard is present, or when the budget is full of
        shards the policy may not displace (then :attr:`budget_full` is true).
        A shard whose download failed is tried again when its cooldown ends,
        up to the retry policy's ``shard_attempts`` downloads; shards it gave up
        on are in :attr:`failed` with their last error. Returns the number of
        shards present.

        Raises:
            CacheFullError: as :meth:`fill_one`.
        """
        self.gc()
        failures: list[BaseException] = []
        outcomes: list[str] = []

        def run() -> None:
            self._fill_idents.add(threading.get_ident())
            try:
                while (outcome := self.fill_one()) == "worked" and not self._stop.is_set():
                    pass
                outcomes.append(outcome)
            except BaseException as exc:
                failures.append(exc)
                self._stop.set()
            finally:
                self._fill_idents.discard(threading.get_ident())

        self._give_up = (self._retry or DEFAULT_POLICY).shard_attempts
        try:
            while True:
                outcomes.clear()
                threads = [threading.Thread(target=run) for _ in range(max(1, self.fill_workers))]
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
        if not self._threads:
            self._filler.close()  # no writer processes idle beside a finished fill
        if failures:
            raise failures[0]
        with self.dir.lock():
            return len(self.dir.scan().complete)

    def _retry_wait(self) -> float | None:
        """Seconds until a missing shard that failed fewer than ``shard_attempts`` times
        may be tried again (0 if now), or ``None`` if there is none."""
        limit = (self._retry or DEFAULT_POLICY).shard_attempts
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

    def __repr__(self) -> str:
        fmt = getattr(self._filler, "format", None)
        extra = f", format={fmt!r}" if fmt else ""
        return f"ShardCache({self.remote_url!r}, {self.root!r}, max_bytes={self.max_bytes}{extra})"
