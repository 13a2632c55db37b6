"""The README and docs code blocks run, and the examples run: docs that are not run rot."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _python_blocks():
    for doc in DOCS:
        for i, match in enumerate(_BLOCK.finditer(doc.read_text("utf-8"))):
            yield pytest.param(match.group(1), id=f"{doc.name}-{i}")


@pytest.mark.parametrize("code", list(_python_blocks()))
def test_doc_python_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<doc>", "exec"), {"__name__": "__doc__"})


@pytest.mark.tf
@pytest.mark.torch
@pytest.mark.slow
def test_quickstart_example(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "quickstart.py"),
            "--out",
            str(tmp_path / "q"),
            "-n",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "verify  " in out.stdout and ": OK" in out.stdout
    assert "torch   read 300 samples" in out.stdout
    assert "tf.data read 300 samples" in out.stdout
