"""ShardCache against a local remote: budget, publish, eviction, pins, restart."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import recordkit as rk
from recordkit.cache import CacheFullError, DownloadError, RetryOptions, ShardCache
from recordkit.cache.locks import HeldFile
from recordkit.format.manifest import read_manifest

from .conftest import (
    SCHEMA,
    BudgetWatch,
    check_sample,
    disk_bytes,
    overhead,
    sample,
    visible_shards,
    write_dataset,
)

FAST = RetryOptions(attempts=2, backoff=0.0, cooldown=0.0)
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def remote(tmp_path):
    url = tmp_path / "remote"
    write_dataset(url, shards=10, records=20, size=500)
    return url


def shard_bytes(remote) -> int:
    return max(s.bytes for s in read_manifest(remote).shards)


def budget_for(remote, n: float) -> int:
    """About ``n`` shards (with their indexes) worth of budget, and the bookkeeping's."""
    return int(n * (shard_bytes(remote) + 400)) + overhead(remote)


def read_all(snap) -> list[int]:
    seen = []
    for info, path in zip(snap.shards, snap.paths):
        with rk.Dataset(path, schema=rk.Schema.from_json(snap.schema_json)) as ds:
            assert len(ds) == info.records
            seen += [check_sample(s) for s in ds]
    return seen


def test_fill_until_budget_binds(remote, tmp_path):
    budget = budget_for(remote, 3.5)
    watch = BudgetWatch(tmp_path / "c", budget)
    cache = ShardCache(remote, tmp_path / "c", max_bytes=budget, fill_workers=2, events=watch)
    assert cache.fill() == 3
    assert watch.over == [] and disk_bytes(tmp_path / "c") <= budget
    with cache.snapshot(0) as snap:
        assert len(snap) == 3 and len(visible_shards(tmp_path / "c")) == 3
        assert len(read_all(snap)) == 60
        # the filler may not displace shards no reader has read
        assert cache.fill_one() == "blocked"
        for p in snap.paths:
            snap.mark_consumed(p)
        assert cache.fill_one() == "blocked"  # read, but still pinned
    assert cache.fill_one() == "worked"  # unpinned and read: displaced
    assert watch.evicted_paths and watch.over == []


def test_whole_dataset_fits(remote, tmp_path):
    cache = ShardCache(remote, tmp_path / "c", max_bytes="10MiB", fill_workers=3)
    assert cache.fill() == 10
    assert cache.fill_one() == "idle"
    with cache.snapshot(0) as snap:
        assert [s.path for s in snap.shards] == [s.path for s in read_manifest(remote).shards]
        assert sorted(read_all(snap)) == list(range(200))
        # files are byte-identical to the remote's
        for s in snap.shards:
            with (
                open(os.path.join(remote, s.path), "rb") as a,
                open(snap.paths[0][:0] + os.path.join(snap.root, s.path), "rb") as b,
            ):
                assert a.read() == b.read()
    # A plain recordkit reader sees the cache as a folder of TFRecords.
    with rk.Dataset(tmp_path / "c") as ds:
        assert len(ds) == 200


def test_background_workers_and_snapshot_wait(remote, tmp_path):
    cache = ShardCache(remote, tmp_path / "c", max_bytes="10MiB", fill_workers=2)
    with cache, cache.snapshot(0, min_shards=10, timeout=60) as snap:
        assert len(snap) == 10
    assert not any(t.is_alive() for t in cache._workers.threads)


def test_consumed_this_epoch_is_evicted_first(remote, tmp_path):
    budget = budget_for(remote, 3.5)
    cache = ShardCache(remote, tmp_path / "c", max_bytes=budget, fill_workers=0)
    cache.fill()
    with cache.snapshot(0) as snap:
        old, mid, new = snap.shards
        snap.mark_consumed(old)  # consumed in epoch 0, the least recently used
        snap.mark_consumed(new)
    with cache.snapshot(1) as snap:
        snap.mark_consumed(mid)  # consumed in epoch 1: evicted before the LRU one (old)
        snap.mark_consumed(new)
    assert cache.fill_one() == "worked"
    present = set(visible_shards(tmp_path / "c"))
    assert mid.path not in present and {old.path, new.path} <= present
    # plain LRU takes the least recently used instead
    lru = ShardCache(remote, tmp_path / "c", max_bytes=budget, fill_workers=0, policy="lru")
    assert lru.fill_one() == "worked"
    assert old.path not in set(visible_shards(tmp_path / "c"))


def test_pinned_shards_are_never_evicted(remote, tmp_path):
    budget = budget_for(remote, 2.5)
    cache = ShardCache(remote, tmp_path / "c", max_bytes=budget, fill_workers=0, policy="lru")
    cache.fill()
    snap = cache.snapshot(0)
    assert cache.fill_one() == "blocked"
    snap.release(snap.shards[0])
    assert cache.fill_one() == "worked"
    assert snap.shards[0].path not in visible_shards(tmp_path / "c")
    assert snap.shards[1].path in visible_shards(tmp_path / "c")
    snap.close()


