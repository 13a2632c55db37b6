"""The Ray engine on a local Ray writes exactly what the local engine writes, reports a
failing partition by name, and resumes after failures and after its driver is SIGKILLed.

One local Ray (2 CPUs, no dashboard) serves the module; ``engine="ray"`` without an
address runs on it (the Ray this process is connected to) and leaves it up. The
command-line runs start their own local Ray, which they shut down when done.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import recordkit as rk
from recordkit import converters
from recordkit._procs import RemoteTraceback
from recordkit.conversion import incomplete_at
from recordkit.conversion.engines import RayEngine
from recordkit.errors import ConvertError, PartitionsFailedError

from . import _write_fns as fns
from ._sources import DyingOnceJsonl, KillingJsonl, PickyJsonl
from .cases import assert_samples_equal, numpy_npz, read_all
from .test_convert import _rows, tree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = rk.Schema(id=rk.Int64(), text=rk.Bytes(), v=rk.Int64((2,)))
RUN_TIMEOUT_S = 120
# Ray's per-node agents outlive a SIGKILLed driver by about a minute before they notice
# (Ray's own behaviour); everything that can write, the workers included, goes at once.
RAY_AGENTS = ("ray::DashboardA", "ray::RuntimeEnv")


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    # "local": a Ray of its own, never one another user started on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _sources():
    for cls in (KillingJsonl, PickyJsonl, DyingOnceJsonl):
        converters.register(cls.name, cls)


def _in_writer(src, dst, fmt: str, at: str, **kw):
    """A conversion whose source misbehaves on item ``at`` in a process not this one."""
    options = {"at": at, "parent": os.getpid(), **kw.pop("source_options", {})}
    return rk.convert(
        src, dst, format=fmt, shard_size="2KiB", schema=SCHEMA, source_options=options, **kw
    )


def test_ray_is_byte_identical_to_the_local_engine(tmp_path, ray):
    expected = _rows(tmp_path / "src", files=5)
    rk.convert(tmp_path / "src", tmp_path / "local", format="jsonl", workers=2, shard_size="2KiB")
    result = rk.convert(
        tmp_path / "src", tmp_path / "ray", format="jsonl", engine="ray", shard_size="2KiB"
    )
    assert result.partitions == 5 and result.resumed == 0
    assert ray.is_initialized()  # the caller's Ray: used, and left as it was
    local, on_ray = tree(tmp_path / "local"), tree(tmp_path / "ray")
    # Every file byte for byte, the manifest included: it holds no timestamp, and the
    # listing of the source beside it none either.
    assert sorted(on_ray) == sorted(local)
    assert {"recordkit.json", ".recordkit-source.json.zst"} <= on_ray.keys()
    assert sum(n.endswith(".tfrecord") for n in on_ray) == sum(n.endswith(".idx") for n in on_ray)
    assert sum(n.endswith(".tfrecord") for n in on_ray) >= 5
    assert [n for n in on_ray if on_ray[n] != local[n]] == []
    assert_samples_equal(read_all(tmp_path / "ray"), expected)

    # A second source: numpy with zstd-compressed tensors.
    numpy_src = tmp_path / "np"
    numpy_src.mkdir()
    _, np_expected = numpy_npz(numpy_src)
    run = dict(format="numpy", compress="zstd", shard_size="1KiB")
    rk.convert(numpy_src, tmp_path / "np-ray", engine="ray", **run)
    rk.convert(numpy_src, tmp_path / "np-local", workers=2, **run)
    assert tree(tmp_path / "np-ray") == tree(tmp_path / "np-local")
    assert_samples_equal(read_all(tmp_path / "np-ray"), np_expected)


def test_a_failing_partition_is_named_and_a_rerun_redoes_only_it(tmp_path, ray):
    _rows(tmp_path / "src")
    _in_writer(tmp_path / "src", tmp_path / "ref", "picky-jsonl", "", workers=2)
    with pytest.raises(PartitionsFailedError) as info:
        _in_writer(tmp_path / "src", tmp_path / "out", "picky-jsonl", "f03.jsonl", engine="ray")
    assert "1 of 6 partitions failed converting" in str(info.value)
    (err,) = info.value.exceptions
    # PickyError does not pickle: its summary, its notes and its traceback still cross.
    assert type(err) is ConvertError and str(err) == "PickyError: row 2: no good"
    assert "while converting source item 'f03.jsonl'" in err.__notes__
    assert "partition 3 (part-00003-*), source items: f03.jsonl" in err.__notes__
    assert isinstance(err.__cause__, RemoteTraceback) and "misbehave" in str(err.__cause__)
    state = tmp_path / "out" / ".recordkit-convert"
    done = [f"part-{i:05d}.done.json" for i in (0, 1, 2, 4, 5)]
    assert sorted(p.name for p in state.glob("*.done.json")) == done
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*") if p.is_file()}
    assert kept and not [n for n in kept if n.startswith("part-00003-")]

    result = _in_writer(tmp_path / "src", tmp_path / "out", "picky-jsonl", "", engine="ray")
    assert result.resumed == 5
    # Only partition 3 was written again: the others' files are the same files.
    assert {n: (tmp_path / "out" / n).stat().st_mtime_ns for n in kept} == kept
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")


def test_a_lost_worker_is_retried_and_leaves_nothing_behind(tmp_path, ray):
    _rows(tmp_path / "src", files=4)
    once = {"once": str(tmp_path / "once")}
    args = (tmp_path / "src", tmp_path / "ref", "dying-once-jsonl", "f01.jsonl")
    _in_writer(*args, workers=0, source_options=once)  # in this process: it never dies
    assert not (tmp_path / "once").exists()
    result = _in_writer(
        tmp_path / "src", tmp_path / "out", "dying-once-jsonl", "f01.jsonl", engine="ray",
        source_options=once,
    )  # fmt: skip
    assert (tmp_path / "once").exists()  # its first worker was killed mid-shard
    assert result.resumed == 0
    # Ray ran the task again; the dead attempt's temp file is gone before the manifest.
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")


def test_a_worker_that_always_dies_fails_its_partition_only(tmp_path, ray):
    _rows(tmp_path / "src", files=3)
    _in_writer(tmp_path / "src", tmp_path / "ref", "killing-jsonl", "", workers=0)
    with pytest.raises(PartitionsFailedError) as info:
        _in_writer(tmp_path / "src", tmp_path / "out", "killing-jsonl", "f02.jsonl", engine="ray")
    (err,) = info.value.exceptions
    assert isinstance(err, ConvertError)
    assert str(err).startswith("partition 2: its Ray worker died (")
    assert "3 times; out of memory, or killed?" in str(err)
    assert "partition 2 (part-00002-*), source items: f02.jsonl" in err.__notes__
    result = _in_writer(tmp_path / "src", tmp_path / "out", "killing-jsonl", "", engine="ray")
    assert result.resumed == 2 and tree(tmp_path / "out") == tree(tmp_path / "ref")


def test_write_on_ray(tmp_path, ray):
    run = dict(schema=fns.SCHEMA, shard_size="1KiB", inputs_per_partition=7)
    bad = tmp_path / "bad"
    bad.mkdir()
    fn = functools.partial(fns.fails_in, str(bad))
    rk.write(fn, range(60), tmp_path / "local", workers=2, **run)
    (bad / "17").touch()
    with pytest.raises(PartitionsFailedError) as info:
        rk.write(fn, range(60), tmp_path / "ray", engine="ray", **run)
    (err,) = info.value.exceptions
    assert type(err) is ValueError and str(err) == "input 17 is unlucky"
    assert "while converting input '17'" in err.__notes__
    assert "partition 2 (part-00002-*), inputs: 14, 15, 16, ... (7 items)" in err.__notes__
    (bad / "17").unlink()
    result = rk.write(fn, range(60), tmp_path / "ray", engine="ray", **run)
    assert (result.partitions, result.resumed) == (9, 8)
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    with rk.Dataset(tmp_path / "ray") as ds:
        got = [(int(s["n"]), int(s["k"]), bytes(s["text"])) for s in ds]
    assert got == fns.expected(range(60))


def test_an_address_while_connected_is_refused(ray):
    with pytest.raises(ConvertError, match=r"already connected to Ray .* ray.shutdown\(\)"):
        next(RayEngine(address="auto").run([], lambda *_: None))


# -- the command line, each run on a local Ray of its own --------------------------------------


def _source(root: Path, files: int = 40, rows: int = 1500) -> None:
    root.mkdir()
    for f in range(files):
        with open(root / f"f{f:02d}.jsonl", "w") as fh:
            for i in range(rows):
                fh.write(json.dumps({"id": f * rows + i, "text": "t" * (i % 40)}) + "\n")


def _cli(src: Path, dst: Path, engine: str) -> list[str]:
    return [
        sys.executable, "-m", "recordkit", "convert", str(src), str(dst), "--from", "jsonl",
        "--engine", engine, "--workers", "2", "--shard-size", "16KiB", "--partition-size", "1",
        "--progress", "none",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    """This checkout's recordkit, and a local Ray (no RAY_ADDRESS)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "PYTHONPATH": str(ROOT)}


