"""Whole epochs through the shard cache (``CacheOptions(epochs="whole")``, the default).

:class:`WholeEpochs`: every epoch is the whole remote dataset in the epoch plan's
order. The shard set is the remote's catalog (so ``len()`` and the plan are the whole
dataset's); at each pass (a :class:`WholePass`) a
:class:`~recordkit.cache.Stream` fetches the shards in the order the plan first
needs them, ahead of the readers, and the reader lets each go after its last unit.
Under a budget smaller than the dataset the shuffled plan reads in shard windows
sized from the budget (``PlanOptions.shard_window_bytes``). :class:`TaskFeed` is the
same for ``recordkit.tf``'s tasks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..cache import ShardCache
    from .plan import EpochPlan
    from .shards import ShardSet

__all__ = ["TaskFeed", "WholeEpochs", "WholePass"]

# The one documented logger of reading through the cache (docs/cache.md), both modes.
log = logging.getLogger("recordkit.reader.epochs")


class WholeEpochs:
    """Whole epochs from remote storage through a :class:`~recordkit.cache.ShardCache`
    (see the module docs): :meth:`begin` starts a pass.

    Args:
        cache: the cache (its own fill workers, if started, pause while a pass runs).
        timeout: seconds a reader waits for one shard.
        agree_min: for several ranks, the smallest of every rank's value (so all
            ranks plan with the same shard windows).

    Raises:
        ValueError: the remote has no manifest (record counts are needed up
            front), or the cache is in producer mode.
        CacheFullError: a shard is larger than the budget can hold.
    """

    def __init__(
        self,
        cache: ShardCache,
        *,
        timeout: float | None,
        agree_min: Callable[[int], int] | None = None,
    ) -> None:
        from ..cache.stream import footprint, plan_capacity

        self.cache = cache
        self.timeout = timeout
        if cache.mode != "shards":
            raise ValueError(
                f"cache {cache.root} is in producer mode (shards are converted while training "
                "runs, so an epoch cannot be planned over all of them): pass "
                "cache=CacheOptions(..., epochs='growing')"
            )
        self.infos = cache.catalog()
        self.manifest = cache.manifest
        if self.manifest is None:
            raise ValueError(
                f"{cache.remote_url} has no recordkit.json manifest: whole epochs plan over "
                "every shard's record count up front. Write one (recordkit index on the "
                "remote folder, or convert it), or pass "
                "cache=CacheOptions(..., epochs='growing')"
            )
        self.root = str(cache.root)
        sizes = [footprint(i) for i in self.infos]
        capacity = plan_capacity(cache.max_bytes, len(self.infos))
        if agree_min is not None:
            capacity = agree_min(capacity)
        self.capacity = capacity
        big = max(range(len(sizes)), key=sizes.__getitem__, default=None)
        if big is not None and sizes[big] > capacity:
            from ..cache import CacheFullError

            raise CacheFullError(
                f"needs {sizes[big]:,} bytes with its index; the cache budget of "
                f"{cache.max_bytes:,} less {cache.max_bytes - capacity:,} for the cache's "
                f"own files holds {max(capacity, 0):,}: raise cache_limit (CacheOptions.limit; "
                "whole epochs need at least the largest shard, and two read-ahead windows to "
                "overlap fetching with reading)",
                path=self.infos[big].path,
                needed=sizes[big],
            )
        self.fits = sum(sizes) <= capacity
        if self.fits:
            self._window = 0
        else:  # two windows fit beside each other, indexes included
            ratio = min((i.bytes / s for i, s in zip(self.infos, sizes) if s), default=1.0)
            self._window = max(1, int(capacity * ratio) // 2)
        self.pass_: WholePass | None = None

    def window_bytes(self, shuffle: bool) -> int:
        """``PlanOptions.shard_window_bytes`` for this cache: 0 when the dataset fits
        the budget (the order of a local read) or without shuffle."""
        return self._window if shuffle else 0

    def shard_set(self, schema: Any) -> ShardSet:
        """The whole dataset's shards under the cache root (mapped as they arrive)."""
        from .shards import ShardSet

        return ShardSet(self.root, self.manifest, self.infos, schema)

    def begin(
        self, plan: EpochPlan, rank: int, world_size: int, start: int, shards: ShardSet
    ) -> WholePass:
        """Start a pass over ``plan`` from unit ``start`` of ``rank``: the stream
        fetches its shards ahead, and ``shards.gate`` waits for each."""
        self.end()
        self.pass_ = WholePass(self, plan, rank, world_size, start, shards)
        return self.pass_

    def end(self) -> None:
        """End the current pass (its pins go)."""
        if self.pass_ is not None:
            self.pass_.close()
            self.pass_ = None

    def close(self) -> None:
        self.end()

    def __getstate__(self) -> Any:
        raise TypeError("WholeEpochs stays in the process that reads the cache")


