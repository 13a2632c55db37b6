"""Datasets of many shards: open in O(shards), map within a budget of descriptors.

Every reader runs in a subprocess whose ``RLIMIT_NOFILE`` is lowered to 256, over
far more shards than that; before the map budget, each failed with ``OSError:
[Errno 24] Too many open files``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import recordkit as rk
from recordkit.errors import ManifestError, ShardNotFoundError
from recordkit.format.index import index_path
from recordkit.format.manifest import Manifest, read_manifest
from recordkit.reader.shards import ShardSet, max_open_shards, open_shards

SHARDS = 2000  # eight times a descriptor limit of 256
RECORDS = 5  # per shard
LIMIT = 256

pytestmark = pytest.mark.timeout(240)


def make_many(root, shards: int = SHARDS, records: int = RECORDS) -> str:
    """A dataset of ``shards`` copies (hard links) of one template shard.

    Record ``r`` of every shard holds ``x = r``; the shard number is in the path.
    """
    root = str(root)
    template = os.path.join(root, "template")
    schema = rk.Schema(x=rk.Int64())
    with rk.Writer(template, schema, shard_size=10**9) as w:
        for r in range(records):
            w.write({"x": r})
    manifest = read_manifest(template)
    (info,) = manifest.shards
    src = os.path.join(template, info.path)
    out = os.path.join(root, "many")
    os.makedirs(out)
    infos = []
    for k in range(shards):
        name = f"part-{k:06d}.tfrecord"
        os.link(src, os.path.join(out, name))
        os.link(index_path(src), index_path(os.path.join(out, name)))
        infos.append(type(info)(name, info.records, info.bytes, info.crc32c))
    Manifest(schema=manifest.schema, shards=tuple(infos)).write(out)
    return out


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    return make_many(tmp_path_factory.mktemp("scale"))


def run_limited(code: str, *args: str, limit: int = LIMIT, timeout: float = 200) -> str:
    """Run ``code`` in a fresh interpreter under ``ulimit -n limit``; return its stdout."""
    prelude = textwrap.dedent(
        f"""
        import os, resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
        def open_fds():
            return len(os.listdir("/proc/self/fd"))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_budget_follows_the_descriptor_limit(monkeypatch):
    monkeypatch.delenv("RECORDKIT_MAX_OPEN_SHARDS", raising=False)
    out = run_limited(
        "from recordkit.reader.shards import max_open_shards; print(max_open_shards())"
    )
    assert int(out) == LIMIT // 4
    monkeypatch.setenv("RECORDKIT_MAX_OPEN_SHARDS", "5")
    assert max_open_shards() == 5
    monkeypatch.setenv("RECORDKIT_MAX_OPEN_SHARDS", "zero")
    with pytest.raises(ValueError, match="RECORDKIT_MAX_OPEN_SHARDS"):
        max_open_shards()


def test_reference_dataset_under_ulimit(many):
    out = run_limited(
        """
        import random
        import recordkit as rk
        ds = rk.Dataset(sys.argv[1])
        assert len(ds) == len(ds.shards) * 5
        total = sum(int(s["x"]) for s in ds)
        rng = random.Random(0)
        picks = [rng.randrange(len(ds)) for _ in range(3000)]
        assert all(int(ds[i]["x"]) == i % 5 for i in picks)
        print(total, open_fds())
        """,
        many,
    )
    total, fds = map(int, out.split())
    assert total == SHARDS * sum(range(RECORDS))
    assert fds < LIMIT


@pytest.mark.parametrize("native", ["1", "0"])
def test_record_dataset_under_ulimit(many, native):
    out = run_limited(
        """
        import collections, os
        import recordkit.torch as rkt
        os.environ["RECORDKIT_NATIVE_TASKS"] = sys.argv[2]
        ds = rkt.RecordDataset(sys.argv[1], batch_size=64, shuffle=True, seed=1)
        seen = collections.Counter()
        for epoch in range(2):
            for batch in ds:
                seen.update(batch["x"].tolist())
        print(sum(seen.values()), seen[0], seen[4], ds.source.open().open_count, open_fds())
        """,
        many,
        native,
    )
    total, zeros, fours, mapped, fds = map(int, out.split())
    assert total == 2 * SHARDS * RECORDS
    assert zeros == fours == 2 * SHARDS  # every record once per epoch
    assert mapped <= LIMIT // 4
    assert fds < LIMIT


