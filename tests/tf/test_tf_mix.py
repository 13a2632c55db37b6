"""recordkit.tf.dataset over several datasets: concatenation, weights, record ranges.

The order is the epoch plan's (the one recordkit.torch reads), checked here against
the plan itself; input pipelines split it exactly; a checkpointed iterator resumes it.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import recordkit as rk
from recordkit.codec import encode_example
from recordkit.errors import SchemaError
from recordkit.format import frame
from recordkit.reader import CacheOptions, ReadOptions
from recordkit.reader.mix import _quotas, make_mix, open_sources
from recordkit.reader.plan import EpochPlan, PlanOptions, Split

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf

SCHEMA = rk.Schema(src=rk.Int64(), idx=rk.Int64())
SIZES = (120, 30, 17)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfmix")
    out = []
    for s, n in enumerate(SIZES[:2]):
        with rk.Writer(root / f"s{s}", SCHEMA, max_records=25) as w:
            for i in range(n):
                w.write({"src": s, "idx": i})
        out.append(str(root / f"s{s}"))
    foreign = root / "foreign"  # no manifest: the schema is inferred, as for one path
    foreign.mkdir()
    with open(foreign / "part-0.tfrecord", "wb") as f:
        for i in range(SIZES[2]):
            f.write(frame(encode_example({"src": ("int64", [2]), "idx": ("int64", [i])})))
    out.append(str(foreign))
    return out


def _pairs(ds):
    out = []
    for b in ds:
        out += zip(np.atleast_1d(b["src"].numpy()).tolist(), np.atleast_1d(b["idx"].numpy()))
    return [(int(s), int(i)) for s, i in out]


def _plan_pairs(paths, epoch, split=None, **kw):
    """What the epoch plan says the stream is, as (src, idx)."""
    split = split or Split()
    shards = open_sources(paths)
    mix = make_mix(
        shards,
        records=kw.pop("records", None),
        weights=kw.pop("weights", None),
        epoch_records=kw.pop("epoch_records", None),
    )
    plan = EpochPlan(shards.counts, PlanOptions(mix=mix, **kw), epoch)
    positions, _ = plan.unit_positions(split, plan.units(split))
    shard, rec = plan.resolve(positions)
    src = np.searchsorted(np.array(shards.bounds), shard, side="right") - 1
    within = np.concatenate(([0], np.cumsum(shards.counts)))[shard] - np.array(
        [np.concatenate(([0], np.cumsum(shards.counts)))[shards.bounds[s]] for s in src]
    )
    return list(zip(src.tolist(), (within + rec).tolist()))


def test_list_is_a_concatenation(paths):
    got = _pairs(rtf.dataset(paths, batch_size=10, shuffle=True, seed=3))
    want = [(s, i) for s, n in enumerate(SIZES) for i in range(n)]
    assert sorted(got) == want
    assert got == _plan_pairs(paths, 0, shuffle=True, seed=3, batch_size=10)
    ds = rtf.dataset(paths, batch_size=10)
    assert len(ds) == -(-sum(SIZES) // 10)
    assert _pairs(ds) == want


def test_weights_follow_the_plan_every_epoch(paths):
    weights, total = (1, 1, 2), 400
    ds = rtf.dataset(
        paths,
        batch_size=16,
        shuffle=True,
        seed=5,
        epochs=2,
        options=ReadOptions(weights=weights, epoch_records=total),
    )
    got = _pairs(ds)
    assert len(ds) == 2 * 25
    opts = dict(shuffle=True, seed=5, batch_size=16, weights=weights, epoch_records=total)
    assert got == _plan_pairs(paths, 0, **opts) + _plan_pairs(paths, 1, **opts)
    by_src = collections.Counter(s for s, _ in got[:total])
    assert [by_src[s] for s in range(3)] == _quotas(total, weights)


def test_input_pipelines_split_the_mix_exactly(paths):
    opts = dict(batch_size=4, shuffle=True, seed=1, weights=[2, 1, 1], epoch_records=203)
    streams = []
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i)
        read = ReadOptions(weights=opts["weights"], epoch_records=opts["epoch_records"])
        flat = {k: v for k, v in opts.items() if k not in ("weights", "epoch_records")}
        streams.append(_pairs(rtf.dataset(paths, input_context=ctx, **flat, options=read)))
        assert streams[-1] == _plan_pairs(paths, 0, Split(rank=i, world_size=3), **opts)
    assert sum(len(s) for s in streams) == 203


def test_checkpoint_resumes_a_weighted_mix(paths, tmp_path):
    read = ReadOptions(weights=[1, 1, 1])
    opts = dict(batch_size=8, shuffle=True, seed=2, epochs=2, options=read)
    full = _pairs(rtf.dataset(paths, **opts))
    it = iter(rtf.dataset(paths, **opts))
    head = _pairs([next(it) for _ in range(9)])
    ckpt = tf.train.Checkpoint(iterator=it)
    saved = ckpt.write(str(tmp_path / "ckpt"))
    it2 = iter(rtf.dataset(paths, **opts))
    tf.train.Checkpoint(iterator=it2).read(saved).assert_consumed()
    assert head + _pairs(it2) == full


def test_record_ranges(paths):
    got = _pairs(rtf.dataset(paths[0], records="[:25%]", shuffle=True, batch_size=7))
    assert sorted(got) == [(0, i) for i in range(30)] and got != sorted(got)
    got = _pairs(rtf.dataset(paths, records=[slice(0, 3), None, "[-2:]"], batch_size=7))
    assert got == [(0, 0), (0, 1), (0, 2), *((1, i) for i in range(30)), (2, 15), (2, 16)]
    with pytest.raises(ValueError, match="one range per dataset"):
        rtf.dataset(paths, records="[:10%]")


def test_schemas_must_agree(paths, tmp_path):
    other = tmp_path / "other"
    with rk.Writer(other, rk.Schema(src=rk.Int64(), idx=rk.Bytes()), max_records=5) as w:
        w.write({"src": 7, "idx": b"x"})
    with pytest.raises(SchemaError, match=rf"feature 'idx'.*{paths[1]}.*{other}"):
        rtf.dataset([paths[1], other])


def test_refused_with_a_cache(paths, tmp_path):
    with pytest.raises(ValueError, match="records= with a shard cache"):
        rtf.dataset(paths[0], records="[:5]", cache=CacheOptions(dir=tmp_path, limit="1MiB"))
