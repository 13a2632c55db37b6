"""Schema: validation, the shape rule, JSON form, inference, and per-feature zstd."""

import json
import threading
import time

import numpy as np
import pytest
import zstandard

from recordkit.codec import (
    Bytes,
    DecodeLimits,
    Float32,
    Int64,
    Schema,
    Tensor,
    decode_example,
    encode_example,
    zstd_compress,
    zstd_decompress,
)
from recordkit.errors import CorruptRecordError, RecordTooLargeError, SchemaError

RNG = np.random.default_rng(0)
DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def random_array(dtype, shape):
    dtype = np.dtype(dtype)
    raw = RNG.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    arr = raw.view(dtype).reshape(shape)
    return arr.astype(bool) if dtype.kind == "b" else arr


ROUND_TRIPS = [
    (Bytes(), b"hello", b"hello"),
    (Bytes(), "héllo", "héllo".encode()),
    (Bytes(), bytearray(b""), b""),
    (Bytes((2,)), [b"a", "b"], [b"a", b"b"]),
    (Bytes((None,)), [], []),
    (Bytes((None,)), (memoryview(b"xy"), b"z"), [b"xy", b"z"]),
    (Int64(), 7, np.array(7)),
    (Int64(), np.int16(-3), np.array(-3)),
    (Int64(), 2.0, np.array(2)),
    (Int64((3,)), [1, -(2**63), 2**63 - 1], np.array([1, -(2**63), 2**63 - 1])),
    (Int64((None,)), [], np.zeros(0, np.int64)),
    (Int64((2, None)), [[1, 2, 3], [4, 5, 6]], np.arange(1, 7).reshape(2, 3)),
    (Int64((None, None)), np.arange(6).reshape(3, 2), np.arange(6).reshape(3, 2)),
    (Int64((None, 2, None)), np.zeros((0, 2, 5)), np.zeros((0, 2, 5), np.int64)),
    (Float32(), 0.5, np.array(0.5, np.float32)),
    (Float32(), float("nan"), np.array(np.nan, np.float32)),
    (Float32((2, 2)), [[1, 2], [3, True]], np.array([[1, 2], [3, 1]], np.float32)),
    (Float32((None, None)), np.ones((4, 1)), np.ones((4, 1), np.float32)),
]


@pytest.mark.parametrize(("ftype", "value", "expected"), ROUND_TRIPS, ids=repr)
@pytest.mark.parametrize("copy", [False, True])
def test_roundtrip_scalar_and_list_types(ftype, value, expected, copy):
    schema = Schema(x=ftype)
    got = schema.decode(schema.encode({"x": value}), copy=copy)["x"]
    if isinstance(expected, np.ndarray):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, list):
        assert [bytes(v) for v in got] == expected
        assert all(type(v) is (bytes if copy else memoryview) for v in got)
    else:
        assert bytes(got) == expected and type(got) is (bytes if copy else memoryview)


