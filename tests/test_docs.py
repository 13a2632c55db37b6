"""The README's and the docs' code blocks run: docs that are not run rot.

Every page runs its ```python and ```bash (``sh``, ``console``, ``shell``) blocks in
order, as a reader would follow it: Python blocks in one namespace, shell blocks with
``bash -euo pipefail`` and this environment's ``python`` and ``recordkit`` first on
``PATH``, all in one empty temporary directory where ``examples/``, ``benchmarks/``,
``scripts/`` and ``.venv`` lead to the checkout's. A shell block that cannot run here
is preceded by ``<!-- not run here: WHY -->`` (real S3, a cluster, the set-up this
test runs in), or by ``<!-- run here as: COMMAND -->``, which runs COMMAND in its
place (what the block does without the set-up around it).
"""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Every page of the site (docs/ and its subfolders, not the build output) and the README.
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.relative_to(ROOT).parts),
]
_BLOCK = re.compile(
    r"^(?:<!-- (?P<how>not run here|run here as): *(?P<what>.*?) *-->\n)?"
    r"```(?P<lang>python|bash|sh|console|shell)\n(?P<code>.*?)^```",
    re.S | re.M,
)
SHELL_TIMEOUT = 420
_LINKED = ("examples", "benchmarks", "scripts")


def _pages() -> list[Path]:
    return [d for d in DOCS if _BLOCK.search(d.read_text("utf-8"))]


def _env(tmp: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = sys.prefix
    env["HOME"] = str(tmp / "home")  # ~ in a command is not the user's home
    return env


def _room(tmp: Path) -> None:
    """The checkout's examples, benchmarks, scripts and virtual environment, linked."""
    for name in _LINKED:
        (tmp / name).symlink_to(ROOT / name, target_is_directory=True)
    (tmp / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    (tmp / "home").mkdir()


def _shell(code: str, where: str, tmp: Path) -> None:
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=tmp, env=_env(tmp), capture_output=True, text=True, timeout=SHELL_TIMEOUT,
    )  # fmt: skip
    assert out.returncode == 0, (
        f"{where} failed (exit {out.returncode}):\n{code}\n--- stdout\n{out.stdout[-3000:]}"
        f"\n--- stderr\n{out.stderr[-5000:]}"
    )


@pytest.mark.parametrize("doc", _pages(), ids=lambda d: d.relative_to(ROOT).as_posix())
def test_doc_blocks_run(doc, tmp_path, monkeypatch):
    """The blocks of one page run in order, as a reader would paste them.

    Each page starts in an empty temp directory: a page that needs data makes it first.
    """
    _room(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc__"}
    # A page may configure logging as a user would; other tests should not inherit it.
    loggers = [logging.root, *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    levels = {lg: lg.level for lg in loggers}
    handlers = list(logging.root.handlers)
    name = doc.relative_to(ROOT).as_posix()
    try:
        for i, match in enumerate(_BLOCK.finditer(doc.read_text("utf-8"))):
            where = f"{name}[block {i}]"
            if match["lang"] == "python":
                assert not match["how"], f"{where}: a Python block that cannot run is ```text"
                exec(compile(match["code"], where, "exec"), namespace)
            elif match["how"] == "run here as":
                _shell(match["what"], where + " (run here as)", tmp_path)
            elif match["how"] is None:
                _shell(match["code"], where, tmp_path)
    finally:
        for lg in [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]:
            lg.setLevel(levels.get(lg, logging.NOTSET))
        logging.root.setLevel(levels[logging.root])
        logging.root.handlers[:] = handlers


def test_every_block_not_run_says_why():
    """A marker names its reason or command, and sits on a shell block."""
    for doc in DOCS:
        text = doc.read_text("utf-8")
        for m in re.finditer(r"<!-- (not run here|run here as):(.*?)-->", text, re.S):
            at = f"{doc.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
            assert len(m.group(2).strip()) > 8, f"{at}: say why, or what runs instead"
            rest = text[m.end() :]
            shell = re.match(r"\n```(bash|sh|console|shell)\n", rest)
            assert shell, f"{at}: not before a shell block"
