"""The hand-written tf.train.Example codec, pinned to TensorFlow's own protobuf both ways."""

import contextlib
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from recordkit.codec import KINDS, decode_example, encode_example
from recordkit.errors import CorruptRecordError, SchemaError, UnknownFieldError

INT64 = st.integers(-(2**63), 2**63 - 1)
FEATURE = st.one_of(
    st.tuples(st.just("bytes"), st.lists(st.binary(max_size=40), max_size=5)),
    st.tuples(st.just("float"), st.lists(st.floats(width=32), max_size=12)),
    st.tuples(st.just("int64"), st.lists(INT64, max_size=12)),
    st.tuples(st.just("int64"), st.lists(st.integers(0, 127), min_size=49, max_size=80)),
)
FEATURES = st.dictionaries(st.text(max_size=8), FEATURE, max_size=6)
EDGES = {
    "": ("int64", [-(2**63), 2**63 - 1, -1, 0, 127, 128, 2**56]),
    "ünï/😀": ("float", [float("inf"), float("-inf"), float("nan"), -0.0, 1e-45]),
    "e": ("bytes", [b"", b"\x00" * 3]),
    "empty_b": ("bytes", []),
    "empty_f": ("float", []),
    "empty_i": ("int64", []),
}
slow_ok = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def pb():
    """TensorFlow's generated Example message classes (imports TensorFlow once)."""
    pytest.importorskip("tensorflow")
    from tensorflow.core.example import example_pb2, feature_pb2

    return example_pb2, feature_pb2


def to_proto(pb, features):
    example_pb2, feature_pb2 = pb
    example = example_pb2.Example(features=feature_pb2.Features())
    for name, (kind, values) in features.items():
        feature = example.features.feature[name]
        lst = getattr(feature, f"{kind}_list")
        lst.SetInParent()  # an empty list is still set, as TensorFlow writes it
        lst.value.extend(values)
    return example


def intent(features):
    """What a features dict means, with floats as float32 bit patterns."""
    out = {}
    for name, (kind, values) in features.items():
        if kind == "float":
            out[name] = (kind, np.asarray(values, np.float32).view(np.uint32).tolist())
        elif kind == "int64":
            out[name] = (kind, [int(v) for v in np.asarray(values, np.int64).reshape(-1)])
        elif kind == "bytes":
            out[name] = (kind, [bytes(v) for v in values])
        else:
            out[name] = (None, None)
    return out


def from_proto(example):
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            out[name] = (None, None)
        else:
            out[name] = (kind[: -len("_list")], list(getattr(feature, kind).value))
    return intent(out)


def from_ours(decoded):
    return intent(decoded)


def field(number, wire, data=b""):
    tag = varint(number << 3 | wire)
    return tag + (varint(len(data)) + data if wire == 2 else data)


def varint(n):
    n &= 2**64 - 1
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def entry(key, feature):
    return field(1, 2, field(1, 2, key.encode()) + field(2, 2, feature))


def example_of(*entries):
    return field(1, 2, b"".join(entries))


def has_unknown_fields(proto):
    """Whether protobuf skipped a field anywhere in the message (it keeps them aside)."""
    known = type(proto)()
    known.CopyFrom(proto)
    known.DiscardUnknownFields()  # recursive
    return known.SerializeToString(deterministic=True) != proto.SerializeToString(
        deterministic=True
    )


def same_as_protobuf(pb, payload):
    """Our decode equals protobuf's, or both reject the payload, or protobuf parses it
    only by skipping a field, which we refuse (UnknownFieldError)."""
    try:
        proto = pb[0].Example.FromString(bytes(payload))
    except Exception:
        proto = None
    try:
        ours = from_ours(decode_example(payload))
    except UnknownFieldError:
        assert proto is None or has_unknown_fields(proto)
        return
    except CorruptRecordError:
        ours = None
    assert ours == (None if proto is None else from_proto(proto))
    assert proto is None or not has_unknown_fields(proto)  # nothing dropped, silently


