"""``torch.distributed`` and CPU helpers of :mod:`recordkit.torch` (imported only by it)."""

from __future__ import annotations

import json
import os

import torch

__all__ = ["common_shards", "cpus", "smallest"]


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def smallest(value: int) -> int:
    """The smallest of every ``torch.distributed`` rank's ``value`` (or ``value`` alone)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def common_shards(paths: list[str]) -> set[str]:
    """The shards every ``torch.distributed`` rank has (each rank's cache differs).

    Exchanged as JSON bytes in uint8 tensors (no pickling), so every rank plans
    the epoch over the same shard set.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return set(paths)
    data = torch.frombuffer(bytearray(json.dumps(sorted(paths)).encode()), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
    width = int(max(int(x) for x in sizes))
    padded = torch.zeros(width, dtype=torch.uint8)
    padded[: len(data)] = data
    gathered = [torch.zeros(width, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(gathered, padded)
    common = set(paths)
    for g, n in zip(gathered, sizes):
        common &= set(json.loads(bytes(g[: int(n)].tolist()).decode()))
    return common
