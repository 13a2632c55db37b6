"""What the fuzz suite found, each pinned by a plain test (issue 22, item 7).

Every one of these raised an exception outside the ``RecordkitError`` family
(or crashed a reader) before it was fixed.
"""

from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import pytest

import recordkit as rk
from recordkit.cache import ShardCache
from recordkit.errors import CorruptRecordError, InvalidIndexError, ManifestError, SchemaError
from recordkit.format.index import load_index, scan_index

FIRST = "path = (SELECT min(path) FROM shards)"
SCHEMA = rk.Schema(i=rk.Int64(), x=rk.Tensor("uint8", (4,)))


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    with rk.Writer(root, SCHEMA, max_records=4, fsync=False) as w:
        for i in range(8):
            w.write({"i": i, "x": np.full(4, i, np.uint8)})
    return root


def test_scanning_a_shard_with_a_bad_payload_crc_names_the_record(dataset):
    """Was ``BufferError: cannot close exported pointers exist``: the error's traceback
    held a view of the map that scan_index then closed."""
    path = dataset / "part-00000.tfrecord"
    data = bytearray(path.read_bytes())
    data[20] ^= 1  # inside the first payload
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="payload CRC mismatch"):
        scan_index(path, verify=True)


def test_sidecars_that_cannot_be_opened_are_named(dataset):
    """Was ``OSError: [Errno 40] Too many levels of symbolic links`` from every reader."""
    idx = dataset / "part-00000.tfrecord.idx"
    idx.unlink()
    os.symlink(idx.name, idx)  # a loop
    with pytest.raises(InvalidIndexError, match="cannot be opened"):
        load_index(idx)
    with rk.Dataset(dataset) as ds:  # rebuilt in memory, as for any bad index
        assert [int(s["i"]) for s in ds] == list(range(8))
    manifest = dataset / "recordkit.json"
    manifest.unlink()
    os.symlink(manifest.name, manifest)
    with pytest.raises(ManifestError, match="cannot be opened"):
        rk.Dataset(dataset)


@pytest.mark.parametrize("dtype", ["01", "0:", {"": []}, [1, 2], "uint9"])
def test_a_manifest_dtype_that_numpy_cannot_parse_is_a_schema_error(dataset, dtype):
    """Was ``SyntaxError`` ("01"), ``ValueError`` ("0:", a dict) from numpy."""
    path = dataset / "recordkit.json"
    doc = json.loads(path.read_text())
    doc["schema"]["features"][1]["dtype"] = dtype
    path.write_text(json.dumps(doc))
    with pytest.raises((SchemaError, ManifestError)):
        rk.Dataset(dataset)
    assert not rk.verify(dataset).ok


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE settings SET value = 'x'",
        "UPDATE settings SET value = 1e300",
        "UPDATE totals SET bytes = 'x'",
        "UPDATE shards SET extra = '{'",
        "UPDATE totals SET bytes = bytes + 1",  # the running total no longer adds up
        f"UPDATE shards SET path = '../../outside' WHERE {FIRST}",
        f"UPDATE shards SET path = CAST(X'ff00' AS TEXT) WHERE {FIRST}",  # not UTF-8
    ],
)
def test_a_cache_state_of_the_wrong_shape_is_rebuilt(dataset, tmp_path, sql, caplog):
    """Was ``ValueError``, ``OverflowError``, ``UnicodeDecodeError`` from the store, on
    every start, until the file was deleted by hand."""
    root = tmp_path / "c"
    cache = ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0)
    assert cache.fill() == 2
    cache.dir.store.close()
    conn = sqlite3.connect(root / ".recordkit-cache" / "state.db", isolation_level=None)
    conn.execute(sql)
    conn.close()
    again = ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0)
    assert again.fill() == 2
    assert "rebuilding it from the directory" in caplog.text
    with again.snapshot(0) as snap:
        assert snap.records == 8


def test_a_cache_bookkeeping_folder_that_is_a_file_is_replaced(dataset, tmp_path):
    """Was ``FileExistsError`` on every start."""
    root = tmp_path / "c"
    ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0).fill()
    leases = root / ".recordkit-cache" / "leases"
    os.rmdir(leases)
    leases.write_bytes(b"not a folder")
    assert ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0).fill() == 2
    assert leases.is_dir()


@pytest.mark.parametrize(
    "entry",
    [
        {"path": "part-00000.tfrecord", "bytes": 5},  # no records
        {"path": "part-00000.tfrecord", "records": "4", "bytes": 5},
        {"records": 4, "bytes": 5},
        {"path": "../x", "records": 4, "bytes": 5},
        {"path": "part-00000.tfrecord", "records": 4, "bytes": 5, "extra": 1},
    ],
)
def test_a_saved_catalog_of_the_wrong_shape_is_ignored(dataset, tmp_path, entry):
    """Was ``TypeError``/``KeyError`` when the remote was away and the saved catalog used."""
    root = tmp_path / "c"
    ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0).fill()
    path = root / ".recordkit-cache" / "catalog.json"
    doc = json.loads(path.read_text())
    doc["shards"][0] = entry
    path.write_text(json.dumps(doc))
    with pytest.raises(rk.errors.ShardNotFoundError, match="not a cache"):
        ShardCache(None, root, max_bytes="1MiB")  # reader-only: the catalog is all it has
    away = dataset.with_name("away")
    os.rename(dataset, away)
    try:  # the remote away and the saved catalog unusable: an error that says so
        with pytest.raises(rk.errors.ShardNotFoundError):
            ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0).catalog()
    finally:
        os.rename(away, dataset)
    assert ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0).fill() == 2


