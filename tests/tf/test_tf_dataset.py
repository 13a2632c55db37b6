"""recordkit.tf: the tf.data pipeline reads what the Writer wrote, as RecordDataset does."""

from __future__ import annotations

import numpy as np
import pytest

import recordkit as rk
from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit.reader import ReadOptions
from recordkit.reader.plan import EpochPlan, PlanOptions
from recordkit.reader.shards import open_shards

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf

SCHEMA = Schema(
    id=Int64(),
    b=Bytes(),
    bl=Bytes((None,)),
    b2=Bytes((2,)),
    iv=Int64((3,)),
    ivar=Int64((None, 2)),
    f=Float32((2, 2)),
    fvar=Float32((None,)),
    t=Tensor("uint16", (2, 3)),
    tz=Tensor("float64", (4,), compression="zstd"),
    t1=Tensor("int32", (2, None)),
    t2=Tensor("uint8", (None, None)),
    t2z=Tensor("float32", (None, None), compression="zstd"),
    tb=Tensor("bool", (3,)),
    th=Tensor("float16", (2,)),
)


def _sample(k: int) -> dict:
    rng = np.random.default_rng(k)
    return {
        "id": k,
        "b": rng.bytes(k % 7),
        "bl": [rng.bytes(j + 1) for j in range(k % 4)],
        "b2": [b"a" * (k % 3), b"bc"],
        "iv": [k, -k, 2**40 + k],
        "ivar": rng.integers(-(2**62), 2**62, size=(k % 3, 2)),
        "f": rng.standard_normal((2, 2)).astype(np.float32),
        "fvar": rng.standard_normal(k % 5).astype(np.float32),
        "t": rng.integers(0, 2**16, size=(2, 3), dtype=np.uint16),
        "tz": rng.standard_normal(4),
        "t1": rng.integers(-(2**31), 2**31, size=(2, k % 3), dtype=np.int32),
        "t2": rng.integers(0, 256, size=(k % 2 + 1, k % 3), dtype=np.uint8),
        "t2z": rng.standard_normal((k % 3, 2)).astype(np.float32),
        "tb": rng.integers(0, 2, size=3).astype(bool),
        "th": rng.standard_normal(2).astype(np.float16),
    }


N = 37


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfds") / "d"
    samples = [_sample(k) for k in range(N)]
    with rk.Writer(root, SCHEMA, max_records=5) as w:
        for s in samples:
            w.write(s)
    return root, samples


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """Fixed shapes only (the vectorised batch path): 10 shards of 13 records."""
    root = tmp_path_factory.mktemp("tffixed") / "d"
    schema = Schema(id=Int64(), x=Tensor("float32", (3,)), v=Float32((2,)), s=Bytes())
    with rk.Writer(root, schema, max_records=13) as w:
        for k in range(130):
            w.write({"id": k, "x": np.full(3, k, np.float32), "v": [k, -k], "s": str(k)})
    return root


def _norm(name: str, value) -> object:
    """A comparable form: bytes lists for Bytes, numpy arrays for numbers."""
    ftype = SCHEMA[name]
    if isinstance(ftype, Bytes):
        if isinstance(value, (tf.Tensor, tf.RaggedTensor)):
            value = value.numpy()
        if not ftype.shape:
            return bytes(value)
        return [bytes(v) for v in value]
    if isinstance(value, tf.RaggedTensor):
        value = value.to_list()
    elif hasattr(value, "numpy"):
        value = value.numpy()
    dtype = np.int64 if isinstance(ftype, Int64) else np.float32
    if isinstance(ftype, Tensor):
        dtype = ftype.dtype
    arr = np.asarray(value, dtype=dtype)
    shape = tuple(arr.shape)
    return (shape, arr.tobytes())


def _expected(sample: dict) -> dict:
    out = {}
    for name, ftype in SCHEMA.features.items():
        value = sample[name]
        if isinstance(ftype, Bytes):
            out[name] = _norm(name, value)
            continue
        dtype = {Int64: np.int64, Float32: np.float32}.get(type(ftype))
        arr = np.asarray(value, dtype=dtype or ftype.dtype)
        if isinstance(ftype, (Int64, Float32)) and not ftype.shape:
            arr = arr.reshape(())
        out[name] = (tuple(arr.shape), arr.tobytes())
    return out


