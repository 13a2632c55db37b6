"""Convert NumPy arrays into a recordkit dataset, kill-safe and resumable, then read it back.

Writes synthetic ``.npz`` files (images and labels), converts them with two writer
processes and zstd-compressed image tensors, verifies the result, and shows that a
second run with the same arguments has nothing left to do.

    python examples/convert/convert_numpy.py --out /tmp/convert-demo
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import recordkit as rk


def make_source(root: str, files: int, rows: int) -> None:
    """Synthetic arrays: ``image`` (rows, 28, 28) uint8 and ``label`` (rows,) int64 per file."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        image = (rng.random((rows, 28, 28)) > 0.8).astype(np.uint8) * 255
        label = rng.integers(0, 10, rows)
        np.savez(os.path.join(root, f"part{i}.npz"), image=image, label=label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a scratch directory")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rows", type=int, default=500)
    args = ap.parse_args()
    src, dst = os.path.join(args.out, "arrays"), os.path.join(args.out, "dataset")
    make_source(src, args.files, args.rows)

    result = rk.convert(
        src, dst, format="numpy", compress="zstd", workers=2, shard_size="256KiB", overwrite=True
    )
    print(result.summary())
    report = rk.verify(dst)
    print(f"verify  {report}")

    with rk.Dataset(dst) as ds:
        first = ds[0]
        print(f"schema  {ds.schema}")
        image = first["image"]
        print(f"sample  image {image.shape} {image.dtype}, label {first['label']}")
        with np.load(os.path.join(src, "part0.npz")) as original:
            assert np.array_equal(image, original["image"][0])

    again = rk.convert(src, dst, format="numpy", compress="zstd", workers=2, shard_size="256KiB")
    print(f"rerun   {again.resumed} of {again.partitions} partitions already done")


if __name__ == "__main__":
    main()
