"""The cache against real servers: moto's S3 (server mode) and an HTTP server that lies."""

from __future__ import annotations

import os
import threading

import pytest

import recordkit as rk
from recordkit.cache import DownloadError, RetryOptions, ShardCache
from recordkit.cache.directory import BOOKKEEPING_SLACK
from recordkit.cache.fetch import index_bound
from recordkit.reader.shards import ShardSet

from .conftest import (
    BudgetWatch,
    check_sample,
    cutting_http_server,
    disk_bytes,
    overhead,
    visible_shards,
    write_dataset,
)

pytestmark = [pytest.mark.remote, pytest.mark.timeout(120)]

RECORDS = 20


def read_epoch(snap) -> tuple[int, set[int]]:
    """Read a snapshot the way a reader does: map all shards, read, release each."""
    schema = rk.Schema.from_json(snap.schema_json)
    shards = ShardSet(snap.root, snap.manifest, snap.shards, schema)
    seen: set[int] = set()
    try:
        for k, info in enumerate(shards.infos):
            first = int(info.path.split("-")[1].split(".")[0]) * RECORDS
            with shards.use(k) as shard:
                for r in range(shard.records):
                    i = check_sample(schema.decode(shard.payload(r), copy=True))
                    assert first <= i < first + RECORDS  # the record belongs to this shard
                    seen.add(i)
            shards.evict(k)
            assert shards.open_count == 0
            snap.mark_consumed(info, release=True)  # unmapped: it may go now
    finally:
        shards.close()
    return len(shards), seen


@pytest.mark.slow
def test_training_through_a_dataset_five_times_the_budget(s3, tmp_path):
    url = s3.bucket() + "/train"
    manifest = write_dataset(
        url, shards=40, records=RECORDS, size=2000, storage_options=s3.storage_options
    )
    largest = max(s.bytes for s in manifest.shards)
    need = largest + index_bound(max(manifest.shards, key=lambda s: s.bytes))
    for_shards = manifest.bytes // 5
    budget = for_shards + overhead(url, storage_options=s3.storage_options)
    root = tmp_path / "cache"
    watch = BudgetWatch(root, budget)
    cache = ShardCache(
        url,
        root,
        max_bytes=budget,
        fill_workers=1,  # at most one reservation at a time: the bound below is exact
        storage_options=s3.storage_options,
        chunk_bytes="16KiB",  # several ranged reads per shard
        events=watch,
    )
    counts, bound, union = [], [], set()
    with cache:
        for epoch in range(7):
            if epoch >= 3:
                # From here on let the filler catch up between epochs (as a slower
                # training step would), so the budget binds whatever this machine's speed.
                assert cache.wait_settled(timeout=60)
            with cache.snapshot(epoch, min_shards=1, timeout=60) as snap:
                used = cache.status().used + BOOKKEEPING_SLACK  # what the cache keeps free
                bound.append(bool(watch.evicted_paths) or used + need > budget)
                n, seen = read_epoch(snap)
                assert len(seen) == n * RECORDS  # every record of every shard, once
                counts.append(n)
                union |= {s.path for s in snap.shards}
    assert watch.over == [], "budget exceeded at a publish"
    assert disk_bytes(root) <= budget
    for k in range(len(counts) - 1):
        # the epoch grows until the budget binds ...
        assert counts[k + 1] >= counts[k] or bound[k + 1], (counts, bound)
    for k in range(len(counts)):
        # ... and then holds all but one reservation's worth of shards
        assert not bound[k] or counts[k] >= (for_shards - 2 * need) // largest, (counts, bound)
    assert any(bound), counts  # the budget did bind
    # More distinct shards were trained on than the cache can hold at once.
    assert len(union) > for_shards // largest, (len(union), counts)
    assert watch.evicted_paths


