"""Decoding JPEGs while reading: images/s with the decode on the training thread or off it.

A dataset of ``--images`` JPEGs (``--size`` pixels a side, smooth content with some
noise, quality 90: about the bytes per pixel of photographs) converted with
``recordkit convert --from imagefolder``, read in batches of 64 and decoded to
``uint8`` tensors by ``recordkit.torch.DecodeImages`` (Pillow here: torchvision
does not import beside this torch build):

- ``inline``: ``transform=DecodeImages()`` in the consuming (training) thread;
- ``threads=N``: the same transform on ``transform_threads=N`` threads, ahead of it;
- ``workers=2``: ``DataLoader`` with 2 worker processes (one reader thread each);
- ``tf``: ``recordkit.tf.dataset(options=ReadOptions(decode_images="image"))``
  (``tf.io.decode_image``), and ``tf-bare``: a hand-written ``TFRecordDataset`` +
  ``parse_single_example`` + ``tf.io.decode_image`` pipeline of the same features,
  without recordkit's guard that names a failing record (what that costs).

Each mode runs in a fresh interpreter, ``--repeat`` times (median; the modes
interleaved, so that a busy spell on a shared machine hits them all): once unloaded,
and once with a simulated training step per batch that waits ``--step-ms`` on an
"accelerator" (``time.sleep``: the GIL is released, as while a GPU computes),
which is where decoding on the training thread costs its full time.

Run: ``python benchmarks/image_bench.py [--images 2048] [--size 256] [--step-ms 60]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, run_child

from recordkit.reader import ReadOptions

BATCH = 64


def _make(root: Path, images: int, size: int) -> Path:
    from PIL import Image

    import recordkit as rk

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size] / size
    for i in range(images):
        cls = root / "src" / f"c{i % 10}"
        cls.mkdir(parents=True, exist_ok=True)
        a, b, c = rng.uniform(0.5, 6, 3)
        base = np.stack([np.sin(a * x + b * y), np.cos(b * x * y * c), np.sin(c * y)], -1)
        pixels = (127 + 100 * base + rng.normal(0, 12, base.shape)).clip(0, 255)
        buf = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(buf, format="JPEG", quality=90)
        (cls / f"{i:05d}.jpg").write_bytes(buf.getvalue())
    rk.convert(root / "src", root / "ds", format="imagefolder", workers=0)
    return root / "ds"


def _torch_loader(path: str, mode: str):  # type: ignore[no-untyped-def]
    from recordkit.torch import DataLoader, DecodeImages, RecordDataset

    if mode == "inline":
        return RecordDataset(path, batch_size=BATCH, transform=DecodeImages())
    if mode.startswith("threads="):
        threads = int(mode.split("=")[1])
        return RecordDataset(
            path,
            batch_size=BATCH,
            transform=DecodeImages(),
            options=ReadOptions(transform_threads=threads),
        )
    if mode == "workers=2":
        ds = RecordDataset(
            path, batch_size=BATCH, transform=DecodeImages(), options=ReadOptions(num_threads=1)
        )
        return DataLoader(ds, num_workers=2)
    raise ValueError(mode)


def _tf_loader(path: str, mode: str):  # type: ignore[no-untyped-def]
    import tensorflow as tf

    import recordkit.tf as rtf

    if mode == "tf":
        return rtf.dataset(path, batch_size=BATCH, options=ReadOptions(decode_images="image"))
    files = sorted(str(p) for p in Path(path).glob("*.tfrecord"))
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "path": tf.io.FixedLenFeature([], tf.string),
    }

    def parse(s):  # type: ignore[no-untyped-def]
        el = tf.io.parse_single_example(s, spec)
        el["image"] = tf.io.decode_image(el["image"], channels=3, expand_animations=False)
        return el

    ds = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.ragged_batch(BATCH).prefetch(tf.data.AUTOTUNE)


def _count(batch) -> int:  # type: ignore[no-untyped-def]
    images = batch["image"] if isinstance(batch, dict) else batch
    return int(images.nrows()) if hasattr(images, "nrows") else len(images)


def _child(path: str, mode: str, step_ms: float) -> None:
    loader = _tf_loader(path, mode) if mode.startswith("tf") else _torch_loader(path, mode)
    for _ in loader:  # a warm-up pass: imports, maps, threads, TensorFlow's tracing
        pass
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += _count(batch)
        if step_ms:
            time.sleep(step_ms / 1000)  # the accelerator's step: GIL released
    seconds = time.perf_counter() - t0
    print(json.dumps({"images": n, "seconds": seconds, "per_s": n / seconds}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--step-ms", type=float, default=60.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--modes", default="inline,threads=1,threads=2,workers=2,tf,tf-bare")
    p.add_argument("--dir", default=None)
    p.add_argument("--child", nargs=3, metavar=("PATH", "MODE", "STEP_MS"))
    args = p.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], float(args.child[2]))
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ds = _make(Path(tmp), args.images, args.size)
        jpeg = sum(p.stat().st_size for p in (Path(tmp) / "src").rglob("*.jpg")) / args.images
        print(
            f"{args.images} JPEGs of {args.size}x{args.size}, {jpeg / 1024:.1f} KiB each; "
            f"batches of {BATCH}; {os.cpu_count()} CPUs; {platform.python_version()}"
        )
        runs: dict[tuple[str, float], list[float]] = {}
        for _ in range(args.repeat):  # modes interleaved: a busy spell hits them all alike
            for step in (0.0, args.step_ms):
                for mode in args.modes.split(","):
                    out = run_child(__file__, ["--child", str(ds), mode, str(step)])
                    runs.setdefault((mode, step), []).append(out["per_s"])
        rows = {key: median(values) for key, values in runs.items()}
        base = {step: rows[("inline", step)] for step in (0.0, args.step_ms)}
        print(
            f"\n| mode | images/s, no step | vs inline | images/s, {args.step_ms:g} ms step "
            "| vs inline |"
        )
        print("|---|---|---|---|---|")
        for mode in args.modes.split(","):
            free, loaded = rows[(mode, 0.0)], rows[(mode, args.step_ms)]
            print(
                f"| {mode} | {free:.0f} | {free / base[0.0]:.2f}x | {loaded:.0f} "
                f"| {loaded / base[args.step_ms]:.2f}x |"
            )
        floor = BATCH / (args.step_ms / 1000)
        print(f"\n(a {args.step_ms:g} ms step alone allows at most {floor:.0f} images/s)")


if __name__ == "__main__":
    main()