# --------------------------------------------------------------------------- TF oracle


@pytest.mark.tf
@slow_ok
@given(FEATURES)
@example(EDGES)
@example({})
def test_our_encoding_parses_in_protobuf(pb, features):
    parsed = pb[0].Example.FromString(encode_example(features))
    assert from_proto(parsed) == intent(features)


@pytest.mark.tf
@slow_ok
@given(FEATURES)
@example(EDGES)
@example({})
def test_we_decode_protobuf_encoding(pb, features):
    decoded = decode_example(to_proto(pb, features).SerializeToString())
    assert from_ours(decoded) == intent(features)
    assert set(decoded) == set(features)


@pytest.mark.tf
@slow_ok
@given(FEATURES)
@example(EDGES)
@example({})
def test_bytes_identical_to_protobuf(pb, features):
    # Protobuf orders map entries itself (hash order, or sorted when
    # deterministic), so encode in the order it chose and compare bytes.
    proto = to_proto(pb, features)
    for theirs in (proto.SerializeToString(), proto.SerializeToString(deterministic=True)):
        order = list(decode_example(theirs))
        assert encode_example({k: features[k] for k in order}) == theirs


@pytest.mark.tf
def test_unset_feature_and_empty_example_match_protobuf(pb):
    example_pb2, _ = pb
    proto = example_pb2.Example()
    proto.features.feature["x"].SetInParent()
    assert encode_example({"x": (None, None)}) == proto.SerializeToString()
    assert decode_example(proto.SerializeToString()) == {"x": (None, None)}
    assert encode_example({}) == example_pb2.Example(features={}).SerializeToString()
    assert decode_example(b"") == {} == decode_example(b"\x0a\x00")


# --------------------------------------------------------------------------- protobuf rules

PROTOBUF_RULES = {
    "duplicate key: later entry wins": example_of(
        entry("a", field(3, 2, field(1, 2, varint(1)))),
        entry("a", field(1, 2, field(1, 2, b"x"))),
    ),
    "features field repeated: maps merge": field(1, 2, entry("a", field(3, 2, b"")))
    + field(1, 2, entry("b", field(2, 2, b""))),
    "oneof: last member wins": example_of(
        entry("a", field(1, 2, field(1, 2, b"x")) + field(3, 2, field(1, 2, varint(5))))
    ),
    "oneof: same member twice merges": example_of(
        entry("a", field(3, 2, field(1, 2, varint(5))) + field(3, 2, field(1, 2, varint(6))))
    ),
    "oneof: switch back drops earlier": example_of(
        entry(
            "a",
            field(1, 2, field(1, 2, b"x"))
            + field(3, 2, field(1, 2, varint(5)))
            + field(1, 2, field(1, 2, b"y")),
        )
    ),
    "entry value repeated merges": field(
        1,
        2,
        field(
            1,
            2,
            field(1, 2, b"k")
            + field(2, 2, field(2, 2, field(1, 5, struct.pack("<f", 1.5))))
            + field(2, 2, field(2, 2, field(1, 2, struct.pack("<2f", 2, 3)))),
        ),
    ),
    "entry key repeated: last wins, value before key": field(
        1, 2, field(1, 2, field(2, 2, b"") + field(1, 2, b"a") + field(1, 2, b"b"))
    ),
    "entry without key or value": field(1, 2, field(1, 2, b"")),
    "unpacked int64 mixed with packed": example_of(
        entry(
            "a",
            field(
                3,
                2,
                field(1, 0, varint(-1))
                + field(1, 2, varint(300) + varint(2))
                + field(1, 0, varint(7))
                + field(1, 2, b""),
            ),
        )
    ),
    "packed floats in several chunks": example_of(
        entry(
            "f",
            field(
                2,
                2,
                field(1, 2, struct.pack("<2f", 1, 2))
                + field(1, 5, struct.pack("<f", 3))
                + field(1, 2, struct.pack("<f", 4)),
            ),
        )
    ),
    # Example.features with a 2-byte tag and a 3-byte length, holding one entry
    # whose length is a 2-byte varint.
    "non-minimal tag and length varints": b"\x8a\x00\x8a\x80\x00"
    + b"\x0a\x87\x00"
    + b"\x0a\x01a\x12\x02\x1a\x00",
    "10-byte varints with bits past 64, vectorised": example_of(
        entry("a", field(3, 2, field(1, 2, (b"\xff" * 9 + b"\x7f") * 6)))
    ),
    "10-byte varint with bits past 64": example_of(
        entry("a", field(3, 2, field(1, 2, b"\xff" * 9 + b"\x7f")))
    ),
}


