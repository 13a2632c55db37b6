"""The README and docs code blocks run: docs that are not run rot."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("doc", [d for d in DOCS if _BLOCK.search(d.read_text("utf-8"))],
                         ids=lambda d: d.name)
def test_doc_python_blocks_run(doc, tmp_path, monkeypatch):
    """The blocks of one page run in order in one namespace, as a reader would paste them."""
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc__"}
    for i, match in enumerate(_BLOCK.finditer(doc.read_text("utf-8"))):
        exec(compile(match.group(1), f"{doc.name}[block {i}]", "exec"), namespace)
