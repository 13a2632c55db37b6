"""MosaicML Streaming's side of ``cache_bench.py --whole`` (run in its own venv: see there).

``write``: the benchmark's synthetic records (the same bytes as recordkit's
``make_dataset``: ``default_rng(0).bytes`` per record) as MDS shards.
``read``: time to the first batch and two epochs of ``StreamingDataset`` over the
S3 remote (``S3_ENDPOINT_URL`` in the environment), printed as one JSON line.

Imports only numpy and streaming (not recordkit).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def write(out: str, records: int, record_kib: int, shard_mib: int) -> None:
    from streaming import MDSWriter

    rng = np.random.default_rng(0)
    columns = {"data": "bytes", "label": "int"}
    with MDSWriter(out=out, columns=columns, size_limit=shard_mib << 20) as w:
        for i in range(records):
            w.write({"data": rng.bytes(record_kib * 1024), "label": i})


def read(args: argparse.Namespace) -> dict:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    ds = StreamingDataset(
        remote=args.remote,
        local=args.local,
        batch_size=args.batch,
        shuffle=args.shuffle,
        shuffle_seed=1,
        shuffle_block_size=args.block or None,
        cache_limit=args.budget,
    )
    loader = DataLoader(ds, batch_size=args.batch, num_workers=args.workers)
    out: dict = {}
    for epoch in range(2):
        start = time.perf_counter()
        nbytes = 0
        records = 0
        for k, batch in enumerate(loader):
            if epoch == 0 and k == 0:
                out["ttfb_s"] = time.perf_counter() - t0
            nbytes += sum(len(x) for x in batch["data"])
            records += len(batch["label"])
        secs = time.perf_counter() - start
        out[f"epoch{epoch}_s"] = secs
        out[f"epoch{epoch}_records"] = records
        out[f"epoch{epoch}_mib_s"] = nbytes / secs / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["write", "read"])
    ap.add_argument("--out")
    ap.add_argument("--records", type=int)
    ap.add_argument("--record-kib", type=int)
    ap.add_argument("--shard-mib", type=int)
    ap.add_argument("--remote")
    ap.add_argument("--local")
    ap.add_argument("--budget", type=int)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--block", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.what == "write":
        write(args.out, args.records, args.record_kib, args.shard_mib)
    else:
        print(json.dumps(read(args)))


if __name__ == "__main__":
    main()
