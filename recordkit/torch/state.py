"""Where a ``RecordDataset`` is: its :class:`Position` (the epoch, its rank's split, the
pass under way, the point to resume from, and the state it saves and loads), and the
refusals of loaders that would read it wrongly. ``RecordDataset`` holds a Position;
imported only by :mod:`recordkit.torch`.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from ..reader.plan import PlanOptions, Split
from ..reader.position import (
    RESUME_KEYS,
    EpochCell,
    Pass,
    WorkerPosition,
    check_state,
    check_worker,
    saved_state,
)
from .cache import EpochSource

__all__ = ["Position", "refuse_dispatch", "refuse_worker_batches"]


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


class Position:
    """A reader's place: its epoch, the pass under way and the point to resume from.

    The epoch lives in an :class:`~recordkit.reader.position.EpochCell` that the
    reader's ``DataLoader`` workers share (their copies of this object pickle it).

    Args:
        rank: this process's rank (``None``: ``torch.distributed``'s, else 0).
        world_size: the number of ranks (``None``: ``torch.distributed``'s, else 1).

    Attributes:
        pass_: the pass this process reads (or left unfinished).
        resume: a rank's ``(epoch, units consumed)`` to resume from, or ``None``.
        worker_resume: a DataLoader worker's restored position, or ``None``.
        passes: passes started in this process (a persistent worker's pass id).
        fixed: in ``worker_pass()``: the epoch's shard set is fixed for the workers.
    """

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        self.rank, self.world_size = rank, world_size
        self.cell = EpochCell(0)
        self.pass_: Pass | None = None
        self.resume: tuple[int, int] | None = None
        self.worker_resume: WorkerPosition | None = None
        self.passes = 0
        self.fixed = False

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads."""
        return self.cell.get()

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.cell.set(epoch)

    def restart(self, epoch: int) -> None:
        """Read epoch ``epoch`` next, from its start."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch
        self.pass_ = None

    def split(self) -> Split:
        """This process's share: rank and world size, DataLoader worker and workers."""
        rank, world = self.rank, self.world_size
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

    def resume_point(self) -> int:
        """Units of the current epoch that the next pass skips (set by :meth:`load`)."""
        if self.resume is not None and self.resume[0] == self.epoch:
            return self.resume[1]
        return 0

    def next_worker_pass(self, split: Split) -> WorkerPosition:
        """Where this worker's next pass would start (its state before it begins)."""
        if self.worker_resume is not None:
            return self.worker_resume
        return WorkerPosition(self.epoch, self.resume_point() + split.worker)

    def state(
        self,
        source: EpochSource,
        options: PlanOptions,
        consumed: int | None = None,
        epoch: int | None = None,
    ) -> dict[str, Any]:
        """The state to resume from (``RecordDataset.state_dict`` documents it)."""
        shards = source.open()
        split = self.split()
        worker = None
        if consumed is not None:
            epoch = self.epoch if epoch is None else epoch
        elif get_worker_info() is not None:
            p = self.pass_ or self.next_worker_pass(split)
            epoch = p.epoch
            worker = {"id": split.worker, "num_workers": split.num_workers, "next": p.next}
        elif self.pass_ is not None:
            epoch, consumed = self.pass_.epoch, self.pass_.next
        else:
            epoch, consumed = self.epoch, self.resume_point()
        return saved_state(
            epoch=epoch,
            consumed=consumed,
            worker=worker,
            options=options,
            world_size=split.world_size,
            fingerprint=shards.fingerprint(),
            shard_paths=[info.path for info in shards.infos] if source.cached else None,
            shard_window_bytes=source.window,
        )

    def load(self, state: dict[str, Any], source: EpochSource, options: PlanOptions) -> None:
        """Resume from ``state`` (``RecordDataset.load_state_dict`` documents it)."""
        worker = state.get("worker")
        if worker is not None:
            info = get_worker_info()
            check_worker(worker, None if info is None else (info.id, info.num_workers))
        keys: tuple[str, ...] = RESUME_KEYS
        if not source.cached:
            keys += ("shards",)
        elif state.get("shard_paths") is None:
            raise ValueError("cannot resume a cached dataset from a state saved without a cache")
        else:
            source.resume_with(state["shard_paths"])  # the next pass takes exactly these
        check_state(state, self.state(source, options, consumed=0), keys)
        source.adopt_window(state.get("shard_window_bytes", 0))
        epoch = int(state["epoch"])
        self.pass_ = None
        if worker is not None:
            # The shared epoch is written when the pass begins, once the workers know
            # whether it reads this epoch or the next (WorkerPosition.restored).
            self.worker_resume = WorkerPosition(epoch, int(worker["next"]))
            self.resume = None
        else:
            self.epoch = epoch
            self.resume = (epoch, int(state["consumed"]))
