"""Reading through a shard cache: the part of ``RecordDataset`` that takes each epoch's
shards from a :class:`~recordkit.cache.ShardCache` (growing epochs) or streams them in
(whole epochs), pins and releases them (imported only by :mod:`recordkit.torch`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import get_worker_info

from ..reader.epochs import CacheEpochs, WholeEpochs, open_cache
from ..reader.local import OPEN_LOCK, ProcessLocalShards
from ..reader.mix import open_sources
from ..reader.options import CacheOptions
from ..reader.plan import EpochPlan, PlanOptions, Split
from ..reader.shards import ShardSet
from .distributed import common_shards, smallest

if TYPE_CHECKING:
    from ..cache import ShardCache

__all__ = ["CachedShards"]

log = logging.getLogger(__name__)


class CachedShards(ProcessLocalShards):
    """A reader's shard set, read directly or through a shard cache (``RecordDataset``'s base).

    The reader sets ``options`` (its :class:`~recordkit.reader.plan.PlanOptions`),
    ``partial`` and ``split``, keeps ``epoch`` and ``_resume`` (its resume point), and
    calls :meth:`_init_cache` once.
    """

    options: PlanOptions
    partial: bool
    paths: list[str]  # the datasets read (one, or several read as one)
    columns: list[str] | None
    split: str | None
    _resume: tuple[int, int] | None
    _whole: WholeEpochs | None
    _epochs: CacheEpochs | None
    cache: ShardCache | None
    cache_epochs: str | None
    _window: int
    _cached: bool
    _fresh: bool
    _resume_shards: list[str] | None

    epoch: int  # the reader's (a property there)

    def _init_cache(self, options: CacheOptions) -> None:
        mode = options.epochs
        source = open_cache(self.path, options, agree=common_shards, agree_min=smallest)
        self._whole = source if isinstance(source, WholeEpochs) else None
        self._epochs = source if isinstance(source, CacheEpochs) else None
        self.cache = source.cache if source is not None else None
        self.cache_epochs = mode if source is not None else None
        self._window = self._whole.window_bytes(self.options.shuffle) if self._whole else 0
        # growing epochs: the shard set changes per epoch (also true in workers, which
        # have no cache); whole epochs read one fixed set, the remote's whole catalog
        self._cached = self._epochs is not None
        self._fresh = False  # the epoch taken last is not yet started
        self._resume_shards = None

    def close(self) -> None:
        """Release the cache pins and maps (and stop a cache made from ``CacheOptions.dir``)."""
        self._let_go()
        if self._epochs is not None:
            self._epochs.close()
        if self._whole is not None:
            self._whole.close()

    def _let_go(self) -> None:
        """Unmap this process's shards, then unpin them (in that order: never unmapped
        after an eviction could have unlinked them)."""
        with OPEN_LOCK:  # the next _open() maps anew
            if self._shards is not None and self._pid == os.getpid():
                self._shards.close()
            self._shards = None
        if self._epochs is not None:
            self._epochs.let_go()

    def _open_shards(self) -> ShardSet:
        if self._whole is not None:
            return self._whole.shard_set(getattr(self, "schema", None))
        if not self._cached:
            return open_sources(
                self.paths,
                getattr(self, "schema", None),
                columns=self.columns,
                partial=getattr(self, "partial", False),
                split=self.split,
            )
        if self._epochs is None:
            raise RuntimeError(
                "a cached RecordDataset in DataLoader workers needs recordkit.torch.DataLoader "
                "(it fixes each epoch's shard set in the training process)"
            )
        epoch = self.epoch
        want = self._resume_shards if self._resume and self._resume[0] == epoch else None
        taken = self._epochs.take(epoch, want)
        self._fresh = True
        return ShardSet(taken.root, taken.manifest, taken.infos, getattr(self, "schema", None))

    def _start_epoch(self, epoch: int) -> None:
        """At the start of a pass in the training process: rescan the cache (growing
        epochs), or end the last pass's stream (whole epochs)."""
        if self._whole is not None and get_worker_info() is None:
            self._whole.end()
        if self._epochs is None or get_worker_info() is not None:
            return
        current = self._epochs.current
        if not (self._fresh and current is not None and current.epoch == epoch):
            self._let_go()  # the last set goes first: this epoch's may have to displace it
            self._open()
        self._fresh = False

    def _releaser(self, plan: EpochPlan, split: Split, start: int) -> Callable[[int], None] | None:
        """Cache mode: unmap and unpin each shard once this rank has read its last unit.

        Whole epochs start the pass here (the stream that fetches ahead); in a
        DataLoader worker or the loader process only this process's maps go.
        """
        if self._whole is not None and get_worker_info() is None:
            begun = self._whole.begin(plan, split.rank, split.world_size, start, self._open())
            return begun.release
        if self.cache_epochs == "whole":  # a worker: the training process streams and pins
            shards = self._open()
            last = plan.last_units(split.rank, split.world_size, len(shards))
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
        last = plan.last_units(split.rank, split.world_size, len(shards))
        return self._epochs.releaser(last, start, shards.evict)

    def _adopt_window(self, saved: int) -> None:
        """Resume with the shard windows the state was saved with (the order depends
        on them), if this cache's budget holds two of them (or, for none, the dataset)."""
        if saved == self._window:
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
                f"{self._window:,}",
            )
            self._window = saved
            return
        raise ValueError(
            f"cannot resume: the state was saved reading shard windows of {saved:,} bytes "
            f"(0: the whole dataset at once), which the cache budget of "
            f"{whole.cache.max_bytes:,} cannot hold; give CacheOptions.limit (the cache_limit) "
            "at least the budget it was saved with"
        )