@pytest.mark.tf
@pytest.mark.parametrize("payload", PROTOBUF_RULES.values(), ids=list(PROTOBUF_RULES))
def test_protobuf_parse_rules(pb, payload):
    assert pb[0].Example.FromString(payload) is not None  # protobuf accepts it
    same_as_protobuf(pb, payload)


def test_protobuf_rules_without_tensorflow():
    decoded = decode_example(PROTOBUF_RULES["oneof: switch back drops earlier"])
    assert from_ours(decoded) == {"a": ("bytes", [b"y"])}
    decoded = decode_example(PROTOBUF_RULES["unpacked int64 mixed with packed"])
    assert from_ours(decoded) == {"a": ("int64", [-1, 300, 2, 7])}
    decoded = decode_example(PROTOBUF_RULES["entry key repeated: last wins, value before key"])
    assert decoded == {"b": (None, None)}


# Fields a message does not define: protobuf skips them (TensorFlow with it), dropping
# what they hold; the codec refuses the record, naming the field, its wire type, where it
# sits and its tag's payload byte.
UNKNOWN_FIELDS = {
    "in the Example": (
        example_of(entry("a", b"")) + field(9, 0, varint(2**63)),
        "field 9 (varint) inside the Example at payload byte 9",
    ),
    "in Example.features": (
        field(1, 2, field(15, 1, b"\x00" * 8) + entry("a", b"")),
        "field 15 (64-bit) inside Example.features at payload byte 2",
    ),
    "in a map entry, before its key": (
        example_of(field(1, 2, field(3, 5, b"abcd") + field(1, 2, b"k") + field(2, 2, b""))),
        "field 3 (32-bit) inside the map entry of feature 'k' at payload byte 4",
    ),
    "in a Feature, before the key": (
        example_of(field(1, 2, field(2, 2, field(7, 5, b"abcd")) + field(1, 2, b"k"))),
        "field 7 (32-bit) inside Feature 'k' at payload byte 6",
    ),
    "in a Feature, after its list": (
        example_of(entry("a", field(3, 2, field(1, 2, varint(42))) + field(9, 0, varint(1)))),
        "field 9 (varint) inside Feature 'a' at payload byte 14",
    ),
    "in a BytesList": (
        example_of(entry("b", field(1, 2, field(1, 2, b"x") + field(2, 2, b"zz")))),
        "field 2 (length-delimited) inside the BytesList of feature 'b' at payload byte 14",
    ),
    "in an Int64List": (
        example_of(entry("i", field(3, 2, field(1, 2, varint(42)) + field(4, 1, b"\x01" * 8)))),
        "field 4 (64-bit) inside the Int64List of feature 'i' at payload byte 14",
    ),
    "in a FloatList": (
        example_of(entry("f", field(2, 2, field(5, 0, varint(1))))),
        "field 5 (varint) inside the FloatList of feature 'f' at payload byte 11",
    ),
    "int64 values as fixed32 (a known number, another wire type)": (
        example_of(entry("i", field(3, 2, field(1, 5, b"abcd")))),
        "field 1 (32-bit) inside the Int64List of feature 'i' at payload byte 11",
    ),
    "floats as varints": (
        example_of(entry("f", field(2, 2, field(1, 0, varint(3))))),
        "field 1 (varint) inside the FloatList of feature 'f' at payload byte 11",
    ),
    "bytes as a varint": (
        example_of(entry("b", field(1, 2, field(1, 0, varint(3))))),
        "field 1 (varint) inside the BytesList of feature 'b' at payload byte 11",
    ),
    "Example.features as a varint": (
        field(1, 0, varint(3)),
        "field 1 (varint) inside the Example at payload byte 0",
    ),
    "a group": (
        example_of(entry("a", field(1, 3) + field(1, 4))),
        "field 1 (group start) inside Feature 'a' at payload byte 9",
    ),
    "a group holding a field": (
        field(1, 3) + field(1, 0, varint(1)) + field(1, 4),
        "field 1 (group start) inside the Example at payload byte 0",
    ),
    "a group end alone": (field(1, 4), "field 1 (group end) inside the Example at payload byte 0"),
    "the largest field number, its tag in 5 bytes": (
        example_of(entry("a", b"")) + field(2**29 - 1, 2, b"ignored"),
        f"field {2**29 - 1} (length-delimited) inside the Example at payload byte 9",
    ),
    "a tag written in more bytes than it needs": (
        example_of(entry("a", b"\xc8\x80\x00" + varint(1))),
        "field 9 (varint) inside Feature 'a' at payload byte 9",
    ),
    "a huge length it never reads": (
        example_of(entry("k", b"\x22" + varint(2**60) + b"\x00" * 16)),
        "field 4 (length-delimited) inside Feature 'k' at payload byte 9",
    ),
    "before a malformed field": (
        example_of(entry("a", field(9, 0, varint(1)))) + b"\x0a\x80",
        "field 9 (varint) inside Feature 'a' at payload byte 9",
    ),
    "a value past the end (fixed64)": (
        b"\x09\x00",
        "field 1 (64-bit) inside the Example at payload byte 0",
    ),
    "an 11-byte varint": (
        b"\x08" + b"\x80" * 10 + b"\x01",
        "field 1 (varint) inside the Example at payload byte 0",
    ),
}
# Those that protobuf also rejects: a malformed part, or a value past the end.
PROTOBUF_REJECTS = {
    "a group end alone",
    "a huge length it never reads",
    "before a malformed field",
    "a value past the end (fixed64)",
    "an 11-byte varint",
}


