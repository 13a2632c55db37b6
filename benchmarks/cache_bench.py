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

Whole epochs from remote storage (``--whole``): the same synthetic records as
recordkit shards and as MosaicML Streaming MDS shards, on one moto S3 server
(a separate process on 127.0.0.1), read with a cache budget of ``--budget-frac``
of the dataset: time from making the dataset to the first batch, and two
epochs' throughput (the first from a cold cache), for ``RecordDataset(s3://...,
cache=ShardCache(...))`` (whole epochs), the same records read from local disk,
and ``StreamingDataset(remote=s3://..., local=..., cache_limit=...)`` with a
``DataLoader`` of ``--mds-workers`` workers, shuffled and not. Streaming runs in
its own venv (``--mds-python``), made by ``benchmarks/mds_env.sh``::

    bash benchmarks/mds_env.sh /tmp/mds-venv
    python benchmarks/cache_bench.py --whole --mds-python /tmp/mds-venv/bin/python
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from recordkit.reader import CacheOptions


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


def _moto(port_file: str) -> subprocess.Popen[bytes]:
    """A moto S3 server in its own process (its CPU is not the readers')."""
    code = (
        "import logging, sys, time\n"
        "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
        "from moto.server import ThreadedMotoServer\n"
        "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
        "s.start()\n"
        f"open({port_file!r} + '.tmp', 'w').write(str(s.get_host_and_port()[1]))\n"
        f"import os; os.replace({port_file!r} + '.tmp', {port_file!r})\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(300):
        if os.path.exists(port_file):
            return proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the moto server did not start")


def _rk_epochs(make) -> dict:
    """Time to the first batch (from making the dataset) and two epochs' throughput."""
    t0 = time.perf_counter()
    ds = make()
    out: dict = {}
    for e in range(2):
        start = time.perf_counter()
        nbytes = records = 0
        for k, batch in enumerate(ds):
            if e == 0 and k == 0:
                out["ttfb_s"] = time.perf_counter() - t0
            nbytes += int(batch["data"].numel())
            records += len(batch["label"])
        secs = time.perf_counter() - start
        out[f"epoch{e}_s"] = secs
        out[f"epoch{e}_records"] = records
        out[f"epoch{e}_mib_s"] = nbytes / secs / 2**20
    out["remote_wait_s"] = ds.stats.remote_wait_seconds
    close = getattr(ds, "close", None)
    if close is not None:
        close()
    return out


def whole(args: argparse.Namespace) -> dict:
    """Whole epochs through the cache vs local vs MosaicML Streaming (see the module doc)."""
    import boto3

    import recordkit as rk
    from recordkit.cache import ShardCache
    from recordkit.torch import RecordDataset

    work = tempfile.mkdtemp(prefix="rk-whole-bench-")
    server = _moto(os.path.join(work, "port"))
    try:
        with open(os.path.join(work, "port")) as f:
            port = int(f.read())
        endpoint = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "S3_ENDPOINT_URL": endpoint,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        opts = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        s3.create_bucket(Bucket="bench")
        local = os.path.join(work, "local")
        make_dataset(local, args.shards, args.shard_mib, args.record_kib)
        records = len(rk.Dataset(local))
        total = sum(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local))
        for name in os.listdir(local):
            s3.upload_file(os.path.join(local, name), "bench", f"rk/{name}")
        budget = int(total * args.budget_frac)
        schema = rk.Dataset(local).schema
        mds = args.mds_python
        if mds:
            subprocess.run(
                [mds, _MDS_SIDE, "write", "--out", os.path.join(work, "mds"), "--records",
                 str(records), "--record-kib", str(args.record_kib), "--shard-mib",
                 str(args.shard_mib)],
                check=True, env=env,
            )  # fmt: skip
            mds_dir = os.path.join(work, "mds")
            for name in os.listdir(mds_dir):
                s3.upload_file(os.path.join(mds_dir, name), "bench", f"mds/{name}")
        import recordkit.torch  # noqa: F401  (imports are not part of the first batch)

        results: dict = {
            "dataset_mib": round(total / 2**20, 1),
            "records": records,
            "shards": args.shards,
            "budget_mib": round(budget / 2**20, 1),
        }
        for k, shuffle in enumerate((False, True)):
            tag = "shuffled" if shuffle else "in_order"
            cache_dir = os.path.join(work, f"cache{k}")

            def remote(cache_dir: str = cache_dir, shuffle: bool = shuffle) -> RecordDataset:
                cache = ShardCache(
                    "s3://bench/rk",
                    cache_dir,
                    max_bytes=budget,
                    fill_workers=args.workers,
                    storage_options=opts,
                )
                return RecordDataset(
                    "s3://bench/rk", batch_size=64, shuffle=shuffle, seed=1, cache=cache,
                    schema=schema,
                )  # fmt: skip

            rk_remote = _rk_epochs(remote)
            rk_local = _rk_epochs(
                lambda shuffle=shuffle: RecordDataset(local, batch_size=64, shuffle=shuffle, seed=1)
            )
            row = {"recordkit_whole": rk_remote, "recordkit_local": rk_local}
            if mds:
                probe = CacheOptions(dir=os.path.join(work, "probe"), limit=budget)
                probed = RecordDataset(local, batch_size=64, shuffle=True, cache=probe)
                window = probed.source.window
                # Streaming's shuffle block: our shard window in samples (its default,
                # 0 here, where the budget holds the dataset and we read the local order)
                block = window // (args.record_kib * 1024) if shuffle and window else 0
                out = subprocess.run(
                    [mds, _MDS_SIDE, "read", "--remote", "s3://bench/mds", "--local",
                     os.path.join(work, f"mds-cache{k}"), "--budget", str(budget),
                     "--workers", str(args.mds_workers), "--block", str(block)]
                    + (["--shuffle"] if shuffle else []),
                    env=env, capture_output=True, text=True,
                )  # fmt: skip
                if out.returncode:
                    raise RuntimeError(f"MosaicML Streaming's side failed:\n{out.stderr}")
                row["mosaicml_streaming"] = json.loads(out.stdout.strip().splitlines()[-1])
                row["mosaicml_shuffle_block_size"] = block
            for name, r in row.items():
                if isinstance(r, dict):
                    row[name] = {key: round(v, 3) for key, v in r.items()}
            ratios = {
                "ttfb_whole_vs_local": rk_remote["ttfb_s"] / rk_local["ttfb_s"],
                "epoch0_whole_vs_local": rk_remote["epoch0_mib_s"] / rk_local["epoch0_mib_s"],
                "epoch1_whole_vs_local": rk_remote["epoch1_mib_s"] / rk_local["epoch1_mib_s"],
            }
            if mds:
                m = row["mosaicml_streaming"]
                ratios["ttfb_whole_vs_mosaicml"] = rk_remote["ttfb_s"] / m["ttfb_s"]
                ratios["epoch0_whole_vs_mosaicml"] = rk_remote["epoch0_mib_s"] / m["epoch0_mib_s"]
                ratios["epoch1_whole_vs_mosaicml"] = rk_remote["epoch1_mib_s"] / m["epoch1_mib_s"]
            row["ratios"] = {key: round(v, 3) for key, v in ratios.items()}
            results[tag] = row
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return results


_MDS_SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mds_side.py")


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
    ap.add_argument("--whole", action="store_true", help="whole epochs vs local vs Streaming")
    ap.add_argument("--budget-frac", type=float, default=1 / 3, help="--whole: budget/dataset")
    ap.add_argument("--mds-python", default=None, help="--whole: the Streaming venv's python")
    ap.add_argument("--mds-workers", type=int, default=2, help="--whole: its DataLoader workers")
    args = ap.parse_args()
    if args.whole:
        args.workers = args.workers or 4
        if args.quick:  # Streaming wants a budget of at least four shards
            args.shards, args.shard_mib = 16, 2
        print(json.dumps(whole(args)))
        return
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
