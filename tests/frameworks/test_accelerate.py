"""Hugging Face Accelerate over RecordDataset on 2 processes (gloo, CPU), as its users run it.

``accelerator.prepare(loader)`` of an iterable dataset reads it on the main process
alone and slices every batch out to the processes (``dispatch_batches``); a
RecordDataset that reads one rank's share there would train on half of every epoch,
so it is refused by name. The recipe (examples/pytorch/accelerate_train.py) keeps the
loader out of ``prepare()``, each process reading its own share, and puts the loader's
position in ``save_state`` with ``register_for_checkpointing``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ._streams import ENV, ROOT, check_epochs, example, steps

pytest.importorskip("accelerate")
pytestmark = [pytest.mark.torch, pytest.mark.frameworks, pytest.mark.slow]

SCRIPT = "pytorch/accelerate_train.py"
RECORDS, EPOCHS = 1000, 3  # 32 steps an epoch on each of 2 processes


def _run(tmp, name, *args):
    example(SCRIPT, "--data", tmp / "data", "--labels", tmp / name, *args, processes=2)
    return [steps(tmp / f"{name}.rank{r}") for r in range(2)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accelerate")
    return tmp, _run(tmp, "full")


def test_each_process_reads_its_share_of_every_epoch_in_a_new_order(uninterrupted):
    _, ranks = uninterrupted
    figures = check_epochs(ranks, RECORDS, EPOCHS)
    assert figures["records per epoch per rank"] == [RECORDS // 2] * 2


# 40: mid-epoch 1; 32: after the last step of epoch 0 (the loader's state says epoch 1).
@pytest.mark.parametrize(("stop", "workers"), [(40, 0), (32, 0), (40, 2)])
def test_save_state_and_load_state_resume_the_same_stream(uninterrupted, stop, workers, tmp_path):
    _, full = uninterrupted
    if workers:
        full = _run(tmp_path, "full", "--workers", workers)
    args = ["--workers", workers, "--checkpoint", tmp_path / "state"]
    first = _run(tmp_path, "first", *args, "--stop-after", stop)
    rest = _run(tmp_path, "rest", *args, "--resume")
    for rank in range(2):
        assert len(first[rank]) == stop
        assert first[rank] + rest[rank] == full[rank], f"rank {rank}"


_PREPARED = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    import recordkit as rk
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from recordkit.torch import ReadOptions, RecordDataset

    path, whole, out = sys.argv[1], sys.argv[2] == "whole", sys.argv[3]
    acc = Accelerator(cpu=True)
    split = {"rank": 0, "world_size": 1} if whole else {}
    read = ReadOptions(**split)
    ds = RecordDataset(path, batch_size=16, shuffle=True, seed=0, options=read)
    loader = acc.prepare(DataLoader(ds, batch_size=None))  # Accelerate's defaults
    seen = []
    try:
        for epoch in range(2):
            seen.append([i for b in loader for i in b["label"].tolist()])
    except ValueError as exc:
        seen = str(exc)
    with open(f"{out}.rank{acc.process_index}", "w") as f:
        json.dump(seen, f)
    acc.wait_for_everyone()
    acc.end_training()
    import os
    sys.stdout.flush()
    os._exit(0)  # not Python's shutdown under gloo's threads (examples/pytorch/ddp.py)
    """
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    import recordkit as rk

    path = tmp_path_factory.mktemp("prepared") / "d"
    with rk.Writer(path, rk.Schema(label=rk.Int64()), max_records=100) as w:
        for i in range(RECORDS):
            w.write({"label": i})
    return path


def _prepared(dataset, tmp_path, mode):
    import json

    script = tmp_path / "prepared.py"
    script.write_text(_PREPARED)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    proc = subprocess.run(
        [*cmd, str(script), str(dataset), mode, str(tmp_path / "out")],
        capture_output=True, text=True, timeout=240, env=ENV, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return [json.loads((tmp_path / f"out.rank{r}").read_text()) for r in range(2)]


def test_prepare_with_accelerates_defaults_is_refused_on_every_process(dataset, tmp_path):
    """Not half of every epoch: both processes stop at the first batch, saying what to do."""
    for said in _prepared(dataset, tmp_path, "share"):
        assert isinstance(said, str), said
        assert "dispatches this DataLoader" in said and "rank=0, world_size=1" in said


def test_prepared_loader_reading_every_record_on_the_main_process(dataset, tmp_path):
    """``rank=0, world_size=1``: Accelerate slices every batch out; each epoch covers every
    record once over the two processes, in a new order."""
    ranks = _prepared(dataset, tmp_path, "whole")
    for epoch in range(2):
        union = ranks[0][epoch] + ranks[1][epoch]
        assert sorted(union) == list(range(RECORDS))
    assert sum(a != b for a, b in zip(ranks[0][0], ranks[0][1])) > RECORDS // 4
