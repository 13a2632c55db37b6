"""Train with the Hugging Face ``Trainer`` on a recordkit dataset: every record once per
epoch, a new order every epoch, exact resume from a checkpoint (CPU, synthetic, seconds).

``RecordDataset`` is the ``train_dataset``, yielding single samples
(``batch_size=None``); the ``Trainer`` batches them (``per_device_train_batch_size``)
with its default collator, calls ``set_epoch`` with its own epoch number before
every epoch, and on ``resume_from_checkpoint`` skips the batches of the
interrupted epoch that were trained on: the order is a pure function of the seed
and the epoch, so the resumed run reads what the uninterrupted one did.

    python examples/pytorch/hf_trainer.py [--data DIR] [--epochs 3]
    python examples/pytorch/hf_trainer.py --stop-after 40   # checkpoint at step 40, stop
    python examples/pytorch/hf_trainer.py --resume          # ... and continue from it
    torchrun --nproc-per-node 2 examples/pytorch/hf_trainer.py   # 2 processes

On several processes the ``Trainer`` (through Accelerate) reads an iterable
dataset on the main process alone and gives each process a slice of every batch,
so the dataset there must read every record: ``RecordDataset(...,
options=ReadOptions(rank=0, world_size=1))`` (one that reads one rank's share is
refused by name).

``--labels FILE`` writes ``[epoch, [labels]]`` for every step, one JSON line each
(``FILE.rankN`` on several processes; ``label`` is the record's number).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

import recordkit as rk

BATCH = 16


def write_dataset(path: Path, n: int) -> None:
    """``n`` records: ``label`` is the record's number, ``x`` 4 features."""
    rng = np.random.default_rng(0)
    schema = rk.Schema(label=rk.Int64(), x=rk.Float32((4,)))
    with rk.Writer(path, schema, max_records=100, overwrite=True) as w:
        for i in range(n):
            w.write({"label": i, "x": rng.normal(size=4).astype(np.float32)})


class Model(torch.nn.Module):
    """A linear model that also notes which records each step trained on."""

    def __init__(self, samples: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.samples = samples
        self.epoch = 0
        self.steps: list[tuple[int, list[int]]] = []  # (epoch, labels) per step

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training:
            self.steps.append((self.epoch, labels.tolist()))
        target = labels.float()[:, None] / self.samples
        return {"loss": torch.nn.functional.mse_loss(self.linear(x), target)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("demo-data/hf-trainer"))
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--output", type=Path, default=None, help="default: DATA.trainer")
    ap.add_argument("--stop-after", type=int, default=0, help="save a checkpoint, then stop")
    ap.add_argument("--resume", action="store_true", help="from the checkpoint in --output")
    ap.add_argument("--labels", type=Path, default=None)
    args = ap.parse_args()
    output = args.output or args.data.with_suffix(".trainer")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if os.environ.get("RANK", "0") == "0" and not args.resume:
        write_dataset(args.data, args.samples)

    from transformers import Trainer, TrainerCallback, TrainingArguments

    from recordkit.torch import ReadOptions, RecordDataset

    class Steps(TrainerCallback):
        """Note the epoch; save and stop after ``--stop-after`` steps (a preempted job)."""

        def on_epoch_begin(self, a, state, control, model=None, **_):  # type: ignore[no-untyped-def]
            model.epoch = int(state.epoch or 0)

        def on_step_end(self, a, state, control, **_):  # type: ignore[no-untyped-def]
            if state.global_step == args.stop_after and not args.resume:
                control.should_save = control.should_training_stop = True

    # Single samples (the Trainer batches); on several processes the main process
    # reads every record and the Trainer slices each batch (see above).
    split = {"rank": 0, "world_size": 1} if world > 1 else {}
    ds = RecordDataset(args.data, shuffle=True, seed=0, options=ReadOptions(**split))
    training = TrainingArguments(
        output_dir=str(output),
        per_device_train_batch_size=BATCH,
        num_train_epochs=args.epochs,
        # 0 (the default): recordkit decodes on its reader threads. The Trainer's own
        # workers would each batch their share of samples and end with a short batch,
        # more batches than len() says (refused by name).
        dataloader_num_workers=0,
        save_strategy="no",  # --stop-after saves once
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        seed=0,
    )
    model = Model(args.samples)
    trainer = Trainer(model=model, args=training, train_dataset=ds, callbacks=[Steps()])
    last = None
    if args.resume:
        last = max(output.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    trainer.train(resume_from_checkpoint=str(last) if last else None)

    rank = trainer.args.process_index
    for epoch in sorted({e for e, _ in model.steps}):
        ids = [i for e, step in model.steps if e == epoch for i in step]
        print(f"rank {rank}: epoch {epoch}: {len(ids)} records, {len(set(ids))} distinct")
    if args.labels:
        path = args.labels if world == 1 else Path(f"{args.labels}.rank{rank}")
        path.write_text("".join(json.dumps(s) + "\n" for s in model.steps))
    if world > 1 and torch.distributed.is_initialized():
        torch.distributed.barrier()  # leave together: gloo aborts a rank whose peer hangs up
        torch.distributed.destroy_process_group()
        # DDP keeps the gloo group's C++ threads alive past destroy_process_group (torch
        # 2.13), and they can meet Python's shutdown and abort a finished rank (SIGABRT,
        # "terminate called without an active exception"): leave without that shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
