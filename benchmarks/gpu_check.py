"""The GPU check: the feed recordkit exists for, measured on one GPU in a few minutes.

Run by ``scripts/gpu_check.sh`` (which sets up the interpreter, builds the C extension
and runs the ``gpu``-marked tests first); writes Markdown under ``OUT``:

- ``prefetch.md``: step time against max(load, compute) for a compute step of 0.5x, 1x
  and 2x the load time (``torch.cuda._sleep``), for the reader threads and the loader
  process, without the prefetcher and with it at depths 1 to 4 (target: step <= 1.15
  x max(load, compute));
- ``h2d.md``: host-to-device throughput of W1 (256 KiB records, page-cached) through
  ``RecordDataset(options=ReadOptions(pin_memory=True))`` + ``DevicePrefetcher`` into
  device memory, against a plain pinned ``copy_`` loop (the link's ceiling) and
  ``DataLoader`` with worker processes and ``pin_memory=True``, in the same run;
- ``threads.md``: reader threads 2, 4, 8, 16 on W1 and W2 (1 KiB records);
- ``summary.md``: all of it in the shape of ``docs/performance.md``'s tables, with the
  GPU, driver, CUDA and torch versions and the date; ``results.json``: the numbers.

``--dry-run``: the same steps on the CPU with the stand-in ``torch.cuda`` of the tests
(``tests/standin_cuda.py``: copies go to the ``meta`` device, a compute step is a
sleep) and small data, so the script itself is proven on every CI run; its figures
mean nothing and the summary says so.

    python benchmarks/gpu_check.py OUT [--dry-run] [--budget 330] [--data DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from recordkit.reader import ReadOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # tests.standin_cuda, for the dry run

BATCH = 32  # W1: 8 MiB a batch
COMPUTES = (0.5, 1.0, 2.0)
DEPTHS = (1, 2, 3, 4)
THREADS = (2, 4, 8, 16)
TARGET = 1.15


class Device:
    """The GPU, or on a dry run the stand-in: what the measurements need of it."""

    def __init__(self, dry: bool) -> None:
        import torch

        self.dry = dry
        self.torch = torch
        if dry:
            from tests.standin_cuda import FakeCuda, install

            install(FakeCuda())
            self.name = "stand-in torch.cuda (dry run: CPU, figures mean nothing)"
            self.per_ms = 0.0
            return
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run on a machine without one")
        self.name = torch.cuda.get_device_name()
        self.per_ms = self._cycles_per_ms()

    def _cycles_per_ms(self) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
        return 50_000_000 / start.elapsed_time(end)

    def compute(self, ms: float, x: Any) -> None:
        """A step of ``ms`` on the device that reads ``x``; returns when it is done."""
        if self.dry:
            time.sleep(ms / 1e3)
            return
        self.torch.cuda._sleep(int(self.per_ms * ms))
        int(x.view(-1)[-1])  # the step ends when the device is done with it

    def to_device(self, t: Any) -> Any:
        if self.dry:
            return t
        return t.to("cuda", non_blocking=True)

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def versions(self) -> dict[str, str]:
        torch = self.torch
        out = {
            "gpu": self.name,
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
            "python": platform.python_version(),
            "cpus": str(os.cpu_count()),
            "date": datetime.date.today().isoformat(),
        }
        try:
            import subprocess

            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            out["driver"] = driver.stdout.strip() or "?"
        except (OSError, subprocess.SubprocessError):
            out["driver"] = "none (no nvidia-smi)"
        return out


# -- data --------------------------------------------------------------------------------------


def write(root: str, records: int, payload: int, vec: int) -> str:
    """W1 (``payload`` 256 KiB) or W2 (1 KiB, a vector of 16 float32s) at ``root``."""
    import numpy as np

    import recordkit as rk

    if os.path.exists(os.path.join(root, "recordkit.json")):
        return root
    features: dict[str, Any] = {"data": rk.Bytes(), "label": rk.Int64()}
    if vec:
        features["vec"] = rk.Float32((vec,))
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, payload * 64, dtype=np.uint8).tobytes()
    v = np.arange(vec, dtype=np.float32)
    per_shard = max(1, (256 << 20) // payload)  # shards of about 256 MiB
    with rk.Writer(root, rk.Schema(**features), max_records=per_shard, fsync=False) as w:
        for i in range(records):
            start = (i * 7919) % (len(pool) - payload)
            sample: dict[str, Any] = {"data": pool[start : start + payload], "label": i}
            if vec:
                sample["vec"] = v
            w.write(sample)
    return root


def warm(root: str) -> None:
    """Read every file once: page-cached, as the measurements assume."""
    for name in os.listdir(root):
        with open(os.path.join(root, name), "rb") as f:
            while f.read(16 << 20):
                pass


# -- measurements ------------------------------------------------------------------------------


def _loader(root: str, reader: str, pin: bool = True, threads: int | None = None) -> Any:
    import recordkit.torch as rkt

    return rkt.RecordDataset(
        root,
        batch_size=BATCH,
        options=ReadOptions(
            pin_memory=pin, reader_process=reader == "process", num_threads=threads
        ),
    )


def _steps(batches: Iterable[Any], dev: Device, compute_ms: float | None, n: int) -> float:
    """Seconds per step over ``n`` steps after the first (``compute_ms=None``: the host
    loop alone, the load time)."""
    it = iter(batches)
    next(it)  # start-up left out
    done, t0 = 0, time.perf_counter()
    for b in it:
        if compute_ms is not None:
            dev.compute(compute_ms, dev.to_device(b["data"]))
        done += 1
        if done == n:
            break
    seconds = (time.perf_counter() - t0) / max(1, done)
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return seconds


def prefetch(w1: str, dev: Device, steps: int, left: Callable[[], float]) -> list[dict[str, Any]]:
    """Step time against max(load, compute), per reader, compute ratio and depth."""
    import recordkit.torch as rkt

    rows = []
    for reader in ("threads", "process"):
        load = _steps(_loader(w1, reader), dev, None, steps)
        for ratio in COMPUTES:
            compute_ms = load * 1e3 * ratio
            best = max(load, compute_ms / 1e3)
            plain = _steps(_loader(w1, reader), dev, compute_ms, steps)
            cells = {"reader": reader, "compute": ratio, "load_ms": load * 1e3}
            cells["plain_ms"] = plain * 1e3
            for depth in DEPTHS:
                if left() <= 0:
                    cells[f"depth{depth}_ms"] = None
                    continue
                pf = rkt.DevicePrefetcher(_loader(w1, reader), "cuda", depth=depth)
                cells[f"depth{depth}_ms"] = _steps(pf, dev, compute_ms, steps) * 1e3
                pf.close()
            cells["max_ms"] = best * 1e3
            rows.append(cells)
    return rows


def h2d(w1: str, dev: Device, steps: int) -> list[dict[str, Any]]:
    """Bytes a second into device memory: recordkit, the pinned ceiling, DataLoader."""
    import torch

    import recordkit.torch as rkt

    rows = []
    nbytes = BATCH * (256 << 10)
    # The link's ceiling: one pinned host buffer copied over and over.
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=not dev.dry)
    target = torch.empty(nbytes, dtype=torch.uint8, device="cpu" if dev.dry else "cuda")
    target.copy_(host, non_blocking=True)
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        target.copy_(host, non_blocking=True)
    dev.sync()
    rows.append(
        {
            "path": "pinned copy_ loop (the link)",
            "gbps": nbytes * steps / (time.perf_counter() - t0) / 1e9,
        }
    )

    def through(batches: Iterable[Any], what: str) -> None:
        it = iter(batches)
        first = next(it)
        dev.to_device(first["data"])
        dev.sync()
        moved, t0 = 0, time.perf_counter()
        for n, b in enumerate(it, 1):
            x = dev.to_device(b["data"])
            moved += x.numel() * x.element_size()
            if n == steps:
                break
        dev.sync()
        rows.append({"path": what, "gbps": moved / (time.perf_counter() - t0) / 1e9})
        close = getattr(it, "close", None)
        if close is not None:
            close()

    pf = rkt.DevicePrefetcher(_loader(w1, "threads", pin=True), "cuda")
    through(pf, "RecordDataset(options=ReadOptions(pin_memory=True)) + DevicePrefetcher")
    pf.close()
    ds = rkt.RecordDataset(w1, batch_size=BATCH, options=ReadOptions(num_threads=1))
    workers = max(1, min(8, (os.cpu_count() or 2) // 2))
    dl = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=workers, pin_memory=not dev.dry
    )
    through(dl, f"DataLoader({workers} workers, pin_memory=True) + .to(cuda)")
    return rows


def threads(w1: str, w2: str, steps: int) -> list[dict[str, Any]]:
    """MB/s of host batches for 2, 4, 8 and 16 reader threads (page-cached)."""
    rows = []
    for name, root in (("W1", w1), ("W2", w2)):
        for n in THREADS:
            import recordkit.torch as rkt

            ds = rkt.RecordDataset(
                root, batch_size=256 if name == "W2" else BATCH, options=ReadOptions(num_threads=n)
            )
            it = iter(ds)
            next(it)
            moved, t0 = 0, time.perf_counter()
            for done, b in enumerate(it, 1):
                moved += sum(
                    t.numel() * t.element_size() for t in b.values() if hasattr(t, "numel")
                )
                if done == steps:
                    break
            rows.append(
                {"workload": name, "threads": n, "mbps": moved / (time.perf_counter() - t0) / 1e6}
            )
            it.close()
    return rows


# -- report ------------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "skipped (budget)" if v is None else f"{v:.2f}"


def report(out: str, env: dict[str, str], res: dict[str, Any], dry: bool) -> str:
    lines = []
    head = "dry run (stand-in device; the figures mean nothing)" if dry else env["gpu"]
    lines += [f"## The GPU feed: {head}", ""]
    lines += [
        f"{env['date']}; {env['gpu']}; driver {env['driver']}; CUDA {env['cuda']}; torch "
        f"{env['torch']}; Python {env['python']}; {env['cpus']} CPUs. Command: "
        "`bash scripts/gpu_check.sh OUT`.",
        "",
    ]
    pre = ["### Step time against max(load, compute) (target <= 1.15x)", ""]
    pre += [
        "| reader | compute / load | load ms | max(load, compute) ms | no prefetcher | "
        + " | ".join(f"depth {d}" for d in DEPTHS)
        + " | best / max |",
        "|---|---|---|---|---|" + "---|" * len(DEPTHS) + "---|",
    ]
    for r in res.get("prefetch", []):
        depths = [r[f"depth{d}_ms"] for d in DEPTHS]
        measured = [d for d in depths if d is not None]
        ratio = min(measured) / r["max_ms"] if measured else float("nan")
        pre.append(
            f"| {r['reader']} | {r['compute']}x | {r['load_ms']:.2f} | {r['max_ms']:.2f} | "
            f"{r['plain_ms']:.2f} | " + " | ".join(map(_ms, depths)) + f" | {ratio:.2f} |"
        )
    h = [
        "### Host to device, W1 (256 KiB records, page-cached)",
        "",
        "| path | GB/s |",
        "|---|---|",
    ]
    h += [f"| {r['path']} | {r['gbps']:.2f} |" for r in res.get("h2d", [])]
    t = ["### Reader threads (host batches, page-cached)", ""]
    t += ["| workload | " + " | ".join(f"{n} threads" for n in THREADS) + " |"]
    t += ["|---|" + "---|" * len(THREADS)]
    for wl in ("W1", "W2"):
        cells = {r["threads"]: r["mbps"] for r in res.get("threads", []) if r["workload"] == wl}
        if cells:
            t.append(
                f"| {wl} | "
                + " | ".join(f"{cells.get(n, float('nan')):,.0f} MB/s" for n in THREADS)
                + " |"
            )
    skipped = res.get("skipped", [])
    notes = [f"Skipped for the time budget: {', '.join(skipped)}.", ""] if skipped else []
    sections = {"prefetch.md": pre, "h2d.md": h, "threads.md": t}
    for name, body in sections.items():
        with open(os.path.join(out, name), "w") as f:
            f.write("\n".join(body) + "\n")
    text = "\n".join(lines + notes + pre + [""] + h + [""] + t) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for all steps")
    ap.add_argument("--data", default=None, help="where W1 and W2 go (default: OUT/../gpu-data)")
    args = ap.parse_args()
    t0 = time.monotonic()

    def left() -> float:
        return args.budget - (time.monotonic() - t0)

    os.makedirs(args.out, exist_ok=True)
    data = args.data or os.path.join(os.path.dirname(os.path.abspath(args.out)), "gpu-data")
    dev = Device(args.dry_run)
    env = dev.versions()
    small = args.dry_run
    w1 = write(os.path.join(data, "w1"), 96 if small else 4096, 256 << 10, 0)
    w2 = write(os.path.join(data, "w2"), 5000 if small else 500_000, 1 << 10, 16)
    warm(w1)
    warm(w2)
    print(f"data ready in {time.monotonic() - t0:.0f} s", flush=True)
    res: dict[str, Any] = {"env": env, "skipped": []}
    steps = 4 if small else 40
    for name, step in (
        ("prefetch", lambda: prefetch(w1, dev, steps, left)),
        ("h2d", lambda: h2d(w1, dev, steps)),
        ("threads", lambda: threads(w1, w2, steps)),
    ):
        if left() <= 0:
            res["skipped"].append(name)
            continue
        s = time.monotonic()
        res[name] = step()
        print(f"{name} in {time.monotonic() - s:.0f} s", flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(report(args.out, env, res, args.dry_run))


if __name__ == "__main__":
    main()
