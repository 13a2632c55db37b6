import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from recordkit.reader.plan import EpochPlan, PlanOptions, Split


def _read(plan, split, start=0):
    units = plan.units(split, start)
    pos, lengths = plan.unit_positions(split, list(units))
    shards, recs = plan.resolve(pos)
    rows = list(zip(shards.tolist(), recs.tolist()))
    out, i = [], 0
    for u, n in zip(units, lengths.tolist()):
        out.append((u, rows[i : i + n]))
        i += n
    return out


def _rank_stream(plan, rank, world, workers, start=0):
    """What a DataLoader yields for one rank: round-robin over workers, in unit order."""
    per_worker = [_read(plan, Split(rank, world, w, workers), start) for w in range(workers)]
    merged = sorted((u, rows) for stream in per_worker for u, rows in stream)
    return [rows for _, rows in merged]


counts_st = st.lists(st.integers(0, 40), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    counts=counts_st,
    shuffle=st.booleans(),
    batch=st.sampled_from([None, 1, 3, 8]),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    block=st.sampled_from([0, 1, 4, 16]),
    seed=st.integers(0, 2**32),
)
def test_every_record_exactly_once(counts, shuffle, batch, world, workers, block, seed):
    total = sum(counts)
    opts = PlanOptions(
        shuffle=shuffle, seed=seed, block_records=block, window_blocks=2, batch_size=batch
    )
    plan = EpochPlan(np.array(counts), opts, epoch=3)
    seen = []
    for rank in range(world):
        for w in range(workers):
            for _, rows in _read(plan, Split(rank, world, w, workers)):
                seen.extend(rows)
                assert 0 < len(rows) <= (batch or 1)
    assert sorted(seen) == sorted((s, r) for s, c in enumerate(counts) for r in range(c))
    assert len(seen) == total


@settings(max_examples=40, deadline=None)
@given(
    counts=counts_st,
    batch=st.sampled_from([1, 3, 8]),
    world=st.integers(1, 4),
    shuffle=st.booleans(),
)
def test_drop_last_gives_equal_full_batches(counts, batch, world, shuffle):
    opts = PlanOptions(shuffle=shuffle, batch_size=batch, drop_last=True, block_records=4)
    plan = EpochPlan(np.array(counts), opts, epoch=0)
    streams = [_rank_stream(plan, r, world, 2) for r in range(world)]
    assert len({len(s) for s in streams}) == 1
    assert all(len(b) == batch for s in streams for b in s)
    seen = [row for s in streams for b in s for row in b]
    assert len(seen) == len(set(seen)) == (sum(counts) // (world * batch)) * world * batch


@settings(max_examples=40, deadline=None)
@given(
    counts=counts_st,
    batch=st.sampled_from([None, 2, 5]),
    workers=st.integers(1, 4),
    shuffle=st.booleans(),
)
def test_stream_does_not_depend_on_workers(counts, batch, workers, shuffle):
    plan = EpochPlan(np.array(counts), PlanOptions(shuffle=shuffle, batch_size=batch, seed=5), 1)
    assert _rank_stream(plan, 0, 1, workers) == _rank_stream(plan, 0, 1, 1)


@settings(max_examples=40, deadline=None)
@given(
    counts=counts_st, batch=st.sampled_from([None, 2, 5]), workers=st.integers(1, 3), data=st.data()
)
def test_resume_continues_exactly(counts, batch, workers, data):
    plan = EpochPlan(np.array(counts), PlanOptions(shuffle=True, batch_size=batch, seed=9), 2)
    full = _rank_stream(plan, 0, 1, workers)
    k = data.draw(st.integers(0, len(full)))
    assert full[:k] + _rank_stream(plan, 0, 1, workers, start=k) == full


def test_deterministic_and_epochs_differ():
    counts = np.array([100, 50, 75, 10])
    a = EpochPlan(counts, PlanOptions(shuffle=True, seed=1), 0)
    b = EpochPlan(counts, PlanOptions(shuffle=True, seed=1), 0)
    c = EpochPlan(counts, PlanOptions(shuffle=True, seed=1), 1)
    d = EpochPlan(counts, PlanOptions(shuffle=True, seed=2), 0)
    s = Split()
    order = [_read(p, s) for p in (a, b, c, d)]
    assert order[0] == order[1]
    assert order[0] != order[2] and order[0] != order[3]
    plain = _read(EpochPlan(counts, PlanOptions(), 0), s)
    assert [r for _, rows in plain for r in rows] == [
        (sh, r) for sh, c in enumerate(counts) for r in range(c)
    ]


def test_shuffle_reads_whole_blocks_within_a_window():
    counts = np.array([1000] * 4)
    plan = EpochPlan(counts, PlanOptions(shuffle=True, block_records=50, window_blocks=10), 0)
    rows = [r for _, rows in _read(plan, Split()) for r in rows]
    # Each window of 10 blocks (500 positions) reads exactly 10 blocks of 50 consecutive
    # records of one shard each, in an order mixed over the whole window.
    for w in range(0, len(rows), 500):
        window = rows[w : w + 500]
        blocks = {(s, r // 50) for s, r in window}
        assert len(blocks) == 10
        assert len({s for s, _ in window[:20]}) > 1  # mixed, not one block after another


def test_global_order_does_not_depend_on_world_size():
    """Elastic: the same global batches at any world size that shares them."""
    counts = np.array([37, 0, 81, 12, 64])
    glob = 12

    def global_batches(world):
        plan = EpochPlan(counts, PlanOptions(shuffle=True, seed=4, batch_size=glob // world), 2)
        streams = [_rank_stream(plan, r, world, 1) for r in range(world)]
        depth = max(len(s) for s in streams)
        return [[row for s in streams if t < len(s) for row in s[t]] for t in range(depth)]

    one = global_batches(1)
    assert global_batches(2) == global_batches(3) == global_batches(4) == one
    assert sorted(r for b in one for r in b) == sorted(
        (s, r) for s, c in enumerate(counts) for r in range(c)
    )


@settings(max_examples=60, deadline=None)
@given(
    counts=counts_st,
    shuffle=st.booleans(),
    batch=st.sampled_from([None, 1, 3, 8]),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    block=st.sampled_from([0, 1, 4, 16]),
    seed=st.integers(0, 2**32),
)
def test_last_units_cover_the_records_read(counts, shuffle, batch, world, drop_last, block, seed):
    """A cache reader lets a shard go after ``last_units``: never before its last record."""
    options = PlanOptions(
        shuffle=shuffle,
        seed=seed,
        block_records=block,
        window_blocks=3,
        batch_size=batch,
        drop_last=drop_last,
    )
    plan = EpochPlan(np.array(counts), options, epoch=1)
    for rank in range(world):
        want = np.full(len(counts), -1)
        for unit, rows in _read(plan, Split(rank, world)):
            for shard, _ in rows:
                want[shard] = max(want[shard], unit)
        got = plan.shard_units(rank, world)[1]
        assert (got >= want).all()
        if not shuffle:  # exact up to the global batch: never more than a unit late
            read = want >= 0
            assert (got[read] <= want[read] + 1).all()
