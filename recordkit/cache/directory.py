"""The cache directory: what is published, what is reserved, what is pinned.

Layout of a cache directory::

    LOCAL/part-00000.tfrecord            published shards, same relative paths as the remote
    LOCAL/part-00000.tfrecord.idx        ... each with its index (published first)
    LOCAL/part-00007.tfrecord.tmp-<id>   a download in progress (id = its reservation)
    LOCAL/.recordkit-cache/lock          the directory mutex (flock)
    LOCAL/.recordkit-cache/leases/<id>.json   a reservation of disk budget (held, flock'ed)
    LOCAL/.recordkit-cache/pins/<id>.json     shards a reader has pinned (held, flock'ed)
    LOCAL/.recordkit-cache/state.db      per-shard state in sqlite (WAL mode, see ``store``):
                                         published or not, sizes, times seen, last use, reads
    LOCAL/.recordkit-cache/catalog.json  the remote's manifest or listing, for offline restarts

The budget counts every byte under ``LOCAL``: published shards and indexes,
files that are not the cache's, every live reservation (in place of the temp
files it covers, which never outgrow it), and the bookkeeping under
``.recordkit-cache/`` — measured at each decision, plus
:data:`BOOKKEEPING_SLACK` kept free for the store's growth until the next one.

Per event the cost does not grow with the number of shards: the published set
and its byte total live in the store (a running total kept by triggers), the
bookkeeping is a listing of ``.recordkit-cache/`` (a few files plus one per live
claim). The directory itself is walked only by :meth:`CacheDir.rescan` (at
``start()``/``gc()`` and ``status()``), which reconciles the store with what is
on disk after a crash.

Every method that reads or changes this state runs under the directory lock.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import CacheFullError
from ..format import atomic_write_bytes, fsync_dir
from ..format.index import INDEX_SUFFIX
from .catalog import catalog_problem
from .locks import DirLock, HeldFile, live_claims
from .scan import META, Scan, is_temp, walk
from .staged import discard, staged_names
from .store import WAL_LIMIT, Store

__all__ = ["BOOKKEEPING_SLACK", "POLICIES", "CacheDir"]

log = logging.getLogger(__name__)

POLICIES = ("consumed-lru", "lru")
# Kept free beyond the bookkeeping counted at a decision, for what may be written
# before the next one measures again: the database grows by the rows of the shards
# published meanwhile (a page or two), a reader's pin file by ~30 bytes a shard.
BOOKKEEPING_SLACK = 64 * 1024


class CacheDir:
    """Bookkeeping of one cache directory (no network, no threads).

    Args:
        root: the local directory (created if missing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.meta = os.path.join(self.root, META)
        self.leases_dir = os.path.join(self.meta, "leases")
        self.pins_dir = os.path.join(self.meta, "pins")
        for d in (self.root, self.meta, self.leases_dir, self.pins_dir):
            if d != self.root and os.path.lexists(d) and not os.path.isdir(d):
                log.warning("%s is not a directory; replacing it with one", d)
                os.unlink(d)  # our own bookkeeping's place: whatever is there is damage
            os.makedirs(d, exist_ok=True)
        self.lock = DirLock(os.path.join(self.meta, "lock"))
        self.store = Store(os.path.join(self.meta, "state.db"))
        # temp files of dead reservations removed since the last gc, for its report
        self._reaped: collections.deque[str] = collections.deque(maxlen=1024)

    def path(self, rel: str) -> str:
        """The local path of a shard given its path relative to the root."""
        return os.path.join(self.root, *rel.split("/"))

    # -- small JSON documents ----------------------------------------------------------------

    def _read_json(self, name: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(self.meta, name), "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError:
            log.warning("ignoring unreadable %s in %s", name, self.meta)
            return None
        if not isinstance(doc, dict):
            log.warning("ignoring %s in %s: a JSON %s, not an object", name, self.meta, type(doc))
            return None
        return doc

    def load_catalog(self) -> dict[str, Any] | None:
        """The saved catalog, or ``None`` if there is none or it has the wrong shape."""
        doc = self._read_json("catalog.json")
        if doc is None:
            return None
        problem = catalog_problem(doc)
        if problem is not None:
            log.warning("ignoring catalog.json in %s: not a cache catalog (%s)", self.meta, problem)
            return None
        return doc

    def save_catalog(self, catalog: dict[str, Any], *, max_bytes: int | None = None) -> None:
        """Save the catalog (unless unchanged); with ``max_bytes``, make room for its
        new copy first (until the rename, old and new are both on disk)."""
        data = json.dumps(catalog, separators=(",", ":"), sort_keys=True).encode()
        path = os.path.join(self.meta, "catalog.json")
        with self.lock():
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                if f.read() == data:
                    return
            if max_bytes is not None:
                scan = self.scan()
                short = scan.used + BOOKKEEPING_SLACK + len(data) - max_bytes
                if short > 0:
                    self._evict_for(scan, "lru", short, displace=False)
            atomic_write_bytes(path, data)

    # -- the budget, per event ----------------------------------------------------------------

    def bookkeeping(self) -> int:
        """Bytes under ``.recordkit-cache/`` counted against the budget: the store,
        catalog, lock and claim files as they are; the database at its logical size
        (what a checkpoint grows the file to) and its WAL at the most it may grow to:
        ``WAL_LIMIT`` before a checkpoint truncates it, plus one transaction, which
        rewrites at most every page of the database."""
        total = 0
        db = self.store.logical_bytes()
        wal_path = self.store.path + "-wal"
        for d in (self.meta, self.leases_dir, self.pins_dir):
            try:
                entries = list(os.scandir(d))
            except FileNotFoundError:
                continue
            for e in entries:
                with contextlib.suppress(FileNotFoundError):
                    if e.path == wal_path or not e.is_file(follow_symlinks=False):
                        continue
                    size = e.stat(follow_symlinks=False).st_size
                    total += max(size, db) if e.path == self.store.path else size
        try:
            wal = os.path.getsize(wal_path)
        except FileNotFoundError:
            wal = 0
        return total + max(wal, WAL_LIMIT + db)

    def _reap(self, lease: dict[str, Any]) -> None:
        """Clean up after a reservation whose process died: its staged temp files go;
        a shard it had renamed into place but not recorded is recorded now."""
        rel, lease_id = lease.get("shard"), lease.get("id")
        if not isinstance(rel, str) or not isinstance(lease_id, str):
            return
        final = self.path(rel)
        for p in discard(staged_names(final, lease_id)):
            self._reaped.append(os.path.relpath(p, self.root).replace(os.sep, "/"))
        if rel not in self.store.present():
            try:
                sizes = (os.path.getsize(final), os.path.getsize(final + INDEX_SUFFIX))
            except FileNotFoundError:
                return
            log.info("recording %s, published by a process that died before recording it", rel)
            self.store.found(rel, *sizes)

    def _claims(self, out: Scan) -> None:
        out.leases = live_claims(self.leases_dir, on_dead=self._reap)
        for claim in live_claims(self.pins_dir).values():
            listed = claim.get("shards")
            if claim.get("unreadable") or not isinstance(listed, list):
                out.pinned.add(None)
            else:
                out.pinned.update(str(s) for s in listed)

    def scan(self) -> Scan:
        """The published shards, live claims and bytes used, from the store and the
        claim files (removing dead processes' claims); the shards are not walked
        (except once, by the process that found the store new or unreadable)."""
        self.store.present()  # opens the store, which may find it must start afresh
        if self.store.fresh:
            self.store.fresh = False
            self.adopt()
        out = Scan()
        self._claims(out)
        out.complete = self.store.present()
        out.bookkeeping = self.bookkeeping()
        out.used = (
            self.store.shard_bytes()
            + self.store.setting("foreign")
            + sum(int(c.get("bytes", 0)) for c in out.leases.values())
            + out.bookkeeping
        )
        return out

    # -- the directory walk (start, gc, status) ---------------------------------------------

    def rescan(self) -> Scan:
        """Walk the directory: what is on disk, whatever the store says."""
        out = Scan()
        self._claims(out)
        walk(self.root, out)
        out.bookkeeping = self.bookkeeping()
        out.used += sum(int(c.get("bytes", 0)) for c in out.leases.values()) + out.bookkeeping
        return out

    def adopt(self) -> Scan:
        """Walk the directory and make the store list the complete shards found there,
        counting files that are not the cache's (nothing is removed)."""
        with self.lock():
            self._import_state_json()
            scan = self.rescan()
            kept = [self.path(r) for r in (*scan.incomplete, *scan.orphans)]
            foreign = scan.foreign + sum(os.path.getsize(p) for p in kept if os.path.exists(p))
            self.store.adopt(scan.complete, foreign)
            return scan

    def _import_state_json(self) -> None:
        """Take over a ``state.json`` of a recordkit before the sqlite store, once."""
        path = os.path.join(self.meta, "state.json")
        if not os.path.exists(path):
            return
        doc = self._read_json("state.json")
        shards = doc.get("shards") if doc is not None else None
        if isinstance(shards, dict):
            epoch = doc.get("epoch", 0) if doc is not None else 0
            n = self.store.import_history(shards, epoch if isinstance(epoch, int) else 0)
            log.info("cache %s: took over the history of %d shard(s) from state.json", self.root, n)
        elif doc is not None:
            log.warning("ignoring state.json in %s: not a cache state", self.meta)
        os.unlink(path)

    def gc(self, keep: Callable[[str, int], bool] | None = None) -> list[str]:
        """Remove orphan temp files, orphan indexes, shards without an index, and
        unpinned shards that ``keep(path, size)`` rejects (e.g. not in the remote any
        more); then make the store agree with the directory. Returns what was removed."""
        with self.lock():
            self._import_state_json()
            for name in os.listdir(self.meta):  # an atomic write cut short
                if is_temp(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.meta, name))
            scan = self.rescan()
            removed = list(self._reaped)
            self._reaped.clear()
            for rel in scan.orphans:
                self._unlink(rel)
                removed.append(rel)
            for rel in scan.incomplete:
                if not scan.is_pinned(rel):
                    self._unlink(rel)
                    removed.append(rel)
            if keep is not None:
                for rel, (size, _) in list(scan.complete.items()):
                    if not scan.is_pinned(rel) and not keep(rel, size):
                        self.evict(rel)
                        removed.append(rel)
                        del scan.complete[rel]
            self.store.fresh = False
            self.adopt()
        if removed:
            log.info("cache gc in %s removed %d file(s)", self.root, len(removed))
        return removed

    # -- changing things ---------------------------------------------------------------------

    def _unlink(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(rel))

    def evict(self, rel: str) -> None:
        """Unlink a shard, then its index (never truncate: a reader may have it mapped),
        then record it. Files go first: a crash in between leaves a record of bytes no
        longer there (counted, so the budget holds), which the next rescan drops."""
        with self.lock():
            self._unlink(rel)
            self._unlink(rel + INDEX_SUFFIX)
            fsync_dir(os.path.dirname(self.path(rel)))
            self.store.evicted(rel)

    def victims(self, scan: Scan, policy: str, *, displace: bool) -> Iterator[tuple[str, int]]:
        """Evictable shards in eviction order (:meth:`Store.victims
        <recordkit.cache.store.Store.victims>`, less the pinned ones), with their bytes.
        ``displace`` (making room for another download) offers only shards readers used
        since they arrived, so a filler without readers fills the budget and stops
        instead of churning, and never discards data no reader has had."""
        for rel, size in self.store.victims(policy, displace=displace):
            if not scan.is_pinned(rel):
                yield rel, size

    def fixed_bytes(self, scan: Scan) -> int:
        """What no eviction can free: the bookkeeping with its slack, and files that
        are not the cache's. ``max_bytes`` less this is the most one shard may take."""
        return scan.bookkeeping + BOOKKEEPING_SLACK + self.store.setting("foreign")

    def reserve(
        self,
        rel: str,
        nbytes: int,
        *,
        max_bytes: int,
        policy: str,
        displace: bool = True,
        on_evict: Callable[[str], None] | None = None,
    ) -> HeldFile | None:
        """Reserve ``nbytes`` of the budget for filling ``rel``, evicting if needed.

        Returns the reservation, or ``None`` when evictable shards cannot free
        enough (they are pinned, or unread under ``consumed-lru``). Nothing is
        evicted unless the eviction makes the reservation fit.

        Raises:
            CacheFullError: the shard is larger than the whole budget, less what
                the bookkeeping and files that are not the cache's take.
        """
        if nbytes > max_bytes:
            raise CacheFullError(
                f"needs {nbytes} bytes (with its index), more than the whole cache "
                f"budget of {max_bytes}",
                path=rel,
                needed=nbytes,
            )
        with self.lock():
            scan = self.scan()
            fixed = self.fixed_bytes(scan)
            if nbytes + fixed > max_bytes:
                raise CacheFullError(
                    f"needs {nbytes} bytes (with its index); the cache budget of {max_bytes} "
                    f"less {fixed} for its bookkeeping (and files that are not the cache's) "
                    "cannot hold it",
                    path=rel,
                    needed=nbytes,
                )
            short = scan.used + BOOKKEEPING_SLACK + nbytes - max_bytes
            if short > 0 and not self._evict_for(scan, policy, short, displace, on_evict):
                return None
            lease_id = uuid.uuid4().hex[:12]
            return HeldFile(
                os.path.join(self.leases_dir, f"{lease_id}.json"),
                {"id": lease_id, "shard": rel, "bytes": nbytes, "pid": os.getpid()},
            )

    def grow(
        self,
        lease: HeldFile,
        nbytes: int,
        *,
        max_bytes: int,
        policy: str,
        on_evict: Callable[[str], None] | None = None,
    ) -> bool:
        """Enlarge a reservation to ``nbytes`` (evicting if needed); False if it cannot."""
        with self.lock():
            extra = nbytes - int(lease.content["bytes"])
            if extra <= 0:
                return True
            scan = self.scan()
            short = scan.used + BOOKKEEPING_SLACK + extra - max_bytes
            if short > 0 and not self._evict_for(scan, policy, short, True, on_evict):
                return False
            lease.update(bytes=nbytes)
            return True

    def _evict_for(
        self,
        scan: Scan,
        policy: str,
        short: int,
        displace: bool,
        on_evict: Callable[[str], None] | None = None,
        keep: Iterable[str] = (),
    ) -> bool:
        chosen, freed = [], 0
        spare = set(keep)
        for rel, size in self.victims(scan, policy, displace=displace):
            if freed >= short:
                break
            if rel not in spare:
                chosen.append(rel)
                freed += size
        if freed < short:
            return False
        for rel in chosen:
            log.debug("evicting %s to make room", rel)
            self.evict(rel)
            if on_evict is not None:
                on_evict(rel)
        scan.used -= freed
        return True

    def make_room(
        self, nbytes: int, *, max_bytes: int, policy: str, on_evict: Callable[[str], None]
    ) -> bool:
        """Evict shards the policy may displace until ``nbytes`` are free on the disk's
        account (a full disk: the budget is not what binds). False if they cannot."""
        with self.lock():
            scan = self.scan()
            return self._evict_for(scan, policy, nbytes, True, on_evict)

    def release(self, claim: HeldFile) -> None:
        """Drop a reservation or pin."""
        with self.lock():
            claim.release()

    def publish(
        self,
        lease: HeldFile,
        rel: str,
        staged: str,
        staged_index: str,
        extra: dict[str, Any],
    ) -> Scan:
        """Rename a verified shard into place (index first), record it, drop the lease.

        A crash after the renames but before the record is repaired by whoever finds
        the dead reservation (:meth:`_reap`) or by the next rescan."""
        final = self.path(rel)
        with self.lock():
            os.replace(staged_index, final + INDEX_SUFFIX)
            os.replace(staged, final)
            fsync_dir(os.path.dirname(final))
            sizes = (os.path.getsize(final), os.path.getsize(final + INDEX_SUFFIX))
            try:
                self.store.published(rel, *sizes, extra)
            except CacheFullError:
                self.evict(rel)  # no reader can know of it: unrecorded, it must not stay
                raise
            lease.release()
            return self.scan()

    def pin(
        self,
        rels: list[str],
        *,
        epoch: int | None = None,
        max_bytes: int | None = None,
        policy: str = "lru",
    ) -> HeldFile:
        """Pin published shards so no process evicts them until the claim is released.

        With ``max_bytes``, room is made for the pin's own file first by evicting
        unpinned shards outside ``rels`` (a reader is never refused: if nothing can
        go, the pin is made anyway and the slack kept for the bookkeeping absorbs it).
        """
        content = {"id": uuid.uuid4().hex[:12], "pid": os.getpid(), "shards": sorted(rels)}
        size = len(json.dumps(content, separators=(",", ":")))
        with self.lock():
            if max_bytes is not None:
                scan = self.scan()
                short = scan.used + BOOKKEEPING_SLACK + size - max_bytes
                if short > 0:
                    self._evict_for(scan, policy, short, False, keep=rels)
            claim = HeldFile(os.path.join(self.pins_dir, f"{content['id']}.json"), content)
            self.touch(rels, epoch=epoch)
            return claim

    def readable(self) -> set[str]:
        """Published shards that some live reader pins (no process may evict them)."""
        with self.lock():
            present = self.store.present()
            scan = Scan()
            self._claims(scan)
            if None in scan.pinned:
                return set(present)
            return {rel for rel in scan.pinned if rel is not None and rel in present}

    def unpin(self, claim: HeldFile, rels: Iterable[str]) -> None:
        """Stop pinning some shards of a pin."""
        drop = set(rels)
        with self.lock():
            if claim.held:
                claim.update(shards=[s for s in claim.content["shards"] if s not in drop])

    def touch(
        self, rels: Iterable[str], *, epoch: int | None = None, consumed: bool = False
    ) -> None:
        """Record a use (for LRU) and, with ``consumed``, a read in ``epoch``.

        On a full disk the use goes unrecorded (with a log line): it only orders
        eviction, and a reader must not fail for it."""
        rels = list(rels)
        with self.lock():
            try:
                self.store.touch(rels, epoch=epoch, consumed=consumed)
            except CacheFullError as exc:
                log.warning("%s; a use of %d shard(s) is not recorded", exc, len(rels))
