"""The epoch plan in shard windows (remote reads under a budget smaller than the dataset)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recordkit.reader.order import mixing
from recordkit.reader.plan import EpochPlan, PlanOptions, Split

from .test_plan import _read

counts_st = st.lists(st.integers(0, 40), min_size=1, max_size=8)


def _sizes(counts):
    return np.array(counts, dtype=np.int64) * 100 + 7


@settings(max_examples=80, deadline=None)
@given(
    counts=counts_st,
    batch=st.sampled_from([None, 1, 3, 8]),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    block=st.sampled_from([0, 1, 4, 16]),
    window=st.integers(1, 3000),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_every_record_once_and_shard_units_cover_the_reads(
    counts, batch, world, workers, block, window, drop_last, seed
):
    opts = PlanOptions(
        shuffle=True,
        seed=seed,
        block_records=block,
        window_blocks=2,
        batch_size=batch,
        drop_last=drop_last,
        shard_window_bytes=window,
    )
    plan = EpochPlan(np.array(counts), opts, epoch=3, shard_bytes=_sizes(counts))
    seen = []
    for rank in range(world):
        first_want = np.full(len(counts), -1)
        last_want = np.full(len(counts), -1)
        for w in range(workers):
            for unit, rows in _read(plan, Split(rank, world, w, workers)):
                seen.extend(rows)
                for shard, _ in rows:
                    if first_want[shard] < 0 or unit < first_want[shard]:
                        first_want[shard] = unit
                    last_want[shard] = max(last_want[shard], unit)
        first, last = plan.shard_units(rank, world)
        read = last_want >= 0
        assert (first[read] >= 0).all() and (first[read] <= first_want[read]).all()
        assert (last[read] >= last_want[read]).all()
    if not drop_last:
        want = sorted((s, r) for s, c in enumerate(counts) for r in range(c))
        assert sorted(seen) == want
    else:
        assert len(seen) == len(set(seen))


def test_a_stretch_reads_only_its_window_of_shards():
    counts = np.full(40, 100)
    sizes = np.full(40, 1000)
    opts = PlanOptions(shuffle=True, seed=3, batch_size=10, shard_window_bytes=5000)
    plan = EpochPlan(counts, opts, 0, shard_bytes=sizes)
    assert plan.windows == 8  # 5 shards each
    shards, _ = plan.resolve(np.arange(4000))
    for w in range(8):
        part = shards[w * 500 : (w + 1) * 500]
        assert len(np.unique(part)) == 5  # every record of 5 shards, and only them
    seq = plan.shard_sequence()
    assert sorted(seq.tolist()) == list(range(40))
    assert set(shards[:500].tolist()) == set(seq[:5].tolist())  # windows take the keyed order


def test_windows_are_deterministic_and_change_with_the_epoch():
    counts, sizes = np.full(30, 50), np.full(30, 10)
    opts = PlanOptions(shuffle=True, seed=1, shard_window_bytes=40)

    def order(epoch, seed=1):
        o = PlanOptions(shuffle=True, seed=seed, shard_window_bytes=40)
        return EpochPlan(counts, o, epoch, shard_bytes=sizes).order(np.arange(1500))

    assert np.array_equal(order(0), order(0))
    assert not np.array_equal(order(0), order(1))
    assert not np.array_equal(order(0, seed=2), order(0))
    assert opts.shard_window_bytes == 40


def test_a_shard_larger_than_the_window_stands_alone():
    counts = np.array([10, 10, 10, 10])
    sizes = np.array([100, 5000, 100, 100])
    plan = EpochPlan(
        counts, PlanOptions(shuffle=True, shard_window_bytes=250), 0, shard_bytes=sizes
    )
    shards, _ = plan.resolve(np.arange(40))
    runs = [set(shards[i : i + 10].tolist()) for i in range(0, 40, 10)]
    assert {1} in runs  # the big shard alone


def test_without_shuffle_or_windows_the_order_is_the_local_one():
    counts, sizes = np.array([7, 0, 13, 20]), np.array([70, 0, 130, 200])
    local = EpochPlan(counts, PlanOptions(shuffle=True, seed=4), 2)
    whole = EpochPlan(
        counts, PlanOptions(shuffle=True, seed=4, shard_window_bytes=0), 2, shard_bytes=sizes
    )
    assert np.array_equal(local.order(np.arange(40)), whole.order(np.arange(40)))
    plain = EpochPlan(counts, PlanOptions(shard_window_bytes=100), 0, shard_bytes=sizes)
    assert np.array_equal(plain.order(np.arange(40)), np.arange(40))
    with pytest.raises(ValueError, match="bytes"):
        EpochPlan(counts, PlanOptions(shuffle=True, shard_window_bytes=100), 0)


def test_windows_mix_labels_within_their_shards():
    """Sorted data, 10 classes in 100 shards, windows of 20 shards: a batch holds the
    labels of its window's shards (about 9 of 10), far better than shard by shard."""
    counts = np.full(100, 1000)
    opts = PlanOptions(shuffle=True, seed=0, batch_size=64, shard_window_bytes=20)
    plan = EpochPlan(counts, opts, 0, shard_bytes=np.ones(100, np.int64))
    labels = plan.order(np.arange(100_000)) * 10 // 100_000
    m = mixing(labels, 64, 10)
    assert m["distinct"] > 8.0
