"""recordkit reads TensorFlow-written TFRecords exactly as TensorFlow does.

The golden files in ``tests/data/golden/`` were written by ``tf.io.TFRecordWriter``
(see ``tests/data/make_golden.py``). Nothing here stores expected values: TensorFlow is
asked live, and every answer recordkit gives is compared against it — the framing
(``tf.data.TFRecordDataset``), the Example wire decoding (``tf.train.Example.FromString``
and TF's own C++ parser ``tf.io.parse_single_example``), and ``recordkit.Dataset``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import recordkit
from recordkit.codec import decode_example
from recordkit.errors import UnknownFieldError
from recordkit.format import iter_records

pytestmark = pytest.mark.tf

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
GOLDEN_FILES = sorted(p.name for p in GOLDEN.glob("*.tfrecord"))
# Files whose records share one schema, so recordkit.Dataset can infer it.
UNIFORM_FILES = ["large.tfrecord", "lists.tfrecord", "scalars.tfrecord"]

_KIND = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64", None: None}


def _record_count(path: Path) -> int:
    """Count records from the length fields alone (no TF, no recordkit) for test ids."""
    count, offset, size = 0, 0, path.stat().st_size
    with path.open("rb") as f:
        while offset < size:
            f.seek(offset)
            (length,) = struct.unpack("<Q", f.read(8))
            offset += length + 16
            count += 1
    return count


# Examples with fields their messages do not define: TensorFlow skips them, we refuse.
UNKNOWN_FIELDS = "unknown_fields.tfrecord"
RECORDS = [
    (name, i)
    for name in GOLDEN_FILES
    if name != UNKNOWN_FIELDS
    for i in range(_record_count(GOLDEN / name))
]


@pytest.fixture(scope="module")
def tf() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with warnings.catch_warnings():
        # TensorFlow's own import-time deprecation noise is not ours to fix.
        warnings.simplefilter("ignore")
        return pytest.importorskip("tensorflow")


def _tf_payloads(tf: ModuleType, path: Path) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def _our_payloads(path: Path) -> list[tuple[int, bytes]]:
    data = path.read_bytes()
    return [(offset, bytes(payload)) for offset, payload in iter_records(data, path=str(path))]


# ------------------------------------------------------------------------------ framing


def test_golden_files_present() -> None:
    # Guards against a regeneration that silently drops a case the tests rely on.
    assert set(GOLDEN_FILES) == {
        "edge.tfrecord",
        "large.tfrecord",
        "lists.tfrecord",
        "scalars.tfrecord",
        "unknown_fields.tfrecord",
        "wire_variants.tfrecord",
    }
    assert (GOLDEN / "README.md").is_file()


@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_framing_matches_tf(tf: ModuleType, name: str) -> None:
    path = GOLDEN / name
    ours = _our_payloads(path)
    theirs = _tf_payloads(tf, path)
    assert [p for _, p in ours] == theirs
    # Offsets are contiguous: each record starts where the previous one's footer ends.
    expected_offset = 0
    for offset, payload in ours:
        assert offset == expected_offset
        expected_offset += len(payload) + 16
    assert expected_offset == path.stat().st_size


def test_zero_length_record(tf: ModuleType) -> None:
    path = GOLDEN / "edge.tfrecord"
    theirs = _tf_payloads(tf, path)
    ours = [p for _, p in _our_payloads(path)]
    assert b"" in theirs
    assert ours.index(b"") == theirs.index(b"")
    # TF parses an empty payload as an Example with no features; so must we.
    assert len(tf.train.Example.FromString(b"").features.feature) == 0
    assert dict(decode_example(b"")) == {}


def test_large_record(tf: ModuleType) -> None:
    path = GOLDEN / "large.tfrecord"
    ours = _our_payloads(path)
    assert len(ours[0][1]) > 16 * 2**20
    assert ours[1][0] == len(ours[0][1]) + 16
    assert [p for _, p in ours] == _tf_payloads(tf, path)


# ------------------------------------------------------------------------------ Example codec


def _tf_example(tf: ModuleType, payload: bytes) -> dict[str, tuple[str | None, Any]]:
    """``{key: (kind, values)}`` as ``tf.train.Example.FromString`` parses ``payload``."""
    out: dict[str, tuple[str | None, Any]] = {}
    for key, feature in tf.train.Example.FromString(payload).features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        if kind == "float_list":
            values = np.asarray(values, dtype=np.float32)
        elif kind == "int64_list":
            values = np.asarray(values, dtype=np.int64)
        out[key] = (_KIND[kind], values)
    return out


def _ours(payload: bytes) -> dict[str, tuple[str | None, Any]]:
    out: dict[str, tuple[str | None, Any]] = {}
    for key, (kind, value) in decode_example(payload).items():
        if kind == "bytes":
            assert all(isinstance(v, memoryview) for v in value), key
            value = [bytes(v) for v in value]
        elif kind in ("float", "int64"):
            assert isinstance(value, np.ndarray), key
            assert value.dtype == (np.float32 if kind == "float" else np.int64), key
            assert value.ndim == 1, key
        else:
            assert kind is None, (key, kind)
            assert value is None or len(value) == 0, (key, value)
            value = []
        out[key] = (kind, value)
    return out


def _assert_values_equal(key: str, kind: str | None, ours: Any, theirs: Any) -> None:
    if kind == "float":
        # Bitwise: nan payloads and the sign of -0.0 must survive, and nan != nan.
        theirs = np.asarray(theirs, dtype=np.float32)
        assert ours.shape == theirs.shape, key
        assert ours.view(np.uint32).tolist() == theirs.view(np.uint32).tolist(), key
    elif kind == "int64":
        assert np.asarray(ours).tolist() == np.asarray(theirs, dtype=np.int64).tolist(), key
    else:
        assert list(ours) == list(theirs), key


@pytest.mark.parametrize(("name", "record"), RECORDS, ids=[f"{n}#{i}" for n, i in RECORDS])
def test_decode_example_matches_tf(tf: ModuleType, name: str, record: int) -> None:
    payload = _tf_payloads(tf, GOLDEN / name)[record]
    ours = _ours(payload)
    theirs = _tf_example(tf, payload)
    assert sorted(ours) == sorted(theirs)
    for key, (kind, values) in theirs.items():
        assert ours[key][0] == kind, key
        _assert_values_equal(key, kind, ours[key][1], values)

    # TF's C++ fast parser (what tf.data pipelines use) must agree as well. It cannot
    # be asked about the empty key or about a feature with no kind.
    dtypes = {"bytes": tf.string, "float": tf.float32, "int64": tf.int64}
    spec = {k: tf.io.VarLenFeature(dtypes[kind]) for k, (kind, _) in theirs.items() if kind and k}
    if spec:
        parsed = tf.io.parse_single_example(payload, spec)
        for key in spec:
            kind = theirs[key][0]
            _assert_values_equal(key, kind, ours[key][1], parsed[key].values.numpy())


# What each record of unknown_fields.tfrecord holds that its message does not define.
UNKNOWN = [
    "field 15 (length-delimited) inside the Example at payload byte 14",
    "field 9 (varint) inside Feature 'a' at payload byte 14",
    "field 2 (varint) inside the Int64List of feature 'a' at payload byte 14",
    "field 5 (32-bit) inside the BytesList of feature 'b' at payload byte 14",
    "field 3 (varint) inside the map entry of feature 'c' at payload byte 14",
    "field 1 (64-bit) inside the FloatList of feature 'f' at payload byte 11",
]


def test_fields_tensorflow_skips_are_refused_by_name(tf: ModuleType, tmp_path: Path) -> None:
    """TensorFlow reads these records by skipping a field (for one, a whole entry): what
    that field held is gone without a word. Every recordkit reader refuses them."""
    path = GOLDEN / UNKNOWN_FIELDS
    payloads = _tf_payloads(tf, path)
    assert len(payloads) == len(UNKNOWN)
    offset = 0
    shard = tmp_path / UNKNOWN_FIELDS
    shutil.copyfile(path, shard)
    for record, (payload, where) in enumerate(zip(payloads, UNKNOWN, strict=True)):
        theirs = tf.train.Example.FromString(payload)  # parses: the field is skipped
        known = tf.train.Example()
        known.CopyFrom(theirs)
        known.DiscardUnknownFields()
        assert known.SerializeToString() != theirs.SerializeToString()  # it held one
        with pytest.raises(UnknownFieldError) as info:
            decode_example(payload)
        assert info.value.reason.startswith(f"{where}, which tf.train.Example does not define")
        ds = recordkit.Dataset(shard, raw=True)  # every record as stored: but not this one
        with pytest.raises(UnknownFieldError) as info:
            ds[record]
        assert str(info.value).startswith(f"{shard}:{offset}:{record}: {where}, ")
        offset += len(payload) + 16
    schema = recordkit.Schema(
        a=recordkit.Int64((None,)), b=recordkit.Bytes((None,)), f=recordkit.Float32((None,))
    )
    report = recordkit.verify(shard, schema=schema)
    assert [p.record for p in report.problems] == list(range(len(UNKNOWN)))
    assert all("which tf.train.Example does not define" in p.message for p in report.problems)


# ------------------------------------------------------------------------------ Dataset


def _flat(value: Any) -> list[Any]:
    """A sample value as a flat list (bytes scalars and lists alike), for comparison."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [bytes(value)]
    if isinstance(value, np.ndarray):
        if value.dtype == np.float32:
            return value.reshape(-1).view(np.uint32).tolist()
        return value.reshape(-1).tolist()
    return [bytes(v) for v in value]


