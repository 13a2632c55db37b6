"""Scale: the fixed costs of 1k to 100k shards and 1M to 100M records on one node.

Datasets are synthesized in seconds, not written record by record: one template
shard of ``--records`` tiny records is written with ``recordkit.Writer``, then
every shard of the dataset is a hard link of it (a copy where a link fails, e.g.
past the file system's link limit) with a link of its ``.idx``, and the manifest
``recordkit.json`` is written with ``recordkit.format.manifest.Manifest`` (every
entry has the template's record count, bytes and CRC32C). Datasets live under
``--data`` (default ``bench-data/scale``) and are reused across runs.

Each measurement runs in a fresh interpreter whose soft ``RLIMIT_NOFILE`` is
lowered to ``--nofile`` (default 256; ``--keep-nofile`` leaves it), for two
readers: ``recordkit.Dataset(path)`` and
``recordkit.torch.RecordDataset(path, batch_size=256, shuffle=True)``:

- time to open (the constructor) and to the first batch (from the start of
  open; for ``Dataset`` the first 256 records in order);
- anonymous memory added (``RssAnon``) and open file descriptors, after the first
  batch and after reading on: ``--batches`` more batches for ``RecordDataset``,
  ``--spread`` records spread evenly over the whole dataset for ``Dataset``;
- ``--readers ...,tf`` adds ``recordkit.tf.dataset(path, batch_size=256,
  shuffle=True)`` (TensorFlow opens ``ReadOptions.num_threads`` files at a time);
- growth: each size N divisible by ``--growth`` (16) is also measured at
  N/16 shards, and the ratios 16x records in 16x shards are printed;
- ``--repeat N``: each cell measured N times (sizes and readers alternating),
  medians reported (the machine is shared: one run is noisy);
- the per-user index cache (``RECORDKIT_INDEX_CACHE``) is the children's as the
  environment sets it, so after the first reader of a dataset the indexes load from
  their binary copies there; ``--cold-index`` gives every child an empty one (each
  index text parsed, as by the first process to read the dataset).

The cache fill rate: ``ShardCache(src, dir).fill()`` from a local folder of
``--cache-shards`` (4000) tiny shards, seconds per thousand shards published,
and the 4th thousand's rate against the first's.

A reader that fails (``OSError: [Errno 24] Too many open files``) or runs past
``--timeout`` is reported in the table with the error's first line. Targets are
printed PASS/FAIL next to the figures; nothing here gates anything.

Usage::

    python benchmarks/scale_bench.py [--sizes 1k,10k,100k] [--records 1000] [--no-cache]
    python benchmarks/scale_bench.py --sizes 1k,10k --no-cache   # ~20 s on the 2-core VM
    python benchmarks/scale_bench.py --only-cache            # ~12 min before issue 14's store
    python benchmarks/scale_bench.py --sizes 16 --growth 16 --records 250000 --no-cache --repeat 5
    python benchmarks/scale_bench.py --clean                 # remove bench-data/scale
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
MIB = 2**20
BATCH = 256
READERS = ("Dataset", "RecordDataset", "tf")
DEFAULT_READERS = "Dataset,RecordDataset"
# Targets (issue 14): growth 16x records in 16x shards, the 100k-shard open, the cache fill.
GROWTH_TIME = 2.5
GROWTH_RSS_MIB = 24.0
BIG_SHARDS, BIG_OPEN_S, BIG_RSS_MIB = 100_000, 2.0, 300.0
FILL_RATIO = 0.6


# -- synthesis --------------------------------------------------------------------------------


def _count(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _human(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div:
            return f"{n / div:g}{unit}"
    return str(n)


def _link_or_copy(src: str, dst: str) -> tuple[str, bool]:
    """Hard-link ``src`` to ``dst``; copy it where linking fails. Returns the source to
    link the next file from (the copy, once ``src`` hit the link limit) and whether it linked."""
    try:
        os.link(src, dst)
        return src, True
    except OSError as exc:
        if exc.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
            raise
    shutil.copyfile(src, dst)
    return dst, False


def synthesize(root: str, shards: int, records: int, record_bytes: int) -> dict:
    """Make (or reuse) a dataset of ``shards`` x ``records`` tiny records under ``root``."""
    import recordkit as rk
    from recordkit.format.manifest import Manifest, ShardInfo

    spec = {"shards": shards, "records": records, "record_bytes": record_bytes, "v": 1}
    stamp = os.path.join(root, "scale.json")
    try:
        with open(stamp) as f:
            if json.load(f)["spec"] == spec:
                with open(stamp) as f2:
                    return json.load(f2)
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    template = os.path.join(root, "_template")
    schema = rk.Schema(label=rk.Int64(), data=rk.Bytes())
    with rk.Writer(template, schema, max_records=records, fsync=False) as w:
        for i in range(records):
            w.write({"label": i, "data": i.to_bytes(8, "little") * (record_bytes // 8)})
    tpl = w.manifest.shards[0]
    src = os.path.join(template, tpl.path)
    src_idx = src + ".idx"
    links = copies = 0
    infos = []
    for i in range(shards):
        name = f"part-{i:05d}.tfrecord"
        dst = os.path.join(root, name)
        src_idx, linked_idx = _link_or_copy(src_idx, dst + ".idx")  # the index first, as a writer
        src, linked = _link_or_copy(src, dst)
        links += linked + linked_idx
        copies += (not linked) + (not linked_idx)
        infos.append(ShardInfo(name, tpl.records, tpl.bytes, tpl.crc32c))
    Manifest(
        schema=schema.to_json(),
        shards=tuple(infos),
        metadata={"synthesized_by": "benchmarks/scale_bench.py"},
        created_by=f"recordkit {rk.__version__}",
    ).write(root)
    info = {
        "spec": spec,
        "shard_bytes": tpl.bytes,
        "index_bytes": os.path.getsize(src_idx),
        "links": links,
        "copies": copies,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    with open(stamp, "w") as f:
        json.dump(info, f)
    return info


def check_disk(data: str, need: int) -> None:
    os.makedirs(data, exist_ok=True)
    free = shutil.disk_usage(data).free
    print(f"# free disk at {data}: {free / 2**30:.1f} GiB (need ~{need / 2**30:.2f} GiB)")
    if free < need + 2**30:
        sys.exit(f"not enough free disk under {data}: {free} bytes free, need ~{need} + 1 GiB")


# -- the children (fresh interpreters) ----------------------------------------------------------


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _lower_nofile(limit: int) -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))


def _emit(res: dict) -> None:
    print(json.dumps(res), flush=True)  # one line per phase: a timeout keeps what was reached


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def child_read(args: argparse.Namespace) -> None:
    _lower_nofile(args.nofile)
    import resource

    import numpy as np
    import numpy.ma

    import recordkit as rk

    if args.reader == "RecordDataset":
        import torch  # noqa: F401  (imports are not part of the open)

        from recordkit.torch import RecordDataset
    elif args.reader == "tf":
        import tensorflow  # noqa: F401

        import recordkit.tf
    res: dict = {"nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "phase": "open"}
    rss0, res["fds_base"] = _status("RssAnon"), _fds()

    def mark(prefix: str) -> None:
        res[f"rss_{prefix}_mib"] = round((_status("RssAnon") - rss0) / MIB, 1)
        res[f"fds_{prefix}"] = _fds()

    try:
        t0 = time.perf_counter()
        if args.reader == "Dataset":
            ds = rk.Dataset(args.path)
        elif args.reader == "tf":
            ds = recordkit.tf.dataset(args.path, batch_size=BATCH, shuffle=True)
        else:
            ds = RecordDataset(args.path, batch_size=BATCH, shuffle=True)
        res["open_s"] = time.perf_counter() - t0
        mark("open")
        res["phase"] = "first batch"
        _emit(res)
        it = iter(ds)
        first = [next(it) for _ in range(BATCH)] if args.reader == "Dataset" else next(it)
        res["first_s"] = time.perf_counter() - t0
        mark("first")
        del first
        res["phase"] = "reading on"
        _emit(res)
        t1 = time.perf_counter()
        if args.reader == "Dataset":
            n = len(ds)
            for i in np.linspace(0, n - 1, args.spread).astype(np.int64):
                ds[int(i)]
            res["read_on"] = f"{args.spread} records spread"
        else:
            got = 0
            for _ in range(args.batches):
                if next(it, None) is None:
                    break  # the epoch ended first (a small dataset)
                got += 1
            res["read_on"] = f"{got} batches"
        res["read_s"] = time.perf_counter() - t1
        mark("read")
        res["phase"] = "done"
    except Exception as exc:  # reported in the table, not a crash of the benchmark
        res["error"] = f"{_first_line(exc)} (in {res['phase']})"
    _emit(res)
    os._exit(0)  # reader threads need no orderly shutdown here


class _Stamps:
    """CacheEvents that time-stamp each published shard."""

    def __init__(self, t0: float, every: int) -> None:
        self.t0, self.every, self.times = t0, every, []

    def downloaded(self, nbytes: int) -> None:
        pass

    def published(self, shard, used: int) -> None:
        self.times.append(time.perf_counter() - self.t0)
        if len(self.times) % self.every == 0:
            _emit({"published": len(self.times), "times": self.times[self.every - 1 :: self.every]})

    def evicted(self, path: str) -> None:
        pass


def child_cache(args: argparse.Namespace) -> None:
    _lower_nofile(args.nofile)
    from recordkit.cache import ShardCache

    shutil.rmtree(args.dir, ignore_errors=True)
    t0 = time.perf_counter()
    stamps = _Stamps(t0, 1000)
    res: dict = {"published": 0, "times": []}
    try:
        cache = ShardCache(
            args.path, args.dir, max_bytes="1TiB", fill_workers=args.workers, events=stamps
        )
        cache.fill()
        res["fds"] = _fds()
    except Exception as exc:
        res["error"] = _first_line(exc)
    res["published"] = len(stamps.times)
    res["times"] = stamps.times[999::1000]
    res["total_s"] = time.perf_counter() - t0
    _emit(res)
    os._exit(0)


def run_child(args: list[str], timeout: float, index_cache: str | None = None) -> dict:
    """Run a child; its last JSON line is the result (a crash or timeout keeps the last one).

    ``index_cache``: the child's ``RECORDKIT_INDEX_CACHE`` (default: as this process has it).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if index_cache is not None:
        env["RECORDKIT_INDEX_CACHE"] = index_cache
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, HERE, *args], capture_output=True, text=True, timeout=timeout, env=env
        )
        out, err, failure = proc.stdout, proc.stderr, None
        if proc.returncode != 0:
            failure = f"exit {proc.returncode}: " + (err.strip().splitlines() or [""])[-1][:120]
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        failure = f"timeout after {time.perf_counter() - t0:.0f} s"
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    if failure and "error" not in res:
        res["error"] = failure + (f" (in {res['phase']})" if "phase" in res else "")
    return res


