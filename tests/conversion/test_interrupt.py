"""Ctrl-C in a real ``recordkit convert`` (SIGINT to its whole process group): one line that
says how far it got, exit 130, no traceback; the folder is refused by every reader until a
rerun finishes it, and ``partial=True`` reads what was published."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.conversion import incomplete_at
from tests.incomplete import assert_partial_reads, assert_refused_everywhere

SCRIPT = str(Path(sys.executable).with_name("recordkit"))
FILES, ROWS = 48, 1500
RUN_TIMEOUT_S = 120
# The test's own process may ignore SIGINT (a background job): give the command Python's
# default Ctrl-C behaviour, as an interactive shell would, then exec it.
_DEFAULT_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "


def _source(root: Path) -> None:
    root.mkdir()
    for f in range(FILES):
        with open(root / f"f{f:02d}.jsonl", "w") as fh:
            for i in range(ROWS):
                fh.write(json.dumps({"id": f * ROWS + i, "text": "t" * (i % 40)}) + "\n")


def _cmd(src: Path, dst: Path, workers: str = "2") -> list[str]:
    args = [
        SCRIPT, "convert", str(src), str(dst), "--from", "jsonl", "--workers", workers,
        "--shard-size", "16KiB", "--partition-size", "1", "--progress", "none",
    ]  # fmt: skip
    return [sys.executable, "-c", _DEFAULT_SIGINT + "os.execv(sys.argv[1], sys.argv[1:])", *args]


def _done(dst: Path) -> int:
    state = dst / ".recordkit-convert"
    return len(list(state.glob("*.done.json"))) if state.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["2", "0"])  # writer subprocesses; in the process itself
def test_ctrl_c_in_convert_is_one_line_and_refused_until_rerun(tmp_path, capsys, caplog, workers):
    src, dst = tmp_path / "src", tmp_path / "out"
    _source(src)
    proc = subprocess.Popen(
        _cmd(src, dst, workers), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: SIGINT reaches it all, as Ctrl-C does
    )  # fmt: skip
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while _done(dst) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, f"finished before it could be interrupted: {proc.stderr}"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.strip().splitlines()[-1]
    found = incomplete_at(dst)
    assert found is not None and found.writer == "convert" and found.total == FILES
    assert 3 <= found.published < FILES
    assert last == (
        f"recordkit convert: interrupted: {found.published} of {FILES} partitions published "
        f"at {dst}; rerun the same command to resume"
    )
    says = f"a conversion was interrupted here ({found.published} of {FILES} partitions"
    assert_refused_everywhere(dst, says, capsys)
    shards = rk.Dataset(dst, partial=True).shards
    assert_partial_reads(dst, sum(s.records for s in shards), "partitions", caplog)
    assert f"reads {found.published} of {FILES} partitions" in caplog.text

    rerun = subprocess.run(_cmd(src, dst), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{found.published} resumed" in rerun.stderr
    ds = rk.Dataset(dst)
    assert ds.manifest is not None and len(ds) == FILES * ROWS
    assert rk.verify(dst).ok and incomplete_at(dst) is None
    assert not (dst / ".recordkit-writing.json").exists()


@pytest.mark.remote
def test_failed_conversion_to_s3_leaves_a_marker_object(tmp_path, s3):
    pytest.importorskip("s3fs")
    src = tmp_path / "src"
    src.mkdir()
    for f in range(4):
        lines = [json.dumps({"id": f * 10 + i}) for i in range(10)]
        if f == 2:
            lines[5] = "{not json"
        (src / f"f{f}.jsonl").write_text("\n".join(lines) + "\n")
    bucket = s3.bucket()
    dst = f"{bucket}/out"
    run = dict(
        format="jsonl",
        schema=rk.Schema(id=rk.Int64()),
        workers=0,
        options=rk.conversion.ConvertOptions(partition_bytes=1),
    )
    with pytest.raises(rk.errors.PartitionsFailedError):
        rk.convert(src, dst, storage_options=s3.storage_options, **run)
    fs = s3.filesystem()
    assert fs.exists(f"{dst}/.recordkit-writing.json") and not fs.exists(f"{dst}/recordkit.json")
    found = incomplete_at(dst, s3.storage_options)
    assert found is not None and (found.writer, found.published, found.total) == ("convert", 3, 4)
    local = tmp_path / "copy"
    fs.get(f"{dst}/", str(local) + "/", recursive=True)
    with pytest.raises(rk.errors.IncompleteDatasetError, match=r"\(3 of 4 partitions published\)"):
        rk.Dataset(local)
    assert len(rk.Dataset(local, partial=True)) == 30

    # The bad file fixed (another size): the same source, so the run resumes, keeping the
    # 3 published partitions (their files unchanged) and writing the fixed file's.
    (src / "f2.jsonl").write_text("".join(json.dumps({"id": 20 + i}) + "\n" for i in range(10)))
    result = rk.convert(src, dst, storage_options=s3.storage_options, **run)
    assert result.resumed == 3 and result.manifest.records == 40
    assert not fs.exists(f"{dst}/.recordkit-writing.json") and fs.exists(f"{dst}/recordkit.json")
    assert incomplete_at(dst, s3.storage_options) is None
