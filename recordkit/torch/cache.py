"""Where a ``RecordDataset``'s shards come from, epoch by epoch: its :class:`EpochSource`.

Read directly (the dataset's own files, mapped per process) or through a shard cache:
each epoch's shards taken from a :class:`~recordkit.cache.ShardCache` (growing
epochs) or streamed in ahead of the readers (whole epochs), pinned, and released as
the epoch is done with them. ``RecordDataset`` holds one; imported only by
:mod:`recordkit.torch`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from torch.utils.data import get_worker_info

from ..reader.epochs import open_cache
from ..reader.growing import CacheEpochs
from ..reader.local import OPEN_LOCK, ProcessLocalShards
from ..reader.mix import open_sources
from ..reader.options import CacheOptions, ReadOptions
from ..reader.plan import EpochPlan, PlanOptions, Split
from ..reader.shards import ShardSet
from ..reader.whole import WholeEpochs, WholePass
from .distributed import common_shards, smallest

if TYPE_CHECKING:
    from ..cache import ShardCache

__all__ = ["EpochSource", "Placed"]

log = logging.getLogger(__name__)


class Placed(Protocol):
    """What the source reads of its reader's position (``torch.state.Position`` has it)."""

    @property
    def epoch(self) -> int: ...

    @property
    def resume(self) -> tuple[int, int] | None: ...


