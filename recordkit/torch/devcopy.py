"""Host-to-device copies for :class:`~recordkit.torch.prefetch.DevicePrefetcher`, and pinned memory.

One discipline for every accelerator whose torch module (``torch.cuda``,
``torch.xpu``, ...) has streams and events (:class:`StreamCopier`):

1. host tensors that are not in page-locked (pinned) memory are staged into a
   pinned arena per slot (a synchronous host copy, GIL released), except a
   pinned tensor trimmed along its last dimension (a padded ``Bytes`` column),
   whose full rows are copied and sliced on the device instead;
2. the copies are issued on a side stream of the device, ``non_blocking``, and
   an event is recorded after them;
3. every host tensor a copy reads (a reader's pinned batch, a staged view) is
   kept until that event has completed, and no longer: the producer drops the
   keeps of completed events before each pull from the loader, and waits for
   all but the newest pending copy then, so at most two batches' host memory
   is held for copies (a loader process has only a few shared-memory slots);
4. a slot's arena is rewritten only after its previous event has completed.

A device type without streams and events (``mps``, ``meta``) gets
:class:`SyncCopier`: blocking copies, nothing to keep. torch is passed in by
the caller (``recordkit.torch.prefetch`` imports it on demand).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._deps import require

log = logging.getLogger("recordkit.torch.prefetch")

_ALIGN = 256  # staging offsets: enough for any dtype, and what DMA engines like
# A trimmed pinned tensor is copied as full rows (no staging copy) when those
# rows are at most this many times its own bytes; past that, staging moves fewer bytes.
_ROWS_FACTOR = 2
# What a device module needs for the asynchronous path.
_STREAM_API = ("Stream", "Event", "stream", "device", "current_stream", "set_device")
_PIN_TYPES = ("cuda", "xpu")  # where torch's pinned host allocator serves the device

_fallback_lock = threading.Lock()
_fallback_logged = False


def device_module(torch: Any, kind: str) -> Any | None:
    """``torch.cuda`` / ``torch.xpu`` / ... if it has streams and events, else None."""
    try:
        module = torch.get_device_module(kind)
    except (RuntimeError, ValueError, AttributeError):  # "cpu", "meta": no module
        return None
    return module if all(hasattr(module, name) for name in _STREAM_API) else None


def is_available(torch: Any, kind: str) -> bool:
    """False only when the device type's torch module says so (``meta`` is always there)."""
    try:
        module = torch.get_device_module(kind)
    except (RuntimeError, ValueError, AttributeError):
        return True
    available = getattr(module, "is_available", None)
    return available is None or bool(available())


def to_device(t: Any, device: Any, non_blocking: bool) -> Any:
    """One tensor copy (a function of its own so a CPU test can stand in for a device)."""
    return t.to(device, non_blocking=non_blocking)


def record_stream(t: Any, stream: Any) -> None:
    """Tie ``t``'s memory to ``stream`` in the caching allocator (see :func:`to_device`)."""
    t.record_stream(stream)


def _log_fallback(exc: BaseException | str) -> None:
    global _fallback_logged
    with _fallback_lock:
        if _fallback_logged:
            return
        _fallback_logged = True
    log.info("pinned memory is not available (%s): using ordinary memory", exc)


def pinned_empty(torch: Any, nbytes: int) -> Any:
    """A page-locked uint8 CPU tensor, or an ordinary one (one INFO line per process)."""
    try:
        t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as exc:  # no pinned allocator (macOS releases, CPU builds)
        _log_fallback(exc)
        return torch.empty(nbytes, dtype=torch.uint8)
    if t.device.type != "cpu":  # some macOS releases hand back an "mps" tensor
        _log_fallback(f"pin_memory=True returned a {t.device.type!r} tensor")
        return torch.empty(nbytes, dtype=torch.uint8)
    return t


def can_pin() -> bool:
    """Whether pinned host memory serves the accelerator this process uses."""
    torch = require("torch", extra="torch")
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        current = accelerator.current_accelerator()
        return current is not None and current.type in _PIN_TYPES
    return bool(torch.cuda.is_available())


def pinned_slab(nbytes: int) -> np.ndarray:
    """A page-locked slab for a ``BufferPool`` (ordinary memory if pinning fails)."""
    torch = require("torch", extra="torch")
    slab: np.ndarray = pinned_empty(torch, nbytes).numpy()  # the array keeps the tensor
    return slab


def tree_map(fn: Callable[[Any], Any], batch: Any, torch: Any) -> Any:
    """Apply ``fn`` to every tensor of a nested dict / list / tuple; other values pass."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        items = {k: tree_map(fn, v, torch) for k, v in batch.items()}
        try:
            return type(batch)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(tree_map(fn, v, torch) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(tree_map(fn, v, torch) for v in batch)
    return batch


def full_rows(t: Any) -> Any | None:
    """For ``t = a[..., :w]`` of a C-contiguous ``a``: the rows of ``a`` under ``t``, else None."""
    if t.dim() < 2 or t.stride(-1) != 1 or t.numel() == 0:
        return None
    shape = list(t.shape)
    shape[-1] = t.stride(-2)
    if shape[-1] < t.shape[-1]:
        return None
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    if any(t.stride(i) != strides[i] for i in range(t.dim() - 1) if t.shape[i] > 1):
        return None
    span = math.prod(shape)
    end = (t.storage_offset() + span) * t.element_size()
    if span > _ROWS_FACTOR * t.numel() or end > t.untyped_storage().nbytes():
        return None
    return t.as_strided(shape, strides)


class Ready:
    """A batch on the device, valid on the consumer's stream once it waits on ``event``."""

    __slots__ = ("batch", "event", "tensors")

    def __init__(self, batch: Any, event: Any, tensors: list[Any]) -> None:
        self.batch, self.event, self.tensors = batch, event, tensors


