"""torchdata's StatefulDataLoader over RecordDataset: every resume continues the exact stream.

StatefulDataLoader saves one dataset state per worker (taken in the worker after each
batch, kept for the last batch the loader yielded) and restores each into its own
worker. Each test compares the labels of an interrupted and resumed run, cut at many
places, with an uninterrupted run, and checks each epoch reads every record once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import recordkit as rk
from recordkit.reader import CacheOptions, ReadOptions

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [
    pytest.mark.torch,
    # 4 workers on a machine of fewer CPUs: torch warns; exactness is what is tested here.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

from recordkit.torch import DataLoader, RecordDataset  # noqa: E402

StatefulDataLoader = stateful.StatefulDataLoader
N, BATCH, EPOCHS = 203, 8, 3  # 203: the last batch is short (drop_last drops it)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("stateful") / "ds"
    with rk.Writer(root, rk.Schema(label=rk.Int64()), max_records=50) as w:
        for i in range(N):
            w.write({"label": i})
    return root


def _dataset(path, *, shuffle=True, drop_last=False, batch_size=BATCH):
    return RecordDataset(
        path,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=3,
        drop_last=drop_last,
        options=ReadOptions(num_threads=1),
    )


def _loader(path, workers, *, shuffle=True, drop_last=False, **kwargs):
    ds = _dataset(path, shuffle=shuffle, drop_last=drop_last)
    return StatefulDataLoader(ds, batch_size=None, num_workers=workers, **kwargs)


def _read(loader, passes, stop=None):
    """The labels of ``passes`` passes (one list each) and the state at the end.

    With ``stop``: stop after that many batches, counted over the passes.
    """
    out, n = [], 0
    for _ in range(passes):
        out.append([])
        for batch in loader:
            out[-1] += batch["label"].tolist()
            n += 1
            if n == stop:
                return out, loader.state_dict()
    return out, loader.state_dict()


def _flat(passes):
    return [x for p in passes for x in p]


def _check_epochs(path, passes, *, shuffle, drop_last):
    """Every epoch reads each record once (a full-batch subset with drop_last), in the
    order a dataset read in this process gives that epoch."""
    per_epoch = (N // BATCH) * BATCH if drop_last else N
    for epoch, labels in enumerate(passes):
        assert len(labels) == len(set(labels)) == per_epoch, f"epoch {epoch}"
        ds = _dataset(path, shuffle=shuffle, drop_last=drop_last)
        ds.set_epoch(epoch)
        assert labels == [x for b in ds for x in b["label"].tolist()], f"epoch {epoch}"
    if shuffle:
        assert passes[0] != passes[1]


def _cuts(per_epoch):
    """(batches before the cut, passes the first run reads): mid-epoch 0, mid-epoch 1,
    at the last batch of epoch 0 with drop_last (the loop never asks for another: the
    state already says epoch 1), and after the loop over epoch 0 ended."""
    return [(5, 1), (per_epoch + 3, 2), (per_epoch, 1), (None, 1)]


def _resumed(path, workers, stop, passes, *, json_trip=True, **kwargs):
    first, state = _read(_loader(path, workers, **kwargs), passes, stop)
    if json_trip:
        state = json.loads(json.dumps(state))  # a checkpoint written as JSON
    # passes finished before the cut: a pass is over once its last batch is handed out
    per_epoch = (N // BATCH) * BATCH if kwargs.get("drop_last") else N
    done = len(first) - (stop is not None and len(first[-1]) < per_epoch)
    loader = _loader(path, workers, **kwargs)
    loader.load_state_dict(state)
    rest, _ = _read(loader, EPOCHS - done)
    return _flat(first) + _flat(rest)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 1, 2, 4])
@pytest.mark.parametrize(
    ("shuffle", "drop_last"), [(True, False), (False, True)], ids=["shuffle", "sorted-drop_last"]
)
def test_resume_is_exact_anywhere(path, workers, shuffle, drop_last):
    options = {"shuffle": shuffle, "drop_last": drop_last}
    reference, _ = _read(_loader(path, workers, **options), EPOCHS)
    _check_epochs(path, reference, **options)
    want = _flat(reference)
    for stop, passes in _cuts(len(reference[0]) // BATCH):
        got = _resumed(path, workers, stop, passes, **options)
        assert got == want, f"cut after {stop} batches"


def test_resume_with_two_workers_mid_epoch(path):
    """The issue's report: 20 batches, save, new loader, load, finish (was 1,008 labels,
    656 distinct)."""
    first, state = _read(_loader(path, 2), 1, stop=20)
    loader = _loader(path, 2)
    loader.load_state_dict(state)
    rest, _ = _read(loader, 1)
    labels = _flat(first) + _flat(rest)
    assert len(labels) == len(set(labels)) == N
    assert labels == [x for b in _dataset(path) for x in b["label"].tolist()]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_persistent_workers(path, workers):
    reference, _ = _read(_loader(path, workers, persistent_workers=True), EPOCHS)
    _check_epochs(path, reference, shuffle=True, drop_last=False)
    for stop, passes in _cuts(len(reference[0]) // BATCH):
        got = _resumed(path, workers, stop, passes, persistent_workers=True)
        assert got == _flat(reference), f"cut after {stop} batches"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_snapshots_every_few_steps(path, workers):
    """snapshot_every_n_steps=4: the loader restores the last snapshot and replays the
    steps since; a cut between snapshots, and one after an epoch ended between them."""
    options = {"snapshot_every_n_steps": 4}
    reference, _ = _read(_loader(path, workers, **options), EPOCHS)
    _check_epochs(path, reference, shuffle=True, drop_last=False)
    per_epoch = len(reference[0]) // BATCH  # 26: epoch 0 ends 2 steps after a snapshot
    for stop, passes in [(7, 1), (per_epoch + 5, 2), (None, 1)]:
        got = _resumed(path, workers, stop, passes, **options)
        assert got == _flat(reference), f"cut after {stop} batches"


@pytest.mark.slow
def test_samples_batched_by_the_loader(path):
    """Without batch_size the dataset yields samples and the loader batches them."""

    def make():
        ds = RecordDataset(path, shuffle=True, seed=3, options=ReadOptions(num_threads=1))
        return StatefulDataLoader(ds, batch_size=10, num_workers=2, collate_fn=ds.collate)

    reference, _ = _read(make(), 2)
    first, state = _read(make(), 1, stop=7)
    loader = make()
    loader.load_state_dict(state)
    rest, _ = _read(loader, 2)
    assert _flat(first) + _flat(rest) == _flat(reference)
    assert sorted(reference[0]) == sorted(reference[1]) == list(range(N))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_spawned_persistent_workers_resume(path):
    """Spawned workers get the dataset (and its shared epoch) by pickle."""
    reference, _ = _read(_loader(path, 2), 2)
    kwargs = {"multiprocessing_context": "spawn", "persistent_workers": True}
    first, state = _read(_loader(path, 2, **kwargs), 1, stop=9)
    loader = _loader(path, 2, **kwargs)
    loader.load_state_dict(state)
    rest, _ = _read(loader, 2)
    assert _flat(first) + _flat(rest) == _flat(reference)


SCRIPT = """
import json, sys
from torchdata.stateful_dataloader import StatefulDataLoader
from recordkit.torch import ReadOptions, RecordDataset
path, state_file, mode = sys.argv[1:4]
ds = RecordDataset(path, batch_size=8, shuffle=True, seed=3, options=ReadOptions(num_threads=1))
loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
labels = []
if mode == "first":
    for k, batch in enumerate(loader):
        labels += batch["label"].tolist()
        if k == 10:
            break
    json.dump({"state": loader.state_dict(), "labels": labels}, open(state_file, "w"))
