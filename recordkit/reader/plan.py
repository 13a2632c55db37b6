"""The epoch plan: which records, in which order, for this rank and worker.

Everything here is a pure function of (the shard set's record counts, seed,
epoch, shuffle options, world size, rank, number of DataLoader workers, worker
id, resume position) — never of timing — so two runs with the same inputs
read the same records in the same order, and a resumed run continues exactly
where the interrupted one stopped.

How an epoch is ordered (``shuffle=True``):

1. The shards are permuted (seeded by ``seed`` and ``epoch``).
2. Each shard is cut into *blocks* of ``block_records`` consecutive records.
3. The permuted shards are taken ``window_shards`` at a time; all blocks of the
   shards in one window are permuted together, so neighbouring batches mix
   records of several shards.
4. Records are permuted inside each block.

Reads stay mostly sequential: a block is a contiguous run of one shard, and a
window touches only ``window_shards`` files. Without shuffle the order is the
dataset order. The order is stored per block, never per record, so a plan for
a billion records costs memory per block only.

How an epoch is split: the global order is cut into ``world_size`` contiguous
slices, one per rank. Rank slices are cut into *units* — batches of
``batch_size`` records, or single records without batching — and unit ``u``
goes to DataLoader worker ``(u - start) % num_workers``. PyTorch's DataLoader
collects from its workers round-robin, so the stream a rank consumes is the
same whatever ``num_workers`` is.

Uneven splits: with ``drop_last=False`` every record is read exactly once per
epoch; rank slices differ by at most one record, so ranks may see a different
number of batches (the last batch of a rank may be short). With
``drop_last=True`` the global order is cut to a multiple of
``world_size * batch_size`` (the tail of the *shuffled* order is dropped, so a
different few records each epoch), and every rank sees the same number of full
batches — what DDP needs to keep its collectives in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EpochPlan", "PlanOptions", "Split"]


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How an epoch is ordered and cut into units.

    Attributes:
        shuffle: permute shards, blocks and records each epoch.
        seed: the shuffle seed; the same seed gives the same orders.
        block_records: records per block. Large enough that a block is a long
            sequential read, small enough to mix well; 0 picks about 1 MiB
            worth of records (at least one batch, at most 4096 records).
        window_shards: shards whose blocks are permuted together.
        batch_size: records per unit, or ``None`` for single-record units.
        drop_last: drop the tail so every rank gets the same number of full batches.
    """

    shuffle: bool = False
    seed: int = 0
    block_records: int = 0
    window_shards: int = 8
    batch_size: int | None = None
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.block_records < 0:
            raise ValueError(f"block_records must be >= 0, got {self.block_records}")
        if self.window_shards < 1:
            raise ValueError(f"window_shards must be >= 1, got {self.window_shards}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")


