"""``recordkit convert --from tfrecord`` of SequenceExamples written by TensorFlow (issue 15,
item 2): every payload copied byte for byte, the manifest saying so, and every reader
returning what ``rk.Dataset(src, sequence_example=True)`` and TensorFlow's own
``tf.io.parse_single_sequence_example`` return on the source, without being told.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import recordkit as rk
from recordkit.cli import main
from recordkit.codec.sequence import SequenceSchema
from recordkit.errors import (
    CorruptRecordError,
    ManifestError,
    PartitionsFailedError,
    SchemaError,
    SequenceExampleError,
)
from recordkit.format import frame
from recordkit.reader import CacheOptions, ReadOptions

from .test_foreign import _same_as_stored, _sequence_equal, _tf_value

pytestmark = pytest.mark.tf

CONTEXT = ("id", "name", "weight", "optional", "unset")
LISTS = ("tokens", "words", "frames", "late")


@pytest.fixture(scope="module")
def tf() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TensorFlow's import-time deprecation noise
        return pytest.importorskip("tensorflow")


def _write(
    tf: ModuleType,
    path: Path,
    first: int,
    n: int,
    *,
    compression: str = "",
    late: bool = False,
    mixed: bool = False,
) -> Path:
    """SequenceExamples ``first .. first + n - 1`` through ``tf.io.TFRecordWriter``.

    Context: 'id' int64, 'name' bytes (0-2 values), 'weight' float, 'optional' an
    empty int64 list in some records, 'unset' a Feature with no list in others.
    Feature lists: 'tokens' int64 (0-4 steps of 0-3 values), 'words' bytes (0-2
    steps), 'frames' float (2 steps, and an unset step in some records); 'late' only
    in the last record (``late``), 'mixed' int64 and bytes steps (``mixed``). Every
    seventh record has no feature_lists at all (an Example's bytes).
    """
    f = tf.train.Feature

    def i64(v: Any) -> Any:
        return f(int64_list=tf.train.Int64List(value=list(v)))

    def byt(v: Any) -> Any:
        return f(bytes_list=tf.train.BytesList(value=list(v)))

    def flt(v: Any) -> Any:
        return f(float_list=tf.train.FloatList(value=list(v)))

    options = tf.io.TFRecordOptions(compression_type=compression)
    with tf.io.TFRecordWriter(str(path), options=options) as w:
        for i in range(first, first + n):
            ctx = {"id": i64([i]), "name": byt([b"r%d" % i] * (i % 3)), "weight": flt([i / 4])}
            if i % 4 == 1:
                ctx["optional"] = i64([])
            if i % 5 == 2:
                ctx["unset"] = f()
            context = tf.train.Features(feature=ctx)
            if i % 7 == 3:
                w.write(tf.train.SequenceExample(context=context).SerializeToString())
                continue
            lists = {
                "tokens": [i64(range(s % 4)) for s in range(i % 5)],
                "words": [byt([b"w%d" % s] * (s % 2 + 1)) for s in range(i % 3)],
                "frames": [flt(np.linspace(0, 1, 3) * (s + i)) for s in range(2)]
                + ([f()] if i % 6 == 0 else []),
            }
            if late and i == first + n - 1:
                lists["late"] = [byt([b"z"]), byt([])]
            if mixed and i % 2:
                lists["mixed"] = [i64([i]), byt([b"b"])]
            feature_lists = tf.train.FeatureLists(
                feature_list={k: tf.train.FeatureList(feature=v) for k, v in lists.items()}
            )
            seq = tf.train.SequenceExample(context=context, feature_lists=feature_lists)
            w.write(seq.SerializeToString())
    return path


def _payloads(tf: ModuleType, paths: list[Path], compression: str = "") -> list[bytes]:
    out: list[bytes] = []
    for p in paths:
        out += [r.numpy() for r in tf.data.TFRecordDataset(str(p), compression_type=compression)]
    return out


def _tf_parse(tf: ModuleType, payload: bytes) -> dict[str, Any]:
    """TensorFlow's own parse of one record, with every name this test writes."""
    dtypes = {"id": tf.int64, "name": tf.string, "weight": tf.float32, "optional": tf.int64}
    ctx_spec = {k: tf.io.RaggedFeature(dtypes.get(k, tf.string)) for k in CONTEXT}
    seq_spec = {
        "tokens": tf.io.RaggedFeature(tf.int64),
        "words": tf.io.RaggedFeature(tf.string),
        "frames": tf.io.RaggedFeature(tf.float32),
        "late": tf.io.RaggedFeature(tf.string),
    }
    ctx, seq = tf.io.parse_single_sequence_example(
        payload, context_features=ctx_spec, sequence_features=seq_spec
    )
    return _plain({"context": ctx, "feature_lists": seq})


def _plain(sample: dict[str, Any]) -> dict[str, Any]:
    """A whole sample (ours: arrays and lists; TensorFlow's: tensors) as nested lists, with
    every name of this test (a name a record lacks reads as empty, as in TensorFlow)."""

    def values(v: Any) -> list[Any]:
        if hasattr(v, "to_list"):
            return list(v.to_list())
        if hasattr(v, "numpy"):
            v = v.numpy()
        return v.tolist() if isinstance(v, np.ndarray) else list(v)

    context = {k: values(sample["context"].get(k, [])) for k in CONTEXT}
    lists = {}
    for k in LISTS:
        steps = sample["feature_lists"].get(k, [])
        lists[k] = values(steps) if hasattr(steps, "to_list") else [values(s) for s in steps]
    return {"context": context, "feature_lists": lists}


def _convert(src: Path, dst: Path, *extra: str) -> int:
    argv = ["convert", "--from", "tfrecord", str(src), str(dst), "--progress", "none"]
    return main([*argv, *extra])


@pytest.fixture(scope="module")
def converted(tf: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three source files (one GZIP-compressed), converted by two writer processes, one
    partition per file, shards of about 1 KiB; 'late' is past the leading records."""
    root = tmp_path_factory.mktemp("seqconv")
    src = root / "src"
    src.mkdir()
    files = [
        _write(tf, src / "a.tfrecord", 0, 12),
        _write(tf, src / "b.tfrecord", 12, 9),
        _write(tf, src / "c.tfrecord", 21, 10, compression="GZIP", late=True),
    ]
    payloads = _payloads(tf, files[:2]) + _payloads(tf, files[2:], "GZIP")
    # rk.Dataset reads a GZIP file only by converting it: its reference reads a twin.
    twin = _write(tf, root / "c-uncompressed.tfrecord", 21, 10, late=True)
    dst = root / "dst"
    argv = ["--workers", "2", "--partition-size", "1", "--shard-size", "1KiB"]
    assert _convert(src, dst, *argv, "-o", "infer_records=3") == 0
    return {"src": src, "files": [*files[:2], twin], "dst": dst, "payloads": payloads}


def test_payloads_are_copied_byte_for_byte(tf: ModuleType, converted: dict[str, Any]):
    manifest = json.loads((converted["dst"] / "recordkit.json").read_text())
    assert manifest["payload"] == "sequence_example"
    assert len(manifest["shards"]) > 3  # rolled over, across partitions
    shards = [converted["dst"] / s["path"] for s in manifest["shards"]]
    assert _payloads(tf, shards) == converted["payloads"]
    assert len(converted["payloads"]) == 31


def test_manifest_schema_counts_every_record(tf: ModuleType, converted: dict[str, Any]):
    """The schema, counted from TensorFlow's own protos, 'late' (past the leading 3) too."""
    want = SequenceSchema()
    for payload in converted["payloads"]:
        msg = tf.train.SequenceExample.FromString(payload)
        context = {}
        for name, feature in msg.context.feature.items():
            kind, values = _tf_value(feature)
            context[name] = (kind and kind[:-5], values if kind else None)
        lists = {}
        for name, flist in msg.feature_lists.feature_list.items():
            steps = [_tf_value(x) for x in flist.feature]
            lists[name] = [(k and k[:-5], v if k else None) for k, v in steps]
        want.add(context, lists)
    got = rk.Dataset(converted["dst"]).sequence_schema
    assert got == want
    doc = got.to_json() if got is not None else {}
    assert [e["name"] for e in doc["feature_lists"]] == ["frames", "late", "tokens", "words"]
    late = doc["feature_lists"][1]
    assert late == {
        "name": "late", "records": 1, "steps": [2, 2], "kinds": {"bytes": 2}, "values": [0, 1]
    }  # fmt: skip
    frames = doc["feature_lists"][0]
    # Records 3, 10, 17, 24 hold no feature lists; 0, 6, 12, 18, 30 an unset 'frames' step.
    assert frames["kinds"]["unset"] == 5 and frames["records"] == 27


def test_rk_dataset_reads_it_whole_untold(tf: ModuleType, converted: dict[str, Any]):
    ours = rk.Dataset(converted["dst"])
    assert ours.sequence_example and ours.schema is None and len(ours) == 31
    source = [s for f in converted["files"] for s in rk.Dataset(f, sequence_example=True)]
    samples = list(ours)
    for a, b in zip(samples, source, strict=True):
        _sequence_equal(a, b)
    assert [int(s["context"]["id"][0]) for s in samples] == list(range(31))
    for i in (0, 17, 30, -1):  # random access
        _sequence_equal(ours[i], source[i])
    # Against TensorFlow's own protos, value by value, kind by kind.
    for sample, payload in zip(samples, converted["payloads"], strict=True):
        msg = tf.train.SequenceExample.FromString(payload)
        assert set(sample["context"]) == set(msg.context.feature)
        for name, feature in msg.context.feature.items():
            _same_as_stored(sample["context"][name], *_tf_value(feature))
        assert set(sample["feature_lists"]) == set(msg.feature_lists.feature_list)
        for name, flist in msg.feature_lists.feature_list.items():
            steps = sample["feature_lists"][name]
            assert len(steps) == len(flist.feature)
            for step, feature in zip(steps, flist.feature, strict=True):
                _same_as_stored(step, *_tf_value(feature))
    # And against tf.io.parse_single_sequence_example.
    for sample, payload in zip(samples, converted["payloads"], strict=True):
        assert _plain(sample) == _tf_parse(tf, payload)
    with pytest.raises(ValueError, match="SequenceExamples, read whole: pass no schema"):
        rk.Dataset(converted["dst"], rk.Schema(id=rk.Int64()))


def test_recordkit_tf_parses_it_natively_untold(tf: ModuleType, converted: dict[str, Any]):
    from recordkit import tf as rktf

    theirs = [_tf_parse(tf, p) for p in converted["payloads"]]
    ours = [_plain(e) for e in rktf.dataset(converted["dst"])]
    assert ours == theirs
    batches = list(rktf.dataset(converted["dst"], batch_size=8))
    assert [int(b["feature_lists"]["tokens"].shape[0]) for b in batches] == [8, 8, 8, 7]
    assert batches[3]["feature_lists"]["late"][-1].to_list() == [[b"z"], []]
    with pytest.raises(ValueError, match="no schema, columns or cache"):
        rktf.dataset(converted["dst"], columns=["id"])


def test_torch_readers_read_it_whole_untold(converted: dict[str, Any]):
    pytest.importorskip("torch")
    from recordkit.torch import RecordDataset, RecordMapDataset

    reference = list(rk.Dataset(converted["dst"]))
    samples = list(RecordDataset(converted["dst"], options=ReadOptions(num_threads=2)))
    for a, b in zip(samples, reference, strict=True):
        _sequence_equal(a, b)
    batches = list(
        RecordDataset(converted["dst"], batch_size=5, options=ReadOptions(num_threads=2))
    )
    assert [len(b) for b in batches] == [5, 5, 5, 5, 5, 5, 1]
    for a, b in zip([s for batch in batches for s in batch], reference, strict=True):
        _sequence_equal(a, b)
    shuffled = list(
        RecordDataset(converted["dst"], shuffle=True, seed=1, options=ReadOptions(num_threads=2))
    )
    assert sorted(int(s["context"]["id"][0]) for s in shuffled) == list(range(31))
    mapped = RecordMapDataset(converted["dst"])
    assert mapped.sequence_example and len(mapped) == 31
    for i in (0, 13, 30):
        _sequence_equal(mapped[i], reference[i])
    for a, i in zip(mapped.__getitems__([30, 2, 2, -1]), [30, 2, 2, 30], strict=True):
        _sequence_equal(a, reference[i])
    assert mapped.collate([mapped[0], mapped[1]])[1]["context"]["id"].tolist() == [1]
    with pytest.raises(ValueError, match=r"manifest says its records are tf\.train\.Sequence"):
        RecordDataset(converted["dst"], columns=["id"])
    with pytest.raises(ValueError, match="no schema, columns or decode_images"):
        RecordMapDataset(converted["dst"], schema=rk.Schema(id=rk.Int64()))
    # Foreign SequenceExamples, told.
    foreign = RecordMapDataset(converted["files"][0], options=ReadOptions(sequence_example=True))
    _sequence_equal(foreign[5], reference[5])


def test_through_a_shard_cache(converted: dict[str, Any], tmp_path: Path):
    """Whole epochs through a cache: RecordDataset reads every record whole (threads and
    DataLoader workers); recordkit.tf refuses the dataset by name in either mode."""
    pytest.importorskip("torch")
    from recordkit import tf as rktf
    from recordkit.torch import DataLoader, RecordDataset

    reference = list(rk.Dataset(converted["dst"]))
    cached = RecordDataset(
        converted["dst"],
        cache=CacheOptions(dir=tmp_path / "a", limit="1GiB"),
        options=ReadOptions(num_threads=2),
    )
    assert cached.sequence_example and cached.cache_epochs == "whole"
    for a, b in zip(cached, reference, strict=True):
        _sequence_equal(a, b)
    cached.close()
    batched = RecordDataset(
        converted["dst"], batch_size=4, cache=CacheOptions(dir=tmp_path / "b", limit="1GiB")
    )
    ids = [int(s["context"]["id"][0]) for b in DataLoader(batched, num_workers=2) for s in b]
    assert sorted(ids) == list(range(31))
    batched.close()
    for mode in ("whole", "growing"):
        with pytest.raises(ValueError, match="SequenceExamples"):
            rktf.dataset(
                converted["dst"], cache=CacheOptions(dir=tmp_path / mode, limit="1GiB", epochs=mode)
            )


def test_verify_info_and_head(converted: dict[str, Any], capsys: pytest.CaptureFixture[str]):
    report = rk.verify(converted["dst"])
    assert report.ok and report.records == 31, str(report)
    assert main(["verify", str(converted["dst"])]) == 0
    assert main(["info", str(converted["dst"])]) == 0
    out = capsys.readouterr().out
    assert "schema   tf.train.SequenceExample" in out
    assert "feature_lists/late: bytes (in 1 of 31 records, 2 steps, 0-1 values per step)" in out
    assert "context/id: int64 (in 31 of 31 records, 1 value)" in out
    assert main(["info", "--json", str(converted["dst"])]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["payload"] == "sequence_example" and doc["schema"]["records"] == 31
    assert main(["head", "-n", "1", str(converted["dst"])]) == 0
    out = capsys.readouterr().out
    assert "feature_lists/frames: [float32[3] [0., 0., 0.], float32[3] [0. , 0.5, 1. ], []]" in out


def test_verify_names_what_the_schema_lacks(converted: dict[str, Any], tmp_path: Path):
    dst = tmp_path / "dst"
    shutil.copytree(converted["dst"], dst)
    doc = json.loads((dst / "recordkit.json").read_text())
    schema = doc["schema"]

    def verify(**changed: Any) -> list[str]:
        (dst / "recordkit.json").write_text(json.dumps(doc | {"schema": schema | changed}))
        report = rk.verify(dst)
        assert all(p.offset is not None and p.record is not None for p in report.problems)
        return [p.message for p in report.problems]

    lists = [e for e in schema["feature_lists"] if e["name"] != "late"]
    (message,) = verify(feature_lists=lists)
    assert message == (
        "the record holds feature list 'late', which the schema of this dataset does not name"
    )
    context = [
        e | {"kinds": {"int64": 31}} if e["name"] == "weight" else e for e in schema["context"]
    ]
    messages = verify(context=context)
    assert len(messages) == 31 and messages[0] == (
        "the record holds context feature 'weight' as float, which the schema of this dataset "
        "does not name (it has int64)"
    )
    assert verify() == []
    doc["payload"] = "sequence_example_v9"
    (dst / "recordkit.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="payload 'sequence_example_v9' is not a kind"):
        rk.Dataset(dst)


def test_detection_is_said(tf: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    src = tmp_path / "src"
    src.mkdir()
    _write(tf, src / "seq.tfrecord", 0, 5)
    with caplog.at_level(logging.INFO, logger="recordkit.conversion"):
        assert _convert(src, tmp_path / "dst", "--workers", "0") == 0
    said = [r.getMessage() for r in caplog.records if "SequenceExamples" in r.getMessage()]
    assert said == [
        f"the records are tf.train.SequenceExamples (detected: {src / 'seq.tfrecord'}:0:0 "
        "holds feature_lists): copied whole"
    ]
    # A writer that asks the source for Examples (the cache's producer) is refused by name.
    from recordkit import converters

    source = converters.get("tfrecord")(str(src))
    items = source.list_items()
    source.resolve_schema(items)
    assert source.payload_kind()[0] == "sequence_example"
    with pytest.raises(ValueError, match="cannot keep whole; make a dataset of them with"):
        next(source.records(items[0], rk.Schema({})))


def test_told_when_the_leading_records_hold_no_feature_lists(
    tf: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Records 3 and 10 have no feature_lists: starting at 3, the leading record looks
    like an Example; detection calls the next one mixed input, the option converts it."""
    src = tmp_path / "src"
    src.mkdir()
    path = _write(tf, src / "seq.tfrecord", 3, 8)
    first = len(_payloads(tf, [path])[0]) + 16  # where record 1 starts
    assert _convert(src, tmp_path / "no", "--workers", "0", "-o", "infer_records=1") == 1
    err = capsys.readouterr().err
    assert f"{path}:{first}:1: a tf.train.SequenceExample (it has feature_lists) among" in err
    assert "(the leading 1 records hold no feature_lists): mixed input is refused" in err
    assert "-o sequence_example=true" in err
    assert not (tmp_path / "no" / "recordkit.json").exists()
    told = ["--workers", "0", "-o", "infer_records=1", "-o", "sequence_example=true"]
    assert _convert(src, tmp_path / "dst", *told) == 0
    ours = list(rk.Dataset(tmp_path / "dst"))
    assert ours[0]["feature_lists"] == {} and len(ours) == 8  # record 3: context only
    for a, payload in zip(ours, _payloads(tf, [path]), strict=True):
        assert _plain(a) == _tf_parse(tf, payload)
    with pytest.raises(ValueError, match="leave it out with sequence_example=True"):
        rk.convert(
            src,
            tmp_path / "x",
            format="tfrecord",
            workers=0,
            schema=rk.Schema(id=rk.Int64()),
            source_options={"sequence_example": True},
        )
    with pytest.raises(ValueError, match="check_payloads=false does not apply"):
        rk.convert(src, tmp_path / "y", format="tfrecord", workers=0,
                   source_options={"check_payloads": False, "sequence_example": True})  # fmt: skip


def test_a_sequence_example_among_examples_is_refused_unchecked(tf: ModuleType, tmp_path: Path):
    """Examples first, then one SequenceExample: refused by name, check_payloads off too."""
    src = tmp_path / "src"
    src.mkdir()
    f = tf.train.Feature
    with tf.io.TFRecordWriter(str(src / "mixed.tfrecord")) as w:
        for i in range(4):
            ctx = tf.train.Features(feature={"id": f(int64_list=tf.train.Int64List(value=[i]))})
            w.write(tf.train.Example(features=ctx).SerializeToString())
        empty = tf.train.FeatureLists()  # written as an empty field 2: still a SequenceExample
        w.write(tf.train.SequenceExample(context=ctx, feature_lists=empty).SerializeToString())
    for options in ({}, {"check_payloads": False}):
        with pytest.raises(PartitionsFailedError) as info:
            rk.convert(src, tmp_path / "dst", format="tfrecord", workers=0,
                       source_options={"infer_records": 4, **options})  # fmt: skip
        (err,) = info.value.exceptions
        assert isinstance(err, SequenceExampleError) and err.record == 4
        assert "(the leading 4 records hold no feature_lists): mixed input" in str(err)


def test_a_payload_that_does_not_decode_stops_it(tf: ModuleType, tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    path = _write(tf, src / "seq.tfrecord", 0, 6)
    size = path.stat().st_size
    with open(path, "ab") as fh:  # a well-framed record: feature_lists running past its end
        fh.write(frame(b"\x12\x05\x0a\x03"))
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(src, tmp_path / "dst", format="tfrecord", workers=0,
                   source_options={"infer_records": 2})  # fmt: skip
    (err,) = info.value.exceptions
    assert isinstance(err, CorruptRecordError)
    assert (err.path, err.offset, err.record) == (str(path), size, 6)
    assert f"{path}:{size}:6: malformed tf.train.SequenceExample: length 5 runs past" in str(err)
    assert not (tmp_path / "dst" / "recordkit.json").exists()
    # Among the leading records it stops the plan, before anything is written.
    with pytest.raises(CorruptRecordError, match=rf"{path}:{size}:6: malformed"):
        rk.convert(src, tmp_path / "dst2", format="tfrecord", workers=0,
                   source_options={"sequence_example": True})  # fmt: skip
    assert not (tmp_path / "dst2").exists() or not any((tmp_path / "dst2").iterdir())
    # Detection reads top-level fields only; a leading record malformed there is named.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.tfrecord").write_bytes(frame(b"\x0a\x05ab") + path.read_bytes())
    with pytest.raises(CorruptRecordError, match=r"x\.tfrecord:0:0: malformed tf\.train\.Example"):
        rk.convert(bad, tmp_path / "dst3", format="tfrecord", workers=0)


def test_recordkit_tf_refuses_a_name_of_two_kinds(tf: ModuleType, tmp_path: Path):
    from recordkit import tf as rktf

    src = tmp_path / "src"
    src.mkdir()
    _write(tf, src / "seq.tfrecord", 0, 6, mixed=True)
    assert _convert(src, tmp_path / "dst", "--workers", "0") == 0
    with pytest.raises(SchemaError, match="feature list 'mixed' holds bytes and int64 in"):
        rktf.dataset(tmp_path / "dst")
    steps = rk.Dataset(tmp_path / "dst")[1]["feature_lists"]["mixed"]  # kept, as stored
    assert steps[0].tolist() == [1] and steps[1] == [b"b"]


def test_a_resumed_conversion_ends_identical(tf: ModuleType, tmp_path: Path):
    """A partition fails, the rest publish with their schemas in their done-markers; the
    rerun resumes and writes the manifest an uninterrupted run writes."""
    src = tmp_path / "src"
    src.mkdir()
    _write(tf, src / "a.tfrecord", 0, 7)
    b = _write(tf, src / "b.tfrecord", 7, 7, late=True)
    good = b.read_bytes()
    bad = bytearray(good)
    bad[-2] ^= 0xFF  # the last payload CRC
    b.write_bytes(bytes(bad))
    argv = ["--workers", "0", "--partition-size", "1", "-o", "infer_records=1"]
    assert _convert(src, tmp_path / "dst", *argv) == 1
    markers = list((tmp_path / "dst" / ".recordkit-convert").glob("*.done.json"))
    assert [json.loads(m.read_text())["schema"]["records"] for m in markers] == [7]
    b.write_bytes(good)
    assert _convert(src, tmp_path / "dst", *argv) == 0
    assert _convert(src, tmp_path / "fresh", *argv) == 0
    resumed = (tmp_path / "dst" / "recordkit.json").read_bytes()
    assert resumed == (tmp_path / "fresh" / "recordkit.json").read_bytes()
    assert SequenceSchema.from_json(json.loads(resumed)["schema"]).records == 14
