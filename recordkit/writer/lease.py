"""One writer per destination: the lease a ``Writer``, ``recordkit convert`` or
``recordkit write`` holds on its dataset directory while it writes (the rules, and
what a second writer is told: ``docs/howto/concurrency.md``).

Locally a ``flock`` (``LOCK_EX``, not blocking) on the directory itself, which the
kernel drops when its process dies, with :data:`LEASE_NAME` beside the shards saying
who holds it. On an object store :data:`LEASE_NAME` created only if absent (fsspec's
exclusive ``xb`` mode): taken over when its holder ran on this host and is gone,
else only with ``break_lock=True``; a store that cannot create conditionally is not
locked (a WARNING says so). The destination is only touched while the lease is held.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import time
from typing import Any

from ..errors import DestinationBusyError
from ..storage import is_remote, strip_file_scheme

__all__ = ["LEASE_NAME", "Lease"]

log = logging.getLogger(__name__)

LEASE_NAME = ".recordkit-lease.json"


def _me(what: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": now.isoformat(timespec="seconds"),
        "what": what,
        "started": _start_time(os.getpid()),
    }


def _start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot; Linux), to tell a pid reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder of a lease may still be running (``True`` unless this host can
    tell it is gone)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = holder.get("started")
    return started is None or _start_time(pid) in (None, started)


def _busy(url: str, holder: dict[str, Any], remote: bool) -> DestinationBusyError:
    who = (
        f"{holder.get('what', 'a writer')} (pid {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')} since {holder.get('since', '?')})"
        if holder
        else "another writer"
    )
    if remote:
        advice = "wait for it, or pass break_lock=True (--break-lock) if that process is gone"
    else:
        advice = "wait for it to finish (its lock goes with its process)"
    return DestinationBusyError(
        f"{url} is being written by {who}; {advice}", path=url, holder=holder
    )


class Lease:
    """The exclusive lease of one writer on a dataset directory (a context manager).

    Args:
        url: the dataset directory (local path or fsspec URL); created if missing.
        storage_options: fsspec options for a remote ``url``.
        what: who holds it, for the message others get (``"recordkit convert"``).
        break_lock: take over a remote lease whose holder this host cannot see.

    Raises:
        DestinationBusyError: another writer holds the lease (from :meth:`acquire`).
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        what: str = "a writer",
        break_lock: bool = False,
    ) -> None:
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        self.what = what
        self.break_lock = break_lock
        self._fd: int | None = None
        self._remote_key: str | None = None
        self._fs: Any = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lease (see the module docstring)."""
        if self.url.startswith("memory://"):
            return  # lives in this process: nobody else can write there
        if is_remote(self.url):
            self._acquire_remote()
        else:
            self._acquire_local()

    def _acquire_local(self) -> None:
        import fcntl

        root = strip_file_scheme(self.url)
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            # The holder writes who it is right after it takes the lock: wait for that.
            holder, deadline = self._read_local(root), time.monotonic() + 2.0
            while not holder and time.monotonic() < deadline:
                time.sleep(0.05)
                holder = self._read_local(root)
            raise _busy(self.url, holder, remote=False) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        from ..format import atomic_write_bytes

        try:  # who holds it, for the message a second writer gets
            atomic_write_bytes(os.path.join(root, LEASE_NAME), json.dumps(_me(self.what)).encode())
        except OSError as exc:
            log.info("%s: could not say who holds its lease (%s)", self.url, exc)

    @staticmethod
    def _read_local(root: str) -> dict[str, Any]:
        try:
            with open(os.path.join(root, LEASE_NAME), "rb") as f:
                doc = json.loads(f.read(1 << 16))
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _acquire_remote(self) -> None:
        from ..storage import Location

        fs, path = Location(self.url, self.storage_options)._filesystem()
        key = f"{path.rstrip('/')}/{LEASE_NAME}"
        for _ in range(2):
            try:
                with fs.open(key, "xb") as f:
                    f.write(json.dumps(_me(self.what)).encode())
            except FileExistsError:
                holder = self._read_remote(fs, key)
                if self.break_lock or (holder and not _alive(holder)):
                    log.warning("%s: taking over the lease of %s", self.url, holder or "?")
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm_file(key)
                    continue
                raise _busy(self.url, holder, remote=True) from None
            except (NotImplementedError, ValueError, TypeError) as exc:
                log.warning(
                    "%s cannot be locked (%s has no conditional create: %s): make sure one "
                    "writer at a time writes there",
                    self.url,
                    type(fs).__name__,
                    exc,
                )
                return
            self._fs, self._remote_key = fs, key
            return
        raise _busy(self.url, self._read_remote(fs, key), remote=True)

    @staticmethod
    def _read_remote(fs: Any, key: str) -> dict[str, Any]:
        try:
            doc = json.loads(fs.cat_file(key))
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def release(self) -> None:
        """Give the lease back (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(strip_file_scheme(self.url), LEASE_NAME))
            os.close(self._fd)  # the flock goes with the descriptor
            self._fd = None
        if self._remote_key is not None:
            with contextlib.suppress(OSError):
                self._fs.rm_file(self._remote_key)
            self._remote_key = None
