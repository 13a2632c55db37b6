"""A real ``recordkit convert`` killed with SIGKILL at random moments, then rerun, ends
byte-identical to an uninterrupted run, with no temp file and no orphaned worker left."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_convert import tree

SCRIPT = str(Path(sys.executable).with_name("recordkit"))
KILLS = 4
RUN_TIMEOUT_S = 120


def _source(root: Path) -> None:
    root.mkdir()
    for f in range(16):
        with open(root / f"f{f:02d}.jsonl", "w") as fh:
            for i in range(300):
                fh.write(json.dumps({"id": f * 1000 + i, "text": "y" * (i % 50), "v": [i]}) + "\n")


def _cmd(src: Path, dst: Path) -> list[str]:
    return [
        SCRIPT, "convert", str(src), str(dst), "--from", "jsonl", "--workers", "2",
        "--shard-size", "4KiB", "--partition-size", "1", "--progress", "none",
    ]  # fmt: skip


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """True once no process of the group is left (the workers died with their parent)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _state(out: Path) -> tuple[int, int, int, bool]:
    names = [p.name for p in out.rglob("*")] if out.exists() else []
    return (
        sum(n.endswith(".tfrecord") for n in names),
        sum(n.endswith(".done.json") for n in names),
        sum(".tmp-" in n for n in names),
        "recordkit.json" in names,
    )


@pytest.mark.slow
def test_kill_at_random_moments_then_resume(tmp_path):
    src, ref, out = tmp_path / "src", tmp_path / "ref", tmp_path / "out"
    _source(src)
    t0 = time.monotonic()
    done = subprocess.run(_cmd(src, ref), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    duration = time.monotonic() - t0
    assert done.returncode == 0, done.stderr
    rng = random.Random(20261122)
    states = []
    for kill in range(KILLS):
        proc = subprocess.Popen(
            _cmd(src, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, to check for orphans
        )  # fmt: skip
        try:
            time.sleep(rng.uniform(0.05, duration))
            proc.send_signal(signal.SIGKILL)  # only the main process: workers must follow
            proc.wait(timeout=RUN_TIMEOUT_S)
            orphans_gone = _wait_group_gone(proc.pid, timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stderr.close()
        assert orphans_gone, f"kill {kill}: writer processes outlived their parent"
        states.append(_state(out))
    print("after each kill (shards, done-markers, temp files, manifest):", states)
    final = subprocess.run(_cmd(src, out), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert final.returncode == 0, final.stderr
    got = tree(out)
    assert not [n for n in got if ".tmp-" in n or ".recordkit-convert" in n]
    assert got == tree(ref)
    assert len([n for n in got if n.endswith(".tfrecord")]) >= 16
