"""The GPU check's dry run: ``scripts/gpu_check.sh --dry-run`` runs every step of the real
check (the gpu-marked tests, the prefetch grid, host-to-device, reader threads, the
summary) with the stand-in ``torch.cuda`` and small data, so the script a borrowed GPU
machine runs is proven here on every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]


def test_the_dry_run_writes_every_part_of_the_summary(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, (
        run.stdout[-3000:]
        + run.stderr[-3000:]
        + ((out / "setup.log").read_text() if (out / "setup.log").exists() else "")
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "env.txt", "gpu-tests.txt", "h2d.md", "prefetch.md", "results.json", "setup.log",
        "summary.md", "threads.md",
    ]  # fmt: skip
    assert len(names) <= 8  # what comes back from a borrowed machine
    tests = (out / "gpu-tests.txt").read_text()
    assert "skipped" in tests and "needs a CUDA device" in tests  # -rs: each reason shown
    results = json.loads((out / "results.json").read_text())
    assert results["skipped"] == []
    grid = {(r["reader"], r["compute"]) for r in results["prefetch"]}
    assert grid == {(r, c) for r in ("threads", "process") for c in (0.5, 1.0, 2.0)}
    assert all(r[f"depth{d}_ms"] > 0 for r in results["prefetch"] for d in (1, 2, 3, 4))
    assert [r["path"].split("(")[0].strip() for r in results["h2d"]] == [
        "pinned copy_ loop", "RecordDataset", "DataLoader"
    ]  # fmt: skip
    assert {(r["workload"], r["threads"]) for r in results["threads"]} == {
        (w, n) for w in ("W1", "W2") for n in (2, 4, 8, 16)
    }
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## The GPU feed: dry run")
    for heading in ("Step time against max(load, compute)", "Host to device, W1", "Reader threads"):
        assert heading in summary
    assert "torch 2." in summary and "driver " in summary
