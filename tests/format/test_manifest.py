import json

import pytest

from recordkit.errors import ManifestError, ShardNotFoundError
from recordkit.format import MANIFEST_NAME, Manifest, ShardInfo, read_manifest


def test_roundtrip(tmp_path):
    m = Manifest(
        schema={"features": []},
        shards=(ShardInfo("part-00000.tfrecord", 3, 100, 12345),),
        metadata={"classes": ["cat", "dög"]},
        created_by="test",
    )
    m.write(tmp_path)
    back = read_manifest(tmp_path)
    assert back == m
    doc = json.loads((tmp_path / MANIFEST_NAME).read_text("utf-8"))
    assert doc["records"] == 3 and doc["bytes"] == 100 and doc["format_version"] == 1


def test_missing(tmp_path):
    with pytest.raises(ShardNotFoundError):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        json.dumps({"format": "other"}),
        json.dumps({"format": "recordkit", "format_version": 99, "schema": {}, "shards": []}),
        json.dumps({"format": "recordkit", "format_version": 1, "schema": {}}),
        json.dumps(
            {
                "format": "recordkit",
                "format_version": 1,
                "schema": {},
                "shards": [{"path": "../x", "records": 1, "bytes": 1}],
            }
        ),
        json.dumps(
            {
                "format": "recordkit",
                "format_version": 1,
                "schema": {},
                "shards": [{"path": "a", "records": 1, "bytes": 1}] * 2,
            }
        ),
    ],
)
def test_malformed(tmp_path, doc):
    (tmp_path / MANIFEST_NAME).write_text(doc)
    with pytest.raises(ManifestError) as info:
        read_manifest(tmp_path)
    assert MANIFEST_NAME in str(info.value)
