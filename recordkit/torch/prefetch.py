"""Overlap loading and host-to-device copies with compute: :class:`DevicePrefetcher`.

A training step should cost max(load, compute), not their sum. The prefetcher
runs the wrapped loader in a background thread, ``depth`` batches ahead of the
consumer. On an accelerator whose torch module has streams and events (CUDA,
XPU) it also moves each batch to the device there (:mod:`recordkit.torch.devcopy`):

1. every tensor that is not already in page-locked (pinned) memory is copied
   into a reusable pinned staging arena (one per slot, grown on demand; the
   copy runs in torch with the GIL released);
2. the host-to-device copies are issued on a side stream with
   ``non_blocking=True``, and an event is recorded after them;
3. the consumer's current stream at ``next()`` waits on that event (the host
   does not), and every device tensor is tied to that stream with
   ``record_stream``, so the caching allocator does not hand its memory out
   again before the consumer's kernels that use it have run;
4. the host memory a copy reads (a reader's pinned batch, a staging arena) is
   kept until that copy's event has completed, and no longer, so a reader that
   recycles buffers (``RecordDataset(options=ReadOptions(pin_memory=True))``, the loader process's
   shared-memory slots) is neither overwritten mid-copy nor starved.

Other devices (``mps``, ``meta``) get blocking copies in the background thread;
on the CPU (``device="cpu"``) batches are passed through unchanged, still loaded
ahead. The device is resolved at the first iteration (``"cuda"`` is then
``torch.cuda.current_device()``), and the background thread makes it current
before any device call. torch is imported when a prefetcher is made; this
module is reached as ``recordkit.torch.DevicePrefetcher``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .._deps import require
from . import devcopy as _devcopy
from .devcopy import Ready, StreamCopier, SyncCopier

__all__ = ["DevicePrefetcher"]

log = logging.getLogger(__name__)

_JOIN_SECONDS = 60.0  # close() waits this long for the loader's current batch


class _End:
    """Marks the end of the loader's iteration."""


class _Failure:
    """An exception raised by the loader (or a copy) in the producer thread."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Channel:
    """A bounded FIFO between the producer thread and the consumer; ``close`` unblocks both."""

    def __init__(self, size: int) -> None:
        self._items: deque[Any] = deque()
        self._size = size
        self._cv = threading.Condition()
        self.closed = False

    def put(self, item: Any) -> bool:
        """Wait for room; False when the channel was closed (the item is dropped)."""
        with self._cv:
            while len(self._items) >= self._size and not self.closed:
                self._cv.wait()
            if self.closed:
                return False
            self._items.append(item)
            self._cv.notify_all()
            return True

    def put_last(self, item: Any) -> None:
        """The producer's final word (end or failure): never waits for room."""
        with self._cv:
            if not self.closed:
                self._items.append(item)
                self._cv.notify_all()

    def get(self, alive: Callable[[], bool]) -> Any:
        """The next item; raises if the producer died without a final word."""
        with self._cv:
            while not self._items:
                if not alive() and not self._items:
                    raise RuntimeError("the prefetch thread stopped without a result")
                self._cv.wait(timeout=1.0)
            item = self._items.popleft()
            self._cv.notify_all()
            return item

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._items.clear()
            self._cv.notify_all()


class _FirstState:
    """The loader's state after the first batch of a pass, shared with the producer."""

    __slots__ = ("counted", "state")

    def __init__(self) -> None:
        self.state: Any = None
        self.counted = False  # the state counts batches in "consumed" (recordkit's loaders)