def test_dataloader_workers_under_ulimit(many):
    out = run_limited(
        """
        import collections
        import recordkit.torch as rkt
        ds = rkt.RecordDataset(sys.argv[1], batch_size=50, shuffle=True, seed=2)
        loader = rkt.DataLoader(ds, num_workers=2)
        seen = collections.Counter()
        for batch in loader:
            seen.update(batch["x"].tolist())
        print(sum(seen.values()), seen[2])
        """,
        many,
    )
    total, twos = map(int, out.split())
    assert (total, twos) == (SHARDS * RECORDS, SHARDS)


def test_loader_process_under_ulimit(many):
    out = run_limited(
        """
        import recordkit.torch as rkt
        read = rkt.ReadOptions(reader_process=True, num_threads=2)
        ds = rkt.RecordDataset(sys.argv[1], batch_size=100, options=read)
        print(sum(len(b["x"]) for b in ds))
        """,
        many,
    )
    assert int(out) == SHARDS * RECORDS


def test_map_dataset_under_ulimit(many):
    out = run_limited(
        """
        import numpy as np
        import recordkit.torch as rkt
        ds = rkt.RecordMapDataset(sys.argv[1])
        idx = np.random.default_rng(0).permutation(len(ds))[:4000]
        got = [int(s["x"]) for s in ds.__getitems__(idx.tolist())]
        assert got == (idx % 5).tolist()
        print(len(got), ds._shards.open_count)
        """,
        many,
    )
    n, mapped = map(int, out.split())
    assert n == 4000 and mapped <= LIMIT // 4


def test_verify_under_ulimit(many):
    out = run_limited(
        """
        import recordkit as rk
        report = rk.verify(sys.argv[1])
        print(report.ok, report.shards, report.records)
        """,
        many,
    )
    assert out.split() == ["True", str(SHARDS), str(SHARDS * RECORDS)]


def test_open_reads_no_index(many, monkeypatch):
    """Opening takes counts from the manifest: no shard is mapped, no index read."""
    import recordkit.reader.finding as rkf  # counting a folder's shards (out of shards.py)
    import recordkit.reader.mapped as rkm  # MappedShard (issue 17: out of shards.py)

    def refuse(*args, **kwargs):
        raise AssertionError("an index was read at open time")

    monkeypatch.setattr(rkf, "ensure_index", refuse)
    monkeypatch.setattr(rkm, "open_index", refuse)
    shards = open_shards(many)
    assert shards.open_count == 0
    assert shards.records == SHARDS * RECORDS
    assert len(rk.Dataset(many)) == SHARDS * RECORDS


def test_stale_index_on_the_last_shard_is_caught_before_its_records(tmp_path, caplog):
    root = make_many(tmp_path, shards=50)
    last = os.path.join(root, "part-000049.tfrecord")
    idx = index_path(last)
    os.unlink(idx)  # a link to the template's index: replace it, do not edit through it
    size = os.path.getsize(last)
    with open(idx, "w") as f:  # tiles the file, but not along its records: stale
        f.write(f"0 16\n16 {size - 16}\n")
    ds = rk.Dataset(root, write_index=False)
    assert "rebuilding index" not in caplog.text  # opening read no index
    got = []
    for sample in ds:
        if len(got) == 49 * RECORDS:
            # the last shard's first record comes only after its index was checked
            assert "part-000049.tfrecord.idx" in caplog.text and "rebuilding index" in caplog.text
        got.append(int(sample["x"]))
    assert got == list(range(RECORDS)) * 50


def test_wrong_record_count_is_caught_when_the_shard_is_first_read(tmp_path):
    root = make_many(tmp_path, shards=30)
    with open(os.path.join(root, "recordkit.json")) as f:
        doc = json.load(f)
    doc["shards"][-1]["records"] = RECORDS + 1
    with open(os.path.join(root, "recordkit.json"), "w") as f:
        json.dump(doc, f)
    ds = rk.Dataset(root)
    assert len(ds) == 30 * RECORDS + 1  # the manifest's word, until the shard is read
    wrong = r"part-000029\.tfrecord.*5 records, the manifest says 6"
    with pytest.raises(ManifestError, match=wrong):
        ds[len(ds) - 1]
    assert int(ds[0]["x"]) == 0


