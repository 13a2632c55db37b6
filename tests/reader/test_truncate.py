"""A shard truncated under a reader is a ShardChangedError (or a verify problem), never SIGBUS.

Every case runs in a subprocess: a reader that still dies of SIGBUS shows as exit
-7 and fails its test instead of killing pytest. The subprocess opens its reader
(which maps the shards), reads, truncates the shard it is reading to half its
size with ``os.truncate`` (what ``rsync --inplace`` or a rewrite does to a mapped
file), reads on, and prints what it got as JSON.

The readers check a shard's size before each read; the ``race`` cases switch those
checks off in the subprocess, which is what a cut landing just after a check looks
like: then only the native SIGBUS guard stands between the reader and the signal
(the pure-Python paths have no guard, so they have no such case).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.format import guard

try:
    from recordkit.native import _ext as _native
except ImportError:  # built without a compiler
    _native = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = rk.Schema(x=rk.Int64(), data=rk.Bytes())
# One shard of many records: far more than a reader decodes ahead of the first batch
# (a few tasks of 4096 records), so the truncated half is still to be read.
RECORDS = 40_000
SHARD = "part-00000.tfrecord"

needs_native = pytest.mark.skipif(_native is None, reason="recordkit.native._ext is not built")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("truncate") / "ds"
    rng = np.random.default_rng(0)
    with rk.Writer(root, SCHEMA) as w:
        for i in range(RECORDS):
            w.write({"x": i, "data": rng.bytes(int(rng.integers(40, 120)))})
    assert [p.name for p in root.glob("*.tfrecord")] == [SHARD]
    return root


@pytest.fixture
def ds(built, tmp_path):
    """A fresh copy of the dataset (each test truncates its shard)."""
    return Path(shutil.copytree(built, tmp_path / "ds"))


_PRELUDE = """
import json, os, sys
import recordkit as rk
from recordkit.errors import ShardChangedError
root = sys.argv[1]
shard = os.path.join(root, "part-00000.tfrecord")

