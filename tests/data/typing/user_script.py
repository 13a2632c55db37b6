"""A user's training script, as a type checker sees it (tests/test_typing.py)."""

from __future__ import annotations

import numpy as np

import recordkit as rk
from recordkit.errors import CorruptRecordError, RecordkitError
from recordkit.torch import DataLoader, RecordDataset, RecordMapDataset


def samples(path: str) -> list[dict[str, object]]:
    return [{"x": np.zeros(4, np.float32), "y": len(path)}]


def main(root: str) -> int:
    schema = rk.Schema(x=rk.Tensor("float32", (4,)), y=rk.Int64(), name=rk.Bytes())
    with rk.Writer(f"{root}/data", schema, shard_size="1MiB") as writer:
        writer.write({"x": np.zeros(4, np.float32), "y": 1, "name": b"a"})
    report: rk.VerifyReport = rk.verify(f"{root}/data")
    assert report.ok
    ds = rk.Dataset(f"{root}/data")
    first: int = len(ds)
    result = rk.convert(f"{root}/rows", f"{root}/out", format="jsonl", workers=0)
    records: int = result.records
    written = rk.write(samples, ["a", "b"], f"{root}/own", schema=schema, workers=0)
    train = RecordDataset(f"{root}/data", batch_size=2, shuffle=True, seed=0)
    loader = DataLoader(train, num_workers=0)
    for batch in loader:
        print(batch["x"].shape)
    state = loader.state_dict()
    loader.load_state_dict(state)
    mapped = RecordMapDataset(f"{root}/data")
    try:
        rk.Dataset(f"{root}/missing")
    except CorruptRecordError as exc:
        print(exc.path, exc.offset)
    except RecordkitError:
        pass
    return first + records + len(mapped) + written.records


if __name__ == "__main__":
    raise SystemExit(main("."))
