"""``ReadOptions(bytes_as="padded")`` in ``recordkit.tf``: ``Bytes()`` values as zero-padded
``uint8`` rows (the batch's longest) and ``name/lengths``, the torch reader's layout, the
same on every path (native, the plan's ``parse_example``, ``TFRecordDataset``, record by
record); ``"list"`` and the default stay ``tf.string``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit import Bytes, Int64, Schema
from recordkit.reader.options import ReadOptions

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")
tfnative = pytest.importorskip("recordkit.tf.native")

pytestmark = pytest.mark.tf

PADDED = ReadOptions(bytes_as="padded")
RECORDS = 203


def _value(k: int) -> bytes:
    """Record k's bytes: empty, with trailing NULs, short, or long."""
    if k % 11 == 0:
        return b""
    if k % 7 == 0:
        return bytes([k % 256]) * (5000 + k)
    return bytes(range(1, 1 + k % 13)) + b"\x00" * (k % 3)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bytes_as") / "d"
    with rk.Writer(root, Schema(i=Int64(), b=Bytes()), max_records=37) as w:
        for k in range(RECORDS):
            w.write({"i": k, "b": _value(k)})
    return root


@pytest.fixture(scope="module")
def ragged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ragged feature beside: the record-by-record ``parse_example`` path."""
    root = tmp_path_factory.mktemp("bytes_as") / "r"
    with rk.Writer(root, Schema(i=Int64(), b=Bytes(), r=Int64((None,))), max_records=37) as w:
        for k in range(RECORDS):
            w.write({"i": k, "b": _value(k), "r": list(range(k % 4))})
    return root


def _values(ds: object, batched: bool) -> dict[int, bytes]:
    """Each record's value from padded rows, checking the layout on the way: ``uint8``
    rows exactly as wide as the batch's longest value, zeros past each length."""
    got: dict[int, bytes] = {}
    for el in ds:  # type: ignore[attr-defined]
        rows, lengths, ids = el["b"].numpy(), el["b/lengths"].numpy(), el["i"].numpy()
        assert rows.dtype == np.uint8 and lengths.dtype == np.int64
        if not batched:
            assert rows.shape == (lengths,)
            got[int(ids)] = rows.tobytes()
            continue
        assert rows.shape == (len(ids), int(lengths.max()))
        for i, row, n in zip(ids, rows, lengths):
            assert not row[n:].any()
            got[int(i)] = row[:n].tobytes()
    return got


WANT = {k: _value(k) for k in range(RECORDS)}


@pytest.mark.parametrize(
    "kw",
    [
        {"batch_size": 16},
        {"batch_size": 16, "shuffle": True},
        {"batch_size": 64, "shuffle": True},
        {"batch_size": None},
        {"batch_size": None, "shuffle": True},
        {"batch_size": 16, "options": dataclasses.replace(PADDED, num_threads=2)},
    ],
    ids=[
        "native",
        "native-shuffled",
        "native-shuffled-64",
        "records",
        "records-shuffled",
        "tfrecord",
    ],
)
@pytest.mark.parametrize("native", [True, False], ids=["tf-native", "parse"])
def test_every_path_gives_padded_rows_and_lengths(
    data: Path, monkeypatch: pytest.MonkeyPatch, kw: dict[str, object], native: bool
) -> None:
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1" if native else "0")
    kw = {"options": PADDED, "seed": 5, **kw}
    ds = rtf.dataset(data, **kw)  # type: ignore[arg-type]
    assert ds.element_spec["b"].dtype == tf.uint8
    assert _values(ds, kw["batch_size"] is not None) == WANT