@pytest.mark.parametrize(("payload", "message"), UNKNOWN_FIELDS.values(), ids=list(UNKNOWN_FIELDS))
def test_unknown_fields_are_refused_by_name(payload, message):
    with pytest.raises(UnknownFieldError) as info:
        decode_example(payload)
    err = info.value
    assert err.reason == (
        f"{message}, which tf.train.Example does not define: TensorFlow would drop it "
        "silently, so the record is refused"
    )
    assert isinstance(err, CorruptRecordError) and err.message == "tf.train.Example"
    assert f"field {err.field_number} ({err.wire_type}) inside {err.where} at payload byte " in (
        err.reason
    )
    located = err.located("a.tfrecord", 16, 1)
    assert type(located) is UnknownFieldError and located.field_number == err.field_number
    assert str(located) == f"a.tfrecord:16:1: {err.reason}"
    # keys= leaves the values of other features unread, never the Example's structure
    if "List" not in message:
        with pytest.raises(UnknownFieldError):
            decode_example(payload, keys=())


@pytest.mark.tf
@pytest.mark.parametrize(
    "payload",
    [p for n, (p, _) in UNKNOWN_FIELDS.items() if n not in PROTOBUF_REJECTS],
    ids=[n for n in UNKNOWN_FIELDS if n not in PROTOBUF_REJECTS],
)
def test_protobuf_reads_them_by_dropping_the_field(pb, payload):
    """What we refuse, protobuf parses, keeping the field aside and out of the Example."""
    proto = pb[0].Example.FromString(payload)
    assert has_unknown_fields(proto)
    known = pb[0].Example()
    known.CopyFrom(proto)
    known.DiscardUnknownFields()
    assert from_proto(known) == from_proto(proto)  # what TensorFlow's Example holds: no trace


