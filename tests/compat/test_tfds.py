"""tensorflow-datasets folders, written by the real ``tensorflow-datasets`` (issue 15, item 5).

A builder defined here prepares a dataset in a temporary ``data_dir`` (no
download): images (PNG of varying size, fixed-size JPEG), class labels with and
without names, text, tensors of many dtypes and encodings (none, bytes, zlib,
two unknown dims), a float64 and a bool scalar, and a ``Sequence`` of bounding
boxes and labels, in two splits of several shards. Every value recordkit's
readers return is compared with ``builder.as_dataset``'s, and the folder must be
byte for byte as tfds left it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import ManifestError, SchemaError, ShardNotFoundError
from recordkit.reader import ReadOptions

pytestmark = [pytest.mark.tf, pytest.mark.slow]

SPLITS = {"train": 23, "test": 7}


@pytest.fixture(scope="module")
def tfds() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TensorFlow's and tfds's import-time noise
        return pytest.importorskip("tensorflow_datasets")


def _builder_class(tfds: ModuleType) -> type:
    features = tfds.features

    class Tiny(tfds.core.GeneratorBasedBuilder):  # type: ignore[misc,name-defined]
        VERSION = tfds.core.Version("1.2.0")

        def _info(self) -> Any:
            return tfds.core.DatasetInfo(
                builder=self,
                features=features.FeaturesDict(
                    {
                        "image": features.Image(shape=(None, None, 3)),
                        "photo": features.Image(shape=(6, 4, 3), encoding_format="jpeg"),
                        "mask": features.Image(shape=(5, 5, 1)),
                        "label": features.ClassLabel(names=["cat", "dog", "bird"]),
                        "text": features.Text(),
                        "emb": features.Tensor(shape=(4,), dtype=np.float32),
                        "grid": features.Tensor(shape=(2, 3), dtype=np.int32),
                        "small": features.Tensor(shape=(3,), dtype=np.uint8),
                        "big": features.Tensor(shape=(), dtype=np.uint64),
                        "var": features.Tensor(shape=(None,), dtype=np.int64),
                        "half": features.Tensor(shape=(3,), dtype=np.float16, encoding="bytes"),
                        "packed": features.Tensor(shape=(None, 2), dtype=np.int16, encoding="zlib"),
                        "ragged": features.Tensor(
                            shape=(None, None), dtype=np.uint8, encoding="zlib"
                        ),
                        "score": features.Scalar(dtype=np.float64),
                        "flag": features.Scalar(dtype=np.bool_),
                        "words": features.Tensor(shape=(None,), dtype=np.str_),
                        "objects": features.Sequence(
                            {
                                "bbox": features.BBoxFeature(),
                                "kind": features.ClassLabel(num_classes=4),
                            }
                        ),
                    }
                ),
                supervised_keys=("image", "label"),
            )

        def _split_generators(self, dl_manager: Any) -> Any:
            return {name: self._generate_examples(name, n) for name, n in SPLITS.items()}

        def _generate_examples(self, split: str, n: int) -> Any:
            rng = np.random.default_rng(len(split))
            for i in range(n):
                yield (
                    f"{split}{i}",
                    {
                        "image": rng.integers(0, 255, (3 + i % 4, 2 + i % 3, 3), dtype=np.uint8),
                        "photo": rng.integers(0, 255, (6, 4, 3), dtype=np.uint8),
                        "mask": rng.integers(0, 255, (5, 5, 1), dtype=np.uint8),
                        "label": i % 3,
                        "text": f"héllo {split} {i}",
                        "emb": rng.random(4, dtype=np.float32),
                        "grid": rng.integers(-(2**31), 2**31 - 1, (2, 3), dtype=np.int32),
                        "small": rng.integers(0, 255, 3, dtype=np.uint8),
                        "big": np.uint64(2**64 - 1 - i),
                        "var": np.arange(i % 5, dtype=np.int64) * -7,
                        "half": rng.random(3).astype(np.float16),
                        "packed": rng.integers(-30000, 30000, (i % 4, 2), dtype=np.int16),
                        "ragged": rng.integers(0, 255, (i % 3, i % 4), dtype=np.uint8),
                        "score": i / 7,
                        "flag": bool(i % 2),
                        "words": [f"w{j}" for j in range(i % 3)],
                        "objects": {
                            "bbox": [
                                tfds.features.BBox(0.1 * j, 0.1, 0.5 + 0.1 * j, 0.9)
                                for j in range(i % 3)
                            ],
                            "kind": [j % 4 for j in range(i % 3)],
                        },
                    },
                )

    return Tiny


@pytest.fixture(scope="module")
def prepared(tfds: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    data_dir = tmp_path_factory.mktemp("tfds")
    builder = _builder_class(tfds)(data_dir=str(data_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
    root = Path(builder.data_dir)
    return builder, root


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.iterdir())}


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[prefix + key] = value
    return out


def _tfds_values(tfds: ModuleType, builder: Any, split: str, decode: bool) -> list[dict[str, Any]]:
    """tfds's own reading, flattened as recordkit names features."""
    decoders = None
    if not decode:
        skip = tfds.decode.SkipDecoding()
        decoders = {"image": skip, "photo": skip, "mask": skip}
    ds = builder.as_dataset(split=split, shuffle_files=False, decoders=decoders)
    values = [_flat(ex) for ex in tfds.as_numpy(ds)]
    if decode:
        # JPEG: TensorFlow's decoder and Pillow's differ by a few levels (their IDCT and
        # upsampling); recordkit decodes as tfds's own NumPy path does (Pillow without
        # OpenCV), so that is the reference, and TensorFlow's stays within a few levels.
        photo = builder.info.features["photo"]
        for ex, enc in zip(values, _tfds_values(tfds, builder, split, decode=False)):
            pil = photo.decode_example_np(enc["photo"])
            assert np.abs(pil.astype(int) - ex["photo"].astype(int)).max() <= 16
            ex["photo"] = pil
    return values


