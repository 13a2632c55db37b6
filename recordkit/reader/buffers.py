"""Reusable batch buffers.

A fresh 16 MiB array per batch costs a page fault per 4 KiB page on first touch
(~2.6 µs each here, capping a loader at ~1.5 GB/s). The pool hands out arrays
carved from slabs it keeps, and takes a slab back only when every array,
view and ``torch.from_numpy`` tensor made from it is gone: each lease is the
``base`` of the arrays built on it, and a ``weakref.finalize`` on the lease
returns the slab. A slab is therefore never reused while user code can still
see it, however long the user keeps a batch.

The slabs themselves come from ``allocate`` (default: ``np.empty``); the PyTorch
reader passes one that returns page-locked (pinned) memory, so batches can be
copied to a GPU asynchronously with no staging copy. Everything here is guarded
by one lock, and finalizers may run on any thread: the pool is safe to share
between reader threads and consumers, also on free-threaded CPython.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BufferPool", "Lease"]

_ALIGN = 64  # cache line; also what SIMD copies like


class Lease:
    """Exports the memory at ``address`` to NumPy via ``__array_interface__`` and keeps
    its ``owner`` (a slab, a shared-memory segment) alive; a ``weakref.finalize`` on the
    lease frees the memory once every array made from it is gone."""

    __slots__ = ("__array_interface__", "__weakref__", "owner")

    def __init__(
        self, owner: Any, address: int, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (address, False),
            "version": 3,
        }


class BufferPool:
    """A thread-safe pool of page-touched slabs that batch arrays are carved from.

    Args:
        max_free_bytes: slabs kept for reuse beyond this are released to the OS.
        allocate: makes a new slab: ``allocate(nbytes)`` returns a 1-D ``uint8``
            array of at least ``nbytes`` (e.g. pinned memory); default ``np.empty``.
        min_bytes: smaller arrays come from ``np.empty`` (malloc is cheaper than
            the bookkeeping below 64 KiB); 0 makes every array a pooled one.
    """

    def __init__(
        self,
        max_free_bytes: int = 1 << 30,
        *,
        allocate: Callable[[int], np.ndarray] | None = None,
        min_bytes: int = 64 << 10,
    ) -> None:
        self.max_free_bytes = max_free_bytes
        self.min_bytes = min_bytes
        self._allocate = allocate or (lambda nbytes: np.empty(nbytes, dtype=np.uint8))
        self._free: list[np.ndarray] = []
        self._free_bytes = 0
        self._lock = threading.Lock()
        self.allocated = 0  # slabs created (for tests and stats)

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` backed by a pooled slab."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize  # (np.prod costs 4 µs a call)
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        slab = self._take(nbytes)
        lease = Lease(slab, slab.ctypes.data, tuple(int(d) for d in shape), dtype)
        weakref.finalize(lease, self._give_back, slab)
        return np.asarray(lease)

    def _take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            best = None
            for i, slab in enumerate(self._free):
                # Reuse a slab that fits without wasting more than half of it.
                if nbytes <= slab.nbytes <= 2 * nbytes and (
                    best is None or slab.nbytes < self._free[best].nbytes
                ):
                    best = i
            if best is not None:
                slab = self._free.pop(best)
                self._free_bytes -= slab.nbytes
                return slab
            self.allocated += 1
        size = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        slab = self._allocate(size)
        if slab.dtype != np.uint8 or slab.ndim != 1 or slab.nbytes < nbytes:
            raise ValueError(f"allocate({size}) must return a 1-D uint8 array of >= {size} bytes")
        return slab

    def _give_back(self, slab: np.ndarray) -> None:
        with self._lock:
            if self._free_bytes + slab.nbytes <= self.max_free_bytes:
                self._free.append(slab)
                self._free_bytes += slab.nbytes

    def clear(self) -> None:
        """Drop every free slab."""
        with self._lock:
            self._free.clear()
            self._free_bytes = 0
