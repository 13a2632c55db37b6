import os

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import DatasetExistsError, IncompleteDatasetError, SchemaError
from recordkit.format import crc32c, load_index, read_manifest, scan_index

SCHEMA = rk.Schema(data=rk.Bytes(), label=rk.Int64())


def _write(path, n, size=100, **kw):
    with rk.Writer(path, SCHEMA, **kw) as w:
        for i in range(n):
            w.write({"data": bytes([i % 256]) * size, "label": i})
    return w


def test_rolls_over_by_size(tmp_path):
    w = _write(tmp_path, 100, size=100, shard_size="1KiB")
    # framed record: 100 payload bytes of data + label + Example overhead + 16
    assert len(w.shards) > 5
    assert all(s.bytes <= 1024 for s in w.shards)
    assert sum(s.records for s in w.shards) == 100
    names = sorted(os.listdir(tmp_path))
    assert names[-1] == "recordkit.json"
    assert names[0] == "part-00000.tfrecord" and names[1] == "part-00000.tfrecord.idx"


def test_rolls_over_by_count(tmp_path):
    w = _write(tmp_path, 25, max_records=10)
    assert [s.records for s in w.shards] == [10, 10, 5]


def test_manifest_matches_files(tmp_path):
    _write(tmp_path, 30, max_records=7, prefix="train")
    m = read_manifest(tmp_path)
    assert m.records == 30
    assert rk.Schema.from_json(m.schema) == SCHEMA
    for s in m.shards:
        data = (tmp_path / s.path).read_bytes()
        assert s.path.startswith("train-")
        assert len(data) == s.bytes
        assert crc32c(data) == s.crc32c
        assert (
            load_index(str(tmp_path / s.path) + ".idx").tolist()
            == scan_index(str(tmp_path / s.path)).tolist()
        )


def test_record_larger_than_shard_size_gets_own_shard(tmp_path):
    with rk.Writer(tmp_path, SCHEMA, shard_size=1000) as w:
        w.write({"data": b"a" * 10, "label": 0})
        w.write({"data": b"b" * 5000, "label": 1})
        w.write({"data": b"c" * 10, "label": 2})
    assert [s.records for s in w.shards] == [1, 1, 1]


def test_exception_leaves_no_manifest_and_no_temp(tmp_path):
    with pytest.raises(RuntimeError), rk.Writer(tmp_path, SCHEMA, max_records=3) as w:
        for i in range(5):
            w.write({"data": b"x", "label": i})
        raise RuntimeError("boom")
    names = sorted(os.listdir(tmp_path))
    assert "recordkit.json" not in names
    # published and complete, and the mark of a write that did not finish
    assert names == [".recordkit-writing.json", "part-00000.tfrecord", "part-00000.tfrecord.idx"]
    with pytest.raises(IncompleteDatasetError):
        rk.Dataset(tmp_path)
    ds = rk.Dataset(tmp_path, partial=True)  # what was published, schema inferred
    assert len(ds) == 3


def test_schema_error_does_not_write(tmp_path):
    with rk.Writer(tmp_path, SCHEMA) as w:
        with pytest.raises(SchemaError, match="label"):
            w.write({"data": b"x", "label": "not a number"})
        w.write({"data": b"x", "label": 1})
    assert rk.Dataset(tmp_path)[0]["label"] == 1
    assert len(rk.Dataset(tmp_path)) == 1


def test_refuses_to_overwrite(tmp_path):
    _write(tmp_path, 3)
    with pytest.raises(DatasetExistsError, match="overwrite=True"):
        rk.Writer(tmp_path, SCHEMA)
    _write(tmp_path, 2, overwrite=True)
    assert len(rk.Dataset(tmp_path)) == 2
    assert sorted(os.listdir(tmp_path)) == [
        "part-00000.tfrecord",
        "part-00000.tfrecord.idx",
        "recordkit.json",
    ]


def test_leftover_temp_files_are_removed(tmp_path):
    (tmp_path / "part-00000.tfrecord.tmp-deadbeef").write_bytes(b"partial")
    _write(tmp_path, 2)
    assert not any(".tmp-" in n for n in os.listdir(tmp_path))


def test_empty_dataset(tmp_path):
    with rk.Writer(tmp_path, SCHEMA):
        pass
    assert read_manifest(tmp_path).shards == ()
    assert len(rk.Dataset(tmp_path)) == 0


def test_size_strings():
    from recordkit._units import parse_size

    assert parse_size("256MiB") == 256 << 20
    assert parse_size("256MB") == 256_000_000
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("4 kb") == 4000
    assert parse_size(123) == 123
    for bad in ("12 parsecs", "-1MB", "", True):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_memory_filesystem_roundtrip(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    url = "memory://recordkit-test/ds"
    _write(url, 20, max_records=8)
    fs = fsspec.filesystem("memory")
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/recordkit-test/ds", detail=False))
    assert names == [
        "part-00000.tfrecord",
        "part-00000.tfrecord.idx",
        "part-00001.tfrecord",
        "part-00001.tfrecord.idx",
        "part-00002.tfrecord",
        "part-00002.tfrecord.idx",
        "recordkit.json",
    ]
    local = tmp_path / "copy"
    fs.get("/recordkit-test/ds", str(local), recursive=True)
    ds = rk.Dataset(local)
    assert [int(s["label"]) for s in ds] == list(range(20))
    fs.rm("/recordkit-test", recursive=True)


def test_values_roundtrip_all_types(tmp_path):
    schema = rk.Schema(
        b=rk.Bytes(),
        bl=rk.Bytes((None,)),
        i=rk.Int64(),
        iv=rk.Int64((None,)),
        f=rk.Float32((3,)),
        t=rk.Tensor("float32", (None, 2)),
        t2=rk.Tensor("int16", (None, None)),
        z=rk.Tensor("uint8", (64,), compression="zstd"),
    )
    rng = np.random.default_rng(1)
    samples = [
        {
            "b": bytes(rng.integers(0, 256, i, dtype=np.uint8)),
            "bl": [b"x" * j for j in range(i % 3)],
            "i": -(2**63) + i,
            "iv": list(range(i)),
            "f": rng.standard_normal(3).astype(np.float32),
            "t": rng.standard_normal((i, 2)).astype(np.float32),
            "t2": rng.integers(-100, 100, (i % 4, 3), dtype=np.int16),
            "z": np.full(64, i, dtype=np.uint8),
        }
        for i in range(12)
    ]
    with rk.Writer(tmp_path, schema, max_records=5) as w:
        for s in samples:
            w.write(s)
    ds = rk.Dataset(tmp_path)
    assert ds.schema == schema
    for i, (want, got) in enumerate(zip(samples, ds)):
        assert got["b"] == want["b"]
        assert got["bl"] == want["bl"]
        assert got["i"].shape == () and int(got["i"]) == want["i"]
        assert got["iv"].tolist() == want["iv"]
        for k in ("f", "t", "t2", "z"):
            np.testing.assert_array_equal(got[k], want[k])
            assert got[k].dtype == np.asarray(want[k]).dtype
        assert ds[i]["b"] == want["b"]