TENSOR_SHAPES = [
    ((), ()),
    ((3,), (3,)),
    ((None,), (5,)),
    ((None,), (0,)),
    ((2, None, 3), (2, 4, 3)),
    ((None, None), (3, 0)),
    ((None, None, 3), (2, 5, 3)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize(("shape", "actual"), TENSOR_SHAPES, ids=str)
def test_roundtrip_tensor(dtype, compression, shape, actual):
    schema = Schema(t=Tensor(dtype, shape, compression))
    value = random_array(dtype, actual)
    payload = schema.encode({"t": value})
    got = schema.decode(payload)["t"]
    assert got.dtype == np.dtype(dtype) and got.shape == actual
    assert got.tobytes() == value.tobytes()
    assert not got.flags.writeable
    owned = schema.decode(payload, copy=True)["t"]
    assert owned.flags.writeable and owned.flags.owndata
    assert owned.tobytes() == value.tobytes()


def test_tensor_is_a_zero_copy_little_endian_view():
    schema = Schema(t=Tensor(">u2", (2,)))
    assert schema["t"] == Tensor("uint16", (2,))
    payload = schema.encode({"t": np.array([1, 258], ">u2")})
    assert b"\x01\x00\x02\x01" in payload  # stored little-endian whatever the input order
    got = schema.decode(payload)["t"]
    assert np.shares_memory(got, np.frombuffer(payload, np.uint8))
    assert got.tolist() == [1, 258]


def test_float_views_are_read_only_views_and_copies_are_not():
    schema = Schema(f=Float32((3,)))
    payload = schema.encode({"f": [1, 2, 3]})
    view = schema.decode(payload)["f"]
    assert np.shares_memory(view, np.frombuffer(payload, np.uint8)) and not view.flags.writeable
    owned = schema.decode(payload, copy=True)["f"]
    assert owned.flags.writeable and not np.shares_memory(owned, view)


def test_companion_shape_feature_only_with_two_or_more_none():
    two = Schema(t=Tensor("uint8", (None, None, 3)))
    raw = decode_example(two.encode({"t": np.zeros((4, 5, 3), np.uint8)}))
    assert list(raw) == ["t", "t/shape"]
    assert raw["t/shape"][1].tolist() == [4, 5, 3]
    one = Schema(t=Tensor("uint8", (None, 3)), i=Int64((None, 2)), f=Float32((2, None)))
    sample = {"t": np.zeros((4, 3), np.uint8), "i": [[1, 2]], "f": [[1.0], [2.0]]}
    assert list(decode_example(one.encode(sample))) == ["t", "i", "f"]


def test_shape_feature_name_collisions():
    with pytest.raises(SchemaError, match="'a/shape' collides"):
        Schema({"a": Tensor("uint8", (None, None)), "a/shape": Int64((2,))})
    with pytest.raises(SchemaError, match="'a/shape' collides"):
        Schema({"a/shape": Int64((2,)), "a": Float32((None, 1, None))})
    Schema({"a": Tensor("uint8", (None, 3)), "a/shape": Int64((2,))})  # no companion: fine


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Bytes((2, 2)), "Bytes: shape must be"),
        (lambda: Int64((-1,)), "ints >= 0 or None"),
        (lambda: Int64((True,)), "ints >= 0 or None"),
        (lambda: Float32("ab"), "must be a tuple"),
        (lambda: Float32((None, 0)), "zero dim next to a single None"),
        (lambda: Tensor("object", (1,)), "dtype must be one of"),
        (lambda: Tensor("U4", (1,)), "dtype must be one of"),
        (lambda: Tensor("float128", (1,)), "not a numpy dtype|dtype must be one of"),
        (lambda: Tensor("nonsense", (1,)), "not a numpy dtype"),
        (lambda: Tensor("uint8", (1,), "gzip"), "compression must be one of"),
        (lambda: Schema({"": Int64()}), "non-empty str"),
        (lambda: Schema({"a": "int64"}), "expected Bytes, Int64, Float32 or Tensor"),
    ],
)
def test_bad_schemas(make, message):
    with pytest.raises(SchemaError, match=message):
        make()


ENCODE_ERRORS = [
    ({}, "missing feature 'i'"),
    ({"i": 1, "extra": 2}, r"not in the schema: \['extra'\]"),
    ({"i": [1, 2]}, r"feature 'i': expected shape \(\), got \(2,\)"),
    ({"i": 1.5}, "feature 'i': 1.5 is not an int64"),
    ({"i": 2**63}, "feature 'i'.*out of int64 range"),
    ({"i": "7"}, "feature 'i': expected integers"),
    ({"f": [[1e300, 0]]}, "feature 'f': a value is out of float32 range"),
    ({"f": "x"}, "feature 'f': expected numbers"),
    ({"f": [[1, 2, 3]]}, r"feature 'f': expected shape \(None, 2\), got \(1, 3\)"),
    ({"t": [[300]]}, "feature 't': 300 is out of uint8 range"),
    ({"t": [[-1]]}, "feature 't': -1 is out of uint8 range"),
    ({"t": np.full((1, 1), 1)}, "feature 't': cannot store dtype int64 as uint8"),
    ({"t8": np.full((1,), 300, np.int16)}, "feature 't8': 300 is out of int8 range"),
    ({"t8": np.array([1e5], np.float32)}, "feature 't8': cannot store dtype float32 as int8"),
    ({"h": np.array(1e6)}, "feature 'h': a value is out of float16 range"),
    ({"t": np.ones((1, 1))}, "feature 't': cannot store dtype float64 as uint8"),
    ({"t": np.ones(3, np.uint8)}, r"feature 't': expected shape \(None, None\), got \(3,\)"),
    ({"b": 5}, "feature 'b': expected bytes or str, got int"),
    ({"bl": b"ab"}, "feature 'bl': expected a list of bytes"),
    ({"bl": [b"a"]}, r"feature 'bl': expected shape \(2,\), got \(1,\)"),
]


