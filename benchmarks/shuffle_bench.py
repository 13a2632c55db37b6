"""How well ``shuffle=True`` mixes label-sorted data, and what the order costs.

Statistics of the epoch order on sorted data, per rank stream, against a uniform
permutation (``recordkit.reader.order.mixing``: distinct labels per batch, their
1st percentile, and the label dispersion D(M) — the chi-square of a batch's label
counts against the global proportions over classes - 1; uniform gives 1.0):

- ``sorted``: 100,000 records sorted by label (10 classes, 11 shards), batch 64, at
  world size 1 and for each rank's stream at world size 8 (the worst rank shown);
- ``billion``: 1e9 records in 1e5 shards (10 classes, sorted), computed from the plan
  alone: D(64), D(6400), distinct shards per batch of 64, the plan's memory and the
  cost of ordering a position;
- ``images``: 5 classes x 600 records written class by class (as ``--from
  imagefolder`` would without its interleave), read through ``RecordDataset``, batch 32.
- ``remote``: the plan of whole epochs through a shard cache smaller than the
  dataset (shard windows: ``PlanOptions.shard_window_bytes``): 100,000 sorted
  records (10 classes) in 100 shards, a cache budget of 1/2 .. 1/20 of the
  dataset (windows of half that), at world size 1 and 8 (worst rank), batch 64;
  D(64) and D(6400), distinct labels per batch.

Run it against another checkout (``PYTHONPATH=/path/to/other/checkout``) to compare
orders; the epoch-time comparison is ``read_bench.py --readers recordkit-shuffle``.

    python benchmarks/shuffle_bench.py [--parts sorted,billion,images,remote] [--seeds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import tempfile
import time
import tracemalloc

import numpy as np

import recordkit as rk
from recordkit.reader.plan import EpochPlan, PlanOptions, Split

# The metric comes from this checkout's recordkit/reader/order.py, loaded by path, so
# that the orders of another checkout (PYTHONPATH=...) are measured the same way.
_spec = importlib.util.spec_from_file_location(
    "_order", os.path.join(os.path.dirname(__file__), "..", "recordkit", "reader", "order.py")
)
assert _spec is not None and _spec.loader is not None
_order = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_order)
mixing = _order.mixing


def _stream(plan: EpochPlan, counts: np.ndarray, rank: int, world: int) -> np.ndarray:
    """The global record numbers (dataset order) one rank reads, in order."""
    split = Split(rank, world)
    positions, _ = plan.unit_positions(split, list(plan.units(split)))
    shards, records = plan.resolve(positions)
    return np.concatenate(([0], np.cumsum(counts)))[shards] + records


def _row(name: str, m: dict[str, float]) -> str:
    return f"  {name:<34} {m['distinct']:>8.2f} {m['distinct_p1']:>6.1f} {m['dispersion']:>8.3f}"


def sorted_part(seeds: int) -> None:
    n, classes, batch = 100_000, 10, 64
    counts = np.full(11, n // 11)
    counts[-1] += n - counts.sum()
    print(f"sorted: {n:,} records, {classes} classes in order, 11 shards, batch {batch}")
    print(f"  {'order':<34} {'labels':>8} {'p1':>6} {'D(64)':>8}")
    rng = np.random.default_rng(0)
    print(_row("uniform permutation", mixing(rng.permutation(n) * classes // n, batch, classes)))
    for world in (1, 8):
        worst: dict[str, float] | None = None
        for seed in range(seeds):
            for rank in range(world):
                plan = EpochPlan(counts, PlanOptions(shuffle=True, seed=seed, batch_size=batch), 0)
                m = mixing(_stream(plan, counts, rank, world) * classes // n, batch, classes)
                if worst is None or m["distinct"] < worst["distinct"]:
                    worst = m
        assert worst is not None
        print(_row(f"recordkit, world {world} (worst rank/seed)", worst))


def billion_part() -> None:
    n, shards, classes, batch = 10**9, 10**5, 10, 64
    counts = np.full(shards, n // shards)
    tracemalloc.start()
    t0 = time.perf_counter()
    plan = EpochPlan(counts, PlanOptions(shuffle=True, seed=0, batch_size=batch), 0)
    made = time.perf_counter() - t0
    sample = 64 * 100 * 40  # 40 runs of 100 batches, spread over the epoch
    starts = np.linspace(0, n - 6400, 40, dtype=np.int64)
    positions = (starts[:, None] + np.arange(6400)).reshape(-1)
    t0 = time.perf_counter()
    records = plan.order(positions)
    per = (time.perf_counter() - t0) / sample
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    labels = records * classes // n
    shard_of = records // (n // shards)
    per_batch = shard_of.reshape(-1, batch)
    distinct_shards = np.mean([len(np.unique(b)) for b in per_batch])
    d64 = mixing(labels, batch, classes)
    d6400 = mixing(labels, 6400, classes)["dispersion"]
    print(f"billion: {n:.0e} records in {shards:.0e} shards, {classes} classes in order")
    print(f"  plan: made in {made * 1e3:.1f} ms, peak {peak / 2**20:.1f} MiB (tracemalloc),")
    print(f"        block {plan.block_records} records, {plan.windows:,} windows,")
    print(f"        ordering costs {per * 1e9:.0f} ns per position")
    print(f"  distinct labels per 64: {d64['distinct']:.2f} (p1 {d64['distinct_p1']:.0f})")
    print(f"  D(64) {d64['dispersion']:.3f}   D(6400) {d6400:.3f}")
    print(f"  distinct shards per batch of 64: {distinct_shards:.1f}")


def remote_part(seeds: int) -> None:
    n, shards, classes, batch = 100_000, 100, 10, 64
    counts = np.full(shards, n // shards)
    sizes = np.full(shards, 1 << 20)  # 1 MiB shards: the budget fractions below are exact
    print(f"remote: {n:,} records, {classes} classes in order, {shards} shards, batch {batch}")
    print(f"  {'budget (of the dataset)':<34} {'labels':>8} {'p1':>6} {'D(64)':>8} {'D(6400)':>8}")
    rng = np.random.default_rng(0)
    uniform = rng.permutation(n) * classes // n
    m = mixing(uniform, batch, classes)
    print(_row("uniform permutation", m) + f" {mixing(uniform, 6400, classes)['dispersion']:>8.3f}")
    for fraction in (1, 2, 4, 10, 20):
        window = 0 if fraction == 1 else int(sizes.sum()) // fraction // 2
        for world in (1, 8):
            worst: dict[str, float] | None = None
            d6400 = 0.0
            for seed in range(seeds):
                opts = PlanOptions(
                    shuffle=True, seed=seed, batch_size=batch, shard_window_bytes=window
                )
                plan = EpochPlan(counts, opts, 0, shard_bytes=sizes)
                for rank in range(world):
                    labels = _stream(plan, counts, rank, world) * classes // n
                    got = mixing(labels, batch, classes)
                    if worst is None or got["distinct"] < worst["distinct"]:
                        worst = got
                    d6400 = max(d6400, mixing(labels, 6400, classes)["dispersion"])
            assert worst is not None
            name = (
                "all (the local order)"
                if fraction == 1
                else f"1/{fraction}: windows of {100 // fraction // 2} shards"
            )
            print(_row(f"{name}, world {world}", worst) + f" {d6400:>8.3f}")


def images_part(seeds: int) -> None:
    import recordkit.torch as rkt

    classes, per, batch = 5, 600, 32
    with tempfile.TemporaryDirectory() as tmp:
        schema = rk.Schema(image=rk.Bytes(), label=rk.Int64())
        with rk.Writer(tmp + "/ds", schema, shard_size="2MiB") as w:
            for label in range(classes):
                for i in range(per):
                    w.write({"image": bytes(600 + i % 50), "label": label})
        print(f"images: {classes} classes x {per} records written class by class, batch {batch}")
        for seed in range(seeds):
            ds = rkt.RecordDataset(tmp + "/ds", batch_size=batch, shuffle=True, seed=seed)
            labels = np.concatenate([b["label"].numpy() for b in ds])
            m = mixing(labels, batch, classes)
            print(_row(f"recordkit, seed {seed}", m))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="sorted,billion,images,remote")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    parts = args.parts.split(",")
    for part in parts:
        if part not in ("sorted", "billion", "images", "remote"):
            ap.error(f"unknown part {part!r}")
    print(f"recordkit from {os.path.dirname(rk.__file__)}")
    if "sorted" in parts:
        sorted_part(args.seeds)
    if "billion" in parts:
        billion_part()
    if "images" in parts:
        images_part(args.seeds)
    if "remote" in parts:
        remote_part(args.seeds)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