def test_shard_larger_than_budget_is_a_clear_error(remote, tmp_path):
    cache = ShardCache(remote, tmp_path / "c", max_bytes=1000, fill_workers=1)
    with pytest.raises(CacheFullError, match="more than the whole cache budget"):
        cache.fill()
    cache.start()
    with pytest.raises(CacheFullError):
        cache.snapshot(0, timeout=30)
    cache.stop()


def test_corrupt_remote_shard_is_never_published(remote, tmp_path):
    path = os.path.join(remote, "part-00003.tfrecord")
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    cache = ShardCache(remote, tmp_path / "c", max_bytes="10MiB", fill_workers=1, retry=FAST)
    assert cache.fill() == 9
    assert "part-00003.tfrecord" not in visible_shards(tmp_path / "c")
    assert any(isinstance(e, DownloadError) and "CRC32C" in str(e) for e in cache.errors)
    assert not [n for n in os.listdir(tmp_path / "c") if ".tmp-" in n]


def test_foreign_tfrecords_without_manifest(remote, tmp_path):
    os.unlink(os.path.join(remote, "recordkit.json"))
    for n in os.listdir(remote):
        if n.endswith(".idx") and n.startswith("part-0000"):
            os.unlink(os.path.join(remote, n))  # some indexes missing: rebuilt by a scan
    cache = ShardCache(remote, tmp_path / "c", max_bytes="10MiB", fill_workers=2)
    assert cache.fill() == 10
    with cache.snapshot(0) as snap:
        assert snap.manifest is None and snap.records == 200
        assert all(s.crc32c is None and s.records == 20 for s in snap.shards)


def test_restart_cleans_orphans_and_keeps_complete_shards(remote, tmp_path):
    root = tmp_path / "c"
    cache = ShardCache(remote, root, max_bytes="10MiB", fill_workers=0)
    cache.fill_one()
    cache.fill_one()
    before = set(visible_shards(root))
    # A process killed mid-download: its reservation's lock died with it, its temp file stayed.
    lease = cache.dir.reserve("part-00009.tfrecord", 5000, max_bytes=cache.max_bytes, policy="lru")
    with open(root / f"part-00009.tfrecord.tmp-{lease.content['id']}", "wb") as f:
        f.write(b"half a shard")
    os.close(lease._fd)  # what the kernel does when the process dies
    # A half-evicted shard: index left behind.
    shutil.copy(root / (sorted(before)[0] + ".idx"), root / "part-00008.tfrecord.idx")
    # A reader that died holding pins.
    pin = HeldFile(str(cache.dir.pins_dir) + "/dead.json", {"shards": sorted(before)})
    os.close(pin._fd)

    again = ShardCache(remote, root, max_bytes="10MiB", fill_workers=0)
    removed = again.gc()
    assert sorted(os.path.basename(r) for r in removed) == sorted(
        [f"part-00009.tfrecord.tmp-{lease.content['id']}", "part-00008.tfrecord.idx"]
    )
    assert set(visible_shards(root)) == before
    assert os.listdir(cache.dir.leases_dir) == [] and os.listdir(cache.dir.pins_dir) == []
    status = again.status()
    meta = disk_bytes(root / ".recordkit-cache")
    assert status.used - status.bookkeeping == disk_bytes(root) - meta  # the shards: exact
    assert disk_bytes(root) <= status.used  # the WAL is counted at its bound


def test_restart_drops_shards_the_remote_changed(remote, tmp_path):
    root = tmp_path / "c"
    ShardCache(remote, root, max_bytes="10MiB", fill_workers=2).fill()
    write_dataset(
        remote, shards=4, records=20, size=900, overwrite=True
    )  # rewritten with other shards
    cache = ShardCache(remote, root, max_bytes="10MiB", fill_workers=0)
    cache.gc()
    assert visible_shards(root) == []
    cache.fill()
    with cache.snapshot(0) as snap:
        assert len(snap) == 4 and len(read_all(snap)) == 80


@pytest.mark.parametrize("generations", [2, 3])
def test_copies_readopted_after_the_state_is_lost_are_checked(remote, tmp_path, generations):
    """The state database lost (the documented "rebuilt from the directory" path): the
    copies found there carry no checksum, so each is checked against the remote's
    manifest now; those of an older generation of the same shard names and sizes are
    fetched again, never served."""
    root = tmp_path / "c"
    ShardCache(remote, root, max_bytes="10MiB", fill_workers=0).fill()
    for g in range(1, generations):  # the same names, sizes and counts; other records
        with rk.Writer(remote, SCHEMA, max_records=20, fsync=False, overwrite=True) as w:
            for i in range(200):
                w.write(sample(i + 1000 * g, 500 + (i % 5)))
    for name in os.listdir(root / ".recordkit-cache"):
        if name.startswith("state.db"):
            os.unlink(root / ".recordkit-cache" / name)
    cache = ShardCache(remote, root, max_bytes="10MiB", fill_workers=0)
    cache.fill()
    with cache.snapshot(0) as snap:
        ids = read_all(snap)
    assert sorted(ids) == [i + 1000 * (generations - 1) for i in range(200)]