@pytest.mark.parametrize(("change", "message"), ENCODE_ERRORS, ids=lambda v: str(v)[:40])
def test_encode_errors_name_the_feature(change, message):
    schema = Schema(
        i=Int64(),
        f=Float32((None, 2)),
        t=Tensor("uint8", (None, None)),
        t8=Tensor("int8", (1,)),
        h=Tensor("float16", ()),
        b=Bytes(),
        bl=Bytes((2,)),
    )
    sample = {"i": 1, "f": [[1, 2]], "t": np.zeros((1, 1), np.uint8), "b": b"", "bl": [b"", b""]}
    sample.update(t8=[1], h=1.0)
    sample = {**sample, **change} if change else {}
    with pytest.raises(SchemaError, match=message):
        schema.encode(sample)


def test_encode_rejects_a_non_mapping():
    with pytest.raises(SchemaError, match="must be a mapping"):
        Schema(a=Int64()).encode([("a", 1)])


DECODE_ERRORS = [
    (Schema(a=Int64()), {"b": ("int64", [1])}, "feature 'a' is missing"),
    (Schema(a=Int64()), {"a": ("float", [1.0])}, "feature 'a': expected a int64 list"),
    (Schema(a=Int64((2,))), {"a": ("int64", [1])}, "feature 'a': expected 2 elements"),
    (Schema(a=Int64()), {"a": (None, None)}, "feature 'a': expected 1 elements"),
    (Schema(a=Float32((None, 3))), {"a": ("float", [1.0] * 4)}, "4 elements do not fit"),
    (Schema(a=Bytes()), {"a": ("bytes", [])}, "expected one bytes value, the record has 0"),
    (Schema(a=Bytes((2,))), {"a": ("bytes", [b""])}, "feature 'a': expected 2 elements"),
    (Schema(t=Tensor("uint16", (2,))), {"t": ("bytes", [b"abc"])}, "expected 4 bytes"),
    (Schema(t=Tensor("uint16", (None,))), {"t": ("bytes", [b"abc"])}, "not a whole number"),
    (Schema(t=Tensor("uint8", (1,))), {"t": ("bytes", [b"a", b"b"])}, "expected one tensor"),
    (
        Schema(t=Tensor("uint8", (None, None))),
        {"t": ("bytes", [b"abcd"])},
        "feature 't/shape' is missing",
    ),
    (
        Schema(t=Tensor("uint8", (None, None))),
        {"t": ("bytes", [b"abcd"]), "t/shape": ("int64", [4])},
        "not a shape of rank 2",
    ),
    (
        Schema(t=Tensor("uint8", (None, 2, None))),
        {"t": ("bytes", [b"abcd"]), "t/shape": ("int64", [1, 4, 1])},
        r"stored shape \(1, 4, 1\) does not match",
    ),
    (
        Schema(t=Tensor("uint8", (None, None))),
        {"t": ("bytes", [b"abcd"]), "t/shape": ("int64", [-2, -2])},
        "not a shape of rank 2",
    ),
    (
        Schema(t=Int64((None, None))),
        {"t": ("int64", [1, 2, 3]), "t/shape": ("int64", [2, 2])},
        r"stored shape \(2, 2\) does not hold 3 elements",
    ),
    (
        Schema(t=Tensor("uint8", (2,), "zstd")),
        {"t": ("bytes", [b"not zstd"])},
        "bad zstd frame",
    ),
    (
        Schema(t=Tensor("uint8", (2,), "zstd")),
        {"t": ("bytes", [zstd_compress(b"abc")])},
        "declares 3 decompressed bytes, expected 2",
    ),
]


