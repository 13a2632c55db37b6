"""Write throughput: recordkit.Writer vs tf.io.TFRecordWriter on the same Examples.

Writes ``--total`` bytes of Examples, each a ``--record``-sized random ``bytes``
feature plus an ``int64`` label, into 256 MiB shards, from buffers already in
memory. Each implementation runs in its own fresh process, ``--repeat`` times,
alternating; the median is reported. Targets:

- ``tmpfs``  (/dev/shm): the CPU cost of framing, encoding and writing;
- ``disk``   (--dir): through the page cache, without fsync, as TF writes;
- ``disk+fsync``: recordkit's default (each shard fsync'ed before it is published)
  against TF followed by an fsync of its files, the same durability.

Usage::

    python benchmarks/write_bench.py --total 2GiB --record 256KiB --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import median, run_child

POOL = 64  # distinct random records, cycled: "from memory" without 2 GiB of RAM per process


def child(impl: str, out: str, total: int, record: int, fsync: bool) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    pool = [rng.bytes(record) for _ in range(POOL)]
    n = total // record
    shard_bytes = 256 << 20
    os.makedirs(out, exist_ok=True)
    if impl == "recordkit":
        import recordkit as rk

        schema = rk.Schema(data=rk.Bytes(), label=rk.Int64())
        t0 = time.perf_counter()
        with rk.Writer(out, schema, shard_size=shard_bytes, fsync=fsync, overwrite=True) as w:
            for i in range(n):
                w.write({"data": pool[i % POOL], "label": i})
        elapsed = time.perf_counter() - t0
        written = w.manifest.bytes
    else:
        import tensorflow as tf

        t0 = time.perf_counter()
        written, shard, size, writer, files = 0, 0, 0, None, []
        for i in range(n):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "data": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[pool[i % POOL]])
                        ),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    }
                )
            ).SerializeToString()
            if writer is None or size + len(ex) + 16 > shard_bytes:
                if writer is not None:
                    writer.close()
                files.append(os.path.join(out, f"tf-{shard:05d}.tfrecord"))
                writer = tf.io.TFRecordWriter(files[-1])
                shard, size = shard + 1, 0
            writer.write(ex)
            size += len(ex) + 16
            written += len(ex) + 16
        writer.close()
        if fsync:  # the durability recordkit gives by default
            for f in files:
                fd = os.open(f, os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
        elapsed = time.perf_counter() - t0
    return {"impl": impl, "seconds": elapsed, "bytes": written, "records": n}


def main() -> None:
    from recordkit._units import format_size, parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", default="2GiB")
    ap.add_argument("--record", default="256KiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--dir", default=None, help="on-disk target directory (default: a temp dir in .)"
    )
    ap.add_argument("--targets", default="tmpfs,disk,disk+fsync")
    ap.add_argument(
        "--child", nargs=4, metavar=("IMPL", "OUT", "FSYNC", "_"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    total, record = parse_size(args.total), parse_size(args.record)
    if args.child:
        impl, out, fsync, _ = args.child
        print(json.dumps(child(impl, out, total, record, fsync == "1")))
        return
    base_disk = args.dir or tempfile.mkdtemp(prefix="rk-writebench-", dir=".")
    rows = []
    for target in args.targets.split(","):
        root = tempfile.mkdtemp(prefix="rk-wb-", dir="/dev/shm") if target == "tmpfs" else base_disk
        fsync = "1" if target == "disk+fsync" else "0"
        times: dict[str, list[float]] = {"recordkit": [], "tf": []}
        size = 0
        for _ in range(args.repeat):
            for impl in ("recordkit", "tf"):
                out = os.path.join(root, impl)
                shutil.rmtree(out, ignore_errors=True)
                os.sync()
                res = run_child(
                    __file__,
                    [
                        "--total",
                        args.total,
                        "--record",
                        args.record,
                        "--child",
                        impl,
                        out,
                        fsync,
                        "x",
                    ],
                )
                times[impl].append(res["seconds"])
                size = res["bytes"]
                shutil.rmtree(out, ignore_errors=True)
        if target == "tmpfs":
            shutil.rmtree(root, ignore_errors=True)
        rk_s, tf_s = median(times["recordkit"]), median(times["tf"])
        rows.append((target, size / rk_s / 1e6, size / tf_s / 1e6, tf_s / rk_s))
        print(
            f"{target:11s} recordkit {size / rk_s / 1e6:7.0f} MB/s   tf.io.TFRecordWriter "
            f"{size / tf_s / 1e6:7.0f} MB/s   ratio {tf_s / rk_s:.2f}x",
            flush=True,
        )
    if not args.dir:
        shutil.rmtree(base_disk, ignore_errors=True)
    print(f"\n{format_size(total)} of {format_size(record)} records, median of {args.repeat}")
    print("| target | recordkit MB/s | tf.io.TFRecordWriter MB/s | recordkit / TF |")
    print("|---|---|---|---|")
    for target, a, b, r in rows:
        print(f"| {target} | {a:.0f} | {b:.0f} | {r:.2f} |")


if __name__ == "__main__":
    main()
