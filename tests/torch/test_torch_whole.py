"""Whole epochs from remote storage (the default through a cache), against real servers.

Budgets smaller than the dataset: every epoch reads every record exactly once in
the plan's order, the budget is never exceeded (checked at every publish), and a
reader killed mid-epoch resumes exactly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from recordkit.cache import CacheFullError, ShardCache
from recordkit.cache.stream import plan_capacity
from recordkit.reader import CacheOptions, ReadOptions
from tests.cache.conftest import BudgetWatch, check_sample, write_dataset
from tests.servers import http_server, s3_server

torch = pytest.importorskip("torch")
rkt = pytest.importorskip("recordkit.torch")

pytestmark = [pytest.mark.torch, pytest.mark.remote, pytest.mark.timeout(180)]

SHARDS, RECORDS, SIZE = 16, 20, 2000
TOTAL = SHARDS * RECORDS


def budget_for(manifest, shards: float) -> int:
    """A budget whose plan holds about ``shards`` shards (indexes included)."""
    per = max(s.bytes for s in manifest.shards) + 2 * RECORDS * 24
    n = len(manifest.shards)
    return int(shards * per) + (max(manifest.bytes, 1) - plan_capacity(manifest.bytes, n))


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        yield server


@pytest.fixture(params=["s3", "http"])
def remote(request, tmp_path_factory):
    """The same dataset on a moto S3 server or a Range HTTP server: (url, cache kwargs, env)."""
    if request.param == "s3":
        server = request.getfixturevalue("s3")
        url = server.bucket() + "/train"
        manifest = write_dataset(
            url, shards=SHARDS, records=RECORDS, size=SIZE, storage_options=server.storage_options
        )
        yield url, {"storage_options": server.storage_options}, server.env, manifest
        return
    root = tmp_path_factory.mktemp("http")
    manifest = write_dataset(root / "train", shards=SHARDS, records=RECORDS, size=SIZE)
    with http_server(root) as http:
        yield http.url + "/train", {}, {}, manifest


def _epoch(ds) -> list[int]:
    ids = []
    for batch in ds:
        ids.extend(batch["i"].tolist())
        for i, x, n in zip(batch["i"].tolist(), batch["x"], batch["x/lengths"].tolist()):
            check_sample({"i": i, "x": x[:n].numpy()})  # ragged: padded, with lengths
    return ids


def test_two_whole_epochs_under_a_budget_of_a_third(remote, tmp_path):
    url, opts, _, manifest = remote
    budget = budget_for(manifest, SHARDS / 3)
    assert budget < manifest.bytes
    watch = BudgetWatch(tmp_path / "cache", budget)
    cache = ShardCache(url, tmp_path / "cache", max_bytes=budget, events=watch, **opts)
    ds = rkt.RecordDataset(
        url, batch_size=8, shuffle=True, seed=1, cache=cache, options=ReadOptions(bytes_as="list")
    )
    assert ds.cache_epochs == "whole" and ds.source.window > 0  # read in shard windows
    assert len(ds) == TOTAL // 8  # the whole dataset, before anything is cached
    orders = []
    for epoch in range(2):
        ids = _epoch(ds)
        assert sorted(ids) == list(range(TOTAL)), f"epoch {epoch}"
        orders.append(ids)
    ds.close()
    assert orders[0] != orders[1]  # a new order each epoch
    assert not watch.over, f"budget exceeded: {watch.over}"
    assert len(watch.published_paths) > SHARDS  # it streamed: shards came, went, came back
    assert len(watch.evicted_paths) >= SHARDS // 2
    assert ds.stats.records == 2 * TOTAL
    assert cache.stream_stats.fetched == len(watch.published_paths)
    # the order is the plan's: a second reader with the same seed reads the same
    again = ShardCache(url, tmp_path / "again", max_bytes=budget, **opts)
    ds2 = rkt.RecordDataset(url, batch_size=8, shuffle=True, seed=1, cache=again)
    assert [i for b in ds2 for i in b["i"].tolist()] == orders[0]
    ds2.close()


def test_a_budget_that_holds_the_dataset_reads_the_local_order(tmp_path):
    root = tmp_path / "remote"
    write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    local = [
        i
        for b in rkt.RecordDataset(root, batch_size=8, shuffle=True, seed=2)
        for i in b["i"].tolist()
    ]
    ds = rkt.RecordDataset(
        root,
        batch_size=8,
        shuffle=True,
        seed=2,
        cache=CacheOptions(dir=tmp_path / "c", limit="64MiB"),
    )
    assert ds.source.window == 0
    assert [i for b in ds for i in b["i"].tolist()] == local
    # the second epoch finds every shard cached: nothing is fetched again
    fetched = ds.cache.stream_stats.fetched
    assert sorted(i for b in ds for i in b["i"].tolist()) == list(range(TOTAL))
    assert ds.cache.stream_stats.fetched == fetched == SHARDS
    ds.close()


def test_unshuffled_whole_epochs_stream_in_dataset_order(tmp_path):
    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    budget = budget_for(manifest, 3)  # three shards at a time
    watch = BudgetWatch(tmp_path / "cache", budget)
    cache = ShardCache(root, tmp_path / "cache", max_bytes=budget, events=watch)
    ds = rkt.RecordDataset(root, batch_size=7, cache=cache)
    for _ in range(2):
        assert [i for b in ds for i in b["i"].tolist()] == list(range(TOTAL))
    ds.close()
    assert not watch.over, f"budget exceeded: {watch.over}"


def test_a_shard_larger_than_the_budget_is_an_error_saying_so(tmp_path):
    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=2, records=RECORDS, size=SIZE)
    budget = budget_for(manifest, 0.5)
    with pytest.raises(CacheFullError, match="raise cache_limit") as err:
        rkt.RecordDataset(root, cache=CacheOptions(dir=tmp_path / "c", limit=budget))
    assert err.value.path == "part-00000.tfrecord"


@pytest.mark.parametrize("mode", ["whole", "growing"])
def test_tfds_options_are_refused_through_a_cache(tmp_path, mode):
    root = tmp_path / "remote"
    write_dataset(root, shards=2, records=RECORDS, size=SIZE)
    for option in ({"split": "train"}, {"options": ReadOptions(decode_images=True)}):
        with pytest.raises(ValueError, match="not a dataset read through a shard cache"):
            rkt.RecordDataset(
                root, **option, cache=CacheOptions(dir=tmp_path / "c", limit="1GiB", epochs=mode)
            )


def test_growing_epochs_say_how_much_they_read(tmp_path, caplog):
    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=8, records=RECORDS, size=SIZE)
    cache = ShardCache(root, tmp_path / "c", max_bytes="1GiB", fill_workers=0)
    cache.fill_one()  # one shard of eight
    ds = rkt.RecordDataset(root, batch_size=8, cache=CacheOptions(cache=cache, epochs="growing"))
    with caplog.at_level(logging.WARNING, logger="recordkit"):
        ids = [i for b in ds for i in b["i"].tolist()]
    assert len(ids) == RECORDS
    lines = [r for r in caplog.records if "reads 1 of 8 shards" in r.getMessage()]
    assert lines and lines[0].levelno == logging.WARNING
    assert "(12%, 20 records)" in lines[0].getMessage()
    cache.fill()
    with caplog.at_level(logging.INFO, logger="recordkit"):
        caplog.clear()
        assert len([b for b in ds]) == 8 * RECORDS // 8
    full = [r for r in caplog.records if "reads 8 of 8 shards" in r.getMessage()]
    assert full and full[0].levelno == logging.INFO  # nothing partial to warn about
    ds.close()
    assert manifest.records == 8 * RECORDS
    with pytest.raises(ValueError, match="cache_epochs"):
        rkt.RecordDataset(root, cache=CacheOptions(cache=cache, epochs="sometimes"))


@pytest.mark.slow
def test_dataloader_workers_and_the_loader_process(tmp_path):
    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    budget = budget_for(manifest, SHARDS / 3)
    watch = BudgetWatch(tmp_path / "cache", budget)
    cache = ShardCache(root, tmp_path / "cache", max_bytes=budget, events=watch)
    ds = rkt.RecordDataset(root, batch_size=8, shuffle=True, seed=4, cache=cache)
    loader = rkt.DataLoader(ds, num_workers=2)
    orders = []
    for _ in range(2):
        ids = [i for b in loader for i in b["i"].tolist()]
        assert sorted(ids) == list(range(TOTAL))
        orders.append(ids)
    with pytest.raises(ValueError, match="persistent_workers"):
        rkt.DataLoader(ds, num_workers=2, persistent_workers=True)
    ds.close()
    # the loader process, through another cache over the same budget: the same orders
    cache2 = ShardCache(root, tmp_path / "cache2", max_bytes=budget, events=watch)
    watch.root = tmp_path / "cache2"
    ds2 = rkt.RecordDataset(
        root,
        batch_size=8,
        shuffle=True,
        seed=4,
        cache=cache2,
        options=ReadOptions(reader_process=True),
    )
    for epoch in range(2):
        assert [i for b in ds2 for i in b["i"].tolist()] == orders[epoch]
    ds2.close()
    assert not watch.over, f"budget exceeded: {watch.over}"


KILLED = """
import json, os, signal, sys
from recordkit.torch import CacheOptions, ReadOptions, RecordDataset
url, cache_dir, budget, out, kill_after = sys.argv[1:6]
ds = RecordDataset(url, batch_size=8, shuffle=True, seed=7,
                   cache=CacheOptions(dir=cache_dir, limit=int(budget)),
                   options=ReadOptions(bytes_as="list"))
