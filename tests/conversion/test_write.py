"""recordkit.write: a function's samples through convert's engine, byte-identical whatever
the workers or engine, resumable after SIGKILL, failures naming the input."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.conversion import ConvertOptions, incomplete_at
from recordkit.errors import (
    DatasetExistsError,
    IncompleteDatasetError,
    PartitionsFailedError,
    SchemaError,
)

from . import _write_fns as fns
from .test_convert import tree

ROOT = str(Path(__file__).resolve().parents[2])
SCRIPT = str(Path(sys.executable).with_name("recordkit"))
pytestmark = pytest.mark.timeout(240)


def _read(path) -> list[tuple[int, int, bytes]]:
    return [(int(s["n"]), int(s["k"]), bytes(s["text"])) for s in rk.Dataset(path)]


def test_byte_identical_whatever_the_workers(tmp_path):
    inputs = range(200)
    trees = []
    for workers in (0, 1, 2):
        out = tmp_path / f"w{workers}"
        result = rk.write(
            fns.squares, inputs, out, schema=fns.SCHEMA, workers=workers, shard_size="1KiB"
        )
        assert result.records == len(fns.expected(inputs)) and result.partitions == 50
        assert result.summary().startswith(f"wrote {result.records} records from 200 inputs")
        trees.append(tree(out))
    assert trees[0] == trees[1] == trees[2]
    assert "part-00000-00000.tfrecord" in trees[0] and "part-00049-00000.tfrecord" in trees[0]
    assert _read(tmp_path / "w2") == fns.expected(inputs)
    ds = rk.Dataset(tmp_path / "w2")
    assert ds.schema == fns.SCHEMA and rk.verify(tmp_path / "w2").ok
    assert ds.metadata["write"] == {"function": "tests.conversion._write_fns:squares"}
    # The same call again: complete with the same plan, nothing to do.
    again = rk.write(fns.squares, inputs, tmp_path / "w2", schema=fns.SCHEMA, shard_size="1KiB")
    assert again.resumed == again.partitions == 50 and tree(tmp_path / "w2") == trees[0]
    with pytest.raises(DatasetExistsError, match="different source or options"):
        rk.write(fns.squares, range(201), tmp_path / "w2", schema=fns.SCHEMA, shard_size="1KiB")


def test_what_a_function_may_give_and_be(tmp_path):
    one = "tests.conversion._write_fns:one"
    result = rk.write(one, range(10), tmp_path / "a", schema=fns.SCHEMA)
    assert [s[0] for s in _read(tmp_path / "a")] == [0, 2, 4, 6, 8] and result.partitions == 10
    rk.write(fns.Tagged("t"), range(3), tmp_path / "b", schema=fns.SCHEMA, workers=2)
    assert _read(tmp_path / "b") == [(0, 1, b"t"), (1, 1, b"t"), (2, 1, b"t")]
    add = functools.partial(fns.Tagged.__call__, fns.Tagged("p"))
    rk.write(add, [5], tmp_path / "c", schema=fns.SCHEMA, workers=1)
    assert _read(tmp_path / "c") == [(5, 1, b"p")]
    with pytest.raises(PartitionsFailedError) as info:
        rk.write(fns.not_a_sample, [7], tmp_path / "d", schema=fns.SCHEMA, workers=0)
    (err,) = info.value.exceptions
    assert isinstance(err, SchemaError) and "sample 1: " in str(err) and "not a mapping" in str(err)
    assert "while converting input '7'" in err.__notes__


def test_functions_writers_cannot_import_are_refused_up_front(tmp_path):
    schema = fns.SCHEMA
    with pytest.raises(TypeError, match=r"fn is a lambda .*define it with `def` at the top level"):
        rk.write(lambda n: {"n": n}, [1], tmp_path / "o", schema=schema, workers=0)

    def inner(n):
        return {"n": n}

    with pytest.raises(TypeError, match="'inner' is defined inside test_functions_writers"):
        rk.write(inner, [1], tmp_path / "o", schema=schema, workers=0)
    namespace: dict = {"__name__": "notebook_cell"}
    exec("def cell(n):\n    return {'n': n, 'k': 0, 'text': ''}\n", namespace)
    with pytest.raises(TypeError, match="writer processes cannot import notebook_cell:cell"):
        rk.write(namespace["cell"], [1], tmp_path / "o", schema=schema, workers=2)
    rk.write(namespace["cell"], [1], tmp_path / "o", schema=schema, workers=0)  # in-process
    with pytest.raises(ImportError, match="has no 'nope'"):
        rk.write("tests.conversion._write_fns:nope", [1], tmp_path / "p", schema=schema)
    with pytest.raises(ValueError, match="expected module:function"):
        rk.write("squares", [1], tmp_path / "p", schema=schema)
    # A function from an interactive session (python -c): only workers=0 can call it.
    code = textwrap.dedent(
        """
        import recordkit as rk
        def f(n):
            return {"n": n}
        try:
            rk.write(f, [1], "o", schema=rk.Schema(n=rk.Int64()), workers=2)
        except TypeError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert "__main__:f is defined in an interactive session" in out.stdout, out.stderr


