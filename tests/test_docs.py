"""The README and docs code blocks run: docs that are not run rot."""

import logging
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every page of the site (docs/ and its subfolders, not the build output) and the README.
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.relative_to(ROOT).parts),
]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize(
    "doc",
    [d for d in DOCS if _BLOCK.search(d.read_text("utf-8"))],
    ids=lambda d: d.relative_to(ROOT).as_posix(),
)
def test_doc_python_blocks_run(doc, tmp_path, monkeypatch):
    """The blocks of one page run in order in one namespace, as a reader would paste them.

    Each page starts in an empty temp directory: a page that needs data makes it first.
    Blocks that cannot run here (real S3, a Dask scheduler, DALI) are ```text or ```bash.
    """
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc__"}
    # A page may configure logging as a user would; other tests should not inherit it.
    loggers = [logging.root, *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    levels = {lg: lg.level for lg in loggers}
    handlers = list(logging.root.handlers)
    try:
        for i, match in enumerate(_BLOCK.finditer(doc.read_text("utf-8"))):
            name = doc.relative_to(ROOT).as_posix()
            exec(compile(match.group(1), f"{name}[block {i}]", "exec"), namespace)
    finally:
        for lg in [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]:
            lg.setLevel(levels.get(lg, logging.NOTSET))
        logging.root.setLevel(levels[logging.root])
        logging.root.handlers[:] = handlers
