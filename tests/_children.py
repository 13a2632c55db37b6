"""Entry points for the child processes tests/test_procs.py starts (children import them)."""

from __future__ import annotations

import contextlib
import signal
import time
from multiprocessing.connection import Connection

from recordkit._procs import pack_exception, receive


def echo(conn: Connection) -> None:
    """Send back what arrives, until ``None``."""
    while (msg := receive(conn)) is not None:
        conn.send(msg)


def call(conn: Connection) -> None:
    """``(fn, arg)`` in, ``("ok", fn(arg))`` or ``("error", packed)`` out, until ``None``."""
    while True:
        try:
            msg = receive(conn)
        except Exception as exc:
            conn.send(("error", pack_exception(exc)))
            continue
        if msg is None:
            return
        fn, arg = msg
        conn.send(("ok", fn(arg)))


def stubborn(conn: Connection) -> None:
    """Ignore SIGTERM, say so, then wait to be killed."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn.send("ready")
    while True:
        time.sleep(1)


def chatty(conn: Connection) -> None:
    """Say "ready", wait for the parent to close its end, then keep talking (as a writer
    reporting progress does when Ctrl-C closed the parent's end under it)."""
    conn.send("ready")
    with contextlib.suppress(EOFError):
        conn.recv()
    for _ in range(1000):
        conn.send(("progress", (1, 2, 3)))
        time.sleep(0.001)
