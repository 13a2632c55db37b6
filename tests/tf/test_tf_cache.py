"""recordkit.tf.dataset over a ShardCache: each epoch takes the shards cached by then."""

from __future__ import annotations

import pytest

from recordkit.cache import ShardCache
from tests.cache.conftest import BudgetWatch, check_sample, overhead, write_dataset

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
        ds = rtf.dataset(root, batch_size=8, shuffle=True, cache=cache)
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
    ds = rtf.dataset(root, batch_size=50, cache_dir=tmp_path / "c", cache_limit="1GiB")
    ids = [int(i) for b in ds for i in b["i"].numpy()]
    assert len(ids) == len(set(ids)) and ids
    with pytest.raises(ValueError, match="cache_limit"):
        rtf.dataset(root, cache_dir=tmp_path / "d")
