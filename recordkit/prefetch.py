"""Overlap loading and host-to-device copies with compute: :class:`DevicePrefetcher`.

A training step should cost max(load, compute), not their sum. The prefetcher
runs the wrapped loader in a background thread, ``depth`` batches ahead of the
consumer. On CUDA it also moves each batch to the device there:

1. every tensor that is not already in page-locked (pinned) memory is copied
   into a reusable pinned staging arena (one per slot, grown on demand; the
   copy runs in torch with the GIL released);
2. the host-to-device copies are issued on a dedicated CUDA stream with
   ``non_blocking=True``, and an event is recorded after them;
3. the consumer's stream waits on that event (the host does not), and every
   device tensor is tied to the consumer's stream with ``record_stream``, so
   the caching allocator does not hand its memory out again before the
   consumer's kernels that use it have run;
4. a slot (its staging arena and the host batch it was copied from) is reused
   only after its event has completed, so pinned memory that a reader recycles
   (``RecordDataset(pin_memory=True)``) is never overwritten mid-copy.

On the CPU (``device="cpu"``) batches are passed through unchanged, still loaded
ahead in the background thread. torch is imported when a prefetcher is made;
this module is reached as ``recordkit.torch.DevicePrefetcher``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ._deps import require

__all__ = ["DevicePrefetcher"]

log = logging.getLogger(__name__)

_ALIGN = 256  # staging offsets: enough for any dtype, and what DMA engines like
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


def _map(fn: Callable[[Any], Any], batch: Any, torch: Any) -> Any:
    """Apply ``fn`` to every tensor of a nested dict / list / tuple; other values pass."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        items = {k: _map(fn, v, torch) for k, v in batch.items()}
        try:
            return type(batch)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_map(fn, v, torch) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(fn, v, torch) for v in batch)
    return batch


class _Slot:
    """Pinned staging memory for one batch in flight, and what must outlive its copy."""

    __slots__ = ("arena", "event", "keep")

    def __init__(self) -> None:
        self.arena: Any = None  # a pinned uint8 tensor
        self.event: Any = None  # recorded after the batch's copies
        self.keep: Any = None  # the host batch and staged tensors, until the event


class _Ready:
    """A batch on the device, valid on the consumer's stream once it waits on ``event``."""

    __slots__ = ("batch", "event", "tensors")

    def __init__(self, batch: Any, event: Any, tensors: list[Any]) -> None:
        self.batch, self.event, self.tensors = batch, event, tensors


