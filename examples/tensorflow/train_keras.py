"""Train a small Keras model with ``model.fit`` on a recordkit dataset (CPU, synthetic, seconds).

Writes a synthetic classification dataset with ``recordkit.Writer`` (16x16 RGB
images whose class is the brightest colour channel), then trains on it through
``recordkit.tf.dataset``: records gathered natively in the epoch plan's order,
``parse_example`` from the dataset's schema, a seeded shuffle that changes every
epoch of ``fit``. The same files are
what ``recordkit.torch.RecordDataset`` reads in ``examples/pytorch/train.py``.

    python examples/tensorflow/train_keras.py [--data DIR] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import recordkit as rk

SCHEMA = rk.Schema(
    image=rk.Tensor("uint8", (16, 16, 3)),
    label=rk.Int64(),
    caption=rk.Bytes(),
)
CLASSES = ["red", "green", "blue"]


def write_dataset(path: str, n: int) -> None:
    rng = np.random.default_rng(0)
    with rk.Writer(
        path, SCHEMA, shard_size="1MiB", overwrite=True, metadata={"classes": CLASSES}
    ) as w:
        for _ in range(n):
            label = int(rng.integers(0, 3))
            image = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
            image[..., label] += 100  # the class is the brightest channel
            w.write({"image": image, "label": label, "caption": f"a {CLASSES[label]} square"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="demo-data/keras-train")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    # Before TensorFlow is imported: no C++ INFO/WARNING lines, and no oneDNN notice
    # (reading data uses no oneDNN kernels; the notice also starts absl's log).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

    import tensorflow as tf

    import recordkit.tf

    write_dataset(args.data, args.samples)
    classes = rk.Dataset(args.data).manifest.metadata["classes"]

    def to_xy(batch):  # the element is a dict of batched tensors, one per feature
        image = tf.cast(batch["image"], tf.float32) / 255.0
        return image, batch["label"]

    # Each epoch of fit is a new pass over the dataset, and each pass reads the next
    # epoch of the plan, in its own order; EpochCallback ties those epochs to Keras'
    # epoch number, so a run BackupAndRestore resumes reads what it would have read.
    ds = recordkit.tf.dataset(
        args.data, batch_size=64, shuffle=True, seed=0, columns=["image", "label"]
    )
    train = ds.map(to_xy)
    print(f"{len(ds)} batches per epoch")  # known from the manifest

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((16, 16, 3)),
            tf.keras.layers.GlobalAveragePooling2D(),  # the mean of each channel
            tf.keras.layers.Dense(len(classes)),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.05),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    # shuffle=False: the dataset orders itself, a new order every epoch.
    history = model.fit(
        train,
        epochs=args.epochs,
        shuffle=False,
        verbose=2,
        callbacks=[recordkit.tf.EpochCallback(ds)],
    )
    for epoch, (loss, acc) in enumerate(zip(history.history["loss"], history.history["accuracy"])):
        print(f"epoch {epoch}: loss {loss:.3f}, accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
