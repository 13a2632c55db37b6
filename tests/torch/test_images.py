"""Images decoded for you in PyTorch: ``recordkit.torch.DecodeImages`` over what imagefolder writes.

Real image files (JPEG, PNG grey and with alpha, GIF) are converted with
``--from imagefolder``; every decoded image is compared with Pillow's decode of
the source file, in every reading mode; images that do not decode are named by
shard, offset, record and source path, in every mode.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import recordkit as rk
from recordkit.errors import ImageDecodeError
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.torch

from recordkit._origins import ordered_map  # noqa: E402
from recordkit.images import ImageOptions, decode_image  # noqa: E402
from recordkit.torch import DataLoader, DecodeImages, RecordDataset, RecordMapDataset  # noqa: E402
from tests.image_cases import BAD, make_broken, make_images, where  # noqa: E402


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return make_broken(tmp_path_factory.mktemp("broken"))


def _check(decoded, paths, expected):
    assert len(decoded) == len(paths)
    for img, path in zip(decoded, paths):
        assert img.dtype == torch.uint8
        np.testing.assert_array_equal(img.permute(1, 2, 0).numpy(), expected[path])


def _paths(batch):
    if "path/lengths" in batch:
        return [
            bytes(batch["path"][i, :n].numpy()).decode()
            for i, n in enumerate(batch["path/lengths"].tolist())
        ]
    return [bytes(p).decode() for p in batch["path"]]


@pytest.mark.parametrize("threads", [0, 2])
@pytest.mark.parametrize("bytes_as", ["padded", "list"])
def test_batches_decode_to_what_pillow_reads_from_the_files(images, threads, bytes_as):
    ds_path, expected = images
    ds = RecordDataset(
        ds_path,
        batch_size=5,
        shuffle=True,
        transform=DecodeImages(),
        options=ReadOptions(transform_threads=threads, bytes_as=bytes_as),
    )
    seen = []
    for batch in ds:
        assert "image/lengths" not in batch and isinstance(batch["image"], list)
        paths = _paths(batch)
        _check(batch["image"], paths, expected)
        seen += paths
    assert sorted(seen) == sorted(expected)


def test_samples_modes_and_layouts(images):
    ds_path, expected = images
    for mode, channels in (("RGB", 3), ("L", 1), ("RGBA", 4)):
        ds = RecordDataset(ds_path, transform=DecodeImages(mode=mode, layout="HWC"))
        for sample in ds:
            path = sample["path"].decode()
            img = sample["image"]
            assert img.shape == (*expected[path].shape[:2], channels)
            with Image.open(ds_path.parent / "src" / path) as f:
                want = np.asarray(f.convert(mode))
            np.testing.assert_array_equal(img.numpy().reshape(want.shape), want)


def test_dataloader_workers_and_map_dataset(images):
    ds_path, expected = images
    ds = RecordDataset(
        ds_path, batch_size=4, transform=DecodeImages(), options=ReadOptions(num_threads=1)
    )
    got = []
    for batch in DataLoader(ds, num_workers=2):
        _check(batch["image"], _paths(batch), expected)
        got += _paths(batch)
    assert sorted(got) == sorted(expected)
    # a plain DataLoader batches samples itself (images as a list of bytes), then decodes
    mds = RecordMapDataset(ds_path)
    loader = torch.utils.data.DataLoader(
        mds,
        batch_size=6,
        collate_fn=lambda s: DecodeImages()(
            {"image": [x["image"] for x in s], "path": [x["path"] for x in s]}
        ),
    )
    for batch in loader:
        _check(batch["image"], _paths(batch), expected)
    # and RecordMapDataset's own transform, per sample
    mds = RecordMapDataset(ds_path, transform=DecodeImages())
    sample = mds[3]
    _check([sample["image"]], [sample["path"].decode()], expected)


def test_the_loader_process_carries_where_rows_came_from(images, broken):
    ds_path, expected = images
    ds = RecordDataset(
        ds_path, batch_size=8, transform=DecodeImages(), options=ReadOptions(reader_process=True)
    )
    assert sum(len(b["image"]) for b in ds) == len(expected)
    ds = RecordDataset(
        broken, batch_size=8, transform=DecodeImages(), options=ReadOptions(reader_process=True)
    )
    with pytest.raises(ImageDecodeError) as info:
        list(ds)
    path, offset, record = where(broken, info.value.key)
    assert (info.value.path, info.value.offset, info.value.record) == (path, offset, record)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: RecordDataset(p, batch_size=4, transform=DecodeImages()),
        lambda p: RecordDataset(
            p, batch_size=4, transform=DecodeImages(), options=ReadOptions(transform_threads=3)
        ),
        lambda p: RecordDataset(p, transform=DecodeImages(), shuffle=True, seed=3),
        lambda p: RecordDataset(
            p, batch_size=3, transform=DecodeImages(), options=ReadOptions(bytes_as="list")
        ),
    ],
    ids=["batches", "threads", "samples", "list"],
)
def test_an_image_that_does_not_decode_names_its_record_and_source_key(broken, make):
    with pytest.raises(ImageDecodeError) as info:
        for _ in make(broken):
            pass
    err = info.value
    assert err.key in BAD and err.feature == "image"
    path, offset, record = where(broken, err.key)
    assert (err.path, err.offset, err.record) == (path, offset, record)
    assert str(err).startswith(
        f"{path}:{offset}:{record}: image feature 'image', source key '{err.key}' does not decode"
    )
    assert BAD[err.key] in str(err)
    assert isinstance(err, ValueError) and isinstance(err.__cause__, Exception)


def test_every_bad_image_is_found_by_each_reader(broken):
    """Skipping past each error in turn (by reading single records) finds both bad images."""
    mds = RecordMapDataset(broken, transform=DecodeImages())
    bad = {}
    for i in range(len(mds)):
        try:
            mds[i]
        except ImageDecodeError as err:
            bad[err.key] = (err.path, err.offset, err.record)
    assert bad == {key: where(broken, key) for key in BAD}


def test_errors_in_dataloader_workers_keep_the_location(broken):
    ds = RecordDataset(
        broken, batch_size=4, transform=DecodeImages(), options=ReadOptions(num_threads=1)
    )
    with pytest.raises(ImageDecodeError) as info:
        list(DataLoader(ds, num_workers=2))
    text = str(info.value)
    del info  # its traceback holds the loader: torch stops the workers (in 5 s) here, not later
    gc.collect()
    assert any(
        f"{':'.join(map(str, where(broken, k)))}: image feature 'image', source key '{k}'" in text
        for k in BAD
    )


def test_without_a_recordkit_reader_the_row_is_named(broken):
    good = (broken.parent / "src" / "cat" / "0.jpg").read_bytes()
    bad = (broken.parent / "src" / "dog" / "text.jpg").read_bytes()
    batch = {"image": [good, bad], "path": ["a.jpg", "b.jpg"]}
    with pytest.raises(ImageDecodeError) as info:
        DecodeImages()(batch)
    assert str(info.value).startswith(
        "<buffer>:?:?: image feature 'image', source key 'b.jpg' does not decode "
        "(row 1 of the item; its record is unknown): UnidentifiedImageError: cannot identify"
    )
    with pytest.raises(ImageDecodeError, match=r"an empty value"):
        decode_image(b"")


def test_resume_with_transform_threads_is_exact(images):
    ds_path, _ = images

    def make():
        return RecordDataset(
            ds_path,
            batch_size=3,
            shuffle=True,
            seed=1,
            transform=DecodeImages(),
            options=ReadOptions(transform_threads=2),
        )

    full = [_paths(b) for b in make()]
    ds = make()
    for step, _batch in enumerate(ds):
        if step == 2:
            state = ds.state_dict()
            break
    again = make()
    again.load_state_dict(state)
    assert [_paths(b) for b in again] == full[3:]


def test_transform_threads_with_the_loader_process_stay_within_its_slots(tmp_path):
    """Batches waiting for the transform hold the loader's shared-memory slots (4): with
    one batch per chunk, 2 x 3 waiting batches would hold them all; the wait is capped."""
    schema = rk.Schema(x=rk.Tensor("uint8", (1 << 20,)), i=rk.Int64())
    with rk.Writer(tmp_path / "big", schema) as w:
        for i in range(48):
            w.write({"x": np.full(1 << 20, i % 256, np.uint8), "i": i})

    def touch(batch):
        batch["sum"] = batch["x"][:, :8].sum()
        return batch

    ds = RecordDataset(
        tmp_path / "big",
        batch_size=8,
        transform=touch,
        options=ReadOptions(reader_process=True, transform_threads=3),
    )
    assert [int(i) for b in ds for i in b["i"]] == list(range(48))


def test_options_are_checked():
    with pytest.raises(ValueError, match=r"mode must be one of \('RGB', 'L', 'RGBA'\), got 'CMYK'"):
        DecodeImages(mode="CMYK")
    with pytest.raises(ValueError, match="layout must be 'CHW' or 'HWC'"):
        DecodeImages(layout="NHWC")
    with pytest.raises(ValueError, match="key 'image' is one of the image features"):
        ImageOptions(("image",), key="image")
    with pytest.raises(ValueError, match="transform_threads must be >= 0"):
        RecordDataset(".", options=ReadOptions(transform_threads=-1))
    with pytest.raises(KeyError, match="no feature 'img'"):
        DecodeImages("img")({"image": b""})
    with pytest.raises(TypeError, match="not encoded image bytes"):
        DecodeImages()({"image": torch.zeros(2, 3, dtype=torch.uint8)})


def test_ordered_map_keeps_order_and_raises_in_place():
    def fn(x):
        if x == 7:
            raise KeyError("seven")
        return x * 2

    items = ((i, i, None) for i in range(20))
    out = []
    with pytest.raises(KeyError, match="seven"):
        for unit, value in ordered_map(fn, items, threads=3):
            out.append((unit, value))
    assert out == [(i, 2 * i) for i in range(7)]
    gen = ordered_map(lambda x: x, ((i, i, None) for i in range(100)), threads=2)
    assert next(gen) == (0, 0)
    gen.close()  # cancels what has not started, waits for what has


_BROKEN_TORCHVISION = "raise RuntimeError('operator torchvision::nms does not exist')\n"


def test_a_torchvision_that_does_not_import_falls_back_to_pillow_with_one_info_line(
    tmp_path, images
):
    """A real import failure (a package that raises on import, as a torchvision built for
    another torch does), in a fresh interpreter: one INFO line, then Pillow decodes."""
    (tmp_path / "tv" / "torchvision").mkdir(parents=True)
    (tmp_path / "tv" / "torchvision" / "__init__.py").write_text(_BROKEN_TORCHVISION)
    ds_path, expected = images
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
        "from recordkit.torch import DecodeImages, RecordDataset\n"
        "from recordkit.torch.images import image_backend\n"
        f"ds = RecordDataset({str(ds_path)!r}, batch_size=8, transform=DecodeImages())\n"
        "print(sum(len(b['image']) for b in ds), image_backend())\n"
        "for _ in range(2): DecodeImages()\n"
        "try:\n"
        "    DecodeImages(backend='torchvision')\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path / "tv"), os.getcwd(), os.environ.get("PYTHONPATH", "")]
        ),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    lines = [line for line in out.stderr.splitlines() if "recordkit.images" in line]
    assert lines == [
        "INFO recordkit.images: torchvision does not import (operator torchvision::nms does "
        "not exist): decoding images with Pillow"
    ]
    assert out.stdout.splitlines()[0] == f"{len(expected)} pillow"
    assert "refused: backend='torchvision'" in out.stdout
