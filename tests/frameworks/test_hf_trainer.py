"""The Hugging Face ``Trainer`` with a RecordDataset as ``train_dataset``
(examples/pytorch/hf_trainer.py): it batches the dataset's samples, calls ``set_epoch``
with its own epoch number, and on ``resume_from_checkpoint`` skips the batches of the
interrupted epoch it had trained on."""

from __future__ import annotations

import pytest

from ._streams import check_epochs, example, steps

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = [pytest.mark.torch, pytest.mark.frameworks, pytest.mark.slow]

SCRIPT = "pytorch/hf_trainer.py"
RECORDS, EPOCHS = 1000, 3  # 63 steps of 16 an epoch, the last one of 8


def _run(tmp, name, *args, processes=1):
    example(SCRIPT, "--data", tmp / "data", "--labels", tmp / name, *args, processes=processes)
    if processes == 1:
        return [steps(tmp / name)]
    return [steps(tmp / f"{name}.rank{r}") for r in range(processes)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainer")
    return tmp, _run(tmp, "full")


def test_every_record_once_per_epoch_in_a_new_order(uninterrupted):
    _, ranks = uninterrupted
    assert check_epochs(ranks, RECORDS, EPOCHS)["records per epoch per rank"] == [RECORDS]


@pytest.mark.parametrize("stop", [40, 63])  # mid-epoch 0; the end of epoch 0
def test_resume_from_checkpoint_reads_the_same_stream(uninterrupted, stop, tmp_path):
    _, (full,) = uninterrupted
    out = ["--output", tmp_path / "trainer"]
    (first,) = _run(tmp_path, "first", *out, "--stop-after", stop)
    (rest,) = _run(tmp_path, "rest", *out, "--resume")
    assert len(first) == stop
    assert first + rest == full


@pytest.mark.timeout(600)
def test_two_processes_split_every_batch_and_resume(tmp_path):
    """The main process reads every record (rank=0, world_size=1); the Trainer slices."""
    full = _run(tmp_path, "full", processes=2)
    assert check_epochs(full, RECORDS, EPOCHS)["records per epoch per rank"] == [RECORDS // 2] * 2
    out = ["--output", tmp_path / "trainer"]
    first = _run(tmp_path, "first", *out, "--stop-after", 40, processes=2)
    rest = _run(tmp_path, "rest", *out, "--resume", processes=2)
    for rank in range(2):
        assert first[rank] + rest[rank] == full[rank], f"rank {rank}"
