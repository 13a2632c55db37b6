"""The in-progress marker and ``check_complete``: the format layer's part of issue 20."""

from __future__ import annotations

import json
import logging
import pickle

import pytest

from recordkit.errors import IncompleteDatasetError, RecordkitError
from recordkit.format import (
    MANIFEST_NAME,
    MARKER_NAME,
    check_complete,
    find_incomplete,
    mark_finished,
    mark_started,
)
from recordkit.storage import open_target


def _convert_marked(root, partitions, done):
    target = open_target(root)
    mark_started(
        target, "convert", partitions=partitions, state_dir=".state", done_suffix=".done.json"
    )
    (root / ".state").mkdir()
    for i in range(done):
        (root / ".state" / f"part-{i:05d}.done.json").write_text("{}")
    (root / ".state" / "part-00063.done.json.tmp-1234").write_text("")  # not published
    return target


def test_a_conversion_says_how_far_it_got(tmp_path, caplog):
    target = _convert_marked(tmp_path, 64, 24)
    doc = json.loads((tmp_path / MARKER_NAME).read_text())
    assert doc["writer"] == "convert" and doc["partitions"] == 64 and doc["pid"] > 0
    with pytest.raises(IncompleteDatasetError) as info:
        check_complete(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: a conversion was interrupted here (24 of 64 partitions published): rerun "
        "the same `recordkit convert` command to finish it, or pass `partial=True` "
        "(`--partial`) to read what is there"
    )
    assert isinstance(info.value, ValueError) and isinstance(info.value, RecordkitError)
    assert info.value.path == str(tmp_path)
    back = pickle.loads(pickle.dumps(info.value))  # crosses to DataLoader workers intact
    assert str(back) == str(info.value) and back.path == info.value.path
    with caplog.at_level(logging.WARNING, logger="recordkit"):
        found = check_complete(tmp_path, partial=True)
    assert found is not None and (found.published, found.total) == (24, 64)
    assert "partial=True: reads 24 of 64 partitions" in caplog.text
    mark_finished(target)
    assert check_complete(tmp_path) is None and find_incomplete(tmp_path) is None


def test_manifest_wins_and_foreign_folders_pass(tmp_path):
    assert check_complete(tmp_path) is None  # nothing of ours here
    assert check_complete(tmp_path / "missing") is None
    _convert_marked(tmp_path, 4, 1)
    (tmp_path / MANIFEST_NAME).write_text("{}")
    assert check_complete(tmp_path) is None


def test_other_file_systems_through_read_and_listdir(tmp_path):
    files = {MARKER_NAME: b'{"writer": "writer", "error": "record 7: OSError: gone"}'}
    listing = {"": [MARKER_NAME, "part-00000.tfrecord", "part-00000.tfrecord.idx", "x.tmp-1"]}
    found = find_incomplete("gs://b/ds", read=files.get, listdir=lambda rel: listing.get(rel, []))
    assert found is not None and found.writer == "writer" and found.published == 1
    assert found.message().startswith(
        "gs://b/ds: a Writer did not finish here; it stopped on record 7: OSError: gone "
        "(1 shard published, no manifest)"
    )


def test_marker_bytes_refuses_an_unknown_writer(tmp_path):
    with pytest.raises(ValueError, match=r"writer must be one of \('writer', 'convert', 'write'\)"):
        mark_started(open_target(tmp_path), "someone")
    assert not (tmp_path / MARKER_NAME).exists()
