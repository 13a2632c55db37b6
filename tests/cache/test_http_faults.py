"""Faulty remotes: the cache through an HTTP server that misbehaves (``tests.servers.Faults``).

Whatever the server does — 5xx answers, bodies cut off or short, flipped bits,
``Range`` ignored, a new ``ETag`` on every answer, another object's bytes,
stalls — a fill ends with the same shards, byte for byte, and a reader reads
the same dataset (schema, batch shapes, records) as over a server that behaves;
or, when the remote is broken for good, with an error that says so.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import numpy as np
import pytest

import recordkit as rk
from recordkit.cache import DownloadError, ShardCache, workers
from recordkit.cache.remote import Remote
from recordkit.cli import main
from recordkit.errors import AccessDeniedError
from recordkit.format.manifest import read_manifest
from recordkit.reader import CacheOptions
from recordkit.retry import RetryPolicy
from tests.servers import FAULT_KINDS, Faults, http_server

from .conftest import overhead, visible_shards, write_dataset
from .test_faults import assert_intact

pytestmark = [pytest.mark.timeout(120), pytest.mark.remote]

# Fast tries, and a read deadline far below the stalls the server makes (600 s, ended
# when it stops): a test that passes cannot have waited for a stall to end by itself.
FAST = RetryPolicy(backoff=0.01, max_backoff=0.05, cooldown=0.05, read_timeout=0.5)
SCHEMA = rk.Schema(i=rk.Int64(), x=rk.Tensor("uint8", (256,)), v=rk.Tensor("float32", (None,)))


def write_fixed(root: str, shards: int = 6, records: int = 12) -> None:
    """A dataset whose samples have a fixed-shape tensor (the shape a foreign read loses)."""
    with rk.Writer(root, SCHEMA, max_records=records, fsync=False) as w:
        for i in range(shards * records):
            v = np.arange(i % 7, dtype=np.float32) + i
            w.write({"i": i, "x": np.full(256, i % 251, np.uint8), "v": v})


@pytest.fixture
def www(tmp_path):
    write_dataset(tmp_path / "www" / "ds", shards=8, records=20, size=500)
    return tmp_path / "www"


def test_manifest_503s_are_retried_never_taken_for_no_manifest(www, tmp_path):
    with http_server(www) as http:
        http.fail_next(2, status=503, path_prefix="/ds/recordkit.json")
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert cache.fill() == 8
        with cache.snapshot(0) as snap:
            assert snap.manifest == read_manifest(www / "ds")  # manifest mode, not foreign
        http.fail_next(10**6, status=503, path_prefix="/ds/recordkit.json")
        other = ShardCache(http.url + "/ds", tmp_path / "c2", max_bytes="10MiB", retry=FAST)
        with pytest.raises(DownloadError, match=r"recordkit.json: manifest read failed after 6"):
            other.catalog()
    assert other.dir.load_catalog() is None  # nothing decided from a failure


def test_a_missing_manifest_is_a_404_and_then_the_folder_is_foreign(www, tmp_path):
    os.unlink(www / "ds" / "recordkit.json")
    with http_server(www) as http:
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert cache.fill() == 8
        assert ("GET", "/ds/recordkit.json", None) in http.requests
        with cache.snapshot(0) as snap:
            assert snap.manifest is None and snap.records == 160


def test_403_is_an_access_error_that_says_so(www, tmp_path):
    with http_server(www) as http:
        http.fail_next(10**6, status=403, path_prefix="/ds/recordkit.json")
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        with pytest.raises(AccessDeniedError, match=r"refused \(HTTP 403\)") as info:
            cache.catalog()
        assert isinstance(info.value, PermissionError) and info.value.url.endswith("recordkit.json")
        manifest_gets = [r for r in http.requests if r[1] == "/ds/recordkit.json"]
        assert len(manifest_gets) == 1  # not retried
        assert (
            main(["cache", "fill", http.url + "/ds", str(tmp_path / "c3"), "--max-bytes", "1MiB"])
            == 2
        )


def test_a_corrupt_manifest_response_is_retried(www, tmp_path):
    with http_server(www) as http:
        for kind in ("flip", "short", "cut", "swap", "flip"):
            http.fault_next(1, kind, path_prefix="/ds/recordkit.json")
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert cache.fill() == 8
        assert sum(http.injected.values()) == 5
        with cache.snapshot(0) as snap:
            assert snap.manifest == read_manifest(www / "ds")


def test_index_503s_are_retried_and_missing_indexes_mean_a_checked_scan(www, tmp_path, capsys):
    with http_server(www) as http:
        http.fail_next(2, status=503, path_prefix="/ds/part-00000.tfrecord.idx")
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert cache.fill() == 8 and cache.errors == []
        assert_intact(tmp_path / "c", www / "ds")
    for name in os.listdir(www / "ds"):
        if name.endswith(".idx"):
            os.unlink(www / "ds" / name)
    with http_server(www) as http:
        local = tmp_path / "c2"
        assert main(["cache", "fill", http.url + "/ds", str(local), "--max-bytes", "10MiB"]) == 0
        assert "8 of 8 shards cached" in capsys.readouterr().err
        assert_intact(local, www / "ds")  # every index rebuilt by a CRC-checked scan
        # the same remote, read by a training loop through a cache of its own
        from recordkit.torch import RecordDataset

        ds = RecordDataset(
            http.url + "/ds", batch_size=40, cache=CacheOptions(dir=tmp_path / "c3", limit="10MiB")
        )
        try:
            while True:  # growing epochs read what has arrived; whole epochs read it all
                seen = sorted(i for b in ds for i in b["i"].tolist())
                if len(seen) == 160:
                    break
                time.sleep(0.05)
            assert seen == list(range(160))
        finally:
            ds.close()


def test_a_corrupt_index_response_falls_back_to_a_scan(www, tmp_path):
    with http_server(www) as http:
        http.fault_next(1, "flip", path_prefix="/ds/part-00001.tfrecord.idx")
        http.fault_next(1, "swap", path_prefix="/ds/part-00002.tfrecord.idx")
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert cache.fill() == 8 and cache.failed == {}
    assert_intact(tmp_path / "c", www / "ds")


def test_the_mode_is_decided_once(tmp_path):
    write_fixed(str(tmp_path / "www" / "ds"))
    with http_server(tmp_path / "www") as http:
        url = http.url + "/ds"
        ShardCache(url, tmp_path / "c", max_bytes="10MiB", retry=FAST).fill_one()
        os.rename(tmp_path / "www" / "ds" / "recordkit.json", tmp_path / "recordkit.json")
        # the remote now says "no manifest" (a rewrite in progress, a deleted file): the
        # cache keeps the mode it was made in, never reading the shards as foreign
        again = ShardCache(url, tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert again.fill() == 6
        with again.snapshot(0) as snap:
            assert snap.manifest is not None
            assert rk.Schema.from_json(snap.manifest.schema) == SCHEMA


def test_a_stalled_response_meets_its_deadline(www, tmp_path):
    with http_server(www) as http:  # each stall lasts until the server stops
        http.fault_next(2, "stall", path_prefix="/ds/part-00003.tfrecord")
        http.fault_next(1, "stall", path_prefix="/ds/recordkit.json")
        cache = ShardCache(http.url + "/ds", tmp_path / "c", max_bytes="10MiB", retry=FAST)
        assert cache.fill() == 8 and cache.failed == {}
        assert http.injected["stall"] == 3
    assert_intact(tmp_path / "c", www / "ds")


def test_a_connection_that_never_opens_meets_its_deadline():
    """A listener whose backlog is full drops SYNs: connecting hangs (about two minutes
    of SYN retries without a deadline; the test's timeout is shorter)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        policy = RetryPolicy(attempts=2, backoff=0.0, connect_timeout=0.5)
        remote = Remote(f"http://127.0.0.1:{port}/ds", retry=policy)
        with pytest.raises(DownloadError, match="after 2 attempt") as info:
            remote.read_manifest()
        assert "timeout" in str(info.value).lower()
    finally:
        for c in fillers:
            c.close()
        server.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "foreign"])