class EpochSource(ProcessLocalShards):
    """A dataset's shard set, per epoch: read directly or through a shard cache.

    Args:
        paths: the datasets read (one, or several read as one); ``label`` names them.
        position: the reader's position (its epoch and resume point say which
            shards a growing epoch takes).
        options: the reader's settings (``partial``, ``decode_images``, ``limits``).
        cache: the reader's cache settings (``open_cache`` turns them into a source).
        columns: the features read; ``split``: a tensorflow-datasets split.
        shuffle: the plan shuffles (whole epochs then read in shard windows).

    Attributes:
        schema: the schema the shards are opened with (set by the reader; unset: the
            manifest's, or inferred).
        cache: the cache read through (``None``: none, or in a DataLoader worker).
        cache_epochs: ``"whole"``, ``"growing"`` or ``None`` (no cache).
        window: the plan's shard window in bytes (whole epochs under a small budget).
        cached: the shard set changes per epoch (growing epochs).
    """

    def __init__(
        self,
        paths: list[str],
        label: str,
        position: Placed,
        options: ReadOptions,
        cache: CacheOptions,
        *,
        columns: list[str] | None,
        split: str | None,
        shuffle: bool,
    ) -> None:
        self.paths, self.path = paths, label
        self.position = position
        self.read_options = options
        self.columns = columns
        self.split = split
        source = open_cache(label, cache, agree=common_shards, agree_min=smallest)
        self._whole = source if isinstance(source, WholeEpochs) else None
        self._epochs = source if isinstance(source, CacheEpochs) else None
        self.cache: ShardCache | None = source.cache if source is not None else None
        self.cache_epochs = cache.epochs if source is not None else None
        self.window = self._whole.window_bytes(shuffle) if self._whole else 0
        # growing epochs: the shard set changes per epoch (also true in workers, which
        # have no cache); whole epochs read one fixed set, the remote's whole catalog
        self.cached = self._epochs is not None
        self._fresh = False  # the epoch taken last is not yet started
        self._resume_shards: list[str] | None = None

    def open(self) -> ShardSet:
        """This process's shard set (mapped on first use in each process)."""
        return self._open()

    def view(self) -> Any:
        """The tensorflow-datasets split's view (``None`` for other data)."""
        return self._view()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # workers read the epoch's set; the training process pins it ...
        state["cache"] = state["_epochs"] = None
        state["_whole"] = None  # ... or streams the shards in (the shard set's gate waits)
        return state

    def close(self) -> None:
        """Release the cache pins and maps (and stop a cache made from ``CacheOptions.dir``)."""
        self.let_go()
        if self._epochs is not None:
            self._epochs.close()
        if self._whole is not None:
            self._whole.close()

    def let_go(self) -> None:
        """Unmap this process's shards, then unpin them (in that order: never unmapped
        after an eviction could have unlinked them)."""
        with OPEN_LOCK:  # the next open() maps anew
            if self._shards is not None and self._pid == os.getpid():
                self._shards.close()
            self._shards = None
        if self._epochs is not None:
            self._epochs.let_go()

    def _open_shards(self) -> ShardSet:
        if self._whole is not None:
            return self._whole.shard_set(getattr(self, "schema", None))
        if not self.cached:
            return open_sources(
                self.paths,
                getattr(self, "schema", None),
                columns=self.columns,
                partial=self.read_options.partial,
                split=self.split,
            )
        if self._epochs is None:
            raise RuntimeError(
                "a cached RecordDataset in DataLoader workers needs recordkit.torch.DataLoader "
                "(it fixes each epoch's shard set in the training process)"
            )
        epoch = self.position.epoch
        resume = self.position.resume
        want = self._resume_shards if resume and resume[0] == epoch else None
        taken = self._epochs.take(epoch, want)
        self._fresh = True
        return ShardSet(taken.root, taken.manifest, taken.infos, getattr(self, "schema", None))

    def plan(self, epoch: int, options: PlanOptions) -> EpochPlan:
        """Epoch ``epoch``'s plan over this process's shard set."""
        shards = self._open()
        if self.window:
            options = dataclasses.replace(options, shard_window_bytes=self.window)
        return EpochPlan(
            shards.counts,
            options,
            epoch,
            avg_record_bytes=shards.avg_record_bytes,
            shard_bytes=shards.nbytes,
        )

    def start_epoch(self, epoch: int) -> None:
        """At the start of a pass in the training process: rescan the cache (growing
        epochs), or end the last pass's stream (whole epochs)."""
        if self._whole is not None and get_worker_info() is None:
            self._whole.end()
        if self._epochs is None or get_worker_info() is not None:
            return
        current = self._epochs.current
        if not (self._fresh and current is not None and current.epoch == epoch):
            self.let_go()  # the last set goes first: this epoch's may have to displace it
            self._open()
        self._fresh = False

    def begin_stream(self, plan: EpochPlan, split: Split, start: int) -> None:
        """Whole epochs, for a pass that DataLoader workers read: this process streams
        the shards in (the workers' shard sets wait on them)."""
        if self._whole is not None:
            self._whole.begin(plan, split.rank, split.world_size, start, self._open())

    def stream(self) -> WholePass | None:
        """Whole epochs: the stream of the pass under way (``None``: none)."""
        return self._whole.pass_ if self._whole is not None else None

    def end_stream(self, stream: object) -> None:
        """End ``stream`` (whole epochs), unless a later pass's stream has replaced it."""
        if self._whole is not None and stream is not None and self._whole.pass_ is stream:
            self._whole.end()

    def delivered(self, unit: int) -> None:
        """A loader with workers yielded unit ``unit`` of this rank (whole epochs: the
        shards that no later unit reads can go)."""
        stream = self.stream()
        if stream is not None:
            stream.release(unit)

    def releaser(self, plan: EpochPlan, split: Split, start: int) -> Callable[[int], None] | None:
        """Cache mode: unmap and unpin each shard once this rank has read its last unit.

        Whole epochs start the pass here (the stream that fetches ahead); in a
        DataLoader worker or the loader process only this process's maps go.
        """
        if self._whole is not None and get_worker_info() is None:
            begun = self._whole.begin(plan, split.rank, split.world_size, start, self._open())
            return begun.release
        if self.cache_epochs == "whole":  # a worker: the training process streams and pins
            shards = self._open()
            last = plan.shard_units(split.rank, split.world_size)[1]
            order = iter(np.argsort(last, kind="stable").tolist())
            pending = [next(order, None)]

            def unmap(unit: int) -> None:
                while pending[0] is not None and last[pending[0]] <= unit:
                    shards.evict(pending[0])
                    pending[0] = next(order, None)

            return unmap
        if self._epochs is None or get_worker_info() is not None:
            return None  # a DataLoader worker: the training process holds the pins
        shards = self._open()
        last = plan.shard_units(split.rank, split.world_size)[1]
        return self._epochs.releaser(last, start, shards.evict)

    def resume_with(self, shard_paths: list[str]) -> None:
        """The next growing epoch takes exactly these shards (a resume)."""
        self._resume_shards = list(shard_paths)
        self._fresh = False

    def adopt_window(self, saved: int) -> None:
        """Resume with the shard windows the state was saved with (the order depends
        on them), if this cache's budget holds two of them (or, for none, the dataset)."""
        if saved == self.window:
            return
        whole = self._whole
        if whole is None:
            raise ValueError(
                f"cannot resume: the state was saved reading through a shard cache in shard "
                f"windows of {saved:,} bytes (a different order); read through the cache again"
            )
        if (saved == 0 and whole.fits) or (saved and 2 * saved <= whole.capacity):
            log.info(
                "resuming with the saved shard windows of %s bytes (this budget gives %s)",
                f"{saved:,}",
                f"{self.window:,}",
            )
            self.window = saved
            return
        raise ValueError(
            f"cannot resume: the state was saved reading shard windows of {saved:,} bytes "
            f"(0: the whole dataset at once), which the cache budget of "
            f"{whole.cache.max_bytes:,} cannot hold; give CacheOptions.limit (the cache_limit) "
            "at least the budget it was saved with"
        )
