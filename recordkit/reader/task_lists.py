"""Ragged numbers and lists of bytes as whole-task columns of the native runner.

``recordkit.tf``'s native path decodes each task of the epoch plan with one
``Runner.run`` call (``recordkit/reader/_contract.py`` has the runner's contract). A
ragged number whose only ``None`` is the first dim, and a list of bytes, take a
*packed* or *list* column there: each record's values appended to one array, with its
size beside it. :class:`TaskLists` lays out those columns' slots after the fixed
features' (the torch reader's), guesses the room each needs from what earlier tasks
held per payload byte, runs a task again when the runner says it needed more, and
reads the slots back as ``(values, rows)`` (numbers) or ``(bytes, lengths, counts)``
(lists of bytes). The functions below join such columns from several parts of a task
(its shards' records, interleaved in stream order) and turn the reference decoder's
per-record values into the same layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..codec import Bytes, Float32, Int64, Tensor
from ..format.framing import OVERHEAD
from . import _contract
from ._contract import Alloc, ColumnSpec
from .decode import BatchDecoder
from .ragged import first_dim_ragged

__all__ = ["TaskLists", "from_records", "gather", "list_column", "scatter", "splits", "sums"]


def list_column(ftype: Any) -> ColumnSpec | None:
    """The runner's packed or list column for a feature the batch decoder decodes per
    record (a ragged number, a list of bytes), or ``None`` (not one the runner takes).
    An absent feature reads as no values where ``parse_example`` reads it so (a
    ``RaggedFeature``: numbers with ``None`` dims, ``Bytes((None,))``)."""
    shape = ftype.shape
    if isinstance(ftype, Bytes):
        if len(shape) != 1 or shape[0] == 0:
            return None
        count = shape[0] or 0  # a fixed count: a FixedLenFeature, which absence fails
        return ColumnSpec(
            _contract.COL_BYTES_LIST, 0, 0, count, False, _contract.KIND_BYTES, not count
        )
    inner = first_dim_ragged(ftype)
    if inner is None:
        return None
    unit = math.prod(inner)
    if isinstance(ftype, Int64):
        return ColumnSpec(_contract.COL_PACKED_INT64, 0, 0, unit, False, _contract.KIND_INT64, True)
    if isinstance(ftype, Float32):
        return ColumnSpec(_contract.COL_PACKED, 0, 4 * unit, 0, True, _contract.KIND_FLOAT, True)
    if isinstance(ftype, Tensor):
        nbytes = unit * np.dtype(ftype.dtype).itemsize
        return ColumnSpec(_contract.COL_PACKED, 0, nbytes, 0, True, _contract.KIND_BYTES, False)
    return None


class TaskLists:
    """The slots of a decoder's packed runner: the fixed features', then per ragged
    feature its packed or list column's (see the module docs).

    Args:
        decoder: a decoder whose every ``"list"`` feature :func:`list_column` takes.

    Attributes:
        lists: the ragged features' columns, in schema order.
        runner: ``decoder.packed_runner(lists)``, or ``None`` (no native runner).
    """

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.fixed = [p for p in decoder.plans if p.mode != "list"]
        self.lists: dict[str, ColumnSpec] = {}
        for plan in decoder.plans:
            if plan.mode == "list":
                col = list_column(plan.ftype)
                if col is None:
                    raise ValueError(f"feature {plan.name!r} has no packed or list column")
                self.lists[plan.name] = col
        runner = decoder.packed_runner(self.lists)
        self.runner = runner if hasattr(runner, "run") else None
        # Per packed or list slot, the most it held per payload byte so far (None: none
        # yet, the bound then): the room given to the next task (more: run again).
        self._lengths_slots: set[int] = set()  # a bytes list's values' lengths
        k = 0
        for col in self.lists.values():
            if col.mode == _contract.COL_BYTES_LIST:
                self._lengths_slots.add(k + 1)
            k += 3 if col.mode == _contract.COL_BYTES_LIST else 2
        self._per_byte: list[float | None] = [None] * k

    def run(
        self,
        bufs: tuple[Any, ...],
        table: np.ndarray,
        widths: Sequence[int],
        alloc: Alloc,
    ) -> dict[str, Any] | None:
        """One task (``bufs``, ``table`` as ``Runner.run`` takes them; ``widths`` the
        bytes columns' row widths): its columns, or ``None`` if the runner refused a
        record (the reference decoder's then). Run again, once, with the room the runner
        said it needed."""
        assert self.runner is not None
        n = len(table)
        payload = int(table[:, 2].sum()) - n * OVERHEAD if n else 0
        rooms = [self._room(k, payload) for k in range(len(self._per_byte))]
        for _ in range(2):
            outs = _contract.task_outputs(self.fixed, n, widths, alloc)
            outs += self._outputs(n, rooms, alloc)
            ok, got, needs = self.runner.run(bufs, table, outs)
            mine = needs[len(outs) - len(rooms) :]
            if ok or all(need <= room for need, room in zip(mine, rooms)):
                break
            rooms = [max(need, room) for need, room in zip(mine, rooms)]
        if not ok:
            return None
        cut = len(outs) - len(rooms)
        columns = _contract.task_columns(self.fixed, outs[:cut], got[: len(self.fixed)], n)
        columns.update(self._columns(outs[cut:], mine, payload))
        return columns

    def _room(self, slot: int, payload: int) -> int:
        """The elements to allocate for slot ``slot`` of a task of ``payload`` bytes: the
        most per byte seen so far, with an eighth more, or the bound (a value's bytes, or
        an int64 list's count, are at most its payload's bytes; a bytes list's values at
        most half of them)."""
        seen = self._per_byte[slot]
        bound = payload // 2 if slot in self._lengths_slots else payload
        if seen is None:
            return bound
        return min(bound, int(seen * payload * 1.125) + 64)

    def _outputs(self, n: int, rooms: list[int], alloc: Alloc) -> tuple[np.ndarray, ...]:
        """Per column its values (``rooms``), a bytes list's values' lengths, and each
        record's size."""
        outs: list[np.ndarray] = []
        k = 0
        for col in self.lists.values():
            dtype = np.int64 if col.mode == _contract.COL_PACKED_INT64 else np.uint8
            outs.append(alloc((rooms[k],), np.dtype(dtype)))
            if col.mode == _contract.COL_BYTES_LIST:
                outs.append(np.empty(rooms[k + 1], np.int64))
                k += 1
            outs.append(np.empty(n, np.int64))
            k += 2
        return tuple(outs)

    def _columns(
        self, outs: Sequence[np.ndarray], needs: Sequence[int], payload: int
    ) -> dict[str, Any]:
        """The ragged features' columns from their slots, learning what each slot held per
        payload byte."""
        for k, need in enumerate(needs):
            per = need / payload if payload else 0.0
            self._per_byte[k] = max(self._per_byte[k] or 0.0, per)
        columns: dict[str, Any] = {}
        k = 0
        for name, col in self.lists.items():
            if col.mode == _contract.COL_BYTES_LIST:
                values, lengths, counts = outs[k : k + 3]
                columns[name] = (values[: needs[k]], lengths[: needs[k + 1]], counts)
                k += 3
                continue
            values, sizes = outs[k], outs[k + 1]
            if col.mode == _contract.COL_PACKED:
                values = values[: needs[k]].view(self.decoder.packed[name].dtype)
                rows = sizes // col.row_bytes
            else:
                values = values[: needs[k]]
                rows = sizes // col.nvalues
            columns[name] = (values, rows)
            k += 2
        return columns


def from_records(records: list[Any], dtype: np.dtype[Any] | None) -> tuple[np.ndarray, ...]:
    """Per-record values (the reference decoder's) as :class:`TaskLists` gives them:
    numbers of ``dtype`` ``(values, rows)``, bytes lists (``dtype`` None) ``(bytes,
    lengths, counts)``."""
    if dtype is None:
        counts = np.fromiter((len(r) for r in records), np.int64, len(records))
        flat = [v for r in records for v in r]
        lengths = np.fromiter((len(v) for v in flat), np.int64, len(flat))
        return np.frombuffer(b"".join(flat), np.uint8), lengths, counts
    rows = np.fromiter((len(r) for r in records), np.int64, len(records))
    values = [np.asarray(r, dtype).reshape(-1) for r in records]
    return (np.concatenate(values) if values else np.empty(0, dtype)), rows


def scatter(n: int, parts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per record of a task of ``n``, its value from the part holding it (``(positions,
    values)`` per part)."""
    out = np.zeros(n, np.int64)
    for idx, values in parts:
        out[idx] = values
    return out


def gather(
    sizes: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], dtype: Any
) -> np.ndarray:
    """The elements of every record in stream order, ``sizes`` each, from the parts that
    hold them (``(positions, sizes, elements)`` per part, its records in its order)."""
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), dtype)
    for idx, size, elements in parts:
        local = np.cumsum(size) - size
        out[np.repeat(starts[idx] - local, size) + np.arange(len(elements))] = elements
    return out


def splits(sizes: np.ndarray) -> np.ndarray:
    """Row splits of rows of ``sizes``: 0, then where each row ends."""
    out = np.empty(len(sizes) + 1, np.int64)
    out[0] = 0
    np.cumsum(sizes, out=out[1:])
    return out


def sums(lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per record, the sum of its ``counts[i]`` values of ``lengths``."""
    ends = np.cumsum(np.concatenate([[0], lengths]))
    bounds = np.cumsum(np.concatenate([[0], counts]))
    out: np.ndarray = ends[bounds[1:]] - ends[bounds[:-1]]
    return out
