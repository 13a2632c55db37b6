"""A record holding a field its message does not define is refused by every reader (issue 15).

Protobuf parsers, TensorFlow's among them, skip such a field, and what it holds is gone
without a word. recordkit refuses the record instead, with an ``UnknownFieldError``
naming the field, its wire type, where it sits and file:offset:record: ``rk.Dataset``
(indexed, iterated, raw), ``RecordDataset`` (the native runner, the thread pool, the pure
Python twins, the loader process), ``RecordMapDataset``, ``recordkit convert --from
tfrecord`` and ``rk.verify``. ``on_error="skip"`` leaves just that record out.
(``recordkit.tf`` is in ``tests/tf/test_tf_dataset.py``; TensorFlow's own parse of such
records in ``tests/compat/test_golden.py`` and ``tests/codec/test_example.py``.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.cli import main
from recordkit.codec import encode_example
from recordkit.errors import CorruptRecordError, PartitionsFailedError, UnknownFieldError
from recordkit.format import frame
from recordkit.reader import ReadOptions, _fallback, decode

N = 20
BAD = 7  # the record that holds the field
SCHEMA = rk.Schema(id=rk.Int64(), name=rk.Bytes(), vec=rk.Float32((3,)))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _ld(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _features(i: int) -> dict[str, tuple[str, object]]:
    return {"id": ("int64", [i]), "name": ("bytes", [b"r%d" % i]), "vec": ("float", [i, -i, 0.5])}


def _with_unknown(i: int, where: str) -> bytes:
    """Record ``i`` with one field its message does not define, ``where`` says where."""
    if where == "Example":  # a top-level field 9, a varint (as a newer writer might add)
        return encode_example(_features(i)) + _varint(9 << 3) + _varint(1)
    feats = _features(i)
    del feats["id"]
    head = encode_example(feats)
    if where == "Feature":  # an Int64List, then field 4 (length-delimited) in the Feature
        feature = _ld(3, _ld(1, _varint(i))) + _ld(4, b"note")
    else:  # "Int64List": a fixed32 among its values
        feature = _ld(3, _ld(1, _varint(i)) + _varint(2 << 3 | 5) + b"abcd")
    entry = _ld(1, _ld(1, b"id") + _ld(2, feature))
    return head + _ld(1, entry)  # Example.features given twice: protobuf merges the maps


WHERE = {
    "Example": "field 9 (varint) inside the Example at payload byte ",
    "Feature": "field 4 (length-delimited) inside Feature 'id' at payload byte ",
    "Int64List": "field 2 (32-bit) inside the Int64List of feature 'id' at payload byte ",
}


@pytest.fixture(params=list(WHERE))
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def write_source(root: Path, where: str) -> Path:
    """A foreign folder: one shard of N Examples, record BAD with an unknown field."""
    root.mkdir()
    payloads = [
        _with_unknown(i, where) if i == BAD else encode_example(_features(i)) for i in range(N)
    ]
    (root / "data.tfrecord").write_bytes(b"".join(frame(p) for p in payloads))
    return root


@pytest.fixture
def src(tmp_path: Path, where: str) -> Path:
    return write_source(tmp_path / "src", where)


def _offset(src: Path) -> int:
    data = (src / "data.tfrecord").read_bytes()
    offset = 0
    for _ in range(BAD):
        offset += int.from_bytes(data[offset : offset + 8], "little") + 16
    return offset


def _refused(exc: BaseException, src: Path, where: str) -> None:
    """The error names the field, where it sits, and file:offset:record."""
    assert isinstance(exc, UnknownFieldError) and isinstance(exc, CorruptRecordError)
    assert (exc.path, exc.offset, exc.record) == (str(src / "data.tfrecord"), _offset(src), BAD)
    assert exc.reason.startswith(WHERE[where])
    assert exc.reason.endswith(
        ", which tf.train.Example does not define: TensorFlow would drop it silently, so the "
        "record is refused"
    )


def test_the_reference_decoder_refuses_it(where: str) -> None:
    with pytest.raises(UnknownFieldError, match=re.escape(WHERE[where])):
        SCHEMA.decode(_with_unknown(BAD, where))
    assert int(SCHEMA.decode(encode_example(_features(BAD)))["id"]) == BAD


def test_dataset(src: Path, where: str) -> None:
    ds = rk.Dataset(src, SCHEMA)
    with pytest.raises(UnknownFieldError) as info:
        ds[BAD]
    _refused(info.value, src, where)
    with pytest.raises(UnknownFieldError) as info:
        list(ds)
    _refused(info.value, src, where)
    assert int(ds[BAD + 1]["id"]) == BAD + 1
    with pytest.raises(UnknownFieldError) as info:  # raw: each record as it holds it
        rk.Dataset(src, raw=True)[BAD]
    _refused(info.value, src, where)


def test_dataset_inferring_its_schema(src: Path, where: str) -> None:
    with pytest.raises(UnknownFieldError) as info:  # inference reads the leading records
        rk.Dataset(src)
    _refused(info.value, src, where)


def _record_dataset(src: Path, **kw: object) -> object:
    pytest.importorskip("torch")
    from recordkit.torch import RecordDataset

    return RecordDataset(src, schema=SCHEMA, batch_size=4, options=ReadOptions(num_threads=2, **kw))


@pytest.mark.torch
@pytest.mark.parametrize("native_tasks", ["1", "0"], ids=["runner", "threads"])
def test_record_dataset(
    src: Path, where: str, native_tasks: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", native_tasks)
    ds = _record_dataset(src)
    with pytest.raises(UnknownFieldError) as info:
        list(ds)  # type: ignore[call-overload]
    _refused(info.value, src, where)
    ds = _record_dataset(src, on_error="skip")
    ids = [int(i) for batch in ds for i in batch["id"]]  # type: ignore[attr-defined]
    assert ids == [i for i in range(N) if i != BAD] and ds.stats.skipped == 1  # type: ignore[attr-defined]


@pytest.mark.torch
def test_record_dataset_python_twins(
    src: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RECORDKIT_NO_NATIVE=1``: the pure Python twins of the native functions."""
    monkeypatch.setattr(decode, "_impl", _fallback)
    with pytest.raises(UnknownFieldError) as info:
        list(_record_dataset(src))  # type: ignore[call-overload]
    _refused(info.value, src, where)


