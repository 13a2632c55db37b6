"""A reader's tasks: whole units of an epoch plan, located and grouped by shard.

:class:`~recordkit.reader.pipeline.RecordReader` hands reader threads (or the
native runner) a :class:`Task` at a time: as many whole units (batches, or single
records) as fit its record and byte budgets, each row located (unit, shard,
record) and the rows grouped by shard, so a shuffled task reads each shard's
records in one call. The helpers here cut tasks to the map and cache budgets and
join a task's per-shard pieces back into its order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Columns",
    "Task",
    "concat",
    "groups_by_shard",
    "pieces",
    "take",
    "units_within",
]

Columns = dict[str, Any]


@dataclass
class Task:
    """Whole units of the plan, located: for each row its unit, shard and record."""

    units: range
    unit_of_row: np.ndarray
    shard_ids: np.ndarray
    records: np.ndarray
    groups: list[tuple[int, np.ndarray]]  # (shard id, its rows in task order), by shard id

    @property
    def nshards(self) -> int:
        """Distinct shards: what the task holds mapped while it runs."""
        return len(self.groups)


def units_within(task: Task, limit: int, nbytes: np.ndarray | None = None) -> int:
    """How many of a task's leading units touch at most ``limit`` distinct shards, or
    with ``nbytes`` (bytes per shard id) shards of at most ``limit`` bytes (>= 1)."""
    ids, first_rows = np.unique(task.shard_ids, return_index=True)
    order = np.argsort(first_rows)
    total = np.arange(1, len(ids) + 1) if nbytes is None else np.cumsum(nbytes[ids[order]])
    over = np.flatnonzero(total > limit)
    if not len(over):
        return len(task.units)
    row = int(first_rows[order[over[0]]])  # the first row of the shard past the limit
    units_before = int(task.unit_of_row[row]) - task.units.start
    return max(1, units_before // task.units.step)


def pieces(task: Task, cap: int) -> list[np.ndarray | None]:
    """A task's rows in pieces that each touch at most ``cap`` shards (``[None]``: one)."""
    if task.nshards <= cap:
        return [None]
    groups = task.groups
    return [
        np.concatenate([rows for _, rows in groups[k : k + cap]])
        for k in range(0, len(groups), cap)
    ]


def groups_by_shard(shard_ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """A task's rows grouped by shard: ``(shard id, rows in task order)``, by shard id."""
    if not len(shard_ids):
        return []
    if (np.diff(shard_ids) >= 0).all():  # unshuffled: runs already in order
        order = np.arange(len(shard_ids))
        ids = shard_ids
    else:
        # A stable sort; ids that fit 16 bits take NumPy's radix sort (linear).
        keys = shard_ids.astype(np.uint16) if shard_ids.max() < 1 << 16 else shard_ids
        order = np.argsort(keys, kind="stable")
        ids = shard_ids[order]
    edges = (np.flatnonzero(np.diff(ids)) + 1).tolist()
    return [
        (int(ids[lo]), order[lo:hi]) for lo, hi in zip([0, *edges], [*edges, len(ids)], strict=True)
    ]


def take(columns: Columns, index: np.ndarray) -> Columns:
    """Columns with their rows reordered by ``index``."""
    out: Columns = {}
    for key, value in columns.items():
        if isinstance(value, np.ndarray):
            out[key] = value[index]
        else:
            out[key] = [value[i] for i in index.tolist()]
    return out


def concat(
    parts: list[tuple[Columns, int]], alloc: Callable[[tuple[int, ...], Any], np.ndarray]
) -> tuple[Columns, int]:
    """Join the per-shard pieces of one batch (most batches have one piece)."""
    if len(parts) == 1:
        return parts[0]
    rows = sum(n for _, n in parts)
    out: Columns = {}
    for key, first in parts[0][0].items():
        pieces = [cols[key] for cols, _ in parts]
        if isinstance(first, np.ndarray):
            if any(p.shape[1:] != first.shape[1:] for p in pieces):
                # padded bytes or ragged numbers of different widths: pad to the widest
                top = tuple(max(d) for d in zip(*(p.shape[1:] for p in pieces), strict=True))
                joined = alloc((rows, *top), first.dtype)
                joined[...] = 0
                row = 0
                for p in pieces:
                    joined[(slice(row, row + len(p)), *(slice(0, d) for d in p.shape[1:]))] = p
                    row += len(p)
            else:
                joined = alloc((rows, *first.shape[1:]), first.dtype)
                np.concatenate(pieces, out=joined)
            out[key] = joined
        else:
            out[key] = [v for p in pieces for v in p]
    return out, rows
