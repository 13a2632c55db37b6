"""Entry points for the child processes tests/test_procs.py starts (children import them)."""

from __future__ import annotations

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