def _produce(
    loader: Iterable[Any],
    channel: _Channel,
    copier: StreamCopier | SyncCopier | None,
    first: _FirstState,
) -> None:
    """The producer thread; it holds no reference to the iterator, so GC can stop it.

    Each item is ``(batch, state)``: a loader whose state counts ``consumed``
    batches (recordkit's) is asked for it once, after the first batch, and the
    consumer adds what it took since; any other loader with a ``state_dict`` is
    asked after every batch. The copies read the loader's buffers, so they are
    finished before the loader's iteration is closed (a loader process unmaps
    its shared memory then).
    """
    outcome: Any = _End()
    it: Any = None
    try:
        if copier is not None:
            copier.start()
        state_dict = getattr(loader, "state_dict", None)
        it = iter(loader)
        n = 0
        while True:
            if copier is not None:
                copier.release(1)  # the loader may need the buffers of finished copies
            try:
                batch = next(it)
            except StopIteration:
                break
            state = None
            if state_dict is not None and (n == 0 or not first.counted):
                state = state_dict()
                if n == 0:
                    first.counted = isinstance(state, dict) and isinstance(
                        state.get("consumed"), int
                    )
                    first.state = state
            item = copier(batch) if copier is not None else batch
            del batch  # the copier keeps what its copies still read, and only that
            if not channel.put((item, state)):
                outcome = None  # closed: nobody listens
                break
            del item
            n += 1
    except BaseException as exc:
        outcome = _Failure(exc)
    steps = [] if copier is None else [copier.finish]
    close = getattr(it, "close", None)
    if close is not None:
        steps.append(close)  # a generator's finally (reader threads, workers) runs here
    for step in steps:
        try:
            step()
        except BaseException as exc:
            if outcome is not None and not isinstance(outcome, _Failure):
                outcome = _Failure(exc)
    if outcome is not None:
        channel.put_last(outcome)


def _stop(channel: _Channel, thread: threading.Thread) -> None:
    channel.close()
    if thread is threading.current_thread() or not thread.is_alive():
        return
    thread.join(_JOIN_SECONDS)
    if thread.is_alive():
        log.warning(
            "prefetch thread %s still running after %.0f s: the loader is stuck in a batch",
            thread.name,
            _JOIN_SECONDS,
        )


class _PrefetchIterator:
    """One pass over the loader; stops its thread on close, exhaustion, error or GC."""

    def __init__(self, owner: DevicePrefetcher) -> None:
        self._owner = owner
        self._channel = _Channel(owner.depth)
        self.first = _FirstState()
        self.consumed = 0
        self.done = False
        self.state: Any = None  # the loader's state after the last batch yielded
        self._thread = threading.Thread(
            target=_produce,
            args=(owner.loader, self._channel, owner._copier(), self.first),
            name="recordkit-prefetch",
            daemon=True,  # close() and GC stop it; daemon only so a stuck loader cannot hang exit
        )
        self._finalizer = weakref.finalize(self, _stop, self._channel, self._thread)
        self._thread.start()

    def __iter__(self) -> _PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        owner = self._owner
        t0 = time.perf_counter()
        item = self._channel.get(self._thread.is_alive)
        owner.wait_seconds += time.perf_counter() - t0
        if isinstance(item, _End):
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            if hasattr(item.exc, "add_note"):  # Python >= 3.11
                item.exc.add_note("(raised by the loader in the recordkit-prefetch thread)")
            raise item.exc
        batch, state = item
        if state is not None:
            self.state = state
        self.consumed += 1
        if isinstance(batch, Ready):
            module: Any = owner._module  # not None: only a device with streams makes a Ready
            stream = module.current_stream(owner.device)  # the user's, at this next()
            stream.wait_event(batch.event)  # the consumer's stream waits, the host does not
            for t in batch.tensors:
                # the allocator reuses it only after this stream's work
                _devcopy.record_stream(t, stream)
            return batch.batch
        return batch

    def state_dict(self) -> Any:
        """The loader's state after the last batch yielded, or None if there is none yet."""
        if self.first.counted:
            first = self.first.state
            return dict(first, consumed=first["consumed"] - 1 + self.consumed)
        return self.state

    def close(self) -> None:
        """Stop the thread (and the loader's iteration); waits for its current batch."""
        self.done = True
        self._finalizer()


