"""Keras ``model.fit`` over ``recordkit.tf.dataset``, as every Keras user writes it.

Keras makes a new iterator of the dataset every epoch (and one more at each epoch's
end, which it drops unread): each pass reads the next epoch of the plan. With
``recordkit.tf.EpochCallback`` the order also follows Keras' epoch number, so a run
that ``BackupAndRestore`` resumes reads what the uninterrupted run read.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from ._streams import run

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.tf, pytest.mark.frameworks, pytest.mark.slow]

RECORDS, EPOCHS = 2000, 3  # 63 batches of 32 an epoch, the last one of 16

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    import recordkit as rk
    import recordkit.tf

    data, mode, backup, out = sys.argv[1:5]
    if not os.path.exists(data):
        with rk.Writer(data, rk.Schema(label=rk.Int64(), x=rk.Float32((2,))), max_records=250) as w:
            for i in range(2000):
                w.write({"label": i, "x": [i / 2000, 1.0]})

    class Recording(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1)
            self.steps = []

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, labels = data
            self.steps.append(labels.numpy().tolist())
            return super().train_step((x, tf.cast(labels, tf.float32) / 2000))

    class Crash(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                raise KeyboardInterrupt  # preempted after epoch 0's backup

    ds = recordkit.tf.dataset(data, batch_size=32, shuffle=True, seed=0)
    train = ds.map(lambda b: (b["x"], b["label"]))
    tf.keras.utils.set_random_seed(0)
    model = Recording()
    model(tf.zeros((1, 2)))  # built before fit: BackupAndRestore needs its weights
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    callbacks = []
    if mode != "plain":
        callbacks.append(recordkit.tf.EpochCallback(ds))
    if mode in ("crash", "resume"):
        callbacks.append(tf.keras.callbacks.BackupAndRestore(backup))
    if mode == "crash":
        callbacks.append(Crash())
    try:
        model.fit(train, epochs=3, verbose=0, callbacks=callbacks)
    except KeyboardInterrupt:
        pass
    with open(out, "w") as f:
        json.dump(model.steps, f)
    """
)


def _fit(tmp, mode, name):
    script = tmp / "fit.py"
    script.write_text(_SCRIPT)
    out = tmp / f"{name}.json"
    run([sys.executable, str(script), str(tmp / "data"), mode, str(tmp / "backup"), str(out)])
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keras")
    return tmp, _fit(tmp, "plain", "plain")


def _epochs(steps):
    flat = [i for s in steps for i in s]
    return [flat[e * RECORDS : (e + 1) * RECORDS] for e in range(len(flat) // RECORDS)]


def test_fit_reads_every_record_once_per_epoch_in_a_new_order(plain):
    _, steps = plain
    assert len(steps) == EPOCHS * 63
    epochs = _epochs(steps)
    assert all(sorted(e) == list(range(RECORDS)) for e in epochs)
    differ = sum(a != b for a, b in zip(epochs[0], epochs[1]))
    assert differ > RECORDS * 0.9, f"{differ} of {RECORDS} positions differ"


def test_backup_and_restore_resumes_the_same_stream_with_the_epoch_callback(plain):
    tmp, steps = plain
    assert _fit(tmp, "callback", "callback") == steps  # it numbers epochs as Keras does
    first = _fit(tmp, "crash", "first")
    assert len(first) == 63
    rest = _fit(tmp, "resume", "rest")  # BackupAndRestore: fit starts at epoch 1
    assert first + rest == steps


_RAGGED = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import recordkit as rk
    import recordkit.tf

    data, out = sys.argv[1:3]
    schema = rk.Schema(label=rk.Int64(), tokens=rk.Int64((None,)), boxes=rk.Float32((None, 4)))
    with rk.Writer(data, schema, max_records=100) as w:
        for i in range(500):
            boxes = np.tile([[i, 0, 0, 1]], (i % 3, 1))
            w.write({"label": i, "tokens": [i] * (i % 4), "boxes": boxes})

    class Recording(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1)
            self.steps = []

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, labels = data
            self.steps.append([labels.numpy().tolist(), x.numpy().tolist()])
            return super().train_step((x, tf.cast(labels, tf.float32)))

    def features(b):  # ragged in, dense out: what a model's first layer does with them
        tokens = tf.cast(tf.reduce_sum(b["tokens"], axis=1), tf.float32)
        boxes = tf.reduce_sum(b["boxes"][:, :, 0], axis=1)
        return tf.stack([tokens, boxes], axis=1), b["label"]

    ds = recordkit.tf.dataset(data, batch_size=32, shuffle=True, seed=0)
    model = Recording()
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    model.fit(ds.map(features), epochs=2, verbose=0)
    with open(out, "w") as f:
        json.dump(model.steps, f)
    """
)


def test_fit_over_ragged_features_read_natively(tmp_path):
    """Ragged numbers on recordkit.tf's native path (RaggedTensor batches cut from each
    task) through Keras fit: every record once an epoch, each with its own values."""
    script = tmp_path / "ragged.py"
    script.write_text(_RAGGED)
    out = tmp_path / "steps.json"
    run([sys.executable, str(script), str(tmp_path / "data"), str(out)])
    steps = json.loads(out.read_text())
    assert len(steps) == 2 * 16  # 500 records in batches of 32
    epochs = [[i for labels, _ in steps[e * 16 : (e + 1) * 16] for i in labels] for e in (0, 1)]
    assert all(sorted(e) == list(range(500)) for e in epochs) and epochs[0] != epochs[1]
    for labels, x in steps:
        for i, (tokens, boxes) in zip(labels, x):
            assert tokens == i * (i % 4) and boxes == i * (i % 3)
