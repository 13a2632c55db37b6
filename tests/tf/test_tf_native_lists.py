"""recordkit.tf's native path for ragged numbers and lists of bytes (issue 33): the
runner's packed and list columns, as ``tf.RaggedTensor`` (or a dense ``[n, k]`` for
``Bytes((k,))``), value for value what the ``parse_example`` path gives: empty lists, a
batch of only empty ones, absent features, shuffled tasks joined from many shards, the
exact way for what the runner refuses, checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import recordkit as rk
from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit.codec import encode_example
from tests.tf.native_cases import count_calls, foreign, offset

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")
tfnative = pytest.importorskip("recordkit.tf.native")
tftasks = pytest.importorskip("recordkit.tf.tasks")
tfpipes = pytest.importorskip("recordkit.tf.pipes")
shards_mod = pytest.importorskip("recordkit.reader.shards")

pytestmark = pytest.mark.tf

LISTS = Schema(
    i=Int64(),
    b2=Bytes((2,)),
    bl=Bytes((None,)),
    il=Int64((None,)),
    fl=Float32((None,)),
    f3=Float32((None, 3)),
    t2=Tensor("int16", (None, 2)),
    u=Tensor("uint64", (None,)),
)


# decode_raw (the parse_example path) has no uint64: compared without it
PARSED = [n for n in LISTS.names if n != "u"]


def _sample(k: int) -> dict[str, Any]:
    """Record k: records 4 to 7 (a batch of 4) hold only empty lists; values of 0, short
    with NULs, and at least 4096 bytes (RecordkitStrings' views); int64s of 1 to 10 bytes."""
    n = 0 if 4 <= k < 8 else k % 5
    return {
        "i": k,
        "b2": [bytes([k % 256]) * (k % 3), b"x\x00" * (k % 2) + b"y" * (4096 * (k % 7 == 1))],
        "bl": [bytes([65 + j]) * (j + k % 3) + b"\x00" * (j % 2) for j in range(n)],
        "il": [(-1) ** j * 7**j * (k + 1) for j in range(n * 4)],
        "fl": [k / 2, float("nan"), -0.0][: n % 3] * n,
        "f3": np.arange(n * 3, dtype=np.float32).reshape(n, 3) + k,
        "t2": np.full((n, 2), -k, np.int16),
        "u": np.full(n, 2**64 - 1 - k, np.uint64),
    }


def _write(root: Path, records: int = 60, max_records: int = 9) -> Path:
    with rk.Writer(root, LISTS, max_records=max_records) as w:
        for k in range(records):
            w.write(_sample(k))
    return root


@pytest.fixture(scope="module")
def lists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("lists") / "d")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the native path's tasks: by the runner, and the exact way."""
    return count_calls(monkeypatch)


def _plain(value: Any) -> Any:
    """A value as nested Python lists, bit-exact for floats (NaN, -0.0)."""
    if isinstance(value, tf.RaggedTensor):
        return (
            "ragged",
            value.ragged_rank,
            _plain(value.flat_values),
            value.nested_row_splits[0].numpy().tolist(),
        )
    array = value.numpy()
    if array.dtype.kind == "f":
        return ("f", array.dtype.str, array.shape, array.tobytes())
    return (array.dtype.str, array.shape, array.tolist())


def _read(
    root: Path, monkeypatch: pytest.MonkeyPatch, native: bool, op: bool = True, **kw: Any
) -> tuple[Any, list[Any]]:
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1" if native else "0")
    monkeypatch.setenv("RECORDKIT_NO_TFOP", "0" if op else "1")
    ds = rtf.dataset(root, **kw)
    return ds.element_spec, [{k: _plain(v) for k, v in el.items()} for el in ds]


@pytest.mark.parametrize("op", [True, False], ids=["op", "substr"])
@pytest.mark.parametrize("batch_size", [None, 4, 7])
def test_lists_read_natively_as_parse_example_reads_them(
    lists: Path,
    monkeypatch: pytest.MonkeyPatch,
    calls: dict[str, int],
    op: bool,
    batch_size: int | None,
) -> None:
    """Same element spec, same elements, every task by the runner (shuffled: the plan's
    order on both paths; batches of 4: one of only empty lists, a short last one)."""
    for name in LISTS.names:
        assert tfnative.takes(LISTS, ["i", name]), name
    kw = {"batch_size": batch_size, "shuffle": True, "seed": 5, "columns": PARSED}
    spec0, want = _read(lists, monkeypatch, native=False, **kw)
    assert calls["run"] == 0
    spec1, got = _read(lists, monkeypatch, native=True, op=op, **kw)
    assert calls["run"] > 0 and calls["decode"] == 0
    assert spec1 == spec0
    assert got == want