def test_records_equal_what_the_writer_wrote(written):
    root, samples = written
    ds = rtf.dataset(root, options=ReadOptions(num_threads=1))  # dataset order
    got = [{n: _norm(n, v) for n, v in rec.items()} for rec in ds]
    assert [g["id"] for g in got] == [_expected(s)["id"] for s in samples]
    for g, s in zip(got, samples):
        assert g == _expected(s)


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_batches_equal_records(written, batch_size):
    root, samples = written
    rows = []
    for batch in rtf.dataset(root, batch_size=batch_size, options=ReadOptions(num_threads=1)):
        n = int(batch["id"].shape[0])
        assert n <= batch_size
        for i in range(n):
            rows.append({name: _norm(name, value[i]) for name, value in batch.items()})
    assert [_empty_as_one(r) for r in rows] == [_empty_as_one(_expected(s)) for s in samples]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_every_feature_type_through_the_plan(written, batch_size):
    """Ragged, zstd, bool and float16 features read the same through the epoch plan."""
    root, samples = written
    ds = rtf.dataset(root, batch_size=batch_size, shuffle=True, seed=2)
    rows = []
    for batch in ds:
        if batch_size is None:
            rows.append({n: _norm(n, v) for n, v in batch.items()})
            continue
        for i in range(int(batch["id"].shape[0])):
            rows.append({n: _norm(n, v[i]) for n, v in batch.items()})
    ids = [int(np.frombuffer(r["id"][1], np.int64)[0]) for r in rows]
    assert sorted(ids) == list(range(N)) and ids != list(range(N))
    for k, row in zip(ids, rows):
        assert _empty_as_one(row) == _empty_as_one(_expected(samples[k]))


def _empty_as_one(row: dict) -> dict:
    """A ragged row with no elements cannot carry the sizes of its inner dims
    (a (0, 2) record reads back as shape (0,)): compare empty values as equal."""
    return {n: "empty" if isinstance(v, tuple) and 0 in v[0] else v for n, v in row.items()}


def test_ragged_and_dense_batch_types(written):
    root, _ = written
    spec = rtf.dataset(root, batch_size=4).element_spec
    assert isinstance(spec["t"], tf.TensorSpec) and spec["t"].shape.as_list() == [None, 2, 3]
    assert isinstance(spec["bl"], tf.RaggedTensorSpec)
    assert isinstance(spec["t1"], tf.RaggedTensorSpec)
    assert spec["t1"].shape.as_list() == [None, 2, None]  # the fixed dim stays uniform
    assert spec["ivar"].shape.as_list() == [None, None, 2]
    assert spec["th"].dtype == tf.float16 and spec["tb"].dtype == tf.bool


@pytest.mark.torch
def test_same_records_and_values_as_the_torch_reader(written):
    torch_mod = pytest.importorskip("recordkit.torch")
    root, _ = written

    def norm_torch(name, value):
        if hasattr(value, "numpy"):
            value = value.numpy()
        return _norm(name, value)

    rows = torch_mod.RecordDataset(root)
    from_torch = [{n: norm_torch(n, v) for n, v in r.items()} for r in rows]
    in_order = rtf.dataset(root, options=ReadOptions(num_threads=1))
    from_tf = [{n: _norm(n, v) for n, v in r.items()} for r in in_order]
    assert from_tf == from_torch


def test_columns_and_remainder(written):
    root, _ = written
    ds = rtf.dataset(root, batch_size=8, columns=["t", "id"], drop_last=True)
    batches = list(ds)
    assert len(batches) == N // 8
    assert all(set(b) == {"id", "t"} and b["id"].shape == (8,) for b in batches)
    with pytest.raises(rk.errors.SchemaError, match="nope"):
        rtf.dataset(root, columns=["nope"])