def _np(value: Any) -> Any:
    return value.numpy() if hasattr(value, "numpy") else value


def _assert_same(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    assert set(ours) == set(theirs), where
    for name, want in theirs.items():
        have = ours[name]
        if name in ("text",):
            assert have == want.decode("utf-8"), (where, name)
        elif name == "words":
            assert [w.encode() if isinstance(w, str) else w for w in have] == list(want)
        elif isinstance(want, bytes):
            assert bytes(have) == want, (where, name)
        else:
            have = np.asarray(have)
            assert have.dtype == want.dtype, (where, name, have.dtype, want.dtype)
            assert have.shape == want.shape, (where, name, have.shape, want.shape)
            np.testing.assert_array_equal(have, want, err_msg=f"{where} {name}")


@pytest.mark.parametrize("decode", [False, True])
def test_dataset_equals_tfds(tfds: ModuleType, prepared: tuple[Any, Path], decode: bool) -> None:
    builder, root = prepared
    before = _listing(root)
    assert sum(1 for name in before if ".tfrecord-" in name) == 6  # 3 shards per split
    for split, n in SPLITS.items():
        theirs = _tfds_values(tfds, builder, split, decode)
        with rk.Dataset(root, split=split, decode_images=decode) as ds:
            ours = list(ds)
            assert len(ds) == n == len(theirs)
            assert ds.tfds is not None and ds.tfds.class_names == {
                "label": ["cat", "dog", "bird"],
                "objects/kind": ["0", "1", "2", "3"],
            }
            assert ds.metadata["tfds"]["split"] == split
            assert ds.metadata["tfds"]["supervised_keys"] == ["image", "label"]
            last = ds[-1]
        for i, (o, t) in enumerate(zip(ours, theirs)):
            _assert_same(o, t, f"{split}[{i}]")
        _assert_same(last, theirs[-1], f"{split}[-1]")
    assert _listing(root) == before, "reading wrote into the tfds folder"


def test_record_dataset_batches_equal_tfds(tfds: ModuleType, prepared: tuple[Any, Path]) -> None:
    torch = pytest.importorskip("torch")
    from recordkit.torch import RecordDataset, RecordMapDataset

    builder, root = prepared
    before = _listing(root)
    theirs = _tfds_values(tfds, builder, "train", decode=True)
    ds = RecordDataset(
        root, split="train", batch_size=5, options=ReadOptions(num_threads=2, decode_images=True)
    )
    rows: list[dict[str, Any]] = []
    for batch in ds:
        n = len(batch["label"])
        assert batch["grid"].dtype == torch.int32 and batch["grid"].shape == (n, 2, 3)
        assert batch["photo"].shape == (n, 6, 4, 3) and batch["mask"].dtype == torch.uint8
        assert isinstance(batch["image"], list) and isinstance(batch["text"], list)
        for j in range(n):
            rows.append({k: _np(v[j]) for k, v in batch.items()})
    assert len(rows) == len(theirs)
    for i, (o, t) in enumerate(zip(rows, theirs)):
        _assert_same(o, t, f"batch row {i}")
    # Single samples, encoded images, a few columns, and random access.
    theirs_enc = _tfds_values(tfds, builder, "test", decode=False)
    samples = list(
        RecordDataset(
            root, split="test", columns=["text", "packed"], options=ReadOptions(num_threads=1)
        )
    )
    for i, (o, t) in enumerate(zip(samples, theirs_enc)):
        _assert_same(
            {k: _np(v) for k, v in o.items()},
            {k: t[k] for k in ("text", "packed")},
            f"sample {i}",
        )
    padded = next(iter(RecordDataset(root, split="test", batch_size=7, columns=["image"])))
    for j in range(7):
        length = int(padded["image/lengths"][j])
        assert padded["image"][j, :length].numpy().tobytes() == theirs_enc[j]["image"]
    maps = RecordMapDataset(root, split="test", options=ReadOptions(decode_images=True))
    got = maps.__getitems__([6, 0])
    theirs_dec = _tfds_values(tfds, builder, "test", decode=True)
    for o, t in zip(got, (theirs_dec[6], theirs_dec[0])):
        _assert_same({k: _np(v) for k, v in o.items()}, t, "map")
    plain = RecordDataset(root, split="train")
    batch = plain.collate(list(plain)[:3])  # as batch_size=3 gives it
    assert batch["grid"].shape == (3, 2, 3) and isinstance(batch["text"], list)
    assert batch["photo"].dtype == torch.uint8 and batch["photo/lengths"].shape == (3,)
    assert _listing(root) == before


def test_one_shard_and_split_errors(prepared: tuple[Any, Path]) -> None:
    _, root = prepared
    with pytest.raises(ValueError, match=r"splits train \(23 records\), test \(7 records\)"):
        rk.Dataset(root)
    with pytest.raises(ShardNotFoundError, match="no split 'validation'; it has train"):
        rk.Dataset(root, split="validation")
    shard = sorted(root.glob("tiny-test.tfrecord-*"))[1]
    with rk.Dataset(shard) as ds:  # one shard: its split's types
        assert ds.metadata["tfds"]["split"] == "test"
        assert isinstance(ds[0]["text"], str) and ds[0]["grid"].dtype == np.int32
    with rk.Dataset(root, split="test", raw=True) as raw:  # as stored
        assert raw[0]["grid"].dtype == np.int64 and "ragged/value" in raw[0]
    with pytest.raises(ValueError, match=r"version folder\(s\) 1.2.0: read one\); split= is for"):
        rk.Dataset(shard.parent.parent, split="train")
    with pytest.raises(ShardNotFoundError, match=r"version folder\(s\) 1.2.0"):
        rk.Dataset(shard.parent.parent)


def test_metadata_that_disagrees_is_named(prepared: tuple[Any, Path], tmp_path: Path) -> None:
    import json
    import shutil

    _, root = prepared
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    info = json.loads((copy / "dataset_info.json").read_text())
    for split in info["splits"]:
        if split["name"] == "test":
            split["shardLengths"][0] = str(int(split["shardLengths"][0]) + 1)
    (copy / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(ManifestError, match=r"dataset_info.json says"):
        list(rk.Dataset(copy, split="test"))
    next(iter(sorted(copy.glob("tiny-train.tfrecord-*")))).unlink()
    with pytest.raises(ShardNotFoundError, match="lists it in split 'train'"):
        rk.Dataset(copy, split="train")
    feats = json.loads((copy / "features.json").read_text())
    feats["featuresDict"]["features"]["clip"] = {
        "pythonClassName": "tensorflow_datasets.core.features.video_feature.Video",
        "video": {"shape": {"dimensions": ["-1", "8", "8", "3"]}, "dtype": "uint8"},
    }
    (copy / "features.json").write_text(json.dumps(feats))
    with pytest.raises(SchemaError, match=r"feature 'clip': tfds Video is not supported.*raw"):
        rk.Dataset(copy, split="test")


def test_convert_keeps_tfds_types(
    tfds: ModuleType, prepared: tuple[Any, Path], tmp_path: Path
) -> None:
    builder, root = prepared
    before = _listing(root)
    from converters.base import SourceError

    with pytest.raises(SourceError, match=r"choose one with split='NAME' \(recordkit convert"):
        rk.convert(root, tmp_path / "x", format="tfrecord", workers=0)
    rk.convert(
        root, tmp_path / "out", format="tfrecord", workers=0, source_options={"split": "train"}
    )
    theirs = _tfds_values(tfds, builder, "train", decode=False)
    with rk.Dataset(tmp_path / "out") as ds:
        assert ds.schema["grid"] == rk.Tensor("int32", (2, 3))
        assert ds.metadata["tfds"]["class_names"]["label"] == ["cat", "dog", "bird"]
        ours = list(ds)
    assert len(ours) == len(theirs)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        o["text"] = o["text"].decode("utf-8")  # recordkit stores Text as UTF-8 bytes
        _assert_same(o, t, f"converted[{i}]")
    assert rk.verify(tmp_path / "out").ok
    assert _listing(root) == before


def test_tf_dataset_equals_tfds(tfds: ModuleType, prepared: tuple[Any, Path]) -> None:
    from recordkit import tf as rktf

    builder, root = prepared
    theirs = _tfds_values(tfds, builder, "train", decode=True)
    tf_photo = [ex["photo"] for ex in _tfds_as_tf(tfds, builder)]
    ours = list(
        rktf.dataset(
            root, split="train", options=ReadOptions(decode_images=True)
        ).as_numpy_iterator()
    )
    assert len(ours) == len(theirs)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        o["text"] = o["text"].decode("utf-8")
        np.testing.assert_array_equal(o.pop("photo"), tf_photo[i])  # TensorFlow's JPEG decoder
        t = {k: v for k, v in t.items() if k != "photo"}
        _assert_same(o, t, f"tf[{i}]")
    batches = list(rktf.dataset(root, split="test", batch_size=4, columns=["grid", "text"]))
    assert [b["grid"].shape for b in batches] == [(4, 2, 3), (3, 2, 3)]
    assert batches[0]["grid"].dtype.name == "int32"


def test_tf_dataset_of_a_tfds_folder_refuses_named_images(prepared: tuple[Any, Path]) -> None:
    # Feature names (recordkit's Bytes() image features) are not how a tfds folder's
    # Image features are decoded: decode_images=True is, and the error says so.
    from recordkit import tf as rktf

    _, root = prepared
    with pytest.raises(ValueError, match=r"decoded with decode_images=True, not .*'photo'"):
        rktf.dataset(root, split="train", options=ReadOptions(decode_images="photo"))


def _tfds_as_tf(tfds: ModuleType, builder: Any) -> list[dict[str, Any]]:
    ds = builder.as_dataset(split="train", shuffle_files=False)
    return list(tfds.as_numpy(ds))


@pytest.mark.parametrize("spec", ["train[:50%]", "train[-5:]", "train[10%:40%]", "test[1:3]"])
def test_split_ranges_equal_tfds(tfds: ModuleType, prepared: tuple[Any, Path], spec: str) -> None:
    """records="train[:50%]" (and split="train[:50%]") read the records tfds's split
    string reads, percents rounded as tfds rounds them."""
    pytest.importorskip("torch")
    from recordkit import tf as rktf
    from recordkit.torch import RecordDataset

    builder, root = prepared

    def text(v: Any) -> str:
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)

    theirs = [text(t["text"]) for t in _tfds_values(tfds, builder, spec, decode=False)]
    assert theirs  # the range is not empty
    ours = [text(s["text"]) for s in RecordDataset(root, records=spec, columns=["text"])]
    assert ours == theirs
    tf_ours = rktf.dataset(root, split=spec, columns=["text"]).as_numpy_iterator()
    assert [text(s["text"]) for s in tf_ours] == theirs
