"""Many threads on one dataset: each iterator sees exactly its records; shared state stays right.

Ready for free-threaded CPython: the reader's shared mutable state (the shard maps of
a dataset object, its statistics, the buffer pool) is guarded by locks. Under the GIL
the races are provoked with a tiny switch interval.
"""

import pickle
import sys
import threading

import numpy as np
import pytest

import recordkit as rk
from recordkit.reader import ReadOptions
from recordkit.reader.buffers import BufferPool
from recordkit.reader.pipeline import ReaderStats

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]

import recordkit.reader.shards as rks  # noqa: E402
import recordkit.torch as rkt  # noqa: E402

SCHEMA = rk.Schema(idx=rk.Int64(), data=rk.Bytes(), vec=rk.Float32((8,)))
N = 1000
THREADS = 8


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads") / "ds"
    with rk.Writer(root, SCHEMA, max_records=128) as w:
        for i in range(N):
            w.write({"idx": i, "data": b"x" * (i % 13), "vec": np.full(8, i, np.float32)})
    return root


@pytest.fixture
def busy_switching():
    """Switch threads every few bytecodes, so unguarded read-modify-writes interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _hammer(fn, n=THREADS):
    """Run ``fn(k)`` in ``n`` threads at once; return results, re-raise the first error."""
    results, errors = [None] * n, []
    start = threading.Barrier(n)

    def run(k):
        try:
            start.wait(timeout=30)
            results[k] = fn(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    assert not any(t.is_alive() for t in threads), "a hammering thread hangs"
    if errors:
        raise errors[0]
    return results


def _epoch_ids(ds, first_done=None):
    ids = []
    for batch in ds:
        ids += batch["idx"].tolist()
        assert all(float(v[0]) == i for v, i in zip(batch["vec"], batch["idx"].tolist()))
        if first_done is not None:
            first_done.wait(timeout=30)  # every thread holds a live iterator of epoch 0
            first_done = None
    return ids


@pytest.mark.slow
def test_many_threads_iterate_one_dataset(ds_path, busy_switching):
    kwargs = dict(batch_size=32, shuffle=True, seed=11, options=ReadOptions(num_threads=2))
    want = _epoch_ids(rkt.RecordDataset(ds_path, **kwargs))
    assert sorted(want) == list(range(N))
    ds = rkt.RecordDataset(ds_path, **kwargs)
    # A fresh copy, as a spawned process gets it: the maps are opened on first use,
    # by whichever threads get there first; each shard must be mapped once.
    ds = pickle.loads(pickle.dumps(ds))
    opened = []
    real_shard = rks.MappedShard

    def counting_shard(root, info, **kw):
        opened.append(info.path)
        return real_shard(root, info, **kw)

    rks.MappedShard = counting_shard
    try:
        first_done = threading.Barrier(THREADS)
        got = _hammer(lambda k: _epoch_ids(ds, first_done))
    finally:
        rks.MappedShard = real_shard
    assert opened and sorted(opened) == sorted(set(opened))  # within the budget: once each
    for ids in got:
        assert ids == want
    assert ds.stats.records == THREADS * N
    assert ds.stats.batches == THREADS * len(ds)
    assert ds.epoch == 1  # advanced once, by the first pass to finish


@pytest.mark.slow
def test_many_threads_read_samples(ds_path, busy_switching):
    ds = rkt.RecordDataset(ds_path, options=ReadOptions(num_threads=1))
    got = _hammer(lambda k: [int(s["idx"]) for s in ds], n=4)
    assert all(ids == list(range(N)) for ids in got)  # no shuffle: every epoch alike
    assert ds.stats.records == 4 * N


def test_reader_stats_add_is_atomic(busy_switching):
    stats = ReaderStats()

    def add(k):
        for _ in range(20_000):
            stats.add(records=1, bytes=3)

    _hammer(add)
    assert stats.records == THREADS * 20_000 and stats.bytes == 3 * THREADS * 20_000
    assert pickle.loads(pickle.dumps(stats)).records == stats.records


def test_buffer_pool_never_hands_out_a_slab_twice(busy_switching):
    pool = BufferPool(max_free_bytes=4 << 20)

    def churn(k):
        live = []
        for i in range(300):
            a = pool.alloc((16 << 10,), np.int64)  # 128 KiB: pooled
            a.fill(k * 1000 + i)
            live.append((k * 1000 + i, a))
            if len(live) > 3:
                value, old = live.pop(0)
                assert (old == value).all(), "a live array was handed to someone else"
        return True

    assert all(_hammer(churn))
    assert pool.allocated <= THREADS * 5 + 8  # slabs were reused, not leaked
