"""``SequenceSchema``: what a set of SequenceExamples holds, and the manifest's payload kind."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordkit.codec import Schema, SequenceSchema, decode_sequence_example
from recordkit.codec.sequence import has_feature_lists, sequence_example_values
from recordkit.errors import CorruptRecordError, ManifestError, SchemaError
from recordkit.format.manifest import Manifest, ShardInfo

from .test_example import field
from .test_sequence import CONTEXT, LISTS, _feature, _flist

KIND = st.sampled_from(["bytes", "float", "int64", None])


@st.composite
def records(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A decoded SequenceExample: a few context features and feature lists, any kinds."""

    def values(kind: str | None) -> Any:
        return None if kind is None else [0] * draw(st.integers(0, 3))

    names = st.sampled_from(["a", "b", "c"])
    context = {n: (k, values(k)) for n, k in draw(st.dictionaries(names, KIND, max_size=3)).items()}
    lists = {}
    for name in draw(st.sets(names, max_size=3)):
        lists[name] = [(k, values(k)) for k in draw(st.lists(KIND, max_size=4))]
    return context, lists


@settings(max_examples=200, deadline=None)
@given(st.lists(records(), max_size=12), st.integers(0, 12))
def test_merged_parts_count_what_the_whole_counts(found: list[Any], cut: int):
    whole, head, tail = SequenceSchema(), SequenceSchema(), SequenceSchema()
    for i, (context, lists) in enumerate(found):
        whole.add(context, lists)
        (head if i < cut else tail).add(context, lists)
    merged = SequenceSchema.merged([head, tail])
    assert merged == whole and merged.to_json() == whole.to_json()
    again = SequenceSchema.from_json(json.loads(json.dumps(whole.to_json())))
    assert again == whole and again.records == len(found)
    for context, lists in found:
        whole.check(context, lists)  # every record it was built from fits it


def test_counts_kinds_and_lengths():
    schema = SequenceSchema()
    for payload in (CONTEXT + LISTS, CONTEXT):
        schema.add(*decode_sequence_example(payload))
    doc = schema.to_json()
    assert doc == {
        "records": 2,
        "context": [
            {"name": "id", "records": 2, "kinds": {"int64": 2}, "values": [1, 1]},
            {"name": "name", "records": 2, "kinds": {"bytes": 2}, "values": [1, 1]},
        ],
        "feature_lists": [
            {"name": "f", "records": 1, "steps": [2, 2], "kinds": {"float": 1, "unset": 1},
             "values": [1, 1]},
            {"name": "tok", "records": 1, "steps": [3, 3], "kinds": {"int64": 3},
             "values": [0, 2]},
            {"name": "w", "records": 1, "steps": [1, 1], "kinds": {"bytes": 1}, "values": [2, 2]},
        ],
    }  # fmt: skip
    assert schema.kinds("feature_lists") == {"f": ["float"], "tok": ["int64"], "w": ["bytes"]}
    assert schema.describe() == [
        "context/id: int64 (in 2 of 2 records, 1 value)",
        "context/name: bytes (in 2 of 2 records, 1 value)",
        "feature_lists/f: float, unset (in 1 of 2 records, 2 steps, 1 value per step)",
        "feature_lists/tok: int64 (in 1 of 2 records, 3 steps, 0-2 values per step)",
        "feature_lists/w: bytes (in 1 of 2 records, 1 steps, 2 values per step)",
    ]
    with pytest.raises(ValueError, match="part must be"):
        schema.kinds("lists")


