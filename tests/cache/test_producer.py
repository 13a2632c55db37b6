"""Producer mode: raw samples converted into cached shards by writer processes while
training runs, under the same budget, eviction and crash rules as shard mode."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import zlib

import numpy as np
import pytest

import recordkit as rk
from recordkit import converters
from recordkit.cache import CacheFullError, ProduceError, ShardCache, workers
from recordkit.cache.directory import BOOKKEEPING_SLACK
from recordkit.cli import main
from recordkit.reader import CacheOptions, ReadOptions
from recordkit.retry import RetryPolicy

from ._sources import DiskFullJsonl, FlakyJsonl, GatedJsonl
from .conftest import BudgetWatch, disk_bytes, overhead, visible_shards

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINES = 40  # samples per source file; each file is one partition, so one shard


@pytest.fixture(autouse=True)
def _test_sources(monkeypatch):
    # a failed partition is retried soon
    monkeypatch.setattr(workers, "DEFAULT_POLICY", RetryPolicy(cooldown=0.2))
    converters.register(GatedJsonl.name, GatedJsonl)
    converters.register(DiskFullJsonl.name, DiskFullJsonl)
    converters.register(FlakyJsonl.name, FlakyJsonl)


def sample(i: int, size: int) -> dict:
    """Sample ``i``: its number and ``size`` random hex characters (seeded by ``i``)."""
    rng = np.random.default_rng(i)
    return {"i": i, "x": rng.bytes(size // 2).hex()}


def jsonl_files(files: int, *, size: int = 400, lines: int = LINES) -> dict[str, bytes]:
    """``fNN.jsonl`` -> its bytes: ``files * lines`` samples in file order."""
    out = {}
    for f in range(files):
        rows = [json.dumps(sample(f * lines + j, size)) for j in range(lines)]
        out[f"f{f:02d}.jsonl"] = ("\n".join(rows) + "\n").encode()
    return out


def local_source(root, files: int, **kw) -> tuple[str, int]:
    """Raw JSONL files in ``root``; returns the path and their total size."""
    os.makedirs(root, exist_ok=True)
    data = jsonl_files(files, **kw)
    for name, blob in data.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(blob)
    return str(root), sum(len(b) for b in data.values())


def check_record(i: int, x: bytes, size: int = 400) -> int:
    """A record read back equals its source sample."""
    assert x.decode() == sample(i, size)["x"], i
    return i


def read_snapshot(snap) -> list[int]:
    schema = rk.Schema.from_json(snap.manifest.schema)
    seen = []
    for path, info in zip(snap.paths, snap.shards):
        with rk.Dataset(path, schema) as ds:
            assert len(ds) == info.records
            seen += [check_record(int(s["i"]), bytes(s["x"])) for s in ds]
    return seen


def temp_files(root) -> list[str]:
    return [n for n in os.listdir(root) if ".tmp-" in n]


def fill_order(n: int, seed: int = 0) -> list[int]:
    """The partitions in the order a fresh cache fills them (least seen, then seeded)."""
    return sorted(
        range(n), key=lambda p: zlib.crc32(f"{seed}:part-{p:05d}-00000.tfrecord".encode())
    )


def wait_for(path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.02)


# -- training through it ----------------------------------------------------------------------


@pytest.mark.remote
@pytest.mark.torch
def test_training_on_raw_samples_five_times_the_budget(s3, tmp_path):
    rkt = pytest.importorskip("recordkit.torch")
    url = s3.bucket() + "/raw"
    fs = s3.filesystem()
    data = jsonl_files(24)
    for name, blob in data.items():
        fs.pipe(f"{url[5:]}/{name}", blob)
    source = sum(len(b) for b in data.values())
    for_shards = int(source * 1.1) // 5  # the shards come out about 10% larger than the JSONL
    budget = for_shards + overhead(
        url, format="jsonl", shard_size="16KiB", storage_options=s3.storage_options
    )
    root = tmp_path / "cache"
    watch = BudgetWatch(root, budget)
    cache = ShardCache(
        url,
        root,
        max_bytes=budget,
        format="jsonl",
        shard_size="16KiB",  # one file (17 KB) per partition
        storage_options=s3.storage_options,
        fill_workers=1,  # one reservation at a time: the bounds below are exact
        events=watch,
    )
    assert len(cache.catalog()) == 24
    need = max(i.bytes for i in cache.catalog()) * 2 + 4096  # the largest first reservation
    counts, bound, shards_seen, samples_seen = [], [], set(), set()
    with cache:
        ds = rkt.RecordDataset(
            url,
            batch_size=16,
            shuffle=True,
            cache=CacheOptions(cache=cache, timeout=60, epochs="growing"),
            options=ReadOptions(bytes_as="list"),
        )
        for epoch in range(7):
            if epoch >= 2:
                # Let the filler catch up between epochs (as a slower step would), so
                # the budget binds whatever this machine's speed.
                assert cache.wait_settled(timeout=60)
            ids = [check_record(int(i), x) for b in ds for i, x in zip(b["i"], b["x"])]
            used = cache.status().used + BOOKKEEPING_SLACK  # what the cache keeps free
            bound.append(bool(watch.evicted_paths) or used + need > budget)
            assert len(ids) == len(set(ids)) and len(ids) % LINES == 0  # whole shards, once
            files = {i // LINES for i in ids}
            assert len(files) * LINES == len(ids)  # each shard is one source file, complete
            counts.append(len(files))
            shards_seen |= files
            samples_seen |= set(ids)
        ds.close()
    assert watch.over == [], "budget exceeded at a publish"
    assert disk_bytes(root) <= budget and temp_files(root) == []
    largest = max(os.path.getsize(root / p) for p in visible_shards(root))
    for k in range(len(counts) - 1):
        assert counts[k + 1] >= counts[k] or bound[k + 1], (counts, bound)  # grows until bound
    assert any(bound) and watch.evicted_paths, counts
    # More distinct samples were trained on than the budget can hold at once.
    assert len(samples_seen) > for_shards // largest * LINES, (len(samples_seen), counts)
    assert len(shards_seen) > max(counts), (shards_seen, counts)


def test_tf_dataset_reads_a_producer_cache(tmp_path):
    pytest.importorskip("tensorflow")
    rtf = pytest.importorskip("recordkit.tf")
    src, _ = local_source(tmp_path / "raw", 3)
    with ShardCache(src, tmp_path / "c", max_bytes="1MiB", format="jsonl", shard_size="16KiB") as c:
        assert c.wait_settled(timeout=60)
        ds = rtf.dataset(src, batch_size=32, cache=CacheOptions(cache=c, epochs="growing"))
        ids = [check_record(int(i), bytes(x)) for b in ds for i, x in zip(b["i"], b["x"].numpy())]
    assert sorted(ids) == list(range(3 * LINES))


def test_sources_regenerated_at_the_same_sizes_are_produced_again(tmp_path):
    """The catalog is a conversion plan, and a plan names its sources' versions: files
    rewritten with other samples of the same size are another plan, and the shards
    made from the old ones are not served."""
    src, _ = local_source(tmp_path / "raw", 3)
    opts = {"max_bytes": "1MiB", "format": "jsonl", "shard_size": "16KiB"}
    with ShardCache(src, tmp_path / "c", **opts) as c:
        assert c.wait_settled(timeout=60)
    old = jsonl_files(3)
    new = {}  # sample i now holds sample i + 500's bytes: the same sizes
    for f in range(3):
        rows = [
            {"i": f * LINES + j, "x": sample(500 + f * LINES + j, 400)["x"]} for j in range(LINES)
        ]
        blob = ("\n".join(map(json.dumps, rows)) + "\n").encode()
        assert len(blob) == len(old[f"f{f:02d}.jsonl"])
        new.update((r["i"], r["x"]) for r in rows)
        with open(os.path.join(src, f"f{f:02d}.jsonl"), "wb") as fh:
            fh.write(blob)
    with ShardCache(src, tmp_path / "c", **opts) as c:
        assert c.wait_settled(timeout=60)
        with c.snapshot(0) as snap:
            schema = rk.Schema.from_json(snap.manifest.schema)
            got = {}
            for path in snap.paths:
                with rk.Dataset(path, schema) as ds:
                    got.update((int(s["i"]), bytes(s["x"]).decode()) for s in ds)
    assert got == new


# -- the budget --------------------------------------------------------------------------------


def expanding_source(root, files: int) -> tuple[str, int]:
    """JSONL rows of one small int: the Examples, framing and index come out ~3.7x
    the text, past the first reservation (2x)."""
    os.makedirs(root, exist_ok=True)
    total = 0
    for f in range(files):
        blob = "".join(f'{{"i":{f * 1000 + j}}}\n' for j in range(1000)).encode()
        total += len(blob)
        with open(os.path.join(root, f"f{f:02d}.jsonl"), "wb") as fh:
            fh.write(blob)
    return str(root), total


def test_underestimated_output_is_redone_with_a_larger_reservation(tmp_path, caplog):
    src, source = expanding_source(tmp_path / "raw", 4)
    root = tmp_path / "c"
    budget = 5 * source + overhead(src, format="jsonl", shard_size="4KiB")  # room for all
    watch = BudgetWatch(root, budget)
    cache = ShardCache(
        src, root, max_bytes=budget, format="jsonl", shard_size="4KiB", fill_workers=0, events=watch
    )
    with caplog.at_level(logging.INFO, logger="recordkit.cache"):
        assert cache.fill() == 4
    outgrew = [
        r.getMessage() for r in caplog.records if "outgrew its reservation" in r.getMessage()
    ]
    assert len(outgrew) == 1, outgrew  # the first partition; the others learned the ratio
    assert cache.errors == [] and watch.over == [] and temp_files(root) == []
    assert disk_bytes(root) > 3 * source  # the output really outgrew the first guess
    with cache.snapshot(0) as snap:
        schema = rk.Schema.from_json(snap.manifest.schema)
        ids = []
        for path in snap.paths:
            with rk.Dataset(path, schema) as ds:
                ids += [int(s["i"]) for s in ds]
    assert sorted(ids) == sorted(f * 1000 + j for f in range(4) for j in range(1000))


def test_partition_larger_than_the_budget_is_a_clear_error(tmp_path):
    src, source = expanding_source(tmp_path / "raw", 2)
    cache = ShardCache(
        src,
        tmp_path / "c",
        max_bytes=source // 2 + overhead(src, format="jsonl", shard_size="4KiB"),
        format="jsonl",
        shard_size="4KiB",
        fill_workers=0,
    )
    with pytest.raises(CacheFullError, match="more than the whole cache budget") as info:
        cache.fill()
    assert "shard_size or partition_items" in str(info.value)
    assert info.value.path == f"part-{fill_order(2)[0]:05d}-00000.tfrecord"  # the first tried
    assert visible_shards(tmp_path / "c") == [] and temp_files(tmp_path / "c") == []


class CountingEvents:
    """Sums the source bytes the cache reports as converted ("downloaded")."""

    def __init__(self) -> None:
        self.total = 0

    def downloaded(self, nbytes: int) -> None:
        self.total += nbytes

    def published(self, shard, used: int) -> None:
        pass

    def evicted(self, path: str) -> None:
        pass


@pytest.mark.parametrize("fill_workers", [0, 1])  # in this thread; in a writer process
def test_a_retried_partition_counts_its_source_bytes_once(tmp_path, fill_workers):
    """Two transient errors on the second item of a partition: it is converted three
    times, its bytes counted once (the producer's retry once counted the first item's
    again, lacking the undo convert's retry has)."""
    src, source = local_source(tmp_path / "raw", 4)
    flaky = tmp_path / "flaky"
    flaky.mkdir()
    for n in range(2):
        (flaky / str(n)).touch()
    counted = CountingEvents()
    cache = ShardCache(
        src,
        tmp_path / "c",
        max_bytes="1MiB",
        format=FlakyJsonl.name,
        source_options={"flaky": str(flaky)},
        # Two files (about 16.5 KB each) per partition: f00 and f01, then f02 and f03.
        convert_options=rk.conversion.ConvertOptions(
            shard_size="64KiB", partition_bytes="40KiB", retry_backoff=0.0
        ),
        fill_workers=fill_workers,
        events=counted,
    )
    try:
        assert cache.fill() == 2
    finally:
        cache.stop()
    assert os.listdir(flaky) == [] and cache.errors == []  # both failures happened, retried
    assert counted.total == source
    with cache.snapshot(0) as snap:
        assert sorted(read_snapshot(snap)) == list(range(4 * LINES))


# -- crashes -----------------------------------------------------------------------------------


def test_writer_sigkilled_mid_partition_is_produced_later(tmp_path):
    src, _ = local_source(tmp_path / "raw", 3)
    gate = tmp_path / "gate"
    gate.mkdir()
    root = tmp_path / "c"
    cache = ShardCache(
        src,
        root,
        max_bytes="1MiB",
        format=GatedJsonl.name,
        source_options={"gate": str(gate), "block": "f01.jsonl"},
        shard_size="16KiB",
        fill_workers=1,
    )
    with cache:
        wait_for(gate / "blocked")
        pid = int((gate / "blocked").read_text())
        assert pid != os.getpid()  # converting in a writer process
        assert "part-00001-00000.tfrecord" not in visible_shards(root)
        assert any(n.startswith("part-00001-00000.tfrecord.tmp-") for n in temp_files(root))
        (gate / "release").touch()  # the retry converts it normally ...
        os.kill(pid, signal.SIGKILL)  # ... but this attempt dies now
        with cache.snapshot(0, min_shards=3, timeout=60) as snap:
            assert sorted(read_snapshot(snap)) == list(range(3 * LINES))
    died = [e for e in cache.errors if isinstance(e, ProduceError)]
    assert died and "died (killed by SIGKILL)" in str(died[0]), cache.errors
    assert died[0].path == "part-00001-00000.tfrecord" and "f01.jsonl" in str(died[0])
    assert temp_files(root) == []


def test_a_silent_writer_is_stopped_and_its_partition_retried(tmp_path):
    src, _ = local_source(tmp_path / "raw", 1)
    gate = tmp_path / "gate"
    gate.mkdir()
    cache = ShardCache(
        src,
        tmp_path / "c",
        max_bytes="1MiB",
        format=GatedJsonl.name,
        source_options={"gate": str(gate), "block": "f00.jsonl"},
        shard_size="16KiB",
        fill_workers=1,
        inactivity_timeout=1.0,
    )
    try:
        assert cache.fill_one() == "worked"  # the writer hangs mid-item: stopped after 1 s
        (err,) = cache.errors
        assert isinstance(err, ProduceError) and "no progress for 1 s" in str(err)
        pid = int((gate / "blocked").read_text())
        assert not os.path.exists(f"/proc/{pid}")  # terminated and reaped
        assert visible_shards(tmp_path / "c") == [] and temp_files(tmp_path / "c") == []
        (gate / "release").touch()
        assert cache.fill_one(only="part-00000-00000.tfrecord") == "worked"
        with cache.snapshot(0) as snap:
            assert sorted(read_snapshot(snap)) == list(range(LINES))
    finally:
        cache.stop()


def test_an_unguarded_training_script_works(tmp_path):
    """Writers never run the user's ``__main__`` again (as multiprocessing's spawn would:
    a script without ``if __name__ == "__main__":`` would start over in every writer)."""
    src, _ = local_source(tmp_path / "raw", 3)
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from recordkit.cache import ShardCache
            cache = ShardCache({src!r}, {str(tmp_path / "c")!r}, max_bytes="1MiB",
                               format="jsonl", shard_size="16KiB", fill_workers=2)
            print("cached", cache.fill(), flush=True)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.split() == ["cached", "3"], out.stderr


def test_a_killed_cache_process_leaves_a_directory_that_is_reused(tmp_path):
    src, _ = local_source(tmp_path / "raw", 4)
    gate = tmp_path / "gate"
    gate.mkdir()
    root = tmp_path / "c"
    order = fill_order(4)
    options = {"gate": str(gate), "block": f"f{order[2]:02d}.jsonl"}  # the third one filled
    code = f"""
        from recordkit import converters
        from recordkit.cache import ShardCache
        from tests.cache._sources import GatedJsonl
        converters.register(GatedJsonl.name, GatedJsonl)
        ShardCache({src!r}, {str(root)!r}, max_bytes="1MiB", format=GatedJsonl.name,
                   source_options={options!r}, shard_size="16KiB", fill_workers=1).fill()
        """
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT)
    try:
        wait_for(gate / "blocked")  # two partitions are published, the third half-written
        writer = int((gate / "blocked").read_text())
    finally:
        child.kill()
        child.wait(30)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{writer}"):  # the writer dies with its cache process
        assert time.monotonic() < deadline, "the writer outlived its cache process"
        time.sleep(0.02)
    kept = {n: os.stat(root / n).st_ino for n in visible_shards(root)}
    names = [f"part-{p:05d}-00000.tfrecord" for p in order]
    assert sorted(kept) == sorted(names[:2])
    assert any(n.startswith(names[2] + ".tmp-") for n in temp_files(root))

    (gate / "release").touch()
    watch = BudgetWatch(root, 1 << 20)
    cache = ShardCache(
        src,
        root,
        max_bytes="1MiB",
        format=GatedJsonl.name,
        source_options=options,
        shard_size="16KiB",
        fill_workers=1,
        events=watch,
    )
    removed = cache.gc()
    assert removed and all(".tmp-" in r for r in removed) and temp_files(root) == []
    assert cache.fill() == 4
    assert sorted(watch.published_paths) == sorted(names[2:])  # the complete ones were kept
    assert all(os.stat(root / n).st_ino == ino for n, ino in kept.items())  # reused as they were
    with cache.snapshot(0) as snap:
        assert sorted(read_snapshot(snap)) == list(range(4 * LINES))