def test_fills_through_a_faulty_server_equal_a_fault_free_fill(www, tmp_path, manifest):
    """At a 30% fault rate, seeded, a fill (indexes there or not) ends with the shards a
    fault-free fill has, byte for byte, and the same catalog. Foreign folders have no
    checksum to tell another shard of the same size from the right one, so ``swap``
    is left out there (docs/howto/remote.md says so)."""
    kinds = FAULT_KINDS if manifest else tuple(k for k in FAULT_KINDS if k != "swap")
    if not manifest:
        os.unlink(www / "ds" / "recordkit.json")
        for name in sorted(os.listdir(www / "ds"))[::3]:
            if name.endswith(".idx"):
                os.unlink(www / "ds" / name)  # some indexes missing
    with http_server(www) as http:
        clean = ShardCache(http.url + "/ds", tmp_path / "ref", max_bytes="10MiB", retry=FAST)
        assert clean.fill() == 8 and clean.errors == []
        with clean.snapshot(0) as snap:
            expected = (snap.manifest, [(s.path, s.records, s.bytes) for s in snap.shards])
    injected: dict[str, int] = {}
    for seed in range(3):
        faults = Faults(rate=0.3, kinds=kinds, seed=seed, stall_s=600)
        with http_server(www, faults) as http:
            root = tmp_path / f"c{seed}"
            # a bad bit anywhere fails a whole download (one CRC per shard): with ~3 ranged
            # reads a shard, about a quarter fail, so give each shard plenty of tries
            policy = dataclasses.replace(FAST, shard_attempts=30)
            cache = ShardCache(
                http.url + "/ds", root, max_bytes="10MiB", retry=policy, chunk_bytes="4KiB"
            )
            assert cache.fill() == 8, cache.failed
            assert cache.failed == {}
            for kind, n in http.injected.items():
                injected[kind] = injected.get(kind, 0) + n
        assert sorted(visible_shards(root)) == sorted(visible_shards(www / "ds"))
        assert_intact(root, www / "ds")
        with cache.snapshot(0) as snap:
            assert (snap.manifest, [(s.path, s.records, s.bytes) for s in snap.shards]) == expected
    assert set(injected) == set(kinds), injected  # every kind of fault was met