@pytest.mark.tf
@pytest.mark.parametrize("name", sorted(PROTOBUF_REJECTS))
def test_protobuf_rejects_the_others(pb, name):
    with pytest.raises(Exception):  # noqa: B017 - upb raises its own DecodeError
        pb[0].Example.FromString(UNKNOWN_FIELDS[name][0])


MALFORMED = {
    "wire type 6": example_of(entry("a", b"\x0e")),
    "wire type 7": b"\x0f",
    "field number 0": example_of(b"\x02\x00"),
    "bad UTF-8 key": field(1, 2, field(1, 2, field(1, 2, b"\xff\xfe"))),
    "truncated varint": b"\x0a\x80",
    "11-byte packed int64": example_of(
        entry("a", field(3, 2, field(1, 2, b"\x80" * 10 + b"\x01")))
    ),
    "11-byte unpacked int64": example_of(entry("a", field(3, 2, b"\x08" + b"\x80" * 10 + b"\x01"))),
    "packed int64 cut mid-varint": example_of(entry("a", field(3, 2, field(1, 2, b"\x01\x80")))),
    "chunks joining a cut varint": example_of(
        entry("a", field(3, 2, field(1, 2, b"\x80") + field(1, 2, b"\x01")))
    ),
    "packed floats not a multiple of 4": example_of(entry("a", field(2, 2, field(1, 2, b"abc")))),
    "fixed32 past the end": example_of(entry("a", field(2, 2, b"\x0d\x00\x00"))),
    "length past the end": b"\x0a\x05\x0a\x00",
    "inner length past its message": field(1, 2, b"\x0a\x03\x0a\x05k") + b"\x00" * 8,
}