def _tf_flat(kind: str | None, values: Any) -> list[Any]:
    if kind == "float":
        return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()
    if kind == "int64":
        return np.asarray(values).tolist()
    return list(values)


@pytest.mark.parametrize("name", UNIFORM_FILES)
@pytest.mark.parametrize("as_dir", [False, True], ids=["file", "dir"])
def test_dataset_matches_tf(tf: ModuleType, tmp_path: Path, name: str, as_dir: bool) -> None:
    # A copy: opening a foreign folder may publish .idx files beside the shards, and the
    # checked-in golden directory must stay as generated.
    shard = tmp_path / name
    shutil.copyfile(GOLDEN / name, shard)
    digest = hashlib.sha256(shard.read_bytes()).digest()
    ds = recordkit.Dataset(tmp_path if as_dir else shard)

    expected = [_tf_example(tf, p) for p in _tf_payloads(tf, GOLDEN / name)]
    assert len(ds) == len(expected)
    assert [s.records for s in ds.shards] == [len(expected)]
    samples = list(ds)
    assert len(samples) == len(expected)
    for i, (sample, theirs) in enumerate(zip(samples, expected, strict=True)):
        assert sorted(sample) == sorted(theirs), i
        for key, (kind, values) in theirs.items():
            assert _flat(sample[key]) == _tf_flat(kind, values), (i, key)
    for i in (0, len(expected) - 1):
        assert {k: _flat(v) for k, v in ds[i].items()} == {
            k: _flat(v) for k, v in samples[i].items()
        }
    # Reading never rewrites a shard (a mapped reader elsewhere would die of SIGBUS).
    assert hashlib.sha256(shard.read_bytes()).digest() == digest


