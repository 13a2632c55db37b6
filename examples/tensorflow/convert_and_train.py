"""From a JSON Lines file to a trained Keras model (CPU, synthetic data, seconds).

1. Writes ``rows/part-0.jsonl``: one JSON object per line, ``{"id": 7,
   "features": [8 floats], "label": 0|1, "note": "..."}``, as an export from a
   database or a log pipeline would look.
2. Converts it with ``recordkit.convert(..., format="jsonl")``; the schema is
   inferred (``id`` and ``label`` int64, ``features`` float32[8], ``note`` bytes).
3. Trains a Keras model with ``model.fit`` on ``recordkit.tf.dataset``:
   TensorFlow's own TFRecord reader and ``parse_example``, no Python per record.

    python examples/tensorflow/convert_and_train.py [--workdir DIR] [--epochs 5]

Needs TensorFlow (from a checkout: ``pip install -e '.[tf-cpu]'``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

import recordkit as rk


def write_jsonl(path: Path, n: int) -> None:
    """Rows whose label is whether the features' weighted sum is positive."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            x = rng.normal(size=8).round(4)
            row = {
                "id": i,
                "features": x.tolist(),
                "label": int(x @ weights > 0),
                "note": f"row {i}",
            }
            f.write(json.dumps(row) + "\n")


def main() -> None:
    """Write rows, convert them, train on the result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("demo-data/jsonl-to-keras"))
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    # Before TensorFlow is imported: no C++ INFO/WARNING lines, and no oneDNN notice
    # (reading data uses no oneDNN kernels; the notice also starts absl's log).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

    rows, data = args.workdir / "rows" / "part-0.jsonl", args.workdir / "train"
    write_jsonl(rows, args.rows)
    result = rk.convert(rows.parent, data, format="jsonl", shard_size="64KiB", overwrite=True)
    print(result.summary())
    print(rk.Dataset(data).schema)

    import tensorflow as tf

    import recordkit.tf

    train = recordkit.tf.dataset(
        data, batch_size=64, shuffle=True, seed=0, columns=["features", "label"]
    ).map(lambda b: (b["features"], b["label"]))
    print(f"{len(train)} batches per epoch")

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.05),
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[tf.keras.metrics.BinaryAccuracy(threshold=0.0)],
    )
    # shuffle=False: each epoch of fit is a new pass over the dataset, which reads the
    # next epoch of its order (a new order every epoch).
    history = model.fit(train, epochs=args.epochs, shuffle=False, verbose=2)
    print(f"final accuracy {history.history['binary_accuracy'][-1]:.3f}")


if __name__ == "__main__":
    main()
