"""recordkit.tf reads the epoch plan: resumable through tf.train.Checkpoint, seed-only order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import recordkit as rk
from recordkit import Int64, Schema, Tensor
from recordkit.reader import ReadOptions
from recordkit.reader.order import mixing

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf

RECORDS = 130


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """130 records, id k and a variable-shape tensor, in 10 shards of 13."""
    root = tmp_path_factory.mktemp("tfplan") / "d"
    schema = Schema(id=Int64(), x=Tensor("float32", (3,)), r=Tensor("int32", (None,)))
    with rk.Writer(root, schema, max_records=13) as w:
        for k in range(RECORDS):
            w.write(
                {"id": k, "x": np.full(3, k, np.float32), "r": np.arange(k % 4, dtype=np.int32)}
            )
    return root


def _ids(ds) -> list[int]:
    return [int(i) for b in ds for i in np.atleast_1d(b["id"].numpy())]


# The same pipeline in both processes; the columns pick the vectorised path
# ("id,x") or the per-record one with a ragged feature ("id,r").
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    import recordkit.tf as rtf

    mode, root, ckdir, columns, global_seed = sys.argv[1:6]
    cuts = [int(c) for c in sys.argv[6:]]
    tf.random.set_seed(int(global_seed))  # must not matter
    ds = rtf.dataset(root, batch_size=8, shuffle=True, seed=5, epochs=3,
                     columns=columns.split(","))
    ids = lambda b: [int(i) for i in b["id"].numpy()]
    out = {}
    if mode == "save":  # the uninterrupted stream, a checkpoint after each cut
        it = iter(ds)
        ckpt = tf.train.Checkpoint(iterator=it)
        stream = []
        for n in range(len(ds)):
            if n in cuts:
                ckpt.write(f"{ckdir}/at{n}/ck")
            stream.append(ids(next(it)))
        out["stream"] = stream
    else:  # each checkpoint restored into a fresh iterator, the rest read to the end
        for n in cuts:
            it = iter(ds)
            tf.train.Checkpoint(iterator=it).read(f"{ckdir}/at{n}/ck").assert_consumed()
            out[str(n)] = [ids(b) for b in it]
    print("RESULT" + json.dumps(out))
    """
)


