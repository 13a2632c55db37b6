"""Child processes, managed: one way to start them, watch them and stop them.

Every helper process recordkit starts goes through here: the writer processes of
``recordkit convert`` (and :func:`recordkit.write`), the cache's producer writers
and the loader process of ``reader_process=True``.

- **Fresh interpreters** (``python -c``) that import only what their entry point
  needs. Never ``fork`` (the parent has threads, fsspec event loops, maybe CUDA),
  and never ``multiprocessing``'s spawn: spawn runs the parent's ``__main__``
  again in every child, so a training script without an
  ``if __name__ == "__main__":`` guard started over in each writer and hung. A
  task that names something defined in the user's script (a function given to
  :func:`recordkit.write` there) loads that script in the child on first need,
  as ``__mp_main__`` the way spawn does (the guarded block does not run), and
  a script that starts recordkit's processes again while being loaded gets an
  error that says to add the guard.
- **One connection per child**, a :mod:`multiprocessing` connection over a
  socketpair, for small pickled control messages (tasks, progress, outcomes);
  bulk data travels through files or shared memory.
- **Parent death**: a child polls its parent's pid and exits when the parent is
  gone (killed, even by SIGKILL), so no orphan writes on. Not
  ``PR_SET_PDEATHSIG``: that fires when the *thread* that started the child
  ends, and the cache's fill threads come and go while their writers live on.
- **Ctrl-C** is the parent's to handle: children ignore SIGINT (a traceback
  from each of them would bury the parent's one-line summary) and the parent
  stops them.
- **Stopping** is join -> terminate -> kill, with a log line at each step; a
  child that outlives SIGKILL (stuck in uninterruptible I/O) is left to exit on
  its own rather than waited on for ever.
- **Inactivity**: :class:`Deadline` turns "no message for N seconds" into an
  error the caller raises, never a hang.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import multiprocessing
import os
import pickle
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "STOP_WAIT_S",
    "Child",
    "Deadline",
    "RemoteTraceback",
    "can_load_main",
    "check_not_loading_main",
    "exit_reason",
    "pack_exception",
    "receive",
    "stop_all",
    "unpack_exception",
]

log = logging.getLogger(__name__)

#: Seconds each step of join -> terminate -> kill waits for the child to exit.
STOP_WAIT_S = 5.0
# How often a child looks for its parent. A killed parent's writers stop within this.
_PARENT_POLL_S = 0.25

_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from recordkit._procs import _boot; _boot()"
)


# -- the parent's side ------------------------------------------------------------------------


def exit_reason(code: int | None) -> str:
    """``"killed by SIGKILL"``, ``"exit code 1"`` or ``"still running"``."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def _main_spec() -> dict[str, str] | None:
    """How a child can load this process's ``__main__``, as spawn would (``None``: it cannot)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name:  # python -m pkg.mod
        # ``python -m pkg`` runs pkg/__main__.py, which spawn does not run again either.
        return None if name == "__main__" or name.endswith(".__main__") else {"name": name}
    path = getattr(main, "__file__", None)
    return {"path": os.path.abspath(path)} if path else None


def can_load_main() -> bool:
    """Whether a child can load this process's ``__main__`` to find a function defined
    there: not from an interactive session, ``python -c`` or ``python -m pkg``."""
    return _main_spec() is not None


class Child:
    """A fresh interpreter running ``entry(conn)``, and the connection to it.

    Args:
        entry: ``"module:function"``; the function takes the child's end of the
            connection and returns when the child should exit.
        what: what the child is, for log lines and errors (``"writer process"``).
    """

    def __init__(self, entry: str, *, what: str = "child process") -> None:
        check_not_loading_main(f"a {what}")
        self.what = what
        self.conn, theirs = multiprocessing.Pipe(duplex=True)
        fd = theirs.fileno()
        spec = {
            "fd": fd,
            "parent": os.getpid(),
            "level": logging.getLogger("recordkit").getEffectiveLevel(),
            "main": _main_spec(),
        }
        argv = [sys.executable, "-c", _BOOT, json.dumps(sys.path), entry, json.dumps(spec)]
        try:
            self.proc = subprocess.Popen(argv, pass_fds=(fd,))
        except BaseException:
            self.conn.close()
            raise
        finally:
            theirs.close()
        self.pid = self.proc.pid
        log.debug("started %s %d (%s)", what, self.pid, entry)

    def __repr__(self) -> str:
        return f"{self.what} {self.pid}"

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def wait(self, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds for it to exit; its exit code, or ``None``."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        return self.proc.returncode

    def reason(self) -> str:
        """How it ended (``"killed by SIGKILL"``), waiting a little for a dying process."""
        return exit_reason(self.wait(STOP_WAIT_S))

    def send(self, message: Any) -> bool:
        """Send ``message`` (pickled); ``False`` if the child is gone."""
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError: it died
            return False
        return True

    def stop(self, why: str, *, join: float = 0.0, level: int = logging.WARNING) -> None:
        """join (``join`` seconds) -> terminate -> kill; see :func:`stop_all`."""
        stop_all([self], why, join=join, level=level)

    def close(self, goodbye: Any = None) -> None:
        """Ask it to exit (send ``goodbye``), join; terminate and kill it if it does not."""
        self.send(goodbye)
        self.stop("asked to exit", join=STOP_WAIT_S)

    def kill(self, why: str) -> None:
        """SIGKILL at once (it also ends a stopped process), with a log line; then reap."""
        if self.alive():
            log.warning("%s: %s: kill", self, why)
            self.proc.kill()
            if self.wait(STOP_WAIT_S) is None:
                log.warning("%s did not die yet (uninterruptible I/O?); left to exit", self)
        self.conn.close()


def _names(children: Sequence[Child]) -> str:
    if len(children) == 1:
        return str(children[0])
    pids = ", ".join(str(c.pid) for c in children)
    return f"{len(children)} {children[0].what}es ({pids})"  # "writer processes"


def _wait_all(children: Sequence[Child], seconds: float) -> list[Child]:
    """Wait until all have exited or ``seconds`` passed; those still running."""
    deadline = time.monotonic() + seconds
    for c in children:
        c.wait(max(0.0, deadline - time.monotonic()))
    return [c for c in children if c.alive()]


def stop_all(
    children: Sequence[Child], why: str, *, join: float = 0.0, level: int = logging.WARNING
) -> None:
    """Stop ``children`` together: join -> terminate -> kill, a log line at each step.

    Args:
        children: the processes.
        why: why they are stopped, for the log (``"no progress for 900 s"``).
        join: seconds to wait for them to exit on their own first (after a
            goodbye message); 0 goes straight to SIGTERM.
        level: the log level of the join and terminate lines (``DEBUG`` when the
            user asked for it, e.g. Ctrl-C); a kill is always a WARNING.
    """
    alive = [c for c in children if c.alive()]
    if alive and join > 0:
        log.debug("%s: %s: join", _names(alive), why)
        alive = _wait_all(alive, join)
        if alive:
            why = f"still running {join:.0f} s after being {why}"
    if alive:
        log.log(level, "%s: %s: terminate", _names(alive), why)
        for c in alive:
            with contextlib.suppress(OSError):
                c.proc.terminate()
        alive = _wait_all(alive, STOP_WAIT_S)
    if alive:
        log.warning("%s ignored SIGTERM for %.0f s: kill", _names(alive), STOP_WAIT_S)
        for c in alive:
            with contextlib.suppress(OSError):
                c.proc.kill()
        alive = _wait_all(alive, STOP_WAIT_S)
    if alive:  # uninterruptible I/O: never block the caller on it
        log.warning("%s did not die: left to exit on its own", _names(alive))
    for c in children:
        c.conn.close()


class Deadline:
    """An inactivity deadline: expired once ``seconds`` pass without :meth:`touch`.

    Args:
        seconds: the allowed silence; ``None`` never expires.
    """

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and not seconds > 0:
            raise ValueError(f"an inactivity timeout must be > 0 or None, got {seconds!r}")
        self.seconds = seconds
        self.last = time.monotonic()

    def touch(self) -> None:
        """Something happened: the silence starts over."""
        self.last = time.monotonic()

    def expired(self) -> bool:
        """Whether ``seconds`` have passed since the last :meth:`touch`."""
        return self.seconds is not None and time.monotonic() - self.last > self.seconds

    def poll(self, most: float) -> float:
        """How long to wait for a message before looking at the clock again."""
        return most if self.seconds is None else min(most, self.seconds / 4)


# -- exceptions across the connection ----------------------------------------------------------


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child process (set as its ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


Packed = tuple["bytes | None", str, list[str], str]


def pack_exception(exc: BaseException) -> Packed:
    """``exc`` as it crosses to the parent: pickled when it survives a round trip,
    and always its one-line summary, its notes and its traceback text."""
    text = "".join(traceback.format_exception(exc))
    notes = [str(n) for n in getattr(exc, "__notes__", None) or []]
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # an __init__ that does not take its own args back fails here
    except Exception:
        blob = None
    return blob, f"{type(exc).__name__}: {exc}", notes, text


def unpack_exception(packed: Packed, fallback: type[Exception]) -> BaseException:
    """The exception :func:`pack_exception` packed, or ``fallback(summary)`` with its
    notes when its class cannot be rebuilt here; its ``__cause__`` is the remote traceback."""
    blob, summary, notes, text = packed
    exc: BaseException | None = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:  # a class only the child could import (its __mp_main__)
            exc = None
    if not isinstance(exc, BaseException):
        exc = fallback(summary)
        for note in notes:
            _add_note(exc, note)
    exc.__cause__ = RemoteTraceback(text)
    return exc


def _add_note(exc: BaseException, note: str) -> None:
    # recordkit.errors' add_note, here too: this module imports nothing of recordkit.
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


# -- the child's side --------------------------------------------------------------------------

_main: dict[str, str] | None = None  # how to load the parent's __main__ (set by _boot)
_main_loaded = False
_loading_main: str | None = None  # the script being loaded, while it is
_main_failed: str | None = None  # why it could not be loaded


def check_not_loading_main(what: str) -> None:
    """Refuse to start ``what`` while a child loads the user's script to find a task's
    function: the script is running recordkit again at import time (no ``__main__`` guard).

    Raises:
        RuntimeError: naming the script and the fix.
    """
    if _loading_main is not None:
        raise RuntimeError(
            f"{_loading_main} started {what} while a recordkit child process imported it "
            "to find a function its task names (the script's top level runs again there): "
            'put the code that starts the work under `if __name__ == "__main__":`'
        )


def _load_main() -> None:
    """Load the parent's ``__main__`` as ``__mp_main__`` (what spawn does), once: a
    script that failed to load fails every task that needs it the same way."""
    global _main_loaded, _loading_main, _main_failed
    if _main_failed is not None:
        raise RuntimeError(_main_failed)
    _main_loaded = True
    if _main is None:
        return
    where = _main.get("path") or _main["name"]
    _loading_main = where
    try:
        if "name" in _main:
            content = runpy.run_module(_main["name"], run_name="__mp_main__", alter_sys=True)
        else:
            content = runpy.run_path(_main["path"], run_name="__mp_main__")
    except BaseException as exc:
        _main_loaded = False
        _main_failed = f"{where} failed to load in a recordkit child process: {exc}"
        raise
    finally:
        _loading_main = None
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(content)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


class _Unpickler(pickle.Unpickler):
    """Resolves names from the parent's ``__main__``, loading it on first need."""

    def find_class(self, module: str, name: str) -> Any:
        main = sys.modules["__main__"]
        if module == "__main__" and not _main_loaded and not hasattr(main, name.partition(".")[0]):
            _load_main()
        return super().find_class(module, name)