def test_missing_or_resized_shard_fails_at_open(tmp_path):
    root = make_many(tmp_path, shards=10)
    os.unlink(os.path.join(root, "part-000003.tfrecord"))
    with pytest.raises(ShardNotFoundError, match="part-000003"):
        rk.Dataset(root)
    root2 = make_many(tmp_path / "b", shards=10)
    with open(os.path.join(root2, "part-000004.tfrecord"), "ab") as f:
        f.write(b"\0")  # through the link: every shard grew by a byte
    with pytest.raises(ManifestError, match="manifest says"):
        rk.Dataset(root2)


def test_lru_keeps_the_budget_and_never_closes_a_held_map(many):
    shards = ShardSet.__new__(ShardSet)  # the same set, a small budget
    shards.__setstate__({**open_shards(many).__getstate__(), "max_open": 4})
    held = [shards.acquire(k) for k in range(6)]  # all held: over the budget, none closed
    assert shards.open_count == 6 and not any(h.buf.closed for h in held)
    for h in held:
        shards.release(h)
    assert shards.open_count == 4
    assert [h.buf.closed for h in held] == [True, True, False, False, False, False]
    view = memoryview(held[2].buf)  # a live export (as a native task holds one)
    for k in range(6, 12):
        with shards.use(k):
            pass
    assert not held[2].buf.closed  # the buffer protocol refused; it stays until free
    view.release()
    with shards.use(12):
        pass
    assert held[2].buf.closed and shards.open_count == 4
    shards.close()
    assert shards.open_count == 0


def test_unmapped_shards_keep_their_index_for_the_next_map(tmp_path, monkeypatch):
    """A shard the budget unmapped is mapped again without loading its index again,
    while it is the same file; a replaced file (another inode) gets its own index;
    RECORDKIT_KEEP_INDEX_BYTES=0 keeps none."""
    import recordkit.reader.mapped as rkm

    root = make_many(tmp_path, shards=12)
    loads = []
    real = rkm.open_index

    def counting(path, **kw):
        loads.append(os.path.basename(path))
        return real(path, **kw)

    monkeypatch.setattr(rkm, "open_index", counting)

    def small_budget():
        shards = ShardSet.__new__(ShardSet)
        shards.__setstate__({**open_shards(root).__getstate__(), "max_open": 4})
        return shards

    shards = small_budget()
    for k in range(12):
        with shards.use(k) as shard:
            assert shard.entry(RECORDS - 1)[1] > 0
    assert len(loads) == 12 and shards.open_count == 4
    # part-000003 replaced by a copy: same bytes, another file
    victim = os.path.join(root, "part-000003.tfrecord")
    with open(victim, "rb") as f:
        data = f.read()
    os.unlink(victim)
    with open(victim, "wb") as f:
        f.write(data)
    loads.clear()
    for k in range(12):
        with shards.use(k) as shard:
            assert shard.payload(RECORDS - 1)
    assert loads == ["part-000003.tfrecord"]  # the others: their kept indexes
    shards.close()
    monkeypatch.setenv("RECORDKIT_KEEP_INDEX_BYTES", "0")
    shards = small_budget()
    for _ in range(2):
        for k in range(12):
            with shards.use(k):
                pass
    assert len(loads) == 1 + 2 * 12  # cycling through 12 with 4 maps: every map loads
    shards.close()
    with shards.use(0) as shard:
        one = shard.index.memory
    monkeypatch.setenv("RECORDKIT_KEEP_INDEX_BYTES", str(2 * one))  # room for two
    shards = small_budget()
    for k in range(12):
        with shards.use(k):
            pass
    loads.clear()
    for k in (6, 7, 5):  # the last two unmapped are kept, the one before is not
        with shards.use(k):
            pass
    assert loads == ["part-000005.tfrecord"]
    shards.close()


def _counting_opens(monkeypatch):
    """Record (shard path, thread name) for every map a ShardSet opens."""
    import threading

    import recordkit.reader.shards as rks

    opened = []
    real = rks.MappedShard

    def counting(root, info, **kw):
        opened.append((info.path, threading.current_thread().name))
        return real(root, info, **kw)

    monkeypatch.setattr(rks, "MappedShard", counting)
    return opened