_JOB = """
import recordkit as rk

def make(n):
    yield {{"n": n * n}}

{call}
"""
_CALL = 'rk.write(make, range(20), "out", schema=rk.Schema(n=rk.Int64()), workers=2)'


@pytest.mark.parametrize("guarded", [True, False])
def test_a_function_in_the_users_script(tmp_path, guarded):
    if guarded:
        call = f'if __name__ == "__main__":\n    print({_CALL}.records)'
    else:
        call = f"try:\n    {_CALL}\nexcept rk.errors.PartitionsFailedError as e:\n"
        call += "    print(e.exceptions[0])"
    (tmp_path / "job.py").write_text(_JOB.format(call=call))
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "job.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    if guarded:
        assert out.stdout.split() == ["20"]
        assert [int(s["n"]) for s in rk.Dataset(tmp_path / "out")] == [n * n for n in range(20)]
    else:  # the writers load job.py to find make(), which starts a write again: refused
        assert "job.py started recordkit.write while a recordkit child process" in out.stdout
        assert 'if __name__ == "__main__":' in out.stdout


def test_inputs_and_options_are_checked(tmp_path):
    def go(inputs, **kw):
        return rk.write(fns.squares, inputs, tmp_path / "o", schema=fns.SCHEMA, workers=0, **kw)

    with pytest.raises(TypeError, match=r"input 1 is a object; inputs must be JSON values"):
        go([1, object()])
    with pytest.raises(TypeError, match="input 0 is nan"):
        go([float("nan")])
    with pytest.raises(ValueError, match="inputs is empty"):
        go([])
    with pytest.raises(ValueError, match="inputs_per_partition must be positive"):
        go([1], inputs_per_partition=0)
    with pytest.raises(ValueError, match=r"not options\.partition_items"):
        go([1], options=ConvertOptions(partition_items=3))
    with pytest.raises(ValueError, match="are recordkit's own"):
        go([1], metadata={"convert": 1})
    given = [Path("a"), ("b", 1), {"c": [2.5, None, True]}, 3]
    result = rk.write(
        fns.describe, given, tmp_path / "d", schema=fns.SCHEMA, workers=1, inputs_per_partition=2
    )
    assert result.partitions == 2 and result.items == 4
    texts = [bytes(s["text"]).decode() for s in rk.Dataset(tmp_path / "d")]
    assert texts == [repr(x) for x in given]  # the inputs as given, not as JSON