else:
    loader.load_state_dict(json.load(open(state_file))["state"])
    for epoch in range(2):
        for batch in loader:
            labels += batch["label"].tolist()
    print(json.dumps(labels))
"""


@pytest.mark.slow
def test_resume_in_a_new_process(path, tmp_path):
    script = tmp_path / "resume.py"
    script.write_text(SCRIPT)
    run = [sys.executable, "-W", "ignore::UserWarning", str(script), str(path), str(tmp_path / "s")]
    subprocess.run([*run, "first"], check=True, timeout=120)
    out = subprocess.run([*run, "second"], check=True, timeout=120, capture_output=True, text=True)
    first = json.loads((tmp_path / "s").read_text())["labels"]
    reference, _ = _read(_loader(path, 2), 2)
    assert first + json.loads(out.stdout) == _flat(reference)


def test_plain_dataloader_workers_advance_the_epoch(path):
    """Workers share the dataset's epoch: a plain DataLoader reads a new order each pass."""
    ds = _dataset(path)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    passes = [[x for b in loader for x in b["label"].tolist()] for _ in range(2)]
    assert ds.epoch == 2
    _check_epochs(path, passes, shuffle=True, drop_last=False)


@pytest.mark.slow
def test_plain_dataloader_persistent_workers_follow_set_epoch(path):
    ds = _dataset(path)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=True
    )
    e0 = [x for b in loader for x in b["label"].tolist()]
    ds.set_epoch(0)  # read epoch 0 again: the persistent workers see it
    assert [x for b in loader for x in b["label"].tolist()] == e0


