"""A stateful property test of the cache: fill, read, pin, evict, crash, restart.

Invariants checked after every step:

- the budget: the bytes in the cache directory — its bookkeeping (the sqlite
  store and its WAL, catalog, lock, lease and pin files) included — never
  exceed ``max_bytes``;
- the store agrees with the directory: every shard it lists as published is
  there, whole;
- no partial shard is visible: every shard a listing shows has its index and is
  byte-identical to the remote's;
- no pinned shard is evicted: every shard a live snapshot still pins is present;
- no complete shard is lost on restart (checked in the restart rule), also when
  the bookkeeping was corrupt or of the wrong shape (then it is rebuilt from the
  directory).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from recordkit.cache import RetryOptions, ShardCache
from recordkit.cache.staged import staged_names
from recordkit.format.manifest import read_manifest

from .conftest import disk_bytes, overhead, visible_shards, write_dataset

pytestmark = pytest.mark.timeout(300)

_REMOTE: dict[str, str] = {}


def remote_dataset() -> str:
    """One remote for every run: 8 shards of different sizes."""
    if "path" not in _REMOTE:
        path = tempfile.mkdtemp(prefix="rk-cache-stateful-")
        write_dataset(path, shards=8, records=6, size=300)
        _REMOTE["path"] = path
    return _REMOTE["path"]


@pytest.fixture(scope="module", autouse=True)
def _cleanup_remote():
    yield
    if "path" in _REMOTE:
        shutil.rmtree(_REMOTE.pop("path"), ignore_errors=True)


class CacheMachine(RuleBasedStateMachine):
    policy = "consumed-lru"
    snapshots = Bundle("snapshots")

    def __init__(self) -> None:
        super().__init__()
        self.remote = remote_dataset()
        self.infos = list(read_manifest(self.remote).shards)
        self.local = tempfile.mkdtemp(prefix="rk-cache-local-")
        largest = max(s.bytes for s in self.infos)
        # room for about three shards beside the cache's own files
        self.max_bytes = int(3.2 * (largest + 100)) + overhead(self.remote)
        self.cache = self._open()
        self.live: list = []  # snapshots not closed or crashed
        self.epoch = 0

    def _open(self) -> ShardCache:
        cache = ShardCache(
            self.remote,
            self.local,
            max_bytes=self.max_bytes,
            fill_workers=0,
            policy=self.policy,
            retry=RetryOptions(attempts=1, backoff=0.0),
        )
        cache.gc()  # what start() does
        return cache

    def teardown(self) -> None:
        for snap in self.live:
            snap.close()
        self.cache.dir.store.close()
        shutil.rmtree(self.local, ignore_errors=True)

    # -- rules -------------------------------------------------------------------------------

    @rule()
    def fill(self) -> None:
        self.cache.fill_one()

    @rule(i=st.integers(0, 7))
    def fill_this(self, i: int) -> None:
        self.cache.fill_one(only=self.infos[i].path)

    @rule(target=snapshots, new_epoch=st.booleans())
    def take_snapshot(self, new_epoch: bool):
        self.epoch += new_epoch
        snap = self.cache.snapshot(self.epoch, min_shards=0, timeout=0)
        self.live.append(snap)
        return snap

    @rule(snap=snapshots, k=st.integers(0, 7), release=st.booleans())
    def read_shard(self, snap, k: int, release: bool) -> None:
        if snap not in self.live or not snap.shards:
            return
        info = snap.shards[k % len(snap.shards)]
        if info.path in snap._released:
            return
        with open(os.path.join(snap.root, info.path), "rb") as f:
            assert len(f.read()) == info.bytes  # a pinned shard is readable
        snap.mark_consumed(info, release=release)

    @rule(snap=consumes(snapshots))
    def close_snapshot(self, snap) -> None:
        if snap in self.live:
            self.live.remove(snap)
            snap.close()

    @rule(snap=consumes(snapshots))
    def reader_dies(self, snap) -> None:
        """The reader's process is killed: the kernel drops its lock, the file stays."""
        if snap in self.live:
            self.live.remove(snap)
            pin = snap._pin
            os.close(pin._fd)
            pin._fd = -1

    @rule(i=st.integers(0, 7), written=st.integers(0, 4000))
    def filler_dies_mid_download(self, i: int, written: int) -> None:
        info = self.infos[i]
        lease = self.cache.dir.reserve(
            info.path, info.bytes + 200, max_bytes=self.max_bytes, policy=self.policy
        )
        if lease is None:
            return
        shard_tmp, index_tmp = staged_names(self.cache.dir.path(info.path), lease.content["id"])
        with open(self.remote + "/" + info.path, "rb") as src, open(shard_tmp, "wb") as dst:
            dst.write(src.read(min(written, info.bytes)))
        if written % 2:
            with open(index_tmp, "wb") as dst:
                dst.write(b"0 16\n")
        os.close(lease._fd)  # killed: lock gone, temp files and claim file left behind
        lease._fd = -1

    @rule(i=st.integers(0, 7))
    def filler_dies_after_publishing_renames(self, i: int) -> None:
        """Killed between renaming a shard into place and recording it in the store."""
        info = self.infos[i]
        if info.path in self.cache.dir.scan().complete:
            return
        lease = self.cache.dir.reserve(
            info.path, info.bytes + 200, max_bytes=self.max_bytes, policy=self.policy
        )
        if lease is None:
            return
        final = self.cache.dir.path(info.path)
        shutil.copy(os.path.join(self.remote, info.path + ".idx"), final + ".idx")
        shutil.copy(os.path.join(self.remote, info.path), final)
        os.close(lease._fd)
        lease._fd = -1

    @precondition(lambda self: not self.live)
    @rule()
    def restart(self) -> None:
        before = set(visible_shards(self.local))
        self.cache.dir.store.close()
        self.cache = self._open()
        after = set(visible_shards(self.local))
        assert before <= after, f"lost on restart: {before - after}"
        assert not [n for n in os.listdir(self.local) if ".tmp-" in n]

    @precondition(lambda self: not self.live)
    @rule(
        damage=st.sampled_from(
            [
                "garbage-db",
                "empty-db",
                "foreign-db",
                "catalog-list",
                "catalog-fields",
                "state-json-list",
                "state-json-fields",
            ]
        )
    )
    def restart_with_damaged_bookkeeping(self, damage: str) -> None:
        """Bookkeeping that cannot be read, or is of the wrong shape, is rebuilt from the
        directory with a log line: nothing lost, no error on every start."""
        meta = os.path.join(self.local, ".recordkit-cache")
        self.cache.dir.store.close()
        before = set(visible_shards(self.local))
        db = os.path.join(meta, "state.db")
        if damage.endswith("-db"):
            for suffix in ("-wal", "-shm"):
                if os.path.exists(db + suffix):
                    os.unlink(db + suffix)
        if damage == "garbage-db":
            with open(db, "wb") as f:
                f.write(b"this is not a database" * 100)
        elif damage == "empty-db":
            open(db, "wb").close()
        elif damage == "foreign-db":
            import sqlite3

            os.unlink(db)
            with sqlite3.connect(db) as other:
                other.execute("CREATE TABLE shards(x)")
            other.close()
        elif damage == "catalog-list":
            with open(os.path.join(meta, "catalog.json"), "w") as f:
                json.dump([1, 2, 3], f)
        elif damage == "catalog-fields":
            with open(os.path.join(meta, "catalog.json"), "w") as f:
                json.dump({"remote": 7, "shards": "all"}, f)
        elif damage == "state-json-list":  # left by a recordkit before the sqlite store
            with open(os.path.join(meta, "state.json"), "w") as f:
                json.dump(["shards"], f)
        else:
            with open(os.path.join(meta, "state.json"), "w") as f:
                json.dump({"epoch": "x", "shards": {"a": 3, "b": {"seen": "many"}}}, f)
        self.cache = self._open()
        after = set(visible_shards(self.local))
        assert before <= after, f"lost after {damage}: {before - after}"
        assert set(self.cache.dir.scan().complete) == after  # re-adopted
        assert not os.path.exists(os.path.join(meta, "state.json"))
        self.cache.fill_one()  # and it works on

    @rule()
    def gc_with_live_readers(self) -> None:
        self.cache.gc()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def within_budget(self) -> None:
        on_disk = disk_bytes(self.local)  # every file, the bookkeeping's included
        assert on_disk <= self.max_bytes, (on_disk, self.max_bytes)
        assert self.cache.status().used <= self.max_bytes

    @invariant()
    def store_lists_only_whole_shards(self) -> None:
        with self.cache.dir.lock():
            listed = dict(self.cache.dir.scan().complete)
        for rel, (size, index_size) in listed.items():
            path = os.path.join(self.local, rel)
            assert os.path.getsize(path) == size, rel
            assert os.path.getsize(path + ".idx") == index_size, rel

    @invariant()
    def no_partial_shard_visible(self) -> None:
        for name in visible_shards(self.local):
            path = os.path.join(self.local, name)
            assert os.path.exists(path + ".idx"), name
            with open(path, "rb") as a, open(os.path.join(self.remote, name), "rb") as b:
                assert a.read() == b.read(), name

    @invariant()
    def pinned_shards_stay(self) -> None:
        present = set(visible_shards(self.local))
        for snap in self.live:
            pinned = {s.path for s in snap.shards} - snap._released
            assert pinned <= present, f"evicted while pinned: {pinned - present}"


class LruCacheMachine(CacheMachine):
    policy = "lru"


_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheStateful = CacheMachine.TestCase
TestCacheStateful.settings = _SETTINGS
TestLruCacheStateful = LruCacheMachine.TestCase
TestLruCacheStateful.settings = _SETTINGS