def _ids(ds) -> list[int]:
    return [int(i) for b in ds for i in np.atleast_1d(b["id"].numpy())]


@pytest.mark.parametrize("batch_size", [None, 8])
def test_fixed_shapes_vectorised_path(fixed, batch_size):
    ds = rtf.dataset(fixed, batch_size=batch_size, options=ReadOptions(num_threads=1))
    assert _ids(ds) == list(range(130))


@pytest.mark.parametrize("batch_size", [None, 1, 5])
def test_parallel_reads_give_a_fixed_order(written, batch_size):
    root, _ = written
    first = _ids(rtf.dataset(root, batch_size=batch_size))
    assert sorted(first) == list(range(N))
    assert _ids(rtf.dataset(root, batch_size=batch_size)) == first
    ds = rtf.dataset(root, batch_size=batch_size)
    if batch_size:
        sizes = [int(b["id"].shape[0]) for b in ds]
        assert sizes[:-1] == [batch_size] * (len(sizes) - 1)  # only the last is short


def _plan_order(root, epoch: int, **options) -> list[int]:
    """The epoch plan's order of a dataset whose record k has id k."""
    shards = open_shards(root)
    plan = EpochPlan(
        shards.counts, PlanOptions(**options), epoch, avg_record_bytes=shards.avg_record_bytes
    )
    return plan.order(np.arange(shards.records)).tolist()


def test_shuffle_is_the_plan_seeded_and_new_each_epoch(fixed):
    ds = rtf.dataset(fixed, batch_size=8, shuffle=True, seed=3, epochs=2)
    assert len(ds) == 2 * 17
    ids = _ids(ds)
    e1, e2 = ids[:130], ids[130:]
    assert sorted(e1) == sorted(e2) == list(range(130))
    assert e1 != e2 and e1 != list(range(130))
    assert e1 == _plan_order(fixed, 0, shuffle=True, seed=3, batch_size=8)
    assert e2 == _plan_order(fixed, 1, shuffle=True, seed=3, batch_size=8)
    # a new pass reads the next epochs (Keras fit, or a loop over the same dataset)
    again = _ids(ds)
    assert again[:130] == _plan_order(fixed, 2, shuffle=True, seed=3, batch_size=8)
    assert again[130:] == _plan_order(fixed, 3, shuffle=True, seed=3, batch_size=8)
    rtf.set_epoch(ds, 0)  # the epoch numbers say the order
    assert _ids(ds) == ids
    assert _ids(rtf.dataset(fixed, batch_size=8, shuffle=True, seed=3, epoch=1)) == e2
    other = rtf.dataset(fixed, batch_size=8, shuffle=True, seed=4)
    assert _ids(other) != e1
    forever = rtf.dataset(fixed, batch_size=8, shuffle=True, seed=3, epochs=None)
    assert forever.cardinality() == tf.data.INFINITE_CARDINALITY
    assert _ids(forever.take(34)) == ids


@pytest.mark.parametrize("pipelines", [2, 3, 16])
@pytest.mark.parametrize("shuffle", [False, True])
def test_input_pipelines_see_every_record_once(fixed, pipelines, shuffle):
    seen = []
    for i in range(pipelines):
        ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=i)
        part = _ids(rtf.dataset(fixed, batch_size=4, input_context=ctx, shuffle=shuffle))
        assert part, f"pipeline {i} got nothing"
        seen += part
    assert sorted(seen) == list(range(130))


def test_shard_files_rule():
    files = [f"s{i}" for i in range(5)]
    assert rtf.shard_files(files, 2, 1) == (["s1", "s3"], False)
    assert rtf.shard_files(files, 8, 3) == (files, True)
    assert rtf.shard_files(files, 1, 0) == (files, False)
    with pytest.raises(ValueError):
        rtf.shard_files(files, 2, 2)


def test_feature_spec_for_your_own_pipeline(fixed):
    spec = rtf.feature_spec(rk.Dataset(fixed).schema)
    files = sorted(str(p) for p in fixed.glob("*.tfrecord"))
    ds = tf.data.TFRecordDataset(files).batch(200).map(lambda s: tf.io.parse_example(s, spec))
    batch = next(iter(ds))
    assert sorted(batch["id"].numpy().tolist()) == list(range(130))
    assert batch["x"].dtype == tf.string  # raw tensor bytes, for tf.io.decode_raw
    assert batch["v"].shape == (130, 2)