# -- the report -------------------------------------------------------------------------------


def _median_run(runs: list[dict]) -> dict:
    """One cell from repeated measurements: the first error, else each number's median."""
    for r in runs:
        if "error" in r:
            return r
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            vals = sorted(r[key] for r in runs if key in r)
            mid = len(vals) // 2
            out[key] = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
    return out


def _fmt(value: object, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def _rss(r: dict) -> float | None:
    vals = [r.get(k) for k in ("rss_open_mib", "rss_first_mib", "rss_read_mib")]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def _verdict(ok: bool | None) -> str:
    return "**PASS**" if ok else "**FAIL**"


def report_reads(
    results: dict, readers: list[str], sizes: list[int], records: int, growth: int
) -> None:
    print(
        "\n| reader | shards | records | open s | first batch s | RssAnon +MiB open / first "
        "/ read on | fds first / read on | read on | result |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for reader in readers:
        for n in sizes:
            r = results[reader, n]
            rss = " / ".join(
                _fmt(r.get(k), ".1f") for k in ("rss_open_mib", "rss_first_mib", "rss_read_mib")
            )
            fds = f"{_fmt(r.get('fds_first'))} / {_fmt(r.get('fds_read'))}"
            read_on = r.get("read_on", "-")
            if r.get("read_s") is not None:
                read_on += f" in {r['read_s']:.2f} s"
            print(
                f"| {reader} | {_human(n)} | {_human(n * records)} | {_fmt(r.get('open_s'))} "
                f"| {_fmt(r.get('first_s'))} | {rss} | {fds} | {read_on} "
                f"| {r.get('error', 'ok')} |"
            )
    print(
        f"\nGrowth: {growth}x the records in {growth}x the shards (targets: <= "
        f"{GROWTH_TIME}x open and first-batch time, <= +{GROWTH_RSS_MIB:g} MiB RssAnon)\n"
    )
    print("| reader | from -> to | open | first batch | RssAnon added | target |")
    print("|---|---|---|---|---|---|")
    for reader in readers:
        for n in sizes:
            if n // growth not in sizes or n % growth or n // growth == n:
                continue
            a, b = results[reader, n // growth], results[reader, n]
            pair = f"{_human(n // growth)} -> {_human(n)} shards"
            if "error" in a or "error" in b:
                print(f"| {reader} | {pair} | - | - | - | {_verdict(False)} (a reader failed) |")
                continue
            ro, rf = b["open_s"] / a["open_s"], b["first_s"] / a["first_s"]
            drss = _rss(b) - _rss(a)
            ok = ro <= GROWTH_TIME and rf <= GROWTH_TIME and drss <= GROWTH_RSS_MIB
            print(
                f"| {reader} | {pair} | {ro:.2f}x | {rf:.2f}x | {drss:+.1f} MiB | {_verdict(ok)} |"
            )
    if BIG_SHARDS in sizes:
        print(
            f"\n{_human(BIG_SHARDS * records)} records in {_human(BIG_SHARDS)} shards: open + "
            f"first batch <= {BIG_OPEN_S:g} s, RssAnon added <= {BIG_RSS_MIB:g} MiB\n"
        )
        for reader in readers:
            r = results[reader, BIG_SHARDS]
            if "error" in r:
                print(f"- {reader}: {_verdict(False)} ({r['error']})")
                continue
            ok = r["first_s"] <= BIG_OPEN_S and _rss(r) <= BIG_RSS_MIB
            print(f"- {reader}: {r['first_s']:.2f} s, +{_rss(r):.1f} MiB: {_verdict(ok)}")


def report_cache(r: dict, shards: int) -> None:
    times = r.get("times", [])
    print(
        f"\nCache fill: ShardCache(local folder, dir).fill() of {shards} tiny shards, "
        f"{r.get('workers')} fill workers\n"
    )
    print("| thousand | seconds | shards/s |")
    print("|---|---|---|")
    prev = 0.0
    per = []
    for k, t in enumerate(times, 1):
        per.append(t - prev)
        print(f"| {k} | {t - prev:.2f} | {1000 / (t - prev):.0f} |")
        prev = t
    print(
        f"\npublished {r.get('published')} of {shards} in {_fmt(r.get('total_s'))} s"
        + (f"; stopped: {r['error']}" if "error" in r else "")
    )
    if len(per) >= 4:
        ratio = per[0] / per[3]
        ok = ratio >= FILL_RATIO
        print(
            f"rate of the 4th thousand / the 1st: {ratio:.2f} (target >= {FILL_RATIO}): "
            f"{_verdict(ok)}"
        )
    else:
        print(f"rate of the 4th thousand / the 1st: not reached: {_verdict(False)}")


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("_read", "_cache"):
        ap = argparse.ArgumentParser()
        ap.add_argument("mode")
        ap.add_argument("--path", required=True)
        ap.add_argument("--reader", choices=READERS)
        ap.add_argument("--dir")
        ap.add_argument("--nofile", type=int, default=0)
        ap.add_argument("--batches", type=int, default=0)
        ap.add_argument("--spread", type=int, default=0)
        ap.add_argument("--workers", type=int, default=2)
        args = ap.parse_args()
        return child_read(args) if args.mode == "_read" else child_cache(args)

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="bench-data/scale", help="where datasets are kept")
    ap.add_argument("--sizes", default="1k,10k,100k", help="shard counts (k = 1000)")
    ap.add_argument("--records", type=int, default=1000, help="records per shard")
    ap.add_argument("--record-bytes", type=int, default=16, help="bytes of the data feature")
    ap.add_argument(
        "--growth",
        type=int,
        default=16,
        help="also measure N/G shards for each size N divisible by G",
    )
    ap.add_argument(
        "--readers",
        default=DEFAULT_READERS,
        help=f"of {','.join(READERS)} (tf: recordkit.tf.dataset, needs tensorflow)",
    )
    ap.add_argument("--nofile", type=int, default=256, help="soft RLIMIT_NOFILE of the children")
    ap.add_argument("--keep-nofile", action="store_true", help="leave RLIMIT_NOFILE as it is")
    ap.add_argument("--batches", type=int, default=400, help="RecordDataset: batches read on")
    ap.add_argument("--spread", type=int, default=2000, help="Dataset: records read on, spread")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per measurement")
    ap.add_argument(
        "--repeat", type=int, default=1, help="measurements per cell (medians are reported)"
    )
    ap.add_argument(
        "--cold-index",
        action="store_true",
        help="each reader starts with an empty per-user index cache (no binary index copies: "
        "every index text is parsed, as the first process to read a dataset does)",
    )
    ap.add_argument("--cache-shards", type=int, default=4000)
    ap.add_argument("--cache-records", type=int, default=16, help="records per cache shard")
    ap.add_argument("--cache-workers", type=int, default=2)
    ap.add_argument(
        "--cache-timeout",
        type=float,
        default=900,
        help="seconds for the cache fill (the rates reached by then are reported)",
    )
    ap.add_argument("--no-cache", action="store_true", help="skip the cache fill")
    ap.add_argument("--only-cache", action="store_true", help="only the cache fill")
    ap.add_argument("--clean", action="store_true", help="remove --data and exit")
    args = ap.parse_args()
    if args.clean:
        shutil.rmtree(args.data, ignore_errors=True)
        print(f"removed {args.data}")
        return
    nofile = 0 if args.keep_nofile else args.nofile
    asked = [_count(s) for s in args.sizes.split(",") if s]
    sizes = sorted(set(asked) | {n // args.growth for n in asked if n % args.growth == 0})
    readers = [r for r in READERS if r in args.readers.split(",")]
    if args.only_cache:
        sizes = []
    # Data on disk: two template copies per 65k links, directory entries, the manifest.
    need = sum(n * 400 for n in sizes) + 2 * args.cache_shards * (args.cache_records * 64 + 200)
    check_disk(args.data, need)
    print(
        f"# RLIMIT_NOFILE of the children: {nofile or 'unchanged'}; batch {BATCH}; "
        f"{args.records} records of ~{args.record_bytes + 30} bytes per shard"
    )
    roots = {}
    for n in sizes:
        root = roots[n] = os.path.join(args.data, f"{n}x{args.records}")
        info = synthesize(root, n, args.records, args.record_bytes)
        print(
            f"# {root}: shard {info['shard_bytes']} B, index {info['index_bytes']} B, "
            f"made in {info['seconds']} s ({info['links']} links, {info['copies']} copies)"
        )
    runs: dict = {}
    cold = os.path.join(args.data, "cold-index-cache")
    for _ in range(args.repeat):  # sizes and readers alternate within each repeat
        for n in sizes:
            for reader in readers:
                if args.cold_index:  # every child starts with an empty per-user index cache
                    shutil.rmtree(cold, ignore_errors=True)
                runs.setdefault((reader, n), []).append(
                    run_child(
                        [
                            "_read",
                            "--path",
                            roots[n],
                            "--reader",
                            reader,
                            f"--nofile={nofile}",
                            f"--batches={args.batches}",
                            f"--spread={args.spread}",
                        ],
                        args.timeout,
                        cold if args.cold_index else None,
                    )
                )
    shutil.rmtree(cold, ignore_errors=True)
    results = {key: _median_run(rs) for key, rs in runs.items()}
    if sizes:
        report_reads(results, readers, sizes, args.records, args.growth)
    if not args.no_cache:
        src = os.path.join(args.data, f"cache-src-{args.cache_shards}x{args.cache_records}")
        synthesize(src, args.cache_shards, args.cache_records, args.record_bytes)
        cache_dir = os.path.join(args.data, "cache-run")
        r = run_child(
            [
                "_cache",
                "--path",
                src,
                "--dir",
                cache_dir,
                f"--nofile={nofile}",
                f"--workers={args.cache_workers}",
            ],
            args.cache_timeout,
        )
        r["workers"] = args.cache_workers
        shutil.rmtree(cache_dir, ignore_errors=True)
        report_cache(r, args.cache_shards)


if __name__ == "__main__":
    sys.exit(main())