state = json.load(open(out))["state"] if os.path.exists(out) else None
ids = json.load(open(out))["ids"] if state else []
if state:
    ds.load_state_dict(state)
for k, batch in enumerate(ds):
    ids.extend(batch["i"].tolist())
    # the ids and the position after them, together (atomically): what a checkpoint holds
    with open(out + ".tmp", "w") as f:
        json.dump({"state": ds.state_dict(), "ids": ids}, f)
    os.replace(out + ".tmp", out)
    if k + 1 == int(kill_after):
        os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps({"epoch": ds.epoch, "total": len(ids)}))
"""


def test_killed_mid_epoch_resumes_exactly(remote, tmp_path):
    url, _, env, manifest = remote
    budget = budget_for(manifest, SHARDS / 3)
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    out = tmp_path / "progress.json"
    cache_dir = tmp_path / "cache"

    def run(kill_after: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                str(script),
                url,
                str(cache_dir),
                str(budget),
                str(out),
                str(kill_after),
            ],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = run(kill_after=17)  # of 40 batches
    assert first.returncode == -signal.SIGKILL, first.stderr
    saved = json.loads(out.read_text())
    assert len(saved["ids"]) == 17 * 8 and saved["state"]["consumed"] == 17
    second = run(kill_after=0)
    assert second.returncode == 0, second.stderr
    done = json.loads(second.stdout.strip().splitlines()[-1])
    ids = json.loads(out.read_text())["ids"]
    assert done == {"epoch": 1, "total": TOTAL}
    assert sorted(ids) == list(range(TOTAL))  # every record exactly once across the kill
    # and the resumed order is the uninterrupted one's
    cache = ShardCache(
        url,
        tmp_path / "fresh",
        max_bytes=budget,
        **({"storage_options": _s3_options(env)} if env else {}),
    )
    ds = rkt.RecordDataset(url, batch_size=8, shuffle=True, seed=7, cache=cache)
    assert [i for b in ds for i in b["i"].tolist()] == ids
    ds.close()


def _s3_options(env: dict) -> dict:
    return {
        "key": env["AWS_ACCESS_KEY_ID"],
        "secret": env["AWS_SECRET_ACCESS_KEY"],
        "client_kwargs": {"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": "us-east-1"},
    }


def test_resume_keeps_the_saved_windows_or_refuses(tmp_path):
    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    small = budget_for(manifest, 4)
    ds = rkt.RecordDataset(
        root, batch_size=8, shuffle=True, cache=CacheOptions(dir=tmp_path / "a", limit=small)
    )
    it = iter(ds)
    head = [next(it)["i"].tolist() for _ in range(3)]
    state = ds.state_dict()
    rest = [b["i"].tolist() for b in it]
    ds.close()
    # a larger budget resumes in the saved windows: the same order
    big = rkt.RecordDataset(
        root, batch_size=8, shuffle=True, cache=CacheOptions(dir=tmp_path / "b", limit=small * 2)
    )
    big.load_state_dict(state)
    assert [b["i"].tolist() for b in big] == rest
    big.close()
    assert len({i for b in head + rest for i in b}) == TOTAL
    tiny = rkt.RecordDataset(
        root,
        batch_size=8,
        shuffle=True,
        cache=CacheOptions(dir=tmp_path / "c", limit=budget_for(manifest, 1.5)),
    )
    with pytest.raises(ValueError, match="cannot resume"):
        tiny.load_state_dict(state)
    tiny.close()
    local = rkt.RecordDataset(root, batch_size=8, shuffle=True)
    with pytest.raises(ValueError, match="cannot resume"):
        local.load_state_dict(state)


RANKS = """
import json, sys
import torch.distributed as dist
from recordkit.torch import CacheOptions, DataLoader, ReadOptions, RecordDataset
url, cache_dir, budget, out = sys.argv[1:5]
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
ds = RecordDataset(url, batch_size=4, shuffle=True, seed=9,
                   cache=CacheOptions(dir=f"{cache_dir}-{rank}", limit=int(budget)),
                   options=ReadOptions(num_threads=1))
