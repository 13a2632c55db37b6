"""Features that may be absent (issue 30, item 1): ``default=`` on every feature type.

A defaulted feature is left out of a record that has no value for it, and a record
without it reads as the default: through ``Schema.decode``, the batch decoder (native
and fallback alike), every reader, and TensorFlow's ``parse_example``. A required
feature missing from a record is an error naming the file, offset and record.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.codec import Bytes, Float32, Int64, Schema, Tensor, parse_schema
from recordkit.codec.features import REQUIRED
from recordkit.codec.schema_json import default_from_json, default_to_json
from recordkit.errors import CorruptRecordError, SchemaError
from recordkit.format import frame
from recordkit.reader import _fallback, decode
from recordkit.reader.decode import BatchDecoder

try:
    from recordkit.native import _ext as _native
except ImportError:  # built without a compiler
    _native = None  # type: ignore[assignment]

FULL = Schema(
    id=Int64(),
    label=Int64(default=-1),
    score=Float32((2,), default=float("nan")),
    lang=Bytes(default=b"en"),
    tokens=Int64((None,), default=[]),
    emb=Tensor("float16", (3,), default=[0.5, 0, -1]),
)


# ----------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: Int64((None,), default=[1]), "can only default to an empty value"),
        (lambda: Int64((2,), default=[1, 2, 3]), "expected shape (2,), got (3,)"),
        (lambda: Int64(default="x"), "expected integers"),
        (lambda: Float32(default=b"x"), "does not fit"),
        (lambda: Bytes(default=3), "does not fit"),
        (lambda: Tensor("complex64", (), default=1), "no default (JSON has no complex)"),
        (lambda: Tensor("uint8", (2,), default=[1, 256]), "does not fit"),
    ],
)
def test_a_default_that_does_not_fit_is_refused_at_construction(make, said):
    with pytest.raises(SchemaError) as info:
        make()
    assert said in str(info.value)


def test_defaults_broadcast_compare_and_show():
    kind, values = Float32((3,), default=1.5).default_value()
    assert kind == "float" and list(values) == [1.5, 1.5, 1.5]
    assert Int64((2, 2), default=0) == Int64((2, 2), default=[[0, 0], [0, 0]])
    assert Int64(default=1) != Int64(default=2) != Int64()
    assert hash(Int64(default=1)) == hash(Int64(default=1))
    assert Int64().required and Int64().default is REQUIRED
    assert not Int64(default=0).required
    assert repr(Int64((None,), default=[])) == "Int64((None,), default=[])"
    assert repr(Bytes(default=b"\xff")) == "Bytes(default=b'\\xff')"
    # A NaN default equals itself (compared by its encoding), so schemas compare.
    assert Float32(default=float("nan")) == Float32(default=float("nan"))


def test_json_round_trip_keeps_every_default():
    back = Schema.from_json(json.loads(json.dumps(FULL.to_json())))
    assert back == FULL
    assert math.isnan(float(back["score"].default[0]))
    assert back["lang"].default == b"en"
    for value in [float("nan"), float("inf"), -float("inf"), b"\x00\xff", [1.5, -0.0], 7]:
        text = json.dumps(default_to_json(value))
        got = default_from_json("x", json.loads(text))
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got)
        else:
            assert got == value and type(got) is type(value)
    assert json.loads(json.dumps(FULL.to_json()))["features"][1]["default"] == -1


def test_a_schema_without_defaults_reads_as_before():
    """No "default" key in JSON unless one was given: old manifests read unchanged."""
    plain = Schema(a=Int64(), b=Bytes())
    assert all("default" not in f for f in plain.to_json()["features"])
    assert Schema.from_json(plain.to_json()) == plain


# ------------------------------------------------------------------- encode, decode


def test_encode_leaves_out_what_is_missing_or_none_and_decode_gives_the_default():
    payload = FULL.encode({"id": 1, "lang": None})
    assert payload == Schema(id=Int64()).encode({"id": 1})  # nothing else written
    got = FULL.decode(payload)
    assert got["id"] == 1 and got["label"] == -1 and got["lang"] == b"en"
    assert np.isnan(got["score"]).all() and got["score"].dtype == np.float32
    assert got["tokens"].shape == (0,) and got["tokens"].dtype == np.int64
    assert got["emb"].dtype == np.float16 and got["emb"].tolist() == [0.5, 0, -1]


def test_each_read_gets_its_own_default():
    payload = FULL.encode({"id": 1})
    first = FULL.decode(payload, copy=True)
    first["emb"][0] = 9  # the caller owns what it was given
    assert FULL.decode(payload, copy=True)["emb"].tolist() == [0.5, 0, -1]
    view = FULL.decode(payload)  # copy=False: the schema's own default, read-only
    assert not view["emb"].flags.writeable
    with pytest.raises(ValueError):
        view["emb"][0] = 9


def test_a_present_value_wins_over_the_default():
    sample = {
        "id": 2, "label": 5, "score": [1, 2], "lang": b"fr", "tokens": [3, 4, 5],
        "emb": np.array([1, 2, 3], np.float16),
    }  # fmt: skip
    got = FULL.decode(FULL.encode(sample))
    assert got["label"] == 5 and got["score"].tolist() == [1, 2] and got["lang"] == b"fr"
    assert got["tokens"].tolist() == [3, 4, 5] and got["emb"].tolist() == [1, 2, 3]


def test_a_required_feature_missing_is_an_error_on_both_sides():
    with pytest.raises(SchemaError, match="sample is missing feature 'id', which has no default"):
        FULL.encode({"label": 3})
    with pytest.raises(SchemaError, match="'id'"):
        FULL.encode({"id": None})
    with pytest.raises(CorruptRecordError, match="'id'"):
        FULL.decode(Schema(label=Int64()).encode({"label": 3}))


# ------------------------------------------------------------ the batch decoder


def _shard(payloads: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    framed = [frame(p) for p in payloads]
    sizes = np.array([len(f) for f in framed], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return b"".join(framed), offsets, sizes


@pytest.fixture(params=["native", "fallback"])
def impl(request, monkeypatch):
    module = {"native": _native, "fallback": _fallback}[request.param]
    if module is None:
        pytest.skip("recordkit.native._ext is not built")
    monkeypatch.setattr(decode, "_impl", module)
    return module


def _samples(n: int) -> list[dict]:
    out = []
    for i in range(n):
        s: dict = {"id": i}
        if i % 3 == 0:
            s.update(label=i * 10, score=[i, -i], lang=b"x" * i)
        if i % 2 == 0:
            s["tokens"] = list(range(i % 5))
            s["emb"] = np.full(3, i, np.float16)
        out.append(s)
    return out


@pytest.mark.parametrize("ragged_as", ["list", "padded"])
def test_batches_of_present_and_absent_records_equal_the_reference(impl, ragged_as):
    samples = _samples(23)
    buf, offsets, sizes = _shard([FULL.encode(s) for s in samples])
    batch = BatchDecoder(FULL, ragged_as=ragged_as).decode(buf, offsets, sizes)
    assert batch.n == 23 and not batch.bad
    want = [FULL.decode(FULL.encode(s), copy=True) for s in samples]
    cols = batch.columns
    assert cols["id"].tolist() == list(range(23))
    assert cols["label"].tolist() == [w["label"] for w in want]
    np.testing.assert_array_equal(cols["score"], np.stack([w["score"] for w in want]))
    np.testing.assert_array_equal(cols["emb"], np.stack([w["emb"] for w in want]))
    lengths = cols["lang/lengths"].tolist()
    assert [cols["lang"][r, :n].tobytes() for r, n in enumerate(lengths)] == [
        w["lang"] for w in want
    ]
    if ragged_as == "padded":
        lens = cols["tokens/lengths"].tolist()
        assert lens == [len(w["tokens"]) for w in want]
        assert cols["tokens"].shape == (23, max(lens))
        assert [cols["tokens"][r, :n].tolist() for r, n in enumerate(lens)] == [
            w["tokens"].tolist() for w in want
        ]
    else:
        assert [t.tolist() for t in cols["tokens"]] == [w["tokens"].tolist() for w in want]


def test_a_required_feature_missing_in_a_batch_is_a_bad_record(impl):
    schema = Schema(id=Int64(), label=Int64())
    payloads = [schema.encode({"id": i, "label": i}) for i in range(4)]
    payloads[2] = Schema(id=Int64()).encode({"id": 2})
    buf, offsets, sizes = _shard(payloads)
    batch = BatchDecoder(schema).decode(buf, offsets, sizes)
    assert batch.n == 3 and [i for i, _ in batch.bad] == [2]
    assert "'label'" in str(batch.bad[0][1])


# ------------------------------------------------------------------- the readers


def _foreign(folder: Path, payloads: list[bytes]) -> Path:
    """A folder with one plain TFRecord file holding ``payloads`` (no index, no manifest)."""
    folder.mkdir()
    (folder / "part.tfrecord").write_bytes(b"".join(frame(p) for p in payloads))
    return folder


def test_readers_name_the_record_that_lacks_a_required_feature(tmp_path):
    schema = Schema(id=Int64(), label=Int64())
    payloads = [schema.encode({"id": i, "label": i}) for i in range(6)]
    payloads[4] = Schema(id=Int64()).encode({"id": 4})
    folder = _foreign(tmp_path / "d", payloads)
    offset = sum(len(frame(p)) for p in payloads[:4])
    where = f"part.tfrecord:{offset}"
    with pytest.raises(CorruptRecordError) as info:
        list(rk.Dataset(folder, schema))
    assert where in str(info.value) and "'label'" in str(info.value)
    assert info.value.record == 4 and info.value.offset == offset
    pytest.importorskip("torch")
    from recordkit.torch import RecordDataset

    with pytest.raises(CorruptRecordError) as info:
        list(RecordDataset(folder, schema=schema, batch_size=3))
    assert where in str(info.value) and info.value.record == 4


def _written(path: Path, n: int) -> tuple[Path, list[dict]]:
    """``n`` of :func:`_samples` written with FULL, and what each reads back as."""
    samples = _samples(n)
    with rk.Writer(path, FULL, max_records=5) as w:
        for s in samples:
            w.write(s)
    return path, [FULL.decode(FULL.encode(s), copy=True) for s in samples]


def test_every_reader_gives_the_default_for_an_absent_feature(tmp_path):
    path, want = _written(tmp_path / "d", 12)
    got = list(rk.Dataset(path))
    assert [g["label"] for g in got] == [w["label"] for w in want]
    assert [g["lang"] for g in got] == [w["lang"] for w in want]
    torch = pytest.importorskip("torch")
    from recordkit.torch import RecordDataset

    rows = {}
    for batch in RecordDataset(path, batch_size=5, shuffle=True, seed=3):
        for r, i in enumerate(batch["id"].tolist()):
            n = int(batch["tokens/lengths"][r])
            rows[i] = (int(batch["label"][r]), batch["tokens"][r, :n].tolist(), batch["emb"][r])
    for i, w in enumerate(want):
        assert rows[i][:2] == (w["label"], w["tokens"].tolist())
        assert torch.equal(rows[i][2], torch.from_numpy(w["emb"]))


@pytest.mark.tf
def test_tensorflow_reads_the_same_defaults(tmp_path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("tensorflow")
    import recordkit.tf as rtf

    path, want = _written(tmp_path / "d", 12)
    got = [b for batch in rtf.dataset(path, batch_size=4) for b in _rows(batch, 4)]
    assert [g["id"] for g in got] == list(range(12))
    for g, w in zip(got, want):
        assert g["label"] == w["label"] and g["lang"] == w["lang"]
        np.testing.assert_array_equal(g["score"], w["score"])
        np.testing.assert_array_equal(g["emb"], w["emb"])
        assert g["tokens"] == w["tokens"].tolist()


def _rows(batch: dict, n: int) -> list[dict]:
    out = []
    for r in range(n):
        row = {}
        for name, col in batch.items():
            value = col[r]
            row[name] = value.numpy().tolist() if name == "tokens" else value.numpy()
        row["id"], row["label"] = int(row["id"]), int(row["label"])
        row["lang"] = bytes(row["lang"])
        out.append(row)
    return out


# ------------------------------------------------------------------------ --schema


def test_compact_schema_takes_json_defaults():
    schema = parse_schema(
        'id:int64,label:int64=-1,tokens:int64[None]=[],lang:bytes="en",x:float32[2]=0.5'
    )
    assert schema["id"].required
    assert schema["label"] == Int64(default=-1)
    assert schema["tokens"] == Int64((None,), default=[])
    assert schema["lang"] == Bytes(default=b"en")
    assert schema["x"] == Float32((2,), default=[0.5, 0.5])
    with pytest.raises(SchemaError, match="label"):
        parse_schema("label:int64=[1,2]")
    with pytest.raises(SchemaError):
        parse_schema("label:int64=notjson")
