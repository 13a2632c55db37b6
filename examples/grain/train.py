"""Train from a recordkit dataset with Grain, JAX's data loader (NumPy batches; JAX optional).

Grain reads ``rk.Dataset`` by random access (``len(ds)``, ``ds[i]``) in worker
processes; each copy of the dataset maps the shards itself. Grain shuffles, batches
and counts epochs; the model is NumPy logistic regression (with JAX, hand the same
batches to ``jax.device_put``). Part-way through the second epoch the run saves
Grain's iterator state (``iterator.get_state()``) with the weights and stops, as a
preempted job would; a new loader restores it (``iterator.set_state()``) and
finishes. Every record id read is checked against an uninterrupted run: each record
once per epoch, nothing read twice across the resume.

    pip install 'recordkit[grain]'
    python examples/grain/train.py [--data DIR] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os

import grain
import numpy as np

import recordkit as rk

SCHEMA = rk.Schema(x=rk.Float32((8,)), label=rk.Int64(), id=rk.Int64())
BATCH = 64


def write_dataset(path: str, n: int) -> None:
    """Two classes, told apart by a linear rule (so a model that learns gets there)."""
    rng = np.random.default_rng(0)
    direction = np.linspace(-1.0, 1.0, 8).astype(np.float32)
    with rk.Writer(path, SCHEMA, max_records=256, overwrite=True) as w:
        for i in range(n):
            x = rng.standard_normal(8).astype(np.float32)
            w.write({"x": x, "label": int(x @ direction > 0), "id": i})


def make_loader(path: str, epochs: int, workers: int) -> grain.DataLoader:
    source = rk.Dataset(path)  # pickled to each worker by reference: paths and counts, no maps
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shard_options=grain.sharding.NoSharding(),
        shuffle=True,
        num_epochs=epochs,
        seed=0,
    )
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[grain.transforms.Batch(batch_size=BATCH, drop_remainder=True)],
        worker_count=workers,
    )


def step(w: np.ndarray, batch: dict[str, np.ndarray], lr: float = 0.5) -> np.ndarray:
    """One step of logistic regression (bias as the last weight)."""
    x = np.concatenate([batch["x"], np.ones((len(batch["x"]), 1), np.float32)], axis=1)
    p = 1.0 / (1.0 + np.exp(-(x @ w)))
    out: np.ndarray = w - lr * x.T @ (p - batch["label"]) / len(x)
    return out


def accuracy(w: np.ndarray, path: str) -> float:
    ds = rk.Dataset(path)
    x = np.stack([ds[i]["x"] for i in range(len(ds))])
    y = np.array([int(ds[i]["label"]) for i in range(len(ds))])
    pred = (np.concatenate([x, np.ones((len(x), 1), np.float32)], axis=1) @ w) > 0
    return float((pred == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="demo-data/grain-train")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="Grain worker processes")
    ap.add_argument("--stop-at", type=int, default=45, help="the step the first run stops at")
    args = ap.parse_args()

    write_dataset(args.data, args.samples)
    per_epoch = args.samples // BATCH
    ckpt = os.path.join(args.data, "..", "grain-ckpt")
    os.makedirs(ckpt, exist_ok=True)

    # The first run: train, checkpoint the loader with the model, stop.
    w = np.zeros(9, np.float32)
    ids: list[int] = []
    iterator = iter(make_loader(args.data, args.epochs, args.workers))
    for k, batch in enumerate(iterator, start=1):
        w = step(w, batch)
        ids += batch["id"].tolist()
        if k == args.stop_at:
            with open(os.path.join(ckpt, "loader.json"), "wb") as f:
                f.write(iterator.get_state())  # JSON bytes: the sampler position per worker
            np.save(os.path.join(ckpt, "weights.npy"), w)
            break
    del iterator  # the workers stop
    print(f"stopped after step {args.stop_at} (epoch {args.stop_at // per_epoch})")

    # The resumed run (a new process would do the same): new loader, restore, finish.
    w = np.load(os.path.join(ckpt, "weights.npy"))
    iterator = iter(make_loader(args.data, args.epochs, args.workers))
    with open(os.path.join(ckpt, "loader.json"), "rb") as f:
        iterator.set_state(f.read())
    steps = args.stop_at
    for batch in iterator:
        w = step(w, batch)
        ids += batch["id"].tolist()
        steps += 1
    print(f"resumed: {steps - args.stop_at} more steps, {steps} in all")

    # Check, by record id, against an uninterrupted run (as many workers: each worker
    # batches the records dealt to it, so the order depends on their number).
    loader = make_loader(args.data, args.epochs, args.workers)
    reference = [i for b in loader for i in b["id"].tolist()]
    assert ids == reference, "the resumed run read other records than the uninterrupted one"
    read = per_epoch * BATCH
    for e in range(args.epochs):
        epoch = ids[e * read : (e + 1) * read]
        assert len(set(epoch)) == read, f"epoch {e} read a record twice"
    print(f"{len(ids)} ids: the uninterrupted run's, each record once per epoch")
    print(json.dumps({"steps": steps, "per_epoch": per_epoch}))
    print(f"accuracy {accuracy(w, args.data):.3f}")


if __name__ == "__main__":
    main()