def test_check_and_decode_refuse_what_it_does_not_name():
    schema = SequenceSchema()
    schema.add(*decode_sequence_example(CONTEXT + LISTS))
    assert_same = sequence_example_values(CONTEXT + LISTS)
    got = schema.decode(CONTEXT + LISTS)
    assert got.keys() == assert_same.keys()
    np.testing.assert_array_equal(got["feature_lists"]["tok"][0], [1, 2])
    unset = field(2, 2, _flist("tok", b""))  # a step with no list set fits any list
    schema.decode(unset)
    empty = field(2, 2, field(1, 2, field(1, 2, b"new")))  # a list of no steps, unnamed
    with pytest.raises(CorruptRecordError, match="feature list 'new', which the schema"):
        schema.decode(empty)
    other = field(2, 2, _flist("tok", _feature("bytes", [b"x"])))
    with pytest.raises(CorruptRecordError, match=r"'tok' as bytes, .* \(it has int64\)"):
        schema.decode(other)
    with pytest.raises(CorruptRecordError, match=r"malformed tf\.train\.SequenceExample"):
        schema.decode(b"\x12\x05\x0a")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "a SequenceExample schema is"),
        ({"records": 1, "context": []}, "a SequenceExample schema is"),
        ({"records": -1, "context": [], "feature_lists": []}, "records must be a count"),
        ({"records": True, "context": [], "feature_lists": []}, "records must be a count"),
        ({"records": 1, "context": {}, "feature_lists": []}, "context must be a list"),
        ({"records": 1, "context": [{"name": "a"}], "feature_lists": []}, "has the keys"),
        (
            {"records": 1, "context": [], "feature_lists": [
                {"name": "a", "records": 1, "kinds": {"int64": 1}, "values": [1, 1]}]},
            "has the keys",
        ),
        (
            {"records": 1, "context": [
                {"name": 3, "records": 1, "kinds": {"int64": 1}, "values": None}],
             "feature_lists": []},
            "is not a string",
        ),
        (
            {"records": 1, "context": [
                {"name": "a", "records": 1, "kinds": {"int32": 1}, "values": None}],
             "feature_lists": []},
            "kinds must map",
        ),
        (
            {"records": 1, "context": [
                {"name": "a", "records": 1, "kinds": {}, "values": [2, 1]}],
             "feature_lists": []},
            "min > max",
        ),
        (
            {"records": 1, "context": [
                {"name": "a", "records": 1, "kinds": {}, "values": None},
                {"name": "a", "records": 1, "kinds": {}, "values": None}],
             "feature_lists": []},
            "appears twice",
        ),
    ],
)  # fmt: skip
def test_from_json_refuses_what_it_did_not_write(doc: Any, message: str):
    with pytest.raises(SchemaError, match=message):
        SequenceSchema.from_json(doc)


def test_has_feature_lists_reads_the_top_level():
    assert has_feature_lists(CONTEXT + LISTS) and has_feature_lists(LISTS)
    assert has_feature_lists(CONTEXT + b"\x12\x00")  # empty, but there: a SequenceExample
    assert not has_feature_lists(CONTEXT) and not has_feature_lists(b"")
    with pytest.raises(CorruptRecordError, match=r"malformed tf\.train\.Example: length 9"):
        has_feature_lists(b"\x0a\x09abc")  # asked of records taken for Examples


def test_manifest_payload_kind():
    shards = (ShardInfo("a.tfrecord", 1, 20, 0),)
    plain = Manifest(schema=Schema({}).to_json(), shards=shards)
    assert "payload" not in plain.to_json() and not plain.sequence_example
    seq = Manifest(schema=SequenceSchema().to_json(), shards=shards, payload="sequence_example")
    back = Manifest.loads(seq.dumps())
    assert back.sequence_example and back.to_json()["payload"] == "sequence_example"
    assert back == seq
    doc = json.loads(seq.dumps()) | {"payload": "video"}
    with pytest.raises(ManifestError, match="payload 'video' is not a kind this recordkit reads"):
        Manifest.loads(json.dumps(doc))
    with pytest.raises(ManifestError, match="upgrade recordkit"):
        Manifest(schema={}, shards=shards, payload="video")
    with pytest.raises(SchemaError, match=r"the schema of tf\.train\.SequenceExample records"):
        Schema.from_json(seq.schema)
