"""Batch decoding speed: ``BatchDecoder`` (native and fallback) vs ``Schema.decode`` per record.

Two workloads, batches of 64 records, every payload CRC verified:

- ``big``: a 256 KiB bytes value and an int64 label (an image-like sample);
- ``small``: a 1 KiB bytes value, an int64 label and 16 float32s.

Columns, in µs per record (median of several runs over the whole shard):

- ``native``: ``BatchDecoder.decode`` with the C extension, writing into reused
  batch arrays (as the reader's buffer pool does);
- ``native+alloc``: the same with a fresh ``np.empty`` per batch array (the
  first-touch page faults included);
- ``fallback``: ``BatchDecoder.decode`` with the pure Python twins;
- ``Schema.decode``: ``read_record`` + ``Schema.decode`` per record (views, no
  batching: a lower bound for any per-record Python reader).

For ``big`` also GB/s of framed bytes through ``native`` on 1 thread and on
``--threads`` threads (each decoding its own batches: the GIL is released), and
with the payload CRC checked in a pass of its own before the copy (the default
for records of 16 KiB and more fuses the two: ``gather_verified``).
The shard lives in memory (``bytes``); it is ``--records`` records long so
that it does not fit in the CPU caches.

Run: ``python benchmarks/decode_bench.py [--records N] [--threads T]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from recordkit.codec import Bytes, Float32, Int64, Schema
from recordkit.format import frame, read_record
from recordkit.reader import _contract, _fallback, decode
from recordkit.reader.decode import BatchDecoder

BATCH = 64


def _shard(schema: Schema, records: int, size: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    framed = []
    for i in range(records):
        sample: dict[str, Any] = {"image": rng.bytes(size), "label": i}
        if "embedding" in schema:
            sample["embedding"] = rng.standard_normal(16).astype(np.float32)
        framed.append(frame(schema.encode(sample)))
    sizes = np.array([len(f) for f in framed], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return b"".join(framed), offsets, sizes


class _Reuse:
    """Hands out the same arrays batch after batch (what recordkit's BufferPool does)."""

    def __init__(self) -> None:
        self.arrays: dict[tuple[Any, ...], np.ndarray] = {}

    def __call__(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        key = (shape, np.dtype(dtype).str)
        arr = self.arrays.get(key)
        if arr is None:
            arr = self.arrays[key] = np.empty(shape, dtype)
        return arr


def _median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm up (and touch the reused buffers)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _batched(dec: BatchDecoder, buf: bytes, offsets: np.ndarray, sizes: np.ndarray, alloc: Any):
    bounds = range(0, len(offsets), BATCH)

    def run() -> None:
        for lo in bounds:
            batch = dec.decode(buf, offsets[lo : lo + BATCH], sizes[lo : lo + BATCH], alloc)
            assert not batch.bad

    return run


def _per_record(schema: Schema, buf: bytes, offsets: np.ndarray, sizes: np.ndarray):
    pairs = list(zip(offsets.tolist(), sizes.tolist()))

    def run() -> None:
        for offset, size in pairs:
            schema.decode(read_record(buf, offset, expected_size=size))

    return run


def _threads_gbps(
    dec: BatchDecoder, buf: bytes, offsets: np.ndarray, sizes: np.ndarray, threads: int
) -> float:
    """Framed GB/s with ``threads`` threads, each decoding every batch of its own stripe."""
    starts = list(range(0, len(offsets), BATCH))
    stripes = [starts[t::threads] for t in range(threads)]
    allocs = [_Reuse() for _ in range(threads)]

    def work(t: int) -> None:
        for lo in stripes[t]:
            dec.decode(buf, offsets[lo : lo + BATCH], sizes[lo : lo + BATCH], allocs[t])

    def run() -> None:
        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()

    seconds = _median_seconds(run, 5)
    return float(sizes.sum()) / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=1024, help="records per workload")
    parser.add_argument("--threads", type=int, default=2, help="threads for the scaling row")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    workloads = {
        "big": (Schema(image=Bytes(), label=Int64()), 256 << 10, args.records),
        "small": (
            Schema(image=Bytes(), label=Int64(), embedding=Float32((16,))),
            1 << 10,
            args.records * 16,
        ),
    }
    native = decode._impl if decode.IMPLEMENTATION == "native" else None
    print(f"implementation: {decode.IMPLEMENTATION}; batch {BATCH}; µs per record")
    print(
        f"{'load':6} {'native':>9} {'native+alloc':>13} {'fallback':>9} {'Schema.decode':>14}"
        f" {'vs Schema.decode':>17}"
    )
    gbps = {}
    for name, (schema, size, records) in workloads.items():
        buf, offsets, sizes = _shard(schema, records, size)
        dec = BatchDecoder(schema)
        row = {}
        if native is not None:
            row["native"] = _median_seconds(
                _batched(dec, buf, offsets, sizes, _Reuse()), args.repeat
            )
            row["native+alloc"] = _median_seconds(
                _batched(dec, buf, offsets, sizes, None), args.repeat
            )
        decode._impl = _fallback
        try:
            row["fallback"] = _median_seconds(_batched(dec, buf, offsets, sizes, _Reuse()), 3)
        finally:
            decode._impl = native or _fallback
        row["Schema.decode"] = _median_seconds(_per_record(schema, buf, offsets, sizes), 3)
        us = {k: v / records * 1e6 for k, v in row.items()}
        best = us.get("native", us["fallback"])
        cells = [f"{us[k]:9.3f}" if k in us else f"{'-':>9}" for k in ("native", "native+alloc")]
        print(
            f"{name:6} {cells[0]} {cells[1]:>13} {us['fallback']:9.2f} {us['Schema.decode']:14.2f}"
            f" {us['Schema.decode'] / best:16.1f}x"
        )
        if name == "big":
            framed = float(sizes.sum())
            gbps = {k: framed / v / 1e9 for k, v in row.items()}
            if native is not None:
                fuse_min = _contract.FUSE_MIN_BYTES
                _contract.FUSE_MIN_BYTES = 1 << 62  # CRC pass, then a copy pass
                try:
                    unfused = _median_seconds(
                        _batched(dec, buf, offsets, sizes, _Reuse()), args.repeat
                    )
                finally:
                    _contract.FUSE_MIN_BYTES = fuse_min
                gbps["native, CRC then copy"] = framed / unfused / 1e9
                gbps[f"native, {args.threads} threads"] = _threads_gbps(
                    dec, buf, offsets, sizes, args.threads
                )
    print("\nbig: GB/s of framed records (CRC-verified, copied into the batch array)")
    for k, v in gbps.items():
        print(f"  {k:22} {v:7.2f}")


if __name__ == "__main__":
    main()