@pytest.fixture
def restartable_s3():
    """A moto server that the test can stop and start again on the same port."""
    from moto.server import ThreadedMotoServer

    from tests.servers import S3Server

    servers = [ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)]
    servers[0].start()
    host, port = servers[0].get_host_and_port()
    endpoint = f"http://{host}:{port}"
    info = S3Server(
        endpoint_url=endpoint,
        storage_options={
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        },
    )
    running = [True]

    def outage(seconds: float) -> None:
        servers[-1].stop()
        running[0] = False

        def restart() -> None:
            s = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            s.start()
            servers.append(s)
            running[0] = True

        timer = threading.Timer(seconds, restart)
        timer.daemon = True
        timer.start()
        timers.append(timer)

    timers: list[threading.Timer] = []
    info.outage = outage  # type: ignore[attr-defined]
    try:
        yield info
    finally:
        for t in timers:
            t.join(30)
        if running[0]:
            servers[-1].stop()


def test_s3_server_stopped_mid_download_and_restarted(restartable_s3, tmp_path):
    s3 = restartable_s3
    url = s3.bucket() + "/ds"
    manifest = write_dataset(
        url, shards=4, records=RECORDS, size=3000, storage_options=s3.storage_options
    )

    class StopOnce(BudgetWatch):
        stopped = False

        def downloaded(self, nbytes):
            super().downloaded(nbytes)
            if not self.stopped:
                self.stopped = True
                s3.outage(1.5)  # the server goes away between two ranged reads

    watch = StopOnce(tmp_path / "c", 1 << 30)
    cache = ShardCache(
        url,
        tmp_path / "c",
        max_bytes="1GiB",
        fill_workers=1,
        storage_options=s3.storage_options,
        retry=RetryOptions(attempts=8, backoff=0.2, max_backoff=2.0),
        chunk_bytes="16KiB",
        events=watch,
    )
    assert cache.fill() == 4
    assert watch.stopped and cache.errors == []
    with cache.snapshot(0) as snap:
        n, seen = read_epoch(snap)
    assert n == 4 and len(seen) == 4 * RECORDS
    assert sum(s.bytes for s in manifest.shards) == watch.bytes  # each shard fetched once


def test_responses_cut_short_are_retried(tmp_path):
    write_dataset(tmp_path / "www" / "ds", shards=3, records=RECORDS, size=3000)
    with cutting_http_server(tmp_path / "www") as (server, base):
        server.cut = 3  # the first three ranged answers are half as long as asked
        cache = ShardCache(
            base + "/ds",
            tmp_path / "c",
            max_bytes="1GiB",
            fill_workers=1,
            retry=RetryOptions(attempts=5, backoff=0.01),
            chunk_bytes="16KiB",
        )
        assert cache.fill() == 3
        assert server.cut == 0 and cache.errors == []
        with cache.snapshot(0) as snap:
            assert read_epoch(snap)[0] == 3


def test_responses_always_cut_short_are_an_error_not_data(tmp_path):
    write_dataset(tmp_path / "www" / "ds", shards=2, records=RECORDS, size=3000)
    with cutting_http_server(tmp_path / "www") as (server, base):
        server.cut = 10**9
        cache = ShardCache(
            base + "/ds",
            tmp_path / "c",
            max_bytes="1GiB",
            fill_workers=1,
            retry=RetryOptions(attempts=3, backoff=0.01, cooldown=0.01, shard_attempts=2),
        )
        assert cache.fill() == 0
    assert len(cache.errors) == 4  # 2 shards, 2 downloads each
    assert sorted(cache.failed) == ["part-00000.tfrecord", "part-00001.tfrecord"]
    err = cache.errors[0]
    assert isinstance(err, DownloadError) and "ranged read returned" in str(err)
    assert "/ds/part-0000" in str(err) and "in each of 3 attempt(s)" in str(err)
    assert visible_shards(tmp_path / "c") == []
    assert [n for n in os.listdir(tmp_path / "c") if n != ".recordkit-cache"] == []