def test_the_values_written(lists: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unshuffled, in the plan's order: each record's values as written, the ragged
    shapes and dtypes the docs give."""
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")
    ds = rtf.dataset(lists, batch_size=4)
    spec = ds.element_spec
    assert spec["bl"] == tf.RaggedTensorSpec([None, None], tf.string, 1, tf.int64)
    assert spec["b2"] == tf.TensorSpec([None, 2], tf.string)
    assert spec["f3"] == tf.RaggedTensorSpec([None, None, 3], tf.float32, 1, tf.int64)
    assert spec["u"] == tf.RaggedTensorSpec([None, None], tf.uint64, 1, tf.int64)
    k = 0
    for batch in ds:
        for r in range(int(batch["i"].shape[0])):
            want = _sample(k)
            assert int(batch["i"][r]) == k
            assert batch["b2"][r].numpy().tolist() == want["b2"]
            assert batch["bl"][r].numpy().tolist() == want["bl"]
            assert batch["il"][r].numpy().tolist() == want["il"]
            assert batch["fl"][r].numpy().tobytes() == np.asarray(want["fl"], np.float32).tobytes()
            assert np.array_equal(batch["f3"][r].numpy(), want["f3"])
            assert np.array_equal(batch["t2"][r].numpy().reshape(-1, 2), want["t2"])
            assert batch["u"][r].numpy().tolist() == want["u"].tolist()
            k += 1
    assert k == 60


def test_shuffled_tasks_joined_from_many_shards(
    lists: Path, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]
) -> None:
    """One shard per runner call (max_open 4): a shuffled task's parts, from 7 shards,
    joined in stream order."""
    monkeypatch.setattr(shards_mod, "max_open_shards", lambda: 4)
    kw = {"batch_size": 6, "shuffle": True, "seed": 11, "columns": PARSED}
    spec0, want = _read(lists, monkeypatch, native=False, **kw)
    spec1, got = _read(lists, monkeypatch, native=True, **kw)
    assert calls["run"] >= 7 and calls["decode"] == 0  # a call per shard
    assert spec1 == spec0 and got == want


def test_a_task_the_runner_refuses_is_read_the_exact_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]
) -> None:
    """Records without a defaulted Bytes((2,)) send their tasks to the reference decoder
    (the default), whose parts (one per shard) are joined: parse_example's values."""
    schema = Schema(
        i=Int64(), pair=Bytes((2,), default=[b"a", b"b"]), il=Int64((None,)), bl=Bytes((None,))
    )
    with rk.Writer(tmp_path / "d", schema, max_records=5) as w:
        for k in range(40):
            w.write(
                {
                    "i": k,
                    "pair": None if k % 6 == 0 else [b"p%d" % k, b""],
                    "il": list(range(k % 4)),
                    "bl": [b"v" * j for j in range(k % 3)],
                }
            )
    kw = {"batch_size": 8, "shuffle": True, "seed": 2}
    spec0, want = _read(tmp_path / "d", monkeypatch, native=False, **kw)
    spec1, got = _read(tmp_path / "d", monkeypatch, native=True, **kw)
    assert calls["decode"] > 0
    assert spec1 == spec0 and got == want


def test_absent_features_read_as_parse_example_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]
) -> None:
    """Ragged numbers and Bytes((None,)) that a record lacks (no key, or no list set) are
    no values on both paths (a RaggedFeature), read by the runner; a Bytes((2,)) or a
    Tensor a record lacks is an error on both."""
    schema = Schema(i=Int64(), il=Int64((None,)), f3=Float32((None, 3)), bl=Bytes((None,)))
    payloads = []
    for k in range(12):
        features: dict[str, Any] = {"i": ("int64", [k])}
        if k % 3:
            features["il"] = ("int64", [k] * (k % 4))
            features["f3"] = ("float", [k] * (3 * (k % 2)))
            features["bl"] = ("bytes", [b"z" * k])
        elif k % 2:
            features.update(il=(None, []), f3=(None, []), bl=(None, []))  # no list set
        payloads.append(encode_example(features))
    root = foreign(tmp_path / "d", payloads).parent
    kw = {"schema": schema, "batch_size": 5, "shuffle": True, "seed": 1}
    spec0, want = _read(root, monkeypatch, native=False, **kw)
    spec1, got = _read(root, monkeypatch, native=True, **kw)
    assert calls["run"] > 0 and calls["decode"] == 0
    assert spec1 == spec0 and got == want

    for ftype in (Bytes((2,)), Tensor("int8", (None,))):
        strict = Schema(i=Int64(), x=ftype)
        for native in (False, True):
            monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1" if native else "0")
            with pytest.raises(tf.errors.OpError) as info:
                list(rtf.dataset(root, schema=strict, batch_size=4))
            assert "'x'" in str(info.value) or "Feature: x" in str(info.value)


