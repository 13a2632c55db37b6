"""RecordDataset over a ShardCache with growing epochs (``cache_epochs="growing"``): epochs
grow with the cache, shards are released as read. Whole epochs: ``test_torch_whole.py``."""

from __future__ import annotations

import pytest

from recordkit.cache import ShardCache
from recordkit.reader import CacheOptions, ReadOptions
from tests.cache.conftest import BudgetWatch, check_sample, overhead, write_dataset

torch = pytest.importorskip("torch")
rkt = pytest.importorskip("recordkit.torch")

pytestmark = pytest.mark.torch

SHARDS, RECORDS, SIZE = 10, 20, 2000


@pytest.fixture
def remote(tmp_path):
    root = tmp_path / "remote"
    manifest = write_dataset(root, shards=SHARDS, records=RECORDS, size=SIZE)
    return root, manifest


def _budget(root, manifest, shards: int) -> int:
    """Room for about ``shards`` shards (plus their indexes), and the cache's own files."""
    biggest = max(s.bytes for s in manifest.shards)
    return shards * (biggest + 2 * RECORDS * 24) + 1024 + overhead(root)


def test_epochs_grow_with_the_cache_then_rotate(remote, tmp_path):
    root, manifest = remote
    budget = _budget(root, manifest, 4)
    watch = BudgetWatch(tmp_path / "cache", budget)
    with ShardCache(root, tmp_path / "cache", max_bytes=budget, events=watch) as cache:
        ds = rkt.RecordDataset(
            root,
            batch_size=8,
            shuffle=True,
            cache=CacheOptions(cache=cache, timeout=60, epochs="growing"),
        )
        seen: set[int] = set()
        sizes = []
        for _ in range(300):  # bounded: stops as soon as every record was read once
            ids = [i for b in ds for i in b["i"].tolist()]
            assert len(ids) == len(set(ids)), "a record twice in one epoch"
            assert len(ids) % RECORDS == 0  # whole shards only
            sizes.append(len(ids) // RECORDS)
            seen.update(ids)
            if len(seen) == SHARDS * RECORDS:
                break
        ds.close()
    assert not watch.over, f"budget exceeded: {watch.over}"
    assert max(sizes) <= 4
    assert len(seen) == SHARDS * RECORDS, f"only {len(seen)} records in {len(sizes)} epochs"


def test_values_are_intact_and_batches_match_a_local_read(remote, tmp_path):
    root, _ = remote
    with ShardCache(root, tmp_path / "cache", max_bytes="1GiB") as cache:
        cache.wait_settled(timeout=60)
        ds = rkt.RecordDataset(
            root, batch_size=16, cache=cache, options=ReadOptions(bytes_as="list")
        )
        cached = [i for b in ds for i in b["i"].tolist()]
        ds.close()
    local = [i for b in rkt.RecordDataset(root, batch_size=16) for i in b["i"].tolist()]
    assert cached == local == list(range(SHARDS * RECORDS))
    for s in rkt.RecordDataset(root, cache=CacheOptions(dir=tmp_path / "cache2", limit="1GiB")):
        check_sample(s)


def test_resume_takes_the_saved_shard_set(remote, tmp_path):
    root, manifest = remote
    budget = _budget(root, manifest, 3)
    with ShardCache(root, tmp_path / "cache", max_bytes=budget) as cache:
        ds = rkt.RecordDataset(
            root,
            batch_size=4,
            shuffle=True,
            seed=5,
            cache=CacheOptions(cache=cache, epochs="growing"),
        )
        it = iter(ds)
        first = [next(it)["i"].tolist() for _ in range(3)]
        state = ds.state_dict()
        rest = [b["i"].tolist() for b in it]  # the uninterrupted epoch goes on
        ds.close()
    # Later, in a fresh cache over the same directory (its contents moved on meanwhile):
    with ShardCache(root, tmp_path / "cache", max_bytes=budget) as cache:
        cache.wait_settled(timeout=60)
        resumed = rkt.RecordDataset(
            root,
            batch_size=4,
            shuffle=True,
            seed=5,
            cache=CacheOptions(cache=cache, epochs="growing"),
        )
        resumed.load_state_dict(state)
        after = [b["i"].tolist() for b in resumed]
        resumed.close()
    assert after == rest  # the saved shard set again (fetched back if evicted), same order
    ids = [i for b in first + after for i in b]
    assert len(ids) == len(set(ids)) == len(state["shard_paths"]) * RECORDS


@pytest.mark.slow
def test_dataloader_workers_read_the_epochs_set_once(remote, tmp_path):
    root, _ = remote
    with ShardCache(root, tmp_path / "cache", max_bytes="1GiB") as cache:
        cache.wait_settled(timeout=60)
        ds = rkt.RecordDataset(
            root, batch_size=8, shuffle=True, cache=CacheOptions(cache=cache, epochs="growing")
        )
        loader = rkt.DataLoader(ds, num_workers=2)
        for _ in range(2):
            ids = [i for b in loader for i in b["i"].tolist()]
            assert sorted(ids) == list(range(SHARDS * RECORDS))
        ds.close()


def test_cache_arguments_are_checked(remote, tmp_path):
    root, _ = remote
    with pytest.raises(ValueError, match="cache_limit"):
        rkt.RecordDataset(root, cache=CacheOptions(dir=tmp_path / "c"))
    with pytest.raises(ValueError, match="cache_dir"):
        rkt.RecordDataset(root, cache=CacheOptions(limit="1GiB"))
    with (
        ShardCache(root, tmp_path / "c", max_bytes="1GiB") as cache,
        pytest.raises(ValueError, match="not both"),
    ):
        rkt.RecordDataset(root, cache=CacheOptions(cache=cache, dir=tmp_path / "c", limit="1GiB"))


def test_the_loader_process_reads_growing_epochs(remote, tmp_path):
    root, _ = remote
    with ShardCache(root, tmp_path / "cache", max_bytes="1GiB") as cache:
        cache.wait_settled(timeout=60)
        ds = rkt.RecordDataset(
            root,
            batch_size=8,
            cache=CacheOptions(cache=cache, epochs="growing"),
            options=ReadOptions(reader_process=True),
        )
        assert [i for b in ds for i in b["i"].tolist()] == list(range(SHARDS * RECORDS))
        ds.close()
