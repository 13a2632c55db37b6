"""``--from arrayrecord``: files written by the real ``array-record`` package.

The conformance suite (``test_formats.py``) converts Example records locally,
from S3 and over HTTP; here: records that are not Examples (kept whole, equal
to what ``ArrayRecordReader`` reads), a file cut into record ranges, and
damaged or refused input, each named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.codec import encode_example
from recordkit.converters.base import SourceError
from recordkit.errors import PartitionsFailedError

from .cases import read_all

module = pytest.importorskip("array_record.python.array_record_module")


def _write(path: Path, records: list[bytes], options: str = "group_size:4") -> None:
    writer = module.ArrayRecordWriter(str(path), options)
    for record in records:
        writer.write(record)
    writer.close()


def _theirs(path: Path) -> list[bytes]:
    reader = module.ArrayRecordReader(str(path))
    try:
        return list(reader.read_all())
    finally:
        reader.close()


def _error(exc: BaseException) -> str:
    if isinstance(exc, PartitionsFailedError):
        (exc,) = exc.exceptions
    assert isinstance(exc, SourceError), repr(exc)
    return str(exc)


def test_records_kept_whole_in_ranges(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    records = [json.dumps({"i": i, "s": "x" * i}).encode() for i in range(10)]
    records += [bytes(range(256)) * 3, b""]
    _write(src / "a.array_record", records, "group_size:5,zstd")
    source_options = {"range_records": 4}
    rk.convert(
        src, tmp_path / "out", format="arrayrecord", workers=0, source_options=source_options
    )
    ds = rk.Dataset(tmp_path / "out")
    assert ds.schema == rk.Schema(record=rk.Bytes())
    assert ds.metadata["arrayrecord"] == {"records": "bytes"}
    assert [s["record"] for s in ds] == _theirs(src / "a.array_record") == records
    from converters.arrayrecord import ArrayRecordSource

    keys = [i.key for i in ArrayRecordSource(str(src), range_records=4).list_items()]
    assert keys == ["a.array_record[0:4]", "a.array_record[4:8]", "a.array_record[8:12]"]


def test_examples_forced_and_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    good = [encode_example({"v": ("int64", [i])}) for i in range(3)]
    _write(src / "e.array_record", good)
    rk.convert(src, tmp_path / "ex", format="arrayrecord", workers=0)
    assert [int(s["v"]) for s in read_all(tmp_path / "ex")] == [0, 1, 2]
    rk.convert(
        src, tmp_path / "raw", format="arrayrecord", workers=0, source_options={"records": "bytes"}
    )
    assert [s["record"] for s in read_all(tmp_path / "raw")] == _theirs(src / "e.array_record")
    _write(src / "f.array_record", [b"\xff\xfe not an example"])
    with pytest.raises(SourceError, match=r"f\.array_record: record 0 is not a tf\.train\.Example"):
        rk.convert(
            src / "f.array_record",
            tmp_path / "bad",
            format="arrayrecord",
            workers=0,
            source_options={"records": "example"},
        )
    with pytest.raises(ValueError, match="records must be one of"):
        rk.convert(src, tmp_path / "x", format="arrayrecord", source_options={"records": "pickle"})


def test_damage_and_limits_are_named(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _write(src / "a.array_record", [bytes([i]) * 5000 for i in range(40)], "group_size:8")
    with pytest.raises((SourceError, PartitionsFailedError)) as info:
        rk.convert(
            src,
            tmp_path / "big",
            format="arrayrecord",
            workers=0,
            source_options={"max_record_bytes": 4999, "records": "bytes"},
        )
    assert re.search(r"a\.array_record: record 0 is 5000 bytes, over the limit", _error(info.value))
    data = (src / "a.array_record").read_bytes()
    (src / "a.array_record").write_bytes(data[: len(data) - 40])
    with pytest.raises((SourceError, PartitionsFailedError)) as info:
        rk.convert(src, tmp_path / "cut", format="arrayrecord", workers=0)
    assert re.search(r"a\.array_record: array_record: ", _error(info.value))