def test_a_raising_input_is_named_and_a_rerun_resumes(tmp_path, monkeypatch):
    bad = tmp_path / "bad"
    bad.mkdir()
    for n in (13, 27):
        (bad / str(n)).touch()
    monkeypatch.setenv("RK_TEST_FAIL_DIR", str(bad))  # inherited by the writer processes
    run = dict(schema=fns.SCHEMA, workers=2, shard_size="1KiB", inputs_per_partition=5)
    ref = rk.write(fns.squares, range(40), tmp_path / "ref", **run)
    with pytest.raises(PartitionsFailedError) as info:
        rk.write(fns.fails_where_told, range(40), tmp_path / "out", **run)
    group = info.value
    said = "2 of 8 partitions failed writing the samples of tests.conversion._write_fns:"
    assert said in str(group)
    first, second = group.exceptions
    assert type(first) is ValueError and str(first) == "input 13 is unlucky"
    assert "while converting input '13'" in first.__notes__
    assert "partition 2 (part-00002-*), inputs: 10, 11, 12, ... (5 items)" in first.__notes__
    assert str(second) == "input 27 is unlucky" and "partition 5 " in second.__notes__[-1]
    found = incomplete_at(tmp_path / "out")
    assert found is not None and (found.writer, found.published, found.total) == ("write", 6, 8)
    with pytest.raises(IncompleteDatasetError, match=r"a recordkit.write was interrupted here"):
        rk.Dataset(tmp_path / "out")
    for f in bad.iterdir():
        f.unlink()
    result = rk.write(fns.fails_where_told, range(40), tmp_path / "out", **run)
    assert result.resumed == 6
    # Byte-identical to an uninterrupted run of the same function (but for its name).
    ref_tree, got = tree(tmp_path / "ref"), tree(tmp_path / "out")
    assert ref_tree.keys() == got.keys()
    assert all(got[n] == ref_tree[n] for n in got if n != "recordkit.json")
    assert _read(tmp_path / "out") == fns.expected(range(40)) and ref.records == result.records


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_cli_killed_with_sigkill_then_rerun_is_byte_identical(tmp_path):
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(f"{n}\n" for n in range(150)))
    rk.write(fns.squares, range(150), tmp_path / "ref", schema=fns.SCHEMA, workers=0,
             shard_size="1KiB", inputs_per_partition=3)  # fmt: skip
    cmd = [
        SCRIPT, "write", "tests.conversion._write_fns:slow_squares", str(inputs),
        str(tmp_path / "out"),
        "--schema", fns.SPEC, "--workers", "2", "--shard-size", "1KiB",
        "--inputs-per-partition", "3", "--progress", "none",
    ]  # fmt: skip
    state = tmp_path / "out" / ".recordkit-convert"
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if state.exists() and len(list(state.glob("*.done.json"))) >= 5:
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGKILL)  # the parent only: its writers must follow
        proc.wait(60)
        assert _wait_group_gone(proc.pid, 20), "writer processes outlived their parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
    found = incomplete_at(tmp_path / "out")
    assert found is not None and found.writer == "write" and 5 <= found.published < 50
    with pytest.raises(IncompleteDatasetError, match=r"rerun the same `recordkit\.write"):
        rk.Dataset(tmp_path / "out")
    rerun = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    records = len(fns.expected(range(150)))
    assert f"{found.published} resumed" in rerun.stderr
    assert f"wrote {records} records" in rerun.stderr
    ref, got = tree(tmp_path / "ref"), tree(tmp_path / "out")
    assert ref.keys() == got.keys()
    assert all(got[n] == ref[n] for n in got if n != "recordkit.json")  # the function's name
    manifest = json.loads(got["recordkit.json"])
    assert manifest["metadata"]["write"]["function"] == "tests.conversion._write_fns:slow_squares"


def test_cli_inputs_progress_and_errors(tmp_path):
    (tmp_path / "urls.txt").write_text("a\nbb\n\nccc\n")
    fn = "tests.conversion._write_fns:not_a_sample"
    cmd = [SCRIPT, "write", fn, "range:3", str(tmp_path / "o")]
    out = subprocess.run(
        [sys.executable, "-m", "recordkit", "write", "mod_here:lengths",
         str(tmp_path / "urls.txt"), str(tmp_path / "w"), "--schema", "s:bytes,n:int64",
         "--workers", "1", "--log-interval", "0"],
        cwd=_module_dir(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "wrote 3 records from 3 inputs" in out.stderr
    assert "3/3 inputs (100%)" in out.stderr and "ETA" in out.stderr  # log lines: not a tty
    assert [(bytes(s["s"]), int(s["n"])) for s in rk.Dataset(tmp_path / "w")] == [
        (b"a", 1), (b"bb", 2), (b"ccc", 3)
    ]  # fmt: skip
    bad = subprocess.run([*cmd, "--schema", fns.SPEC], cwd=ROOT, capture_output=True, text=True)
    err = bad.stderr
    assert bad.returncode == 1 and "recordkit write: error: 3 of 3 partitions failed" in err
    assert "  SchemaError: sample 1: tests.conversion._write_fns:not_a_sample gave a list" in err
    assert "    while converting input '0'\n    partition 0 (part-00000-*), inputs: 0\n" in err
    missing = subprocess.run(
        [SCRIPT, "write", "no_such_module:f", "range:3", str(tmp_path / "x"),
         "--schema", "n:int64"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "recordkit write: error: No module named 'no_such_module'" in missing.stderr


def _module_dir(tmp_path: Path) -> Path:
    """A folder holding ``mod_here.py``, a module only the current directory provides."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "mod_here.py").write_text(
        "def lengths(line):\n    return {'s': line, 'n': len(line)}\n"
    )
    return here


@pytest.mark.slow
def test_dask_local_cluster_is_byte_identical(tmp_path):
    distributed = pytest.importorskip("distributed")
    run = dict(schema=fns.SCHEMA, shard_size="1KiB", inputs_per_partition=7)
    rk.write(fns.squares, range(60), tmp_path / "local", workers=0, **run)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:  # fmt: skip
        result = rk.write(
            fns.squares, range(60), tmp_path / "dask", engine="dask",
            scheduler=cluster.scheduler_address, **run,
        )  # fmt: skip
        assert result.partitions == 9
    assert tree(tmp_path / "dask") == tree(tmp_path / "local")
