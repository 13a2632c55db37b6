"""recordkit.tf.dataset over a ShardCache: whole epochs (the default), or growing ones."""

from __future__ import annotations

import pytest

from recordkit.cache import ShardCache
from recordkit.cache.stream import plan_capacity
from recordkit.reader import CacheOptions, ReadOptions
from tests.cache.conftest import BudgetWatch, check_sample, overhead, write_dataset
from tests.servers import http_server

tf = pytest.importorskip("tensorflow")
rtf = pytest.importorskip("recordkit.tf")

pytestmark = pytest.mark.tf

SHARDS, RECORDS = 10, 20


@pytest.fixture
def remote(tmp_path):
    root = tmp_path / "remote"
    return root, write_dataset(root, shards=SHARDS, records=RECORDS, size=2000)


def test_epochs_rescan_and_rotate_within_the_budget(remote, tmp_path):
    root, manifest = remote
    biggest = max(s.bytes for s in manifest.shards)
    budget = 4 * (biggest + 2 * RECORDS * 24) + 1024 + overhead(root)  # and the cache's files
    watch = BudgetWatch(tmp_path / "cache", budget)
    with ShardCache(root, tmp_path / "cache", max_bytes=budget, events=watch) as cache:
        ds = rtf.dataset(
            root, batch_size=8, shuffle=True, cache=CacheOptions(cache=cache, epochs="growing")
        )
        seen: set[int] = set()
        epochs = 0
        while len(seen) < SHARDS * RECORDS and epochs < 300:  # bounded
            ids = []
            for b in ds:
                for i, x in zip(b["i"].numpy(), b["x"].to_list()):
                    ids.append(check_sample({"i": i, "x": x}))
            assert len(ids) == len(set(ids)) and len(ids) % RECORDS == 0
            seen.update(ids)
            epochs += 1
    assert not watch.over, f"budget exceeded: {watch.over}"
    assert len(seen) == SHARDS * RECORDS, f"{len(seen)} records after {epochs} epochs"


def test_cache_dir_reads_a_remote_folder(remote, tmp_path):
    root, _ = remote
    ds = rtf.dataset(root, batch_size=50, cache=CacheOptions(dir=tmp_path / "c", limit="1GiB"))
    ids = [int(i) for b in ds for i in b["i"].numpy()]
    assert len(ids) == len(set(ids)) and ids
    with pytest.raises(ValueError, match="cache_limit"):
        rtf.dataset(root, cache=CacheOptions(dir=tmp_path / "d"))
    for mode in ("whole", "growing"):  # tensorflow-datasets options are for local folders
        for option in ({"split": "train"}, {"options": ReadOptions(decode_images=True)}):
            with pytest.raises(ValueError, match="not a dataset read through a shard cache"):
                rtf.dataset(
                    root,
                    **option,
                    cache=CacheOptions(dir=tmp_path / "e", limit="1GiB", epochs=mode),
                )


def _budget(manifest, shards: float) -> int:
    per = max(s.bytes for s in manifest.shards) + 2 * RECORDS * 24
    n = len(manifest.shards)
    return int(shards * per) + (manifest.bytes - plan_capacity(manifest.bytes, n))


def _ids(batches) -> list[int]:
    out = []
    for b in batches:
        for i, x in zip(b["i"].numpy(), b["x"].to_list()):
            out.append(check_sample({"i": i, "x": x}))
    return out


@pytest.mark.remote
def test_whole_epochs_over_http_under_a_budget_of_a_third(tmp_path):
    root = tmp_path / "srv"
    manifest = write_dataset(root / "train", shards=SHARDS, records=RECORDS, size=2000)
    budget = _budget(manifest, SHARDS / 3)
    watch = BudgetWatch(tmp_path / "cache", budget)
    with http_server(root) as http:
        url = http.url + "/train"
        cache = ShardCache(url, tmp_path / "cache", max_bytes=budget, events=watch)
        ds = rtf.dataset(url, batch_size=8, shuffle=True, seed=3, cache=cache, epochs=2)
        assert len(ds) == 2 * -(-SHARDS * RECORDS // 8)  # known: the whole dataset, twice
        ids = _ids(ds)
    total = SHARDS * RECORDS
    assert sorted(ids[:total]) == list(range(total)) == sorted(ids[total:])
    assert ids[:total] != ids[total:]
    assert not watch.over, f"budget exceeded: {watch.over}"
    assert len(watch.published_paths) > SHARDS  # shards came, went and came back
    assert cache.stream_stats.fetched == len(watch.published_paths)


def test_whole_epochs_resume_from_a_checkpoint(remote, tmp_path):
    root, manifest = remote
    budget = _budget(manifest, SHARDS / 3)

    def make(where):
        return rtf.dataset(
            root,
            batch_size=8,
            shuffle=True,
            seed=5,
            drop_last=True,
            cache=CacheOptions(dir=tmp_path / where, limit=budget),
        )

    it = iter(make("a"))
    head = [next(it) for _ in range(9)]
    ckpt = tf.train.Checkpoint(iterator=it)
    saved = ckpt.write(str(tmp_path / "ckpt" / "it"))
    rest = list(it)
    again = iter(make("b"))
    tf.train.Checkpoint(iterator=again).read(saved).assert_consumed()
    resumed = list(again)
    assert _ids(resumed) == _ids(rest)
    ids = _ids(head) + _ids(resumed)
    assert len(ids) == len(set(ids)) == SHARDS * RECORDS // 8 * 8


def test_cache_options_whole_or_flat(remote, tmp_path):
    """``cache=CacheOptions(...)`` reads the whole remote dataset, with or without a
    timeout; ``cache=`` takes a ShardCache or a CacheOptions, nothing else (the flat
    ``cache_*`` keywords are gone: a setting has one place)."""
    root, manifest = remote
    budget = 2 * manifest.bytes + overhead(root)  # all of it fits: no waits on eviction
    whole = rtf.dataset(
        str(root), batch_size=8, cache=CacheOptions(dir=tmp_path / "a", limit=budget, timeout=60)
    )
    ids = [b["i"].numpy().tolist() for b in whole]
    flat = rtf.dataset(
        str(root), batch_size=8, cache=CacheOptions(dir=tmp_path / "b", limit=budget)
    )
    assert ids == [b["i"].numpy().tolist() for b in flat]
    assert sorted(i for batch in ids for i in batch) == list(range(SHARDS * RECORDS))
    with pytest.raises(TypeError, match="cache= takes a ShardCache or a CacheOptions"):
        rtf.dataset(str(root), cache={"dir": tmp_path / "c", "limit": budget})


def test_whole_epochs_whatever_task_tensorflow_reads_first(remote, tmp_path):
    """TensorFlow reads an epoch's first tasks on several threads in any order: the pass
    starts at the first task of the stream, not at the first one read (it started at
    whichever came first, released the shards of the tasks before it, and failed with
    "the stream was closed while waiting for part-00000.tfrecord" most runs)."""
    root, manifest = remote
    budget = 2 * manifest.bytes + overhead(root)  # it fits: several tasks an epoch
    for k in range(4):
        ds = rtf.dataset(
            str(root),
            batch_size=8,
            epochs=2,
            cache=CacheOptions(dir=tmp_path / f"c{k}", limit=budget),
        )
        ids = _ids(ds)
        total = SHARDS * RECORDS
        assert ids[:total] == list(range(total)) == ids[total:]
        assert _ids(ds) == ids  # iterated again: a new pass from the start
