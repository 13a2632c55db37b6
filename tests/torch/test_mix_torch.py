"""RecordDataset over several datasets: concatenation, weights, record ranges.

Every test reads real shards (two recordkit datasets and a folder of foreign
TFRecords without a manifest) and checks which records came, how often, and that
ranks x workers and resumes reproduce the one global sequence exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np
import pytest

import recordkit as rk
from recordkit.codec import encode_example
from recordkit.errors import SchemaError
from recordkit.format import frame
from recordkit.reader import CacheOptions, ReadOptions
from recordkit.reader.mix import _quotas

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

from recordkit.torch import DataLoader, RecordDataset  # noqa: E402

SCHEMA = rk.Schema(src=rk.Int64(), idx=rk.Int64())
SIZES = (300, 40, 25)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    out = []
    for s, n in enumerate(SIZES[:2]):
        with rk.Writer(root / f"s{s}", SCHEMA, max_records=50) as w:
            for i in range(n):
                w.write({"src": s, "idx": i})
        out.append(str(root / f"s{s}"))
    foreign = root / "foreign"  # TFRecords without a manifest: read as the single path does
    foreign.mkdir()
    for part, ids in enumerate((range(0, 10), range(10, SIZES[2]))):
        with open(foreign / f"part-{part}.tfrecord", "wb") as f:
            for i in ids:
                f.write(frame(encode_example({"src": ("int64", [2]), "idx": ("int64", [i])})))
    out.append(str(foreign))
    return out


def _pairs(batches):
    return [(int(s), int(i)) for b in batches for s, i in zip(b["src"], b["idx"])]


def test_list_is_a_concatenation_shuffled_together(paths):
    ds = RecordDataset(paths, batch_size=16, shuffle=True, seed=1)
    batches = list(ds)
    got = _pairs(batches)
    want = [(s, i) for s, n in enumerate(SIZES) for i in range(n)]
    assert sorted(got) == want and len(got) == len(want) == sum(SIZES)
    assert len(ds) == len(batches) == -(-sum(SIZES) // 16)
    assert max(len({s for s, _ in _pairs([b])}) for b in batches[:5]) > 1  # mixed
    # without shuffle: the datasets one after the other, in the order given
    assert _pairs(RecordDataset(paths, batch_size=16)) == want


def test_weights_realise_their_proportions(paths):
    weights, total = (1.0, 2.0, 1.0), 1000
    ds = RecordDataset(
        paths,
        batch_size=10,
        shuffle=True,
        options=ReadOptions(weights=weights, epoch_records=total),
    )
    assert len(ds) == 100
    for epoch in range(2):
        got = _pairs(ds)
        assert ds.epoch == epoch + 1
        by_src = collections.Counter(s for s, _ in got)
        quotas = _quotas(total, weights)
        assert [by_src[s] for s in range(3)] == quotas
        for s, size in enumerate(SIZES):
            q, r = divmod(quotas[s], size)
            times = collections.Counter(collections.Counter(p for p in got if p[0] == s).values())
            assert set(times) <= {q, q + 1} and sum(times.values()) == (size if q else r)


def test_ranks_and_workers_read_one_global_sequence(paths):
    """World 2 x 2 workers, batches of 8, interleaved by global batch, equal one process
    reading global batches of 16: the same mixed sequence, nothing missing or twice."""
    read = ReadOptions(weights=[3, 1, 1], epoch_records=333, num_threads=1)
    opts = dict(shuffle=True, seed=4)
    whole = [b for b in RecordDataset(paths, batch_size=16, **opts, options=read)]
    ranks = []
    for rank in range(2):
        ds = RecordDataset(
            paths,
            batch_size=8,
            **opts,
            options=dataclasses.replace(read, rank=rank, world_size=2),
        )
        ranks.append(list(DataLoader(ds, num_workers=2)))
    merged = []
    for g in range(len(whole)):
        for rank in range(2):
            if g < len(ranks[rank]):
                merged.append(ranks[rank][g])
    assert _pairs(merged) == _pairs(whole)
    assert len(_pairs(whole)) == 333


def test_resume_mid_epoch_equals_an_uninterrupted_run(paths):
    opts = dict(
        batch_size=8, shuffle=True, seed=2, options=ReadOptions(weights=[1, 1, 1], num_threads=1)
    )
    full = _pairs(RecordDataset(paths, **opts))
    ds = RecordDataset(paths, **opts)
    it = iter(ds)
    head = _pairs([next(it) for _ in range(7)])
    state = json.loads(json.dumps(ds.state_dict()))
    it.close()
    again = RecordDataset(paths, **opts)
    again.load_state_dict(state)
    assert head + _pairs(again) == full
    # ... and through DataLoader workers
    loader = DataLoader(RecordDataset(paths, **opts), num_workers=2)
    it = iter(loader)
    head = _pairs([next(it) for _ in range(5)])
    state = loader.state_dict()
    del it
    loader2 = DataLoader(RecordDataset(paths, **opts), num_workers=2)
    loader2.load_state_dict(state)
    assert head + _pairs(loader2) == full


def test_resume_refuses_other_weights_or_ranges(paths):
    ds = RecordDataset(paths, batch_size=8, options=ReadOptions(weights=[1, 1, 1]))
    state = ds.state_dict()
    other = RecordDataset(paths, batch_size=8, options=ReadOptions(weights=[1, 2, 1]))
    with pytest.raises(ValueError, match="cannot resume: mix was"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot resume: mix was"):
        RecordDataset(paths[0], batch_size=8, records="[:50]").load_state_dict(
            RecordDataset(paths[0], batch_size=8).state_dict()
        )


def test_stateful_dataloader_resumes_a_weighted_mix(paths):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    opts = dict(
        batch_size=8, shuffle=True, seed=6, options=ReadOptions(weights=[2, 1, 1], num_threads=1)
    )

    def loader():
        return stateful.StatefulDataLoader(
            RecordDataset(paths, **opts), batch_size=None, num_workers=2
        )

    full = _pairs(loader())
    first = loader()
    it = iter(first)
    head = _pairs([next(it) for _ in range(9)])
    state = first.state_dict()
    del it
    second = loader()
    second.load_state_dict(state)
    assert head + _pairs(second) == full


def test_record_ranges(paths):
    ds = RecordDataset(paths[0], batch_size=7, shuffle=True, records="[:10%]")
    for _ in range(2):  # the same records every epoch, shuffled among themselves
        got = _pairs(ds)
        assert sorted(got) == [(0, i) for i in range(30)] and got != sorted(got)
    assert len(RecordDataset(paths[0], records=slice(100, 110))) == 10
    per = RecordDataset(paths, batch_size=64, records=["[-5:]", slice(0, 2), None])
    assert _pairs(per) == [
        *((0, i) for i in range(295, 300)),
        (1, 0),
        (1, 1),
        *((2, i) for i in range(25)),
    ]
    with pytest.raises(ValueError, match="one range per dataset"):
        RecordDataset(paths, records="[:10%]")
    with pytest.raises(ValueError, match=r"split='train'.* not a tensorflow-datasets folder"):
        RecordDataset(paths[0], records="train[:10%]")


def test_schemas_must_agree(paths, tmp_path):
    other = tmp_path / "other"
    with rk.Writer(other, rk.Schema(src=rk.Int64(), idx=rk.Float32()), max_records=50) as w:
        w.write({"src": 9, "idx": 1.5})
    with pytest.raises(SchemaError, match=rf"feature 'idx'.*{paths[0]}.*{other}"):
        RecordDataset([paths[0], other])
    # reading only the features they agree on is fine
    got = RecordDataset([paths[1], other], columns=["src"], batch_size=50)
    assert sorted(int(x) for b in got for x in b["src"]) == [1] * 40 + [9]


def test_refused_combinations(paths, tmp_path):
    with pytest.raises(ValueError, match="a list of datasets, weights= with a shard cache"):
        RecordDataset(
            paths,
            cache=CacheOptions(dir=tmp_path, limit="1MiB"),
            options=ReadOptions(weights=[1, 1, 1]),
        )
    with pytest.raises(TypeError, match="list of them"):
        RecordDataset({"a": paths[0]})
    with pytest.raises(ValueError, match="empty list"):
        RecordDataset([])


def test_reader_process_reads_the_same_mix(paths):
    read = ReadOptions(weights=[1, 1, 1], num_threads=1)
    opts = dict(batch_size=8, shuffle=True, seed=8)
    want = _pairs(RecordDataset(paths, **opts, options=read))
    process = dataclasses.replace(read, reader_process=True)
    assert _pairs(RecordDataset(paths, **opts, options=process)) == want


def test_single_list_is_the_dataset(paths):
    a = _pairs(RecordDataset([paths[0]], batch_size=9, shuffle=True))
    assert a == _pairs(RecordDataset(paths[0], batch_size=9, shuffle=True))
    assert np.unique(np.array(a)[:, 1]).size == 300
