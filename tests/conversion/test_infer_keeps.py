"""Tabular inference keeps every value (issue 30): codes with leading zeros stay text,
decimals float32 cannot give back as written are float64, convert says what it kept
and how; a type that does not fit says which --schema fixes it; head/info/verify on a
file that is not a TFRecord say what it looks like."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import PartitionsFailedError

CLI = [sys.executable, "-m", "recordkit"]
TABLE = (
    "zip,ts,price,name\n00001,1795895263.5,19.99,a\n"
    "02134,1795895264.5,5.25,b\n10001,1795895265.5,3.5,c\n"
)


def test_leading_zeros_and_decimals_are_kept(tmp_path):
    (tmp_path / "t.csv").write_text(TABLE)
    run = subprocess.run(
        [*CLI, "convert", str(tmp_path / "t.csv"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "column 'zip': text, not a number: it holds '00001'" in run.stderr
    assert "column 'ts': float64, not float32" in run.stderr
    assert "schema Schema(" in run.stderr and "INFO" not in run.stderr
    rows = list(rk.Dataset(tmp_path / "out"))
    assert [r["zip"] for r in rows] == [b"00001", b"02134", b"10001"]
    assert [float(r["ts"]) for r in rows] == [1795895263.5, 1795895264.5, 1795895265.5]
    assert np.float32(rows[0]["price"]) == np.float32(19.99)  # float32 holds 19.99


def test_json_floats_float32_cannot_hold_are_float64(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"t": 1795895263.25}\n{"t": 0.5}\n')
    rk.convert(tmp_path / "r.jsonl", tmp_path / "out", format="jsonl", workers=0)
    assert [float(r["t"]) for r in rk.Dataset(tmp_path / "out")] == [1795895263.25, 0.5]


def test_a_value_that_does_not_fit_names_the_schema_that_does(tmp_path):
    rows = ["a,b"] + [f"{i},{i}" for i in range(3000)] + ["x,1"]
    (tmp_path / "bad.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(tmp_path / "bad.csv", tmp_path / "out", format="csv", workers=0)
    (error,) = info.value.exceptions
    assert "column 'a' is int64 in the schema, this row holds 'x'" in str(error)
    assert "--schema 'a:bytes,b:int64'" in str(error)
    assert "a rerun fails the same way until the data is fixed" in str(info.value)
    schema = rk.Schema(a=rk.Bytes(), b=rk.Int64())
    rk.convert(
        tmp_path / "bad.csv",
        tmp_path / "out",
        format="csv",
        workers=0,
        schema=schema,
        overwrite=True,
    )
    assert len(rk.Dataset(tmp_path / "out")) == 3001


@pytest.mark.parametrize(
    ("name", "data", "what"),
    [
        ("t.csv", TABLE.encode(), "a CSV file; convert it with: recordkit convert"),
        ("t.parquet", b"PAR1" + bytes(40), "a Parquet file"),
        ("i.png", b"\x89PNG\r\n\x1a\n" + bytes(40), "a PNG image"),
        ("r.jsonl", b'{"a": 1}\n{"a": 2}\n', "JSON Lines"),
    ],
)
def test_head_info_verify_on_a_file_that_is_not_a_tfrecord(tmp_path, name, data, what):
    path = tmp_path / name
    path.write_bytes(data)
    for command in ("head", "info", "verify"):
        run = subprocess.run([*CLI, command, str(path)], capture_output=True, text=True)
        out = run.stdout + run.stderr
        assert run.returncode in (1, 2) and "not a TFRecord file: it looks like" in out, out
        assert what in out and "corrupt" not in out.lower()
