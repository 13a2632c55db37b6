"""The cache directory: what is published, what is reserved, what is pinned.

Layout of a cache directory::

    LOCAL/part-00000.tfrecord            published shards, same relative paths as the remote
    LOCAL/part-00000.tfrecord.idx        ... each with its index (published first)
    LOCAL/part-00007.tfrecord.tmp-<id>   a download in progress (id = its reservation)
    LOCAL/.recordkit-cache/lock          the directory mutex (flock)
    LOCAL/.recordkit-cache/leases/<id>.json   a reservation of disk budget (held, flock'ed)
    LOCAL/.recordkit-cache/pins/<id>.json     shards a reader has pinned (held, flock'ed)
    LOCAL/.recordkit-cache/state.json    per-shard history: times seen, last use, consumption
    LOCAL/.recordkit-cache/catalog.json  the remote's manifest or listing, for offline restarts

The budget counts every byte in ``LOCAL`` outside ``.recordkit-cache/`` —
published shards and indexes, orphan temp files — plus every live reservation
(in place of the temp files it covers, which never outgrow it). The few KiB of
bookkeeping under ``.recordkit-cache/`` are not counted.

Every method that reads or changes this state runs under the directory lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..format._atomic import TMP_MARKER, atomic_write_bytes, fsync_dir
from ..format.index import INDEX_SUFFIX
from ._errors import CacheFullError
from ._locks import DirLock, HeldFile, live_claims
from ._remote import is_shard_name

log = logging.getLogger(__name__)

META = ".recordkit-cache"
_OUR_TEMP = re.compile(re.escape(TMP_MARKER) + "[0-9a-f]{12}$")
POLICIES = ("consumed-lru", "lru")


@dataclass
class Scan:
    """The cache directory as it is now.

    Attributes:
        complete: published shards (shard and index present): path -> (shard bytes, index bytes).
        used: bytes counted against the budget.
        leases: live reservations by claim name.
        pinned: shards that some live reader pins (``None`` in it: pin everything).
        orphans: temp files and half-evicted indexes that no live process owns.
        incomplete: shard files without an index (never left by recordkit itself).
    """

    complete: dict[str, tuple[int, int]] = field(default_factory=dict)
    used: int = 0
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    pinned: set[str | None] = field(default_factory=set)
    orphans: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)

    @property
    def leased(self) -> set[str]:
        return {str(c.get("shard")) for c in self.leases.values()}

    def is_pinned(self, rel: str) -> bool:
        return None in self.pinned or rel in self.pinned


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
            os.makedirs(d, exist_ok=True)
        self.lock = DirLock(os.path.join(self.meta, "lock"))

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
        return doc if isinstance(doc, dict) else None

    def _write_json(self, name: str, doc: dict[str, Any]) -> None:
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        atomic_write_bytes(os.path.join(self.meta, name), data)

    def load_state(self) -> dict[str, Any]:
        """``{"epoch": int, "shards": {path: {...}}}`` (empty on first use)."""
        state = self._read_json("state.json") or {}
        state.setdefault("epoch", 0)
        state.setdefault("shards", {})
        return state

    def save_state(self, state: dict[str, Any]) -> None:
        self._write_json("state.json", state)

    def load_catalog(self) -> dict[str, Any] | None:
        return self._read_json("catalog.json")

    def save_catalog(self, catalog: dict[str, Any]) -> None:
        self._write_json("catalog.json", catalog)

    # -- scanning ----------------------------------------------------------------------------

    def _files(self) -> Iterable[tuple[str, str, int]]:
        for dirpath, dirnames, filenames in os.walk(self.root):
            if dirpath == self.root:
                dirnames[:] = [d for d in dirnames if d != META]
            for name in filenames:
                full = os.path.join(dirpath, name)
                try:
                    size = os.lstat(full).st_size
                except FileNotFoundError:
                    continue
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                yield rel, name, size

    def scan(self) -> Scan:
        """Read the directory and the live claims (removing dead processes' claims)."""
        out = Scan()
        out.leases = live_claims(self.leases_dir)
        live_ids = {str(c.get("id")) for c in out.leases.values()}
        for claim in live_claims(self.pins_dir).values():
            listed = claim.get("shards")
            if claim.get("unreadable") or not isinstance(listed, list):
                out.pinned.add(None)
            else:
                out.pinned.update(str(s) for s in listed)
        shards: dict[str, int] = {}
        indexes: dict[str, int] = {}
        for rel, name, size in self._files():
            if _OUR_TEMP.search(name):
                if name.rsplit(TMP_MARKER, 1)[1] in live_ids:
                    continue  # counted through its reservation
                out.orphans.append(rel)
            elif name.endswith(INDEX_SUFFIX) and is_shard_name(name[: -len(INDEX_SUFFIX)]):
                indexes[rel[: -len(INDEX_SUFFIX)]] = size
            elif is_shard_name(name):
                shards[rel] = size
            # Anything else is not ours: it counts against the budget but is never removed.
            out.used += size
        out.used += sum(int(c.get("bytes", 0)) for c in out.leases.values())
        leased = out.leased
        for rel, size in shards.items():
            if rel in indexes:
                out.complete[rel] = (size, indexes[rel])
            else:
                out.incomplete.append(rel)
        # An index without its shard: a publish in progress (leased) or an eviction cut short.
        out.orphans += [
            rel + INDEX_SUFFIX for rel in indexes if rel not in shards and rel not in leased
        ]
        return out

    # -- changing things ---------------------------------------------------------------------

    def gc(self, keep: Callable[[str, int], bool] | None = None) -> list[str]:
        """Remove orphan temp files, orphan indexes, shards without an index, and
        unpinned shards that ``keep(path, size)`` rejects (e.g. not in the remote any
        more). Returns what was removed."""
        removed: list[str] = []
        with self.lock():
            scan = self.scan()
            for rel in scan.orphans:
                self._unlink(rel)
                removed.append(rel)
            for rel in scan.incomplete:
                if not scan.is_pinned(rel):
                    self._unlink(rel)
                    removed.append(rel)
            if keep is not None:
                for rel, (size, _) in scan.complete.items():
                    if not scan.is_pinned(rel) and not keep(rel, size):
                        self.evict(rel)
                        removed.append(rel)
        if removed:
            log.info("cache gc in %s removed %d file(s)", self.root, len(removed))
        return removed

    def _unlink(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(rel))

    def evict(self, rel: str) -> None:
        """Unlink a shard, then its index (never truncate: a reader may have it mapped)."""
        self._unlink(rel)
        self._unlink(rel + INDEX_SUFFIX)
        fsync_dir(os.path.dirname(self.path(rel)))

    def victims(
        self, scan: Scan, state: dict[str, Any], policy: str, *, displace: bool
    ) -> list[str]:
        """Evictable shards in eviction order.

        ``consumed-lru`` puts shards consumed in the current epoch first, then the
        least recently used; ``lru`` is plain least-recently-used. With
        ``displace`` (making room for another download) only shards that readers
        used since they arrived are offered — consumed (``consumed-lru``) or at
        least taken into a snapshot (``lru``) — so a filler without readers fills
        the budget and stops instead of churning, and never discards data no
        reader has had.
        """
        epoch = state["epoch"]
        meta = state["shards"]
        cands = [r for r in scan.complete if not scan.is_pinned(r)]
        if displace:
            used = "reads" if policy == "consumed-lru" else "uses"
            cands = [r for r in cands if meta.get(r, {}).get(used, 0) > 0]

        def order(rel: str) -> tuple[int, float, float, str]:
            m = meta.get(rel, {})
            consumed_now = policy == "consumed-lru" and m.get("consumed") == epoch
            return (0 if consumed_now else 1, m.get("used", 0.0), m.get("published", 0.0), rel)

        return sorted(cands, key=order)

    def reserve(
        self,
        rel: str,
        nbytes: int,
        *,
        max_bytes: int,
        policy: str,
        displace: bool = True,
        scan: Scan | None = None,
        state: dict[str, Any] | None = None,
    ) -> HeldFile | None:
        """Reserve ``nbytes`` of the budget for downloading ``rel``, evicting if needed.

        Returns the reservation, or ``None`` when evictable shards cannot free
        enough (they are pinned, or unread under ``consumed-lru``). Nothing is
        evicted unless the eviction makes the reservation fit.

        Raises:
            CacheFullError: the shard is larger than the whole budget.
        """
        if nbytes > max_bytes:
            raise CacheFullError(
                f"needs {nbytes} bytes (with its index), more than the whole cache "
                f"budget of {max_bytes}",
                path=rel,
                needed=nbytes,
            )
        with self.lock():
            scan = scan or self.scan()
            state = state or self.load_state()
            short = scan.used + nbytes - max_bytes
            if short > 0 and not self._evict_for(scan, state, policy, short, displace):
                return None
            lease_id = uuid.uuid4().hex[:12]
            return HeldFile(
                os.path.join(self.leases_dir, f"{lease_id}.json"),
                {"id": lease_id, "shard": rel, "bytes": nbytes, "pid": os.getpid()},
            )

    def grow(self, lease: HeldFile, nbytes: int, *, max_bytes: int, policy: str) -> bool:
        """Enlarge a reservation to ``nbytes`` (evicting if needed); False if it cannot."""
        with self.lock():
            extra = nbytes - int(lease.content["bytes"])
            if extra <= 0:
                return True
            scan = self.scan()
            short = scan.used + extra - max_bytes
            if short > 0 and not self._evict_for(scan, self.load_state(), policy, short, True):
                return False
            lease.update(bytes=nbytes)
            return True

    def _evict_for(
        self, scan: Scan, state: dict[str, Any], policy: str, short: int, displace: bool
    ) -> bool:
        chosen, freed = [], 0
        for rel in self.victims(scan, state, policy, displace=displace):
            if freed >= short:
                break
            chosen.append(rel)
            freed += sum(scan.complete[rel])
        if freed < short:
            return False
        for rel in chosen:
            log.debug("evicting %s to make room", rel)
            self.evict(rel)
            scan.complete.pop(rel)
        scan.used -= freed
        return True

    def release(self, claim: HeldFile) -> None:
        """Drop a reservation or pin."""
        with self.lock():
            claim.release()

    def publish(
        self, lease: HeldFile, rel: str, staged: str, staged_index: str, extra: dict[str, Any]
    ) -> Scan:
        """Rename a verified download into place (index first), record it, drop the lease."""
        final = self.path(rel)
        with self.lock():
            os.replace(staged_index, final + INDEX_SUFFIX)
            os.replace(staged, final)
            fsync_dir(os.path.dirname(final))
            state = self.load_state()
            meta = state["shards"].setdefault(rel, {})
            now = time.time()
            meta.update(extra)
            meta.update(seen=meta.get("seen", 0) + 1, published=now, used=now, reads=0, uses=0)
            meta.pop("consumed", None)
            self.save_state(state)
            lease.release()
            return self.scan()

    def pin(self, rels: list[str], *, epoch: int | None = None) -> HeldFile:
        """Pin published shards so no process evicts them until the claim is released."""
        with self.lock():
            claim_id = uuid.uuid4().hex[:12]
            claim = HeldFile(
                os.path.join(self.pins_dir, f"{claim_id}.json"),
                {"id": claim_id, "pid": os.getpid(), "shards": sorted(rels)},
            )
            self.touch(rels, epoch=epoch)
            return claim

    def unpin(self, claim: HeldFile, rels: Iterable[str]) -> None:
        """Stop pinning some shards of a pin."""
        drop = set(rels)
        with self.lock():
            if claim.held:
                claim.update(shards=[s for s in claim.content["shards"] if s not in drop])

    def touch(
        self, rels: Iterable[str], *, epoch: int | None = None, consumed: bool = False
    ) -> None:
        """Record a use (for LRU) and, with ``consumed``, a read in ``epoch``."""
        with self.lock():
            state = self.load_state()
            if epoch is not None and epoch > state["epoch"]:
                state["epoch"] = epoch  # a new epoch: last epoch's consumption stops counting
            now = time.time()
            for rel in rels:
                meta = state["shards"].setdefault(rel, {})
                meta["used"] = now
                meta["uses"] = meta.get("uses", 0) + 1
                if consumed:
                    meta["consumed"] = state["epoch"] if epoch is None else epoch
                    meta["reads"] = meta.get("reads", 0) + 1
            self.save_state(state)