@pytest.mark.parametrize("payload", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_payloads_raise(payload):
    with pytest.raises(CorruptRecordError, match=r"malformed tf.train.Example: .* byte \d+"):
        decode_example(payload)


@pytest.mark.tf
@pytest.mark.parametrize(
    "payload",
    MALFORMED.values(),
    ids=list(MALFORMED),
)
def test_protobuf_rejects_them_too(pb, payload):
    with pytest.raises(Exception):  # noqa: B017 - upb raises its own DecodeError
        pb[0].Example.FromString(payload)


def _huge(tag):
    return bytes([tag]) + varint(2**60) + b"\x00" * 16


HUGE_LENGTHS = {
    "Example.features": _huge(0x0A),
    "Features.feature": field(1, 2, _huge(0x0A)),
    "entry key": field(1, 2, field(1, 2, _huge(0x0A))),
    "entry value": field(1, 2, field(1, 2, field(1, 2, b"k") + _huge(0x12))),
    "Feature.bytes_list": example_of(field(1, 2, field(1, 2, b"k") + field(2, 2, _huge(0x0A)))),
    "BytesList.value": example_of(entry("k", field(1, 2, _huge(0x0A)))),
    "Int64List.value": example_of(entry("k", field(3, 2, _huge(0x0A)))),
}


@pytest.mark.parametrize("payload", HUGE_LENGTHS.values(), ids=list(HUGE_LENGTHS))
def test_huge_length_fails_fast(payload):
    start = time.perf_counter()
    with pytest.raises(CorruptRecordError, match="length 1152921504606846976 runs past"):
        decode_example(payload)
    assert time.perf_counter() - start < 0.1


VALID = encode_example(
    {
        "image": ("bytes", [b"\x89PNG" * 40, b""]),
        "label": ("int64", [3, -2, 2**40]),
        "bbox": ("float", [0.5, 0.25, 1.0, 1.0]),
        "n": ("int64", list(range(100, 200))),
    }
)


def test_every_truncation_is_rejected_or_valid():
    for cut in range(len(VALID)):
        with contextlib.suppress(CorruptRecordError):
            decode_example(VALID[:cut])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_corruption_raises_only_corrupt_record_error(data):
    payload = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    with contextlib.suppress(CorruptRecordError):
        decode_example(bytes(payload))


@pytest.mark.tf
@settings(slow_ok, max_examples=300)
@given(st.data())
def test_corrupted_payloads_decode_as_protobuf_does(pb, data):
    payload = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(payload) - 1))
        payload[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    same_as_protobuf(pb, bytes(payload[:cut]))


# --------------------------------------------------------------------------- our API


def test_values_are_views_into_the_payload():
    payload = encode_example({"b": ("bytes", [b"abc" * 100]), "f": ("float", [1.0, 2.0])})
    decoded = decode_example(payload)
    assert decoded["b"][1][0].obj is payload
    floats = decoded["f"][1]
    assert floats.dtype == np.float32 and not floats.flags.owndata
    assert np.shares_memory(floats, np.frombuffer(payload, np.uint8))


def test_inputs_of_every_buffer_kind():
    payload = encode_example({"x": ("int64", [1, 2, 3])})
    for buf in (payload, bytearray(payload), memoryview(payload), np.frombuffer(payload, "u1")):
        assert decode_example(buf)["x"][1].tolist() == [1, 2, 3]


def test_keys_limits_what_is_materialized():
    decoded = decode_example(VALID, keys={"label"})
    assert list(decoded) == ["label"]


def test_encode_accepts_arrays_scalars_and_buffers():
    ints = np.arange(-5, 5, dtype=np.int32).reshape(2, 5)
    payload = encode_example(
        {
            "i": ("int64", ints),
            "s": ("int64", 7),
            "u": ("int64", np.array([2**63 - 1], np.uint64)),
            "f": ("float", np.eye(2, dtype=np.float64)),
            "b": ("bytes", [bytearray(b"ab"), memoryview(b"cd"), np.array([1, 2], np.uint8)]),
        }
    )
    decoded = from_ours(decode_example(payload))
    assert decoded["i"] == ("int64", list(range(-5, 5)))
    assert decoded["s"] == ("int64", [7])
    assert decoded["u"] == ("int64", [2**63 - 1])
    assert decoded["f"] == intent({"f": ("float", [1, 0, 0, 1])})["f"]
    assert decoded["b"] == ("bytes", [b"ab", b"cd", b"\x01\x02"])


@settings(deadline=None)
@given(st.lists(INT64, max_size=300))
def test_vectorised_varints_roundtrip(values):
    decoded = decode_example(encode_example({"v": ("int64", np.array(values, np.int64))}))
    assert decoded["v"][1].tolist() == values


def test_negative_int64_is_ten_bytes():
    assert encode_example({"": ("int64", [-1])}).endswith(b"\xff" * 9 + b"\x01")


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({1: ("int64", [1])}, "names must be str"),
        ({"a": "int64"}, "pair"),
        ({"a": ("string", [b""])}, "kind must be one of"),
        ({"a": ("bytes", b"abc")}, "a single bytes"),
        ({"a": ("bytes", [1])}, "bytes-like"),
        ({"a": ("int64", [1.5])}, "not an int64"),
        ({"a": ("int64", [2**63])}, "out of int64 range"),
        ({"a": ("int64", [2**64])}, "not an int64"),
        ({"a": ("int64", ["x"])}, "expected integers"),
        ({"a": ("float", ["1.5"])}, "expected numbers"),
        ({"a": ("float", [1j])}, "expected numbers"),
        ({"a": ("float", [[1], [2, 3]])}, "float32"),
    ],
)
def test_encode_errors_name_the_feature(features, message):
    with pytest.raises(SchemaError, match=message):
        encode_example(features)


def test_kinds():
    assert KINDS == ("bytes", "float", "int64")