@pytest.mark.parametrize(("schema", "record", "message"), DECODE_ERRORS, ids=lambda v: str(v)[:40])
def test_records_that_do_not_fit_raise_corrupt_record_error(schema, record, message):
    with pytest.raises(CorruptRecordError, match=message) as info:
        schema.decode(encode_example(record))
    located = info.value.located("shard-00000.tfrecord", 1024, 7)
    assert str(located).startswith("shard-00000.tfrecord:1024:7: ")


def test_zstd_tensor_limits():
    schema = Schema(t=Tensor("uint8", (None,), "zstd"))
    payload = schema.encode({"t": np.zeros(1 << 16, np.uint8)})
    assert len(payload) < 1 << 10
    assert schema.decode(payload, limits=DecodeLimits(1 << 16))["t"].size == 1 << 16
    with pytest.raises(RecordTooLargeError, match="over the limit of 1000"):
        schema.decode(payload, limits=DecodeLimits(1000))


def test_extra_record_features_are_ignored_and_columns_select():
    schema = Schema(a=Int64(), t=Tensor("uint8", (None, None)), b=Bytes())
    payload = encode_example(
        {"zzz": ("float", [1.0]), **decode_example(schema.encode({"a": 1, "t": [[1]], "b": b""}))}
    )
    assert list(schema.decode(payload)) == ["a", "t", "b"]
    assert list(schema.decode(payload, columns=["b", "t"])) == ["t", "b"]
    assert schema.decode(payload, columns=["t"])["t"].tolist() == [[1]]
    with pytest.raises(SchemaError, match=r"columns not in the schema: \['zzz'\]"):
        schema.decode(payload, columns=["zzz"])
    with pytest.raises(SchemaError, match="sequence of names"):
        schema.decode(payload, columns="a")


def test_schema_container_behaviour():
    schema = Schema({"b": Bytes()}, a=Int64((3,)))
    assert schema.names == ("b", "a") and list(schema) == ["b", "a"] and len(schema) == 2
    assert schema["a"] == Int64((3,)) and "a" in schema and "z" not in schema
    assert schema == Schema(b=Bytes(), a=Int64([3]))
    assert schema != Schema(a=Int64((3,)), b=Bytes())  # order matters: it is the record order
    assert hash(schema) == hash(Schema(b=Bytes(), a=Int64((3,))))
    assert repr(schema) == "Schema({'b': Bytes(), 'a': Int64((3,))})"
    assert (
        repr(Tensor("f4", (None, 2), "zstd")) == "Tensor('float32', (None, 2), compression='zstd')"
    )
    with pytest.raises(TypeError):
        schema.features["c"] = Int64()
    with pytest.raises(AttributeError):
        schema.x = 1
    with pytest.raises(AttributeError):
        schema["a"].shape = ()


def test_json_roundtrip():
    schema = Schema(
        image=Tensor("uint8", (None, None, 3), "zstd"),
        depth=Tensor("float16", (4, None)),
        label=Int64(),
        boxes=Float32((None, 4)),
        caption=Bytes(),
        tags=Bytes((None,)),
        ids=Int64((3,)),
    )
    data = json.loads(json.dumps(schema.to_json()))
    assert data["features"][0] == {
        "name": "image",
        "type": "tensor",
        "dtype": "uint8",
        "shape": [None, None, 3],
        "compression": "zstd",
    }
    assert data["features"][2] == {"name": "label", "type": "int64", "shape": []}
    back = Schema.from_json(data)
    assert back == schema and back.to_json() == data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be"),
        ({"features": {}}, "must be"),
        ({"features": ["x"]}, "must be an object"),
        ({"features": [{"name": "a", "type": "string"}]}, "unknown type 'string'"),
        ({"features": [{"name": "", "type": "int64"}]}, "non-empty"),
        ({"features": [{"name": "a", "type": "int64", "shape": [-1]}]}, ">= 0 or None"),
        ({"features": [{"name": "a", "type": "int64", "shape": [1.5]}]}, ">= 0 or None"),
        ({"features": [{"name": "a", "type": "int64", "shape": "3"}]}, "not a list"),
        ({"features": [{"name": "a", "type": "int64", "dtype": "u1"}]}, "unknown keys"),
        ({"features": [{"name": "a", "type": "tensor", "shape": [1]}]}, "needs a dtype"),
        ({"features": [{"name": "a", "type": "tensor", "dtype": "O", "shape": []}]}, "dtype"),
        ({"features": [{"name": "a", "type": "bytes"}] * 2}, "appears twice"),
    ],
)
def test_from_json_rejects(data, message):
    with pytest.raises(SchemaError, match=message):
        Schema.from_json(data)