class _Slot:
    """A staging arena, reused only after the event of the copies that read it."""

    __slots__ = ("arena", "event")

    def __init__(self) -> None:
        self.arena: Any = None  # a pinned uint8 tensor
        self.event: Any = None


class StreamCopier:
    """Runs in the producer thread of one pass: stage, copy on a side stream, keep, release.

    Args:
        torch: the torch module.
        module: the device's torch module (``torch.cuda``, ``torch.xpu``).
        device: the resolved device (with its index).
        slots: staging arenas in rotation (the prefetcher's depth + 2).
        pin: stage tensors that are not pinned, so every copy is asynchronous.
        non_blocking: issue the copies asynchronously.
    """

    def __init__(
        self, torch: Any, module: Any, device: Any, slots: int, pin: bool, non_blocking: bool
    ) -> None:
        self.torch, self.module, self.device = torch, module, device
        self.pin, self.non_blocking = pin, non_blocking
        self.slots = [_Slot() for _ in range(slots)]
        self.turn = 0
        self.stream: Any = None
        # (event, host tensors its copies read), oldest first; events complete in order
        self.pending: deque[tuple[Any, list[Any]]] = deque()

    def start(self) -> None:
        """In the producer thread: make the device current there (no context on GPU 0)."""
        self.module.set_device(self.device.index)
        self.stream = self.module.Stream(self.device)

    def release(self, keep: int = 0) -> None:
        """Drop the keeps of completed copies; wait until at most ``keep`` are pending."""
        pending = self.pending
        while pending and pending[0][0].query():
            pending.popleft()
        while len(pending) > keep:
            pending[0][0].synchronize()
            pending.popleft()

    def finish(self) -> None:
        """Wait for every copy, then let go of the keeps and the arenas."""
        self.release(0)
        for slot in self.slots:
            if slot.event is not None:
                slot.event.synchronize()
            slot.arena = slot.event = None

    def _stage(self, slot: _Slot, leaves: list[Any]) -> dict[int, Any]:
        """Copy the leaves that need it into the slot's arena; id(leaf) -> staged view."""
        torch = self.torch
        layout, total = [], 0
        for t in leaves:
            if t.device.type == "cpu" and t.numel() and not self._direct(t):
                layout.append((t, total))
                total += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        if not layout:
            return {}
        if slot.arena is None or slot.arena.numel() < total:
            slot.arena = None  # let the old arena go back to torch's pinned cache first
            # 25% headroom: batches of padded bytes vary in width from batch to batch.
            slot.arena = pinned_empty(torch, total + total // 4)
        staged = {}
        for t, offset in layout:
            nbytes = t.numel() * t.element_size()
            view = slot.arena[offset : offset + nbytes].view(t.dtype).view(t.shape)
            view.copy_(t)  # GIL released; makes non-contiguous tensors contiguous too
            staged[id(t)] = view
        return staged

    @staticmethod
    def _direct(t: Any) -> bool:
        """A pinned tensor copied without staging: contiguous, or whole rows of one."""
        if not t.is_pinned():
            return False
        return bool(t.is_contiguous()) or full_rows(t) is not None

    def __call__(self, batch: Any) -> Ready:
        torch, module = self.torch, self.module
        self.release(1)
        slot = self.slots[self.turn]
        self.turn = (self.turn + 1) % len(self.slots)
        if slot.event is not None:
            slot.event.synchronize()  # the arena's previous copy is done
            slot.event = None
        leaves: list[Any] = []
        tree_map(leaves.append, batch, torch)
        staged = self._stage(slot, leaves) if self.pin else {}
        sources: list[Any] = []
        moved: list[Any] = []

        def copy(t: Any) -> Any:
            src = staged.get(id(t), t)
            rows = None
            if src is t and t.device.type == "cpu" and not t.is_contiguous() and self.pin:
                rows = full_rows(t) if t.is_pinned() else None
            out = to_device(src if rows is None else rows, self.device, self.non_blocking)
            if out is src:
                return out  # already there: no copy
            if src.device.type == "cpu":
                sources.append(src if rows is None else rows)
            if rows is not None:
                out = out[..., : t.shape[-1]].contiguous()  # on the side stream, in HBM
            moved.append(out)
            return out

        with module.device(self.device.index), module.stream(self.stream):
            on_device = tree_map(copy, batch, torch)
            event = module.Event()
            event.record(self.stream)
        slot.event = event
        # Keep what the copies read, and nothing else, until the event completes:
        # a reader's pool or loader process may recycle that memory once it is freed.
        self.pending.append((event, sources))
        return Ready(on_device, event, moved)


class SyncCopier:
    """A device without streams and events (``mps``, ``meta``): blocking copies, no keeps."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device

    def start(self) -> None:
        """Nothing to set up."""

    def release(self, keep: int = 0) -> None:
        """Nothing is kept."""

    def finish(self) -> None:
        """Nothing is pending."""

    def __call__(self, batch: Any) -> Any:
        return tree_map(lambda t: to_device(t, self.device, False), batch, self.torch)
