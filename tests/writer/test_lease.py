"""One writer per destination, with real processes: a second writer is refused by name,
a lease whose holder was killed is taken over, two conversions racing into one folder
never leave a mix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.errors import DatasetExistsError, DestinationBusyError
from recordkit.writer.lease import LEASE_NAME, Lease

pytestmark = pytest.mark.timeout(180)

SCHEMA = rk.Schema(i=rk.Int64())

_HOLD = textwrap.dedent(
    """
    import sys, time
    import recordkit as rk
    w = rk.Writer(sys.argv[1], rk.Schema(i=rk.Int64()), max_records=10)
    for i in range(25):
        w.write({"i": i})
    print("holding", flush=True)
    time.sleep(120)
    """
)


def _holder(dst: Path) -> subprocess.Popen[str]:
    """A process that holds a Writer open on ``dst`` (shards published, no manifest)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(dst)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def _jsonl(root: Path, base: int, files: int = 6, rows: int = 400) -> Path:
    root.mkdir(parents=True)
    for f in range(files):
        text = "".join(json.dumps({"i": base + f * rows + r}) + "\n" for r in range(rows))
        (root / f"f{f}.jsonl").write_text(text)
    return root


def test_a_second_writer_is_refused_by_name_and_the_first_is_untouched(tmp_path):
    dst = tmp_path / "d"
    proc = _holder(dst)
    try:
        with pytest.raises(DestinationBusyError) as info:
            rk.Writer(dst, SCHEMA, overwrite=True)
        message = str(info.value)
        assert f"pid {proc.pid} on " in message and "a recordkit.Writer" in message
        assert info.value.holder["pid"] == proc.pid
        cmd = [sys.executable, "-m", "recordkit", "convert", str(_jsonl(tmp_path / "s", 0))]
        run = subprocess.run([*cmd, str(dst), "--overwrite"], capture_output=True, text=True)
        assert (
            run.returncode == 2
            and f"is being written by a recordkit.Writer (pid {proc.pid}" in run.stderr
        )
        names = sorted(os.listdir(dst))
        assert names.count("part-00000.tfrecord") == 1 and "recordkit.json" not in names
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_the_lease_of_a_killed_writer_is_taken_over(tmp_path):
    dst = tmp_path / "d"
    proc = _holder(dst)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert os.path.exists(dst / LEASE_NAME)  # it could not say goodbye
    with rk.Writer(dst, SCHEMA, overwrite=True) as w:
        w.write({"i": 7})
    assert [s["i"] for s in rk.Dataset(dst)] == [7]
    assert not os.path.exists(dst / LEASE_NAME)  # released with the manifest


def test_two_conversions_racing_into_one_folder_never_mix(tmp_path):
    """Two sources converted into one destination at once, five times: each time one
    finishes and the other is refused (or finds the first's dataset); the dataset is
    always one source's records, whole."""
    a, b = _jsonl(tmp_path / "a", 0), _jsonl(tmp_path / "b", 100_000)
    whole = {str(a): list(range(2400)), str(b): list(range(100_000, 102_400))}
    for trial in range(5):
        dst = tmp_path / f"d{trial}"
        cmds = [
            [sys.executable, "-m", "recordkit", "convert", str(src), str(dst), "--from", "jsonl",
             "--workers", "1", "--partition-size", "1", "--progress", "none"]
            for src in (a, b)
        ]  # fmt: skip
        procs = [subprocess.Popen(c, stderr=subprocess.PIPE, text=True) for c in cmds]
        outs = [p.communicate(timeout=120)[1] for p in procs]
        codes = [p.returncode for p in procs]
        assert sorted(codes) == [0, 2], outs
        loser = outs[codes.index(2)]
        assert "is being written by recordkit convert" in loser or "already holds" in loser
        got = sorted(int(s["i"]) for s in rk.Dataset(dst))
        source = rk.Dataset(dst).metadata["convert"]["source"]
        assert got == whole[source]
        assert rk.verify(dst).ok


def test_a_writer_refuses_a_folder_of_foreign_tfrecords(tmp_path, caplog):
    """Its manifest would hide them from every reader: refused without overwrite."""
    with rk.Writer(tmp_path / "other", SCHEMA, max_records=100) as w:
        for i in range(500):
            w.write({"i": i})
    dst = tmp_path / "d"
    dst.mkdir()
    for f in sorted((tmp_path / "other").glob("*.tfrecord")):
        (dst / f"foreign-{f.name}").write_bytes(f.read_bytes())  # TFRecords, no manifest
    with pytest.raises(DatasetExistsError, match=r"holds 5 TFRecord file\(s\) this writer"):
        rk.Writer(dst, SCHEMA)
    assert len(rk.Dataset(dst)) == 500  # still readable as the foreign folder it is
    assert not os.path.exists(dst / LEASE_NAME)  # the refused writer let go
    with rk.Writer(dst, SCHEMA, overwrite=True) as w:  # told to: it is the dataset now
        w.write({"i": 1})
    assert "not part of the dataset" in caplog.text and len(rk.Dataset(dst)) == 1


def test_a_prefix_that_looks_like_a_temp_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"must not contain '\.tmp-'"):
        rk.Writer(tmp_path / "d", SCHEMA, prefix="x.tmp-y")
    with pytest.raises(ValueError, match=r"must not contain '\.tmp-'"):
        rk.conversion.ConvertOptions(prefix="x.tmp-y")


@pytest.fixture(scope="module")
def s3():
    from tests.servers import s3_server

    with s3_server() as server:
        yield server


def test_a_lease_object_on_s3_is_created_only_if_absent(tmp_path, s3):
    pytest.importorskip("s3fs")
    url = f"{s3.bucket()}/d"
    with Lease(url, s3.storage_options, what="first"):
        with pytest.raises(DestinationBusyError, match="first"):
            Lease(url, s3.storage_options, what="second").acquire()
        lease = Lease(url, s3.storage_options, what="third", break_lock=True)
        lease.acquire()  # a holder known to be gone: taken over
        lease.release()
    with Lease(url, s3.storage_options):  # released: free again
        pass


@pytest.fixture
def tiny_fs(tmp_path):
    """A 256 KiB tmpfs (skipped where this process may not mount one)."""
    root = tmp_path / "tiny"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(root)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=False)


def test_a_full_disk_is_a_disk_full_error_naming_the_path(tiny_fs):
    import numpy as np

    from recordkit.errors import DiskFullError

    schema = rk.Schema(x=rk.Tensor("uint8", (4096,)))
    writer = rk.Writer(tiny_fs / "d", schema, shard_size="64KiB", fsync=False)
    with pytest.raises(DiskFullError) as info, writer as w:
        for _ in range(200):  # 800 KiB into 256 KiB
            w.write({"x": np.zeros(4096, np.uint8)})
    assert info.value.errno == 28 and str(tiny_fs / "d") in str(info.value)
    assert isinstance(info.value, rk.errors.RecordkitError)
    left = os.listdir(tiny_fs / "d")
    assert not [n for n in left if ".tmp-" in n], left  # nothing half-written
    assert "recordkit.json" not in left and LEASE_NAME not in left
    with pytest.raises(rk.errors.IncompleteDatasetError):
        rk.Dataset(tiny_fs / "d")