class DevicePrefetcher:
    """Load batches ahead in a background thread and move them to ``device`` there.

    Wraps any iterable of tensors, or of dicts / lists / tuples of tensors (a
    :class:`RecordDataset`, a ``DataLoader``); other values in a batch (``bytes``,
    ints) pass through. Iterate it once per epoch, as the loader. On CUDA (or
    XPU), a batch arrives on the device with its copies ordered before the
    next kernels of the stream that is current at ``next()``; the host never
    waits for a copy. A yielded host tensor must not be written in place (the
    reader may reuse its buffer once the copy is done).

    Args:
        loader: the iterable to wrap.
        device: where batches go (``"cuda"``, ``"cuda:1"``, ``"xpu"``, a
            ``torch.device``, ``"cpu"``). ``"cpu"`` is a pass-through that still
            loads ahead. A device without an index is resolved when the first
            pass starts (``torch.cuda.current_device()`` then), so a prefetcher
            made before ``torch.cuda.set_device(local_rank)`` still feeds that rank.
        depth: batches loaded (and copied) ahead of the consumer. 2 hides one
            batch's load and copy behind one step while the next is queued; more
            only helps when load times vary a lot, and costs device memory.
        pin_memory: stage tensors that are not in pinned memory through reusable
            pinned buffers, so copies are asynchronous (devices with streams).
        non_blocking: issue the copies asynchronously (devices with streams;
            elsewhere copies block the background thread, never the consumer).

    Attributes:
        device: the device batches go to (with its index once a pass has started).
        wait_seconds: time the consumer spent waiting for a batch (all passes):
            near zero when loading is hidden behind compute.

    ``len()`` and ``state_dict()`` pass through to the loader; ``state_dict()``
    counts the batches this prefetcher has *yielded*, not those loaded ahead, so
    resuming from it replays nothing and skips nothing. Starting a new pass
    closes the previous one; :meth:`close`, leaving a ``with`` block, or dropping
    the iterator stops the background thread and lets go of its host buffers.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: Any = "cuda",
        *,
        depth: int = 2,
        pin_memory: bool = True,
        non_blocking: bool = True,
    ) -> None:
        torch = require("torch", extra="torch")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        dev = torch.device(device)
        module = _devcopy.device_module(torch, dev.type)
        ok = module.is_available() if module is not None else _devcopy.is_available(torch, dev.type)
        if dev.type != "cpu" and not ok:
            raise RuntimeError(
                f"device {device!r}: {dev.type.upper()} is not available; use device='cpu'"
            )
        self._torch = torch
        self._module = module
        self.loader = loader
        self.device = dev
        self.depth = depth
        self.pin_memory = pin_memory
        self.non_blocking = non_blocking
        self.wait_seconds = 0.0
        self._active: weakref.ref[_PrefetchIterator] | None = None

    def _copier(self) -> StreamCopier | SyncCopier | None:
        """A fresh copier per pass: a stuck earlier pass can never share its slots."""
        if self.device.type == "cpu":
            return None
        if self._module is None:
            return SyncCopier(self._torch, self.device)
        if self.device.index is None:  # resolved once, at the first pass
            index = self._module.current_device()
            self.device = self._torch.device(self.device.type, index)
        return StreamCopier(
            self._torch,
            self._module,
            self.device,
            self.depth + 2,
            self.pin_memory,
            self.non_blocking,
        )

    def __iter__(self) -> Iterator[Any]:
        self.close()
        it = _PrefetchIterator(self)
        self._active = weakref.ref(it)
        return it

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the current pass's thread, if any (the loader's iteration is closed too)."""
        it = self._active() if self._active is not None else None
        self._active = None
        if it is not None:
            it.close()

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch this prefetcher yielded."""
        it = self._active() if self._active is not None else None
        if it is not None and not it.done:
            state = it.state_dict()
            if state is not None:
                return state  # type: ignore[no-any-return]
        return self.loader.state_dict()  # type: ignore[attr-defined,no-any-return]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Pass through to the loader; the next pass resumes there."""
        self.close()
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]