class WholePass:
    """One pass of a reader over an epoch plan, through a stream of the cache.

    Attributes:
        first, last: each shard's first and last unit of this rank (-1: none).
        stream: the cache's stream.
    """

    def __init__(
        self,
        whole: WholeEpochs,
        plan: EpochPlan,
        rank: int,
        world_size: int,
        start: int,
        shards: ShardSet,
    ) -> None:
        from ..cache.gates import StreamGate

        self.whole = whole
        self.epoch = plan.epoch
        self.shards = shards
        self.first, self.last = plan.shard_units(rank, world_size)
        seq = plan.shard_sequence()
        rank_in_seq = np.empty_like(seq)
        rank_in_seq[seq] = np.arange(len(seq))
        wanted = np.flatnonzero((self.first >= 0) & (self.last >= start))
        key = np.maximum(self.first[wanted], start) * (len(seq) + 1) + rank_in_seq[wanted]
        order = wanted[np.argsort(key, kind="stable")]
        infos = whole.infos
        self.stream = whole.cache.stream(
            [infos[i] for i in order.tolist()],
            epoch=plan.epoch,
            timeout=whole.timeout,
            capacity=whole.capacity,  # what the plan's windows were sized from
        )
        self._gate = StreamGate(self.stream)
        shards.gate = self._gate
        records = int(plan.total)
        log.info(
            "epoch %d reads all %d shards (%s records) through the cache %s, from unit %d: "
            "%d shard(s) to read, %s",
            plan.epoch,
            len(infos),
            f"{records:,}",
            whole.root,
            start,
            len(order),
            "the whole dataset fits the budget"
            if whole.fits
            else (
                f"shard windows of {plan.options.shard_window_bytes:,} bytes"
                if plan.options.shard_window_bytes
                else "in dataset order"
            ),
        )
        self._order = iter(np.argsort(self.last, kind="stable").tolist())
        self._pending: int | None = next(self._order, None)
        self.release(start - 1)  # shards this rank does not read, or read before the start

    def release(self, unit: int) -> None:
        """The reader has read unit ``unit``: every shard whose last unit is <= it goes
        (unmapped first, then unpinned and marked consumed)."""
        done = []
        last = self.last
        while self._pending is not None and last[self._pending] <= unit:
            self.shards.evict(self._pending)
            done.append(self.shards.infos[self._pending].path)
            self._pending = next(self._order, None)
        if done:
            self.stream.release(done)

    def close(self) -> None:
        """Stop the stream and unpin what is left (maps first)."""
        if self.shards.gate is self._gate:
            self.shards.gate = None
        self.shards.close()
        self.stream.close()
        stats = self.stream.stats.as_dict()
        log.info(
            "epoch %d through the cache %s: %d shard(s) fetched, %d cached; readers waited "
            "%.2f s for the remote in total so far",
            self.epoch,
            self.whole.root,
            stats["fetched"],
            stats["cached"],
            stats["wait_seconds"],
        )


class TaskFeed:
    """Whole epochs for ``recordkit.tf``'s plan tasks (``PlanTasks(feed=...)``).

    TensorFlow reads an epoch's tasks on several threads, a few ahead of the
    consumer and in no fixed order, so a read cannot tell where a pass starts.
    The tasks are therefore *announced* first, one at a time and in order (a
    sequential stage of the pipeline, :meth:`announce`): the first task
    announced for an epoch starts that epoch's pass, from that task (a
    ``tf.train.Checkpoint`` restore resumes mid-epoch). Reads then run in any
    order (:meth:`begin`, :meth:`done`); once every task before task *t* is done
    the shards no later task reads go. The next epoch's first task waits for
    the tasks of this pass still being read before the pass is ended. One
    iterator at a time per dataset: a task announced out of sequence (a new or
    restored iterator) starts a new pass at once.

    Args:
        whole: the cache's whole epochs.
        shards: the shard set the tasks read.
        plan: the plan of an epoch (``PlanTasks.plan``).
        task_units, tasks: units per task, tasks per epoch.
        rank: the pipeline id; world_size: the number of pipelines.
    """

    def __init__(
        self,
        whole: WholeEpochs,
        shards: ShardSet,
        plan: Callable[[int], EpochPlan],
        *,
        task_units: int,
        tasks: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.whole = whole
        self.shards = shards
        self.plan = plan
        self.task_units = task_units
        self.tasks = tasks
        self.rank, self.world_size = rank, world_size
        self._cond = threading.Condition()
        self._epoch: int | None = None  # the pass's epoch (None: no pass)
        self._low = 0  # every task before it is done
        self._done: set[int] = set()
        self._last: tuple[int, int] | None = None  # the task announced last
        self._pending = 0  # tasks announced in this pass and not done

    def announce(self, epoch: int, task: int) -> None:
        """Task ``task`` of ``epoch`` is next in the stream (called in stream order)."""
        with self._cond:
            last = self._last
            self._last = (epoch, task)
            if last is not None and self._epoch == epoch and task == last[1] + 1:
                self._pending += 1  # the pass goes on
                return
            if last is not None and (epoch, task) == (last[0] + 1, 0):
                # the same iterator's next epoch: let this pass's reads in flight finish
                self._cond.wait_for(lambda: self._pending <= 0, timeout=self.whole.timeout)
            self._start(epoch, task)
            self._pending = 1

    def _start(self, epoch: int, task: int) -> None:
        self.whole.end()
        self._epoch, self._low, self._done = epoch, task, set()
        start = task * self.task_units
        self.whole.begin(self.plan(epoch), self.rank, self.world_size, start, self.shards)

    def begin(self, epoch: int, task: int) -> None:
        """A read of an announced task starts (a task never announced starts a pass)."""
        with self._cond:
            if epoch != self._epoch:
                self._start(epoch, task)
                self._last, self._pending = (epoch, task), 1

    def done(self, epoch: int, task: int) -> None:
        with self._cond:
            current = self.whole.pass_
            if epoch != self._epoch or current is None:
                return
            self._pending -= 1
            self._cond.notify_all()
            self._done.add(task)
            low = self._low
            while low in self._done:
                self._done.discard(low)
                low += 1
            if low == self._low:
                return
            self._low = low
            current.release(low * self.task_units - 1)
            if low >= self.tasks:  # the epoch is read: its pins go now
                self.whole.end()
                self._epoch = None  # iterated again, it starts a new pass