def test_readopted_copies_that_match_are_kept_and_not_read_again(remote, tmp_path):
    root = tmp_path / "c"
    ShardCache(remote, root, max_bytes="10MiB", fill_workers=0).fill()
    published = {p: os.stat(root / p).st_ino for p in visible_shards(root)}
    for name in os.listdir(root / ".recordkit-cache"):
        if name.startswith("state.db"):
            os.unlink(root / ".recordkit-cache" / name)
    cache = ShardCache(remote, root, max_bytes="10MiB", fill_workers=0)
    cache.gc()
    assert {p: os.stat(root / p).st_ino for p in visible_shards(root)} == published
    assert all("crc32c" in m for m in cache.dir.store.metas().values())


def test_exact_resume_with_a_saved_shard_set(remote, tmp_path):
    root = tmp_path / "c"
    cache = ShardCache(remote, root, max_bytes=budget_for(remote, 3.5), fill_workers=0)
    cache.fill()
    with cache.snapshot(0) as snap:
        saved, fp = [s.path for s in snap.shards], snap.fingerprint()
        for s in snap.shards:
            snap.mark_consumed(s)
    shutil.rmtree(root)  # the machine was replaced: the shards are fetched again
    cache = ShardCache(remote, root, max_bytes=budget_for(remote, 3.5), fill_workers=0)
    with cache.snapshot(1, shards=saved, timeout=60) as snap:
        assert [s.path for s in snap.shards] == saved and snap.fingerprint() == fp


def test_reader_only_instance_shares_the_directory(remote, tmp_path):
    root = tmp_path / "c"
    ShardCache(remote, root, max_bytes="10MiB", fill_workers=2).fill()
    reader = ShardCache(None, root, max_bytes="10MiB")
    assert reader.remote_url == str(remote)
    with reader.snapshot(0) as snap:
        assert len(snap) == 10


def test_options_are_validated(remote, tmp_path):
    with pytest.raises(ValueError, match="policy"):
        ShardCache(remote, tmp_path / "c", max_bytes=10, policy="fifo")
    with pytest.raises(ValueError, match="max_bytes"):
        ShardCache(remote, tmp_path / "c", max_bytes=0)
    with pytest.raises(ValueError, match="attempts"):
        RetryOptions(attempts=0)


def test_files_that_are_not_ours_are_counted_but_kept(remote, tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "notes.txt").write_bytes(b"x" * 1000)
    (root / "model.ckpt.tmp-x").write_bytes(b"y" * 100)
    cache = ShardCache(remote, root, max_bytes="10MiB", fill_workers=0)
    cache.gc()
    assert (root / "notes.txt").exists() and (root / "model.ckpt.tmp-x").exists()
    status = cache.status()
    assert status.used - status.bookkeeping == 1100


def test_public_surface():
    import subprocess
    import sys

    import recordkit.cache as cache

    assert cache.__all__ == sorted(cache.__all__)
    for name in cache.__all__:
        assert getattr(cache, name).__doc__, name
    code = "import sys, recordkit.cache; print('fsspec' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_no_import_circle_and_no_private_imports_of_other_packages():
    """The cache's modules import ``shard_cache`` nowhere (fillers and snapshots get the pieces
    they use), and reach other packages only through their public modules."""
    import ast
    import pathlib

    import recordkit.cache as cache

    for path in sorted(pathlib.Path(cache.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = node.module or ""
            names = [a.name for a in node.names]
            if node.level == 1 and path.name not in ("__init__.py", "cli.py"):
                assert module != "shard_cache" and "shard_cache" not in names, (path.name, module)
            if node.level == 2:  # recordkit.<package>.<module>
                parts = module.split(".")
                assert not any(p.startswith("_") for p in parts[1:]), (path.name, module)


def test_a_writer_process_loads_only_what_it_needs():
    import json
    import subprocess
    import sys

    code = (
        "import json, sys, recordkit.cache.writer; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('recordkit.cache'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        "recordkit.cache",
        "recordkit.cache.staged",
        "recordkit.cache.writer",
    ]


def test_a_directory_of_the_json_state_is_taken_over_by_a_reader(remote, tmp_path):
    """A cache filled by a recordkit that kept its state in ``state.json``: the first
    process to open it, a reader here, adopts the shards and the history."""
    root = tmp_path / "c"
    ShardCache(remote, root, max_bytes="10MiB", fill_workers=0).fill()
    meta = root / ".recordkit-cache"
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        if (meta / name).exists():
            (meta / name).unlink()
    first = sorted(visible_shards(root))[0]
    history = {"seen": 2, "published": 1.0, "used": 5.0, "uses": 3, "reads": 1, "consumed": 3}
    (meta / "state.json").write_text(
        json.dumps({"epoch": 3, "shards": {first: {**history, "records": 20}}})
    )
    reader = ShardCache(None, root, max_bytes="10MiB")
    with reader.snapshot(4) as snap:
        assert len(snap) == 10
    assert not (meta / "state.json").exists()
    kept = reader.dir.store.meta(first)
    assert kept["seen"] == 2 and kept["reads"] == 1 and kept["records"] == 20
