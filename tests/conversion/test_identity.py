"""A conversion's identity is its source: another source, or the same one regenerated,
is never taken for the conversion a destination holds (issue 29's cases, as a user runs
them with the CLI: ``recordkit convert v1 D`` then ``recordkit convert v2 D``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import DatasetExistsError, PartitionsFailedError

CLI = [sys.executable, "-m", "recordkit"]
ONE = rk.conversion.ConvertOptions(partition_bytes=1)  # a partition per file
ID = rk.Schema(id=rk.Int64())  # given: inference would read the bad row first


def _jsonl(root: Path, base: int, bad: int | None = None) -> None:
    """8 files of 100 rows; ids from ``base`` (two versions: the same names and sizes)."""
    root.mkdir(parents=True, exist_ok=True)
    for f in range(8):
        rows = [json.dumps({"id": base + f * 100 + i}) for i in range(100)]
        if f == bad:
            rows[50] = "{" + "x" * (len(rows[50]) - 1)  # not JSON, same length
        (root / f"f{f}.jsonl").write_text("\n".join(rows) + "\n")


def _convert(src: Path, dst: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [*CLI, "convert", str(src), str(dst), "--from", "jsonl", "--workers", "0"]
    cmd += ["--partition-size", "1", "--schema", "id:int64", "--progress", "none", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _ids(dst: Path) -> list[int]:
    return sorted(int(s["id"]) for s in rk.Dataset(dst))


def test_a_partial_conversion_of_another_source_is_not_resumed(tmp_path):
    """v1 with one partition failing, then v2 (same names and sizes, other records):
    refused, naming both sources; never 700 records of v1 and 100 of v2."""
    _jsonl(tmp_path / "v1", 0, bad=6)
    _jsonl(tmp_path / "v2", 100_000)
    first = _convert(tmp_path / "v1", tmp_path / "D")
    assert first.returncode == 1, first.stderr
    second = _convert(tmp_path / "v2", tmp_path / "D")
    assert second.returncode != 0
    assert f"it was made from {tmp_path / 'v1'}, this run reads {tmp_path / 'v2'}" in second.stderr
    assert "--overwrite" in second.stderr
    again = _convert(tmp_path / "v2", tmp_path / "D", "--overwrite")
    assert again.returncode == 0, again.stderr
    assert _ids(tmp_path / "D") == list(range(100_000, 100_800))


def test_a_complete_dataset_is_no_conversion_of_another_source(tmp_path):
    """A complete D, then ``convert v2 D``: not a no-op that keeps v1."""
    _jsonl(tmp_path / "v1", 0)
    _jsonl(tmp_path / "v2", 100_000)
    assert _convert(tmp_path / "v1", tmp_path / "D").returncode == 0
    second = _convert(tmp_path / "v2", tmp_path / "D")
    assert second.returncode != 0
    assert "already holds a dataset from a different source" in second.stderr
    assert str(tmp_path / "v1") in second.stderr
    assert _ids(tmp_path / "D") == list(range(800))  # untouched
    assert _convert(tmp_path / "v1", tmp_path / "D").returncode == 0  # the same: a no-op


def test_a_source_regenerated_in_place_is_another_conversion(tmp_path):
    """The same path, the same names and sizes, other content (recomputed embeddings of
    the same shape): refused, naming the first file that changed."""
    src = tmp_path / "emb"
    src.mkdir()
    for f in range(3):
        np.save(src / f"e{f}.npy", np.full((50, 8), f, np.float32))
    rk.convert(src, tmp_path / "D", format="numpy", workers=0)
    np.save(src / "e1.npy", np.full((50, 8), 7, np.float32))  # same shape, same size
    with pytest.raises(DatasetExistsError, match=r"'e1\.npy' changed since \(mtime_ns="):
        rk.convert(src, tmp_path / "D", format="numpy", workers=0)
    rk.convert(src, tmp_path / "D", format="numpy", workers=0, overwrite=True)
    assert {float(s["e1"][0]) for s in rk.Dataset(tmp_path / "D")} == {7.0}


def test_a_partial_conversion_redoes_what_changed_under_it(tmp_path):
    """The same source changed while a conversion was partial: the published partitions
    of unchanged files are kept, those of changed files written again: the result is
    the conversion of what the source holds now, never a mix."""
    src = tmp_path / "src"
    _jsonl(src, 0, bad=6)
    with pytest.raises(PartitionsFailedError):
        rk.convert(src, tmp_path / "D", format="jsonl", workers=0, options=ONE, schema=ID)
    _jsonl(src, 0)  # the bad file fixed; every file rewritten (new mtimes) ...
    (src / "f2.jsonl").write_text(  # ... and one published file's records changed
        "\n".join(json.dumps({"id": 5000 + i}) for i in range(100)) + "\n"
    )
    result = rk.convert(src, tmp_path / "D", format="jsonl", workers=0, options=ONE, schema=ID)
    assert result.resumed == 0  # every file has a new mtime: all written again
    want = sorted([*range(200), *range(5000, 5100), *range(300, 800)])
    assert _ids(tmp_path / "D") == want


def test_unchanged_published_partitions_are_kept(tmp_path):
    src = tmp_path / "src"
    _jsonl(src, 0, bad=6)
    with pytest.raises(PartitionsFailedError):
        rk.convert(src, tmp_path / "D", format="jsonl", workers=0, options=ONE, schema=ID)
    good = tmp_path / "good"
    _jsonl(good, 0)
    (src / "f6.jsonl").write_bytes((good / "f6.jsonl").read_bytes())  # only the bad one
    result = rk.convert(src, tmp_path / "D", format="jsonl", workers=0, options=ONE, schema=ID)
    assert result.resumed == 7 and _ids(tmp_path / "D") == list(range(800))


def test_a_write_of_other_inputs_or_another_function_is_another_conversion(tmp_path):
    from . import _write_fns as fns

    rk.write(fns.squares, range(20), tmp_path / "w", schema=fns.SCHEMA, workers=0)
    with pytest.raises(DatasetExistsError, match="'19' is gone"):
        rk.write(fns.squares, range(19), tmp_path / "w", schema=fns.SCHEMA, workers=0)
    with pytest.raises(DatasetExistsError, match="different source or options"):
        rk.write("tests.conversion._write_fns:one", range(20), tmp_path / "w", schema=fns.SCHEMA)


def test_the_listing_is_kept_beside_the_manifest_and_names_the_source(tmp_path):
    from recordkit.conversion.identity import KEPT_LISTING, load_listing

    _jsonl(tmp_path / "v1", 0)
    rk.convert(tmp_path / "v1", tmp_path / "D", format="jsonl", workers=0)
    doc = load_listing((tmp_path / "D" / KEPT_LISTING).read_bytes())
    assert doc is not None and doc["source"] == str(tmp_path / "v1")
    rows = [r for _, part in doc["partitions"] for r in part]
    assert [r[0] for r in rows] == [f"f{f}.jsonl" for f in range(8)]
    assert all(r[2].startswith("mtime_ns=") for r in rows)
    meta = rk.Dataset(tmp_path / "D").metadata["convert"]
    assert meta["source"] == str(tmp_path / "v1")
    assert rk.verify(tmp_path / "D").ok
    assert os.listdir(tmp_path / "D").count(KEPT_LISTING) == 1
