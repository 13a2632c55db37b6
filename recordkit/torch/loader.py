"""``recordkit.torch.DataLoader``: torch's ``DataLoader`` that saves and resumes a
``RecordDataset`` exactly, with any number of workers, and needs nothing else.

Imported only by :mod:`recordkit.torch` (it imports torch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader as _TorchDataLoader

from .dataset import RecordDataset

__all__ = ["DataLoader"]


class DataLoader(_TorchDataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` that can save and resume a
    :class:`~recordkit.torch.RecordDataset`.

    With worker processes, the dataset object in the training process does not
    see what the workers read; this loader counts the batches it yields, so
    :meth:`state_dict` is exact (one state for the rank, which resumes with any
    number of workers), and advances the dataset's epoch after each full pass.
    ``batch_size`` defaults to ``None`` (the dataset batches). torchdata's
    ``StatefulDataLoader`` resumes exactly too (``docs/howto/resume.md``).
    """

    def __init__(
        self, dataset: RecordDataset, *, batch_size: int | None = None, **kwargs: Any
    ) -> None:
        if not isinstance(dataset, RecordDataset):
            raise TypeError("recordkit.torch.DataLoader takes a recordkit.torch.RecordDataset")
        if batch_size is not None:
            raise ValueError(
                "let the dataset batch: RecordDataset(..., batch_size=N) with "
                "DataLoader(batch_size=None); that is faster and keeps resume exact"
            )
        if kwargs.get("persistent_workers") and dataset.cache_epochs == "whole":
            raise ValueError(
                "persistent_workers=True with whole epochs through a cache: each pass's "
                "workers must start after the pass's stream (workers per pass instead)"
            )
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self._ds = dataset
        self._consumed = 0
        self._epoch: int | None = None  # the epoch of the pass under way
        self._passes = 0  # passes begun: a pass let go late leaves a later one alone

    # A generator, not a _BaseDataLoaderIter: it wraps one to count what it yields.
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self._ds
        epoch = ds.epoch
        self._passes += 1
        mine = self._passes
        stream = None
        if self.num_workers > 0:
            with ds.worker_pass() as start:  # the workers copy the dataset in here
                it = super().__iter__()
            stream = ds.source.stream()
        else:  # the dataset iterates in this process and resumes itself
            start, it = ds.resume_point(), super().__iter__()
        total = len(self)  # this rank's units of the epoch (ds.epoch is still ``epoch``)
        self._epoch, self._consumed = epoch, start
        ended = False

        def end(full: bool) -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            if stream is not None:
                ds.source.end_stream(stream)  # whole epochs: the pass's stream stops
            if not full:
                # Left early: the next pass reads this epoch again (workers that had
                # read their share ahead have marked it finished), unless a later
                # pass of this loader began before this one was let go.
                if self._passes == mine:
                    ds.epoch = epoch
                return
            # A full pass: the next one reads the next epoch (the dataset, or its
            # workers, may have advanced it already).
            if ds.epoch == epoch:
                ds.set_epoch(epoch + 1)
            self._epoch, self._consumed = None, 0

        try:
            for item in it:
                self._consumed += 1
                if self._consumed >= total:
                    # The epoch's last unit: over before it is handed over, since a
                    # loop that takes len(loader) batches never asks for another.
                    end(True)
                    yield item
                    return
                yield item
                if self.num_workers > 0:
                    ds.source.delivered(self._consumed - 1)  # whole epochs: finished shards go
            end(True)  # fewer than counted (on_error="skip" left out a whole unit)
        finally:
            if not ended and self.num_workers > 0 and not self.persistent_workers:
                # Left early: stop the workers before the epoch is set back, or one
                # still reading ahead could mark the epoch finished after it.
                shutdown = getattr(it, "_shutdown_workers", None)
                if shutdown is not None:
                    shutdown()
            end(False)

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches this loader has yielded (JSON-serialisable)."""
        ds = self._ds
        return ds.state_dict(consumed=self._consumed, epoch=self._epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next pass starts at the batch after it."""
        ds = self._ds
        if state.get("worker") is not None:
            raise ValueError(
                "this is one DataLoader worker's state (torchdata's StatefulDataLoader "
                "saves those): load it with the StatefulDataLoader that saved it"
            )
        ds.load_state_dict(state)
        self._epoch, self._consumed = None, int(state["consumed"])
