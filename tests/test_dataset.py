import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import CorruptRecordError, ManifestError, ShardNotFoundError
from recordkit.format import frame

SCHEMA = rk.Schema(x=rk.Int64(), name=rk.Bytes())


@pytest.fixture
def ds_path(tmp_path):
    with rk.Writer(tmp_path / "ds", SCHEMA, max_records=4) as w:
        for i in range(10):
            w.write({"x": i, "name": f"n{i}"})
    return tmp_path / "ds"


def test_len_iter_getitem(ds_path):
    with rk.Dataset(ds_path) as ds:
        assert len(ds) == 10
        assert [int(s["x"]) for s in ds] == list(range(10))
        assert ds[7]["name"] == b"n7"
        assert ds[-1]["x"] == 9
        assert [s.records for s in ds.shards] == [4, 4, 2]
        with pytest.raises(IndexError):
            ds[10]
        with pytest.raises(TypeError):
            ds["a"]


def test_single_file(ds_path):
    ds = rk.Dataset(ds_path / "part-00001.tfrecord")
    assert [int(s["x"]) for s in ds] == [4, 5, 6, 7]


def test_foreign_folder_infers_schema_and_leaves_the_folder_alone(ds_path, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for name in ("a.tfrecord", "b.tfrecord"):
        (foreign / name).write_bytes((ds_path / "part-00000.tfrecord").read_bytes())
    ds = rk.Dataset(foreign)
    assert ds.manifest is None
    assert set(ds.schema.names) == {"x", "name"}
    assert len(ds) == 8
    assert sorted(p.name for p in foreign.iterdir()) == ["a.tfrecord", "b.tfrecord"]
    rk.Dataset(foreign, write_index=True)  # asked for: beside the data
    assert (foreign / "a.tfrecord.idx").exists()


def test_missing_paths(tmp_path, ds_path):
    with pytest.raises(ShardNotFoundError):
        rk.Dataset(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ShardNotFoundError, match="no manifest"):
        rk.Dataset(empty)
    (ds_path / "part-00002.tfrecord").unlink()
    with pytest.raises(ShardNotFoundError, match="part-00002"):
        rk.Dataset(ds_path)


def test_manifest_disagreeing_with_shard(ds_path):
    with open(ds_path / "part-00002.tfrecord", "ab") as f:
        f.write(frame(SCHEMA.encode({"x": 99, "name": "extra"})))
    with pytest.raises(ManifestError, match="manifest says"):
        rk.Dataset(ds_path)


def test_corrupt_record_error_names_place(ds_path):
    path = ds_path / "part-00001.tfrecord"
    data = bytearray(path.read_bytes())
    offsets = [
        int(line.split()[0])
        for line in (ds_path / "part-00001.tfrecord.idx").read_text().splitlines()
    ]
    data[offsets[2] + 14] ^= 0x40
    path.write_bytes(bytes(data))
    ds = rk.Dataset(ds_path)
    assert int(ds[5]["x"]) == 5
    with pytest.raises(CorruptRecordError) as info:
        ds[6]
    err = info.value
    assert err.path.endswith("part-00001.tfrecord")
    assert (err.offset, err.record) == (offsets[2], 2)
    with pytest.raises(CorruptRecordError):
        list(ds)


def test_samples_outlive_close(ds_path):
    ds = rk.Dataset(ds_path)
    s = ds[0]
    ds.close()
    assert s["name"] == b"n0" and isinstance(s["x"], np.ndarray)


def test_remote_url_is_a_clear_error():
    with pytest.raises(ShardNotFoundError, match="local"):
        rk.Dataset("s3://bucket/ds")


def test_pickles_by_reference_and_maps_in_each_process(ds_path, tmp_path):
    """A copy in another process (Grain's workers, spawned) carries no maps or records."""
    import multiprocessing
    import pickle

    ds = rk.Dataset(ds_path)
    want = [ds[i] for i in range(len(ds))]  # maps open here, then pickled
    blob = pickle.dumps(ds)
    assert b"mmap" not in blob and len(blob) < 4096 + 200 * len(ds.shards)
    copy = pickle.loads(blob)
    assert len(copy) == len(ds) and _same(copy[7], want[7])
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.map(_read_all, [ds])[0]
    assert len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want))


def _read_all(ds):
    return [ds[i] for i in range(len(ds))]


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
