"""The engines' own promises: a writer that dies fails its partition only, a silent one is
stopped, exceptions cross from writer processes with their notes, and every engine writes
the same bytes."""

from __future__ import annotations

import glob
import os
import sys

import pytest

import recordkit as rk
from recordkit import converters
from recordkit._procs import RemoteTraceback
from recordkit.conversion.engines import InlineEngine, LocalEngine, RayEngine, make_engine
from recordkit.errors import ConvertError, MissingDependencyError, PartitionsFailedError

from ._sources import HangingJsonl, KillingJsonl, PickyJsonl
from .test_convert import _rows, tree

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _sources():
    for cls in (KillingJsonl, HangingJsonl, PickyJsonl):
        converters.register(cls.name, cls)


def _writers() -> list[int]:
    """PIDs of this process's writer processes (from /proc)."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with open(path) as f:
            pids |= {int(p) for p in f.read().split()}
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"recordkit.conversion.pool:_writer" in f.read():
                    found.append(pid)
        except FileNotFoundError:
            pass
    return found


def _convert(src, dst, fmt: str, at: str, **kw):
    return rk.convert(
        src,
        dst,
        format=fmt,
        shard_size="2KiB",
        source_options={"at": at, "parent": os.getpid()},
        schema=rk.Schema(id=rk.Int64(), text=rk.Bytes(), v=rk.Int64((2,))),
        **kw,
    )


def test_a_killed_writer_fails_its_partition_only_and_a_rerun_resumes(tmp_path):
    _rows(tmp_path / "src")
    _convert(tmp_path / "src", tmp_path / "ref", "killing-jsonl", "", workers=0)
    with pytest.raises(PartitionsFailedError) as info:
        _convert(tmp_path / "src", tmp_path / "out", "killing-jsonl", "f02.jsonl", workers=2)
    (err,) = info.value.exceptions
    assert isinstance(err, ConvertError)
    assert "partition 2: its writer process died (killed by SIGKILL)" in str(err)
    assert "partition 2 (part-00002-*), source items: f02.jsonl" in err.__notes__
    markers = sorted(os.listdir(tmp_path / "out" / ".recordkit-convert"))
    done = [f"part-{i:05d}.done.json" for i in (0, 1, 3, 4, 5)]
    assert markers == [*done, "plan.json", "source.json.zst"]
    result = _convert(tmp_path / "src", tmp_path / "out", "killing-jsonl", "", workers=2)
    assert result.resumed == 5 and tree(tmp_path / "out") == tree(tmp_path / "ref")


def test_a_silent_writer_is_stopped(tmp_path):
    _rows(tmp_path / "src", files=2)
    with pytest.raises(ConvertError, match=r"no progress for 1 s .* rerun to resume"):
        _convert(
            tmp_path / "src",
            tmp_path / "out",
            "hanging-jsonl",
            "f01.jsonl",
            workers=1,
            inactivity_timeout=1.0,
        )
    assert _writers() == []  # stopped and reaped
    result = _convert(tmp_path / "src", tmp_path / "out", "hanging-jsonl", "", workers=1)
    assert result.resumed == 1 and len(rk.Dataset(tmp_path / "out")) == 80
    assert not [p for p in (tmp_path / "out").iterdir() if ".tmp-" in p.name]


def test_exceptions_from_writers_keep_their_type_notes_and_traceback(tmp_path):
    _rows(tmp_path / "src", files=3)
    with pytest.raises(PartitionsFailedError) as info:
        _convert(tmp_path / "src", tmp_path / "out", "picky-jsonl", "f01.jsonl", workers=2)
    (err,) = info.value.exceptions
    # PickyError cannot cross: its summary, its notes and its traceback still do.
    assert type(err) is ConvertError and str(err) == "PickyError: row 2: no good"
    assert "while converting source item 'f01.jsonl'" in err.__notes__
    assert "partition 1 (part-00001-*), source items: f01.jsonl" in err.__notes__
    assert isinstance(err.__cause__, RemoteTraceback) and "misbehave" in str(err.__cause__)


def test_make_engine():
    assert make_engine("local", workers=0) == InlineEngine()
    assert make_engine("local", workers=3, inactivity_timeout=None) == LocalEngine(3, None)
    assert make_engine("dask", workers=0).workers == 1
    assert make_engine("ray", workers=0) == RayEngine(address=None, workers=1)
    assert make_engine("ray", workers=3, scheduler="auto") == RayEngine("auto", 3)
    with pytest.raises(ValueError, match=r"engine must be one of \('local', 'dask', 'ray'\)"):
        make_engine("spark", workers=1)
    with pytest.raises(ValueError, match="workers must be >= 0"):
        make_engine("local", workers=-1)
    with pytest.raises(ValueError, match="inactivity timeout must be > 0"):
        make_engine("local", workers=1, inactivity_timeout=0)


def test_a_cluster_address_for_the_wrong_engine_is_refused():
    with pytest.raises(ValueError, match=r"scheduler='tcp://h:8786' is a cluster's address; "):
        make_engine("local", workers=2, scheduler="tcp://h:8786")
    with pytest.raises(ValueError, match=r"'tcp://h:8786' is a Dask scheduler's address; a Ray"):
        make_engine("ray", workers=2, scheduler="tcp://h:8786")
    with pytest.raises(ValueError, match=r"'ray://h:10001' is a Ray cluster's address; a Dask"):
        make_engine("dask", workers=2, scheduler="ray://h:10001")
    with pytest.raises(ValueError, match="workers must be >= 1 for the Ray engine, got 0"):
        RayEngine(workers=0)
    with pytest.raises(ValueError, match="task_retries must be >= 0, got -1"):
        RayEngine(task_retries=-1)


def test_ray_engine_without_ray_names_its_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(MissingDependencyError, match=r"'ray' is required .*\[ray\]"):
        next(RayEngine().run([], lambda *_: None))
    _rows(tmp_path / "src", files=1)
    with pytest.raises(MissingDependencyError, match=r"\[ray\]"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", engine="ray")
    assert not (tmp_path / "out").exists()  # said before anything was written


def test_in_memory_urls_are_refused_on_clusters(tmp_path):
    for engine, name in (("dask", "Dask"), ("ray", "Ray")):
        with pytest.raises(ValueError, match=f"memory://nowhere lives in this process; {name}"):
            rk.convert("memory://nowhere", tmp_path / "o", format="jsonl", engine=engine)
        with pytest.raises(ValueError, match=f"memory://nowhere lives in this process; {name}"):
            rk.write(str, [1], "memory://nowhere", schema=rk.Schema(x=rk.Int64()), engine=engine)


def test_the_engine_s_floors():
    """``recordkit._procs`` needs only the standard library; ``recordkit.writer`` and
    ``recordkit.conversion`` import nothing above them (cache, reader, the frameworks, the
    CLI; convert for the writer) and no other package's private module, lazy imports
    included."""
    import ast
    import pathlib

    import recordkit

    root = pathlib.Path(recordkit.__file__).parent
    top = {"cache", "reader", "torch", "tf", "cli", "dataset", "verify", "prefetch"}
    floors = {"_procs": set(), "writer": top | {"conversion"}, "conversion": top}
    for own, above in floors.items():
        package = root / own
        files = sorted(package.glob("*.py")) if package.is_dir() else [root / f"{own}.py"]
        for path in files:
            inside = path.parent != root  # in a subpackage: ".." is recordkit
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level:
                    if node.level == 1 and inside:
                        continue  # the same package
                    targets = [f"recordkit.{node.module}" if node.module else "recordkit"]
                elif isinstance(node, ast.ImportFrom):
                    targets = [node.module or ""]
                else:
                    continue
                for target in targets:
                    if not target.startswith("recordkit"):
                        continue
                    parts = target.split(".")[1:]
                    where = f"{path.name}: {target}"
                    assert own != "_procs", f"_procs imports recordkit: {where}"
                    assert not parts or parts[0] not in above, f"imports up a floor: {where}"
                    private = [p for p in parts[1:] if p.startswith("_")]
                    assert not private, f"imports another package's private module: {where}"
