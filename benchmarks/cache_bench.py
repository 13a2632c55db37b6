"""The shard cache: time to the first batch from a cold cache, and read throughput
from the cache vs from the same dataset on local disk.

A synthetic dataset (records of random bytes + a label) is written locally and
uploaded to a moto S3 server started by this script on 127.0.0.1 (in this
process: its CPU use competes with the cache's, as a slow remote would not).

- cold start: from an empty cache directory, ``ShardCache.start()`` then
  ``snapshot(min_shards=1)`` and the first batch of ``recordkit.torch.RecordDataset``
  over the cache; compared with copying the whole dataset first (``fill()``) and
  with the first batch from the local copy;
- steady state: one epoch of ``RecordDataset`` (batch 64) over the filled cache
  directory vs over the local dataset, alternating, medians of ``--repeat``, warm
  page cache. The cache holds the same files, so the target ratio is >= 0.9.

Usage::

    python benchmarks/cache_bench.py [--shards 16] [--shard-mib 16] [--repeat 3] [--quick]

Bookkeeping at scale (``--bookkeeping``): a local folder of ``--tiny-shards``
one-record shards (a path source, no server) is copied into an empty cache by
``ShardCache.fill()``, and the seconds each thousand shards took are printed,
with the ratio of the last thousand's rate to the first's (target: >= 0.6; a
cache whose per-shard bookkeeping grows with the number of shards falls behind)::

    python benchmarks/cache_bench.py --bookkeeping [--tiny-shards 4000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np


def make_dataset(path: str, shards: int, shard_mib: int, record_kib: int) -> None:
    import recordkit as rk

    schema = rk.Schema(data=rk.Bytes(), label=rk.Int64())
    rng = np.random.default_rng(0)
    per_shard = max(1, shard_mib * 1024 // record_kib)
    with rk.Writer(path, schema, max_records=per_shard, fsync=False) as w:
        for i in range(shards * per_shard):
            w.write({"data": rng.bytes(record_kib * 1024), "label": i})


def epoch(path: str, schema) -> tuple[float, int]:
    from recordkit.torch import RecordDataset

    ds = RecordDataset(path, batch_size=64, schema=schema)
    t0 = time.perf_counter()
    nbytes = 0
    for batch in ds:
        nbytes += int(batch["data"].numel())
    return time.perf_counter() - t0, nbytes


def first_batch(path: str, schema) -> None:
    from recordkit.torch import RecordDataset

    next(iter(RecordDataset(path, batch_size=64, schema=schema)))


def bookkeeping(tiny_shards: int, workers: int) -> dict:
    """Fill a cache from a folder of ``tiny_shards`` tiny shards; seconds per thousand."""
    import recordkit as rk
    from recordkit.cache import ShardCache

    class Clock:
        def __init__(self) -> None:
            self.times: list[float] = []

        def downloaded(self, nbytes: int) -> None:
            pass

        def published(self, shard, used: int) -> None:
            self.times.append(time.perf_counter())

        def evicted(self, path: str) -> None:
            pass

    work = tempfile.mkdtemp(prefix="rk-cache-bookkeeping-")
    try:
        src = os.path.join(work, "src")
        schema = rk.Schema(data=rk.Bytes(), label=rk.Int64())
        with rk.Writer(src, schema, max_records=1, fsync=False) as w:
            for i in range(tiny_shards):
                w.write({"data": b"x" * 64, "label": i})
        clock = Clock()
        cache = ShardCache(
            src, os.path.join(work, "cache"), max_bytes="1GiB", fill_workers=workers, events=clock
        )
        t0 = time.perf_counter()
        n = cache.fill()
        total = time.perf_counter() - t0
        meta = os.path.join(work, "cache", ".recordkit-cache")
        on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(meta) for f in fs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    marks = [t0, *clock.times[999::1000]]
    per_k = [round(b - a, 2) for a, b in itertools.pairwise(marks)]
    return {
        "shards": n,
        "fill_workers": workers,
        "total_s": round(total, 2),
        "s_per_thousand": per_k,
        "last_vs_first_rate": round(per_k[0] / per_k[-1], 3) if per_k else None,
        "bookkeeping_bytes_on_disk": on_disk,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-mib", type=int, default=16)
    ap.add_argument("--record-kib", type=int, default=64)
    ap.add_argument(
        "--workers", type=int, default=None, help="cache fill workers (4; --bookkeeping: 2)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 shards of 4 MiB, 1 repeat")
    ap.add_argument("--bookkeeping", action="store_true", help="fill from many tiny shards")
    ap.add_argument("--tiny-shards", type=int, default=4000)
    args = ap.parse_args()
    if args.bookkeeping:  # ShardCache's default fill workers
        print(json.dumps(bookkeeping(args.tiny_shards, args.workers or 2)))
        return
    args.workers = args.workers or 4
    if args.quick:
        args.shards, args.shard_mib, args.repeat = 4, 4, 1

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    import s3fs
    from moto.server import ThreadedMotoServer

    import recordkit as rk
    from recordkit.cache import ShardCache

    work = tempfile.mkdtemp(prefix="rk-cache-bench-")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        opts = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        local = os.path.join(work, "local")
        make_dataset(local, args.shards, args.shard_mib, args.record_kib)
        total = sum(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local))
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **opts)
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="bench")
        fs.put(local + "/", "bench/ds/", recursive=True)
        remote = "s3://bench/ds"
        schema = rk.Dataset(local).schema
        import recordkit.torch  # noqa: F401  (imports are not part of the first batch)

        fs.ls(remote)  # nor is the first connection

        # cold start: first batch while the cache fills
        cold = os.path.join(work, "cold")
        t0 = time.perf_counter()
        cache = ShardCache(
            remote, cold, max_bytes=2 * total, fill_workers=args.workers, storage_options=opts
        )
        with cache:
            snap = cache.snapshot(0, min_shards=1, timeout=600)
            first_batch(cold, schema)
            ttfb = time.perf_counter() - t0
            snap.close()
            cache.wait_settled(timeout=600)
        # the alternative: copy everything, then read
        full = os.path.join(work, "full")
        t0 = time.perf_counter()
        ShardCache(
            remote, full, max_bytes=2 * total, fill_workers=args.workers, storage_options=opts
        ).fill()
        first_batch(full, schema)
        copy_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        first_batch(local, schema)
        local_first = time.perf_counter() - t0

        # steady state, warm page cache, alternating
        epoch(full, schema)
        epoch(local, schema)
        rates: dict[str, list[float]] = {"cache": [], "local": []}
        for _ in range(args.repeat):
            for name, path in (("cache", full), ("local", local)):
                secs, nbytes = epoch(path, schema)
                rates[name].append(nbytes / secs / 2**20)
        cache_rate = statistics.median(rates["cache"])
        local_rate = statistics.median(rates["local"])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "dataset_mib": round(total / 2**20, 1),
        "shards": args.shards,
        "fill_workers": args.workers,
        "ttfb_cold_cache_s": round(ttfb, 3),
        "ttfb_copy_everything_first_s": round(copy_first, 3),
        "ttfb_local_s": round(local_first, 3),
        "ttfb_ratio_cold_vs_copy_first": round(ttfb / copy_first, 3),
        "read_mib_s_cache": round(cache_rate, 1),
        "read_mib_s_local": round(local_rate, 1),
        "read_ratio_cache_vs_local": round(cache_rate / local_rate, 3),
        "repeat": args.repeat,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