def test_the_native_path_reads_them_in_c(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several shards per shuffled task: the runner's parts joined into one padded array."""
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")
    made: list[object] = []
    init = tfnative.NativeTasks.__init__

    def recorded(self, *args, **kw):  # type: ignore[no-untyped-def]
        init(self, *args, **kw)
        made.append(self)

    monkeypatch.setattr(tfnative.NativeTasks, "__init__", recorded)
    ds = rtf.dataset(data, batch_size=64, shuffle=True, seed=1, options=PADDED)
    assert _values(ds, True) == WANT
    assert len(made) == 1 and made[0].padded and made[0].op is None  # type: ignore[attr-defined]


def test_record_by_record_path(ragged: Path) -> None:
    ds = rtf.dataset(ragged, batch_size=16, shuffle=True, seed=2, options=PADDED)
    assert isinstance(ds.element_spec["r"], tf.RaggedTensorSpec)
    assert _values(ds, True) == WANT


def test_the_order_and_values_match_the_strings(data: Path) -> None:
    """Padded and ``tf.string`` read the same records in the same order."""
    strings = [
        (b["i"].numpy().tolist(), b["b"].numpy().tolist())
        for b in rtf.dataset(data, batch_size=16, shuffle=True, seed=9)
    ]
    padded = [
        (
            b["i"].numpy().tolist(),
            [r[:n].tobytes() for r, n in zip(b["b"].numpy(), b["b/lengths"].numpy())],
        )
        for b in rtf.dataset(data, batch_size=16, shuffle=True, seed=9, options=PADDED)
    ]
    assert padded == strings


def test_the_default_and_list_stay_strings(data: Path) -> None:
    for options in (None, ReadOptions(bytes_as="list")):
        spec = rtf.dataset(data, batch_size=8, options=options).element_spec
        assert spec["b"] == tf.TensorSpec([None], tf.string) and "b/lengths" not in spec


def test_a_batch_of_empty_values_has_rows_of_width_zero(tmp_path: Path) -> None:
    with rk.Writer(tmp_path / "e", Schema(i=Int64(), b=Bytes())) as w:
        for k in range(5):
            w.write({"i": k, "b": b""})
    for kw in ({}, {"shuffle": True}, {"options": dataclasses.replace(PADDED, num_threads=1)}):
        kw = {"options": PADDED, **kw}
        (batch,) = list(rtf.dataset(tmp_path / "e", batch_size=8, **kw))  # type: ignore[arg-type]
        assert batch["b"].shape == (5, 0) and batch["b/lengths"].numpy().tolist() == [0] * 5


def test_a_lengths_feature_of_that_name_is_refused(tmp_path: Path) -> None:
    with rk.Writer(tmp_path / "c", Schema(b=Bytes(), **{"b/lengths": Int64()})) as w:
        w.write({"b": b"x", "b/lengths": 1})
    with pytest.raises(ValueError, match=r"b/lengths.*bytes_as='list'"):
        rtf.dataset(tmp_path / "c", batch_size=2, options=PADDED)


def test_checkpoint_resumes_padded(data: Path, tmp_path: Path) -> None:
    def build():  # type: ignore[no-untyped-def]
        return rtf.dataset(data, batch_size=16, shuffle=True, seed=4, epochs=2, options=PADDED)

    def rows(it):  # type: ignore[no-untyped-def]
        return [(b["i"].numpy().tolist(), b["b"].numpy().tobytes()) for b in it]

    it = iter(build())
    ckpt = tf.train.Checkpoint(iterator=it)
    for _ in range(17):  # 13 batches an epoch: inside the second
        next(it)
    saved = ckpt.write(str(tmp_path / "ckpt"))
    want = rows(it)
    again = iter(build())
    tf.train.Checkpoint(iterator=again).read(saved).assert_consumed()
    assert rows(again) == want and len(want) == 9


def test_bytes_as_is_checked() -> None:
    with pytest.raises(ValueError, match="bytes_as must be 'padded', 'list' or None"):
        ReadOptions(bytes_as="string")  # type: ignore[arg-type]


def test_keras_fit_reads_every_record_once_per_epoch_in_a_new_order(tmp_path: Path) -> None:
    """Keras ``fit`` over padded rows: each epoch every record once, a new order each."""
    with rk.Writer(tmp_path / "k", Schema(i=Int64(), b=Bytes())) as w:
        for k in range(96):
            w.write({"i": k, "b": bytes([k % 256]) * 8})
    ds = rtf.dataset(tmp_path / "k", batch_size=16, shuffle=True, seed=3, options=PADDED)
    seen: list[list[int]] = []

    def note(ids: np.ndarray) -> np.ndarray:
        seen[-1].extend(ids.tolist())
        return ids

    def to_xy(b):  # type: ignore[no-untyped-def]
        ids = tf.numpy_function(note, [b["i"]], tf.int64, stateful=True)
        with tf.control_dependencies([ids]):
            x = tf.cast(b["b"], tf.float32) / 255.0
        return tf.ensure_shape(x, [None, 8]), tf.cast(b["b/lengths"], tf.float32)

    class Epochs(tf.keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            seen.append([])

    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(
        ds.map(to_xy),
        epochs=3,
        verbose=0,
        shuffle=False,
        callbacks=[Epochs(), rtf.EpochCallback(ds)],
    )
    assert len(seen) == 3
    for ids in seen:
        assert sorted(ids) == list(range(96))
    assert seen[0] != seen[1] != seen[2]
