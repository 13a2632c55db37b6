"""The README and docs code blocks run: docs that are not run rot."""

import re
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
