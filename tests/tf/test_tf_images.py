"""Images decoded for you in tf.data:
``recordkit.tf.dataset(options=ReadOptions(decode_images=...))``.

The same imagefolder datasets as the PyTorch tests (``tests/image_cases.py``):
every decoded image is compared with Pillow's decode of its source file, on the
plan's path (shuffled) and TensorFlow's own ``TFRecordDataset`` path
(unshuffled); images that do not decode are named by file, offset, record and
source key on both.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import SchemaError
from recordkit.images import ImageOptions
from recordkit.reader import ReadOptions
from tests.image_cases import BAD, make_broken, make_images, where

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("tfimages"))


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return make_broken(tmp_path_factory.mktemp("tfbroken"))


def _close(got: np.ndarray, want: np.ndarray, path: str) -> None:
    """PNG and GIF decode exactly alike; JPEG decoders round their IDCT and chroma
    upsampling differently (a pixel by a few levels on these noise images; another
    image would differ by ~85 on average)."""
    assert got.dtype == np.uint8 and got.shape == want.shape, path
    if path.endswith(".jpg"):
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.max() <= 8 and diff.mean() < 2.0, path
    else:
        np.testing.assert_array_equal(got, want, err_msg=path)


def _elements(ds, batched):
    for el in ds:
        if batched:
            paths = [p.decode() for p in el["path"].numpy()]
            imgs = el["image"]
            assert isinstance(imgs, tf.RaggedTensor)
            for i, p in enumerate(paths):
                yield p, imgs[i].numpy()
        else:
            yield el["path"].numpy().decode(), el["image"].numpy()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"shuffle": True}, {"batch_size": 4}, {"batch_size": 5, "shuffle": True, "seed": 2}],
    ids=["native", "planned", "native-batched", "planned-batched"],
)
def test_images_decode_to_what_pillow_reads(images, kwargs):
    ds_path, expected = images
    ds = rtf.dataset(ds_path, **kwargs, options=ReadOptions(decode_images="image"))
    seen = []
    for path, img in _elements(ds, "batch_size" in kwargs):
        _close(img, expected[path], path)
        seen.append(path)
    assert sorted(seen) == sorted(expected)


def test_modes_and_a_folder_without_manifest(images, tmp_path):
    ds_path, expected = images
    for mode, channels in (("L", 1), ("RGBA", 4)):
        ds = rtf.dataset(
            ds_path,
            shuffle=True,
            options=ReadOptions(decode_images=ImageOptions(("image",), mode=mode)),
        )
        for el in ds:
            path = el["path"].numpy().decode()
            img = el["image"].numpy()
            assert img.shape == (*expected[path].shape[:2], channels)
            with Image.open(ds_path.parent / "src" / path) as f:
                want = np.asarray(f.convert(mode)).reshape(img.shape)
            # TensorFlow's grey is a float weighting of RGB, Pillow's an integer one
            tol = 8 if path.endswith(".jpg") else 1 if mode == "L" else 0
            assert np.abs(img.astype(int) - want).max() <= tol, path
    foreign = tmp_path / "foreign"
    shutil.copytree(ds_path, foreign)
    (foreign / "recordkit.json").unlink()
    schema = rk.Dataset(ds_path).schema
    n = sum(
        1 for _ in rtf.dataset(foreign, schema=schema, options=ReadOptions(decode_images="image"))
    )
    assert n == len(expected)


@pytest.mark.parametrize("kwargs", [{}, {"shuffle": True}, {"batch_size": 3}])
def test_an_image_that_does_not_decode_names_its_record_and_source_key(broken, kwargs):
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        for _ in rtf.dataset(broken, **kwargs, options=ReadOptions(decode_images="image")):
            pass
    text = str(info.value)
    named = [k for k in BAD if f"source key '{k}'" in text]
    assert len(named) == 1, text
    path, offset, record = where(broken, named[0])
    assert (
        f"ImageDecodeError: {path}:{offset}:{record}: image feature 'image', source key "
        f"'{named[0]}' does not decode: " in text
    )
    assert BAD[named[0]] in text


def test_a_format_tensorflow_does_not_read_is_said_so(tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    Image.fromarray(np.zeros((4, 5, 3), np.uint8)).save(src / "x.tif")
    rk.convert(tmp_path / "src", tmp_path / "ds", format="imagefolder", workers=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not read it \\(a TIFF image"):
        list(rtf.dataset(tmp_path / "ds", options=ReadOptions(decode_images="image")))


def test_decode_images_is_checked_against_the_schema(images):
    ds_path, _ = images
    with pytest.raises(SchemaError, match=r"'label' is Int64\(\), not Bytes\(\)"):
        rtf.dataset(ds_path, options=ReadOptions(decode_images="label"))
    with pytest.raises(SchemaError, match="'image' is not among the features read"):
        rtf.dataset(ds_path, columns=["label"], options=ReadOptions(decode_images="image"))
    with pytest.raises(ValueError, match="apply_exif_orientation"):
        rtf.dataset(
            ds_path, options=ReadOptions(decode_images=ImageOptions(apply_exif_orientation=True))
        )


@pytest.mark.parametrize("kwargs", [{}, {"shuffle": True}], ids=["native", "planned"])
def test_decode_images_true_is_for_tfds_folders_and_says_what_to_name(images, kwargs):
    # decode_images=True decodes a tensorflow-datasets folder's Image features; our own
    # data names its image features, and True is refused on either path, never ignored.
    ds_path, _ = images
    with pytest.raises(ValueError, match=r"tensorflow-datasets folders; .*decode_images='image'"):
        rtf.dataset(ds_path, **kwargs, options=ReadOptions(decode_images=True))
    plain = next(iter(rtf.dataset(ds_path, **kwargs, options=ReadOptions(decode_images=False))))
    assert plain["image"].dtype == tf.string  # False (and None): nothing decoded
