"""``decode_sequence_example`` against protobuf's own ``SequenceExample`` parser."""

import numpy as np
import pytest

from recordkit.codec import decode_example, decode_sequence_example
from recordkit.errors import CorruptRecordError, SequenceExampleError, UnknownFieldError

from .test_example import entry, field, has_unknown_fields, intent, varint

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def pb():
    pytest.importorskip("tensorflow")
    from tensorflow.core.example import example_pb2

    return example_pb2


def _feature(kind, values):
    if kind == "bytes":
        return field(1, 2, b"".join(field(1, 2, v) for v in values))
    if kind == "float":
        return field(2, 2, field(1, 2, np.asarray(values, "<f4").tobytes()))
    return field(3, 2, field(1, 2, b"".join(varint(v) for v in values)))


def _flist(key, *steps):
    return field(
        1, 2, field(1, 2, key.encode()) + field(2, 2, b"".join(field(1, 2, s) for s in steps))
    )


def _theirs(pb, payload):
    msg = pb.SequenceExample.FromString(payload)
    context = {}
    for name, feature in msg.context.feature.items():
        kind = feature.WhichOneof("kind")
        context[name] = (kind[:-5], list(getattr(feature, kind).value)) if kind else (None, None)
    lists = {}
    for name, flist in msg.feature_lists.feature_list.items():
        steps = []
        for feature in flist.feature:
            kind = feature.WhichOneof("kind")
            steps.append((kind[:-5], list(getattr(feature, kind).value)) if kind else (None, None))
        lists[name] = [intent({"s": s})["s"] for s in steps]
    return intent(context), lists


def _ours(payload):
    context, lists = decode_sequence_example(payload)
    return intent(context), {
        n: [intent({"s": s})["s"] for s in steps] for n, steps in lists.items()
    }


CONTEXT = field(
    1, 2, entry("id", _feature("int64", [7])) + entry("name", _feature("bytes", [b"a"]))
)
LISTS = field(
    2,
    2,
    _flist("tok", _feature("int64", [1, 2]), _feature("int64", []), _feature("int64", [3]))
    + _flist("w", _feature("bytes", [b"x", b"yy"]))
    + _flist("f", _feature("float", [0.5]), b""),  # b"": a step with no list set
)
CASES = {
    "context and lists": CONTEXT + LISTS,
    "lists before context": LISTS + CONTEXT,
    "no context": LISTS,
    "an Example": CONTEXT,
    "a repeated list key replaces": field(
        2, 2, _flist("k", _feature("int64", [1])) + _flist("k", _feature("bytes", [b"z"]))
    ),
    "a repeated FeatureList value merges": field(
        2,
        2,
        field(
            1,
            2,
            field(1, 2, b"k")
            + field(2, 2, field(1, 2, _feature("int64", [1])))
            + field(2, 2, field(1, 2, _feature("int64", [2]))),
        ),
    ),
    "feature_lists twice merge": field(2, 2, _flist("a", _feature("int64", [1])))
    + field(2, 2, _flist("b", _feature("float", [2.0]))),
    "oneof: the last member wins, the same one merges": field(
        2,
        2,
        _flist("m", _feature("int64", [1]) + _feature("bytes", [b"q"]) + _feature("bytes", [b"r"])),
    ),
}

# Fields a message does not define: protobuf skips them, the decoder names them.
UNKNOWN = {
    "in the SequenceExample": (
        CONTEXT + field(9, 0, varint(5)),
        "field 9 (varint) inside the SequenceExample at payload byte 30",
    ),
    "in the context's Features": (
        field(1, 2, field(4, 0, varint(1))),
        "field 4 (varint) inside SequenceExample.context at payload byte 2",
    ),
    "in a context Feature": (
        field(1, 2, entry("id", _feature("int64", [7]) + field(6, 5, b"abcd"))),
        "field 6 (32-bit) inside context Feature 'id' at payload byte 15",
    ),
    "in a context Int64List": (
        field(1, 2, entry("id", field(3, 2, field(1, 2, varint(7)) + field(2, 0, varint(1))))),
        "field 2 (varint) inside the Int64List of context feature 'id' at payload byte 15",
    ),
    "in FeatureLists": (
        field(2, 2, field(15, 2, b"zz") + _flist("a", _feature("int64", [4]))),
        "field 15 (length-delimited) inside SequenceExample.feature_lists at payload byte 2",
    ),
    "in a FeatureLists map entry": (
        field(2, 2, field(1, 2, field(3, 0, varint(1)) + field(1, 2, b"k"))),
        "field 3 (varint) inside the map entry of feature list 'k' at payload byte 4",
    ),
    "in a FeatureList, before its key": (
        field(2, 2, field(1, 2, field(2, 2, field(2, 0, varint(1))) + field(1, 2, b"k"))),
        "field 2 (varint) inside FeatureList 'k' at payload byte 6",
    ),
    "in a step's Feature": (
        field(
            2, 2, _flist("a", _feature("int64", [4]), _feature("int64", [5]) + field(8, 0, b"\x01"))
        ),
        "field 8 (varint) inside the Feature of step 1 of feature list 'a' at payload byte 23",
    ),
    "in a step's BytesList, in a merged FeatureList": (
        field(
            2,
            2,
            field(
                1,
                2,
                field(1, 2, b"w")
                + field(2, 2, field(1, 2, _feature("bytes", [b"x"])))
                + field(
                    2, 2, field(1, 2, field(1, 2, field(1, 2, b"y") + field(3, 1, b"8bytes!!")))
                ),
            ),
        ),
        "field 3 (64-bit) inside the BytesList of step 1 of feature list 'w' at payload byte 25",
    ),
}


@pytest.mark.parametrize(("payload", "message"), UNKNOWN.values(), ids=list(UNKNOWN))
def test_unknown_fields_are_refused_by_name(pb, payload, message):
    proto = pb.SequenceExample.FromString(payload)  # protobuf reads it, dropping the field
    assert has_unknown_fields(proto)
    with pytest.raises(UnknownFieldError) as info:
        decode_sequence_example(payload)
    assert info.value.reason == (
        f"{message}, which tf.train.SequenceExample does not define: TensorFlow would drop it "
        "silently, so the record is refused"
    )
    assert info.value.message == "tf.train.SequenceExample"


@pytest.mark.parametrize("payload", list(CASES.values()), ids=list(CASES))
def test_same_as_protobuf(pb, payload):
    assert _ours(payload) == _theirs(pb, payload)


def test_every_truncation_is_rejected_or_read_as_protobuf_reads_it(pb):
    payload = CONTEXT + LISTS
    for cut in range(len(payload)):
        part = payload[:cut]
        try:
            theirs = _theirs(pb, part)
        except Exception:
            theirs = None
        try:
            ours = _ours(part)
        except CorruptRecordError:
            ours = None
        assert ours == theirs, cut


def test_an_example_reader_refuses_it():
    with pytest.raises(SequenceExampleError, match=r"tf\.train\.SequenceExample"):
        decode_example(CONTEXT + LISTS)
    assert intent(decode_example(CONTEXT)) == _ours(CONTEXT)[0]