def test_infer():
    records = [
        {
            "img": ("bytes", [b"a"]),
            "tags": ("bytes", [b"x", b"y"]),
            "pair": ("bytes", [b"x", b"y"]),
            "label": ("int64", [1]),
            "vec": ("float", [1.0, 2.0, 3.0]),
            "ragged": ("int64", [1]),
            "never": (None, None),
            "img/shape": ("int64", [2, 2]),
        },
        {
            "img": ("bytes", [b"b"]),
            "tags": ("bytes", []),
            "pair": ("bytes", [b"z", b"w"]),
            "label": ("int64", [2]),
            "vec": ("float", [0.0, 0.0, 0.0]),
            "ragged": (None, None),
            "img/shape": ("int64", [1, 3]),
        },
    ]
    schema = Schema.infer(decode_example(encode_example(r)) for r in records)
    assert schema == Schema(
        {
            "img": Bytes(),
            "tags": Bytes((None,)),
            "pair": Bytes((2,)),
            "label": Int64(),
            "vec": Float32((3,)),
            "ragged": Int64((None,)),
            "img/shape": Int64((2,)),
        }
    )
    assert Schema.infer([]) == Schema()
    # A key some records lack is optional: (None,), absent reads as no values.
    notes: list[str] = []
    got = Schema.infer([{"label": ("int64", [1])}, {}], notes=notes)
    assert got == Schema(label=Int64((None,), default=[]))
    assert notes[0].startswith(
        "feature 'label' is in 1 of 2 records (first without it: record 1): "
        "Int64((None,), default=[])"
    )
    late = Schema.infer([{}, {"late": ("bytes", [b"x", b"y"])}], notes=notes)
    assert late == Schema(late=Bytes((None,), default=[]))
    assert "feature 'late' is in 1 of 2 records (first without it: record 0)" in notes[1]
    many = [{"x": ("int64", [1])}] * 3 + [{"x": ("float", [1.0])}, {"x": ("int64", [2])}]
    with pytest.raises(SchemaError) as info:
        Schema.infer(many, where=[f"f.tfrecord:{10 * i}:{i}" for i in range(5)])
    assert str(info.value) == (
        "feature 'x' is int64 in 4 records and float in 1 (first: f.tfrecord:30:3); "
        "read it raw (rk.Dataset(path, raw=True)), or pass a schema"
    )


@pytest.mark.tf
def test_tensorflow_parses_our_records():
    tf = pytest.importorskip("tensorflow")
    schema = Schema(
        label=Int64(), boxes=Float32((None, 4)), caption=Bytes(), img=Tensor("uint16", (2, 3))
    )
    img = np.arange(6, dtype=np.uint16).reshape(2, 3)
    payload = schema.encode({"label": 5, "boxes": np.ones((2, 4)), "caption": "hi", "img": img})
    parsed = tf.io.parse_single_example(
        payload,
        {
            "label": tf.io.FixedLenFeature([], tf.int64),
            "boxes": tf.io.VarLenFeature(tf.float32),
            "caption": tf.io.FixedLenFeature([], tf.string),
            "img": tf.io.FixedLenFeature([], tf.string),
        },
    )
    assert parsed["label"].numpy() == 5
    assert tf.sparse.to_dense(parsed["boxes"]).numpy().tolist() == [1.0] * 8
    assert parsed["caption"].numpy() == b"hi"
    raw = tf.io.decode_raw(parsed["img"], tf.uint16, little_endian=True).numpy()
    assert raw.reshape(2, 3).tolist() == img.tolist()


# --------------------------------------------------------------------------- zstd helpers


def frame_header(content_size):
    # Magic, then a descriptor: 8-byte content size, single segment (no window byte).
    return b"\x28\xb5\x2f\xfd\xe0" + content_size.to_bytes(8, "little")


