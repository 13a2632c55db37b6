"""Apache Beam both ways (issue 30), with the real engine on small data.

Beam runs in its own venv (``bash scripts/beam_env.sh`` builds ``.beam-venv``: Beam
2.77 pins pillow<13, which the project's lock does not allow), driven through
``beam_driver.py`` in subprocesses; the comparing side runs here, with TensorFlow.

Beam → recordkit: ``tf.train.Example``s serialized here, written by
``beam.io.WriteToTFRecord`` with its default names (``data-00000-of-00002``), TFX-style
``*.tfrecord.gz``, and compression GZIP and DEFLATE (TensorFlow's ZLIB); read value for
value by every recordkit reader (the compressed ones through ``recordkit convert``).
Beam's ZSTD, BZIP2 and LZMA, no TFRecord compressions, are named, not called corrupt.
recordkit → Beam: a dataset written by ``rk.Writer`` read by
``beam.io.ReadFromTFRecord("dir/*.tfrecord")``, each record parsed in the pipeline by
``recordkit.codec.decode_example``: the payloads byte for byte, the features value for
value. The recipes are ``docs/howto/ray-beam.md``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.format import read_stream

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

tf = pytest.importorskip("tensorflow")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("RECORDKIT_BEAM_VENV") or ROOT / ".beam-venv")
PYTHON = VENV / "bin" / "python"
DRIVER = Path(__file__).with_name("beam_driver.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.tf,
    pytest.mark.torch,
    pytest.mark.skipif(
        not PYTHON.exists(),
        reason=f"no Apache Beam venv at {VENV}: build it with `bash scripts/beam_env.sh`",
    ),
]


def _beam(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [str(PYTHON), str(DRIVER), *args], capture_output=True, text=True, timeout=180
    )
    if check:
        assert run.returncode == 0, run.stderr[-3000:]
    return run


def _example(features: dict) -> bytes:
    feature = {}
    for name, value in features.items():
        if isinstance(value, list):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=value))
        elif value.dtype == np.float32:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=value))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


# variant -> (driver options, the file names Beam gives)
WRITES = {
    "default": (["--shards", "2"], ["data-00000-of-00002", "data-00001-of-00002"]),
    "tfx-gz": (
        ["--shards", "2", "--suffix", ".tfrecord.gz"],
        ["data-00000-of-00002.tfrecord.gz", "data-00001-of-00002.tfrecord.gz"],
    ),
    "gzip": (["--compression", "GZIP"], ["data-00000-of-00001"]),
    "deflate": (["--compression", "DEFLATE"], ["data-00000-of-00001"]),
    "zstd": (["--compression", "ZSTD"], ["data-00000-of-00001"]),
    "bzip2": (["--compression", "BZIP2"], ["data-00000-of-00001"]),
    "lzma": (["--compression", "LZMA"], ["data-00000-of-00001"]),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Beam's writes of ``items()`` serialized as TensorFlow does, as ``stored`` says."""
    root = tmp_path_factory.mktemp("beam-writes")
    want = {
        k: stored(item, lambda a: tf.io.serialize_tensor(a).numpy())
        for k, item in enumerate(items())
    }
    (root / "payloads.json").write_text(json.dumps([_example(w).hex() for w in want.values()]))
    for variant, (options, _) in WRITES.items():
        _beam("write", str(root / "payloads.json"), str(root / variant / "data"), *options)
    return root, want


def test_beam_names_and_compressions(written):
    root, _ = written
    for variant, (_, names) in WRITES.items():
        assert sorted(os.listdir(root / variant)) == names, variant
    magic = {
        "tfx-gz": b"\x1f\x8b",
        "gzip": b"\x1f\x8b",
        "deflate": b"\x78",
        "zstd": b"(\xb5/\xfd",
        "bzip2": b"BZh",
        "lzma": b"\xfd7zXZ\x00",
    }
    for variant, head in magic.items():
        first = root / variant / WRITES[variant][1][0]
        assert first.read_bytes()[: len(head)] == head, variant


