"""The standing fuzz suite: each target runs in a child process of its own.

Every reader (``rk.Dataset``, ``RecordDataset`` on reader threads and on the
native runner, batched and not, ``RecordMapDataset``, ``recordkit.tf.dataset``,
``rk.verify``) and the shard cache meet Hypothesis-drawn inputs: Example
payloads (valid, mutated, built feature by feature, random; zstd bombs among
them), manifests (edited as a JSON tree or as text), indexes and shard bytes
(edited, replaced, not a regular file), and a cache's own files (its sqlite
state, saved catalog, reservation and pin files, cached shards). Only two
outcomes pass: the right data (what a plain reference read computes), or a
``RecordkitError``. Another exception type fails the example (Hypothesis
shrinks it and prints it); so does a signal, a hang past the per-example
deadline, or memory past the child's address-space cap (``MemoryError``) —
then the test prints the example the child was running.

CI runs a few hundred examples per target with a fixed seed;
``pytest tests/fuzz --fuzz-long`` runs thousands with a fresh seed (printed,
with ``--fuzz-seed`` in the repro line).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# examples per target: (CI, --fuzz-long)
TARGETS = {
    "payloads": (200, 5000),
    "manifests": (200, 5000),
    "indexes": (200, 5000),
    "cache_state": (150, 3000),
    "tf_payloads": (40, 1000),
}


@pytest.fixture
def fuzz_long(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--fuzz-long"))


# CI runs are bounded by the child's own timeout (280 s); a --fuzz-long run by 3000 s.
@pytest.mark.timeout(3100)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz(target: str, fuzz_long: bool, tmp_path) -> None:
    ci, deep = TARGETS[target]
    if target == "tf_payloads":
        pytest.importorskip("tensorflow")
    seed = random.randrange(2**32) if fuzz_long else None
    timeout = 3000 if fuzz_long else 280
    cmd = [
        sys.executable,
        "-m",
        "tests.fuzz.harness",
        target,
        "--examples",
        str(deep if fuzz_long else ci),
        "--workdir",
        str(tmp_path),
        "--timeout",
        "120" if fuzz_long else "60",
    ]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if target == "tf_payloads":  # TensorFlow's thread pools reserve gigabytes of address space
        cmd += ["--memory", "16384"]
    env = {
        **os.environ,
        "MALLOC_ARENA_MAX": "2",  # address-space cap: one arena per thread would eat it
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "RECORDKIT_INDEX_CACHE": str(tmp_path / "index-cache"),
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    try:
        out = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{target}: the fuzz run did not finish in {timeout} s\n{_current(tmp_path)}\n"
            f"{(exc.stderr or b'')[-5000:]!r}"
        )
    where = f"(seed {seed})" if seed is not None else "(derandomized)"
    if out.returncode != 0:
        how = (
            f"killed by {signal.Signals(-out.returncode).name}"
            if out.returncode < 0
            else f"exit status {out.returncode}"
        )
        pytest.fail(
            f"fuzz target {target} {where}: {how}\n"
            f"--- the example being run ---\n{_current(tmp_path)}\n"
            f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-12000:]}"
        )
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"fuzz {target} {where}: {json.dumps(stats)}")
    # not vacuous: both outcomes were met
    refusals = sum(n for k, n in stats.items() if ":" in k and not k.endswith((" data", " ok")))
    assert refusals > 0 and any(k.endswith(": data") or k.endswith(": ok") for k in stats), stats


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("crash", "Segmentation fault"),
        ("hang", "Timeout"),
        ("memory", "MemoryError"),
        ("wrong_type", "KeyError: 'not a RecordkitError'"),
    ],
)
def test_the_harness_catches_each_way_of_failing(how, says, tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.fuzz.harness",
            f"selftest_{how}",
            "--examples",
            "200",
            "--workdir",
            str(tmp_path),
            "--timeout",
            "2",
            "--memory",
            "512",
        ],
        cwd=ROOT,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode != 0
    assert says in out.stdout + out.stderr, out.stderr[-3000:]
    assert int(_current(tmp_path)) >= 50  # the example that did it is on record


def _current(tmp_path) -> str:
    try:
        with open(tmp_path / "current.txt") as f:
            return f.read()[:20000]
    except OSError:
        return "(none)"