def _session(sid: int) -> list[tuple[int, str]]:
    """(pid, name) of every process in session ``sid`` (the command and all it started)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:  # state ppid pgrp session ...
            found.append((int(stat.parent.name), name))
    return found


def _wait_session(sid: int, timeout: float, ignore: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """The processes of ``sid`` (but ``ignore``d names) still there after up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in _session(sid) if p[1] not in ignore]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _end_session(sid: int) -> None:
    for pid, _ in _session(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _done(dst: Path) -> int:
    state = dst / ".recordkit-convert"
    return len(list(state.glob("*.done.json"))) if state.exists() else 0


def test_cli_killed_with_sigkill_then_rerun_is_byte_identical(tmp_path):
    pytest.importorskip("ray")
    src, ref, out = tmp_path / "src", tmp_path / "ref", tmp_path / "out"
    _source(src)
    local = subprocess.run(
        _cli(src, ref, "local"), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=_env()
    )
    assert local.returncode == 0, local.stderr

    proc = subprocess.Popen(
        _cli(src, out, "ray"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=_env(),  # its own session: whatever it starts is in it
    )  # fmt: skip
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while _done(out) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
        proc.send_signal(signal.SIGKILL)  # the driver only: Ray and its workers must follow
        proc.wait(timeout=30)
        left = _wait_session(proc.pid, timeout=30, ignore=RAY_AGENTS)
        assert left == [], f"outlived their driver: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()
        _end_session(proc.pid)  # Ray's agents, which would go on their own within a minute
    found = incomplete_at(out)
    assert found is not None and found.writer == "convert" and 3 <= found.published < 40
    assert not (out / "recordkit.json").exists()

    rerun = subprocess.Popen(
        _cli(src, out, "ray"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env=_env(),
    )  # fmt: skip
    try:
        _, err = rerun.communicate(timeout=RUN_TIMEOUT_S)
        assert rerun.returncode == 0, err
        # The Ray it started, it shut down: nothing of it is left.
        assert _wait_session(rerun.pid, timeout=20) == []
    finally:
        if rerun.poll() is None:
            rerun.kill()
        rerun.wait()
        _end_session(rerun.pid)
    assert "resumed" in err.splitlines()[-1], err
    got = tree(out)
    assert not [n for n in got if ".tmp-" in n or ".recordkit-convert" in n]
    assert got == tree(ref)
