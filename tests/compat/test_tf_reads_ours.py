"""TensorFlow reads recordkit-written shards natively, with no recordkit code involved.

A dataset covering every feature type and shape kind is written with
``recordkit.Writer``; TensorFlow then reads it with ``tf.data.TFRecordDataset`` and
``tf.io.parse_example`` alone (raw tensors through ``tf.io.decode_raw``, zstd values
through the ``zstandard`` package), and every value must equal what was written.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import recordkit

pytestmark = pytest.mark.tf

N_SAMPLES = 20
MAX_RECORDS = 7  # -> shards of 7, 7 and 6 records


def _schema() -> recordkit.Schema:
    return recordkit.Schema(
        id=recordkit.Int64(),
        name=recordkit.Bytes(),
        tags=recordkit.Bytes(shape=(None,)),
        triple=recordkit.Int64(shape=(3,)),
        ints=recordkit.Int64(shape=(None,)),
        score=recordkit.Float32(),
        grid=recordkit.Float32(shape=(2, 3)),
        floats=recordkit.Float32(shape=(None,)),
        image=recordkit.Tensor(np.uint8, (4, 5, 3)),
        emb=recordkit.Tensor(np.float32, (None, 8)),
        ragged=recordkit.Tensor(np.int32, (None, None)),
        packed=recordkit.Tensor(np.float32, (16, 16), compression="zstd"),
    )


def _sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    n_tags, n_ints, n_floats = i % 4, (i * 3) % 5, (i * 2) % 7
    return {
        "id": i,
        "name": f"sample-{i}-\u00e9".encode() if i % 5 else b"",
        "tags": [bytes([65 + j]) * (j + 1) + b"\x00\xff" for j in range(n_tags)],
        "triple": np.array([i, -i, np.iinfo(np.int64).min + i], dtype=np.int64),
        "ints": rng.integers(-(2**62), 2**62, n_ints, dtype=np.int64),
        "score": np.float32([0.5, -0.0, np.inf, -np.inf, np.nan][i % 5]),
        "grid": rng.standard_normal((2, 3)).astype(np.float32),
        "floats": rng.standard_normal(n_floats).astype(np.float32),
        "image": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        "emb": rng.standard_normal((i % 4, 8)).astype(np.float32),
        "ragged": rng.integers(-(2**31), 2**31, (i % 3, (i * 7) % 5), dtype=np.int32),
        # Mostly zeros, so zstd actually compresses it.
        "packed": np.where(rng.random((16, 16)) < 0.1, rng.standard_normal((16, 16)), 0).astype(
            np.float32
        ),
    }


@pytest.fixture(scope="module")
def tf() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with warnings.catch_warnings():
        # TensorFlow's own import-time deprecation noise is not ours to fix.
        warnings.simplefilter("ignore")
        return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("ours")
    samples = [_sample(i) for i in range(N_SAMPLES)]
    with recordkit.Writer(root, _schema(), max_records=MAX_RECORDS) as w:
        for sample in samples:
            w.write(sample)
    return root, samples


def _manifest_shards(root: Path) -> list[tuple[Path, int]]:
    doc = json.loads((root / "recordkit.json").read_text(encoding="utf-8"))
    return [(root / s["path"], int(s["records"])) for s in doc["shards"]]


def test_tf_reads_every_record(tf: ModuleType, written: tuple[Path, list[Any]]) -> None:
    root, _ = written
    shards = _manifest_shards(root)
    assert [path.name for path, _ in shards] == [
        f"part-{i:05d}.tfrecord" for i in range(-(-N_SAMPLES // MAX_RECORDS))
    ]
    assert sorted(p.name for p in root.glob("*.tfrecord")) == [p.name for p, _ in shards]
    for path, records in shards:
        assert Path(recordkit.format.index_path(path)).is_file()
        assert sum(1 for _ in tf.data.TFRecordDataset(str(path))) == records, path
    assert sum(records for _, records in shards) == N_SAMPLES
    assert [s.records for s in recordkit.Dataset(root).shards] == [r for _, r in shards]


def _spec(tf: ModuleType) -> dict[str, Any]:
    return {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "name": tf.io.FixedLenFeature([], tf.string),
        "tags": tf.io.RaggedFeature(tf.string),
        "triple": tf.io.FixedLenFeature([3], tf.int64),
        "ints": tf.io.RaggedFeature(tf.int64),
        "score": tf.io.FixedLenFeature([], tf.float32),
        "grid": tf.io.FixedLenFeature([2, 3], tf.float32),
        "floats": tf.io.VarLenFeature(tf.float32),
        "image": tf.io.FixedLenFeature([], tf.string),
        "emb": tf.io.FixedLenFeature([], tf.string),
        "ragged": tf.io.FixedLenFeature([], tf.string),
        "ragged/shape": tf.io.FixedLenFeature([2], tf.int64),
        "packed": tf.io.FixedLenFeature([], tf.string),
    }


def _read_with_tf(tf: ModuleType, files: list[str]) -> list[dict[str, Any]]:
    """Every record of ``files`` as numpy values, using TensorFlow and zstandard only."""
    import zstandard

    ds = tf.data.TFRecordDataset(files).batch(8).map(lambda x: tf.io.parse_example(x, _spec(tf)))
    out: list[dict[str, Any]] = []
    for batch in ds:
        floats = tf.RaggedTensor.from_sparse(batch["floats"])
        for j in range(int(batch["id"].shape[0])):
            row = {
                key: batch[key][j].numpy()
                for key in ("id", "name", "triple", "score", "grid", "ragged/shape")
            }
            row["tags"] = batch["tags"][j].numpy().tolist()
            row["ints"] = batch["ints"][j].numpy()
            row["floats"] = floats[j].numpy()
            row["image"] = tf.reshape(
                tf.io.decode_raw(batch["image"][j], tf.uint8, little_endian=True), [4, 5, 3]
            ).numpy()
            row["emb"] = tf.reshape(
                tf.io.decode_raw(batch["emb"][j], tf.float32, little_endian=True), [-1, 8]
            ).numpy()
            row["ragged"] = tf.reshape(
                tf.io.decode_raw(batch["ragged"][j], tf.int32, little_endian=True),
                batch["ragged/shape"][j],
            ).numpy()
            raw = (
                zstandard.ZstdDecompressor().decompressobj().decompress(batch["packed"][j].numpy())
            )
            row["packed"] = tf.reshape(
                tf.io.decode_raw(raw, tf.float32, little_endian=True), [16, 16]
            ).numpy()
            out.append(row)
    return out


def _same(key: str, got: Any, want: Any) -> None:
    if isinstance(want, (bytes, list)):
        assert got == want, key
    else:
        want = np.asarray(want)
        assert got.shape == want.shape, (key, got.shape, want.shape)
        assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
        # Bitwise, so nan and -0.0 count.
        assert got.tobytes() == want.tobytes(), key


def test_tf_parse_example_reads_written_values(
    tf: ModuleType, written: tuple[Path, list[dict[str, Any]]]
) -> None:
    root, samples = written
    files = [str(path) for path, _ in _manifest_shards(root)]
    rows = _read_with_tf(tf, files)
    assert len(rows) == len(samples)
    for row, sample in zip(rows, samples, strict=True):
        for key, want in sample.items():
            if key in ("id", "score"):
                want = np.asarray(want, dtype=np.int64 if key == "id" else np.float32)
            _same(key, row[key], want)
        assert row["ragged/shape"].tolist() == list(sample["ragged"].shape)


def test_tf_reads_zstd_feature_compressed(
    tf: ModuleType, written: tuple[Path, list[dict[str, Any]]]
) -> None:
    """The zstd feature really is a zstd frame on disk, not raw bytes that happen to fit."""
    root, samples = written
    first = str(_manifest_shards(root)[0][0])
    spec = {"packed": tf.io.FixedLenFeature([], tf.string)}
    record = next(iter(tf.data.TFRecordDataset([first])))
    value = tf.io.parse_single_example(record, spec)["packed"].numpy()
    assert value[:4] == b"\x28\xb5\x2f\xfd"  # the zstd frame magic
    assert len(value) < samples[0]["packed"].nbytes
