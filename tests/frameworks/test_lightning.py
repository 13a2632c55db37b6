"""PyTorch Lightning over RecordDataset, as its users run it (examples/pytorch/lightning_train.py).

Lightning's ``fit`` takes exactly ``len(loader)`` batches an epoch and never asks for
another; it calls ``set_epoch`` on samplers only; it saves the ``StatefulDataLoader``'s
state in its checkpoints. Each test compares the records every step trained on with an
uninterrupted run.
"""

from __future__ import annotations

import pytest

from ._streams import check_epochs, example, steps

pytest.importorskip("lightning")
pytest.importorskip("torchdata.stateful_dataloader")
pytestmark = [pytest.mark.torch, pytest.mark.frameworks, pytest.mark.slow]

SCRIPT = "pytorch/lightning_train.py"
RECORDS, EPOCHS = 1000, 3  # 63 batches of 16 an epoch, the last one of 8


def _run(tmp, name, *args, devices=1):
    data = tmp / "data"
    example(SCRIPT, "--data", data, "--labels", tmp / name, "--devices", devices, *args)
    if devices == 1:
        return [steps(tmp / name)]
    return [steps(tmp / f"{name}.rank{r}") for r in range(devices)]


@pytest.fixture(scope="module", params=[0, 2], ids=["workers0", "workers2"])
def uninterrupted(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"lightning{request.param}")
    ranks = _run(tmp, "full", "--workers", request.param)
    return request.param, tmp, ranks


def test_every_record_once_per_epoch_in_a_new_order(uninterrupted):
    _, _, ranks = uninterrupted
    figures = check_epochs(ranks, RECORDS, EPOCHS)
    assert figures["records per epoch per rank"] == [RECORDS]
    assert len(ranks[0]) == EPOCHS * 63


# 40: mid-epoch 0; 63: after the last batch of epoch 0 (Lightning's epoch-end
# checkpoint: with workers, each worker's state says it handed its share over).
@pytest.mark.parametrize("stop", [40, 63])
def test_ckpt_path_resumes_the_same_stream(uninterrupted, stop, tmp_path):
    workers, tmp, (full,) = uninterrupted
    data = ["--workers", workers, "--checkpoint", tmp_path / "ck.ckpt"]
    (first,) = _run(tmp, f"first{stop}", *data, "--stop-after", stop)
    assert len(first) == stop
    (rest,) = _run(tmp, f"rest{stop}", *data, "--resume")
    assert first + rest == full


@pytest.mark.timeout(600)
def test_ddp_over_two_processes_splits_every_epoch_and_resumes(tmp_path):
    full = _run(tmp_path, "full", devices=2)
    figures = check_epochs(full, RECORDS, EPOCHS)
    assert figures["records per epoch per rank"] == [RECORDS // 2] * 2
    ck = ["--checkpoint", tmp_path / "ck.ckpt"]
    first = _run(tmp_path, "first", *ck, "--stop-after", 40, devices=2)
    rest = _run(tmp_path, "rest", *ck, "--resume", devices=2)
    for rank in range(2):
        assert first[rank] + rest[rank] == full[rank], f"rank {rank}"
