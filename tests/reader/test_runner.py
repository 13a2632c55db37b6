"""The native task runner: whole tasks decoded on threads that never take the GIL.

Every test compares the runner (``native_tasks=True``) with the thread pool over
``BatchDecoder.decode`` (``native_tasks=False``), the path whose results the
decoder tests pin to the reference decoder: the two must give identical chunks,
errors and stats, whatever falls back.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import recordkit as rk
from recordkit.codec import Bytes, Float32, Int64, Schema, Tensor
from recordkit.errors import CorruptRecordError
from recordkit.reader import decode
from recordkit.reader.decode import BatchDecoder
from recordkit.reader.pipeline import RecordReader
from recordkit.reader.plan import EpochPlan, PlanOptions, Split
from recordkit.reader.shards import open_shards

pytestmark = pytest.mark.skipif(
    decode.IMPLEMENTATION != "native", reason="the runner is part of the native extension"
)

SCHEMA = Schema(
    {
        "idx": Int64(),
        "pair": Int64(shape=(2,)),
        "vec": Float32(shape=(16,)),
        "data": Bytes(),
        "tag": Bytes(),
        "img": Tensor("uint8", shape=(4, 8)),
    }
)
N = 700


def _sample(i: int, rng: np.random.Generator) -> dict:
    # Every 100 records "data" doubles past all before it (the runner's row-width
    # guess is then too narrow); it is sometimes empty; "tag" is short.
    big = 200 * 2 ** (i // 100) if i % 100 == 50 else 0
    width = 0 if i % 37 == 0 else int(rng.integers(1, 40)) + big
    return {
        "idx": i,
        "pair": np.array([i, -i], np.int64),
        "vec": rng.standard_normal(16).astype(np.float32),
        "data": rng.bytes(width),
        "tag": f"t{i}".encode(),
        "img": rng.integers(0, 255, (4, 8), dtype=np.uint8),
    }


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner") / "ds"
    rng = np.random.default_rng(3)
    with rk.Writer(root, SCHEMA, max_records=97) as w:
        for i in range(N):
            w.write(_sample(i, rng))
    return root


def _read(root, *, native, batch_size=16, shuffle=True, on_error="raise", columns=None, **kw):
    shards = open_shards(str(root), None)
    try:
        dec = BatchDecoder(shards.schema, columns=columns)
        reader = RecordReader(
            shards,
            dec,
            num_threads=2,
            prefetch=3,
            on_error=on_error,
            native_tasks=native,
            **kw,
        )
        assert reader.native_tasks is native
        plan = EpochPlan(
            shards.counts,
            PlanOptions(shuffle=shuffle, seed=7, batch_size=batch_size, block_records=40),
            epoch=1,
        )
        split = Split()
        chunks = []
        for chunk in reader.read(plan, split, plan.units(split)):
            chunks.append(
                (chunk.units.copy(), {k: np.array(v) for k, v in chunk.columns.items()}, chunk.rows)
            )
        stats = reader.stats.as_dict()
        stats["fallbacks"] = reader.native_fallbacks
        stats["chunks"] = len(chunks)
        return chunks, stats
    finally:
        gc.collect()
        shards.close()  # fails if a task still exported a shard


def _same(a, b):
    assert len(a) == len(b)
    for (ua, ca, ra), (ub, cb, rb) in zip(a, b):
        assert ra == rb
        np.testing.assert_array_equal(ua, ub)
        assert list(ca) == list(cb)
        for name in ca:
            assert ca[name].dtype == cb[name].dtype, name
            assert ca[name].shape == cb[name].shape, name
            assert ca[name].tobytes() == cb[name].tobytes(), name


@pytest.mark.parametrize("task_records", [16, 128, 4096])
def test_runner_matches_the_thread_pool(ds_path, task_records):
    # Shuffled blocks of 40 records: most tasks span several shards.
    native, stats_n = _read(ds_path, native=True, task_records=task_records)
    python, stats_p = _read(ds_path, native=False, task_records=task_records)
    _same(native, python)
    ids = np.concatenate([c["idx"] for _, c, _ in native])
    assert sorted(ids.tolist()) == list(range(N))
    for key in ("bytes", "skipped"):
        assert stats_n[key] == stats_p[key]
    assert stats_n["decode_seconds"] > 0
    assert stats_n["fallbacks"] <= 7  # at most one per doubling of "data": the runner works


def test_too_narrow_width_guesses_fall_back(ds_path):
    # In order, each doubled "data" value is wider than the guess made from the
    # ones before: those tasks go the reference way, with identical results.
    kw = {"shuffle": False, "task_records": 32}
    native, stats = _read(ds_path, native=True, **kw)
    _same(native, _read(ds_path, native=False, **kw)[0])
    assert stats["fallbacks"] >= 4


def test_runner_unbatched_and_column_subset(ds_path):
    for kw in ({"batch_size": None}, {"columns": ["data", "idx"]}, {"columns": ["img"]}):
        _same(_read(ds_path, native=True, **kw)[0], _read(ds_path, native=False, **kw)[0])


def _corrupt(src, dst, hits):
    """Copy the dataset and flip a payload byte of the given (shard, record)s."""
    import shutil

    shutil.copytree(src, dst)
    shards = sorted(p for p in os.listdir(dst) if p.endswith(".tfrecord"))
    for shard, record in hits:
        path = os.path.join(dst, shards[shard])
        entries = rk.format.load_index(path + ".idx")
        offset = int(entries[record][0]) + 12 + 3
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))
    return dst


@pytest.mark.parametrize("policy", ["skip", "warn", "raise"])
def test_runner_falls_back_on_corrupt_records(ds_path, tmp_path, policy):
    root = _corrupt(ds_path, tmp_path / "bad", [(0, 5), (3, 0), (6, 20)])
    if policy == "raise":
        for native in (True, False):
            with pytest.raises(CorruptRecordError) as info:
                _read(root, native=native, on_error=policy, shuffle=False)
            assert info.value.record == 5 and info.value.path.endswith(".tfrecord")
        return
    with pytest.warns(RuntimeWarning) if policy == "warn" else _nothing():
        native, stats_n = _read(root, native=True, on_error=policy)
    with pytest.warns(RuntimeWarning) if policy == "warn" else _nothing():
        python, stats_p = _read(root, native=False, on_error=policy)
    _same(native, python)
    assert stats_n["skipped"] == stats_p["skipped"] == 3


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_runner_stops_mid_epoch_and_lets_the_shards_go(ds_path):
    shards = open_shards(str(ds_path), None)
    reader = RecordReader(
        shards, BatchDecoder(shards.schema), num_threads=2, prefetch=4, task_records=16
    )
    assert reader.native_tasks
    plan = EpochPlan(shards.counts, PlanOptions(batch_size=16), epoch=0)
    it = reader.read(plan, Split(), plan.units(Split()))
    next(it)
    next(it)
    it.close()  # tasks still queued or running: their exports end here
    shards.close()  # a BufferError here means a shard stayed exported


def test_schemas_the_runner_does_not_take():
    zstd = Schema({"x": Tensor("float32", shape=(4,), compression="zstd")})
    assert BatchDecoder(zstd).runner() is None
    assert BatchDecoder(Schema({"v": Int64(shape=(None,))})).runner() is None
    assert BatchDecoder(Schema({"b": Bytes()}), bytes_as="list").runner() is None
    assert BatchDecoder(Schema({"b": Bytes()})).runner() is not None


def test_runner_rejects_bad_submissions():
    from recordkit.native import _ext as _native

    dec = BatchDecoder(Schema({"b": Bytes(), "i": Int64()}))
    runner = dec.runner()
    rec = np.zeros((1, 3), np.int64)
    outs = dec.runner_outputs(1, [8], np.empty)
    with pytest.raises(ValueError, match="output"):
        runner.submit((b"",), rec, outs[:2])
    rec[0, 0] = 1
    with pytest.raises(ValueError, match="buffer index"):
        runner.submit((b"",), rec, outs)
    runner.close()
    rec[0, 0] = 0
    with pytest.raises(RuntimeError, match="closed"):
        runner.submit((b"",), rec, outs)
    assert isinstance(runner, _native.Runner)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux only")
@pytest.mark.parametrize(("env", "want"), [(None, 10), ("3", 3), ("0", 0)])
def test_runner_threads_lower_their_priority(ds_path, monkeypatch, env, want):
    import threading

    if env is None:
        monkeypatch.delenv("RECORDKIT_READER_NICE", raising=False)
    else:
        monkeypatch.setenv("RECORDKIT_READER_NICE", env)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    shards = open_shards(str(ds_path), None)
    reader = RecordReader(shards, BatchDecoder(shards.schema), num_threads=2, prefetch=2)
    plan = EpochPlan(shards.counts, PlanOptions(batch_size=16), epoch=0)
    it = reader.read(plan, Split(), plan.units(Split()))
    next(it)
    readers = [t for t in threading.enumerate() if t.name.startswith("recordkit-reader")]
    assert len(readers) == 2
    for t in readers:
        with open(f"/proc/self/task/{t.native_id}/stat") as f:
            nice = int(f.read().rsplit(")", 1)[1].split()[16])
        assert nice == min(19, base + want)
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the training thread keeps its own
    it.close()
    shards.close()


def test_reader_nice_must_be_in_range(ds_path, monkeypatch):
    from recordkit.reader.pipeline import _reader_nice

    for bad in ("-1", "20", "high"):
        monkeypatch.setenv("RECORDKIT_READER_NICE", bad)
        with pytest.raises(ValueError, match="RECORDKIT_READER_NICE"):
            _reader_nice()


def test_environment_turns_the_runner_off(ds_path, monkeypatch):
    shards = open_shards(str(ds_path), None)
    try:
        monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", "0")
        assert not RecordReader(
            shards, BatchDecoder(shards.schema), num_threads=1, prefetch=1
        ).native_tasks
        monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", "1")
        assert RecordReader(
            shards, BatchDecoder(shards.schema), num_threads=1, prefetch=1
        ).native_tasks
    finally:
        shards.close()


def _write(root, samples):
    with rk.Writer(root, SCHEMA, max_records=50) as w:
        for s in samples:
            w.write(s)
    return root


@pytest.mark.parametrize("shuffle", [True, False])
def test_large_records_take_the_two_pass_path(tmp_path, shuffle):
    """Records past the fused-copy size (the payload CRC computed in the copy of the
    biggest value): parse first, then every copied column at the task's exact widths."""
    rng = np.random.default_rng(5)
    samples = []
    for i in range(240):
        s = _sample(i % 100, rng)  # no doubling: widths stay within the guess
        s["idx"] = i
        s["data"] = rng.bytes(int(rng.integers(20_000, 40_000)) if i % 9 else 0)
        s["tag"] = rng.bytes(int(rng.integers(0, 30_000)))  # two large bytes columns
        samples.append(s)
    root = _write(tmp_path / "big", samples)
    kw = {"shuffle": shuffle, "task_records": 64, "batch_size": 8}
    native, stats = _read(root, native=True, **kw)
    _same(native, _read(root, native=False, **kw)[0])
    assert stats["fallbacks"] <= 2


def test_values_of_one_size_are_written_where_they_stay(tmp_path):
    """While every task's widest value has had one size, the runner is given rows of
    exactly that width; a wider value later falls back once, narrower ones close up."""
    rng = np.random.default_rng(6)
    samples = []
    for i in range(600):
        s = _sample(i % 100, rng)
        s["idx"] = i
        s["data"] = rng.bytes(64 if i < 400 else (100 if i == 400 else int(rng.integers(1, 64))))
        samples.append(s)
    root = _write(tmp_path / "fixed", samples)
    kw = {"shuffle": False, "task_records": 32}
    native, stats = _read(root, native=True, **kw)
    _same(native, _read(root, native=False, **kw)[0])
    assert stats["fallbacks"] == 1  # the 100-byte value; every other task took the runner
