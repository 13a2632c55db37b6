"""What a wheel installs: recordkit (converters included as recordkit.converters), and
nothing at the top level that a user's own module could shadow or clash with."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_the_converters_inside_recordkit(tmp_path):
    pytest.importorskip("setuptools")
    out = subprocess.run(  # offline: the build backend of this environment
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), "-q"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("recordkit-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry = zf.read(entry_points).decode()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"recordkit"}, tops
    ours = sorted(p.name for p in (ROOT / "converters").glob("*.py"))
    packed = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("recordkit/converters/"))
    assert packed == ours
    assert "[recordkit.converters]" in entry
    assert "csv = recordkit.converters.csv:CsvSource" in entry
    assert "= converters." not in entry


def test_the_converters_folder_installs_as_recordkit_converters():
    """converters/ is a real folder that setup.py maps to recordkit.converters (no link in
    the tree): an editable install and a wheel import the same files under that name."""
    assert not (ROOT / "recordkit" / "converters").exists()
    import recordkit.converters

    assert Path(recordkit.converters.__file__).resolve().parent == (ROOT / "converters").resolve()


@pytest.mark.slow
def test_the_sdist_carries_every_c_source_and_header(tmp_path):
    """recordkit.native._ext is built from several units sharing recordkit/native/recordkit.h:
    an sdist missing one cannot build the extension (and would install the slow fallback)."""
    pytest.importorskip("setuptools")
    out = subprocess.run(  # offline, as the wheel test: this environment's setuptools
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (sdist,) = tmp_path.glob("recordkit-*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    ours = {
        p.relative_to(ROOT).as_posix()
        for pattern in ("*.c", "*.h", "*.cc")
        for p in (ROOT / "recordkit" / "native").glob(pattern)
    }
    units = {"module.c", "recordkit.h", "runner.c", "order.c", "tfop.cc"}
    assert {f"recordkit/native/{name}" for name in units} <= ours
    assert ours <= names, sorted(ours - names)
