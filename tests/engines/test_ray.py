"""Ray Data both ways (issue 30), with the real engine on small data.

Ray → recordkit: ``ray.data.from_items(...).write_tfrecords(dir)`` read value for value
by every recordkit reader, against what Ray was given after Ray's own changes (measured
on ray 2.60: a scalar becomes a one-value list, a Python float float32, text UTF-8
bytes, None an empty list, a NumPy array ``tf.io.serialize_tensor`` bytes).
recordkit → Ray: a dataset written by ``rk.Writer`` read by ``ray.data.read_tfrecords``
with ``file_extensions=["tfrecord"]`` (and ``tf_schema`` for lists of varying length).
The recipes are ``docs/howto/ray-beam.md``'s.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

import recordkit as rk

from ._values import (
    FULL_SPEC,
    N,
    assert_same_record,
    bits,
    by_id,
    check_every_reader,
    cli,
    items,
    stored,
)

ray = pytest.importorskip("ray", reason="Ray Data is not installed (pip install 'ray[data]')")
tf = pytest.importorskip("tensorflow", reason="Ray's write_tfrecords needs TensorFlow")
pytest.importorskip("torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tf,
    pytest.mark.torch,
    pytest.mark.timeout(240),
    # Ray's own modules warn of their deprecations at import and first use; not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
]


@pytest.fixture(scope="module", autouse=True)
def _ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _serialize(array: np.ndarray) -> bytes:
    return tf.io.serialize_tensor(array).numpy()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Ray's writes of ``items()``: plain, GZIP and zstd, two blocks so two files each."""
    root = tmp_path_factory.mktemp("ray-writes")
    ds = ray.data.from_items(items(), override_num_blocks=2)
    ds.write_tfrecords(str(root / "plain"))
    for codec in ("gzip", "zstd"):  # pyarrow's stream codecs; TFRecords know only GZIP/ZLIB
        ds.write_tfrecords(str(root / codec), arrow_open_stream_args={"compression": codec})
    want = {k: stored(item, _serialize) for k, item in enumerate(items())}
    return root, want


def test_ray_names_its_files_uuid_task_tar(written):
    root, _ = written
    for folder in ("plain", "gzip", "zstd"):
        names = sorted(os.listdir(root / folder))
        assert sorted(n.rsplit("_", 1)[1] for n in names) == ["000000.tar", "000001.tar"], names
    with open(glob.glob(str(root / "gzip" / "*"))[0], "rb") as f:
        assert f.read(2) == b"\x1f\x8b"  # the whole file one GZIP stream, still named .tar
    with open(glob.glob(str(root / "zstd" / "*"))[0], "rb") as f:
        assert f.read(4) == b"(\xb5/\xfd"


def test_rays_zstd_writes_are_named_not_called_corrupt(written):
    root, _ = written
    for path in glob.glob(str(root / "zstd" / "*")):
        with pytest.raises(rk.errors.ShardNotFoundError, match="looks like a Zstandard-compressed"):
            rk.Dataset(path)
    with pytest.raises(rk.errors.ShardNotFoundError, match="neither named nor framed as TFRecords"):
        rk.Dataset(str(root / "zstd"))


def test_every_reader_reads_rays_writes_value_for_value(written, tmp_path):
    root, want = written
    counts = check_every_reader(str(root / "plain"), want, tmp_path)
    assert set(counts.values()) == {N}, counts
    assert sorted(os.listdir(root / "plain")) == sorted(  # nothing written into Ray's folder
        os.path.basename(p) for p in glob.glob(str(root / "plain" / "*.tar"))
    )


def test_rays_tensor_bytes_parse_back_to_the_arrays(written):
    root, _ = written
    for sample in rk.Dataset(str(root / "plain"), raw=True):
        k = int(sample["id"][0])
        array = tf.io.parse_tensor(sample["a"][0], out_type=tf.float32).numpy()
        assert array.dtype == np.float32 and array.shape == (2, 3)
        assert bits(array) == bits(items()[k]["a"])


def test_rays_gzip_writes_are_named_as_such_and_convert(written, tmp_path):
    root, want = written
    folder = str(root / "gzip")
    with pytest.raises(rk.errors.CompressedTFRecordError, match="GZIP-compressed"):
        rk.Dataset(folder)
    run = cli("convert", "--from", "tfrecord", folder, str(tmp_path / "c"), "--schema", FULL_SPEC)
    assert run.returncode == 0, run.stderr
    got = by_id(list(rk.Dataset(str(tmp_path / "c"))))
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert_same_record(got[k], w, f"converted GZIP id={k}")
    verify = cli("verify", folder)
    said = verify.stdout + verify.stderr
    assert verify.returncode == 0 and "GZIP-compressed" in said and f"{N} records" in said, said


# -- recordkit -> Ray ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """A recordkit dataset of 30 records in 3 shards, with a list of varying length."""
    root = tmp_path_factory.mktemp("ours") / "train"
    schema = rk.Schema(
        id=rk.Int64(),
        label=rk.Int64(),
        x=rk.Float32((3,)),
        image=rk.Bytes(),
        tags=rk.Int64((None,)),
    )
    samples = [
        {
            "id": k,
            "label": [np.iinfo(np.int64).min, -1, np.iinfo(np.int64).max][k % 3],
            "x": np.array([k, -0.0, np.nan], np.float32) if k % 2 else np.full(3, 0.1, np.float32),
            "image": bytes([k % 256, 0xFF]) * (k % 4),
            "tags": np.arange(k % 3 + 1, dtype=np.int64),
        }
        for k in range(30)
    ]
    with rk.Writer(root, schema, max_records=10) as w:
        for s in samples:
            w.write(s)
    return str(root), samples


def test_ray_reads_our_folder_with_file_extensions_and_tf_schema(ours):
    schema_pb2 = pytest.importorskip(
        "tensorflow_metadata.proto.v0.schema_pb2", reason="Ray's tf_schema is tensorflow-metadata's"
    )
    root, samples = ours
    tf_schema = schema_pb2.Schema()
    for name, kind in [
        ("id", "INT"),
        ("label", "INT"),
        ("x", "FLOAT"),
        ("image", "BYTES"),
        ("tags", "INT"),
    ]:
        feature = tf_schema.feature.add()
        feature.name, feature.type = name, getattr(schema_pb2, kind)
    rows = ray.data.read_tfrecords(
        root, file_extensions=["tfrecord"], tf_schema=tf_schema
    ).take_all()
    got = {r["id"][0]: r for r in rows}  # with a tf_schema every feature is a list
    assert sorted(got) == list(range(30))
    for k, s in enumerate(samples):
        row = got[k]
        assert bits(np.asarray(row["label"], np.int64)) == bits(np.int64(s["label"]))
        assert bits(np.asarray(row["x"], np.float32)) == bits(s["x"])  # NaN, -0.0 exact
        assert bits(np.asarray(row["tags"], np.int64)) == bits(s["tags"])
        assert row["image"] == [s["image"]]


def test_ray_without_tf_schema_fails_on_lists_of_varying_length(ours):
    root, _ = ours
    # pyarrow cannot unify a one-value list (read as a scalar) with longer ones
    with pytest.raises(Exception, match="tags has incompatible types: int64 vs list<item: int64>"):
        ray.data.read_tfrecords(root, file_extensions=["tfrecord"]).take_all()


def test_ray_without_file_extensions_trips_over_our_sidecars(ours):
    root, _ = ours
    with pytest.raises(Exception, match=r"Failed to read TFRecord file .*\.tfrecord\.idx"):
        ray.data.read_tfrecords(root).take_all()
