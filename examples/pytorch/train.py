"""Train a small PyTorch model on a recordkit dataset (CPU, synthetic data, seconds).

Writes a synthetic classification dataset (16x16 RGB images whose class is the
brightest colour channel, plus a caption), then trains an MLP on it with
``recordkit.torch.RecordDataset``: reader threads decode whole batches off the
training thread; the order is shuffled per epoch and resumable.

    python examples/pytorch/train.py [--data DIR] [--epochs 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

import recordkit as rk
from recordkit.torch import DataLoader, RecordDataset

SCHEMA = rk.Schema(
    image=rk.Tensor("uint8", (16, 16, 3)),
    label=rk.Int64(),
    caption=rk.Bytes(),
)
CLASSES = ["red", "green", "blue"]


def write_dataset(path: str, n: int) -> None:
    rng = np.random.default_rng(0)
    with rk.Writer(
        path, SCHEMA, shard_size="1MiB", overwrite=True, metadata={"classes": CLASSES}
    ) as w:
        for _ in range(n):
            label = int(rng.integers(0, 3))
            image = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
            image[..., label] += 100  # the class is the brightest channel
            w.write({"image": image, "label": label, "caption": f"a {CLASSES[label]} square"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="demo-data/pytorch-train")
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    args = ap.parse_args()

    write_dataset(args.data, args.samples)
    torch.manual_seed(0)
    ds = RecordDataset(
        args.data, batch_size=64, shuffle=True, seed=0, drop_last=True, columns=["image", "label"]
    )
    loader = DataLoader(ds, num_workers=args.workers)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16 * 16 * 3, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        t0, correct, seen, loss_sum = time.perf_counter(), 0, 0, 0.0
        for batch in loader:
            x = batch["image"].float().div_(255.0)
            y = batch["label"]
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((logits.argmax(1) == y).sum())
            seen += len(y)
            loss_sum += float(loss) * len(y)
        print(
            f"epoch {epoch}: loss {loss_sum / seen:.3f}  accuracy {correct / seen:.3f}  "
            f"{seen} samples in {time.perf_counter() - t0:.2f} s"
        )
    state = loader.state_dict()
    print(f"reader stats: {ds.stats.as_dict()}")
    print(f"resume state after training: epoch {state['epoch']}, consumed {state['consumed']}")
    assert correct / seen > 0.9, "the model should learn this task"


if __name__ == "__main__":
    main()
