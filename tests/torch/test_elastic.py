"""Elastic resume: a checkpoint taken at one world size resumes exactly at another.

Real ``torch.distributed`` ranks (gloo, loopback) in subprocesses: the first
phase reads a few global batches at one world size and saves each rank's state;
the second phase, at another world size with the same global batch, loads it and
finishes the epoch. Every record is read exactly once across the interrupted
epoch, and the global batches are those of an uninterrupted single-process run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import recordkit as rk
from recordkit.reader import ReadOptions

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]

from recordkit.torch import RecordDataset  # noqa: E402

N = 403  # not a multiple of the global batch: the last one is partial
GLOBAL = 16
TAKEN = 7  # global batches read before the checkpoint

SCRIPT = """
import json, sys
import torch.distributed as dist
from recordkit.torch import DataLoader, ReadOptions, RecordDataset
path, out, phase, state_file, batch = sys.argv[1:6]
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
ds = RecordDataset(path, batch_size=int(batch), shuffle=True, seed=5,
                   options=ReadOptions(num_threads=1))
loader = DataLoader(ds, num_workers=1 if rank % 2 else 0)
batches = []
if phase == "first":
    for k, b in enumerate(loader):
        batches.append(b["idx"].tolist())
        if k + 1 == TAKEN:
            break
    json.dump(loader.state_dict(), open(f"{state_file}.{rank}", "w"))
else:
    loader.load_state_dict(json.load(open(f"{state_file}.0")))
    batches = [b["idx"].tolist() for b in loader]
json.dump(batches, open(f"{out}.{rank}", "w"))
dist.barrier()
dist.destroy_process_group()
""".replace("TAKEN", str(TAKEN))


@pytest.fixture(scope="module")
def sorted_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic") / "ds"
    with rk.Writer(root, rk.Schema(idx=rk.Int64()), max_records=50) as w:
        for i in range(N):
            w.write({"idx": i})
    return str(root)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _phase(tmp_path, path, phase, world):
    script = tmp_path / "elastic.py"
    script.write_text(SCRIPT)
    out, port = tmp_path / f"{phase}-{world}", _port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                path,
                str(out),
                phase,
                str(tmp_path / "state"),
                str(GLOBAL // world),
            ],
            env=dict(
                os.environ,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(r),
                WORLD_SIZE=str(world),
                GLOO_SOCKET_IFNAME="lo",
            ),
        )
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=200) == 0
    per_rank = [json.loads((tmp_path / f"{phase}-{world}.{r}").read_text()) for r in range(world)]
    # global batch t = every rank's t-th batch, in rank order
    depth = max(len(b) for b in per_rank)
    return [[i for b in per_rank if t < len(b) for i in b[t]] for t in range(depth)]


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4)])
def test_resume_at_another_world_size(sorted_path, tmp_path, before, after):
    whole = [
        b["idx"].tolist()
        for b in RecordDataset(sorted_path, batch_size=GLOBAL, shuffle=True, seed=5)
    ]
    first = _phase(tmp_path, sorted_path, "first", before)
    second = _phase(tmp_path, sorted_path, "second", after)
    assert first == whole[:TAKEN]
    assert second == whole[TAKEN:]
    seen = [i for b in first + second for i in b]
    assert sorted(seen) == list(range(N))  # every record exactly once


def test_another_global_batch_is_refused(sorted_path):
    ds = RecordDataset(
        sorted_path, batch_size=8, shuffle=True, seed=5, options=ReadOptions(world_size=2, rank=0)
    )
    state = ds.state_dict()
    other = RecordDataset(
        sorted_path, batch_size=8, shuffle=True, seed=5, options=ReadOptions(world_size=4, rank=1)
    )
    with pytest.raises(ValueError, match="global_batch was 16 when saved, is 32 now"):
        other.load_state_dict(state)
    same = RecordDataset(
        sorted_path, batch_size=4, shuffle=True, seed=5, options=ReadOptions(world_size=4, rank=1)
    )
    same.load_state_dict(state)  # 4 ranks of 4 = 2 ranks of 8