@dataclass(frozen=True, slots=True)
class Split:
    """Who is reading: the rank and DataLoader worker of this process."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker {self.worker} is not in [0, {self.num_workers})")


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))


class EpochPlan:
    """The block-level order of one epoch over the whole shard set (all ranks).

    Args:
        counts: records per shard, in dataset order.
        options: ordering options.
        epoch: the epoch number (mixed into the seed).
        avg_record_bytes: used to pick ``block_records`` when it is 0.
    """

    def __init__(
        self,
        counts: np.ndarray,
        options: PlanOptions,
        epoch: int,
        *,
        avg_record_bytes: float = 1024.0,
    ) -> None:
        self.options = options
        self.epoch = epoch
        counts = np.asarray(counts, dtype=np.int64)
        self.total = int(counts.sum())
        block = options.block_records or _auto_block(avg_record_bytes, options.batch_size)
        self.block_records = block
        order = np.arange(len(counts))
        rng = _rng(options.seed, epoch, 0x5EED) if options.shuffle else None
        if rng is not None:
            order = rng.permutation(len(counts))
        shard_ids, starts, lengths = [], [], []
        window = options.window_shards
        for w0 in range(0, len(order), window):
            ws, wst, wl = [], [], []
            for shard in order[w0 : w0 + window]:
                n = int(counts[shard])
                begins = np.arange(0, n, block, dtype=np.int64)
                ws.append(np.full(len(begins), shard, dtype=np.int64))
                wst.append(begins)
                wl.append(np.minimum(block, n - begins))
            if not ws:
                continue
            s, b, ln = np.concatenate(ws), np.concatenate(wst), np.concatenate(wl)
            if rng is not None:
                p = rng.permutation(len(s))
                s, b, ln = s[p], b[p], ln[p]
            shard_ids.append(s)
            starts.append(b)
            lengths.append(ln)
        empty = np.empty(0, dtype=np.int64)
        self.block_shard = np.concatenate(shard_ids) if shard_ids else empty
        self.block_start = np.concatenate(starts) if starts else empty
        self.block_len = np.concatenate(lengths) if lengths else empty
        # Global position of each block's first record.
        self.block_pos = np.concatenate(([0], np.cumsum(self.block_len)))

    # -- splitting -----------------------------------------------------------------

    def rank_range(self, rank: int, world_size: int) -> tuple[int, int]:
        """The ``[begin, end)`` slice of global positions that ``rank`` reads."""
        n, bs = self.total, self.options.batch_size
        if self.options.drop_last:
            per = (n // (world_size * (bs or 1))) * (bs or 1)
            return rank * per, (rank + 1) * per
        return rank * n // world_size, (rank + 1) * n // world_size

    def unit_count(self, rank: int, world_size: int) -> int:
        """How many units ``rank`` reads this epoch (over all its workers)."""
        begin, end = self.rank_range(rank, world_size)
        size = self.options.batch_size or 1
        return (end - begin) // size if self.options.drop_last else -(-(end - begin) // size)

    def units(self, split: Split, start_unit: int = 0) -> range:
        """The unit ids this worker reads, in order.

        Args:
            split: rank and worker.
            start_unit: units of this rank already consumed (resume); dealing to
                workers restarts at it so the rank's stream continues in order.
        """
        n = self.unit_count(split.rank, split.world_size)
        return range(start_unit + split.worker, n, split.num_workers)

    def unit_positions(self, split: Split, units: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Global positions of ``units`` (concatenated, in order) and each unit's length."""
        begin, end = self.rank_range(split.rank, split.world_size)
        size = self.options.batch_size or 1
        u = np.asarray(units, dtype=np.int64)
        starts = begin + u * size
        lengths = np.minimum(starts + size, end) - starts
        if size == 1:
            return starts, lengths
        if len(lengths) and lengths[-1] == size:  # all full (only a rank's last may be short)
            return (starts[:, None] + np.arange(size, dtype=np.int64)).reshape(-1), lengths
        offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) + offsets, lengths

    def last_units(self, rank: int, world_size: int, shards: int) -> np.ndarray:
        """For each shard, the last unit of ``rank`` that reads it (-1 for none).

        O(blocks): a block's records stay within the block's positions.
        """
        begin, end = self.rank_range(rank, world_size)
        size = self.options.batch_size or 1
        lo, hi = self.block_pos[:-1], self.block_pos[1:]
        inside = (hi > begin) & (lo < end)
        unit = (np.minimum(hi, end)[inside] - 1 - begin) // size
        last = np.full(shards, -1, dtype=np.int64)
        np.maximum.at(last, self.block_shard[inside], unit)
        return last

    def resolve(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map global positions to ``(shard ids, record numbers)``, vectorised.

        Positions must be sorted ascending (they are: units are dealt in order).
        """
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):
            return positions.copy(), positions.copy()
        if positions[0] < 0 or positions[-1] >= self.total:
            raise IndexError(f"positions out of range for an epoch of {self.total} records")
        blocks = np.searchsorted(self.block_pos, positions, side="right") - 1
        within = positions - self.block_pos[blocks]
        if self.options.shuffle:
            # One permutation per block touched, not per record.
            edges = np.flatnonzero(np.diff(blocks)) + 1
            for lo, hi in zip(np.concatenate(([0], edges)), np.concatenate((edges, [len(blocks)]))):
                b = int(blocks[lo])
                within[lo:hi] = self._block_perm(b, int(self.block_len[b]))[within[lo:hi]]
        return self.block_shard[blocks], self.block_start[blocks] + within

    def _block_perm(self, block: int, length: int) -> np.ndarray:
        if not self.options.shuffle:
            return np.arange(length, dtype=np.int64)
        return _rng(self.options.seed, self.epoch, 0xB10C, block).permutation(length)


def _auto_block(avg_record_bytes: float, batch_size: int | None) -> int:
    target = int((1 << 20) / max(avg_record_bytes, 1.0))
    return max(batch_size or 1, min(4096, max(1, target)))
