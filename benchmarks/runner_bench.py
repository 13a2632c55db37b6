"""The native decoder alone: ``Runner`` tasks and ``parse_batch`` on small records.

No shards, no threads of the reader, no torch: ``--records`` records of a 1 KiB bytes
value, an int64 label and 16 float32s, framed into one in-memory buffer, decoded

- ``seq``: by ``BatchDecoder.runner()`` tasks of ``--task`` records in file order;
- ``shuf``: the same in a shuffled order (each record a cache miss);
- ``parse``: by ``parse_batch`` calls of 64 records (framing, CRCs, spans; no copies).

Rates are records per **CPU second** of the process (``time.process_time``), medians of
``--repeat``: on a loaded machine CPU time is steadier than wall time. For changes to
the C code, compare two checkouts alternately (``PYTHONPATH=<checkout> python
benchmarks/runner_bench.py``), or count instructions, which no load disturbs::

    valgrind --tool=callgrind --toggle-collect=run_job --toggle-collect=parse_reads \\
        python benchmarks/runner_bench.py --records 8192 --repeat 1

(``run_job`` is a runner task's decoding, ``parse_reads`` a ``parse_batch`` call's.)
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from recordkit.codec import Bytes, Float32, Int64, Schema
from recordkit.format import frame
from recordkit.reader import decode
from recordkit.reader.decode import BatchDecoder

SCHEMA = Schema({"data": Bytes(), "label": Int64(), "vec": Float32(shape=(16,))})


def _shard(n: int) -> tuple[bytearray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    framed = [
        frame(
            SCHEMA.encode(
                {"data": rng.bytes(1024), "label": i, "vec": rng.standard_normal(16, np.float32)}
            )
        )
        for i in range(n)
    ]
    sizes = np.array([len(f) for f in framed], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return bytearray(b"".join(framed)), offsets, sizes


def _tasks(dec: BatchDecoder, buf: bytearray, offsets, sizes, order, task: int) -> float:
    runner = dec.runner()
    worker = threading.Thread(target=runner.work)
    worker.start()
    t0 = time.process_time()
    try:
        for lo in range(0, len(order), task):
            idx = order[lo : lo + task]
            rec = np.zeros((len(idx), 3), np.int64)
            rec[:, 1], rec[:, 2] = offsets[idx], sizes[idx]
            outs = dec.runner_outputs(len(idx), [1024], np.empty)
            ok, _, _ = runner.wait(runner.submit((buf,), rec, outs))
            assert ok, "a task left the fast path"
        return len(order) / (time.process_time() - t0)
    finally:
        runner.close()
        runner.drop()
        worker.join()


def _parse(dec: BatchDecoder, buf: bytearray, offsets, sizes) -> float:
    t0 = time.process_time()
    for lo in range(0, len(offsets), 64):
        decode._impl.parse_batch(
            buf, offsets[lo : lo + 64], sizes[lo : lo + 64], dec._keys, True, 1 << 31, dec._expect
        )
    return len(offsets) / (time.process_time() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=60000)
    ap.add_argument("--task", type=int, default=4096, help="records per runner task")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if decode.IMPLEMENTATION != "native":
        raise SystemExit("recordkit.native._ext is not built: nothing to measure")
    buf, offsets, sizes = _shard(args.records)
    dec = BatchDecoder(SCHEMA)
    seq = np.arange(args.records)
    shuf = np.random.default_rng(1).permutation(args.records)
    rates: dict[str, list[float]] = {"seq": [], "shuf": [], "parse": []}
    for _ in range(args.repeat):
        rates["seq"].append(_tasks(dec, buf, offsets, sizes, seq, args.task))
        rates["shuf"].append(_tasks(dec, buf, offsets, sizes, shuf, args.task))
        rates["parse"].append(_parse(dec, buf, offsets, sizes))
    print(f"records per CPU second (median of {args.repeat}):")
    for name, values in rates.items():
        print(f"  {name:6} {statistics.median(values):12,.0f}")


if __name__ == "__main__":
    main()