def test_dataset_fixed_schema_shapes(tf: ModuleType, tmp_path: Path) -> None:
    """The fixed-shape golden file reads with the shapes ``tf.io.parse_example`` gives."""
    shard = tmp_path / "scalars.tfrecord"
    shutil.copyfile(GOLDEN / "scalars.tfrecord", shard)
    spec = {
        "label": tf.io.FixedLenFeature([], tf.int64),
        "name": tf.io.FixedLenFeature([], tf.string),
        "score": tf.io.FixedLenFeature([], tf.float32),
        "triple": tf.io.FixedLenFeature([3], tf.int64),
        "quad": tf.io.FixedLenFeature([4], tf.float32),
    }
    batch = tf.io.parse_example(tf.constant(_tf_payloads(tf, shard)), spec)
    samples = list(recordkit.Dataset(shard))
    for i, sample in enumerate(samples):
        assert sample["name"] == batch["name"][i].numpy(), i
        for key in ("label", "score", "triple", "quad"):
            want = batch[key][i].numpy()
            got = sample[key]
            assert isinstance(got, np.ndarray), key
            assert got.dtype == want.dtype, key
            # A length-1 list and a scalar are the same on the wire; either shape is fine.
            assert got.shape == want.shape or (want.shape == () and got.shape == (1,)), key
            if want.dtype == np.float32:
                assert got.reshape(-1).view(np.uint32).tolist() == (
                    want.reshape(-1).view(np.uint32).tolist()
                ), (i, key)
            else:
                assert got.reshape(-1).tolist() == want.reshape(-1).tolist(), (i, key)