def test_reader_only_process_uses_the_saved_catalog(tmp_path):
    src, _ = local_source(tmp_path / "raw", 2)
    root = tmp_path / "c"
    ShardCache(
        src, root, max_bytes="1MiB", format="jsonl", shard_size="16KiB", fill_workers=0
    ).fill()
    os.rename(src, tmp_path / "gone")  # readers must not need the source
    reader = ShardCache(None, root, max_bytes="1MiB")
    assert reader.mode == "producer" and reader.status().format == "jsonl"
    with reader.snapshot(0) as snap:
        assert snap.manifest.schema == rk.Schema(i=rk.Int64(), x=rk.Bytes()).to_json()
        assert [s.path for s in snap.shards] == [
            "part-00000-00000.tfrecord",
            "part-00001-00000.tfrecord",
        ]
        assert snap.records == 2 * LINES and all(s.crc32c is None for s in snap.shards)
        assert sorted(read_snapshot(snap)) == list(range(2 * LINES))


# -- a full disk -------------------------------------------------------------------------------


def test_enospc_in_the_writer_evicts_read_shards_then_retries(tmp_path):
    src, _ = local_source(tmp_path / "raw", 3)
    full = tmp_path / "full"
    full.mkdir()
    root = tmp_path / "c"
    watch = BudgetWatch(root, 1 << 20)
    cache = ShardCache(
        src,
        root,
        max_bytes="1MiB",
        format=DiskFullJsonl.name,
        source_options={"full": str(full)},
        shard_size="16KiB",
        fill_workers=1,
        events=watch,
    )
    assert cache.fill_one() == "worked" and cache.fill_one() == "worked"
    with cache.snapshot(0) as snap:
        first = [s.path for s in snap.shards]
        for s in snap.shards:
            snap.mark_consumed(s)
    (full / "once").touch()  # the next writer runs out of space once
    assert cache.fill_one() == "worked"
    assert sorted(watch.evicted_paths) == sorted(first)  # both read shards made room
    third = sorted({f"part-{p:05d}-00000.tfrecord" for p in range(3)} - set(first))
    assert visible_shards(root) == third and temp_files(root) == []
    assert cache.errors == []
    (full / "always").touch()
    for p in first:
        with pytest.raises(CacheFullError, match=r"disk under .* is full"):
            cache.fill_one(only=p)
    assert temp_files(root) == []
    cache.stop()


