"""recordkit in one minute: write a dataset, verify it, read it in PyTorch and TensorFlow.

Run it with ``bash scripts/demo.sh`` (sets up .venv first) or, in an environment
with recordkit installed, ``python examples/quickstart.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import recordkit as rk

SCHEMA = rk.Schema(
    image=rk.Tensor("uint8", (32, 32, 3)),
    label=rk.Int64(),
    caption=rk.Bytes(),
    embedding=rk.Float32((8,)),
)


def make_sample(i: int, rng: np.random.Generator) -> dict:
    return {
        "image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
        "label": i % 10,
        "caption": f"sample {i} of class {i % 10}",
        "embedding": rng.standard_normal(8).astype(np.float32),
    }


def write(out: str, n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    samples = [make_sample(i, rng) for i in range(n)]
    t0 = time.perf_counter()
    with rk.Writer(out, SCHEMA, shard_size="256KiB", overwrite=True) as w:
        for s in samples:
            w.write(s)
    m = w.manifest
    print(
        f"wrote   {m.records} records in {len(m.shards)} shards "
        f"({m.bytes / 2**20:.1f} MiB) to {out} in {time.perf_counter() - t0:.2f} s"
    )
    return samples


def check_verify(out: str) -> None:
    report = rk.verify(out)
    print(
        f"verify  {report.shards} shards, {report.records} records: {'OK' if report.ok else report}"
    )
    assert report.ok


def read_torch(out: str, samples: list[dict]) -> None:
    import torch

    from recordkit.torch import RecordDataset

    ds = RecordDataset(out, batch_size=64)
    seen = 0
    for batch in ds:
        images, labels = batch["image"], batch["label"]
        expected = np.stack([s["image"] for s in samples[seen : seen + len(labels)]])
        assert torch.equal(images, torch.from_numpy(expected))
        seen += len(labels)
    print(
        f"torch   read {seen} samples with recordkit.torch.RecordDataset in batches of 64: "
        f"image {tuple(images.shape[1:])} {images.dtype}, label {labels.dtype}; "
        "values equal what was written"
    )


def read_tensorflow(out: str, samples: list[dict]) -> None:
    # Before TensorFlow is imported: no C++ INFO/WARNING lines, and no oneDNN notice
    # (reading data uses no oneDNN kernels; the notice also starts absl's log).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import tensorflow as tf

    files = sorted(tf.io.gfile.glob(os.path.join(out, "*.tfrecord")))
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "caption": tf.io.FixedLenFeature([], tf.string),
        "embedding": tf.io.FixedLenFeature([8], tf.float32),
    }

    def parse(batch):
        ex = tf.io.parse_example(batch, spec)
        ex["image"] = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), [-1, 32, 32, 3])
        return ex

    ds = tf.data.TFRecordDataset(files).batch(64).map(parse).prefetch(tf.data.AUTOTUNE)
    seen = 0
    for batch in ds:
        n = int(batch["label"].shape[0])
        want = samples[seen : seen + n]
        assert np.array_equal(batch["image"].numpy(), np.stack([s["image"] for s in want]))
        assert batch["caption"].numpy()[0].decode() == want[0]["caption"]
        seen += n
    print(f"tf.data read {seen} samples with TFRecordDataset + parse_example; values equal")

    # The same pipeline, built from the manifest by recordkit.tf.dataset.
    import recordkit.tf

    seen = 0
    for batch in recordkit.tf.dataset(out, batch_size=64):
        n = int(batch["label"].shape[0])
        want = samples[seen : seen + n]
        assert np.array_equal(batch["image"].numpy(), np.stack([s["image"] for s in want]))
        seen += n
    print(f"recordkit.tf.dataset read {seen} samples; values equal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-data/quickstart", help="output directory")
    parser.add_argument("-n", type=int, default=1000, help="number of samples")
    args = parser.parse_args()
    samples = write(args.out, args.n)
    check_verify(args.out)
    read_torch(args.out, samples)
    read_tensorflow(args.out, samples)
    print(f"next    recordkit info {args.out}; recordkit head {args.out} -n 2")


if __name__ == "__main__":
    main()
