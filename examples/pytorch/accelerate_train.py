"""Train with Hugging Face Accelerate on a recordkit dataset: each process reads its own
share of every epoch, a new order every epoch, exact resume with ``save_state`` /
``load_state`` (CPU, synthetic, seconds).

Run it on 2 processes (gloo on CPU; NCCL on GPUs) with either launcher::

    torchrun --nproc-per-node 2 examples/pytorch/accelerate_train.py [--data DIR] [--epochs 3]
    accelerate launch --num_processes 2 --cpu examples/pytorch/accelerate_train.py

    ... --stop-after 40   # save_state after step 40, then stop as a preempted job would
    ... --resume          # load_state and continue at the next batch

The loader is not given to ``accelerator.prepare()``: for an iterable dataset,
prepare() reads it on the main process alone and sends each process a slice of
every batch, so recordkit's per-rank reading (and its speed) would be lost, and a
``RecordDataset`` that reads one rank's share there is refused by name. Instead
each process's ``RecordDataset`` takes its rank from ``torch.distributed``, and
``accelerator.register_for_checkpointing(loader)`` puts the loader's position in
Accelerate's checkpoints. The loop starts at ``ds.epoch``: after ``load_state``,
the epoch the saved position is in (the next one if it was saved at an epoch's
end). Accelerate never calls ``set_epoch`` on it, so its epoch counter, which it
does not save (accelerate issue #3996), plays no part.

``--labels FILE`` writes ``[epoch, [labels]]`` for every step to ``FILE.rankN``
(``label`` is the record's number): ``tests/frameworks`` compares them with an
uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
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
    ap.add_argument("--data", type=Path, default=Path("demo-data/accelerate"))
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: DATA.state")
    ap.add_argument("--stop-after", type=int, default=0, help="save_state, then stop")
    ap.add_argument("--resume", action="store_true", help="load_state from --checkpoint")
    ap.add_argument("--labels", type=Path, default=None)
    args = ap.parse_args()
    ckpt = args.checkpoint or args.data.with_suffix(".state")

    from accelerate import Accelerator

    from recordkit.torch import DataLoader, RecordDataset

    acc = Accelerator(cpu=not torch.cuda.is_available())
    if acc.is_main_process and not args.resume:
        write_dataset(args.data, args.samples)
    acc.wait_for_everyone()

    # Each process reads its own share of every epoch (its rank from torch.distributed).
    ds = RecordDataset(args.data, batch_size=BATCH, shuffle=True, seed=0)
    loader = DataLoader(ds, num_workers=args.workers)
    acc.register_for_checkpointing(loader)  # its position travels in save_state

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)  # not the loader (see above)
    if args.resume:
        acc.load_state(str(ckpt))

    steps: list[tuple[int, list[int]]] = []  # (epoch, labels) per step
    stopped = False
    for epoch in range(ds.epoch, args.epochs):  # after load_state: the saved epoch
        for batch in loader:
            steps.append((epoch, batch["label"].tolist()))
            x = batch["x"].to(acc.device)
            target = batch["label"].to(acc.device).float()[:, None] / args.samples
            loss = torch.nn.functional.mse_loss(model(x), target)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if len(steps) == args.stop_after and not args.resume:
                acc.save_state(str(ckpt))
                stopped = True
                break
        if stopped:
            break

    rank = acc.process_index
    for epoch in sorted({e for e, _ in steps}):
        ids = [i for e, step in steps if e == epoch for i in step]
        print(f"rank {rank}: epoch {epoch}: {len(ids)} records, {len(set(ids))} distinct")
    if args.labels:
        path = Path(f"{args.labels}.rank{rank}")
        path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    acc.wait_for_everyone()
    acc.end_training()  # destroys the process group
    if acc.num_processes > 1:
        leave()


def leave() -> None:
    """Exit without Python's shutdown. DDP keeps the gloo group (and its C++ threads)
    alive past ``destroy_process_group`` (torch 2.13), and those threads can meet the
    interpreter's shutdown and abort a rank whose work is done (SIGABRT, "terminate
    called without an active exception"; once in a CI run here). See examples/pytorch/ddp.py.
    """
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2 processes on a small machine
    main()
