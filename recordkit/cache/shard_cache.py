"""``ShardCache``: background workers fill a budgeted local directory from a remote.

The cache is a face over parts, each given the pieces it uses, never the cache:

- :class:`~.directory.CacheDir`, the directory: budget, reservations, eviction, pins;
- a *filler* (``reservation.Filler``): what the catalog's entries are, how much
  room filling one needs up front, and how it is staged and published
  (``fetch.Fetcher`` downloads, ``produce.Producer`` runs a conversion in a
  writer subprocess); per entry it gets a :class:`~.reservation.Reservation`;
- :class:`~.catalog.Catalog`, the entries and their fill order;
- :class:`~.workers.FillWorkers`, the fill threads and their retry state;
- :class:`~.reading.Snapshots` and :class:`~.reading.Streams`, the reader side
  (a :class:`~.stream.Stream` is handed its ``Streams``, a small public interface);
- a :class:`~.shared.Budget` (budget, policy, events) and a
  :class:`~.shared.Wakeup` (the threads' in-process signal), shared by the parts.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .._keywords import accepts_options
from .._units import parse_size
from ..errors import ShardNotFoundError
from ..format.manifest import Manifest, ShardInfo
from ..storage import is_remote
from .catalog import Catalog
from .directory import POLICIES, CacheDir
from .fetch import Fetcher
from .producer_options import ProducerOptions, producer_options
from .reading import Snapshots, Streams
from .remote import Remote, RetryOptions
from .reservation import Filler
from .shared import Budget, CacheEvents, CacheStatus, FillContext, NoEvents, Wakeup
from .snapshot import Snapshot
from .stream import Stream, StreamStats
from .workers import FillWorkers

if TYPE_CHECKING:
    from ..codec.schema import Schema
    from ..conversion.plan import ConvertOptions

__all__ = ["ShardCache"]

log = logging.getLogger(__name__)

Policy = Literal["consumed-lru", "lru"]


class ShardCache:
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
    samples (any ``converters`` source) and the fill workers convert them as
    ``recordkit convert`` would, in writer processes, one shard
    ``part-PPPPP-00000.tfrecord`` per partition of the conversion plan, within the
    same budget (an estimate of each partition's output is reserved and enforced
    as a hard cap on its writer). See ``docs/cache.md``.

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
    """

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
        budget = parse_size(max_bytes)
        if budget <= 0:
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
        self.seed = seed
        self._budget = Budget(budget, policy, events or NoEvents())
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
        context = FillContext(
            remote_url=self.remote_url,
            storage_options=storage_options,
            max_bytes=budget,
            fill_workers=fill_workers,
            chunk_bytes=self.chunk_bytes,
        )
        self._filler: Filler
        if producer is not None or (saved is not None and saved.get("mode") == "producer"):
            from .produce import Producer  # the conversion machinery, only when needed

            self._filler = Producer(context, self.dir, producer=producer, saved=saved)
        else:
            self._filler = Fetcher(context, self.dir, lambda: self.remote)
        # the parts, each with the pieces it uses
        self._catalog = Catalog(self._filler.catalog, seed=seed, remote_url=self.remote_url)
        wakeup = Wakeup()
        parts = (self.dir, self._filler, self._catalog, self._budget, wakeup)
        self._streams = Streams(*parts)
        self._workers = FillWorkers(
            *parts, retry=retry, workers=fill_workers, streaming=self._streams.running
        )
        self._snapshots = Snapshots(*parts, self._workers)

    # -- settings and results ------------------------------------------------------------------

    @property
    def max_bytes(self) -> int:
        """The disk budget in bytes."""
        return self._budget.max_bytes

    @property
    def policy(self) -> Policy:
        """The eviction policy (see the class doc)."""
        return self._budget.policy  # type: ignore[return-value]

    @property
    def events(self) -> CacheEvents:
        """Where progress is reported (may be replaced while the cache is open)."""
        return self._budget.events

    @events.setter
    def events(self, events: CacheEvents) -> None:
        self._budget.events = events

    @property
    def errors(self) -> list[BaseException]:
        """Every failed download or production so far (each was retried)."""
        return self._workers.errors

    @property
    def failed(self) -> dict[str, BaseException]:
        """Shards whose last download failed and that are still missing, with that error
        (what :meth:`fill` gave up on)."""
        return self._workers.failed

    @property
    def budget_full(self) -> bool:
        """Whether the last :meth:`fill` stopped because the budget was full of shards
        it may not displace."""
        return self._workers.budget_full

    @property
    def stream_stats(self) -> StreamStats:
        """What whole-epoch readers' streams did, over all passes (see :meth:`stream`)."""
        return self._streams.stats

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
        return self._catalog.entries()

    def info(self, rel: str) -> ShardInfo:
        """The catalog's entry for shard ``rel``.

        Raises:
            ShardNotFoundError: the remote does not list it.
        """
        return self._catalog.info(rel)

    @property
    def manifest(self) -> Manifest | None:
        """The remote dataset's manifest (``None`` for a folder of foreign TFRecords and
        in producer mode)."""
        self.catalog()
        if self._filler.mode != "shards":
            return None
        return self._filler.snapshot_manifest([])  # shard mode: the remote's

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ShardCache:
        """Rescan and clean the directory, then start the fill workers. Returns ``self``."""
        self.gc()
        self._workers.start()
        return self

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop the fill workers (downloads in progress are abandoned and cleaned up;
        in producer mode the writer processes are stopped too)."""
        self._workers.stop(timeout)

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
        return self._workers.failure

    def gc(self) -> list[str]:
        """Remove orphans left by dead processes and shards the remote no longer has
        (in producer mode: shards of another conversion plan)."""
        known = self._catalog.known()
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

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until the fill workers have nothing they may do (all shards present, or
        the budget full of shards they may not displace), counting only from changes
        made in this process before the call. Returns False on timeout."""
        return self._workers.wait_settled(timeout)

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
        return self._workers.fill_one(only)

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
        return self._workers.fill()

    # -- reading ---------------------------------------------------------------------------------

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
        return self._snapshots.take(epoch, min_shards=min_shards, shards=shards, timeout=timeout)

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

        The returned :class:`~recordkit.cache.Stream` pins a read-ahead
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
        return self._streams.open(
            order,
            epoch=epoch,
            timeout=timeout,
            workers=workers or max(1, self.fill_workers),
            capacity=capacity,
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

    def __repr__(self) -> str:
        fmt = getattr(self._filler, "format", None)
        extra = f", format={fmt!r}" if fmt else ""
        return f"ShardCache({self.remote_url!r}, {self.root!r}, max_bytes={self.max_bytes}{extra})"