def test_a_record_of_the_wrong_size_names_file_offset_and_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Float32((None, 3)) record holding 4 floats: the runner refuses its task, the
    reference decoder names the record."""
    schema = Schema(i=Int64(), f3=Float32((None, 3)))
    payloads = [encode_example({"i": ("int64", [k]), "f3": ("float", [k] * 3)}) for k in range(9)]
    payloads[5] = encode_example({"i": ("int64", [5]), "f3": ("float", [1.0] * 4)})
    root = foreign(tmp_path / "d", payloads).parent
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")
    with pytest.raises(tf.errors.OpError) as info:
        list(rtf.dataset(root, schema=schema, batch_size=4))
    shard = root / "part-00000.tfrecord"
    assert f"{shard}:{offset(shard, 5)}:5:" in str(info.value)


def test_a_task_needing_more_room_than_guessed_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]
) -> None:
    """The room for a task's values is the most per payload byte seen so far: a later
    task with more values per byte (1-byte varints after long ones, many short byte
    values after one long one) makes the runner say what it needs, and runs again.
    (Tasks one at a time: which task teaches the others is then the first.)"""
    monkeypatch.setattr(tftasks, "_TASK_RECORDS", 4)
    monkeypatch.setattr(tfpipes, "_CPUS", 1)
    schema = Schema(i=Int64(), il=Int64((None,)), bl=Bytes((None,)))
    samples = []
    for k in range(16):
        if k < 4:  # 10-byte varints, one long value: few values per payload byte
            samples.append({"i": k, "il": [-1] * 3, "bl": [b"x" * 500]})
        else:  # 1-byte varints, many empty values
            samples.append({"i": k, "il": [1] * 200, "bl": [b""] * 100})
    with rk.Writer(tmp_path / "d", schema) as w:
        for s in samples:
            w.write(s)
    runs: list[bool] = []
    run = tfnative.NativeTasks._run

    def spied(self, *args):  # type: ignore[no-untyped-def]
        runner = self.columns.runner

        class Counting:
            def run(self, *a):  # type: ignore[no-untyped-def]
                out = runner.run(*a)
                runs.append(out[0])
                return out

        self.columns.runner = Counting()
        try:
            return run(self, *args)
        finally:
            self.columns.runner = runner

    monkeypatch.setattr(tfnative.NativeTasks, "_run", spied)
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")
    got = list(rtf.dataset(tmp_path / "d", batch_size=None))
    assert runs == [True, False, True, True, True]  # task 1 refused for room, then run
    assert calls["decode"] == 0
    for k, el in enumerate(got):
        assert el["il"].numpy().tolist() == samples[k]["il"]
        assert el["bl"].numpy().tolist() == samples[k]["bl"]


@pytest.mark.parametrize("shuffle", [False, True])
def test_checkpoint_resumes_ragged_batches(
    lists: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffle: bool
) -> None:
    monkeypatch.setenv("RECORDKIT_TF_NATIVE", "1")

    def build():  # type: ignore[no-untyped-def]
        return rtf.dataset(lists, batch_size=8, shuffle=shuffle, seed=2, epochs=2, columns=PARSED)

    it = iter(build())
    ckpt = tf.train.Checkpoint(iterator=it)
    for _ in range(10):  # 8 batches an epoch: inside the second
        next(it)
    saved = ckpt.write(str(tmp_path / "ckpt"))
    want = [{k: _plain(v) for k, v in b.items()} for b in it]
    again = iter(build())
    tf.train.Checkpoint(iterator=again).read(saved).assert_consumed()
    assert [{k: _plain(v) for k, v in b.items()} for b in again] == want
    assert len(want) == 6


@pytest.mark.parametrize("batch_size", [None, 3])
def test_padded_bytes_beside_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int], batch_size: int | None
) -> None:
    """bytes_as="padded": the one-value Bytes() as padded rows and lengths, the lists of
    bytes still tf.string, ragged numbers ragged: parse_example's elements."""
    from recordkit.reader import ReadOptions

    schema = Schema(b=Bytes(), il=Int64((None,)), bl=Bytes((None,)))
    with rk.Writer(tmp_path / "d", schema, max_records=4) as w:
        for k in range(11):
            w.write({"b": b"v" * (k % 4), "il": list(range(k % 3)), "bl": [b"x" * k] * (k % 2)})
    kw = {
        "batch_size": batch_size,
        "shuffle": True,
        "seed": 4,
        "options": ReadOptions(bytes_as="padded"),
    }
    spec0, want = _read(tmp_path / "d", monkeypatch, native=False, **kw)
    spec1, got = _read(tmp_path / "d", monkeypatch, native=True, **kw)
    assert calls["run"] > 0 and calls["decode"] == 0
    assert spec1 == spec0 and got == want
    assert spec1["b"].dtype == tf.uint8 and spec1["bl"].dtype == tf.string
