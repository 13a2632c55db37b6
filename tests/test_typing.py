"""Users' type checkers see recordkit's annotations: mypy --strict on a user's script.

The script (tests/data/typing/user_script.py) uses the public API as a training script
does; it must check clean, and a wrong use must be caught (so the annotations reach
the checker, rather than everything being ``Any``). recordkit ships ``py.typed``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "data" / "typing" / "user_script.py"

pytest.importorskip("mypy")


def _mypy(script: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # The checkout on MYPYPATH stands for the installed package (an editable install's
    # import hook is invisible to mypy); errors inside recordkit are not the user's,
    # so imports are followed silently, as for an installed package.
    env = dict(os.environ, MYPYPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--cache-dir", str(cache), "--no-error-summary", str(script)],
        capture_output=True, text=True, timeout=600, env=env, cwd=script.parent,
    )  # fmt: skip


def test_py_typed_is_shipped():
    assert (ROOT / "recordkit" / "py.typed").is_file()
    assert 'recordkit = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.slow
def test_a_users_script_checks_clean_in_strict_mode(tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        SCRIPT.read_text()
        + "\n\ndef wrong() -> None:\n"
        + '    n: str = len(rk.Dataset("d"))\n'
        + '    rk.convert("a", "b", format=3)\n'
        + '    RecordDataset("d", batch_size="64")\n'
    )
    out = _mypy(wrong, tmp_path / "cache")
    lines = [line for line in out.stdout.splitlines() if "error:" in line]
    # All three wrong uses, and nothing in the script itself, are reported.
    assert len(lines) == 3, out.stdout + out.stderr
    assert all(line.startswith("wrong.py:") for line in lines), out.stdout
    assert 'Argument "format" to "convert" has incompatible type "int"' in out.stdout
    out = _mypy(SCRIPT, tmp_path / "cache")
    assert out.returncode == 0, out.stdout + out.stderr
