"""The position of a ``RecordDataset``: its epoch, its rank's split, the epoch plan, the
passes workers read, and the state it saves and resumes from (imported by
:mod:`recordkit.torch` and the ``DataLoader`` of :mod:`recordkit.torch.loader`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..reader.plan import EpochPlan, Split
from ..reader.position import (
    RESUME_KEYS,
    EpochCell,
    Pass,
    WorkerPosition,
    check_state,
    check_worker,
    saved_state,
)
from .cache import CachedShards

__all__ = ["Positioned", "refuse_dispatch", "refuse_worker_batches"]


def refuse_dispatch(caller: FrameType | None, world_size: int) -> None:
    """Refuse to be read by Accelerate's ``DataLoaderDispatcher`` as one rank's share.

    ``accelerator.prepare(loader)`` of an iterable dataset dispatches by default: the
    main process alone iterates the loader and splits each batch among the
    processes. A dataset that reads only its rank's share there trains on 1 /
    ``world_size`` of every epoch, silently. The dispatcher calls ``set_epoch`` at
    the start of every pass, on every process and before any collective, so the
    caller of ``set_epoch`` is the one reliable sign of it, and refusing there stops
    every process at once (the others never wait for a batch).
    """
    me = caller.f_locals.get("self") if caller is not None else None
    kind = type(me)
    if world_size == 1 or kind.__name__ != "DataLoaderDispatcher":
        return
    if not kind.__module__.startswith("accelerate."):
        return
    raise ValueError(
        "Accelerate's prepare() dispatches this DataLoader (dispatch_batches, its default "
        "for an iterable dataset): the main process alone reads it and splits every batch "
        f"among the {world_size} processes, but this RecordDataset reads one rank's share "
        f"of {world_size}, so {world_size - 1} of every {world_size} records would never "
        "be trained on. Build it with RecordDataset(..., options=ReadOptions(rank=0, "
        "world_size=1)) so the main process reads every record, or leave the DataLoader out "
        "of accelerator.prepare() so each process reads its own share (no batches broadcast); see "
        "docs/howto/frameworks.md"
    )


def refuse_worker_batches(caller: FrameType | None, units: int, samples: bool) -> None:
    """Refuse ``len()`` to a ``DataLoader`` that batches single samples from its workers
    when it would yield more batches than it says.

    Each worker batches its own share, so every worker's last batch may be short and
    the loader then yields more batches than ``len(loader)``; a loop that takes
    ``len(loader)`` batches (Lightning's, the Hugging Face ``Trainer``'s) would leave
    records out of every epoch, silently. Such loops ask ``len()`` first, through
    ``DataLoader.__len__``: the caller says the batch size and the workers.
    """
    loader = caller.f_locals.get("self") if caller is not None else None
    if not samples or not isinstance(loader, DataLoader):
        return
    size, workers = loader.batch_size, loader.num_workers
    if size is None or workers < 2 or loader.drop_last:
        return
    shares = [len(range(w, units, workers)) for w in range(workers)]
    batches = sum(-(-n // size) for n in shares)
    if batches > -(-units // size):
        raise ValueError(
            f"DataLoader(batch_size={size}, num_workers={workers}) over single samples: each "
            f"worker batches its own share, so the loader yields {batches} batches an epoch "
            f"where len() says {-(-units // size)}, and a loop that takes len(loader) batches "
            "(Lightning's, the Hugging Face Trainer's) would leave records out. Let the "
            f"dataset batch (RecordDataset(..., batch_size={size}) with DataLoader("
            "batch_size=None)), or read with num_workers=0: recordkit's reader threads "
            "decode off the training thread"
        )


class Positioned(CachedShards, IterableDataset):  # type: ignore[type-arg]
    """A reader with an epoch, a place in it, and ``state_dict`` / ``load_state_dict``.

    The reader sets ``_cell`` (the :class:`~recordkit.reader.position.EpochCell` its
    DataLoader workers share), ``_rank`` and ``_world`` (``None``: from
    ``torch.distributed``), and keeps ``_pass`` (the pass under way) and
    ``_worker_resume`` (a DataLoader worker's restored position).
    """

    _cell: EpochCell
    _rank: int | None
    _world: int | None
    _pass: Pass | None
    _worker_resume: WorkerPosition | None
    _fixed: bool  # in worker_pass(): the epoch's shard set is fixed for the workers

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads.

        It advances by itself after a full pass, in this process or in ``DataLoader``
        workers (they share it with this object, persistent or not);
        :meth:`set_epoch` sets it.
        """
        return self._cell.get()

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._cell.set(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next (its shuffle order), as ``DistributedSampler.set_epoch``.

        Raises:
            ValueError: called by Accelerate's ``DataLoaderDispatcher`` (which reads
                on the main process alone) while this dataset reads one rank's share.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        refuse_dispatch(sys._getframe(1), self._split().world_size)
        self.epoch = epoch
        self._pass = None

    def _split(self) -> Split:
        rank, world = self._rank, self._world
        if rank is None or world is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world = dist.get_world_size() if world is None else world
        info = get_worker_info()
        return Split(
            rank=rank or 0,
            world_size=world or 1,
            worker=info.id if info else 0,
            num_workers=info.num_workers if info else 1,
        )

    def _plan(self, epoch: int) -> EpochPlan:
        shards = self._open()
        options = self.options
        if self._window:
            options = dataclasses.replace(options, shard_window_bytes=self._window)
        return EpochPlan(
            shards.counts,
            options,
            epoch,
            avg_record_bytes=shards.avg_record_bytes,
            shard_bytes=shards.nbytes,
        )

    def resume_point(self) -> int:
        """Units of the current epoch that the next pass skips (set by :meth:`load_state_dict`)."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1]
        return 0

    @contextlib.contextmanager
    def worker_pass(self) -> Iterator[int]:
        """Start a pass whose iterating is done by copies of this dataset in worker processes.

        For loaders that run ``DataLoader`` workers (:class:`DataLoader` uses it):
        start the workers inside the ``with`` block. It fixes the epoch's shard set
        (cache mode) before they copy the dataset, yields the units already
        consumed (the resume point the copies start from), and spends the resume
        point when the block ends, so a later pass starts at the epoch's beginning.
        """
        start = self.resume_point()
        self._start_epoch(self.epoch)
        if self._whole is not None:  # whole epochs: this process streams the shards in
            split = self._split()
            plan = self._plan(self.epoch)
            self._whole.begin(plan, split.rank, split.world_size, start, self._open())
        self._fixed = True  # the copies read the set fixed here (cache mode)
        try:
            yield start
        finally:
            self._resume = None
            self._fixed = False

    def _delivered(self, unit: int) -> None:
        """A loader with workers yielded unit ``unit`` of this rank (whole epochs: the
        shards that no later unit reads can go)."""
        if self._whole is not None and self._whole.pass_ is not None:
            self._whole.pass_.release(unit)

    def _stream(self) -> object | None:
        """Whole epochs: the stream of the pass just begun by :meth:`worker_pass`."""
        return self._whole.pass_ if self._whole is not None else None

    def _end_pass(self, stream: object) -> None:
        """A loader with workers ended its pass: its stream stops (whole epochs), unless
        a later pass's stream has replaced it."""
        if self._whole is not None and stream is not None and self._whole.pass_ is stream:
            self._whole.end()

    def state_dict(self, consumed: int | None = None, epoch: int | None = None) -> dict[str, Any]:
        """The position to resume from: epoch and units (batches or samples) consumed.

        In a ``DataLoader`` worker (torchdata's ``StatefulDataLoader`` asks each
        worker after each batch), the state is that worker's own position, under
        ``"worker"``: ``{"id", "num_workers", "next"}`` (the next unit it reads), with
        ``"consumed"`` ``None``; it resumes only in the same worker of as many.

        Args:
            consumed: units of this epoch consumed so far. Leave it out when this
                object is iterated directly (it counts itself); :class:`DataLoader`
                passes it when workers do the iterating.
            epoch: with ``consumed``, the epoch they belong to (default: :attr:`epoch`).
        """
        shards = self._open()
        split = self._split()
        worker = None
        if consumed is not None:
            epoch = self.epoch if epoch is None else epoch
        elif get_worker_info() is not None:
            p = self._pass or self._next_worker_pass(split)
            epoch = p.epoch
            worker = {"id": split.worker, "num_workers": split.num_workers, "next": p.next}
        elif self._pass is not None:
            epoch, consumed = self._pass.epoch, self._pass.next
        else:
            epoch, consumed = self.epoch, self.resume_point()
        return saved_state(
            epoch=epoch,
            consumed=consumed,
            worker=worker,
            options=self.options,
            world_size=split.world_size,
            fingerprint=shards.fingerprint(),
            shard_paths=[info.path for info in shards.infos] if self._cached else None,
            shard_window_bytes=self._window,
        )

    def _next_worker_pass(self, split: Split) -> WorkerPosition:
        """Where this worker's next pass would start (its state before it begins)."""
        if self._worker_resume is not None:
            return self._worker_resume
        return WorkerPosition(self.epoch, self.resume_point() + split.worker)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration starts at the first unit not consumed.

        Elastic: a state saved at one world size resumes at another with the same
        global batch (``batch_size * world_size``), e.g. 8 ranks of 32 as 4 of 64:
        the epoch's order is the same, and the ranks start after the global
        batches consumed. A worker's state (see :meth:`state_dict`) resumes in
        the same worker of as many workers, as torchdata's ``StatefulDataLoader``
        restores it.

        Raises:
            ValueError: the state was saved with another shard set, seed, shuffle
                options or global batch, where "the next unseen record" is undefined;
                or it is a worker's state loaded elsewhere than in that worker.
        """
        worker = state.get("worker")
        if worker is not None:
            info = get_worker_info()
            check_worker(worker, None if info is None else (info.id, info.num_workers))
        keys: tuple[str, ...] = RESUME_KEYS
        if not self._cached:
            keys += ("shards",)
        elif state.get("shard_paths") is None:
            raise ValueError("cannot resume a cached dataset from a state saved without a cache")
        else:
            self._resume_shards = list(state["shard_paths"])
            self._fresh = False  # the next pass takes exactly the saved shards
        check_state(state, self.state_dict(consumed=0), keys)
        self._adopt_window(state.get("shard_window_bytes", 0))
        epoch = int(state["epoch"])
        self._pass = None
        if worker is not None:
            # The shared epoch is written when the pass begins, once the workers know
            # whether it reads this epoch or the next (WorkerPosition.restored).
            self._worker_resume = WorkerPosition(epoch, int(worker["next"]))
            self._resume = None
        else:
            self.epoch = epoch
            self._resume = (epoch, int(state["consumed"]))
