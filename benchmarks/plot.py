"""Plot read throughput per reader and workload for the docs (``docs/_static/throughput.png``).

The numbers come from ``docs/_static/bench.json``, which holds the W1/W2 tables of
``docs/performance.md`` (``benchmarks/read_bench.py run --repeat 3``), copied by hand;
update both together after a new run. Needs matplotlib (the ``docs`` dependency group)::

    python benchmarks/plot.py [--data docs/_static/bench.json] [--out docs/_static/throughput.png]

The PNG is committed, so building the docs does not need a benchmark run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plot(data: dict, out: Path) -> None:
    """Draw one panel per workload: a horizontal bar per reader, MB/s on a log axis."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    workloads = data["workloads"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.2 * len(workloads), 3.4))
    for ax, (name, readers) in zip(axes, workloads.items()):
        ordered = sorted(readers.items(), key=lambda kv: kv[1])
        labels = [r for r, _ in ordered]
        values = [v for _, v in ordered]
        colors = ["#1f77b4" if r == "recordkit" else "#9aa5b1" for r in labels]
        bars = ax.barh(labels, values, color=colors)
        ax.set_xscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("MB/s (log scale)")
        base = readers["tf.data"]
        for bar, value in zip(bars, values):
            ax.text(
                value * 1.08,
                bar.get_y() + bar.get_height() / 2,
                f"{value:,}  ({value / base:.2f}x tf.data)",
                va="center",
                fontsize=7.5,
            )
        ax.set_xlim(min(values) / 2, max(values) * 12)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle(f"Read throughput into framework tensors: {data['command']}", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Fixed metadata so that re-running on the same numbers gives the same bytes.
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    """Command line: read the JSON, write the PNG."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "docs/_static/bench.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/_static/throughput.png")
    args = ap.parse_args()
    plot(json.loads(args.data.read_text("utf-8")), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
