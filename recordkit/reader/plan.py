"""The epoch plan: which records, in which order, for this rank and worker.

Everything here is a pure function of (the shard set's record counts, seed,
epoch, shuffle options, the global batch size, rank, number of DataLoader
workers, worker id, resume position) — never of timing — so two runs with the
same inputs read the same records in the same order, and a resumed run
continues exactly where the interrupted one stopped. Memory is O(shards) for the
record-count prefix sums; the order itself is computed, never stored.

How an epoch is ordered (``shuffle=True``) is ``docs/howto/shuffle.md``'s
*hierarchical block shuffle*: the records, in dataset order, cut into blocks of
``block_records`` (about 64 KiB each by default); the blocks ordered by a keyed
bijection (``recordkit.reader.order.Permutation``, seeded by ``seed`` and
``epoch``); taken ``window_blocks`` at a time, every record of a window permuted by a
second one. Without shuffle the order is the dataset order.

How an epoch is split (*shuffle first, then slice*): the global order is cut
into global batches of ``batch_size * world_size`` records; rank ``r`` takes
the ``r``-th ``batch_size`` slice of each, so every rank's stream is as well
mixed as the global one, and the global order depends on the global batch
size, never on how many ranks share it: a checkpoint resumes at another world
size with the same global batch (elastic). A rank's units (batches, or single
records without batching) go to DataLoader workers round-robin: unit ``u`` to
worker ``u % num_workers``; PyTorch's DataLoader collects from its workers in
the same order, so the stream a rank consumes does not depend on
``num_workers``.

Remote reads under a disk budget (``shard_window_bytes``, the same page's *shard
windows*): the shards in a keyed order, taken greedily into groups of at most
``shard_window_bytes`` bytes (a larger shard is a group alone), each group's records
ordered by the block shuffle as if it were the whole dataset, so a stretch of the epoch
reads one group's shards (two where a global batch straddles the border) while the
cache fetches the next. Splitting by global batch is unchanged.

Uneven ends: with ``drop_last=False`` every record is read exactly once per
epoch; the last, partial global batch is shared evenly (ranks' shares differ by
at most one record), so a rank's last batch may be short or missing. With
``drop_last=True`` the global order is cut to a multiple of the global batch
(the tail of the *shuffled* order is dropped, a different few records each
epoch), and every rank sees the same number of full batches, as DDP needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import order as _order
from .mix import Mixer
from .order import Permutation, mix64
from .plan_options import PlanOptions

__all__ = ["EpochPlan", "PlanOptions", "Split"]

# Blocks of about this many bytes: long enough to read sequentially (and to
# amortise a page-cache miss), short enough that a window holds many of them.
_BLOCK_BYTES = 64 << 10
_MAX_BLOCK = 4096


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


class EpochPlan:
    """The order of one epoch over the whole shard set (all ranks), computed on demand.

    Args:
        counts: records per shard, in dataset order.
        options: ordering options.
        epoch: the epoch number (mixed into the seed).
        avg_record_bytes: used to pick ``block_records`` when it is 0.
        shard_bytes: bytes per shard, in dataset order; needed (only) for shard
            windows (``options.shard_window_bytes`` with ``shuffle``).
    """

    def __init__(
        self,
        counts: np.ndarray,
        options: PlanOptions,
        epoch: int,
        *,
        avg_record_bytes: float = 1024.0,
        shard_bytes: np.ndarray | None = None,
    ) -> None:
        self.options = options
        self.epoch = epoch
        counts = np.asarray(counts, dtype=np.int64)
        # record ranges: the plan sees only the selected records (from _first[shard] on)
        self._first: np.ndarray | None = None
        if options.mix is not None:
            counts, self._first = options.mix.effective(counts)
        self.starts = np.concatenate(([0], np.cumsum(counts)))  # first record of each shard
        self.total = int(self.starts[-1])
        b = options.block_records or _auto_block(avg_record_bytes)
        self.block_records = b
        self._full = self.total // b  # whole blocks; the rest (< b records) ends the epoch
        self._window = options.window_blocks
        key = mix64(options.seed, epoch)
        self._key = key
        self._blocks = Permutation(self._full, mix64(key, 1)) if options.shuffle else None
        self._windows: dict[int, Permutation] = {}
        self._groups: _ShardWindows | None = None
        if options.shuffle and options.shard_window_bytes:
            if shard_bytes is None:
                raise ValueError("shard windows (shard_window_bytes) need the shards' bytes")
            self._groups = _ShardWindows(counts, np.asarray(shard_bytes), options, key, b)
            self._blocks = None  # each group orders its own blocks
        self._mixer: Mixer | None = None
        if options.mix is not None and options.mix.weighted:
            self._mixer = Mixer(
                options.mix,
                counts,
                options,
                epoch,
                b,
                lambda c, o: EpochPlan(c, o, 0, avg_record_bytes=avg_record_bytes),
            )
            self.total = self._mixer.total  # positions of the epoch, not records of the set
            self._full, self._blocks = 0, None

    # -- the global order ----------------------------------------------------------------

    @property
    def windows(self) -> int:
        """Number of record-mixing windows in the epoch (1 without shuffle; with shard
        windows, the number of shard windows)."""
        if self._groups is not None:
            return self._groups.count
        if self._blocks is None:
            return 1
        return max(1, -(-self._full // self._window))

    def _window_span(self, w: int) -> tuple[int, int, int]:
        """Window ``w``'s first position, records, and whole blocks."""
        per = self._window * self.block_records
        if w < self.windows - 1:
            return w * per, per, self._window
        blocks = self._full - w * self._window
        return w * per, self.total - w * per, blocks

    def order(self, positions: np.ndarray) -> np.ndarray:
        """The global record numbers (dataset order) at epoch ``positions``."""
        g = np.asarray(positions, dtype=np.int64)
        if self._mixer is not None:
            return self._mixer.order(g)
        if self._groups is not None:
            return self._groups.order(g, self.starts)
        if self._blocks is None:
            same: np.ndarray = g.copy()
            return same
        c = _order._c
        if c is not None and len(g):  # the same order in one C pass (~30 ns a position)
            out = np.empty_like(g)
            c.plan_order(
                np.ascontiguousarray(g),
                out,
                self.total,
                self.block_records,
                self._window,
                self._full,
                self._blocks.round_keys,
                self._key,
            )
            return out
        return self._order_numpy(g)

    def _order_numpy(self, g: np.ndarray) -> np.ndarray:
        """:meth:`order` in NumPy (the reference, and the path without the C module)."""
        assert self._blocks is not None
        b = self.block_records
        w_of = np.minimum(g // (self._window * b), self.windows - 1)
        out = np.empty_like(g)
        edges = np.flatnonzero(np.diff(w_of)) + 1
        for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), len(g)]):
            if lo == hi:
                continue
            w = int(w_of[lo])
            first, size, blocks = self._window_span(w)
            j = self._within(w, size)(g[lo:hi] - first)  # the window's own permutation
            slot, offset = np.divmod(j, b)
            whole = slot < blocks  # else the epoch's tail, after the last whole block
            rec = np.empty_like(j)
            rec[whole] = self._blocks(w * self._window + slot[whole]) * b + offset[whole]
            rec[~whole] = self._full * b + (j[~whole] - blocks * b)
            out[lo:hi] = rec
        return out

    def _within(self, w: int, size: int) -> Permutation:
        perm = self._windows.get(w)
        if perm is None:
            if len(self._windows) > 64:  # tasks move forward: old windows are done
                self._windows.clear()
            perm = self._windows[w] = Permutation(size, mix64(self._key, 2, w))
        return perm

    def resolve(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map epoch positions to ``(shard ids, record numbers)``, vectorised."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(positions):
            return positions.copy(), positions.copy()
        if positions.min() < 0 or positions.max() >= self.total:
            raise IndexError(f"positions out of range for an epoch of {self.total} records")
        rec = self.order(positions)
        shard = np.searchsorted(self.starts, rec, side="right") - 1
        if self._first is not None:  # record ranges: counted from the first selected
            return shard, rec - self.starts[shard] + self._first[shard]
        return shard, rec - self.starts[shard]

    # -- splitting -----------------------------------------------------------------------

    def _batches(self, world_size: int) -> tuple[int, int, int, int]:
        """(unit size, global batch, whole global batches, records in the partial one)."""
        size = self.options.batch_size or 1
        glob = size * world_size
        whole = self.total // glob
        partial = 0 if self.options.drop_last else self.total - whole * glob
        return size, glob, whole, partial

    def unit_count(self, rank: int, world_size: int) -> int:
        """How many units ``rank`` reads this epoch (over all its workers)."""
        _, _, whole, partial = self._batches(world_size)
        lo, hi = rank * partial // world_size, (rank + 1) * partial // world_size
        return whole + (hi > lo)

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
        """Epoch positions of ``units`` (concatenated, ascending) and each unit's length."""
        size, glob, whole, partial = self._batches(split.world_size)
        u = np.asarray(units, dtype=np.int64)
        starts = u * glob + split.rank * size
        lengths = np.full(len(u), size, dtype=np.int64)
        last = u == whole  # the partial global batch, shared evenly
        if last.any():
            lo = split.rank * partial // split.world_size
            hi = (split.rank + 1) * partial // split.world_size
            starts[last] = whole * glob + lo
            lengths[last] = hi - lo
        if size == 1:
            return starts, lengths
        if not last.any():
            return (starts[:, None] + np.arange(size, dtype=np.int64)).reshape(-1), lengths
        offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) + offsets, lengths

    def shard_units(self, rank: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
        """For each shard, the first and last unit of ``rank`` that may read it.

        ``first`` is never after the first unit that reads the shard, ``last``
        never before the last (both exact without shuffle up to the global batch;
        with shuffle, those of the windows that hold its records). -1 for a shard
        this rank never reads. A reader through a cache fetches shards in order
        of ``first`` and lets each go after ``last``. O(blocks) time, O(window +
        shards) memory.
        """
        shards = len(self.starts) - 1
        glob = self._batches(world_size)[1]
        units = self.unit_count(rank, world_size)
        first = np.full(shards, -1, dtype=np.int64)
        last = np.full(shards, -1, dtype=np.int64)
        if not units:
            return first, last
        counts = np.diff(self.starts)
        has = counts > 0
        if self._mixer is not None:  # weighted: any unit may read any shard it draws from
            first[has], last[has] = 0, units - 1
        elif self._groups is not None:
            lo, hi = self._groups.shard_spans()
            read = lo // glob < units  # else only the tail that drop_last drops
            first[read] = lo[read] // glob
            last[read] = np.minimum((hi[read] - 1) // glob, units - 1)
        elif self._blocks is None:
            lo = self.starts[:-1] // glob
            read = has & (lo < units)
            first[read] = lo[read]
            last[read] = np.minimum((self.starts[1:] - 1) // glob, units - 1)[read]
        else:
            self._block_spans(glob, units, first, last)
        first[~has] = -1
        last[~has] = -1
        return first, last

    def _block_spans(self, glob: int, units: int, first: np.ndarray, last: np.ndarray) -> None:
        """``shard_units`` of the block shuffle: each shard's first and last window."""
        assert self._blocks is not None
        b = self.block_records
        for w in range(self.windows):
            begin, size, blocks = self._window_span(w)
            if begin // glob >= units:
                break  # only the tail that drop_last drops
            unit = min((begin + size - 1) // glob, units - 1)
            recs = [self._blocks(w * self._window + np.arange(blocks)) * b]
            if w == self.windows - 1 and self._full * b < self.total:
                recs.append(np.array([self._full * b], dtype=np.int64))  # the tail
            starts = np.concatenate(recs)
            lo = np.searchsorted(self.starts, starts, side="right") - 1
            hi = np.searchsorted(self.starts, np.minimum(starts + b, self.total) - 1, side="right")
            # a block can span several shards: every shard from lo to hi - 1 is touched
            touched = np.repeat(lo, hi - lo) + _ranks_within(hi - lo)
            fresh = touched[first[touched] < 0]
            first[fresh] = begin // glob  # windows go forward: the first one wins
            last[touched] = unit  # ... and the last one wins here

    def shard_sequence(self) -> np.ndarray:
        """Shard ids in the order the epoch's stretches take them: the shard windows'
        keyed order, else the dataset order (a tie-break among equal first units)."""
        if self._groups is not None:
            seq: np.ndarray = self._groups.seq.copy()
            return seq
        return np.arange(len(self.starts) - 1, dtype=np.int64)


class _ShardWindows:
    """The shard windows of one epoch (see the module docs): shards in a keyed order,
    grouped greedily by bytes, each group's records ordered by a block shuffle of its own.

    O(shards) to make (one pass over the keyed order), O(1) per position after.
    """

    def __init__(
        self, counts: np.ndarray, nbytes: np.ndarray, options: PlanOptions, key: int, block: int
    ) -> None:
        n = len(counts)
        if len(nbytes) != n:
            raise ValueError(f"{len(nbytes)} shard sizes for {n} shards")
        self.options = options
        self.block = block
        self.key = key
        self.seq = Permutation(n, mix64(key, 4))(np.arange(n, dtype=np.int64))
        limit = options.shard_window_bytes
        cuts = [0]
        acc = 0
        for i, size in enumerate(nbytes[self.seq].tolist()):
            if acc and acc + size > limit:  # a shard larger than the limit stands alone
                cuts.append(i)
                acc = 0
            acc += size
        cuts.append(n)
        self.cuts = np.asarray(cuts, dtype=np.int64)  # group g: seq[cuts[g] : cuts[g + 1]]
        self.count = len(cuts) - 1
        seq_counts = counts[self.seq]
        self.seq_starts = np.concatenate(([0], np.cumsum(seq_counts)))  # epoch position of each
        self.first = self.seq_starts[self.cuts]  # each group's first position (and the total)
        self._plans: dict[int, EpochPlan] = {}

    def _plan(self, g: int) -> EpochPlan:
        plan = self._plans.get(g)
        if plan is None:
            if len(self._plans) > 8:  # positions move forward: old groups are done
                self._plans.clear()
            lo, hi = int(self.cuts[g]), int(self.cuts[g + 1])
            options = self.options.part(mix64(self.key, 5, g), self.block)
            plan = self._plans[g] = EpochPlan(np.diff(self.seq_starts[lo : hi + 1]), options, 0)
        return plan

    def order(self, g: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Global record numbers (dataset order) at epoch positions ``g``."""
        out = np.empty_like(g)
        which = np.searchsorted(self.first, g, side="right") - 1
        edges = np.flatnonzero(np.diff(which)) + 1
        for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), len(g)]):
            if lo == hi:
                continue
            w = int(which[lo])
            local = self._plan(w).order(g[lo:hi] - self.first[w])  # within the group
            at = local + self.first[w]  # a position in the groups' concatenation
            k = np.searchsorted(self.seq_starts, at, side="right") - 1
            shard = self.seq[k]
            out[lo:hi] = starts[shard] + (at - self.seq_starts[k])
        return out

    def shard_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """For each shard (dataset order), the epoch positions ``[lo, hi)`` of its group."""
        n = len(self.seq)
        group = np.repeat(np.arange(self.count), np.diff(self.cuts))  # per seq slot
        lo = np.empty(n, dtype=np.int64)
        hi = np.empty(n, dtype=np.int64)
        lo[self.seq] = self.first[group]
        hi[self.seq] = self.first[group + 1]
        return lo, hi


def _ranks_within(lengths: np.ndarray) -> np.ndarray:
    """``[0, 1, .., n0 - 1, 0, 1, .., n1 - 1, ...]`` for ``lengths = [n0, n1, ...]``."""
    ends = np.cumsum(lengths)
    out: np.ndarray = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(
        ends - lengths, lengths
    )
    return out


def _auto_block(avg_record_bytes: float) -> int:
    return max(1, min(_MAX_BLOCK, int(_BLOCK_BYTES / max(avg_record_bytes, 1.0))))