class _CudaCopier:
    """Runs in the producer thread: stage into pinned memory, copy on a side stream."""

    def __init__(self, torch: Any, device: Any, slots: int, pin: bool, non_blocking: bool) -> None:
        self.torch = torch
        self.device = device
        self.pin = pin
        self.non_blocking = non_blocking
        self.stream = torch.cuda.Stream(device)
        self.slots = [_Slot() for _ in range(slots)]
        self.turn = 0

    def _needs_staging(self, t: Any) -> bool:
        if t.device.type != "cpu" or t.numel() == 0:
            return False
        return not (t.is_contiguous() and t.is_pinned())

    def _stage(self, slot: _Slot, leaves: list[Any]) -> dict[int, Any]:
        """Copy the leaves that need it into the slot's pinned arena; id(leaf) -> staged."""
        torch = self.torch
        layout, total = [], 0
        for t in leaves:
            if self._needs_staging(t):
                layout.append((t, total))
                total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        if not layout:
            return {}
        if slot.arena is None or slot.arena.numel() < total:
            slot.arena = None  # let the old arena go back to torch's pinned cache first
            # 25% headroom: batches of padded bytes vary in width from batch to batch.
            slot.arena = torch.empty(total + total // 4, dtype=torch.uint8, pin_memory=True)
        staged = {}
        for t, offset in layout:
            nbytes = t.numel() * t.element_size()
            view = slot.arena[offset : offset + nbytes].view(t.dtype).view(t.shape)
            view.copy_(t)  # GIL released; makes non-contiguous tensors contiguous too
            staged[id(t)] = view
        return staged

    def __call__(self, batch: Any) -> _Ready:
        torch = self.torch
        slot = self.slots[self.turn]
        self.turn = (self.turn + 1) % len(self.slots)
        if slot.event is not None:
            slot.event.synchronize()  # its previous copy is done: arena and host batch free
        slot.keep = None
        leaves: list[Any] = []
        _map(leaves.append, batch, torch)
        staged = self._stage(slot, leaves) if self.pin else {}
        moved: list[Any] = []

        def copy(t: Any) -> Any:
            out = staged.get(id(t), t).to(self.device, non_blocking=self.non_blocking)
            if out.device.type == "cuda":
                moved.append(out)
            return out

        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            on_device = _map(copy, batch, torch)
            event = torch.cuda.Event()
            event.record(self.stream)
        slot.event = event
        # The host memory the copies read from must live (and not be recycled by a
        # buffer pool) until the event: keep the batch and the staged views.
        slot.keep = (batch, staged)
        return _Ready(on_device, event, moved)


class _MoveTo:
    """Other devices (no streams here): ``tensor.to(device)`` in the producer thread."""

    def __init__(self, torch: Any, device: Any, non_blocking: bool) -> None:
        self.torch, self.device, self.non_blocking = torch, device, non_blocking

    def __call__(self, batch: Any) -> Any:
        return _map(lambda t: t.to(self.device, non_blocking=self.non_blocking), batch, self.torch)


class _FirstState:
    """The loader's state after the first batch of a pass, shared with the producer."""

    __slots__ = ("counted", "state")

    def __init__(self) -> None:
        self.state: Any = None
        self.counted = False  # the state counts batches in "consumed" (recordkit's loaders)


def _produce(
    loader: Iterable[Any],
    channel: _Channel,
    copier: Callable[[Any], Any] | None,
    first: _FirstState,
) -> None:
    """The producer thread; it holds no reference to the iterator, so GC can stop it.

    Each item is ``(batch, state)``: a loader whose state counts ``consumed``
    batches (recordkit's) is asked for it once, after the first batch, and the
    consumer adds what it took since; any other loader with a ``state_dict`` is
    asked after every batch.
    """
    try:
        state_dict = getattr(loader, "state_dict", None)
        it = iter(loader)
        try:
            for n, batch in enumerate(it):
                state = None
                if state_dict is not None and (n == 0 or not first.counted):
                    state = state_dict()
                    if n == 0:
                        first.counted = isinstance(state, dict) and isinstance(
                            state.get("consumed"), int
                        )
                        first.state = state
                item = copier(batch) if copier is not None else batch
                if not channel.put((item, state)):
                    return  # closed
            channel.put_last(_End())
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # a generator's finally (reader threads, workers) runs here
    except BaseException as exc:
        channel.put_last(_Failure(exc))


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
        if isinstance(batch, _Ready):
            torch = owner._torch
            stream = torch.cuda.current_stream(owner.device)
            stream.wait_event(batch.event)  # the consumer's stream waits, the host does not
            for t in batch.tensors:
                t.record_stream(stream)  # the allocator reuses it only after this stream's work
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
    ints) pass through. Iterate it once per epoch, as the loader. With CUDA, a
    batch arrives on the device with its copies ordered before the current
    stream's next kernels; the host never waits for a copy.

    Args:
        loader: the iterable to wrap.
        device: where batches go (``"cuda"``, ``"cuda:1"``, a ``torch.device``,
            ``"cpu"``). ``"cpu"`` is a pass-through that still loads ahead.
        depth: batches loaded (and copied) ahead of the consumer. 2 hides one
            batch's load and copy behind one step while the next is queued; more
            only helps when load times vary a lot, and costs device memory.
        pin_memory: stage tensors that are not in pinned memory through reusable
            pinned buffers, so copies are asynchronous (CUDA only).
        non_blocking: issue the copies asynchronously (CUDA only).

    Attributes:
        wait_seconds: time the consumer spent waiting for a batch (all passes):
            near zero when loading is hidden behind compute.

    ``len()`` and ``state_dict()`` pass through to the loader; ``state_dict()``
    counts the batches this prefetcher has *yielded*, not those loaded ahead, so
    resuming from it replays nothing and skips nothing. Starting a new pass
    closes the previous one; :meth:`close`, leaving a ``with`` block, or dropping
    the iterator stops the background thread.
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
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"device {device!r}: CUDA is not available; use device='cpu'")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        self._torch = torch
        self.loader = loader
        self.device = dev
        self.depth = depth
        self.pin_memory = pin_memory
        self.non_blocking = non_blocking
        self.wait_seconds = 0.0
        self._cuda_copier: _CudaCopier | None = None
        self._active: weakref.ref[_PrefetchIterator] | None = None

    def _copier(self) -> Callable[[Any], Any] | None:
        if self.device.type == "cpu":
            return None
        if self.device.type != "cuda":
            return _MoveTo(self._torch, self.device, self.non_blocking)
        if self._cuda_copier is None:  # slots (pinned arenas) are kept from pass to pass
            self._cuda_copier = _CudaCopier(
                self._torch, self.device, self.depth + 2, self.pin_memory, self.non_blocking
            )
        return self._cuda_copier

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