def test_a_real_full_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    tag = uuid.uuid4().hex[:8]
    out = subprocess.run(
        # 64 KiB for shards, beside the cache's sqlite store (database, WAL, shared memory)
        ["mount", "-t", "tmpfs", "-o", "size=160k", f"rk{tag}", str(mnt)],
        capture_output=True,
        timeout=30,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.decode().strip()}")
    try:
        src, _ = local_source(tmp_path / "raw", 6)
        cache = ShardCache(
            src, mnt / "c", max_bytes="1GiB", format="jsonl", shard_size="16KiB", fill_workers=1
        )
        with pytest.raises(CacheFullError, match="is full"):  # the disk fills before the budget
            cache.fill()
        assert 1 <= len(visible_shards(mnt / "c")) < 6 and temp_files(mnt / "c") == []
        with cache.snapshot(0) as snap:
            assert len(read_snapshot(snap)) == len(snap) * LINES
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


# -- the command line and the options -----------------------------------------------------------


def test_cli_fill_and_status(tmp_path, capsys):
    src, _ = local_source(tmp_path / "raw", 6)
    local = tmp_path / "c"
    budget = 60 * 1024 + overhead(src, format="jsonl", shard_size="16KiB")
    args = ["cache", "fill", src, str(local), "--max-bytes", str(budget), "--format", "jsonl"]
    assert main([*args, "--shard-size", "16KiB", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert "of 6 partitions converted and cached" in err
    n = len(visible_shards(local))
    assert 1 <= n < 6 and disk_bytes(local) <= budget and temp_files(local) == []

    assert main(["cache", "status", str(local), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "producer" and doc["format"] == "jsonl" and doc["complete"] == n
    meta = disk_bytes(local / ".recordkit-cache")
    assert (
        doc["remote_shards"] == 6 and doc["used"] - doc["bookkeeping"] == disk_bytes(local) - meta
    )
    assert main(["cache", "status", str(local)]) == 0
    assert "mode         producer (converting jsonl samples into shards)" in capsys.readouterr().out

    assert main(["cache", "gc", str(local), "--max-bytes", "1"]) == 0
    assert visible_shards(local) == []
    assert (
        main(["cache", "fill", src, str(local), "--max-bytes", "1MiB", "--shard-size", "1KiB"]) == 2
    )
    assert "--shard-size need(s) --format" in capsys.readouterr().err


def test_options_are_validated(tmp_path):
    src, _ = local_source(tmp_path / "raw", 1)
    with pytest.raises(ValueError, match="no converter named 'nope'"):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", format="nope")
    with pytest.raises(ValueError, match="max_records"):
        ShardCache(
            src,
            tmp_path / "c",
            max_bytes="1MiB",
            format="jsonl",
            convert_options=rk.conversion.ConvertOptions(max_records=10),
        )
    with pytest.raises(ValueError, match="producer mode only"):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", schema=rk.Schema(i=rk.Int64()))
    with pytest.raises(ValueError, match="inactivity_timeout"):
        ShardCache(src, tmp_path / "c", max_bytes="1MiB", format="jsonl", inactivity_timeout=0)