def cut():
    os.truncate(shard, os.path.getsize(shard) // 2)

if sys.argv[2] == "race":  # a cut just after every size check: only the guard is left
    from recordkit.format import guard
    from recordkit.reader import shards as _shards
    guard.check_size = lambda *args, **kwargs: None
    if hasattr(_shards.MappedShard, "check"):
        _shards.MappedShard.check = lambda self: None

def report(exc):
    print(json.dumps({"type": type(exc).__name__, "path": exc.path, "offset": exc.offset,
                      "record": exc.record, "message": str(exc)}))
    sys.exit(0)
"""


def run(script: str, root: Path, env: dict[str, str] | None = None, race: bool = False) -> dict:
    """Run the reader script; return its JSON report (fails on a signal or no report)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    code = _PRELUDE + textwrap.dedent(script)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(root), "race" if race else "checked"],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,  # python -c puts the working directory first on sys.path
        timeout=120,
    )
    assert proc.returncode >= 0, (
        f"the reader died of signal {-proc.returncode} "
        f"({signal.Signals(-proc.returncode).name}):\n{proc.stderr[-3000:]}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_cut(root: Path) -> int:
    """The first record that cutting the shard to half its size takes."""
    entries = np.loadtxt(root / (SHARD + ".idx"), dtype=np.int64)
    half = int(entries[-1].sum()) // 2
    return int(np.flatnonzero(entries.sum(axis=1) > half)[0])


def assert_changed(got: dict, root: Path, race: bool, record: int | range) -> None:
    """A ShardChangedError naming the shard and an offset; and the record read when the
    cut was found, where the guard found it (a check of a whole shard before a task,
    when the shard set makes one, may know no record)."""
    assert got["type"] == "ShardChangedError", got
    assert got["path"] == str(root / SHARD), got
    assert "changed while being read" in got["message"], got
    assert got["offset"] is not None, got
    if race or got["record"] is not None:
        assert got["record"] in (record if isinstance(record, range) else [record]), got


NO_NATIVE = {"RECORDKIT_NO_NATIVE": "1"}
# (environment, race): the native paths with and without the size checks, the
# pure-Python ones (no guard) with them.
IMPLS = [
    pytest.param({}, False, id="native", marks=needs_native),
    pytest.param({}, True, id="native-race", marks=needs_native),
    pytest.param(NO_NATIVE, False, id="python"),
]

# -------------------------------------------------------------------- recordkit.Dataset


@pytest.mark.parametrize(("env", "race"), IMPLS)
def test_dataset_iteration(ds, env, race):
    got = run(
        """
        with rk.Dataset(root) as ds:
            it = iter(ds)
            next(it)
            cut()
            try:
                for _ in it:
                    pass
            except ShardChangedError as exc:
                report(exc)
        print(json.dumps({"type": None}))
        """,
        ds,
        env,
        race,
    )
    # the next record read after the cut; with no size check, the first the cut took
    assert_changed(got, ds, race, first_cut(ds) if race else 1)


@pytest.mark.parametrize(("env", "race"), IMPLS)
def test_dataset_getitem(ds, env, race):
    got = run(
        f"""
        with rk.Dataset(root) as ds:
            ds[0]
            cut()
            try:
                ds[{RECORDS - 1}]
            except ShardChangedError as exc:
                report(exc)
        print(json.dumps({{"type": None}}))
        """,
        ds,
        env,
        race,
    )
    assert_changed(got, ds, race, RECORDS - 1)


# ---------------------------------------------------------------------- torch readers


_THREADS = {"RECORDKIT_NATIVE_TASKS": "0"}


# The loader process is a fresh interpreter that keeps its size checks: no race case.
@pytest.mark.torch
@pytest.mark.parametrize(
    ("env", "race", "process"),
    [
        pytest.param({}, False, False, id="runner", marks=needs_native),
        pytest.param({}, True, False, id="runner-race", marks=needs_native),
        pytest.param(_THREADS, False, False, id="threads", marks=needs_native),
        pytest.param(_THREADS, True, False, id="threads-race", marks=needs_native),
        pytest.param(NO_NATIVE, False, False, id="python"),
        pytest.param({}, False, True, id="loader-process", marks=needs_native),
        pytest.param(_THREADS, False, True, id="loader-process-threads", marks=needs_native),
        pytest.param(NO_NATIVE, False, True, id="loader-process-python"),
    ],
)
def test_record_dataset(ds, env, race, process):
    pytest.importorskip("torch")
    got = run(
        f"""
        import recordkit.torch as rkt
        read = rkt.ReadOptions(num_threads=1, prefetch=1, reader_process={process})
        data = rkt.RecordDataset(root, batch_size=8, options=read)
        it = iter(data)
        next(it)
        cut()
        try:
            for _ in it:
                pass
        except ShardChangedError as exc:
            report(exc)
        print(json.dumps({{"type": None}}))
        """,
        ds,
        env,
        race,
    )
    # where the cut fell in a task: the record a page past it starts (records are
    # about 100 bytes), or the first record read after the cut when it is checked
    assert_changed(
        got, ds, race, range(first_cut(ds), first_cut(ds) + 64) if race else range(RECORDS)
    )


@pytest.mark.torch
@pytest.mark.parametrize(("env", "race"), IMPLS)
def test_record_map_dataset(ds, env, race):
    pytest.importorskip("torch")
    got = run(
        f"""
        import recordkit.torch as rkt
        data = rkt.RecordMapDataset(root)
        data[0]
        cut()
        try:
            data.__getitems__([1, {RECORDS - 2}, {RECORDS - 1}])
        except ShardChangedError as exc:
            report(exc)
        print(json.dumps({{"type": None}}))
        """,
        ds,
        env,
        race,
    )
    assert_changed(got, ds, race, RECORDS - 2)  # the first record the cut took


# ------------------------------------------------------------------------- rk.verify


@pytest.mark.parametrize(("env", "race"), IMPLS)
def test_verify_reports_a_shard_cut_after_it_was_mapped(ds, env, race):
    got = run(
        """
        import recordkit.verify
        v = sys.modules["recordkit.verify"]  # recordkit.verify is also the function
        real = v.open_map

        def open_then_cut(path):
            buf = real(path)
            if path == shard:
                cut()
            return buf

        v.open_map = open_then_cut  # the shard is cut between its mapping and its reads
        report_ = rk.verify(root)
        print(json.dumps({"type": "report", "problems": [
            [p.path, p.offset, p.record, p.message] for p in report_.problems]}))
        """,
        ds,
        env,
        race,
    )
    assert got["type"] == "report", got
    changed = [p for p in got["problems"] if "changed while being read" in p[3]]
    assert changed, got
    assert changed[0][0] == str(ds / SHARD)


# ----------------------------------------------------------------- the native guard


@pytest.mark.parametrize(("env", "race"), IMPLS)
def test_index_validation_on_a_cut_map(ds, env, race):
    """What a lazily mapped shard set runs when it maps a shard mid-epoch."""
    got = run(
        """
        from recordkit.format.index import load_index, open_map, validate_index
        buf = open_map(shard)
        entries = load_index(shard + ".idx")
        cut()
        try:
            validate_index(entries, buf, path=shard)
        except ShardChangedError as exc:
            report(exc)
        print(json.dumps({"type": None}))
        """,
        ds,
        env,
        race,
    )
    # the length field the cut took first (a page past it), or none when checked first
    assert_changed(got, ds, race, range(first_cut(ds), first_cut(ds) + 64))


@needs_native
def test_guarded_native_calls_raise_instead_of_sigbus(tmp_path):
    """Every guarded call, on a map whose file was cut, raises MapFault (twice, and on
    another thread: the guard leaves SIGBUS unblocked and works on any thread)."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 20))
    script = f"""
    import mmap, threading
    import numpy as np
    from recordkit.native import _ext as n
    from recordkit.format import guard
    f = open({str(path)!r}, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate({str(path)!r}, 100)
    i64 = lambda *v: np.array(v, np.int64)
    calls = {{
        "crc32c": lambda: n.crc32c(m),
        "read": lambda: n.read(m, 500_000, 1000),
        "gather": lambda: n.gather(m, i64(0, 600_000), i64(10, 10), bytearray(20), 10),
        "varints": lambda: n.varints(m, i64(700_000), i64(1), i64(1), np.zeros(1, np.int64)),
        "bytes_lists": lambda: n.bytes_lists(m, i64(0, 650_000), i64(10, 10), None),
        "bytes_lists-walk": lambda: n.bytes_lists(m, i64(660_000), i64(10), i64(2)),
        "parse_batch": lambda: n.parse_batch(m, i64(0, 800_000), i64(100, 100), (b"a",), True),
        "gather_verified": lambda: n.gather_verified(
            m, i64(900_000), i64(1000), i64(900_012), i64(10), bytearray(10), 10),
    }}
    got = {{}}

    def all_calls(tag):
        for name, call in calls.items():
            try:
                call()
                got[tag + name] = None
            except n.MapFault as exc:
                got[tag + name] = list(exc.args[1:])

    all_calls("")
    all_calls("again-")
    t = threading.Thread(target=all_calls, args=("thread-",))
    t.start()
    t.join()
    try:
        guard.read(m, 500_000, 10, path="f.bin", offset=5, record=6)
    except ShardChangedError as exc:
        got["guard"] = str(exc)
    print(json.dumps({{"type": "calls", "got": got, "crc": n.crc32c(m[:100])}}))
    """
    got = run(script, tmp_path)
    calls = got["got"]
    assert len(calls) == 8 * 3 + 1
    for tag in ("", "again-", "thread-"):
        assert calls[tag + "parse_batch"] == [1, 800_000], calls
        assert calls[tag + "varints"] == [0, 700_000], calls
        assert calls[tag + "bytes_lists"][0] == 1, calls  # the copy: value 1
        assert 650_000 <= calls[tag + "bytes_lists"][1] < 650_010, calls
        assert calls[tag + "bytes_lists-walk"] == [0, 660_010], calls  # the walk: record 0
        assert calls[tag + "gather_verified"][0] == 0, calls
        assert 900_012 <= calls[tag + "gather_verified"][1] < 900_022, calls
        assert calls[tag + "gather"][0] == 1, calls
        assert 600_000 <= calls[tag + "gather"][1] < 600_010, calls
        assert calls[tag + "read"][1] >= 500_000, calls
        assert calls[tag + "crc32c"][1] >= 100, calls
    assert calls["guard"] == (
        "f.bin:5:6: shard is 100 bytes, its index says 1048576: it changed while being read"
    )
    assert isinstance(got["crc"], int)  # the map's first page still reads


@needs_native
@pytest.mark.parametrize("faulthandler", [False, True], ids=["plain", "faulthandler"])
def test_sigbus_outside_a_guard_still_kills(tmp_path, faulthandler):
    """The handler chains: an unguarded read of a vanished page (Python's own mmap
    copy) still dies of SIGBUS, through faulthandler's report when it is enabled."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 20))
    script = f"""
    import mmap
    from recordkit.native import _ext as _native  # installs the handler
    f = open({str(path)!r}, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate({str(path)!r}, 100)
    try:
        _native.read(m, 500_000, 10)
    except _native.MapFault:
        print("guarded", flush=True)
    m[500_000:500_010]  # not guarded
    print("survived", flush=True)
    """
    flags = ["-X", "faulthandler"] if faulthandler else []
    proc = subprocess.run(
        [sys.executable, *flags, "-c", _PRELUDE + textwrap.dedent(script), str(tmp_path), "-"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=60,
    )
    assert proc.stdout == "guarded\n", (proc.stdout, proc.stderr)
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr)
    if faulthandler:
        assert "Fatal Python error: Bus error" in proc.stderr, proc.stderr


def test_read_twins_agree():
    from recordkit.reader import _fallback

    buf = bytes(range(256)) * 4
    impls = [_fallback] + ([_native] if _native is not None else [])
    for impl in impls:
        assert impl.read(buf, 3, 10) == buf[3:13]
        assert impl.read(memoryview(buf)[100:], 0, 0) == b""
        for start, length in [(-1, 1), (0, 1025), (1024, 1), (5, -1)]:
            with pytest.raises(ValueError, match="outside the buffer"):
                impl.read(buf, start, length)


def test_check_size_and_guarded_reads_on_a_map(tmp_path):
    import mmap

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10_000)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        guard.check_size(m, None, str(path))
        guard.check_size(b"short", 10)  # not a map: nothing can change under it
        assert guard.read(memoryview(m)[10:], 0, 3) == b"xxx"
        with open(path, "ab") as f:  # grown: every page of the map is still there
            f.write(b"y")
        guard.check_size(m, None, str(path))
        assert not guard.shrunk(m)
        os.truncate(path, 9_000)
        assert guard.shrunk(memoryview(m)[5:])
        with pytest.raises(rk.errors.ShardChangedError, match="9000 bytes, its index says 10000"):
            guard.check_size(memoryview(m)[5:], None, str(path), offset=1, record=2)
        with pytest.raises(OSError) as info:  # an OSError, not a ValueError
            guard.read(m, 0, 3, path=str(path), offset=7, record=8)
        assert (info.value.path, info.value.offset, info.value.record) == (str(path), 7, 8)
        assert not isinstance(info.value, ValueError)
    finally:
        m.close()


@needs_native
def test_faulthandler_enabled_after_import_does_not_defeat_the_guard(tmp_path):
    """faulthandler.enable() after import puts its handler in front of ours: a guarded
    fault is then reported by it once, re-raised, and still becomes MapFault."""
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 20))
    script = f"""
    import faulthandler, mmap
    from recordkit.native import _ext as _native
    faulthandler.enable()
    f = open({str(path)!r}, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate({str(path)!r}, 100)
    for _ in range(2):
        try:
            _native.read(m, 500_000, 10)
        except _native.MapFault:
            print("guarded", flush=True)
    """
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(script), str(tmp_path), "-"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stdout == "guarded\nguarded\n", (proc.stdout, proc.stderr)
