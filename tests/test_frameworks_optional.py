"""The suite on a machine without torch, or without TensorFlow: every test module still
collects, and the tests that need the missing framework skip (they are marked, and
import it through ``pytest.importorskip``), so a user with one framework can run it.

``RECORDKIT_TEST_HIDE`` (tests/conftest.py) makes importing the named framework raise
``ModuleNotFoundError`` in the collecting process, as on such a machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_the_suite_collects_without(framework: str) -> None:
    env = dict(os.environ, RECORDKIT_TEST_HIDE=framework)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "tests"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR ")]
    assert out.returncode == 0 and not errors, "\n".join(errors) or out.stdout[-3000:]


def test_a_hidden_framework_cannot_be_imported() -> None:
    """The switch itself: the hidden framework raises as if it were not installed."""
    code = (
        "import tests.conftest\n"
        "try:\n    import torch\n"
        "except ModuleNotFoundError as e:\n    print('hidden', e.name)"
    )
    env = dict(os.environ, RECORDKIT_TEST_HIDE="torch")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "hidden torch", out.stderr[-2000:]