def read_all(ds) -> tuple[set, dict[int, bytes]]:
    """Every batch's feature shapes (but the batch dimension, at most 8) and dtypes, and
    each record's bytes by its number."""
    shapes, records = set(), {}
    for batch in ds:
        assert 1 <= len(batch["i"]) <= 8
        shapes.add(
            tuple(
                (k, tuple(v.shape[1:]), str(v.dtype))
                if hasattr(v, "shape")
                else (k, type(v).__name__)
                for k, v in sorted(batch.items())
            )
        )
        for i, x, v in zip(batch["i"].tolist(), batch["x"], batch["v"]):
            records[i] = bytes(x.numpy()) + np.asarray(v).tobytes()
    return shapes, records


@pytest.mark.timeout(300)
def test_record_dataset_through_a_faulty_server_reads_the_same_dataset(tmp_path, monkeypatch):
    from recordkit.torch import RecordDataset

    # A shard whose download failed is retried after 0.2 s, not 5 s (the one setting a
    # reader's own cache takes from the default policy that this test changes).
    monkeypatch.setattr(workers, "DEFAULT_POLICY", RetryPolicy(cooldown=0.2, max_cooldown=1.0))
    write_fixed(str(tmp_path / "www" / "ds"), shards=6, records=12)
    total = 72

    def run(faults: Faults | None, name: str):
        with http_server(tmp_path / "www", faults) as http:
            ds = RecordDataset(
                http.url + "/ds",
                batch_size=8,
                cache=CacheOptions(dir=tmp_path / name, limit="10MiB"),
            )
            try:
                shapes, records = set(), {}
                while len(records) < total:  # growing epochs widen; whole epochs read it all
                    s, r = read_all(ds)
                    shapes |= s
                    records.update(r)
                return ds.schema, shapes, records, http.injected
            finally:
                ds.close()

    schema, shapes, records, _ = run(None, "ref")
    assert schema == SCHEMA and len(records) == total
    for seed in range(2):
        faults = Faults(rate=0.3, seed=seed, stall_s=0.2)  # stalls shorter than the deadline
        got = run(faults, f"c{seed}")
        assert got[0] == schema  # never read as foreign TFRecords
        assert got[1] == shapes  # batches of the same shapes and types
        assert got[2] == records
        assert sum(got[3].values()) > 0


