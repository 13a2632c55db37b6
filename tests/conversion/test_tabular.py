"""Column options of the tabular converters (parquet, csv, jsonl): columns, drop, fill, nulls.

Each test writes real files (pyarrow for Parquet) and converts them for real,
inline or in writer subprocesses, then reads every record back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from converters import SourceError
from converters._tabular import TabularOptions, zero_value
from recordkit.cli import main
from recordkit.conversion.partition import PartitionResult
from recordkit.errors import DatasetExistsError, PartitionsFailedError, SchemaError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _parquet(path: Path, row_group_size: int = 4) -> None:
    """10 rows: ``maybe`` null in rows 1, 4, 7; ``name`` null in row 2; ``v`` null in 5."""
    n = 10
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "maybe": pa.array([None if i % 3 == 1 else i / 2 for i in range(n)], pa.float64()),
            "name": pa.array([None if i == 2 else f"row {i}" for i in range(n)], pa.string()),
            "v": pa.array([None if i == 5 else [i, i + 1] for i in range(n)], pa.list_(pa.int64())),
            # a type no feature is inferred for: only convertible when left out
            "when": pa.array([1_700_000_000 + i for i in range(n)], pa.timestamp("s")),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)


def _rows(ds_path: Path) -> list[dict]:
    ds = rk.Dataset(ds_path)
    out = []
    for i in range(len(ds)):
        row = {}
        for k, v in ds[i].items():
            if isinstance(v, np.ndarray):
                v = v.tolist()
            elif isinstance(v, (bytes, memoryview)):
                v = bytes(v).decode()
            row[k] = v
        out.append(row)
    return out


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "t.parquet"
    _parquet(path)
    return path


def test_options_are_validated_with_the_bad_value_named():
    with pytest.raises(
        ValueError, match=r"nulls must be one of \('error', 'skip', 'fill'\), got 'drop'"
    ):
        TabularOptions(nulls="drop")
    with pytest.raises(ValueError, match=r"columns and drop both name \['a'\]"):
        TabularOptions(columns=["a", "b"], drop=["a"])
    with pytest.raises(ValueError, match="fill must be a mapping"):
        TabularOptions(fill="maybe=0")
    with pytest.raises(ValueError, match=r"the value for \['a'\] is None"):
        TabularOptions(fill={"a": None})
    with pytest.raises(ValueError, match=r"fill names \['a'\], which drop leaves out"):
        TabularOptions(drop=["a"], fill={"a": 1})
    with pytest.raises(ValueError, match="names a column twice"):
        TabularOptions(drop="a,a")
    assert TabularOptions(columns="id, name").columns == ("id", "name")  # -o columns=id,name
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['nul'\]"):
        rk.convert("x.csv", "out", format="csv", source_options={"nul": "skip"})


def test_zero_values_fit_their_types():
    for ftype in (
        rk.Int64(),
        rk.Float32((2,)),
        rk.Bytes(),
        rk.Bytes((3,)),
        rk.Int64((None,)),
        rk.Tensor("uint8", (None, 3)),
        rk.Tensor("float64", (2, 2)),
    ):
        rk.Schema(x=ftype).encode({"x": zero_value(ftype)})  # no SchemaError


def test_parquet_nulls_are_an_error_that_names_the_options_that_fix_it(table, tmp_path):
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(
            table, tmp_path / "out", format="parquet", workers=0, source_options={"drop": ["when"]}
        )
    messages = [str(e) for e in info.value.exceptions]
    first = messages[0]
    assert first.startswith(
        "t.parquet#rowgroup0: column 'maybe' holds 1 null (the first in row 1 of the row group)"
    )
    for fix in (
        "nulls='skip'",
        "nulls='fill'",
        "fill={'maybe': <value>}",
        "drop=['maybe']",
        "-o nulls=skip",
        "-o drop=maybe",
        """-o 'fill={"maybe": <value>}'""",
    ):
        assert fix in first
    assert all(isinstance(e, SourceError) for e in info.value.exceptions)


def test_parquet_skip_counts_rows_across_writer_processes(table, tmp_path):
    out = tmp_path / "out"
    result = rk.convert(
        table,
        out,
        format="parquet",
        workers=2,
        shard_size=200,  # one partition per row group: the counts cross processes
        source_options={"drop": ["when"], "nulls": "skip"},
    )
    kept = [i for i in range(10) if i % 3 != 1 and i not in (2, 5)]
    assert [r["id"] for r in _rows(out)] == kept
    assert result.skipped == 10 - len(kept) == 5
    assert result.partitions > 1
    assert "(5 source rows skipped)" in result.summary()
    assert rk.Dataset(out).metadata["convert"]["skipped"] == 5
    assert rk.Dataset(out).metadata["tabular"]["nulls"] == "skip"
    # rerun: already complete, and the count comes back from the manifest
    again = rk.convert(
        table,
        out,
        format="parquet",
        workers=0,
        shard_size=200,
        source_options={"drop": ["when"], "nulls": "skip"},
    )
    assert again.resumed == again.partitions and again.skipped == 5


def test_parquet_fill_values_and_the_fill_policy(table, tmp_path):
    out = tmp_path / "filled"
    rk.convert(
        table,
        out,
        format="parquet",
        workers=0,
        source_options={"drop": "when", "fill": {"maybe": -1.0, "v": [7, 7]}, "nulls": "fill"},
    )
    rows = _rows(out)
    assert len(rows) == 10
    assert [r["maybe"] for r in rows] == [-1.0 if i % 3 == 1 else i / 2 for i in range(10)]
    assert rows[2]["name"] == ""  # nulls="fill": empty bytes for a column without a fill value
    assert rows[5]["v"] == [7, 7] and rows[4]["v"] == [4, 5]


def test_parquet_columns_reads_only_those_and_in_that_order(table, tmp_path):
    out = tmp_path / "cols"
    result = rk.convert(
        table,
        out,
        format="parquet",
        workers=0,
        source_options={"columns": ["name", "id"], "fill": {"name": "?"}},
    )
    assert rk.Dataset(out).schema.names == ("name", "id")
    assert [r["name"] for r in _rows(out)][:4] == ["row 0", "row 1", "?", "row 3"]
    assert result.skipped == 0
    with pytest.raises(
        SchemaError, match=r"columns names \['nope'\], not in the source; it has \['id'"
    ):
        rk.convert(
            table,
            tmp_path / "x",
            format="parquet",
            workers=0,
            source_options={"columns": ["id", "nope"]},
        )
    with pytest.raises(
        SchemaError, match=r"fill names \['maybe'\], not among the columns converted"
    ):
        rk.convert(
            table,
            tmp_path / "x",
            format="parquet",
            workers=0,
            source_options={"columns": ["id"], "fill": {"maybe": 0.0}},
        )
    with pytest.raises(
        SchemaError, match=r"fill value 'x' for column 'maybe' does not fit Float32"
    ):
        rk.convert(
            table,
            tmp_path / "x",
            format="parquet",
            workers=0,
            source_options={"drop": ["when"], "fill": {"maybe": "x"}},
        )


def test_parquet_lists_holding_nulls_are_refused_or_skipped(tmp_path):
    path = tmp_path / "l.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "v": [[1, 2], [3, None], [4]]}), path)
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(
            path, tmp_path / "a", format="parquet", workers=0, source_options={"nulls": "fill"}
        )
    assert "the list in row 1 of the row group holds nulls" in str(info.value.exceptions[0])
    result = rk.convert(
        path, tmp_path / "b", format="parquet", workers=0, source_options={"nulls": "skip"}
    )
    assert [r["id"] for r in _rows(tmp_path / "b")] == [0, 2] and result.skipped == 1


def test_another_fill_value_is_another_plan_never_already_complete(table, tmp_path):
    out = tmp_path / "out"
    opts = {"drop": ["when"], "fill": {"maybe": 0.0, "name": "", "v": []}}
    rk.convert(table, out, format="parquet", workers=0, source_options=opts)
    with pytest.raises(DatasetExistsError, match="from a different source or options"):
        rk.convert(
            table,
            out,
            format="parquet",
            workers=0,
            source_options={**opts, "fill": {**opts["fill"], "maybe": 1.0}},
        )


def test_a_schema_with_the_options(table, tmp_path):
    schema = rk.Schema(id=rk.Int64(), maybe=rk.Float32())
    rk.convert(
        table,
        tmp_path / "ok",
        format="parquet",
        schema=schema,
        workers=0,
        source_options={"nulls": "skip"},
    )
    assert [r["id"] for r in _rows(tmp_path / "ok")] == [0, 2, 3, 5, 6, 8, 9]
    with pytest.raises(
        SchemaError, match=r"the schema given has \['maybe'\], which drop leaves out"
    ):
        rk.convert(
            table,
            tmp_path / "x",
            format="parquet",
            schema=schema,
            workers=0,
            source_options={"drop": ["maybe"]},
        )
    with pytest.raises(SchemaError, match=r"columns=\['id'\] differs"):
        rk.convert(
            table,
            tmp_path / "x",
            format="parquet",
            schema=schema,
            workers=0,
            source_options={"columns": ["id"]},
        )


def _csv(path: Path) -> None:
    path.write_text("id,score,note,tags\n0,1.5,a,[1]\n1,,b,[2]\n2,2.5,,[3]\n3,3.5,d,\n")


def test_csv_empty_cells_are_nulls_in_number_columns(tmp_path):
    src = tmp_path / "t.csv"
    _csv(src)
    schema = rk.Schema(id=rk.Int64(), score=rk.Float32(), note=rk.Bytes(), tags=rk.Int64((None,)))
    # inference: empty cells do not make 'score' a text column; they are nulls
    with pytest.raises(
        SchemaError, match=r"t.csv: column 'score' holds 1 null in the first 4 rows"
    ):
        rk.convert(src, tmp_path / "x", format="csv", workers=0, source_options={"drop": "tags"})
    rk.convert(
        src,
        tmp_path / "a",
        format="csv",
        workers=0,
        source_options={"drop": "tags", "fill": {"score": -1}},
    )
    assert rk.Dataset(tmp_path / "a").schema["score"] == rk.Float32()
    assert [r["score"] for r in _rows(tmp_path / "a")] == [1.5, -1.0, 2.5, 3.5]
    assert [r["note"] for r in _rows(tmp_path / "a")] == ["a", "b", "", "d"]  # text: ""
    # with a schema: the list column's empty cell is a null too; a text fill fills ""
    result = rk.convert(
        src,
        tmp_path / "b",
        format="csv",
        schema=schema,
        workers=0,
        source_options={"fill": {"note": "?"}, "nulls": "skip"},
    )
    assert [r["id"] for r in _rows(tmp_path / "b")] == [0, 2] and result.skipped == 2
    assert _rows(tmp_path / "b")[1]["note"] == "?"
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(src, tmp_path / "c", format="csv", schema=schema, workers=0)
    assert str(info.value.exceptions[0]).startswith("t.csv: line 3: column 'score' is empty; ")


def test_jsonl_missing_keys_and_nulls_in_byte_ranges_and_processes(tmp_path):
    src = tmp_path / "rows"
    src.mkdir()
    expected = []
    skipped = 0
    with open(src / "a.jsonl", "w") as f:
        for i in range(300):
            row = {"id": i, "x": [i, -i], "extra": "junk"}
            if i % 7 == 0:
                row["x"] = None
            if i % 11 == 0:
                del row["x"]
            f.write(json.dumps(row) + "\n")
            if "x" in row and row["x"] is not None:
                expected.append(i)
            else:
                skipped += 1
    opts = {"chunk_bytes": 2000, "drop": ["extra"], "nulls": "skip", "infer_rows": 5}
    result = rk.convert(
        src, tmp_path / "out", format="jsonl", workers=2, shard_size="2KiB", source_options=opts
    )
    assert [r["id"] for r in _rows(tmp_path / "out")] == expected
    assert result.skipped == skipped and result.partitions > 2
    # a null seen while inferring stops the plan; one found later stops its partition
    with pytest.raises(
        SchemaError, match=r"^a.jsonl\[0:2000\]: column 'x' holds 1 null in the first 5 rows"
    ):
        rk.convert(
            src, tmp_path / "e", format="jsonl", workers=0, source_options=opts | {"nulls": "error"}
        )
    schema = rk.Schema(id=rk.Int64(), x=rk.Int64((2,)))
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(
            src,
            tmp_path / "e",
            format="jsonl",
            workers=0,
            schema=schema,
            source_options={"drop": ["extra"]},
        )
    assert str(info.value.exceptions[0]).startswith("a.jsonl: line 1: column 'x' is missing; ")
    # an unexpected key is named with the option that leaves it out
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(src, tmp_path / "f", format="jsonl", workers=0, schema=rk.Schema(id=rk.Int64()))
    assert str(info.value.exceptions[0]).startswith(
        "a.jsonl: line 1: unexpected ['extra']: the schema has ['id']; drop=['extra'] "
        "(-o drop=extra) leaves the unexpected out"
    )


def test_cli_takes_the_options_as_o_key_value(table, tmp_path, capsys):
    out = tmp_path / "cli"
    args = [
        "convert",
        str(table),
        str(out),
        "--from",
        "parquet",
        "--workers",
        "0",
        "-o",
        "drop=when,v",
        "-o",
        'fill={"maybe": 0.5}',
        "-o",
        "nulls=skip",
    ]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "into 9 records (1 source row skipped)" in err  # row 2: name is null
    assert rk.Dataset(out).metadata["tabular"] == {
        "columns": None,
        "drop": ["when", "v"],
        "fill": {"maybe": 0.5},
        "nulls": "skip",
    }
    assert (
        main(
            [
                "convert",
                str(table),
                str(tmp_path / "e"),
                "--from",
                "parquet",
                "--workers",
                "0",
                "-o",
                "drop=when",
            ]
        )
        == 1
    )
    assert "-o nulls=skip" in capsys.readouterr().err
    # a bad option value is one line naming what the option takes (exit status 2)
    assert (
        main(["convert", str(table), str(tmp_path / "f"), "--from", "parquet", "-o", "nulls=drop"])
        == 2
    )
    assert capsys.readouterr().err == (
        "recordkit convert: error: nulls must be one of ('error', 'skip', 'fill'), got 'drop'\n"
    )


def test_the_skip_count_survives_a_resume_through_the_done_marker():
    result = PartitionResult(3, (), items=2, size=10, skipped=4)
    fingerprint, back = PartitionResult.from_marker(result.marker_bytes("f"))
    assert fingerprint == "f" and back.skipped == 4
    plain = PartitionResult(3, (), items=2, size=10)
    assert b"skipped" not in plain.marker_bytes("f")  # markers as before when nothing is skipped
    assert PartitionResult.from_marker(plain.marker_bytes("f"))[1].skipped == 0
