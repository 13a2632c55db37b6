import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.cli import build_parser, main


@pytest.fixture
def ds(tmp_path):
    schema = rk.Schema(text=rk.Bytes(), label=rk.Int64(), emb=rk.Float32((3,)))
    with rk.Writer(tmp_path / "ds", schema, max_records=4, metadata={"classes": ["a", "b"]}) as w:
        for i in range(10):
            w.write({"text": f"hello {i}", "label": i, "emb": [0.5, 1.5, i]})
    return tmp_path / "ds"


def test_info(ds, capsys):
    assert main(["info", str(ds)]) == 0
    out = capsys.readouterr().out
    assert "records  10" in out and "shards   3" in out and "label" in out
    assert "recordkit 0." in out and "numpy" in out
    assert main(["info", str(ds), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["records"] == 10 and doc["complete"] and doc["metadata"]["classes"] == ["a", "b"]


def test_head(ds, capsys):
    assert main(["head", str(ds), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "[1]" in out and "[2]" not in out
    assert "b'hello 1'" in out and "label: 1" in out and "float32[3]" in out


def test_index_writes_dali_files(ds, capsys):
    for p in ds.glob("*.idx"):
        p.unlink()
    assert main(["index", str(ds / "part-00000.tfrecord"), str(ds / "part-00001.tfrecord")]) == 0
    assert (ds / "part-00001.tfrecord.idx").read_text().startswith("0 ")
    assert main(["index", str(ds)]) == 0
    assert len(list(ds.glob("*.idx"))) == 3


def test_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 2
    assert "error: no such dataset" in capsys.readouterr().err


def test_every_subcommand_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= {"index", "info", "verify", "head"}
    for name, p in sub.choices.items():
        assert p.description, name


def test_console_entry_points(ds):
    # The console script installed beside this interpreter (the venv need not be on PATH).
    script = str(Path(sys.executable).with_name("recordkit"))
    for cmd in ([sys.executable, "-m", "recordkit"], [script]):
        out = subprocess.run([*cmd, "verify", str(ds)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "OK" in out.stderr


def test_verify_max_decode_bytes(tmp_path, capsys):
    schema = rk.Schema(x=rk.Tensor("uint8", (None,), compression="zstd"))
    with rk.Writer(tmp_path / "z", schema) as w:
        w.write({"x": np.zeros(1000, np.uint8)})
    assert main(["verify", str(tmp_path / "z")]) == 0
    assert main(["verify", str(tmp_path / "z"), "--max-decode-bytes", "999"]) == 1
    out = capsys.readouterr().out
    assert ".tfrecord:0:0: feature 'x'" in out and "record_bytes=999" in out
    assert main(["verify", str(tmp_path / "z"), "--max-decode-bytes", "1KiB"]) == 0
