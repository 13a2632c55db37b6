"""From a folder of images to a trained PyTorch model (CPU, synthetic data, seconds).

1. Makes a folder of PNG images in torchvision's ``ImageFolder`` layout
   (``images/<class>/<n>.png``): 24x24 squares whose class is their colour.
2. Converts it with ``recordkit.convert(..., format="imagefolder")``: indexed
   TFRecord shards plus ``recordkit.json`` (the PNG bytes are stored as they are,
   the class names go into the manifest's metadata), then verifies it.
3. Trains a small CNN with ``recordkit.torch.RecordDataset``: reader threads read
   whole batches; the PNGs are decoded in the batch ``transform``.

    python examples/pytorch/convert_and_train.py [--workdir DIR] [--epochs 3]

Needs torch and Pillow (``pip install 'recordkit[torch,images]'``, or
``'recordkit[examples]'`` for every example). With your own
images, skip step 1 and point ``recordkit convert`` at your folder.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

import recordkit as rk
from recordkit.torch import DataLoader, RecordDataset

COLOURS = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
SIZE = 24


def make_image_folder(root: Path, per_class: int) -> None:
    """``root/<colour>/<n>.png``: noisy squares of one colour each."""
    rng = np.random.default_rng(0)
    for name, rgb in COLOURS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            noise = rng.integers(-30, 30, (SIZE, SIZE, 3))
            pixels = np.clip(np.array(rgb) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i:04d}.png")


def decode_pngs(batch: dict) -> dict:
    """Batch transform: padded PNG bytes -> a float image tensor ``(N, 3, H, W)``."""
    data, lengths = batch["image"].numpy(), batch["image/lengths"].numpy()
    images = [
        np.asarray(Image.open(io.BytesIO(data[i, :n].tobytes())).convert("RGB"))
        for i, n in enumerate(lengths)
    ]
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div_(255.0)
    return {"image": x, "label": batch["label"]}


def main() -> None:
    """Make images, convert them, train on the result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("demo-data/convert-and-train"))
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()

    images, data = args.workdir / "images", args.workdir / "train"
    make_image_folder(images, args.per_class)
    result = rk.convert(images, data, format="imagefolder", shard_size="64KiB", overwrite=True)
    print(result.summary())
    assert rk.verify(data).ok
    classes = rk.Dataset(data).metadata["classes"]
    print(f"classes {classes}")

    torch.manual_seed(0)
    ds = RecordDataset(
        data, batch_size=32, shuffle=True, seed=0, columns=["image", "label"],
        transform=decode_pngs,
    )  # fmt: skip
    loader = DataLoader(ds)  # counts batches, so state_dict() can resume mid-epoch
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(8 * 16, len(classes)),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        correct = seen = 0
        for batch in loader:
            logits = model(batch["image"])
            loss = nn.functional.cross_entropy(logits, batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += int((logits.argmax(1) == batch["label"]).sum())
            seen += len(batch["label"])
        print(
            f"epoch {epoch}: loss {loss.item():.3f}  accuracy {correct / seen:.3f}  ({seen} images)"
        )
    print(f"final accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