def _run(*args: object) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("columns", ["id,x", "id,r"])
def test_checkpoint_resumes_the_same_stream_in_a_new_process(data, tmp_path, columns):
    # 17 batches an epoch (16 of 8, one of 2): 5 is mid-epoch 0, 17 the first batch
    # of epoch 1, 16 the short last batch of epoch 0, 40 mid-epoch 2.
    cuts = [5, 16, 17, 40]
    full = _run("save", data, tmp_path, columns, 1, *cuts)["stream"]
    assert len(full) == 51 and [len(b) for b in full[:17]] == [8] * 16 + [2]
    epochs = [[i for b in full[e * 17 : (e + 1) * 17] for i in b] for e in range(3)]
    assert all(sorted(e) == list(range(RECORDS)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    resumed = _run("load", data, tmp_path, columns, 999, *cuts)  # another global seed
    for n in cuts:
        assert resumed[str(n)] == full[n:], f"resumed after {n} batches"


def test_order_does_not_depend_on_tensorflows_seed(data):
    streams = []
    for global_seed in (None, 1234, 7):
        if global_seed is not None:
            tf.random.set_seed(global_seed)
        ds = rtf.dataset(data, batch_size=8, shuffle=True, seed=11, columns=["id"], epochs=2)
        streams.append(_ids(ds))
    assert streams[0] == streams[1] == streams[2]
    assert sorted(streams[0]) == sorted(list(range(RECORDS)) * 2)


@pytest.mark.parametrize("batch_size", [4, None])
def test_drop_remainder_gives_every_pipeline_the_same_batches(data, batch_size):
    per = []
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i)
        ds = rtf.dataset(
            data,
            batch_size=batch_size,
            shuffle=True,
            drop_last=True,
            input_context=ctx,
            columns=["id"],
        )
        batches = [np.atleast_1d(b["id"].numpy()).tolist() for b in ds]
        assert len(ds) == len(batches)
        per.append(batches)
    unit = batch_size or 1
    kept = RECORDS // (3 * unit) * (3 * unit)  # the shuffled tail of 130 % 12 = 10 is dropped
    assert [len(b) for b in per] == [kept // (3 * unit)] * 3
    assert all(len(x) == unit for b in per for x in b)
    seen = [i for b in per for x in b for i in x]
    assert len(seen) == len(set(seen)) == kept


def test_pipelines_without_drop_read_every_record_once(data):
    seen, counts = [], []
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i)
        ds = rtf.dataset(data, batch_size=4, input_context=ctx, columns=["id"])
        ids = _ids(ds)
        counts.append(len(ds))
        seen += ids
    assert sorted(seen) == list(range(RECORDS))
    assert max(counts) - min(counts) <= 1


@pytest.mark.timeout(300)
def test_sorted_labels_are_mixed_like_a_uniform_permutation(tmp_path):
    # 100,000 records sorted by label, 10 classes, 11 shards, batch 64.
    n, classes = 100_000, 10
    root = tmp_path / "sorted"
    with rk.Writer(root, Schema(label=Int64()), max_records=-(-n // 11)) as w:
        for k in range(n):
            w.write({"label": k * classes // n})
    assert len(list(root.glob("*.tfrecord"))) == 11
    ds = rtf.dataset(root, batch_size=64, shuffle=True, seed=0)
    labels = np.concatenate([b["label"].numpy() for b in ds])
    assert sorted(labels.tolist()) == sorted(k * classes // n for k in range(n))
    m = mixing(labels, 64, classes)
    assert m["distinct"] >= 9.9 and m["distinct_p1"] >= 9, m
    assert m["dispersion"] <= 1.1, m


def test_a_corrupt_record_names_file_offset_and_record(tmp_path):
    root = tmp_path / "bad"
    with rk.Writer(root, Schema(id=Int64(), s=Tensor("uint8", (64,))), max_records=10) as w:
        for k in range(30):
            w.write({"id": k, "s": np.full(64, k, np.uint8)})
    shard = sorted(root.glob("*.tfrecord"))[1]
    data = bytearray(shard.read_bytes())
    data[-20] ^= 1  # inside the last record's payload
    shard.write_bytes(bytes(data))
    offset = int((shard.parent / (shard.name + ".idx")).read_text().split("\n")[-2].split()[0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="CorruptRecordError") as info:
        _ids(rtf.dataset(root, batch_size=4, shuffle=True))
    assert f"{shard}:{offset}:9" in str(info.value)


@pytest.mark.parametrize("drop", [False, True])
def test_tensorflow_pipelines_read_what_torch_ranks_read(data, drop):
    """One order for every reader: pipeline i of n is rank i of n, epoch for epoch."""
    rkt = pytest.importorskip("recordkit.torch")
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i)
        ds = rtf.dataset(
            data,
            batch_size=4,
            shuffle=True,
            seed=9,
            epoch=2,
            drop_last=drop,
            input_context=ctx,
            columns=["id"],
        )
        torch_ds = rkt.RecordDataset(
            data,
            batch_size=4,
            shuffle=True,
            seed=9,
            drop_last=drop,
            options=ReadOptions(rank=i, world_size=3),
        )
        torch_ds.set_epoch(2)
        ranks = [int(x) for b in torch_ds for x in b["id"]]
        assert _ids(ds) == ranks, f"pipeline {i}"


_MIRRORED = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
    import recordkit.tf as rtf

    root = sys.argv[1]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    mode = tf.distribute.InputReplicationMode.PER_REPLICA
    options = tf.distribute.InputOptions(
        experimental_replication_mode=mode, experimental_fetch_to_device=False
    )
    out = {}
    for drop in (True, False):
        def make(ctx):
            return rtf.dataset(root, batch_size=ctx.get_per_replica_batch_size(96),
                               shuffle=True, drop_last=drop, input_context=ctx)
        seen, steps = [], 0
        for batch in strategy.distribute_datasets_from_function(make, options):
            steps += 1
            for value in strategy.experimental_local_results(batch["id"]):
                seen += value.numpy().tolist()
        out[str(drop)] = [steps, seen]
    print("RESULT" + json.dumps(out))
    """
)


@pytest.mark.timeout(300)
def test_mirrored_strategy_per_replica_drops_only_the_counted_tail(tmp_path):
    """3 replicas, global batch 96, 1,000 records: 10 steps and 40 records dropped, or all."""
    root = tmp_path / "m"
    with rk.Writer(root, Schema(id=Int64()), max_records=97) as w:
        for k in range(1000):
            w.write({"id": k})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", _MIRRORED, str(root)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    out = json.loads(line[len("RESULT") :])
    steps, seen = out["True"]
    assert steps == 10 and len(seen) == len(set(seen)) == 960  # 1000 mod 96 = 40 dropped
    steps, seen = out["False"]
    assert steps == 11 and sorted(seen) == list(range(1000))


def test_tasks_split_into_rows_exactly_and_within_the_map_budget(tmp_path, monkeypatch):
    """Payloads of very different sizes (several rows each, empty ones) come back whole,
    and a task over more shards than the map budget holds one shard at a time."""
    from recordkit.reader.plan import PlanOptions
    from recordkit.reader.shards import open_shards
    from recordkit.tf.tasks import PlanTasks

    root = tmp_path / "sizes"
    rng = np.random.default_rng(0)
    sizes = [0, 1, 5000, 3, 64, 65, 0, 20_000, *rng.integers(0, 300, 192).tolist()]
    with rk.Writer(root, Schema(id=Int64(), b=rk.Bytes()), max_records=5) as w:
        for k, n in enumerate(sizes):
            w.write({"id": k, "b": bytes([k % 251]) * n})
    monkeypatch.setenv("RECORDKIT_MAX_OPEN_SHARDS", "4")
    shards = open_shards(root)
    assert len(shards) == 40 and shards.max_open == 4
    tasks = PlanTasks(shards, PlanOptions(shuffle=True, seed=1, batch_size=8), 0, 1)
    peak = []
    acquire = shards.acquire

    def counted(i):
        shard = acquire(i)
        peak.append(shards.open_count)
        return shard

    monkeypatch.setattr(shards, "acquire", counted)
    seen = []
    for t in range(tasks.tasks):
        buf, starts, lengths = tasks.read(0, t)
        data = buf[0]
        shard, rec = tasks.records(0, t)
        for i in range(len(rec)):
            payload = data[starts[i] : starts[i] + lengths[i]]
            with shards.use(int(shard[i])) as m:
                assert payload == bytes(m.payload(int(rec[i])))
            seen.append(int(shards.schema.decode(payload)["id"]))
    assert sorted(seen) == list(range(len(sizes)))
    assert max(peak) <= 4  # tasks touch up to 8 shards, one held at a time


@pytest.mark.timeout(60)
def test_an_empty_dataset_ends_even_without_an_epoch_count(tmp_path):
    with rk.Writer(tmp_path / "e", Schema(id=Int64())):
        pass
    for epochs in (1, 3, None):
        ds = rtf.dataset(tmp_path / "e", batch_size=4, shuffle=True, epochs=epochs)
        assert len(ds) == 0 and list(ds) == []
