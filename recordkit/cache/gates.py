"""Gates: how a reader asks whether a shard a :class:`~.stream.Stream` fetches is ready.

``ShardSet.gate`` is a :class:`StreamGate` in the process that runs the stream;
in other processes (DataLoader workers, the loader process) it is the
:class:`DirGate` a ``StreamGate`` pickles into, which polls the cache directory
for the shard to be complete and pinned.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .directory import CacheDir
from .stream import POLL_S, Stream

__all__ = ["DirGate", "StreamGate"]


class StreamGate:
    """The gate of the process that runs a :class:`Stream` (``ShardSet.gate``).

    Pickles into a ``DirGate`` for other processes; in a forked child
    (DataLoader workers), where the stream's threads do not run, it acts as one.
    """

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.limit = stream.task_limit
        self._pid = os.getpid()
        self._forked: DirGate | None = None

    def _gate(self) -> Stream | DirGate:
        if os.getpid() == self._pid:
            return self.stream
        if self._forked is None or self._forked.pid != os.getpid():
            self._forked = DirGate(self.stream.dir.root, self.stream.timeout, self.limit)
        return self._forked

    def ready(self, rel: str) -> bool:
        """Whether shard ``rel`` is complete in the cache and pinned for this pass."""
        return self._gate().ready(rel)

    def wait(self, rel: str) -> float:
        """Block until ``rel`` is ready; returns the seconds waited (see :meth:`Stream.wait`)."""
        return self._gate().wait(rel)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DirGate, (self.stream.dir.root, self.stream.timeout, self.limit))


class DirGate:
    """A gate for processes that read a cache some other process streams into.

    A shard is ready once it is complete in the cache directory and some live
    reader pins it (the stream pins its window), so it cannot be evicted while
    it is opened here.

    Args:
        root: the cache directory.
        timeout: seconds :meth:`wait` waits for one shard.
        limit: the most shard bytes one reader task may touch (0: no limit).
    """

    def __init__(self, root: str, timeout: float | None, limit: int = 0) -> None:
        self.root = root
        self.timeout = timeout
        self.limit = limit
        self.pid = os.getpid()  # the process it was made (or unpickled) in
        self._ready: set[str] = set()
        self._dir: CacheDir | None = None
        self._checked = 0.0

    def _check(self) -> None:
        if self._dir is None:
            self._dir = CacheDir(self.root)
        self._ready |= self._dir.readable()
        self._checked = time.monotonic()

    def ready(self, rel: str) -> bool:
        if rel not in self._ready and time.monotonic() - self._checked > 0.02:
            self._check()
        return rel in self._ready

    def wait(self, rel: str) -> float:
        t0 = time.monotonic()
        delay = 0.005
        while True:
            self._check()
            if rel in self._ready:
                return time.monotonic() - t0
            if self.timeout is not None and time.monotonic() - t0 > self.timeout:
                raise TimeoutError(
                    f"cache {self.root}: shard {rel} was not complete and pinned within "
                    f"{self.timeout} s (the process that streams into the cache is slow or gone)"
                )
            time.sleep(delay)
            delay = min(POLL_S, delay * 2)

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "timeout": self.timeout, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["timeout"], state["limit"])  # type: ignore[misc]
