"""The CPU an epoch costs, shuffled and in order, across checkouts (issue 19's target).

One ``recordkit.torch.RecordDataset(folder, batch_size=64, shuffle=..., seed=0)`` per
process, as ``read_bench.py``'s ``recordkit`` and ``recordkit-shuffle`` readers: its
first epoch untimed (it maps the shards and loads the indexes), then ``--epochs``
epochs timed, each in process CPU seconds (all threads: ``getrusage``) and wall
seconds. Checkouts alternate within each round (``PYTHONPATH=<checkout>``), so a
busy machine slows them alike; medians over rounds and epochs are printed, with
each checkout's ratio to the first. CPU time is the measure: on a shared machine
wall time varies 2x, CPU time a few percent.

The folders are ``read_bench.py``'s (``python benchmarks/read_bench.py generate``):
``W1`` 8,192 records of 256 KiB, ``W2`` 1,000,000 of 1 KiB, page-cached.

Usage::

    python benchmarks/epoch_bench.py --checkouts prev=/path/a,new=. [--workloads W1,W2]
        [--data bench-data] [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def child(folder: str, shuffle: bool, epochs: int) -> None:
    import recordkit.torch as rkt

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    ds = rkt.RecordDataset(folder, batch_size=64, shuffle=shuffle, seed=0)

    def epoch() -> int:
        n = 0
        for batch in ds:
            labels = batch["label"]
            int(labels.sum())  # touch the batch
            n += int(labels.shape[0])
        return n

    epoch()
    for _ in range(epochs):
        c0, t0 = cpu(), time.perf_counter()
        n = epoch()
        print(json.dumps({"cpu": cpu() - c0, "wall": time.perf_counter() - t0, "records": n}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        return child(sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkouts", required=True, help="name=path,... (the first is the base)")
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--data", default="bench-data")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    checkouts = [tuple(c.split("=", 1)) for c in args.checkouts.split(",")]
    workloads = args.workloads.split(",")
    runs: dict[tuple[str, bool, str], list[dict]] = {}
    for _ in range(args.rounds):
        for wl in workloads:
            folder = os.path.join(args.data, wl, "tfrecord")
            for shuffle in (True, False):
                for name, path in checkouts:
                    env = dict(os.environ, PYTHONPATH=os.path.abspath(path))
                    out = subprocess.run(
                        [
                            sys.executable,
                            HERE,
                            "_child",
                            folder,
                            str(int(shuffle)),
                            str(args.epochs),
                        ],
                        capture_output=True,
                        text=True,
                        env=env,
                        check=True,
                    ).stdout
                    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
                    runs.setdefault((wl, shuffle, name), []).extend(rows)
    base = checkouts[0][0]
    print(
        "\n| workload | order | "
        + " | ".join(f"{n} CPU s (wall s)" for n, _ in checkouts)
        + " | "
        + " | ".join(f"{n} / {base}" for n, _ in checkouts[1:])
        + " |"
    )
    print("|---|---|" + "---|" * (2 * len(checkouts) - 1))
    for wl in workloads:
        for shuffle in (True, False):
            med = {}
            cells = []
            for name, _ in checkouts:
                rows = runs[wl, shuffle, name]
                med[name] = statistics.median(r["cpu"] for r in rows)
                wall = statistics.median(r["wall"] for r in rows)
                cells.append(f"{med[name]:.3f} ({wall:.3f})")
            ratios = [f"{med[n] / med[base]:.2f}x" for n, _ in checkouts[1:]]
            order = "shuffled" if shuffle else "in order"
            print(f"| {wl} | {order} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    sys.exit(main())