def test_shards_opened_together_are_opened_in_parallel_once_each(many, monkeypatch):
    """acquire_many maps the shards nobody has mapped on the opening pool's threads,
    each once however many threads ask at the same time; the rest are acquired as usual."""
    import threading

    import recordkit.reader._opening as rko

    monkeypatch.setattr(rko, "PARALLEL_MIN_RECORDS", 1)  # these shards' indexes are small
    opened = _counting_opens(monkeypatch)
    shards = open_shards(many)
    first = shards.acquire(3)  # open already: not opened again
    ids = list(range(12))
    results, errors = [], []
    go = threading.Barrier(4)

    def grab():
        try:
            go.wait(timeout=30)
            results.append(shards.acquire_many(ids))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    paths = [p for p, _ in opened]
    assert sorted(paths) == sorted(set(paths)) and len(paths) == 12  # once each
    assert any(name.startswith("recordkit-open") for _, name in opened)
    for held in results:  # the same maps, in the order asked, held by each caller
        assert [os.path.basename(h.path) for h in held] == [f"part-{k:06d}.tfrecord" for k in ids]
        assert all(h is g for h, g in zip(held, results[0]))
    assert all(h.pins == 4 + (k == 3) for k, h in enumerate(results[0]))
    for held in results:
        for h in held:
            shards.release(h)
    shards.release(first)
    assert all(h.pins == 0 for h in results[0])
    shards.close()


def test_a_failed_open_among_many_leaves_nothing_held(tmp_path, monkeypatch):
    import recordkit.reader._opening as rko

    monkeypatch.setattr(rko, "PARALLEL_MIN_RECORDS", 1)
    root = make_many(tmp_path, shards=8)
    shards = open_shards(root)
    os.unlink(os.path.join(root, "part-000005.tfrecord"))  # gone after the open
    with pytest.raises(ShardNotFoundError, match="part-000005"):
        shards.acquire_many(range(8))
    assert all(s.pins == 0 for s in shards._open.values())
    assert not shards._opening  # nobody is left waiting for an open
    assert shards.acquire(2).pins == 1  # the others still open and usable
    shards.close()


@pytest.mark.parametrize("native", ["1", "0"])
def test_batches_wider_than_the_budget_are_read_in_pieces(tmp_path, monkeypatch, native):
    """A batch touching more shards than half the map budget: pieces, joined in order."""
    pytest.importorskip("torch")
    import recordkit.torch as rkt

    monkeypatch.setenv("RECORDKIT_MAX_OPEN_SHARDS", "6")
    monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", native)
    schema = rk.Schema(idx=rk.Int64(), data=rk.Bytes(), vec=rk.Float32((3,)))
    with rk.Writer(tmp_path / "ds", schema, max_records=7) as w:
        for i in range(300):
            w.write({"idx": i, "data": bytes([i % 251]) * (i % 37), "vec": [i, -i, 0.5]})
    ds = rkt.RecordDataset(tmp_path / "ds", batch_size=32, shuffle=True, seed=3)
    seen = []
    for batch in ds:
        for k, i in enumerate(batch["idx"].tolist()):
            n = int(batch["data/lengths"][k])
            assert bytes(batch["data"][k, :n].numpy()) == bytes([i % 251]) * (i % 37)
            assert batch["vec"][k].tolist() == [i, -i, 0.5]
            seen.append(i)
        # The reference path's threads may hold a just-released map through a view of
        # the decode in flight for a moment: it is unmapped at the next acquire.
        assert ds.source.open().open_count <= (6 if native == "1" else 6 + 2)
    assert sorted(seen) == list(range(300))
    plain = rkt.RecordDataset(tmp_path / "ds", batch_size=32, shuffle=True, seed=3)
    monkeypatch.setenv("RECORDKIT_MAX_OPEN_SHARDS", "1000")
    wide = rkt.RecordDataset(tmp_path / "ds", batch_size=32, shuffle=True, seed=3)
    assert [b["idx"].tolist() for b in plain] == [b["idx"].tolist() for b in wide]


def test_a_forked_child_reads_although_the_parent_held_the_lock(many):
    """DataLoader workers are forked while a parent's reader thread may hold the lock."""
    out = run_limited(
        """
        from recordkit.reader.shards import open_shards
        s = open_shards(sys.argv[1])
        s._lock.acquire()  # as a reader thread of the parent would, at the fork
        pid = os.fork()
        if pid == 0:
            with s.use(3) as shard:
                os.write(1, str(shard.records).encode())
            os._exit(0)
        s._lock.release()
        _, status = os.waitpid(pid, 0)
        assert status == 0, status
        """,
        many,
        timeout=60,
    )
    assert out == str(RECORDS)