def test_a_worker_state_resumes_only_in_its_worker(path):
    _, state = _read(_loader(path, 2), 1, stop=3)
    worker_state = state["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
    assert worker_state["worker"]["id"] == 1 and worker_state["consumed"] is None
    with pytest.raises(ValueError, match="state of DataLoader worker 1 of 2"):
        _dataset(path).load_state_dict(worker_state)
    with pytest.raises(ValueError, match="load it with the StatefulDataLoader"):
        DataLoader(_dataset(path)).load_state_dict(worker_state)


def test_recordkit_dataloader_left_early_reads_the_epoch_again(path):
    ds = _dataset(path)
    loader = DataLoader(ds, num_workers=2)
    for k, _batch in enumerate(loader):
        if k == 23:  # the workers have read their shares ahead of the loop by now
            break
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["consumed"] == 24
    assert ds.epoch == 0
    labels = [x for b in loader for x in b["label"].tolist()]
    assert sorted(labels) == list(range(N)) and ds.epoch == 1


@pytest.fixture
def remote(tmp_path):
    from tests.cache.conftest import write_dataset

    root = tmp_path / "remote"
    return root, write_dataset(root, shards=10, records=20, size=2000)


@pytest.mark.parametrize("mode", ["growing", "whole"])
def test_cached_dataset_resumes_its_shard_set_in_process(remote, tmp_path, mode):
    """Growing epochs: the position includes the epoch's shard set; a resume in a fresh
    cache, whose contents moved on, takes that set again. Whole epochs (a budget of 3
    of the 10 shards): the rest of the epoch, every record once."""
    from recordkit.cache import ShardCache
    from tests.cache.conftest import overhead
    from tests.torch.test_torch_whole import budget_for

    root, manifest = remote
    budget = 3 * (max(s.bytes for s in manifest.shards) + 2 * 20 * 24) + 1024 + overhead(root)
    if mode == "whole":  # the stream's bookkeeping is counted in its budget too
        budget = budget_for(manifest, 3)

    def loader(cache):
        ds = RecordDataset(
            root, batch_size=4, shuffle=True, seed=5, cache=CacheOptions(cache=cache, epochs=mode)
        )
        return ds, StatefulDataLoader(ds, batch_size=None, num_workers=0)

    with ShardCache(root, tmp_path / "cache", max_bytes=budget) as cache:
        ds, first_loader = loader(cache)
        it = iter(first_loader)
        first = [x for _ in range(3) for x in next(it)["i"].tolist()]
        state = json.loads(json.dumps(first_loader.state_dict()))
        rest = [x for b in it for x in b["i"].tolist()]  # the uninterrupted epoch goes on
        ds.close()
    with ShardCache(root, tmp_path / "cache", max_bytes=budget) as cache:
        cache.wait_settled(timeout=60)
        ds, resumed = loader(cache)
        resumed.load_state_dict(state)
        after = [x for b in resumed for x in b["i"].tolist()]
        ds.close()
    assert after == rest
    assert len(set(first + after)) == len(first + after) == len(after) + 12
    assert len(first + after) % 20 == 0  # whole shards
    if mode == "whole":
        assert sorted(first + after) == list(range(200))


@pytest.mark.parametrize("mode", ["whole", "growing"])
def test_cached_dataset_with_workers_needs_recordkit_dataloader(remote, tmp_path, mode):
    """Workers of another loader would read without the training process taking each
    epoch's shards (growing) or streaming them in (whole): refused by name."""
    from recordkit.cache import ShardCache

    root, _ = remote
    with ShardCache(root, tmp_path / "cache", max_bytes="1GiB") as cache:
        if mode == "growing":
            cache.wait_settled(timeout=60)
        ds = RecordDataset(root, batch_size=8, cache=CacheOptions(cache=cache, epochs=mode))
        with pytest.raises(RuntimeError, match="use num_workers=0"):
            next(iter(StatefulDataLoader(ds, batch_size=None, num_workers=2)))
        ids = [x for b in DataLoader(ds, num_workers=2) for x in b["i"].tolist()]
        assert sorted(ids) == list(range(200))
        ds.close()
