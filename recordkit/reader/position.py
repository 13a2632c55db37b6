"""Where a reader is: its place in an epoch, and the epoch its DataLoader workers read.

A rank reads the units (batches, or single records) ``0 .. n - 1`` of each epoch
(:mod:`recordkit.reader.plan`); with ``W`` DataLoader workers, worker ``w`` reads the
units ``start + w, start + w + W, ...`` of a pass that starts at unit ``start``.
A position is saved in one of two forms:

- **a rank's position** ``(epoch, consumed)``: the units of the epoch the training
  loop has had. :class:`recordkit.torch.DataLoader` and a dataset iterated in the
  training process save this; it resumes with any number of workers (and, for the
  same global batch, at another world size).
- **a worker's position** ``(epoch, next unit of worker w of W)``: torchdata's
  ``StatefulDataLoader`` calls ``state_dict()`` inside each worker after each batch,
  keeps the state that came with the last batch *it yielded* (batches prefetched but
  not yet yielded do not count), and restores each into the same worker id. Every
  worker then continues with its own next unit, and the loader's round-robin over
  the workers rebuilds the rank's stream exactly.

The epoch a pass reads lives in an :class:`EpochCell` that a dataset object shares
with its workers' copies, so epochs advance with worker processes too, persistent or
not: each worker marks the epoch finished when it hands over its last unit; the
last of the pass's workers to do so advances the cell.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from dataclasses import dataclass
from multiprocessing import context as _mp_context
from typing import Any

from .order import mix64
from .plan import PlanOptions

__all__ = [
    "RESUME_KEYS",
    "STATE_VERSION",
    "EpochCell",
    "Pass",
    "WorkerPosition",
    "check_state",
    "check_worker",
    "pass_key",
    "saved_state",
]

log = logging.getLogger(__name__)

# 2: the hierarchical block shuffle and global-batch split (version 1's order differs).
STATE_VERSION = 2
# Workers whose finish a cell can record; more (rare) read correctly, but then the
# cell does not advance by itself and the training process sets the epoch.
MAX_WORKERS = 256
_M63 = (1 << 63) - 1
# Seconds a restored DataLoader worker waits for the one that holds its epoch's last unit.
RESTORE_TIMEOUT = 300.0


def pass_key(base_seed: int, passes: int, epoch: int) -> int:
    """A pass's identity, the same in every worker of the pass and new for each pass.

    ``base_seed`` is the DataLoader iterator's (a worker's seed minus its id), drawn
    afresh for every non-persistent pass; ``passes`` counts the passes a persistent
    worker has started. Never 0 (0 marks an empty slot).
    """
    return (mix64(base_seed, passes, epoch) & _M63) | 1


def _attach(array: Any) -> EpochCell:
    cell = EpochCell.__new__(EpochCell)
    cell._a = array
    return cell


class EpochCell:
    """The epoch the next pass reads, shared by a dataset and its DataLoader workers.

    Shared memory (a ``multiprocessing`` array): forked workers inherit it and spawned
    ones receive it while they are started. Any other pickle (``copy.deepcopy``, a
    dataset sent somewhere) gets a cell of its own holding the same epoch. Each slot
    has one writer at a time and every write is one aligned 8-byte store, so no lock
    is needed: a worker writes its own slot; the epoch is written by the training
    process between passes, by restored workers (all the same value) and by the
    worker that finds every slot of its pass marked (any such writer writes the same).

    Args:
        epoch: the first epoch.
    """

    def __init__(self, epoch: int = 0) -> None:
        # the epoch, a finish slot per worker, and the restored pass's verdict
        self._a = multiprocessing.RawArray("q", 2 + MAX_WORKERS)
        self._a[0] = epoch

    def get(self) -> int:
        """The epoch the next pass reads."""
        return int(self._a[0])

    def set(self, epoch: int) -> None:
        """Read ``epoch`` next (the training process's ``set_epoch``, or a restore)."""
        self._a[0] = epoch

    def finish(self, worker: int, num_workers: int, key: int, epoch: int) -> None:
        """Worker ``worker`` of pass ``key`` handed over the last unit of ``epoch``.

        The worker that finds every worker of its pass finished advances the cell to
        ``epoch + 1`` (unless the epoch was set meanwhile).
        """
        if num_workers > MAX_WORKERS:
            return
        a = self._a
        a[1 + worker] = key
        if all(a[1 + w] == key for w in range(num_workers)) and a[0] == epoch:
            a[0] = epoch + 1
            log.debug("epoch %d finished by all %d workers", epoch, num_workers)

    def tell(self, key: int, complete: bool) -> None:
        """The worker that holds a restored epoch's last unit says whether it was handed
        over (then every unit was: the loader hands them over in order)."""
        self._a[1 + MAX_WORKERS] = key if complete else -key

    def told(self, key: int, timeout: float) -> bool:
        """What :meth:`tell` said for ``key`` (waiting for it: the workers restore at once).

        Raises:
            RuntimeError: nothing was told within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            said = int(self._a[1 + MAX_WORKERS])
            if abs(said) == key:
                return said > 0
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"a restored DataLoader worker waited {timeout:.0f} s for the worker that "
                    "holds the epoch's last batch to say whether it was handed over"
                )
            time.sleep(0.001)

    def __reduce__(self) -> tuple[Any, ...]:
        if _mp_context.get_spawning_popen() is not None:  # a worker being started
            return (_attach, (self._a,))
        return (EpochCell, (self.get(),))


@dataclass
class WorkerPosition:
    """A DataLoader worker's place: the epoch and the next unit it reads."""

    epoch: int
    next: int

    def restored(
        self,
        count: int,
        worker: int,
        num_workers: int,
        cell: EpochCell,
        key: int,
        timeout: float = RESTORE_TIMEOUT,
    ) -> WorkerPosition:
        """Where this restored position's pass starts: here, or at the next epoch.

        A position whose worker had handed over its share of the epoch (``next``
        at or past the epoch's ``count`` units) reads the next epoch if every
        worker had (the state was saved after the epoch's last batch, which the
        loader hands over last); otherwise its pass is empty while the others
        finish the epoch. Only the worker ``last`` that holds the last unit knows
        which: it tells the cell, and the others wait for it. The next epoch is
        dealt so that the loader, which asks the worker after ``last`` first, reads
        its units in order: unit ``u`` to worker ``(last + 1 + u) % num_workers``.
        ``key`` is the same in every worker of the restored pass.
        """
        if num_workers > MAX_WORKERS:
            return self  # the cell has no slots for them: an empty pass ends the epoch
        # Units were dealt round robin from the pass's start: next = start + worker (mod W).
        last = (count - 1 - (self.next - worker)) % num_workers
        if worker == last:
            cell.tell(key, self.next >= count)
        if self.next < count or count == 0:
            return self
        complete = self.next >= count if worker == last else cell.told(key, timeout)
        if not complete:
            return self
        return WorkerPosition(self.epoch + 1, (worker - last - 1) % num_workers)


@dataclass
class Pass:
    """One pass over an epoch in this process (the training process, or one worker).

    Attributes:
        epoch: the epoch read.
        next: the next unit this process hands over (a rank unit id).
        step: units between two of this process's units (the number of workers; 1
            in the training process).
        worker: the worker id (0 in the training process).
        key: the pass's identity (:func:`pass_key`); 0 in the training process.
        finished: the last unit was handed over (or there was none).
    """

    epoch: int
    next: int
    step: int = 1
    worker: int = 0
    key: int = 0
    finished: bool = False


# What a state must agree with to resume: the epoch's order depends on these (and on
# the shard set, checked by its fingerprint, or taken again from the saved paths).
RESUME_KEYS: tuple[str, ...] = (
    "seed",
    "shuffle",
    "block_records",
    "window_blocks",
    "drop_last",
    "global_batch",
    "mix",
)


def saved_state(
    *,
    epoch: int,
    consumed: int | None,
    worker: dict[str, int] | None,
    options: PlanOptions,
    world_size: int,
    fingerprint: str,
    shard_paths: list[str] | None,
    shard_window_bytes: int = 0,
) -> dict[str, Any]:
    """A position and the settings it is valid under, as a JSON-ready dict.

    Args:
        epoch: the epoch of the position.
        consumed: a rank's position: units of the epoch consumed (``None`` for a worker's).
        worker: a worker's position: ``{"id", "num_workers", "next"}``.
        options: the plan's options.
        world_size: ranks sharing the global batch.
        fingerprint: the shard set's (see ``ShardSet.fingerprint``).
        shard_paths: a cached epoch's shards (its set changes per epoch), else ``None``.
        shard_window_bytes: whole epochs through a cache smaller than the dataset: the
            plan's shard windows (the order depends on them), else 0.
    """
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "consumed": consumed,
        **({"worker": worker} if worker is not None else {}),
        "seed": options.seed,
        "shuffle": options.shuffle,
        "block_records": options.block_records,
        "window_blocks": options.window_blocks,
        "batch_size": options.batch_size,
        "drop_last": options.drop_last,
        "world_size": world_size,
        # the order depends on the global batch, not on how many ranks share it
        "global_batch": (options.batch_size or 1) * world_size,
        # record ranges and weights (None: every record once); a state saved without
        # them reads as None
        "mix": None if options.mix is None else options.mix.state(),
        "shards": fingerprint,
        # with a cache the shard set changes per epoch: a resume takes these again
        "shard_paths": shard_paths,
        # whole epochs through a cache smaller than the dataset: the shard windows
        "shard_window_bytes": shard_window_bytes,
    }


def check_state(state: dict[str, Any], mine: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Refuse a state of another version, or saved under other ``keys`` than ``mine``.

    Raises:
        ValueError: naming the setting, its saved value and its value now.
    """
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"unsupported state version {state.get('version')!r} (this recordkit saves "
            f"{STATE_VERSION}; an older version's epoch order differs)"
        )
    for key in keys:
        if state.get(key) != mine.get(key):
            raise ValueError(
                f"cannot resume: {key} was {state.get(key)!r} when saved, is {mine.get(key)!r} now"
            )


def check_worker(worker: dict[str, Any], here: tuple[int, int] | None) -> None:
    """Refuse a worker's state outside the worker (``here``: ``(id, num_workers)``) it was.

    Raises:
        ValueError: in the training process, or in another worker or number of workers.
    """
    saved = f"DataLoader worker {worker['id']} of {worker['num_workers']}"
    if here is None:
        raise ValueError(
            f"this is the state of {saved} (torchdata's StatefulDataLoader saves one per "
            "worker): it resumes only in that worker; load the loader's state_dict instead"
        )
    if here != (worker["id"], worker["num_workers"]):
        raise ValueError(
            f"cannot resume: the state of {saved} loaded into worker {here[0]} of {here[1]}"
        )
