"""Regenerate the MosaicML MDS golden datasets in ``tests/data/mds/``.

Written by the real ``mosaicml-streaming`` (0.13.0) ``MDSWriter``; the values the
tests compare against are read back by its own ``MDSReader`` and stored beside
each dataset as ``expected.json`` (strings, ints, bytes as base64, JSON values)
and ``expected.npz`` (every number and array, and every image as the pixels
the library decodes; ``allow_pickle=False``).

``mosaicml-streaming`` is not a test dependency: pip's resolution of it pulls a
CUDA torch and torchvision. Run this in a throwaway venv that has the library
without its dependencies, plus what its writer and reader import::

    python -m venv /tmp/mds
    /tmp/mds/bin/pip install --no-deps mosaicml-streaming==0.13.0
    /tmp/mds/bin/pip install numpy pillow zstd xxhash
    /tmp/mds/bin/pip install --no-deps brotli python-snappy cramjam
    # torch: the shared venv's CPU build (2.13.0), never pip's resolution:
    echo /work/main/.venv/lib/python3.11/site-packages \
        > /tmp/mds/lib/python3.11/site-packages/zz.pth
    /tmp/mds/bin/python tests/data/make_mds.py

The package ``streaming``'s ``__init__`` imports its PyTorch/torchvision/
transformers dataset classes, which MDS files have nothing to do with; the
script loads only ``streaming.base.format.mds`` (and what that imports).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import types
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

HERE = Path(__file__).parent / "mds"
VERSION = "0.13.0"


def _load_mds() -> tuple[Any, Any, Any]:
    if "streaming.base.format.mds.writer" in sys.modules:
        return _imported()
    spec = importlib.util.find_spec("streaming")
    assert spec is not None and spec.origin, "mosaicml-streaming is not installed"
    root = os.path.dirname(spec.origin)
    for name, sub in (
        ("streaming", ""),
        ("streaming.base", "base"),
        ("streaming.base.format", "base/format"),
    ):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, sub)]
        sys.modules[name] = module
    return _imported()


def _imported() -> tuple[Any, Any, Any]:
    from streaming.base.compression import decompress
    from streaming.base.format.mds.encodings import mds_encode

    _ENCODE.append(mds_encode)
    from importlib import metadata

    from streaming.base.format.mds.reader import MDSReader
    from streaming.base.format.mds.writer import MDSWriter

    assert metadata.version("mosaicml-streaming") == VERSION, metadata.version("mosaicml-streaming")
    return MDSWriter, MDSReader, decompress


_ENCODE: list[Any] = []  # the library's mds_encode, once loaded
# Image columns: the encoded bytes the writer stored, kept as written (base64).
_IMAGES = ("photo", "icon", "clips")

COLUMNS = {
    "id": "int",
    "label": "uint8",
    "count": "int64",
    "big": "uint64",
    "small": "int16",
    "score": "float32",
    "weight": "float64",
    "half": "float16",
    "text": "str",
    "blob": "bytes",
    "emb": "ndarray:float32:4",
    "tokens": "ndarray:int32",
    "mask": "ndarray:uint8",
    "grid": "ndarray",
    "photo": "jpeg",
    "icon": "png",
    "frame": "pil",
    "meta": "json",
    "num": "str_int",
    "ratio": "str_float",
    "price": "str_decimal",
    "clips": "list[jpeg]",
}


def _image(rng: np.random.Generator, h: int, w: int, mode: str) -> Image.Image:
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 255, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)


def _samples(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append(
            {
                "id": i - 3,
                "label": np.uint8(i * 37 % 256),
                "count": np.int64(-(2**62) + i),
                "big": np.uint64(2**64 - 1 - i),
                "small": np.int16(-300 * i),
                "score": np.float32(i / 3),
                "weight": np.float64(1 / (i + 7)),
                "half": np.float16(i / 8),
                "text": f"héllo {i} " * (i % 3),
                "blob": bytes(rng.integers(0, 255, i % 5, dtype=np.uint8)),
                "emb": rng.random(4, dtype=np.float32),
                "tokens": rng.integers(-1000, 1000, 1 + i % 6, dtype=np.int32),
                "mask": rng.integers(0, 2, (2 + i % 2, 3), dtype=np.uint8),
                "grid": rng.integers(-5, 5, (1 + i % 3, 2, 2), dtype=np.int16),
                "photo": _image(rng, 8, 6 + i % 3, "RGB"),
                "icon": _image(rng, 4, 4, "RGBA"),
                "frame": _image(rng, 3 + i % 2, 5, "RGB"),
                "meta": {"i": i, "tags": ["a"] * (i % 3), "nested": {"x": i / 2}},
                "num": 10**20 + i,
                "ratio": i / 9,
                "price": Decimal(f"{i}.{i:02d}"),
                "clips": [_image(rng, 4, 4, "RGB") for _ in range(1 + i % 2)],
            }
        )
    return out


def _expected(reader: Any, n: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    rows: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {}
    for i in range(n):
        sample = reader.get_item(i)
        row: dict[str, Any] = {}
        for name, value in sample.items():
            key = f"{i}/{name}"
            if isinstance(value, Image.Image):
                arrays[key] = np.asarray(value)
            elif isinstance(value, list) and value and isinstance(value[0], Image.Image):
                for k, img in enumerate(value):
                    arrays[f"{key}/{k}"] = np.asarray(img)
                row[name] = {"images": len(value)}
            elif isinstance(value, (np.ndarray, np.generic)):
                arrays[key] = np.asarray(value)
            elif isinstance(value, bytes):
                row[name] = {"b64": base64.b64encode(value).decode()}
            elif isinstance(value, Decimal):
                row[name] = {"decimal": str(value)}
            elif isinstance(value, (float, int)) and not isinstance(value, bool):
                row[name] = {"python": type(value).__name__, "repr": repr(value)}
            else:  # str, and JSON values
                row[name] = {"value": value}
        rows.append(row)
    return rows, arrays


def make(name: str, n: int, seed: int, **writer: Any) -> None:
    MDSWriter, MDSReader, decompress = _load_mds()
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    samples = _samples(n, seed)
    written = [
        {
            c: base64.b64encode(_ENCODE[0](COLUMNS[c], s[c])).decode()
            if c != "clips"
            else [base64.b64encode(_ENCODE[0]("jpeg", img)).decode() for img in s[c]]
            for c in _IMAGES
        }
        for s in samples
    ]
    with MDSWriter(out=str(out), columns=COLUMNS, **writer) as w:
        for sample in samples:
            w.write(sample)
    index = json.loads((out / "index.json").read_text())
    # Read back with the library's own reader, from a decompressed copy.
    with tempfile.TemporaryDirectory() as tmp:
        rows: list[dict[str, Any]] = []
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for shard in index["shards"]:
            raw, zipped = shard["raw_data"], shard["zip_data"]
            if zipped is not None:
                data = (out / zipped["basename"]).read_bytes()
                algo = shard["compression"]
                Path(tmp, raw["basename"]).write_bytes(decompress(algo, data))
            else:
                shutil.copy(out / raw["basename"], Path(tmp, raw["basename"]))
            reader = MDSReader.from_json(tmp, None, shard)
            part_rows, part_arrays = _expected(reader, shard["samples"])
            rows += part_rows
            for key, value in part_arrays.items():
                i, _, rest = key.partition("/")
                arrays[f"{int(i) + offset}/{rest}"] = value
            offset += shard["samples"]
    for row, images in zip(rows, written):
        row["written"] = images
    (out / "expected.json").write_text(
        json.dumps({"library": f"mosaicml-streaming {VERSION}", "samples": rows}, indent=1)
    )
    np.savez(out / "expected.npz", **arrays)
    print(f"{out}: {offset} samples in {len(index['shards'])} shard(s)")


def main() -> None:
    make("plain", 7, seed=1)
    make("zstd", 13, seed=2, compression="zstd:7", size_limit=8000, hashes=["sha1", "xxh64"])


if __name__ == "__main__":
    main()