def test_every_reader_reads_beams_writes_value_for_value(written, tmp_path):
    root, want = written
    folder = root / "default"
    counts = check_every_reader(str(folder), want, tmp_path)
    assert set(counts.values()) == {N}, counts
    assert sorted(os.listdir(folder)) == WRITES["default"][1]  # nothing written there


@pytest.mark.parametrize(
    ("variant", "kind"), [("tfx-gz", "GZIP"), ("gzip", "GZIP"), ("deflate", "ZLIB")]
)
def test_beams_compressed_writes_are_named_verified_and_converted(written, tmp_path, variant, kind):
    root, want = written
    folder = str(root / variant)
    with pytest.raises(rk.errors.CompressedTFRecordError) as info:
        rk.Dataset(folder)
    assert info.value.compression == kind
    verify = cli("verify", folder)
    said = verify.stdout + verify.stderr
    assert verify.returncode == 0 and f"{kind}-compressed" in said and f"{N} records" in said, said
    run = cli("convert", "--from", "tfrecord", folder, str(tmp_path / "c"), "--schema", FULL_SPEC)
    assert run.returncode == 0, run.stderr
    got = by_id(list(rk.Dataset(str(tmp_path / "c"))))
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert_same_record(got[k], w, f"{variant} converted id={k}")


@pytest.mark.parametrize(
    ("variant", "named"), [("zstd", "a Zstandard"), ("bzip2", "a bzip2"), ("lzma", "an XZ")]
)
def test_beams_other_compressions_are_named_not_called_corrupt(written, variant, named):
    root, _ = written
    with pytest.raises(rk.errors.ShardNotFoundError, match=f"looks like {named}-compressed file"):
        rk.Dataset(root / variant)


# -- recordkit -> Beam -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """A recordkit dataset of 30 records in 3 shards (with their .idx and manifest)."""
    root = tmp_path_factory.mktemp("ours") / "train"
    schema = rk.Schema(
        id=rk.Int64(), big=rk.Int64(), x=rk.Float32((3,)), image=rk.Bytes(), tags=rk.Int64((None,))
    )
    samples = [
        {
            "id": k,
            "big": [np.iinfo(np.int64).min, -1, np.iinfo(np.int64).max][k % 3],
            "x": np.array([k, -0.0, np.nan], np.float32) if k % 2 else np.full(3, 0.1, np.float32),
            "image": bytes([k % 256, 0xFF, 0x00]) * (k % 4),
            "tags": np.arange(k % 3 + 1, dtype=np.int64),
        }
        for k in range(30)
    ]
    with rk.Writer(root, schema, max_records=10) as w:
        for s in samples:
            w.write(s)
    payloads = []
    for shard in rk.Dataset(root).shards:
        with open(root / shard.path, "rb") as f:
            payloads += [bytes(p) for p in read_stream(f, path=shard.path)]
    return root, samples, payloads


def test_beam_reads_our_shards_with_the_tfrecord_glob(ours, tmp_path):
    root, samples, payloads = ours
    _beam("read", str(root / "*.tfrecord"), str(tmp_path / "read.json"))
    rows = json.loads((tmp_path / "read.json").read_text())
    assert sorted(bytes.fromhex(r["payload"]) for r in rows) == sorted(payloads)  # byte for byte
    got = {r["features"]["id"][1][0]: r["features"] for r in rows}
    assert len(got) == len(samples) == 30
    for s in samples:  # and parsed in the pipeline by recordkit's codec, value for value
        f = got[s["id"]]
        assert f["big"] == ["int64", [int(s["big"])]]
        assert f["x"] == ["float", bits(s["x"])[1]]
        assert f["image"] == ["bytes", [s["image"].hex()]]
        assert f["tags"] == ["int64", s["tags"].tolist()]


def test_beam_on_every_file_of_our_folder_trips_over_the_sidecars(ours, tmp_path):
    root, _, _ = ours
    run = _beam("read", str(root / "*"), str(tmp_path / "read.json"), check=False)
    assert run.returncode != 0 and "Not a valid TFRecord" in run.stderr, run.stderr[-2000:]
