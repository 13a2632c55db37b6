"""A Writer marks its directory from the first byte to the manifest: a write that raised,
was killed or is still running is refused by every reader, unless ``partial=True``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import recordkit as rk
from recordkit.errors import IncompleteDatasetError
from recordkit.format import MARKER_NAME, check_complete, find_incomplete
from tests.incomplete import assert_partial_reads, assert_refused_everywhere

SCHEMA = rk.Schema(data=rk.Bytes(), label=rk.Int64())


class _Boom(Exception):
    pass


def _raise_at(path, n, stop, **kw):
    with pytest.raises(_Boom), rk.Writer(path, SCHEMA, max_records=100, **kw) as w:
        for i in range(n):
            if i == stop:
                raise _Boom("the source failed")
            w.write({"data": b"x" * 10, "label": i})


def test_writer_that_raises_is_refused_by_every_reader(tmp_path, capsys, caplog):
    path = tmp_path / "ds"
    _raise_at(path, 1000, 500)
    assert not (path / "recordkit.json").exists()
    doc = json.loads((path / MARKER_NAME).read_text())
    assert doc["writer"] == "writer" and "record 500: _Boom: the source failed" in doc["error"]
    says = "a Writer did not finish here"
    assert_refused_everywhere(path, says, capsys)
    found = find_incomplete(path)
    assert found is not None and found.published == 4 and found.total is None
    assert "4 shards published" in found.message() and "_Boom" in found.message()
    assert_partial_reads(path, 400, "an unfinished Writer", caplog)


def test_marked_from_the_first_byte_until_the_manifest(tmp_path):
    path = tmp_path / "ds"
    with rk.Writer(path, SCHEMA, max_records=2) as w:
        assert (path / MARKER_NAME).exists()  # before any record
        for i in range(5):
            w.write({"data": b"y", "label": i})
        assert len(w.shards) == 2  # published shards, no manifest yet: still running
        with pytest.raises(IncompleteDatasetError, match="a Writer did not finish"):
            rk.Dataset(path)
    assert not (path / MARKER_NAME).exists()
    assert len(rk.Dataset(path)) == 5 and rk.verify(path).ok
    assert check_complete(path) is None


def test_sigkilled_writer_is_refused(tmp_path):
    path = tmp_path / "ds"
    code = textwrap.dedent(
        f"""
        import os, signal, recordkit as rk
        schema = rk.Schema(data=rk.Bytes(), label=rk.Int64())
        w = rk.Writer({str(path)!r}, schema, max_records=10)
        for i in range(35):
            w.write({{"data": b"z", "label": i}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with pytest.raises(IncompleteDatasetError, match=r"3 shards published, no manifest"):
        rk.Dataset(path)
    assert len(rk.Dataset(path, partial=True)) == 30


def test_manifest_wins_over_a_stale_marker(tmp_path):
    # Killed between publishing the manifest and removing the marker: the manifest,
    # written last, says the dataset is whole.
    path = tmp_path / "ds"
    with rk.Writer(path, SCHEMA) as w:
        w.write({"data": b"a", "label": 1})
    (path / MARKER_NAME).write_text('{"writer": "writer"}\n')
    assert len(rk.Dataset(path)) == 1 and rk.verify(path).ok


def test_foreign_folder_without_marker_reads_as_today(tmp_path):
    path = tmp_path / "ds"
    _raise_at(path, 300, 250)
    os.unlink(path / MARKER_NAME)  # what a folder of someone else's TFRecords looks like
    assert len(rk.Dataset(path)) == 200 and rk.verify(path).ok


def test_garbled_marker_is_still_refused(tmp_path):
    path = tmp_path / "ds"
    _raise_at(path, 300, 250)
    (path / MARKER_NAME).write_bytes(b"\x00not json")
    with pytest.raises(IncompleteDatasetError, match="a Writer did not finish"):
        rk.Dataset(path)


def test_a_rerun_replaces_an_unfinished_write(tmp_path):
    path = tmp_path / "ds"
    _raise_at(path, 300, 250)
    with rk.Writer(path, SCHEMA, overwrite=True) as w:
        w.write({"data": b"b", "label": 7})
    assert not (path / MARKER_NAME).exists() and len(rk.Dataset(path)) == 1


def test_remote_writer_leaves_a_marker_object(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    from recordkit.conversion import incomplete_at

    url = "memory://recordkit-incomplete/ds"
    fs = fsspec.filesystem("memory")
    try:
        _raise_at(url, 300, 250)
        listed = fs.ls("/recordkit-incomplete/ds", detail=False)
        names = sorted(p.rsplit("/", 1)[-1] for p in listed)
        assert MARKER_NAME in names and "recordkit.json" not in names
        found = incomplete_at(url)
        assert found is not None and found.writer == "writer" and found.published == 2
        local = tmp_path / "copy"
        fs.get("/recordkit-incomplete/ds", str(local), recursive=True)
        with pytest.raises(IncompleteDatasetError):
            rk.Dataset(local)
        with rk.Writer(url, SCHEMA, overwrite=True) as w:
            w.write({"data": b"c", "label": 1})
        assert MARKER_NAME not in [p.rsplit("/", 1)[-1] for p in fs.ls(url[9:], detail=False)]
        assert incomplete_at(url) is None
    finally:
        fs.rm("/recordkit-incomplete", recursive=True)
