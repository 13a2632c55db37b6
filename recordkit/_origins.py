"""Where the rows of a batch came from, for transforms that name a record when they fail.

A reader knows each row's shard and record number (its chunks carry them); a
transform does not. While ``recordkit.torch`` runs a ``transform`` on a batch
or a sample it makes that item's :class:`Origins` current (a context variable,
so it is right on whichever thread runs the transform), and a transform such
as :class:`recordkit.torch.DecodeImages` asks :func:`current` for the
``file:offset:record`` of row ``i`` when it has to raise. Offsets are looked up
only then: the happy path costs two array slices per item.

:func:`ordered_map` runs a transform on threads, ahead of the consumer, in order.
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

__all__ = ["Origins", "current", "ordered_map", "using"]


class _Shards(Protocol):
    def path(self, i: int) -> str: ...

    def use(self, i: int) -> Any: ...


class Origins:
    """The shard and record number of each row of one batch (or of one sample).

    Args:
        shards: the shard set the rows were read from (``path(i)``, ``use(i)``).
        shard_ids: each row's shard, an index into ``shards``.
        records: each row's record number within its shard.
    """

    __slots__ = ("records", "shard_ids", "shards")

    def __init__(self, shards: _Shards, shard_ids: np.ndarray, records: np.ndarray) -> None:
        self.shards = shards
        self.shard_ids = shard_ids
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def locate(self, row: int) -> tuple[str, int | None, int]:
        """``(path, offset, record)`` of row ``row`` (the offset from the shard's index)."""
        sid, record = int(self.shard_ids[row]), int(self.records[row])
        path = self.shards.path(sid)
        try:
            with self.shards.use(sid) as shard:
                offset: int | None = int(shard.offsets[record])
        except Exception:  # already failing: a missing offset must not hide the error
            offset = None
        return path, offset, record


_CURRENT: contextvars.ContextVar[Origins | None] = contextvars.ContextVar(
    "recordkit_origins", default=None
)


def current() -> Origins | None:
    """The origins of the item being transformed on this thread (``None`` outside one)."""
    return _CURRENT.get()


def using(origins: Origins | None, fn: Callable[[Any], Any], item: Any) -> Any:
    """``fn(item)`` with ``origins`` current."""
    token = _CURRENT.set(origins)
    try:
        return fn(item)
    finally:
        _CURRENT.reset(token)


def ordered_map(
    fn: Callable[[Any], Any],
    items: Iterator[tuple[int, Any, Origins | None]],
    threads: int,
    ahead: int | None = None,
) -> Generator[tuple[int, Any], None, None]:
    """``(unit, fn(item))`` for each ``(unit, item, origins)``, in order.

    With ``threads`` >= 1, ``fn`` runs on that many threads, up to ``ahead``
    (default ``2 * threads``) items ahead of the consumer (decoders such as Pillow
    and torchvision release the GIL, so they overlap with the training step and
    with each other). An
    exception in ``fn`` is raised at its item's place. ``items`` is pulled on the
    calling thread. Closing the iterator cancels what has not started and waits
    for what has.
    """
    if threads < 1:
        for unit, item, origins in items:
            yield unit, using(origins, fn, item)
        return
    ahead = max(1, 2 * threads if ahead is None else ahead)
    executor = ThreadPoolExecutor(threads, thread_name_prefix="recordkit-transform")
    pending: deque[tuple[int, Future[Any]]] = deque()
    try:
        for unit, item, origins in items:
            pending.append((unit, executor.submit(using, origins, fn, item)))
            if len(pending) >= ahead:
                done_unit, future = pending.popleft()
                yield done_unit, future.result()
        while pending:
            done_unit, future = pending.popleft()
            yield done_unit, future.result()
    finally:
        for _, future in pending:
            future.cancel()
        executor.shutdown(wait=True, cancel_futures=True)
