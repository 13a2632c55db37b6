"""Read throughput: recordkit.torch.RecordDataset vs tf.data, the tfrecord package,
WebDataset and a plain map-style DataLoader, on the same samples.

Two workloads, each 8 shards written by TensorFlow's own ``tf.io.TFRecordWriter``
(foreign TFRecords, as a user brings them; recordkit reads the folder and infers
the schema), indexed with ``recordkit.build_index``, plus the same samples as
WebDataset tars:

- ``W1``: 8192 Examples of ``data`` = 256 KiB random bytes + ``label`` int64 (2 GiB);
- ``W2``: 1,000,000 Examples of ``data`` = 1 KiB + ``label`` + ``vec`` = 16 float32s.

``run`` reads one epoch per measurement, from a warm page cache, in batches of 64
into torch tensors (NumPy arrays for tf.data), each measurement in a fresh process,
readers alternating across repeats; medians. ``run --gil`` instead measures how
well each loader overlaps with a training step that is pure-Python work.

Usage::

    python benchmarks/read_bench.py generate [--data bench-data] [--quick]
    python benchmarks/read_bench.py run [--workloads W1,W2] [--readers ...] [--repeat 3] [--quick]
        [--batch 64]
    python benchmarks/read_bench.py run --gil [--gil-epochs N] [--accel F] [--quick]

``--quick`` uses its own data set of 1/8 the records (still 8 shards) and 1 repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tarfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _readers
from _common import median, run_child
from _readers import (
    QUICK_FRACTION,
    READERS,
    WORKER_READERS,
    WORKLOADS,
    Files,
    Workload,
    files_for,
)

GIL_READERS = ("recordkit", "tf.data", "dataloader-map")

# -- generate ----------------------------------------------------------------------------------


def _write_shard(wl: Workload, files: Files, shard: int) -> None:
    import numpy as np
    import tensorflow as tf

    tfr, tar = files.tfrecords(wl)[shard], files.tars(wl)[shard]
    if os.path.exists(tfr) and os.path.exists(tfr + ".idx") and os.path.exists(tar):
        return
    n, base = wl.per_shard, shard * wl.per_shard
    rng = np.random.default_rng([wl.records, wl.payload, wl.vec, shard])  # deterministic
    blob = rng.bytes(n * wl.payload)
    labels = rng.integers(0, 1000, size=n)
    vecs = rng.standard_normal((n, wl.vec), dtype=np.float32) if wl.vec else None
    with tf.io.TFRecordWriter(tfr + ".partial") as writer:
        for i in range(n):
            feature = {
                "data": tf.train.Feature(
                    bytes_list=tf.train.BytesList(
                        value=[blob[i * wl.payload : (i + 1) * wl.payload]]
                    )
                ),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])])),
            }
            if vecs is not None:
                feature["vec"] = tf.train.Feature(
                    float_list=tf.train.FloatList(value=vecs[i].tolist())
                )
            ex = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(ex.SerializeToString())
    os.replace(tfr + ".partial", tfr)

    import recordkit

    recordkit.build_index(tfr)

    def member(name: str, payload: bytes) -> tuple[tarfile.TarInfo, bytes]:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(payload), 0, 0o644
        return info, payload

    import io

    with tarfile.open(tar + ".partial", "w", format=tarfile.USTAR_FORMAT) as out:
        for i in range(n):
            key = f"s{base + i:08d}"
            parts = [
                member(f"{key}.bin", blob[i * wl.payload : (i + 1) * wl.payload]),
                member(f"{key}.cls", str(int(labels[i])).encode()),
            ]
            if vecs is not None:
                parts.append(member(f"{key}.f32", vecs[i].astype("<f4").tobytes()))
            for info, payload in parts:
                out.addfile(info, io.BytesIO(payload))
    os.replace(tar + ".partial", tar)


def _complete(wl: Workload, files: Files) -> bool:
    try:
        with open(os.path.join(files.root, "complete.json")) as f:
            return bool(json.load(f) == wl.spec())
    except (OSError, ValueError):
        return False


def generate(data: str, names: list[str], quick: bool) -> None:
    for name in names:
        wl = WORKLOADS[name].scaled(QUICK_FRACTION) if quick else WORKLOADS[name]
        files = files_for(data, wl, quick)
        if _complete(wl, files):
            print(f"{files.root}: complete, skipped", flush=True)
            continue
        os.makedirs(files.tfrecord_dir, exist_ok=True)
        os.makedirs(files.wds_dir, exist_ok=True)
        t0 = time.perf_counter()
        for shard in range(wl.shards):
            _write_shard(wl, files, shard)
            print(f"{files.root}: shard {shard + 1}/{wl.shards}", flush=True)
        with open(os.path.join(files.root, "complete.json"), "w") as f:
            json.dump(wl.spec(), f)
        print(
            f"{files.root}: {wl.records} records, {files.framed_bytes(wl) / 1e9:.2f} GB of "
            f"TFRecords, in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )


# -- children: one measurement each ------------------------------------------------------------


def _anon_rss() -> int:
    """Anonymous resident memory of this process, bytes (mapped file pages excluded)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) << 10
    return 0


