"""What a pass's end costs in TensorFlow: dropping a ``tf.data`` iterator, autotuning on vs off.

Keras ``fit`` (and any ``for batch in ds`` loop over epochs) makes an iterator per
epoch and drops it at the epoch's end. With ``tf.data``'s autotuning on, dropping it
waits for the autotuner's model thread to wake (it wakes 10 ms after the iterator's
start, then at doubling intervals), which is why every ``recordkit.tf`` dataset turns
autotuning off (``recordkit/tf/pipes.py``, ``no_model_thread``).

Two pipelines, each in a fresh process per setting, ``--passes`` passes each:

- ``tf.data``: ``Dataset.range(--elements).map(fill, AUTOTUNE).map(compute, AUTOTUNE)
  .prefetch(AUTOTUNE)``, no recordkit at all;
- ``recordkit.tf``: ``recordkit.tf.dataset(folder, batch_size=64)`` over a generated
  folder (``--records`` of 64 KiB), its options set back to autotuning on for "on".

The defaults make passes of about 0.3 s here, as a W1 epoch: how long a drop waits
depends on where the pass ends between the model thread's wake-ups.

Per pass: the loop's seconds and the seconds ``del iterator`` takes (the drop).
Printed: the median loop, and of the drops the median, the largest and how many took
over 20 ms.

Usage::

    python benchmarks/pass_end_bench.py [--passes 12] [--elements 1500] [--records 8192]
        [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from _common import median, run_child


def _pipeline(kind: str, folder: str, autotune: bool, elements: int) -> object:
    import tensorflow as tf

    if kind == "tf.data":
        auto = tf.data.AUTOTUNE
        ds = (
            tf.data.Dataset.range(elements)
            .map(lambda i: tf.fill([4096], i), num_parallel_calls=auto)
            .map(lambda x: tf.reduce_sum(tf.sin(tf.cast(tf.tile(x, [40]), tf.float32))), auto)
            .prefetch(auto)
        )
    else:
        import recordkit.tf as rktf

        ds = rktf.dataset(folder, batch_size=64)
    opts = tf.data.Options()
    opts.autotune.enabled = autotune
    return ds.with_options(opts)


def child(kind: str, folder: str, autotune: bool, passes: int, elements: int) -> dict:
    ds = _pipeline(kind, folder, autotune, elements)
    loops, drops = [], []
    for _ in range(passes):
        t0 = time.perf_counter()
        it = iter(ds)  # type: ignore[call-overload]
        for _batch in it:
            pass
        t1 = time.perf_counter()
        del it, _batch
        drops.append(time.perf_counter() - t1)
        loops.append(t1 - t0)
    return {"loops": loops, "drops": drops}


def _generate(folder: str, records: int) -> None:
    import numpy as np

    import recordkit as rk
    from recordkit import Bytes, Int64, Schema

    rng = np.random.default_rng(0)
    with rk.Writer(folder, Schema(data=Bytes(), label=Int64()), max_records=256) as w:
        for k in range(records):
            w.write({"data": rng.bytes(64 << 10), "label": k})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--elements", type=int, default=1500)
    ap.add_argument("--records", type=int, default=8192)
    ap.add_argument(
        "--data", default=None, help="where the folder is written (default: a temp dir)"
    )
    ap.add_argument(
        "--child", nargs=3, metavar=("KIND", "FOLDER", "AUTOTUNE"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        kind, folder, autotune = args.child
        print(json.dumps(child(kind, folder, autotune == "on", args.passes, args.elements)))
        return
    with tempfile.TemporaryDirectory(dir=args.data) as tmp:
        folder = os.path.join(tmp, "d")
        _generate(folder, args.records)
        print("| pipeline | autotuning | loop (median) | drop: median | largest | over 20 ms |")
        print("|---|---|---|---|---|---|")
        for kind in ("tf.data", "recordkit.tf"):
            for autotune in ("on", "off"):
                sizes = ["--passes", str(args.passes), "--elements", str(args.elements)]
                res = run_child(__file__, [*sizes, "--child", kind, folder, autotune])
                drops = res["drops"]
                slow = sum(d > 0.020 for d in drops)
                print(
                    f"| {kind} | {autotune} | {median(res['loops']) * 1e3:.0f} ms "
                    f"| {median(drops) * 1e3:.1f} ms | {max(drops) * 1e3:.0f} ms "
                    f"| {slow} of {len(drops)} |",
                    flush=True,
                )


if __name__ == "__main__":
    sys.exit(main())
