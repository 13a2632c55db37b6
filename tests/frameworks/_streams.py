"""Helpers of the training-framework tests: run a recipe, read what each step trained on.

Every recipe (the examples under ``examples/``) writes ``[epoch, [labels]]`` per step,
one JSON line each, with ``--labels FILE`` (``FILE.rankN`` on several processes); a
record's label is its number, so a stream says which records each epoch read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="0")
Steps = list[tuple[int, list[int]]]


def run(args: list[str], timeout: float = 240) -> str:
    """Run a command from the checkout; its stdout (the test fails with its output)."""
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def example(script: str, *args: object, processes: int = 1, timeout: float = 240) -> str:
    """Run ``examples/<script>``, on ``processes`` processes through torchrun."""
    path = str(ROOT / "examples" / script)
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    return run([*launcher, path, *map(str, args)], timeout=timeout)


def steps(path: Path) -> Steps:
    """The ``(epoch, labels)`` of every step a recipe wrote."""
    return [(e, labels) for e, labels in map(json.loads, path.read_text().splitlines())]


def epochs(stream: Steps) -> dict[int, list[int]]:
    """The labels each epoch read, in order."""
    out: dict[int, list[int]] = {}
    for epoch, labels in stream:
        out.setdefault(epoch, []).extend(labels)
    return out


def check_epochs(ranks: list[Steps], records: int, count: int) -> dict[str, object]:
    """Every epoch reads each record once over the ranks, each rank its own share, in a new
    order every epoch. Returns the figures the issue asks for."""
    per_rank = [epochs(s) for s in ranks]
    for r in per_rank:
        assert sorted(r) == list(range(count)), f"epochs read: {sorted(r)}"
    for e in range(count):
        union = [i for r in per_rank for i in r[e]]
        assert sorted(union) == list(range(records)), f"epoch {e}: not every record once"
    first = per_rank[0]
    differ = sum(a != b for a, b in zip(first[0], first[1]))
    assert differ > len(first[0]) // 2, f"epochs 0 and 1 nearly in the same order ({differ})"
    return {
        "records per epoch per rank": [len(r[0]) for r in per_rank],
        "positions that differ between epochs 0 and 1 (rank 0)": differ,
    }
