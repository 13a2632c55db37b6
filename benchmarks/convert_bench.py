"""Conversion throughput vs writer processes (1, 2): a CPU-bound and an I/O-bound source.

- **cpu**: NumPy ``.npz`` files of float32 rows converted with ``compress="zstd"``:
  the time goes to compressing, framing and CRCs, so more writer processes
  should scale with the cores.
- **s3**: an image folder of incompressible files on an S3 server (moto, started
  here on 127.0.0.1) converted to local disk: each image is one GET, so the
  time goes to waiting on the server.

Each measurement converts into a fresh directory; configurations alternate and the
median of ``--repeat`` runs is reported, with the share of the machine that other
processes used meanwhile (from /proc/stat, minus this process and its children).

Usage::

    python benchmarks/convert_bench.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _common import median


def _busy_ticks() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def _own_cpu() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def make_cpu_source(root: str, mib: int) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    rows_per_file = 1024  # 16 KiB rows: 16 MiB per file
    for i in range(mib // 16):
        # Quantised noise: compresses about 3:1, so zstd does real work on every row.
        x = (np.round(rng.standard_normal((rows_per_file, 64, 64)) * 4) / 4).astype(np.float32)
        np.savez(os.path.join(root, f"part{i:03d}.npz"), x=x, y=np.arange(rows_per_file))


def make_image_folder(root: str, files: int, size: int) -> None:
    rng = os.urandom
    for i in range(files):
        d = os.path.join(root, f"class{i % 4}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{i:06d}.jpg"), "wb") as f:
            f.write(
                b"\xff\xd8\xff\xe0" + rng(size - 4)
            )  # a JPEG signature: the converter checks it


def measure(convert_kwargs: dict) -> dict:
    import recordkit as rk

    out = tempfile.mkdtemp(prefix="convert-bench-out-")
    try:
        cpu0, ticks0, t0 = _own_cpu(), _busy_ticks(), time.perf_counter()
        result = rk.convert(dst=out, overwrite=True, **convert_kwargs)
        wall = time.perf_counter() - t0
        busy = (_busy_ticks() - ticks0) / os.sysconf("SC_CLK_TCK")
        own = _own_cpu() - cpu0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "seconds": wall,
        "mb_s": result.size / wall / 1e6,
        "cores": own / wall,
        "other": max(0.0, busy - own) / wall,
        "records": result.records,
    }


def run_case(name: str, kwargs: dict, repeat: int) -> dict[int, list[dict]]:
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(repeat):
        for workers in (1, 2):
            res = measure({**kwargs, "workers": workers})
            runs[workers].append(res)
            print(
                f"  {name} workers={workers}: {res['seconds']:.2f} s, {res['mb_s']:.1f} MB/s, "
                f"{res['cores']:.2f} cores, other processes {res['other']:.2f} cores",
                flush=True,
            )
    return runs


def report(name: str, runs: dict[int, list[dict]]) -> None:
    one = median([r["mb_s"] for r in runs[1]])
    two = median([r["mb_s"] for r in runs[2]])
    print(f"{name}: 1 worker {one:.1f} MB/s, 2 workers {two:.1f} MB/s -> {two / one:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-mib", type=int, default=256, help="size of the CPU-bound source (MiB)")
    ap.add_argument("--s3-files", type=int, default=1500, help="images in the S3 source")
    ap.add_argument("--s3-file-size", type=int, default=64 << 10)
    ap.add_argument("--cases", default="cpu,s3")
    args = ap.parse_args()
    cases = args.cases.split(",")
    work = tempfile.mkdtemp(prefix="convert-bench-")
    results = {}
    try:
        if "cpu" in cases:
            src = os.path.join(work, "npz")
            make_cpu_source(src, args.cpu_mib)
            kwargs = dict(src=src, format="numpy", compress="zstd", shard_size="16MiB")
            results["cpu (numpy + zstd, local disk)"] = run_case("cpu", kwargs, args.repeat)
        if "s3" in cases:
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
            from tests.servers import s3_server

            src = os.path.join(work, "images")
            make_image_folder(src, args.s3_files, args.s3_file_size)
            with s3_server() as s3:
                bucket = s3.bucket()
                s3.filesystem().put(src + "/", f"{bucket}/images/", recursive=True)
                kwargs = dict(
                    src=f"{bucket}/images",
                    format="imagefolder",
                    shard_size="16MiB",
                    storage_options=s3.storage_options,
                    dst_storage_options={},
                )
                results["s3 (imagefolder from moto S3)"] = run_case("s3", kwargs, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    for name, runs in results.items():
        report(name, runs)
    worst = max(r["other"] for runs in results.values() for v in runs.values() for r in v)
    print(
        f"Other processes on this machine used up to {worst:.1f} of {os.cpu_count()} cores "
        "during a measurement" + (" (numbers above are disturbed)." if worst > 0.2 else ".")
    )


if __name__ == "__main__":
    main()