@pytest.mark.torch
def test_record_dataset_loader_process(
    src: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UnknownFieldError) as info:
        list(_record_dataset(src, reader_process=True))  # type: ignore[call-overload]
    _refused(info.value, src, where)
    monkeypatch.setenv("RECORDKIT_NO_NATIVE", "1")  # the loader's own interpreter
    with pytest.raises(UnknownFieldError) as info:
        list(_record_dataset(src, reader_process=True))  # type: ignore[call-overload]
    _refused(info.value, src, where)


@pytest.mark.torch
def test_record_map_dataset(src: Path, where: str) -> None:
    pytest.importorskip("torch")
    from recordkit.torch import RecordMapDataset

    ds = RecordMapDataset(src, schema=SCHEMA)
    with pytest.raises(UnknownFieldError) as info:
        ds[BAD]
    _refused(info.value, src, where)
    with pytest.raises(UnknownFieldError) as info:
        ds.__getitems__([BAD - 1, BAD, BAD + 1])
    _refused(info.value, src, where)
    assert [int(s["id"]) for s in ds.__getitems__([BAD - 1, BAD + 1])] == [BAD - 1, BAD + 1]


def test_verify(src: Path, where: str) -> None:
    report = rk.verify(src, schema=SCHEMA)
    (problem,) = report.problems
    assert (problem.path, problem.offset, problem.record) == (
        str(src / "data.tfrecord"),
        _offset(src),
        BAD,
    )
    assert problem.message.startswith(WHERE[where])
    assert report.records == N


def test_convert(src: Path, where: str, tmp_path: Path) -> None:
    # among the records inference reads: the plan stops, nothing is written
    with pytest.raises(UnknownFieldError) as info:
        rk.convert(src, tmp_path / "a", format="tfrecord", workers=0)
    _refused(info.value, src, where)
    # past them: the payload check of the partition stops it, no manifest
    with pytest.raises(PartitionsFailedError) as group:
        rk.convert(src, tmp_path / "b", format="tfrecord", workers=0,
                   source_options={"infer_records": 4})  # fmt: skip
    (err,) = group.value.exceptions
    _refused(err, src, where)
    assert not (tmp_path / "b" / "recordkit.json").exists()


def test_convert_cli(src: Path, where: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["convert", "--from", "tfrecord", str(src), str(tmp_path / "dst")])
    assert code != 0
    err = capsys.readouterr().err
    assert f"{src / 'data.tfrecord'}:{_offset(src)}:{BAD}: {WHERE[where]}" in err


def test_a_clean_copy_reads_everywhere(tmp_path: Path) -> None:
    """The same records without the field: every reader takes them (the refusal is the field)."""
    root = tmp_path / "clean"
    root.mkdir()
    payloads = [encode_example(_features(i)) for i in range(N)]
    (root / "data.tfrecord").write_bytes(b"".join(frame(p) for p in payloads))
    assert [int(s["id"]) for s in rk.Dataset(root, SCHEMA)] == list(range(N))
    assert rk.verify(root, schema=SCHEMA).ok
    sample = rk.Dataset(root, SCHEMA)[BAD]
    np.testing.assert_array_equal(sample["vec"], np.array([BAD, -BAD, 0.5], np.float32))
    assert os.listdir(root) == ["data.tfrecord"]