def test_a_manifest_that_is_a_broken_link_is_not_taken_for_none(dataset):
    """Was read (and verified ok) as a folder of foreign TFRecords: no schema, no checks."""
    manifest = dataset / "recordkit.json"
    manifest.unlink()
    os.symlink("gone.json", manifest)
    with pytest.raises(rk.errors.ShardNotFoundError, match="no manifest"):
        rk.Dataset(dataset)
    report = rk.verify(dataset)
    assert not report.ok and "dangling" in str(report)


@pytest.mark.timeout(60)
def test_recordkit_tf_refuses_a_fifo_manifest_without_blocking(dataset):
    """Was: blocked for ever in TensorFlow's GFile.read()."""
    pytest.importorskip("tensorflow")
    import recordkit.tf as rtf

    manifest = dataset / "recordkit.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(ManifestError, match="FIFO"):
        rtf.dataset(dataset)


@pytest.mark.parametrize(
    "entry",
    [{"consumed": 2**70}, {"seen": float("nan")}, {"uses": 1e300}, {"used": "x"}, {"seen": -1}],
)
def test_a_legacy_state_json_of_the_wrong_shape_is_skipped(dataset, tmp_path, entry):
    """Was ``OverflowError: Python int too large to convert to SQLite INTEGER``."""
    root = tmp_path / "c"
    ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0).fill()
    doc = {"epoch": 2**70, "shards": {"part-00000.tfrecord": entry, "../x": {"seen": 1}}}
    (root / ".recordkit-cache" / "state.json").write_text(json.dumps(doc))
    cache = ShardCache(dataset, root, max_bytes="1MiB", fill_workers=0)
    assert cache.fill() == 2
    assert not (root / ".recordkit-cache" / "state.json").exists()


def test_a_manifest_shard_path_too_long_to_open_is_a_manifest_error(dataset):
    """Was ``OSError: [Errno 36] File name too long`` from every reader (found by
    ``--fuzz-long``)."""
    path = dataset / "recordkit.json"
    doc = json.loads(path.read_text())
    doc["shards"][0]["path"] = "x" * 300
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="cannot be opened"):
        rk.Dataset(dataset)
    assert not rk.verify(dataset).ok


@pytest.mark.timeout(60)
def test_an_in_progress_marker_that_is_a_fifo_never_blocks(dataset):
    """Was: every reader blocked for ever opening ``.recordkit-writing.json``."""
    from recordkit.format.complete import MARKER_NAME

    os.mkfifo(dataset / MARKER_NAME)
    with rk.Dataset(dataset) as ds:  # the manifest is there: a whole dataset
        assert len(ds) == 8
    assert rk.verify(dataset).ok


@pytest.mark.parametrize("records", [0, 3, 5, 2**63])
def test_a_manifest_record_count_that_is_wrong_is_refused_by_every_reader(dataset, records):
    """Was: ``RecordDataset`` read the other shards and none of one said to hold 0 records
    (silently 4 of 8 records), and ``OverflowError`` for a count past int64 (found by
    ``--fuzz-long``)."""
    from recordkit.torch import RecordDataset, RecordMapDataset

    path = dataset / "recordkit.json"
    doc = json.loads(path.read_text())
    doc["shards"][1]["records"] = records
    path.write_text(json.dumps(doc))
    for read in (
        lambda: list(rk.Dataset(dataset)),
        lambda: list(RecordDataset(dataset)),
        lambda: list(RecordDataset(dataset, batch_size=3)),
        lambda: [s for s in RecordMapDataset(dataset)],
    ):
        with pytest.raises((ManifestError, CorruptRecordError, InvalidIndexError)):
            read()
    assert not rk.verify(dataset).ok


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["marker", "index"])
def test_recordkit_tf_opens_no_fifo(tmp_path, what):
    """An in-progress marker or a foreign shard's ``.idx`` that is a FIFO: TensorFlow's
    ``GFile`` would wait for a writer for ever."""
    pytest.importorskip("tensorflow")
    import recordkit.tf as rtf
    from recordkit.format.complete import MARKER_NAME

    root = tmp_path / "ds"
    with rk.Writer(root, SCHEMA, fsync=False) as w:
        for i in range(4):
            w.write({"i": i, "x": np.full(4, i, np.uint8)})
    if what == "marker":
        os.mkfifo(root / MARKER_NAME)  # beside a whole dataset: not ours, ignored
    else:
        (root / "recordkit.json").unlink()  # a folder of foreign TFRecords
        (root / "part-00000.tfrecord.idx").unlink()
        os.mkfifo(root / "part-00000.tfrecord.idx")
    got = [int(s["i"]) for s in rtf.dataset(root, schema=SCHEMA, shuffle=False)]
    assert got == [0, 1, 2, 3]
