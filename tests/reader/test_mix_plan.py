"""Record ranges and weighted mixing in the epoch plan (no framework needed).

The plan is where exactness lives: every test here checks the realised epoch
(which records, how often, in which order) against what the docs promise.
"""

from __future__ import annotations

import collections
import tracemalloc

import numpy as np
import pytest

from recordkit.reader.mix import MIX_BLOCK, Mix, _quotas, make_mix
from recordkit.reader.plan import EpochPlan, PlanOptions, Split
from recordkit.reader.select import parse_records, take_split


@pytest.mark.parametrize(
    ("spec", "n", "want"),
    [
        (None, 50, (0, 50)),
        (slice(0, 10), 50, (0, 10)),
        (slice(-5, None), 50, (45, 50)),
        (slice(40, 100), 50, (40, 50)),
        (slice(30, 10), 50, (30, 30)),
        ("[:10%]", 1000, (0, 100)),
        ("[10%:20%]", 1000, (100, 200)),
        ("[-10%:]", 1000, (900, 1000)),
        ("[0.5%:1%]", 1000, (5, 10)),
        ("[1000:2000]", 5000, (1000, 2000)),
        ("[-100:]", 5000, (4900, 5000)),
        ("[:]", 7, (0, 7)),
        ("[:15%]", 10, (0, 2)),  # 1.5 rounds to even: 2
        ("[:25%]", 10, (0, 2)),  # 2.5 rounds to even: 2 (tensorflow-datasets' rounding)
        ("[:35%]", 10, (0, 4)),
    ],
)
def test_record_ranges(spec, n, want):
    assert parse_records(spec, n) == want


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (slice(0, 10, 2), "no step"),
        (slice(0.5, 10), "integers"),
        ("[:10", "expected"),
        ("[a:b]", "not a record number"),
        ("[:150%]", r"\[-100%, 100%\]"),
        ("[1.5:]", "whole"),
        ("train[:10%]", "names split 'train'"),
    ],
)
def test_bad_record_ranges(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_records(spec, 100)


def test_records_type_error():
    with pytest.raises(TypeError, match="records must be"):
        parse_records(10, 100)


def test_split_names_move_to_split():
    assert take_split(None, "train[:10%]") == ("train", "[:10%]")
    assert take_split("train[10:20]", None) == ("train", "[10:20]")
    assert take_split("train", "[:5]") == ("train", "[:5]")
    assert take_split(None, slice(0, 3)) == (None, slice(0, 3))
    with pytest.raises(ValueError, match="names split 'train', split='test'"):
        take_split("test", "train[:1%]")


def test_quotas_are_exact_largest_remainder():
    assert _quotas(10, [1, 1, 1]) == [4, 3, 3]  # ties go to the earlier source
    assert _quotas(1000, [0.2, 0.3, 0.5]) == [200, 300, 500]
    assert sum(_quotas(999_999_937, [0.1, 0.7, 0.2, 1e-9])) == 999_999_937
    assert _quotas(7, [0, 1]) == [0, 7]


COUNTS = np.array([100, 50, 30, 7, 13, 60])  # sources: shards 0-1 (150), 2-4 (50), 5 (60)
BOUNDS = (0, 2, 5, 6)
STARTS = np.concatenate(([0], np.cumsum(COUNTS)))


def _mix(weights, total, ranges=((0, 150), (0, 50), (0, 60))):
    return Mix(BOUNDS, tuple(ranges), tuple(float(w) for w in weights), total)


def _source(shard):
    return np.searchsorted(np.array(BOUNDS), shard, side="right") - 1


def _epoch(options, epoch):
    plan = EpochPlan(COUNTS, options, epoch)
    shard, rec = plan.resolve(np.arange(plan.total))
    assert ((rec >= 0) & (rec < COUNTS[shard])).all()
    return plan, shard, rec


@pytest.mark.parametrize("shuffle", [True, False])
def test_weighted_epoch_proportions_and_repeats(shuffle):
    """Each source gives its largest-remainder share; each of its records comes q or q+1
    times (q = share // size), never more."""
    weights, total = (2.0, 5.0, 1.0), 1001
    quotas = _quotas(total, weights)
    opts = PlanOptions(shuffle=shuffle, seed=7, batch_size=8, mix=_mix(weights, total))
    for epoch in range(3):
        plan, shard, rec = _epoch(opts, epoch)
        assert plan.total == total
        src = _source(shard)
        assert np.bincount(src, minlength=3).tolist() == quotas
        seen = collections.Counter(zip(shard.tolist(), rec.tolist()))
        for s, size in enumerate((150, 50, 60)):
            q, r = divmod(quotas[s], size)
            times = collections.Counter(v for (sh, _), v in seen.items() if _source(sh) == s)
            never = size - sum(times.values())
            if r:
                assert times == {q + 1: r, **({q: size - r} if q else {})}
                assert never == (size - r if not q else 0)
            else:
                assert times == {q: size}
        # proportions hold in every stretch of the epoch (within a record per source)
        for lo in range(0, total - 100, 100):
            got = np.bincount(src[lo : lo + 100], minlength=3)
            want = np.array(quotas) * 100 / total
            assert (np.abs(got - want) <= 2 + (100 if shuffle else 0)).all()


def test_unshuffled_interleave_is_smooth():
    opts = PlanOptions(mix=_mix((1, 1, 2), 400))
    _, shard, rec = _epoch(opts, 0)
    src = _source(shard)
    for lo in range(0, 400, 8):  # every 8 positions: 2, 2 and 4 (to a record)
        counts = np.bincount(src[lo : lo + 8], minlength=3)
        assert (np.abs(counts - [2, 2, 4]) <= 1).all()
    # without shuffle each source comes in its own dataset order, pass after pass
    quotas = _quotas(400, (1, 1, 2))
    for s, (first, size) in enumerate(((0, 150), (150, 50), (200, 60))):
        g = STARTS[shard[src == s]] + rec[src == s]
        assert g.tolist() == (first + np.arange(quotas[s]) % size).tolist()
    # ... and the next epoch reads on where the rotation stopped (epoch 0 took 0..99)
    _, shard, rec = _epoch(opts, 1)
    g = (STARTS[shard] + rec)[_source(shard) == 0]
    assert g.tolist() == [*range(100, 150), *range(0, 50)]


def test_downsampled_source_rotates_through_its_records():
    """A source whose share is smaller than it gives different records each epoch and
    goes through all of them before repeating one (within a rotation cycle)."""
    opts = PlanOptions(shuffle=True, seed=1, mix=_mix((1, 0, 0), 30, ((0, 150), (0, 50), (0, 60))))
    seen: list[int] = []
    for epoch in range(5):  # 5 x 30 = 150: one cycle of the rotation
        _, shard, rec = _epoch(opts, epoch)
        got = (STARTS[shard] + rec).tolist()
        assert len(set(got)) == 30
        seen += got
    assert sorted(seen) == list(range(150))
    # zero weight: that source is never read
    _, shard, _ = _epoch(opts, 0)
    assert set(_source(shard).tolist()) == {0}


def test_weighted_order_is_deterministic_and_new_per_epoch():
    opts = PlanOptions(shuffle=True, seed=5, mix=_mix((1, 1, 1), 300))
    a = _epoch(opts, 0)[2]
    assert (a == _epoch(opts, 0)[2]).all()
    assert not (a == _epoch(opts, 1)[2]).all()
    other = PlanOptions(shuffle=True, seed=6, mix=_mix((1, 1, 1), 300))
    assert not (a == _epoch(other, 0)[2]).all()


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch", [None, 7])
def test_weighted_split_is_exact_across_ranks_and_workers(drop_last, batch):
    """Every rank x worker reads a disjoint slice of the one global mixed sequence."""
    total = 2 * MIX_BLOCK + 123  # several mix blocks, a partial last one
    opts = PlanOptions(
        shuffle=True, seed=2, batch_size=batch, drop_last=drop_last, mix=_mix((3, 1, 1), total)
    )
    plan = EpochPlan(COUNTS, opts, 4)
    world, workers = 3, 2
    got = []
    for rank in range(world):
        for worker in range(workers):
            split = Split(rank=rank, world_size=world, worker=worker, num_workers=workers)
            positions, _ = plan.unit_positions(split, plan.units(split))
            got.append(positions)
    allpos = np.sort(np.concatenate(got))
    glob = (batch or 1) * world
    expect = total // glob * glob if drop_last else total
    assert allpos.tolist() == list(range(expect))
    # the same positions resolve to the same records whoever reads them
    shard, rec = plan.resolve(allpos)
    shard2, rec2 = EpochPlan(COUNTS, opts, 4).resolve(allpos[::-1])
    assert (shard == shard2[::-1]).all() and (rec == rec2[::-1]).all()


def test_record_ranges_in_the_plan():
    """A range reads exactly its records, the same ones every epoch, shuffled."""
    mix = Mix(BOUNDS, ((20, 140), (0, 50), (55, 60)))
    for epoch in range(2):
        _, shard, rec = _epoch(PlanOptions(shuffle=True, seed=3, mix=mix), epoch)
        got = sorted((STARTS[shard] + rec).tolist())
        want = [*range(20, 140), *range(150, 200), *range(255, 260)]
        assert got == want
    _, shard, rec = _epoch(PlanOptions(mix=mix), 0)  # unshuffled: in order
    assert (STARTS[shard] + rec).tolist() == want


def test_make_mix_validates():
    class Fake:  # the parts of a CombinedShards make_mix reads
        bounds, names, counts, root = BOUNDS, ("a", "b", "c"), COUNTS, "/x"

        def __len__(self):
            return 6

    fake = Fake()
    assert make_mix(fake) is None
    assert make_mix(fake, records=[None, "[:]", slice(None)]) is None
    with pytest.raises(ValueError, match="one range per dataset"):
        make_mix(fake, records="[:10%]")
    with pytest.raises(ValueError, match="2 ranges for 3 datasets"):
        make_mix(fake, records=["[:1]", None])
    with pytest.raises(ValueError, match="2 weights for 3 datasets"):
        make_mix(fake, weights=[1, 2])
    with pytest.raises(ValueError, match="finite, >= 0"):
        make_mix(fake, weights=[1, -1, 1])
    with pytest.raises(ValueError, match="not all 0"):
        make_mix(fake, weights=[0, 0, 0])
    with pytest.raises(ValueError, match="b has no records"):
        make_mix(fake, weights=[1, 1, 1], records=[None, "[:0]", None])
    with pytest.raises(ValueError, match="epoch_records must be >= 1"):
        make_mix(fake, epoch_records=0)
    natural = make_mix(fake, epoch_records=520)
    assert natural is not None and _quotas(520, natural.weights) == [300, 100, 120]
    assert make_mix(fake, weights=[1, 1, 1]).epoch_records == 260


def test_billion_record_mix_is_computed_not_stored():
    """At a billion records the plan holds O(shards) and resolves positions lazily."""
    shards = 10_000
    counts = np.full(shards, 100_000, dtype=np.int64)  # 1e9 records
    bounds = (0, 6000, 9999, shards)
    mix = Mix(bounds, ((0, 600_000_000), (0, 399_900_000), (0, 100_000)), (0.5, 0.3, 0.2), None)
    mix = Mix(bounds, mix.ranges, mix.weights, 3_000_000_000)  # 3e9 positions per epoch
    opts = PlanOptions(shuffle=True, seed=9, batch_size=256, mix=mix)
    tracemalloc.start()
    plan = EpochPlan(counts, opts, 2)
    split = Split(rank=5, world_size=8)
    units = plan.units(split)
    positions, _ = plan.unit_positions(split, units[1_000_000:1_000_040])
    shard, rec = plan.resolve(positions)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20  # no per-record table (that would be gigabytes)
    assert len(shard) == 40 * 256 and ((rec >= 0) & (rec < 100_000)).all()
    assert plan.total == 3_000_000_000
    src = np.searchsorted(np.array(bounds), shard, side="right") - 1
    share = np.bincount(src, minlength=3) / len(src)
    assert np.allclose(share, [0.5, 0.3, 0.2], atol=0.05)
    # past 2**32 positions the apportionment is exact in Python's integers too
    tail = np.arange(plan.total - 5000, plan.total, dtype=np.int64)
    src_tail = np.searchsorted(np.array(bounds), plan.resolve(tail)[0], side="right") - 1
    assert np.bincount(src_tail, minlength=3).sum() == 5000