def test_foreign_folder_with_inferred_or_given_schema(tmp_path):
    root = tmp_path / "foreign"
    root.mkdir()
    with tf.io.TFRecordWriter(str(root / "a.tfrecord")) as w:
        for k in range(10):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[k])),
                        "img": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[np.full(4, k, np.uint8).tobytes()])
                        ),
                    }
                )
            )
            w.write(ex.SerializeToString())
    batch = next(iter(rtf.dataset(root, batch_size=10)))
    assert batch["label"].numpy().tolist() == list(range(10))
    assert batch["img"].dtype == tf.string
    given = Schema(label=Int64(), img=Tensor("uint8", (4,)))
    batch = next(iter(rtf.dataset(root / "a.tfrecord", batch_size=10, schema=given)))
    assert batch["img"].numpy().tolist() == [[k] * 4 for k in range(10)]


def test_urls_tensorflow_cannot_read_name_the_cache(tmp_path):
    with pytest.raises(rk.errors.ShardNotFoundError, match="cache"):
        rtf.dataset("s3://bucket/data")
    with pytest.raises(rk.errors.ShardNotFoundError, match="no such dataset"):
        rtf.dataset(tmp_path / "missing")
    with pytest.raises(ValueError):
        rtf.dataset(tmp_path, batch_size=0)


def test_keras_fits_on_a_dataset(fixed):
    keras = tf.keras
    ds = rtf.dataset(fixed, batch_size=16, shuffle=True, columns=["x", "id"]).map(
        lambda b: (b["x"], tf.cast(b["id"] % 2, tf.float32))
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(ds, epochs=2, verbose=0, shuffle=False)  # the dataset shuffles
    assert len(history.history["loss"]) == 2


@pytest.mark.parametrize(
    ("batch_size", "drop", "pipelines"),
    [(None, False, 1), (8, False, 1), (8, True, 1), (7, False, 3), (4, True, 16), (None, 0, 16)],
)
def test_length_is_known_and_true(fixed, batch_size, drop, pipelines):
    for i in range(pipelines):
        ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=i)
        ds = rtf.dataset(fixed, batch_size=batch_size, drop_last=drop, input_context=ctx)
        assert len(ds) == sum(1 for _ in ds)


@pytest.mark.parametrize("reads", [1, 4])
@pytest.mark.parametrize("batch_size", [None, 5])
def test_big_records_are_not_chunked(tmp_path, reads, batch_size):
    schema = Schema(id=Int64(), x=Tensor("uint8", (80_000,)))  # >= 64 KiB: one element each
    with rk.Writer(tmp_path / "d", schema, max_records=4) as w:
        for k in range(14):
            w.write({"id": k, "x": np.full(80_000, k, np.uint8)})
    ds = rtf.dataset(tmp_path / "d", batch_size=batch_size, options=ReadOptions(num_threads=reads))
    ids = []
    for b in ds:
        x = b["x"].numpy().reshape(-1, 80_000)
        got = np.atleast_1d(b["id"].numpy())
        assert (x == got[:, None].astype(np.uint8)).all()
        ids += got.tolist()
    assert sorted(ids) == list(range(14)) and len(ds) == len(list(ds))
    if reads == 1:
        assert ids == list(range(14))


@pytest.mark.parametrize(
    "field, named",
    [({"on_error": "skip"}, "on_error='skip'"), ({"reader_process": True}, "reader_process=True")],
)
def test_a_torch_setting_is_refused_by_name(written, field, named):
    """A ReadOptions field only RecordDataset reads, set for recordkit.tf, is refused by
    name: never silently ignored."""
    path, _ = written
    with pytest.raises(ValueError, match=f"^ReadOptions\\({named}\\): recordkit.tf.dataset"):
        rtf.dataset(path, options=ReadOptions(**field))
