"""Overlap of loading with compute: DevicePrefetcher, and threads vs processes under GIL pressure.

``overlap``: a loader whose batch costs ``load`` ms (GIL released, as I/O or a native
decoder) and a step of ``compute`` ms spent waiting on a simulated accelerator, with
and without :class:`recordkit.torch.DevicePrefetcher` on the CPU: step time vs
max(load, compute) and load + compute. Also a real loader that does its work in the
consuming thread (``RecordMapDataset`` through a ``DataLoader`` with no workers).

``modes``: one loader three ways, each in a fresh process, unloaded and under GIL
pressure (after each batch, pure-Python work as long as the threads mode's unloaded
batch; the step holds the GIL, as a Python-heavy training step does):

- ``threads``: ``RecordDataset(batch_size=64)``, reader threads in the training process;
- ``workers``: ``recordkit.torch.DataLoader(RecordDataset(...,
  options=ReadOptions(num_threads=1)), num_workers=2)``;
- ``process``: ``RecordDataset(batch_size=64, options=ReadOptions(reader_process=True))``,
  a loader process
  handing chunks over through shared memory.

``cuda`` (needs a GPU): raw batches of the ``big`` data set (64 records of 128 kB, 8 MiB
a batch) through ``DevicePrefetcher`` to the GPU, for the reader threads and the loader
process, with and without ``pin_memory``: load alone (host), a compute step calibrated
to the load time (``torch.cuda._sleep``, ``--compute`` times it), and the step with the
prefetcher against max(load, compute) (target <= 1.15x) and without it (the sum); the
H2D rate is raw batch bytes per step (target >= 300 MB/s).

Usage::

    python benchmarks/prefetch_bench.py overlap
    python benchmarks/prefetch_bench.py cuda [--compute 1.0] [--steps 40]
    python benchmarks/prefetch_bench.py modes [--data bench-data/prefetch] [--batches 400]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import median, run_child
from read_bench import _busy, _cpu_seconds, _time_busy

from recordkit.reader import ReadOptions

BATCH = 64
# Two page-cached data sets, generated here: big records (one 8 MiB batch is one
# native copy) and small ones (per-batch Python overhead dominates).
DATASETS = {
    "big": {"records": 4096, "payload": 128 << 10, "vec": 0},
    "small": {"records": 262_144, "payload": 1 << 10, "vec": 16},
}
MODES = ("threads", "workers", "process")


# -- overlap ---------------------------------------------------------------------------------


def _sleepy_loader(steps: int, load: float) -> Any:
    import torch

    class Loader:
        def __len__(self) -> int:
            return steps

        def __iter__(self) -> Any:
            for i in range(steps):
                time.sleep(load)  # reading / decoding with the GIL released
                yield {"x": torch.full((1024,), float(i))}

    return Loader()


def _time_steps(batches: Any, compute: float) -> float:
    it = iter(batches)
    next(it)  # start-up left out
    n, t0 = 0, time.perf_counter()
    for _ in it:
        time.sleep(compute)  # the step waits on the accelerator
        n += 1
    return (time.perf_counter() - t0) / n


def overlap(args: argparse.Namespace) -> None:
    import recordkit.torch as rkt

    print("| loader | load ms | compute ms | max | sum | step, plain | step, prefetched |")
    print("|---|---|---|---|---|---|---|")
    for load_ms, compute_ms in ((10, 10), (5, 15), (15, 5)):
        load, compute = load_ms / 1e3, compute_ms / 1e3
        plain = _time_steps(_sleepy_loader(args.steps + 1, load), compute)
        pf = rkt.DevicePrefetcher(_sleepy_loader(args.steps + 1, load), "cpu")
        pre = _time_steps(pf, compute)
        hi, total = max(load, compute), load + compute
        print(
            f"| sleep | {load_ms} | {compute_ms} | {hi * 1e3:.1f} | {total * 1e3:.1f} "
            f"| {plain * 1e3:.1f} ({plain / hi:.2f}x max) | {pre * 1e3:.1f} ({pre / hi:.2f}x max) |"
        )
    # A real loader working in the consuming thread: records decoded through the
    # native batch decoder in DataLoader's main process.
    root = _dataset(args.data, "big")
    import torch.utils.data as tud

    def loader() -> Any:
        ds = rkt.RecordMapDataset(root)
        return tud.DataLoader(ds, batch_size=BATCH, num_workers=0, collate_fn=_stack)

    load = _time_steps(loader(), 0.0)
    compute = load
    plain = _time_steps(loader(), compute)
    pre = _time_steps(rkt.DevicePrefetcher(loader(), "cpu"), compute)
    hi, total = max(load, compute), load + compute
    print(
        f"| RecordMapDataset, 0 workers | {load * 1e3:.1f} | {compute * 1e3:.1f} "
        f"| {hi * 1e3:.1f} | {total * 1e3:.1f} | {plain * 1e3:.1f} ({plain / hi:.2f}x max) "
        f"| {pre * 1e3:.1f} ({pre / hi:.2f}x max) |"
    )


def _stack(samples: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np
    import torch

    data = np.stack([np.frombuffer(s["data"], np.uint8) for s in samples])
    labels = torch.tensor([int(s["label"]) for s in samples])
    return {"data": torch.from_numpy(data), "label": labels}


# -- cuda --------------------------------------------------------------------------------------


def _cuda_loader(root: str, reader: str, pin: bool) -> Any:
    import recordkit.torch as rkt

    process = reader == "process"
    return rkt.RecordDataset(
        root, batch_size=BATCH, options=ReadOptions(pin_memory=pin, reader_process=process)
    )


def _cycles_per_ms() -> float:
    import torch

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / start.elapsed_time(end)


def _cuda_steps(batches: Any, cycles: int | None, steps: int) -> tuple[float, int]:
    """Seconds per step (the step ends when its kernels are done) and bytes per batch.

    ``cycles=None``: the host loop alone, no copy and no kernel (the load time).
    """
    import torch

    it = iter(batches)
    first = next(it)  # start-up left out
    nbytes = sum(t.numel() * t.element_size() for t in first.values() if torch.is_tensor(t))
    n, t0 = 0, time.perf_counter()
    for b in it:
        if cycles is None:
            n += 1
            if n == steps:
                break
            continue
        x = b["data"].to("cuda", non_blocking=True)  # a no-op when the prefetcher moved it
        torch.cuda._sleep(cycles)
        int(x[-1, -1])  # the step ends when the GPU is done with it
        n += 1
        if n == steps:
            break
    del it
    return (time.perf_counter() - t0) / n, nbytes


def cuda(args: argparse.Namespace) -> None:
    import torch

    import recordkit.torch as rkt

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (the CPU overlap is `overlap`)")
        return
    root = _dataset(args.data, "big")
    per_ms = _cycles_per_ms()
    print(f"{torch.cuda.get_device_name()}; batches of {BATCH} x 128 kB; {args.steps} steps\n")
    print(
        "| reader | pin_memory | load ms | compute ms | step ms, plain | step ms, prefetched "
        "| prefetched / max | H2D MB/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for reader in ("threads", "process"):
        for pin in (True, False):
            load, _ = _cuda_steps(_cuda_loader(root, reader, pin), None, args.steps)
            compute_ms = load * 1e3 * args.compute
            cycles = int(per_ms * compute_ms)
            plain, _ = _cuda_steps(_cuda_loader(root, reader, pin), cycles, args.steps)
            pf = rkt.DevicePrefetcher(_cuda_loader(root, reader, pin), "cuda")
            step, nbytes = _cuda_steps(pf, cycles, args.steps)
            pf.close()
            hi = max(load, compute_ms / 1e3)
            print(
                f"| {reader} | {pin} | {load * 1e3:.2f} | {compute_ms:.2f} | {plain * 1e3:.2f} "
                f"| {step * 1e3:.2f} | {step / hi:.2f} | {nbytes / step / 1e6:.0f} |"
            )


# -- data --------------------------------------------------------------------------------------


def _dataset(data: str, name: str) -> str:
    import numpy as np

    import recordkit as rk

    root = os.path.join(data, name)
    if os.path.exists(os.path.join(root, "recordkit.json")):
        return root
    spec = DATASETS[name]
    features: dict[str, Any] = {"data": rk.Bytes(), "label": rk.Int64()}
    if spec["vec"]:
        features["vec"] = rk.Float32((spec["vec"],))
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, spec["payload"] * 64, dtype=np.uint8).tobytes()
    vec = np.arange(spec["vec"], dtype=np.float32)
    with rk.Writer(root, rk.Schema(**features), max_records=spec["records"] // 8) as w:
        for i in range(spec["records"]):
            start = (i * 7919) % (len(pool) - spec["payload"])
            sample: dict[str, Any] = {"data": pool[start : start + spec["payload"]], "label": i}
            if spec["vec"]:
                sample["vec"] = vec
            w.write(sample)
    return root


# -- modes (child) ---------------------------------------------------------------------------


def _loader(mode: str, root: str) -> Any:
    import recordkit.torch as rkt

    if mode == "threads":
        return rkt.RecordDataset(root, batch_size=BATCH)
    if mode == "workers":
        ds = rkt.RecordDataset(root, batch_size=BATCH, options=ReadOptions(num_threads=1))
        return rkt.DataLoader(ds, num_workers=2)
    return rkt.RecordDataset(root, batch_size=BATCH, options=ReadOptions(reader_process=True))


def child(mode: str, root: str, limit: int, step_ms: float) -> dict[str, Any]:
    """Unloaded ms per batch, then ms per step with ``step_ms`` of pure-Python work per batch."""
    # 1. unloaded
    it = iter(_loader(mode, root))
    next(it)
    n, cpu0, t0 = 0, _cpu_seconds(), time.perf_counter()
    for b in it:
        int(b["label"].sum())
        n += 1
        if n == limit:
            break
    load = (time.perf_counter() - t0) / n
    cores = (_cpu_seconds() - cpu0) / (load * n)
    del it
    # 2. under GIL pressure
    compute = (step_ms or load * 1e3) / 1e3
    iters = max(1, round(200_000 * compute / _time_busy(200_000)))
    for _ in range(3):
        iters = max(1, round(iters * compute / _time_busy(iters)))
    busy = _time_busy(iters)
    it = iter(_loader(mode, root))
    next(it)
    n, t0 = 0, time.perf_counter()
    for b in it:
        int(b["label"].sum())
        _busy(iters)
        n += 1
        if n == limit:
            break
    step = (time.perf_counter() - t0) / n
    del it
    return {
        "load_ms": load * 1e3,
        "compute_ms": busy * 1e3,
        "step_ms": step * 1e3,
        "efficiency": max(load, busy) / step,
        "cores": cores,
    }


def modes(args: argparse.Namespace) -> None:
    print(f"cpus: {os.cpu_count()}; batches of {BATCH}; up to {args.batches} batches a pass\n")
    for name in args.datasets.split(","):
        root = _dataset(args.data, name)
        res: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        step_ms = 0.0
        for r in range(args.repeat):
            for mode in MODES:
                out = run_child(
                    __file__,
                    [
                        "child",
                        "--mode",
                        mode,
                        "--root",
                        root,
                        "--batches",
                        str(args.batches),
                        "--step-ms",
                        str(step_ms),
                    ],
                )
                if mode == "threads" and r == 0:
                    step_ms = out["load_ms"]  # every mode gets the same step
                res[mode].append(out)
        print(f"**{name}** ({DATASETS[name]}); step: {step_ms:.2f} ms of pure Python\n")
        print(
            "| mode | load ms/batch (unloaded) | cores used | step ms under GIL pressure "
            "| efficiency | steps/s vs threads |"
        )
        print("|---|---|---|---|---|---|")
        base = median([o["step_ms"] for o in res["threads"]])
        for mode in MODES:
            rows = res[mode]
            step = median([o["step_ms"] for o in rows])
            print(
                f"| {mode} | {median([o['load_ms'] for o in rows]):.2f} "
                f"| {median([o['cores'] for o in rows]):.2f} | {step:.2f} "
                f"| {median([o['efficiency'] for o in rows]):.2f} | {base / step:.2f} |"
            )
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("overlap", "cuda", "modes", "child"))
    ap.add_argument("--data", default="bench-data/prefetch")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--datasets", default="big,small")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--root")
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--compute", type=float, default=1.0, help="cuda: compute / load time")
    args = ap.parse_args()
    if args.what == "child":
        print(json.dumps(child(args.mode, args.root, args.batches, args.step_ms)))
    elif args.what == "overlap":
        overlap(args)
    elif args.what == "cuda":
        cuda(args)
    else:
        modes(args)


if __name__ == "__main__":
    main()
