"""Each converter, from a local folder, from S3 (moto) and over HTTP (Range-capable):
the dataset verifies and reads back equal to the source."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

import recordkit as rk
from recordkit import converters
from recordkit.converters import Item, Source

from .cases import CASES, assert_samples_equal, read_all

pytest.importorskip("fsspec")
NAMES = sorted(CASES)


def _make(case: str, root):
    fmt, make = CASES[case]
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    if fmt == "imagefolder":
        pytest.importorskip("PIL")
    if fmt == "hf":
        pytest.importorskip("datasets")
    if fmt == "arrayrecord":
        pytest.importorskip("array_record.python.array_record_module")
    root.mkdir(parents=True, exist_ok=True)
    src_rel, expected = make(root)
    return fmt, src_rel, expected


def _check(dst, expected, fmt):
    report = rk.verify(dst)
    assert report.ok, str(report)
    assert_samples_equal(read_all(dst), expected)
    manifest = rk.Dataset(dst).manifest
    assert manifest.metadata["convert"]["from"] == fmt
    return manifest


@pytest.mark.parametrize("case", NAMES)
def test_local(case, tmp_path):
    fmt, src_rel, expected = _make(case, tmp_path / "src")
    result = rk.convert(
        tmp_path / "src" / src_rel, tmp_path / "out", format=fmt, workers=0, shard_size="600B"
    )
    manifest = _check(tmp_path / "out", expected, fmt)
    assert result.records == len(expected) == manifest.records
    if fmt == "imagefolder":
        assert manifest.metadata["classes"] == ["cat", "dog"]
    assert not (tmp_path / "out" / ".recordkit-convert").exists()


@pytest.mark.parametrize("case", NAMES)
def test_source_conformance(case, tmp_path):
    """What every Source promises: named, registered, deterministic, picklable."""
    fmt, src_rel, expected = _make(case, tmp_path / "src")
    cls = converters.get(fmt)
    assert issubclass(cls, Source) and cls.name == fmt and fmt in converters.available()
    assert cls.__doc__ and cls.__module__.startswith("recordkit.converters.")
    src = str(tmp_path / "src" / src_rel)
    source = cls(src)
    items = source.list_items()
    assert items == cls(src).list_items(), "listing must be deterministic"
    assert all(isinstance(i, Item) and i.size >= 0 for i in items)
    assert len({i.key for i in items}) == len(items)
    schema = source.resolve_schema(items)
    clone = pickle.loads(pickle.dumps(source))  # what a writer subprocess receives
    payloads = [p for item in items for p in clone.records(item, schema)]
    assert len(payloads) == len(expected)
    assert_samples_equal([schema.decode(p, copy=True) for p in payloads], expected)
    with pytest.raises(ValueError, match="unknown option"):
        cls(src, no_such_option=1)
    with pytest.raises(FileNotFoundError):
        cls(str(tmp_path / "missing")).list_items()


@pytest.mark.remote
@pytest.mark.parametrize("case", NAMES)
def test_from_s3_to_s3(case, tmp_path, s3):
    """Source and dataset on S3; two writer subprocesses get the endpoint by storage_options."""
    pytest.importorskip("s3fs")
    fmt, src_rel, expected = _make(case, tmp_path / "src")
    bucket = s3.bucket()
    fs = s3.filesystem()
    fs.put(str(tmp_path / "src") + "/", f"{bucket}/src/", recursive=True)
    src = f"{bucket}/src/{src_rel}".rstrip("/")
    rk.convert(
        src,
        f"{bucket}/out",
        format=fmt,
        workers=2,
        shard_size="600B",
        storage_options=s3.storage_options,
    )
    keys = fs.find(f"{bucket}/out")
    assert not [k for k in keys if ".tmp-" in k or ".recordkit-convert" in k], keys
    fs.get(f"{bucket}/out/", str(tmp_path / "out") + "/", recursive=True)
    _check(tmp_path / "out", expected, fmt)
    # The same records converted from a local copy give the same shards; the manifest
    # differs only in what it says it was made from (another source: another plan).
    rk.convert(
        tmp_path / "src" / src_rel, tmp_path / "local", format=fmt, workers=0, shard_size="600B"
    )
    for f in (tmp_path / "local").iterdir():
        if f.name.endswith((".tfrecord", ".idx")):
            assert (tmp_path / "out" / f.name).read_bytes() == f.read_bytes(), f.name
    here, there = (
        json.loads((p / "recordkit.json").read_text())
        for p in (tmp_path / "local", tmp_path / "out")
    )
    assert here["metadata"].pop("convert")["source"] == str(tmp_path / "src" / src_rel)
    assert there["metadata"].pop("convert")["source"] == src
    assert here == there


@pytest.mark.remote
@pytest.mark.parametrize("case", NAMES)
def test_from_http(case, tmp_path, http):
    pytest.importorskip("aiohttp")
    fmt, src_rel, expected = _make(case, tmp_path / "src")
    shutil.copytree(tmp_path / "src", f"{http.root}/src")
    src = f"{http.url}/src/{src_rel}"
    rk.convert(src, tmp_path / "out", format=fmt, workers=1, shard_size="600B")
    _check(tmp_path / "out", expected, fmt)
    if fmt in ("numpy", "tfrecord", "webdataset", "parquet"):
        assert any(r[2] for r in http.requests), "expected ranged reads"