def test_zstd_roundtrip_records_content_size():
    data = RNG.bytes(5000) * 3
    frame = zstd_compress(data)
    assert zstandard.frame_content_size(frame) == len(data)
    assert zstd_decompress(frame, expected_size=len(data), max_size=len(data)) == data
    assert zstd_decompress(zstd_compress(b""), expected_size=0, max_size=0) == b""
    assert zstd_decompress(
        zstd_compress(memoryview(data), 19), expected_size=None, max_size=1 << 20
    )


def test_zstd_huge_declared_size_fails_before_allocating():
    start = time.perf_counter()
    with pytest.raises(RecordTooLargeError, match="declares 1099511627776"):
        zstd_decompress(frame_header(1 << 40) + b"\x00" * 8, expected_size=None, max_size=1 << 31)
    with pytest.raises(RecordTooLargeError):
        zstd_decompress(frame_header(1 << 40), expected_size=1 << 40, max_size=1 << 31)
    assert time.perf_counter() - start < 0.1


@pytest.mark.parametrize(
    ("frame", "expected", "error", "message"),
    [
        (zstd_compress(b"abc"), 4, CorruptRecordError, "declares 3 .* expected 4"),
        (b"garbage frame", None, CorruptRecordError, "bad zstd frame"),
        (b"", None, CorruptRecordError, "bad zstd frame"),
        (zstd_compress(b"abc" * 100)[:-3], None, CorruptRecordError, "bad zstd frame"),
        (zstd_compress(b"abc") + b"\x00", None, CorruptRecordError, "bad zstd frame"),
        (frame_header(10) + b"\x01\x00\x00", None, CorruptRecordError, "bad zstd frame"),
    ],
)
def test_zstd_bad_frames(frame, expected, error, message):
    with pytest.raises(error, match=message):
        zstd_decompress(frame, expected_size=expected, max_size=1 << 20)


def test_zstd_frames_without_a_size_are_capped():
    unsized = zstandard.ZstdCompressor(write_content_size=False)
    data = RNG.bytes(1000) * 50
    frame = unsized.compress(data)
    assert zstandard.frame_content_size(frame) == -1
    assert zstd_decompress(frame, expected_size=None, max_size=len(data)) == data
    assert zstd_decompress(frame, expected_size=len(data), max_size=1 << 20) == data
    with pytest.raises(RecordTooLargeError, match="more than the limit"):
        zstd_decompress(frame, expected_size=None, max_size=len(data) - 1)
    with pytest.raises(CorruptRecordError, match="expected 10"):
        zstd_decompress(frame, expected_size=10, max_size=1 << 20)
    with pytest.raises(CorruptRecordError, match="truncated zstd frame"):
        zstd_decompress(frame[:-10], expected_size=None, max_size=1 << 20)
    with pytest.raises(CorruptRecordError, match="trailing data"):
        zstd_decompress(frame + frame, expected_size=None, max_size=1 << 20)


def test_zstd_bomb_without_size_stops_near_the_cap():
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(256 << 20))
    assert len(bomb) < 64 << 10
    start = time.perf_counter()
    with pytest.raises(RecordTooLargeError):
        zstd_decompress(bomb, expected_size=None, max_size=1 << 20)
    assert time.perf_counter() - start < 1.0


def test_zstd_is_safe_across_threads():
    blobs = [RNG.bytes(20000) for _ in range(8)]
    frames = [zstd_compress(b) for b in blobs]
    errors = []

    def work(i):
        try:
            for _ in range(50):
                out = zstd_decompress(frames[i], expected_size=len(blobs[i]), max_size=1 << 20)
                assert out == blobs[i]
                assert zstd_compress(blobs[i]) == frames[i]
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors


@pytest.mark.parametrize(
    "ftype",
    [Tensor("float32", (1 << 40,)), Tensor("uint8", (None, 1 << 32)), Int64((1 << 20, 1 << 20))],
)
def test_schema_refuses_fixed_shapes_larger_than_any_record(ftype):
    # Readers size batch buffers from the schema before reading a record.
    with pytest.raises(SchemaError, match=r"'big'.*more than the record limit"):
        Schema(big=ftype)
