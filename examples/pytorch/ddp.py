"""Distributed data parallel training on one machine: 2 processes, gloo, CPU (seconds).

Writes a small dataset, then starts 2 ranks with ``torch.multiprocessing`` (no
``torchrun`` needed). Each rank opens the same ``RecordDataset``; recordkit sees
the ``torch.distributed`` rank and world size and gives each rank its own slice
of every epoch: every record exactly once per epoch over all ranks, and with
``drop_last=True`` the same number of full batches on every rank (what DDP's
collective ops need). Each rank prints what it read; rank 0 checks, with an
``all_reduce``, that the ranks together read every record exactly once.

    python examples/pytorch/ddp.py [--data DIR] [--samples 3000] [--epochs 2]

The same script works under ``torchrun --nproc-per-node 2`` with a real cluster's
``init_method``; only ``launch()`` is specific to running it from one command.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import recordkit as rk
from recordkit.torch import RecordDataset

WORLD = 2
TIMEOUT_S = 120  # the whole run; a stuck rank is terminated, not waited for


def write_dataset(path: str, n: int) -> None:
    """``n`` records: an id, 8 features and a label that depends on them."""
    rng = np.random.default_rng(0)
    schema = rk.Schema(id=rk.Int64(), x=rk.Float32((8,)), label=rk.Int64())
    with rk.Writer(path, schema, max_records=250, overwrite=True) as w:
        for i in range(n):
            x = rng.normal(size=8).astype(np.float32)
            w.write({"id": i, "x": x, "label": int(x.sum() > 0)})


def worker(rank: int, port: int, data: str, epochs: int, samples: int) -> None:
    """One rank: train with DDP, then count what this rank reads in an epoch."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    try:
        torch.manual_seed(0)  # the same initial weights on every rank
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ds = RecordDataset(data, batch_size=50, shuffle=True, seed=0, drop_last=True)
        for epoch in range(epochs):
            batches = 0
            for batch in ds:  # each pass is the next epoch, reshuffled
                loss = nn.functional.cross_entropy(model(batch["x"]), batch["label"])
                opt.zero_grad()
                loss.backward()  # gradients are averaged over the ranks here
                opt.step()
                batches += 1
            print(
                f"rank {rank}: epoch {epoch}: {batches} batches, loss {loss.item():.3f}", flush=True
            )

        # Exactly once: without drop_last, the ranks' slices cover every record.
        every = RecordDataset(data, batch_size=64, columns=["id"])
        ids = torch.cat([b["id"] for b in every])
        print(f"rank {rank}: read {len(ids)} records", flush=True)
        seen = torch.zeros(samples, dtype=torch.int64)
        seen[ids] += 1
        dist.all_reduce(seen)  # summed over the ranks: 1 for every record, or it is wrong
        if rank == 0:
            assert bool((seen == 1).all()), f"records not read exactly once: {seen.tolist()}"
            print(f"all ranks: {int(seen.sum())} records, each exactly once")
        dist.barrier()  # leave together: gloo aborts a rank whose peer hangs up first
    finally:
        dist.destroy_process_group()
    # DDP keeps the gloo group (and its C++ threads) alive past destroy_process_group
    # (torch 2.13: its 3 threads remain after `del model` and gc), and those threads
    # can meet Python's shutdown and abort the rank after its work is done (SIGABRT,
    # "terminate called without an active exception": 2 runs of ~110 here). A rank
    # that finished leaves without that shutdown; one that failed raised above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port() -> int:
    """A free TCP port on the loopback interface for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(data: str, epochs: int, samples: int) -> None:
    """Start the ranks (spawned, like torchrun's) and wait for them, bounded in time."""
    ctx = mp.start_processes(
        worker, args=(free_port(), data, epochs, samples), nprocs=WORLD, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=1):  # raises if a rank failed
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks still running after {TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)


def main() -> None:
    """Write the data, then train on it with 2 ranks."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="demo-data/ddp")
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # 2 ranks on a small machine
    write_dataset(args.data, args.samples)
    launch(args.data, args.epochs, args.samples)


if __name__ == "__main__":
    main()
