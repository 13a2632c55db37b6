"""The keyed permutation, and how well the epoch order mixes sorted data.

The statistics use fixed seeds and bounds with room to spare (a uniform
permutation scores 9.99 labels and D = 1.0 on these sets): they fail for an
order that mixes like the earlier block shuffle (1.1 labels per batch), not for
an unlucky seed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import recordkit.reader.order as order
from recordkit.reader.order import Permutation, mixing
from recordkit.reader.plan import EpochPlan, PlanOptions, Split


def _need_native() -> None:
    if order._c is None:
        if os.environ.get("RECORDKIT_REQUIRE_NATIVE"):  # CI: the extension must build
            pytest.fail("recordkit.native._ext is not built")
        pytest.skip("the C permutation is not built")


EDGE_SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 2**10 - 1, 2**10, 2**10 + 1, 2**16 - 1, 2**16, 2**16 + 1]


@pytest.mark.parametrize("n", EDGE_SIZES)
@pytest.mark.parametrize("native", [False, True])
def test_a_bijection_at_edge_sizes(n, native):
    if native:
        _need_native()
    perm = Permutation(n, key=12345)
    x = np.arange(n)
    y = perm._apply(x, inverse=False, native=native)
    assert np.array_equal(np.sort(y), x)  # every image once: a bijection of [0, n)
    assert np.array_equal(perm._apply(y, inverse=True, native=native), x)


def test_native_and_numpy_agree():
    _need_native()
    rng = np.random.default_rng(1)
    for n in (2, 3, 1000, 2**31 + 11, 10**12):
        perm = Permutation(n, key=int(rng.integers(2**62)))
        x = rng.integers(0, n, 5000)
        assert np.array_equal(
            perm._apply(x, inverse=False, native=True), perm._apply(x, inverse=False, native=False)
        )


def test_out_of_range_positions_are_refused():
    _need_native()
    with pytest.raises(IndexError):
        Permutation(10, key=1)(np.array([3, 10]))


def test_keys_give_different_permutations():
    x = np.arange(1000)
    assert not np.array_equal(Permutation(1000, 1)(x), Permutation(1000, 2)(x))
    assert np.array_equal(Permutation(1000, 3)(x), Permutation(1000, 3)(x))


def test_consecutive_positions_look_uniform():
    """D(64) of a permutation applied to sorted labels, from 1e5 to 1e9 records."""
    for n in (10**5, 10**7, 10**9):
        labels = Permutation(n, key=7)(np.arange(min(n, 64 * 2000))) * 10 // n
        assert mixing(labels, 64, 10)["dispersion"] < 1.1


def _stream(plan: EpochPlan, counts: np.ndarray, rank: int, world: int) -> np.ndarray:
    split = Split(rank, world)
    positions, _ = plan.unit_positions(split, list(plan.units(split)))
    shards, records = plan.resolve(positions)
    return np.concatenate(([0], np.cumsum(counts)))[shards] + records


@pytest.mark.parametrize("world", [1, 8])
def test_sorted_labels_mix_like_a_uniform_permutation(world):
    """100,000 records sorted by label, 10 classes, 11 shards, batch 64: every rank."""
    n = 100_000
    counts = np.full(11, n // 11)
    counts[-1] += n - counts.sum()
    for seed in (0, 1):
        plan = EpochPlan(counts, PlanOptions(shuffle=True, seed=seed, batch_size=64), 0)
        for rank in range(world):
            m = mixing(_stream(plan, counts, rank, world) * 10 // n, 64, 10)
            assert m["distinct"] >= 9.9, (seed, rank, m)
            assert m["distinct_p1"] >= 9, (seed, rank, m)
            assert m["dispersion"] <= 1.1, (seed, rank, m)


def test_a_billion_records_from_the_plan_alone():
    n, shards = 10**9, 10**5
    plan = EpochPlan(
        np.full(shards, n // shards), PlanOptions(shuffle=True, seed=0, batch_size=64), 0
    )
    starts = np.linspace(0, n - 6400, 20, dtype=np.int64)
    records = plan.order((starts[:, None] + np.arange(6400)).reshape(-1))
    labels = records * 10 // n
    assert mixing(labels, 64, 10)["dispersion"] <= 1.1
    assert mixing(labels, 6400, 10)["dispersion"] <= 2
    per_batch = (records // (n // shards)).reshape(-1, 64)
    assert np.mean([len(np.unique(b)) for b in per_batch]) >= 60
    assert plan.starts.nbytes < 1 << 20  # O(shards): the order itself is never stored


def test_mixing_metric():
    assert mixing(np.repeat(np.arange(10), 64), 64, 10)["distinct"] == 1  # sorted
    sorted_d = mixing(np.repeat(np.arange(10), 6400), 64, 10)["dispersion"]
    assert sorted_d == pytest.approx(64)  # one class per batch: D = batch size
    with pytest.raises(ValueError, match="at least one batch"):
        mixing(np.arange(5), 64)


@pytest.mark.parametrize(
    ("counts", "block", "window"),
    [
        ([1], 1, 1),
        ([5], 3, 2),
        ([7, 0, 3], 2, 1),
        ([100] * 11, 0, 8192),
        ([4097, 12, 999], 64, 7),
        ([3000] * 7, 3, 5),
        ([65537], 1, 2**16 + 1),  # a window past 2^16 records: wider networks
        ([10], 16, 4),  # fewer records than a block: only the tail
    ],
)
def test_the_c_plan_order_is_the_numpy_one(counts, block, window):
    """``EpochPlan.order`` in C (``recordkit/native/order.c``) equals its NumPy reference."""
    _need_native()
    for seed, epoch in ((0, 0), (11, 3)):
        options = PlanOptions(shuffle=True, seed=seed, block_records=block, window_blocks=window)
        plan = EpochPlan(np.array(counts), options, epoch, avg_record_bytes=100)
        g = np.arange(plan.total)
        got = plan.order(g)
        assert np.array_equal(got, plan._order_numpy(g))
        assert np.array_equal(np.sort(got), g)
        picks = np.random.default_rng(seed).permutation(plan.total)[: plan.total // 2 + 1]
        assert np.array_equal(plan.order(picks), plan._order_numpy(picks))