loader = DataLoader(ds, num_workers=1 if rank else 0)
epochs = [[i for b in loader for i in b["i"].tolist()] for _ in range(2)]
json.dump({"epochs": epochs, "len": len(ds)}, open(f"{out}.{rank}", "w"))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ranks_read_every_record_once_per_epoch(tmp_path):
    import socket

    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = 2
    # rank 1's budget is smaller: the ranks agree on the smaller one's windows
    budgets = [budget_for(manifest, SHARDS / 2), budget_for(manifest, SHARDS / 4)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(root),
                str(tmp_path / "cache"),
                str(budgets[r]),
                str(tmp_path / "out"),
            ],
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": str(world),
            },
        )
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(150) == 0
    outs = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(world)]
    assert all(o["len"] == TOTAL // 4 // world for o in outs)
    for epoch in range(2):
        ids = [i for o in outs for i in o["epochs"][epoch]]
        assert sorted(ids) == list(range(TOTAL)), f"epoch {epoch}"
    single = rkt.RecordDataset(
        root,
        batch_size=8,
        shuffle=True,
        seed=9,
        cache=CacheOptions(dir=tmp_path / "one", limit=budgets[1]),
    )
    # the global order is that of one rank with the global batch, in the same windows
    merged = []
    streams = [o["epochs"][0] for o in outs]
    for k in range(TOTAL // 8):
        for r in range(world):
            merged.extend(streams[r][4 * k : 4 * k + 4])
    assert merged == [i for b in single for i in b["i"].tolist()]
    single.close()
    assert np.array_equal(np.sort(merged), np.arange(TOTAL))


def test_the_cache_cli_fills_ahead_and_leaves_a_streaming_reader_alone(tmp_path, capsys):
    from recordkit.cli import main

    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    budget = budget_for(manifest, SHARDS / 2)
    local = tmp_path / "cache"
    assert main(["cache", "fill", str(root), str(local), "--max-bytes", str(budget)]) == 0
    filled = sorted(n for n in os.listdir(local) if n.endswith(".tfrecord"))
    assert 1 <= len(filled) < SHARDS
    cache = ShardCache(root, local, max_bytes=budget)
    ds = rkt.RecordDataset(root, batch_size=8, cache=cache)  # in order: shards come one by one
    it = iter(ds)
    ids = next(it)["i"].tolist()
    # while the reader streams: status shows its pins, gc removes nothing it reads
    assert main(["cache", "status", str(local), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["pinned"] >= 1
    assert main(["cache", "gc", str(local)]) == 0
    ids += [i for b in it for i in b["i"].tolist()]
    assert ids == list(range(TOTAL))
    assert cache.stream_stats.cached >= 1  # what the CLI filled was not fetched again
    ds.close()
