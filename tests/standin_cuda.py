"""A stand-in for ``torch.cuda`` with CUDA's semantics where they matter to
:class:`recordkit.torch.DevicePrefetcher`, for the CPU: events complete late (a copy
"happens" when its event completes, so its host source must still be alive then),
the current device is per thread and any device call opens a context on it, and the
stream a consumer waits on is the thread's current one. Copies go to the ``meta``
device. Used by ``tests/torch/test_prefetch_standin.py`` and by the dry run of
``scripts/gpu_check.sh`` (``benchmarks/gpu_check.py --dry-run``).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any

import torch

__all__ = ["LATE", "FakeCuda", "FakeEvent", "FakeStream", "install"]

LATE = 0.02  # seconds from an event's record to its completion


class FakeEvent:
    def __init__(self, fake):
        self.fake, self.copies, self.due, self.done = fake, [], None, False

    def record(self, stream):
        self.fake.touch()
        self.copies, stream.copies = stream.copies, []
        self.due = time.monotonic() + LATE
        self.fake.events.append(self)

    def query(self):
        self.fake.touch()
        if not self.done and time.monotonic() >= self.due:
            self._complete()
        return self.done

    def synchronize(self):
        self.fake.touch()
        time.sleep(max(0.0, self.due - time.monotonic()))
        self._complete()

    def _complete(self):
        """The copies run now: each reads its host source, which must still exist."""
        if not self.done:
            self.done = True
            for ref, what in self.copies:
                if ref() is None:
                    self.fake.problems.append(f"{what} was let go before its copy ran")


class FakeStream:
    def __init__(self, fake, device=None):
        fake.touch()
        self.fake, self.copies, self.waited = fake, [], []

    def wait_event(self, event):
        self.fake.touch()
        self.waited.append(event)


class FakeCuda:
    """``torch.cuda`` as the prefetcher uses it, with ``devices`` devices."""

    def __init__(self, devices=1):
        self.devices = devices
        self.local = threading.local()
        self.contexts = set()  # devices a call was made on (CUDA opens a context there)
        self.events, self.problems, self.recorded = [], [], []
        self.values = {}
        self.default = FakeStream(self)
        self.contexts.clear()

    # -- the thread's current device and stream
    def _current(self):
        return getattr(self.local, "device", 0)

    def touch(self):
        self.contexts.add(self._current())

    def is_available(self):
        return True

    def current_device(self):
        return self._current()

    def set_device(self, index):
        self.local.device = index

    @contextlib.contextmanager
    def device(self, index):
        old = self._current()
        self.local.device = index
        try:
            yield
        finally:
            self.local.device = old

    @contextlib.contextmanager
    def stream(self, s):
        old = getattr(self.local, "stream", None)
        self.local.stream = s
        try:
            yield
        finally:
            self.local.stream = old

    def current_stream(self, device=None):
        self.touch()
        return getattr(self.local, "stream", None) or self.default

    def Stream(self, device=None):
        return FakeStream(self, device)

    def Event(self):
        return FakeEvent(self)

    # -- what the copier does to tensors
    def to_device(self, t, device, non_blocking):
        if t.device.type == "meta":
            return t
        stream = getattr(self.local, "stream", None)
        assert stream is not None, "a copy outside the side stream"
        stream.copies.append((weakref.ref(t), f"host tensor {tuple(t.shape)} {t.dtype}"))
        out = torch.empty(t.shape, dtype=t.dtype, device="meta")
        if t.dtype == torch.int64:  # small columns: their values as copied, for the tests
            self.values[id(out)] = t.clone()
        return out

    def record_stream(self, t, stream):
        self.recorded.append((id(t), stream))


def install(fake: FakeCuda, setattr_: Any = setattr) -> None:
    """Make ``recordkit.torch.devcopy`` use ``fake`` for the ``cuda`` device (``setattr_``:
    pytest's ``monkeypatch.setattr`` in tests, undone after them)."""
    from recordkit.torch import devcopy as _devcopy

    real = _devcopy.device_module
    setattr_(
        _devcopy,
        "device_module",
        lambda torch_, kind: fake if kind == "cuda" else real(torch_, kind),
    )
    setattr_(_devcopy, "to_device", fake.to_device)
    setattr_(_devcopy, "record_stream", fake.record_stream)