def _cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (DataLoader workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child_epoch(reader: str, wl: Workload, files: Files) -> dict:
    batches = READERS[reader](wl, files)
    records, anon_10, tenth = 0, 0, max(1, wl.records // 10)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for n in batches:
        records += n
        if not anon_10 and records >= tenth:
            anon_10 = _anon_rss()
    elapsed = time.perf_counter() - t0
    anon_end = _anon_rss()
    del batches  # joins DataLoader workers, so their CPU time is counted
    cpu = _cpu_seconds() - cpu0
    return {
        "seconds": elapsed,
        "records": records,
        "cpu": cpu,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10,
        "anon_10": anon_10,
        "anon_end": anon_end,
    }


def _busy(n: int) -> int:
    """Pure-Python bytecode work (a stand-in for a Python-heavy training step)."""
    acc = 0
    for i in range(n):
        acc = (acc * 31 + i) % 1_000_003
    return acc


def _time_busy(n: int, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        _busy(n)
        best = min(best, time.perf_counter() - t)
    return best


def _first(batches: Iterator[int]) -> int:
    return next(batches)  # start-up (threads, workers, first batch) is left out of both passes


def child_gil(reader: str, wl: Workload, files: Files, limit: int, accel: float = 0.0) -> dict:
    """Overlap of a loader with a training step of about the unloaded batch time.

    The step is pure-Python work (GIL held, one core busy) for ``1 - accel`` of
    it and, for ``accel`` of it, a wait on a simulated accelerator (GIL released,
    no CPU), as a real step waits on its GPU kernels.
    """
    iters_per_s = 200_000 / _time_busy(200_000, runs=5)
    # 1. unloaded: the loader alone, for up to ``limit`` batches after the first.
    batches = READERS[reader](wl, files)
    _first(batches)
    steps, cpu0, t0 = 0, _cpu_seconds(), time.perf_counter()
    for _ in batches:
        steps += 1
        if steps == limit:
            break
    load = (time.perf_counter() - t0) / steps
    del batches
    cores = (_cpu_seconds() - cpu0) / (load * steps)
    # 2. under pressure: after each batch, pure-Python work calibrated to take ~load.
    python = load * (1.0 - accel)
    wait = load * accel
    iters = max(1, round(python * iters_per_s))
    for _ in range(3):  # refine: the first rate was taken on a cold interpreter
        busy = _time_busy(iters)
        iters = max(1, round(iters * python / busy))
    busy = _time_busy(iters)
    compute = busy + wait
    batches = READERS[reader](wl, files)
    _first(batches)
    steps, spent, t0 = 0, 0.0, time.perf_counter()
    while True:
        c = time.perf_counter()
        _busy(iters)
        if wait:
            time.sleep(wait)
        spent += time.perf_counter() - c
        if steps == limit or next(batches, None) is None:
            break
        steps += 1
    wall = time.perf_counter() - t0
    del batches
    ideal = steps * max(load, compute) + compute  # perfect overlap, neither slowed down
    cpus = os.cpu_count() or 1
    ceiling = max(load, compute) / max(load, compute, (cores * load + busy) / cpus)
    return {
        "load_ms": load * 1e3,
        "compute_ms": compute * 1e3,
        "compute_under_ms": spent / (steps + 1) * 1e3,
        "step_ms": wall / (steps + 1) * 1e3,
        "next_ms": (wall - spent) / (steps + 1) * 1e3,
        "efficiency": ideal / wall,
        "accel": accel,
        "cores": cores,
        "ceiling": ceiling,
    }


# -- parent ------------------------------------------------------------------------------------


def _warm(paths: list[str]) -> None:
    """Read files once so every reader starts from the same warm page cache."""
    buf = bytearray(16 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _warm_paths(reader: str, wl: Workload, files: Files) -> list[str]:
    if reader == "webdataset":
        return files.tars(wl)
    return [p for f in files.tfrecords(wl) for p in (f, f + ".idx")]


def _busy_ticks() -> int:
    """Busy CPU time of the whole machine so far, in clock ticks (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def _measure(args: argparse.Namespace, mode: str, reader: str, wl: Workload, files: Files) -> dict:
    """One measurement in a fresh process; ``other`` = cores used by other processes meanwhile."""
    _warm(_warm_paths(reader, wl, files))
    cmd = ["child", "--data", args.data, "--mode", mode, "--reader", reader, "--workloads", wl.name]
    cmd += ["--gil-batches", str(args.gil_batches), "--accel", str(args.accel)]
    cmd += ["--gil-epochs", str(args.gil_epochs), "--tf-loop", args.tf_loop]
    cmd += ["--batch", str(args.batch)]
    kids0, ticks0, t0 = _cpu_children(), _busy_ticks(), time.perf_counter()
    res = run_child(__file__, cmd + (["--quick"] if args.quick else []))
    wall = time.perf_counter() - t0
    busy = (_busy_ticks() - ticks0) / os.sysconf("SC_CLK_TCK")
    res["other"] = max(0.0, busy - (_cpu_children() - kids0)) / wall
    return res


def _cpu_children() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def run_epochs(args: argparse.Namespace, wl: Workload, files: Files, readers: list[str]) -> None:
    size = files.framed_bytes(wl)
    results: dict[str, list[dict]] = {r: [] for r in readers}
    for rep in range(args.repeat):
        k = rep % len(readers)  # rotate the order too, so no reader always runs first
        for reader in readers[k:] + readers[:k]:
            res = _measure(args, "epoch", reader, wl, files)
            if res["records"] != wl.records:
                raise RuntimeError(f"{reader} read {res['records']} records of {wl.records}")
            results[reader].append(res)
            print(
                f"{wl.name} {reader:15s} {res['records'] / res['seconds']:9.0f} rec/s "
                f"{size / res['seconds'] / 1e6:7.0f} MB/s  ({res['seconds']:.1f} s, "
                f"{res['cpu'] / res['seconds']:.1f} cores; "
                f"other processes {res['other']:.1f} cores)",
                flush=True,
            )
    secs = {r: median([x["seconds"] for x in v]) for r, v in results.items()}
    ref = secs.get("tf.data")
    print(
        f"\n**{wl.name}**: {wl.records:,} records, {size / 1e9:.2f} GB framed, one epoch "
        f"from page cache, batch {args.batch}, median of {args.repeat}; TensorFlow loop: "
        f"{args.tf_loop}\n"
    )
    print("| reader | records/s | MB/s | vs tf.data | cores | peak RSS | anon RSS @10% | @end |")
    print("|---|---|---|---|---|---|---|---|")
    for reader, v in results.items():
        s = secs[reader]
        mark = " †" if reader in WORKER_READERS else ""
        ratio = f"{ref / s:.2f}" if ref else "—"
        print(
            f"| {reader} | {wl.records / s:,.0f} | {size / s / 1e6:,.0f} | {ratio} "
            f"| {median([x['cpu'] / x['seconds'] for x in v]):.1f} "
            f"| {_mb(int(median([x['peak_rss'] for x in v])))}{mark} "
            f"| {_mb(int(median([x['anon_10'] for x in v])))}{mark} "
            f"| {_mb(int(median([x['anon_end'] for x in v])))}{mark} |"
        )
    print(
        "\nMB/s = framed TFRecord bytes / epoch seconds (the same numerator for every reader). "
        "cores = CPU seconds (process + DataLoader workers) / wall seconds. "
        "† main process only (decoding happens in DataLoader worker processes)."
    )
    _print_noise(results)


def run_gil(args: argparse.Namespace, wl: Workload, files: Files, readers: list[str]) -> None:
    results: dict[str, list[dict]] = {r: [] for r in readers}
    for rep in range(args.repeat):
        k = rep % len(readers)
        for reader in readers[k:] + readers[:k]:
            res = _measure(args, "gil", reader, wl, files)
            results[reader].append(res)
            print(
                f"{wl.name} {reader:15s} load {res['load_ms']:.2f} ms, compute "
                f"{res['compute_ms']:.2f} ms ({res['compute_under_ms']:.2f} under load), step "
                f"{res['step_ms']:.2f} ms: efficiency {res['efficiency']:.2f} "
                f"(CPU ceiling {res['ceiling']:.2f}; other processes {res['other']:.1f} cores)",
                flush=True,
            )
    print(
        f"\n**{wl.name} under GIL pressure**: after each batch, pure-Python work taking about "
        f"as long as the unloaded batch; up to {args.gil_batches} batches a pass "
        f"({args.gil_epochs} epoch(s) of one dataset object); median of {args.repeat}\n"
    )
    print(
        "| reader | load ms/batch | compute ms | under load: compute ms | in next() ms | step ms "
        "| efficiency | CPU ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for reader, v in results.items():
        m = {k: median([x[k] for x in v]) for k in v[0]}
        print(
            f"| {reader} | {m['load_ms']:.2f} | {m['compute_ms']:.2f} "
            f"| {m['compute_under_ms']:.2f} | {m['next_ms']:.2f} | {m['step_ms']:.2f} "
            f"| **{m['efficiency']:.2f}** | {m['ceiling']:.2f} |"
        )
    print(
        "\nefficiency = max(load, compute) / step: 1.0 = loading fully hidden behind the "
        "Python step (step time = max(load, compute)); 0.5 = no overlap (load + compute). "
        "CPU ceiling = the best efficiency the cores allow, given the cores the loader used "
        "unloaded."
    )
    _print_noise(results)


def _print_noise(results: dict[str, list[dict]]) -> None:
    worst = max(x["other"] for v in results.values() for x in v)
    print(
        f"Other processes on this machine used up to {worst:.1f} of {os.cpu_count()} cores "
        "during a measurement" + (" (numbers above are disturbed)." if worst > 0.2 else ".")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("generate", "run", "child"))
    ap.add_argument("--data", default="bench-data")
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--readers", default=None, help=f"comma-separated, of {', '.join(READERS)}")
    ap.add_argument("--repeat", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1/8 of the data, 1 repeat")
    ap.add_argument("--gil", action="store_true", help="the GIL-pressure run")
    ap.add_argument(
        "--gil-batches",
        type=int,
        default=4000,
        help="batches per pass in the GIL run (W2 has 15625)",
    )
    ap.add_argument(
        "--gil-epochs",
        type=int,
        default=1,
        help="GIL run: epochs per pass, iterating one dataset object as a training loop "
        "does (the first epoch maps the shards; later ones reuse the maps)",
    )
    ap.add_argument(
        "--accel",
        type=float,
        default=0.0,
        help="GIL run: the fraction of each step spent waiting on a simulated accelerator "
        "(GIL released, no CPU); the rest is pure Python (default 0: all Python)",
    )
    ap.add_argument(
        "--tf-loop",
        choices=("eager", "numpy", "graph"),
        default="eager",
        help="how TensorFlow readers' batches are taken: a Python loop over the tensors (the "
        "default), the same with .numpy() of each (a copy in TensorFlow 2.21), or a "
        "tf.function taking 64 per call (Keras fit's steps_per_execution)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=_readers.BATCH,
        help=f"records per batch, every reader (default {_readers.BATCH}); TensorFlow's cost "
        "is per element, so larger batches close its gap on small records",
    )
    ap.add_argument("--mode", choices=("epoch", "gil"), help=argparse.SUPPRESS)
    ap.add_argument("--reader", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = args.workloads.split(",")
    for name in names:
        if name not in WORKLOADS:
            ap.error(f"unknown workload {name!r}; have {', '.join(WORKLOADS)}")
    if args.command == "generate":
        generate(args.data, names, args.quick)
        return
    scale = QUICK_FRACTION if args.quick else 1
    workloads = [WORKLOADS[n].scaled(scale) for n in names]
    if args.batch < 1:
        ap.error("--batch must be at least 1")
    _readers.BATCH = args.batch
    if args.command == "child":
        _readers.TF_LOOP = args.tf_loop
        wl = workloads[0]
        files = files_for(args.data, wl, args.quick)
        if args.mode == "gil":
            _readers.EPOCHS = args.gil_epochs
            print(json.dumps(child_gil(args.reader, wl, files, args.gil_batches, args.accel)))
        else:
            print(json.dumps(child_epoch(args.reader, wl, files)))
        return
    readers = (
        args.readers.split(",") if args.readers else list(GIL_READERS if args.gil else READERS)
    )
    for r in readers:
        if r not in READERS:
            ap.error(f"unknown reader {r!r}; have {', '.join(READERS)}")
    args.repeat = args.repeat or (1 if args.quick else 3)
    for wl in workloads:
        files = files_for(args.data, wl, args.quick)
        if not _complete(wl, files):
            sys.exit(f"{files.root} is missing or incomplete: run `read_bench.py generate` first")
        (run_gil if args.gil else run_epochs)(args, wl, files, readers)
        print(flush=True)


if __name__ == "__main__":
    main()