def receive(conn: Connection) -> Any:
    """``conn.recv()`` in a child: names from the parent's ``__main__`` resolve too."""
    data = conn.recv_bytes()
    return _Unpickler(io.BytesIO(data)).load()


def _watch_parent(parent: int) -> None:
    """Exit as soon as the parent is gone (see the module doc)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(1)

    if os.getppid() != parent:  # it died before this child got here
        os._exit(1)
    threading.Thread(target=watch, name="recordkit-parent-watch", daemon=True).start()


def _boot() -> None:
    """A child's start: ``argv`` is the parent's ``sys.path`` (JSON; set before any
    import), the entry ``module:function``, and a JSON spec (the connection's file
    descriptor, the parent's pid, the log level, where the parent's ``__main__`` is)."""
    global _main
    entry, spec = sys.argv[2], json.loads(sys.argv[3])
    _watch_parent(int(spec["parent"]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=int(spec["level"]), format="%(levelname)s %(name)s[%(process)d]: %(message)s"
    )
    _main = spec.get("main")
    module, _, name = entry.partition(":")
    function = getattr(importlib.import_module(module), name)
    try:
        function(Connection(int(spec["fd"])))
    except (BrokenPipeError, ConnectionResetError):
        # The parent closed its end (Ctrl-C, a stop): nobody is left to tell, and its
        # own line says what happened; a traceback here would only bury that line.
        log.debug("the parent closed the connection: exit")
        sys.exit(1)
