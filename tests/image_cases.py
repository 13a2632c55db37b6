"""Image files and imagefolder datasets for the image-decoding tests (PyTorch and TensorFlow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

import recordkit as rk

BAD = {"dog/cut.png": "image file is truncated", "dog/text.jpg": "cannot identify image file"}


def write_images(root: Path) -> dict[str, np.ndarray]:
    """Images of several formats and modes, and (by path) what each decodes to in RGB."""
    rng = np.random.default_rng(0)
    expected = {}
    for c, cls in enumerate(("cat", "dog", "eel")):
        (root / cls).mkdir(parents=True)
        for i in range(7):
            h, w = 16 + 3 * i, 20 + c
            pixels = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
            kind = (i + c) % 4
            if kind == 0:
                img, name = Image.fromarray(pixels[:, :, :3]), f"{i}.jpg"
            elif kind == 1:
                img, name = Image.fromarray(pixels[:, :, 0], mode="L"), f"{i}.png"
            elif kind == 2:
                img, name = Image.fromarray(pixels, mode="RGBA"), f"{i}.png"
            else:
                img, name = Image.fromarray(pixels[:, :, :3]).convert("P"), f"{i}.gif"
            img.save(root / cls / name)
            with Image.open(root / cls / name) as back:
                expected[f"{cls}/{name}"] = np.asarray(back.convert("RGB"))
    return expected


def make_images(root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """An imagefolder dataset of :func:`write_images`: ``(dataset, expected by path)``."""
    expected = write_images(root / "src")
    rk.convert(root / "src", root / "ds", format="imagefolder", workers=0, shard_size=4096)
    return root / "ds", expected


def make_broken(root: Path) -> Path:
    """A dataset with a truncated PNG and a text file stored as an image (check="none")."""
    write_images(root / "src")
    good = (root / "src" / "dog" / "1.png").read_bytes()
    (root / "src" / "dog" / "cut.png").write_bytes(good[: len(good) // 2])
    (root / "src" / "dog" / "text.jpg").write_bytes(b"this is not an image\n")
    rk.convert(
        root / "src",
        root / "ds",
        format="imagefolder",
        workers=0,
        shard_size=4096,
        source_options={"check": "none", "order": "sorted"},
    )
    return root / "ds"


def where(ds_path: Path, key: str) -> tuple[str, int, int]:
    """``(shard path, offset, record)`` of the sample whose ``path`` is ``key``."""
    manifest = json.loads((ds_path / "recordkit.json").read_text())
    ds = rk.Dataset(ds_path)
    first = 0
    for shard in manifest["shards"]:
        for rec in range(shard["records"]):
            if bytes(ds[first + rec]["path"]).decode() == key:
                idx = (ds_path / (shard["path"] + ".idx")).read_text().split("\n")
                return str(ds_path / shard["path"]), int(idx[rec].split()[0]), rec
        first += shard["records"]
    raise AssertionError(key)