def test_cache_fill_exit_status_says_whether_the_budget_was_filled(
    www, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(workers, "DEFAULT_POLICY", RetryPolicy(backoff=0.01, cooldown=0.05))
    with http_server(www) as http:
        url = http.url + "/ds"
        # two shards' downloads fail (a flipped bit, another object's bytes), and each
        # is fetched again after its cooldown, before the fill ends
        http.fault_next(1, "flip", path_prefix="/ds/part-00004.tfrecord")
        http.fault_next(1, "swap", path_prefix="/ds/part-00005.tfrecord")
        assert main(["cache", "fill", url, str(tmp_path / "a"), "--max-bytes", "10MiB"]) == 0
        err = capsys.readouterr().err
        assert "8 of 8 shards cached" in err and "2 failed downloads were retried" in err
        # a budget for three shards, reached after a retried failure: filled, so 0
        budget = 3 * max(os.path.getsize(www / "ds" / n) + 400 for n in visible_shards(www / "ds"))
        budget += overhead(www / "ds")
        http.fault_next(1, "5xx", path_prefix="/ds/part-0000")
        http.fault_next(1, "flip", path_prefix="/ds/part-0000")
        args = ["cache", "fill", url, str(tmp_path / "b"), "--max-bytes", str(budget)]
        assert main(args) == 0
        assert 1 <= len(visible_shards(tmp_path / "b")) < 8
        capsys.readouterr()
    # a shard that is corrupt on the remote: every other one arrives, then exit 1 naming it
    with open(www / "ds" / "part-00006.tfrecord", "r+b") as f:
        f.seek(200)
        f.write(b"\xff\xff")
    with http_server(www) as http:
        assert (
            main(["cache", "fill", http.url + "/ds", str(tmp_path / "c"), "--max-bytes", "10MiB"])
            == 1
        )
        err = capsys.readouterr().err
        assert "7 of 8 shards cached" in err
        assert "error: part-00006.tfrecord:" in err and "CRC32C" in err
        assert "1 shard could not be fetched" in err
        gets = [r for r in http.requests if r[1] == "/ds/part-00006.tfrecord"]
        assert len(gets) == RetryPolicy().shard_attempts  # tried again after each cooldown


def test_on_s3_no_such_key_means_no_manifest(s3, tmp_path):
    url = s3.bucket() + "/ds"
    write_dataset(url, shards=2, records=5, size=100, storage_options=s3.storage_options)
    opts = {"max_bytes": "1MiB", "storage_options": s3.storage_options, "retry": FAST}
    cache = ShardCache(url, tmp_path / "a", **opts)
    assert cache.fill() == 2
    with cache.snapshot(0) as snap:
        assert snap.manifest is not None
    s3.filesystem().rm(url + "/recordkit.json")
    cache = ShardCache(url, tmp_path / "b", **opts)
    assert cache.fill() == 2
    with cache.snapshot(0) as snap:
        assert snap.manifest is None and snap.records == 10
