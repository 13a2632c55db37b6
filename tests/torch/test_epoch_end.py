"""An epoch ends when its last batch is handed out, not when one more is asked for.

Lightning's ``fit``, Keras' and the Hugging Face ``Trainer``'s loops take exactly
``len(loader)`` batches and never ask for another: the next ``iter()`` must read the
next epoch, in a new order, and the state saved after the last batch must say so.
"""

from __future__ import annotations

import pytest

import recordkit as rk
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

from recordkit.torch import DataLoader, RecordDataset  # noqa: E402

N, BATCH = 1000, 16  # 63 batches, the last one of 8


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("epoch_end") / "ds"
    with rk.Writer(root, rk.Schema(label=rk.Int64()), max_records=100) as w:
        for i in range(N):
            w.write({"label": i})
    return root


LOADERS = {
    "dataset": lambda ds: ds,
    "torch-0": lambda ds: TorchDataLoader(ds, batch_size=None),
    "torch-2": lambda ds: TorchDataLoader(ds, batch_size=None, num_workers=2),
    "recordkit-0": lambda ds: DataLoader(ds),
    "recordkit-2": lambda ds: DataLoader(ds, num_workers=2),
    "stateful-0": lambda ds: stateful.StatefulDataLoader(ds, batch_size=None),
    "stateful-2": lambda ds: stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2),
}


def _len_loop(loader, passes):
    """As Lightning does: ``len(loader)`` batches a pass, never one more; the iterator is
    kept until the next pass replaces it."""
    out, it = [], None
    for _ in range(passes):
        it, n = iter(loader), len(loader)
        out.append([x for _ in range(n) for x in next(it)["label"].tolist()])
    return out, it


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_a_loop_that_takes_len_batches_reads_a_new_epoch_each_pass(path, name):
    ds = RecordDataset(
        path, batch_size=BATCH, shuffle=True, seed=0, options=ReadOptions(num_threads=1)
    )
    loader = LOADERS[name](ds)
    epochs, it = _len_loop(loader, 3)
    for e, labels in enumerate(epochs):
        assert sorted(labels) == list(range(N)), f"epoch {e}"
        reference = RecordDataset(
            path, batch_size=BATCH, shuffle=True, seed=0, options=ReadOptions(num_threads=1)
        )
        reference.set_epoch(e)
        assert labels == [x for b in reference for x in b["label"].tolist()], f"epoch {e}"
    assert sum(a != b for a, b in zip(epochs[0], epochs[1])) > N // 2
    assert ds.epoch == 3
    if hasattr(loader, "state_dict") and not name.startswith("stateful-2"):
        state = loader.state_dict()
        state = state.get("dataset_state", state)
        assert (state["epoch"], state["consumed"]) == (3, 0)
    del it


def test_the_state_after_the_last_batch_resumes_at_the_next_epoch(path):
    ds = RecordDataset(
        path, batch_size=BATCH, shuffle=True, seed=0, options=ReadOptions(num_threads=1)
    )
    (first,), _ = _len_loop(ds, 1)
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["consumed"] == 0
    again = RecordDataset(
        path, batch_size=BATCH, shuffle=True, seed=0, options=ReadOptions(num_threads=1)
    )
    again.load_state_dict(ds.state_dict())
    second = [x for b in again for x in b["label"].tolist()]
    ds.set_epoch(1)
    assert second == [x for b in ds for x in b["label"].tolist()] != first


def test_set_epoch_wins_over_the_epoch_a_pass_ended_on(path):
    ds = RecordDataset(
        path, batch_size=BATCH, shuffle=True, seed=0, options=ReadOptions(num_threads=1)
    )
    (first,), _ = _len_loop(ds, 1)
    ds.set_epoch(0)  # DistributedSampler's pattern: set_epoch(epoch) before each epoch
    (again,), _ = _len_loop(ds, 1)
    assert again == first


def test_a_pass_left_early_reads_its_epoch_again(path):
    ds = RecordDataset(
        path, batch_size=BATCH, shuffle=True, seed=0, options=ReadOptions(num_threads=1)
    )
    for i, _ in enumerate(ds):
        if i == 10:
            break
    assert ds.epoch == 0
    assert ds.state_dict()["epoch"] == 0


def test_len_of_a_loader_that_batches_samples_from_workers_is_refused(path):
    """Each worker batches its own share: 2 workers give 64 batches where len() says 63,
    and a loop of len(loader) batches would leave records out, silently."""
    ds = RecordDataset(path, options=ReadOptions(num_threads=1))  # single samples
    with pytest.raises(ValueError, match="each worker batches its own share"):
        len(TorchDataLoader(ds, batch_size=BATCH, num_workers=2))
    assert len(TorchDataLoader(ds, batch_size=BATCH)) == 63  # no workers: exact
    assert len(TorchDataLoader(ds, batch_size=BATCH, num_workers=2, drop_last=True)) == 62
    # 334 + 333 + 333 samples: 21 batches each, as many as len() says
    assert len(TorchDataLoader(ds, batch_size=BATCH, num_workers=3)) == 63
    assert len(TorchDataLoader(ds, batch_size=8, num_workers=5)) == 125  # 200 each: exact
