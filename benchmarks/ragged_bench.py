"""Ragged numbers and lists of bytes, read from TensorFlow and PyTorch.

``recordkit.tf``'s native path decodes ragged numbers (``Int64((None,))``,
``Float32((None, 4))``) and lists of bytes (``Bytes((None,))``, ``Bytes((2,))``) in C
into flat values and row lengths, then ``tf.RaggedTensor.from_row_lengths``; before
issue 33 these took ``parse_example`` record by record. Two generated datasets:

- ``numbers``: ``tokens`` 16 to 256 int64s below 30,000 (2-byte varints), ``boxes``
  0 to 20 rows of 4 float32s, ``label``;
- ``lists``: ``tags`` 0 to 5 byte strings of 8 to 32 bytes, ``pair`` 2 byte strings,
  ``label``.

Readers, each one epoch in a fresh process (page cache warm), batches of 64, a Python
loop over the batches touching each one's labels (as read_bench's eager loop):

- ``recordkit.tf``: ``recordkit.tf.dataset(path, batch_size=64)`` (the native path);
- ``recordkit.tf-parse``: the same with ``RECORDKIT_TF_NATIVE=0`` (what it did before:
  ``TFRecordDataset``, ``parse_example`` per record, ``ragged_batch``);
- ``tf.data``: hand-tuned TensorFlow: ``TFRecordDataset(files, num_parallel_reads=
  AUTOTUNE).batch(64).map(parse_example with RaggedFeature specs, AUTOTUNE)
  .prefetch(AUTOTUNE)``;
- ``recordkit``: ``recordkit.torch.RecordDataset(path, batch_size=64)`` (ragged numbers
  padded with their lengths, lists of bytes as lists).

Usage::

    python benchmarks/ragged_bench.py [--records 200000] [--repeat 3] [--data DIR]
        [--readers recordkit.tf,recordkit.tf-parse,tf.data,recordkit]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

from _common import median, run_child

READERS = ("recordkit.tf", "recordkit.tf-parse", "tf.data", "recordkit")
BATCH = 64


def _generate(root: str, records: int) -> None:
    import numpy as np

    import recordkit as rk
    from recordkit import Bytes, Float32, Int64, Schema

    rng = np.random.default_rng(0)
    numbers = Schema(tokens=Int64((None,)), boxes=Float32((None, 4)), label=Int64())
    with rk.Writer(os.path.join(root, "numbers"), numbers, shard_size="32MiB") as w:
        for i in range(records):
            w.write(
                {
                    "tokens": rng.integers(0, 30000, int(rng.integers(16, 257))),
                    "boxes": rng.random((int(rng.integers(0, 21)), 4), dtype=np.float32),
                    "label": i,
                }
            )
    lists = Schema(tags=Bytes((None,)), pair=Bytes((2,)), label=Int64())
    with rk.Writer(os.path.join(root, "lists"), lists, shard_size="32MiB") as w:
        for i in range(records):
            w.write(
                {
                    "tags": [
                        rng.bytes(int(rng.integers(8, 33))) for _ in range(rng.integers(0, 6))
                    ],
                    "pair": [b"k%d" % i, rng.bytes(16)],
                    "label": i,
                }
            )


def _hand_tuned(path: str, which: str) -> object:
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(path, "*.tfrecord")))
    if which == "numbers":
        spec = {
            "tokens": tf.io.RaggedFeature(tf.int64, row_splits_dtype=tf.int64),
            "boxes": tf.io.RaggedFeature(
                tf.float32,
                partitions=(tf.io.RaggedFeature.UniformRowLength(4),),
                row_splits_dtype=tf.int64,
            ),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }
    else:
        spec = {
            "tags": tf.io.RaggedFeature(tf.string, row_splits_dtype=tf.int64),
            "pair": tf.io.FixedLenFeature([2], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }
    auto = tf.data.AUTOTUNE
    return (
        tf.data.TFRecordDataset(files, num_parallel_reads=auto)
        .batch(BATCH)
        .map(lambda s: tf.io.parse_example(s, spec), num_parallel_calls=auto)
        .prefetch(auto)
    )


def child(reader: str, path: str, which: str) -> dict:
    for f in glob.glob(os.path.join(path, "*")):  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    records = 0
    if reader == "recordkit":
        from recordkit.torch import RecordDataset

        t0 = time.perf_counter()
        for batch in RecordDataset(path, batch_size=BATCH):
            batch["label"].sum()  # touch the batch, as the TensorFlow loop does
            records += len(batch["label"])
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "records": records}
    if reader == "recordkit.tf-parse":
        os.environ["RECORDKIT_TF_NATIVE"] = "0"
    if reader == "tf.data":
        ds = _hand_tuned(path, which)
    else:
        import recordkit.tf as rktf

        ds = rktf.dataset(path, batch_size=BATCH)
    t0 = time.perf_counter()
    for batch in ds:  # type: ignore[attr-defined]
        records += len(batch["label"].numpy())
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "records": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--data", default=None, help="where the datasets are written (default: temp)")
    ap.add_argument("--child", nargs=3, metavar=("READER", "PATH", "WHICH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    readers = args.readers.split(",")
    unknown = [r for r in readers if r not in READERS]
    if unknown:
        ap.error(f"unknown readers {unknown}; have {', '.join(READERS)}")
    with tempfile.TemporaryDirectory(dir=args.data) as tmp:
        root = os.path.join(args.data, f"ragged-{args.records}") if args.data else tmp
        if not os.path.exists(os.path.join(root, "lists", "recordkit.json")):
            _generate(root, args.records)
        print(f"batches of {BATCH}, one epoch per process, median of {args.repeat}")
        print("| dataset | reader | records/s | MB/s | vs tf.data |")
        print("|---|---|---|---|---|")
        for which in ("numbers", "lists"):
            path = os.path.join(root, which)
            size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "*.tfrecord")))
            rates: dict[str, float] = {}
            for reader in readers:
                runs = [
                    run_child(__file__, ["--child", reader, path, which])
                    for _ in range(args.repeat)
                ]
                assert all(r["records"] == args.records for r in runs), runs
                rates[reader] = args.records / median([r["seconds"] for r in runs])
            base = rates.get("tf.data")
            for reader in readers:
                rate = rates[reader]
                mb = rate * size / args.records / 1e6
                ratio = f"{rate / base:.2f}" if base else "-"
                print(f"| {which} | {reader} | {rate:,.0f} | {mb:,.0f} | {ratio} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
