"""Train with PyTorch Lightning on a recordkit dataset: a new order every epoch, every
record once per epoch, exact resume from a checkpoint (CPU, synthetic, seconds).

A ``LightningDataModule`` whose ``train_dataloader`` is torchdata's
``StatefulDataLoader`` over ``RecordDataset``. Lightning takes exactly
``len(loader)`` batches an epoch and never asks for another; recordkit counts the
epoch done when its last batch is handed out, so the next epoch is read in a new
order. Lightning saves the loader's state in its checkpoints, so ``ckpt_path=``
resumes at the next batch, mid-epoch or at an epoch's end. With ``--devices 2``,
DDP over 2 CPU processes (gloo): each rank reads its own share of every epoch.

    python examples/pytorch/lightning_train.py [--data DIR] [--epochs 3] [--workers 2] [--devices 2]
    python examples/pytorch/lightning_train.py --stop-after 40   # checkpoint at step 40, stop
    python examples/pytorch/lightning_train.py --resume          # ... and continue from it

``--labels FILE`` writes ``[epoch, [labels]]`` for every step, one JSON line each
(with DDP, ``FILE.rank0`` and ``FILE.rank1``): the record ids each step trained on,
which ``tests/frameworks`` compares with an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("demo-data/lightning"))
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--devices", type=int, default=1, help="2: DDP over 2 CPU processes")
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: DATA.ckpt")
    ap.add_argument("--stop-after", type=int, default=0, help="save a checkpoint, then stop")
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--labels", type=Path, default=None)
    args = ap.parse_args()
    ckpt = args.checkpoint or args.data.with_suffix(".ckpt")
    # Lightning's DDP launcher runs this script again for rank 1: the data is there.
    if os.environ.get("LOCAL_RANK", "0") == "0" and not args.resume:
        write_dataset(args.data, args.samples)

    import lightning as L
    from torchdata.stateful_dataloader import StatefulDataLoader

    from recordkit.torch import RecordDataset

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> StatefulDataLoader:
            # batch_size=None: recordkit batches (faster, and the order does not
            # depend on the workers); shuffle and seed: a new order every epoch.
            ds = RecordDataset(args.data, batch_size=BATCH, shuffle=True, seed=0)
            return StatefulDataLoader(ds, batch_size=None, num_workers=args.workers)

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)
            self.steps: list[tuple[int, list[int]]] = []  # (epoch, labels) per step

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            self.steps.append((self.current_epoch, batch["label"].tolist()))
            target = batch["label"].float()[:, None] / args.samples
            return torch.nn.functional.mse_loss(self.linear(batch["x"]), target)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class StopAfter(L.Callback):
        """Save a checkpoint after a step and stop, as a preempted job would."""

        def on_train_batch_end(self, trainer, *_: object) -> None:  # type: ignore[no-untyped-def]
            if trainer.global_step == args.stop_after:
                trainer.save_checkpoint(ckpt)
                trainer.should_stop = True

    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # a 2-CPU machine
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        callbacks=[StopAfter()] if args.stop_after else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    trainer.fit(model, datamodule=Data(), ckpt_path=ckpt if args.resume else None)

    rank = trainer.global_rank
    for epoch in sorted({e for e, _ in model.steps}):
        ids = [i for e, step in model.steps if e == epoch for i in step]
        print(f"rank {rank}: epoch {epoch}: {len(ids)} records, {len(set(ids))} distinct")
    if args.labels:
        out = args.labels if args.devices == 1 else Path(f"{args.labels}.rank{rank}")
        out.write_text("".join(json.dumps(s) + "\n" for s in model.steps))
    if args.devices > 1 and torch.distributed.is_initialized():
        torch.distributed.barrier()  # leave together: gloo aborts a rank whose peer hangs up
        torch.distributed.destroy_process_group()
        # DDP keeps the gloo group's C++ threads alive past destroy_process_group (torch
        # 2.13), and they can meet Python's shutdown and abort a finished rank (SIGABRT,
        # "terminate called without an active exception": once in a CI run here, after
        # every epoch was right): leave without that shutdown, as examples/pytorch/ddp.py.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
