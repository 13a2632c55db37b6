"""File locks that die with their process.

Two primitives, both on ``fcntl.flock``:

- :class:`DirLock`, one mutex per cache directory for the short critical
  sections that read and change the cache's state (the budget, the lease and
  pin files, publishing and evicting). It serialises threads of one process and
  processes of one machine alike: each acquisition opens its own file
  description, and Linux ``flock`` locks on distinct descriptions conflict even
  inside one process.
- :class:`HeldFile`, a small JSON file whose *existence plus lock* is a claim
  (a space reservation, a pin). Its owner keeps it open and ``LOCK_EX``-locked
  for as long as the claim holds. The kernel drops the lock when the owner dies
  — SIGKILL included — so :func:`live_claims` can tell a live claim from a
  dead process's leftover by trying the lock, and removes the leftovers.

Claims are created, changed, read and removed only under the :class:`DirLock`,
so a claim is never seen between its creation and its locking. ``flock`` is
local to one machine: a cache directory on NFS shared by several hosts is not
supported.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)


class DirLock:
    """A mutex over a cache directory for threads and processes (re-entrant per thread).

    Fork-safe: a child's copy of a descriptor that holds (or is about to hold)
    the ``flock`` would keep it held for as long as the child lives, so a fork
    (DataLoader workers) waits for every lock's current holder to leave, and the
    child starts with fresh locks.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd = -1
        _LOCKS.add(self)

    def after_fork_in_child(self) -> None:
        """Start afresh: the parent's holder does not exist in the child."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # the child's copy; the parent's stays locked
        self._fd = -1
        self._depth = 0
        self._thread_lock = threading.RLock()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._thread_lock:
            if self._depth == 0:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fd, self._fd = self._fd, -1
                    os.close(fd)  # closing the last descriptor drops the flock


_LOCKS: weakref.WeakSet[DirLock] = weakref.WeakSet()
_HELD_FOR_FORK: list[DirLock] = []


def _before_fork() -> None:
    # No thread may be between opening the lock file and recording the descriptor
    # (or blocked in flock on it) while the process is copied.
    for lock in list(_LOCKS):
        lock._thread_lock.acquire()  # the current holder leaves; held across the fork
        _HELD_FOR_FORK.append(lock)


def _after_fork_in_parent() -> None:
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop()._thread_lock.release()  # this process's threads come in again


def _after_fork_in_child() -> None:
    _HELD_FOR_FORK.clear()
    for lock in list(_LOCKS):
        lock.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


class HeldFile:
    """A claim: a JSON file this process keeps open and exclusively locked.

    Create, update and release it only while holding the directory's :class:`DirLock`.
    """

    def __init__(self, path: str, content: dict[str, Any]) -> None:
        self.path = path
        self.content = dict(content)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._fd = fd
            self._write()
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def _write(self) -> None:
        data = json.dumps(self.content, separators=(",", ":")).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def update(self, **changes: Any) -> None:
        """Rewrite the claim's content in place (the lock stays held)."""
        if self._fd < 0:
            raise ValueError(f"claim {self.path} was released")
        self.content.update(changes)
        self._write()

    def release(self) -> None:
        """Remove the claim. Idempotent."""
        if self._fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        fd, self._fd = self._fd, -1
        os.close(fd)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        content = json.loads(raw)
        if not isinstance(content, dict):
            raise ValueError("not an object")
    except ValueError:
        content = {"unreadable": True}
    return content


def live_claims(
    directory: str, on_dead: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, dict[str, Any]]:
    """The live claims in ``directory`` by file name; removes those of dead processes.

    Call it under the directory's :class:`DirLock`. A live claim whose content
    cannot be parsed maps to ``{"unreadable": True}`` so callers can be
    conservative about it. ``on_dead`` gets the content of each dead claim before
    it is removed (to clean up what that process left).
    """
    out: dict[str, dict[str, Any]] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for name in sorted(names):
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError):
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                out[name] = _parse(os.pread(fd, 1 << 24, 0))
                continue
            # We got the lock: its owner is gone. Unlink while holding it.
            log.info("removing stale claim %s (its process is gone)", path)
            if on_dead is not None:
                on_dead(_parse(os.pread(fd, 1 << 24, 0)))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)
    return out
