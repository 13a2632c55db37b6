"""Shared helpers for the benchmarks: run a measurement in a fresh subprocess, take medians."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence


def run_child(script: str, args: Sequence[str], timeout: float = 1800) -> dict:
    """Run ``script args`` in a fresh interpreter; it prints one JSON object as its last line."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    out = subprocess.run(
        [sys.executable, script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def drop_file_cache(path: str) -> None:
    """Best effort: evict a file's pages (posix_fadvise DONTNEED) so writes start cold."""
    for root, _, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
