"""One progress display for every long command: a tqdm bar, log lines, or a plain line.

Library code reports through the :class:`Tracker` protocol (``start`` with the
totals, ``add`` as work is done, ``close``) and never prints; the CLI hands it a
:class:`Meter`, which shows

- ``"bar"``: a tqdm bar on a terminal (sizes in KiB/MiB/GiB, records, shards);
- ``"log"``: a line at INFO on the ``recordkit.progress`` logger every
  ``interval`` seconds with the rate and the ETA, and one at the end (what
  ``"auto"`` picks when stderr is not a terminal: logs, CI, ``nohup``);
- ``"plain"``: one line rewritten in place (a new line each time when the stream
  is not a terminal), with no dependency: ``"bar"`` falls back to it when tqdm
  is not installed, so a missing tqdm never stops a command;
- ``"none"``: nothing (``-q``).

Progress never blocks the work: ``add`` only adds integers under a lock that
nothing holds for longer than a copy, and every write to the terminal or the log
happens on the meter's own daemon thread. A stalled terminal stalls that thread,
never a worker; an error while drawing (a closed pipe) turns the display off.
"""

from __future__ import annotations

import collections
import importlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

from ._units import format_duration, format_rate, format_size, noun, plural

__all__ = ["COUNTERS", "MODES", "Meter", "NoTracker", "Tracker", "resolve_mode"]

log = logging.getLogger("recordkit.progress")

#: What a meter counts. ``bytes`` are shown in binary units; the others as counted nouns.
COUNTERS = ("bytes", "records", "shards", "items")
#: The display modes a :class:`Meter` takes (``--progress``).
MODES = ("auto", "bar", "log", "plain", "none")

_SHOWN = (2, 3, 1, 0)  # beside the main counter: shards, items, records, bytes
_BAR_TICK_S = 0.25  # redraw period of a bar or plain line: smooth, and a few writes a second
_RATE_WINDOW_S = 60.0  # the rate (and so the ETA) is over the last minute, not the whole run


class Tracker(Protocol):
    """Receives a long operation's progress (:func:`recordkit.verify`, ``build_index``).

    ``add`` may be called from any thread and must be quick; the operation calls
    ``start`` once before its first ``add`` and ``close`` once when it ends
    (finished or failed).
    """

    def start(
        self,
        *,
        bytes: int | None = None,
        records: int | None = None,
        shards: int | None = None,
        items: int | None = None,
        done: Mapping[str, int] | None = None,
    ) -> None:
        """The totals (``None``: unknown); ``done``: counts an earlier run already did
        (a counter named there is shown even while zero)."""
        return None

    def add(self, *, bytes: int = 0, records: int = 0, shards: int = 0, items: int = 0) -> None:
        """Count work done (negative when an attempt is rolled back)."""
        return None

    def close(self) -> None:
        """The operation ended."""
        return None


class NoTracker(Tracker):
    """A :class:`Tracker` that ignores everything (the default): the protocol's methods."""


def resolve_mode(mode: str, stream: TextIO | None = None) -> str:
    """The display ``mode`` comes to here: ``"auto"`` is ``"bar"`` on a terminal and
    ``"log"`` otherwise; ``"bar"`` is ``"plain"`` when tqdm is not installed."""
    if mode not in MODES:
        raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "auto":
        mode = "bar" if _isatty(stream or sys.stderr) else "log"
    if mode == "bar":
        try:
            importlib.import_module("tqdm")
        except ImportError:
            return "plain"
    return mode


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _terminal(stream: Any) -> tuple[int, int]:
    """``(columns, rows)`` of the terminal ``stream`` draws on; 80 x 24 for a size of 0
    (a pty nobody sized, a serial console), which tqdm would draw nothing into."""
    try:
        size = os.get_terminal_size(stream.fileno())
        columns, rows = size.columns, size.lines
    except (AttributeError, OSError, ValueError):  # not a real terminal: a test's stream
        columns = rows = 0
    fallback = shutil.get_terminal_size((80, 24))
    return columns or fallback.columns, rows or fallback.lines


class Meter:
    """Shows the progress of one long operation; a :class:`Tracker`.

    Args:
        desc: what runs, the line's label (``"verify"``, ``"cache fill"``).
        unit: the counter the bar and the ETA follow: ``"bytes"``, ``"records"``,
            ``"shards"`` or ``"items"``; the others counted appear beside it.
        mode: ``"auto"``, ``"bar"``, ``"log"``, ``"plain"`` or ``"none"`` (see the module).
        interval: seconds between log lines (``"log"``). 10 s: a line often enough to
            see a job move in a CI log, rarely enough that a day's run is a few
            thousand lines.
        stream: where a bar or plain line is drawn (default: ``sys.stderr`` when created).
        item: what an item is called (``"input"``, ``"partition"``).
        logger: the logger of ``"log"`` lines (default ``recordkit.progress``).
    """

    def __init__(
        self,
        desc: str,
        *,
        unit: str = "bytes",
        mode: str = "auto",
        interval: float = 10.0,
        stream: TextIO | None = None,
        item: str = "item",
        logger: logging.Logger | None = None,
    ) -> None:
        if unit not in COUNTERS:
            raise ValueError(f"unit must be one of {', '.join(COUNTERS)}, got {unit!r}")
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        self.desc = desc
        self.unit = unit
        self.stream: TextIO = stream or sys.stderr
        self.mode = resolve_mode(mode, self.stream)
        self.interval = interval
        self.item = item
        self.logger = logger or log
        self._lock = threading.Lock()
        self._count = [0, 0, 0, 0]  # COUNTERS order; only add() and snapshots touch it
        self._base = [0, 0, 0, 0]  # what an earlier run did: shown, not in the rate
        self._total: list[int | None] = [None, None, None, None]
        self._used = [False, False, False, False]  # shown even while zero
        self._t0 = time.monotonic()
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._plain_width = 0
        self._plain_last = 0.0
        self._broken = False
        self.lines = 0  # log or plain lines written so far
        #: A short text shown after the counts (``"cache 1.2 GiB"``); set it from any thread.
        self.note = ""

    # The Tracker protocol -------------------------------------------------------------

    def start(
        self,
        *,
        bytes: int | None = None,
        records: int | None = None,
        shards: int | None = None,
        items: int | None = None,
        done: Mapping[str, int] | None = None,
    ) -> None:
        """Set the totals (``None``: unknown) and start showing."""
        with self._lock:
            for i, total in enumerate((bytes, records, shards, items)):
                self._total[i] = total
                self._used[i] = self._used[i] or total is not None
            for name, n in (done or {}).items():
                i = COUNTERS.index(name)
                self._count[i] += n
                self._base[i] += n
                self._used[i] = True
        self._used[COUNTERS.index(self.unit)] = True
        self._t0 = time.monotonic()
        if self.mode != "none" and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"recordkit-progress-{self.desc}", daemon=True
            )
            self._thread.start()

    def add(self, *, bytes: int = 0, records: int = 0, shards: int = 0, items: int = 0) -> None:
        """Count work done. Cheap: integer additions under an uncontended lock."""
        with self._lock:
            c = self._count
            c[0] += bytes
            c[1] += records
            c[2] += shards
            c[3] += items

    def close(self) -> None:
        """Show the final state and stop (idempotent; waits for the drawing thread)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Reading ---------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """What has been counted so far (earlier runs' ``done`` included)."""
        with self._lock:
            return dict(zip(COUNTERS, self._count, strict=True))

    def text(self, *, final: bool = False, percent: bool = True, width: int = 0) -> str:
        """The status as one line of text, as the log and plain modes show it.

        With ``width`` (the bar's room) the main count, rate and ETA come first and
        the other counts follow only as far as they fit.
        """
        head, extras, tail = self._parts(final, percent)
        if not width:
            return ", ".join([head, *extras, *tail])
        line = ", ".join([head, *tail])
        for extra in extras:
            if len(line) + 2 + len(extra) > width:
                break
            line += f", {extra}"
        return line

    def _parts(self, final: bool, percent: bool) -> tuple[str, list[str], list[str]]:
        now = time.monotonic()
        with self._lock:
            count, total = list(self._count), list(self._total)
        p = COUNTERS.index(self.unit)
        head = self._amount(p, count[p], total[p])
        if percent and (goal := total[p]):
            head += f" ({100.0 * count[p] / goal:.0f}%)"
        extras = [
            self._amount(i, count[i], total[i])
            for i in _SHOWN
            if i != p and (self._used[i] or count[i])
        ]
        if self.note:
            extras.append(self.note)
        tail = []
        rate = self._rate(now, count[p], final)
        if rate is not None:
            tail.append(format_rate(rate) if self.unit == "bytes" else self._per_s(rate))
        if final:
            tail.append(f"{format_duration(now - self._t0)} elapsed")
        elif (goal := total[p]) is not None:
            eta = "?" if not rate else format_duration((goal - count[p]) / rate)
            tail.append(f"ETA {eta}")
        return head, extras, tail

    def _amount(self, i: int, n: int, total: int | None) -> str:
        if COUNTERS[i] == "bytes":
            if total is None:
                return format_size(n)
            return f"{format_size(n)}/{format_size(total)}"
        word = {"records": "record", "shards": "shard", "items": self.item}[COUNTERS[i]]
        return plural(n, word) if total is None else f"{n}/{plural(total, word)}"

    def _per_s(self, rate: float) -> str:
        word = self.item if self.unit == "items" else self.unit[:-1]
        return f"{rate:.1f} {noun(2, word)}/s"

    def _rate(self, now: float, n: int, final: bool) -> float | None:
        """Per second over the last minute (the whole run for the final line)."""
        p = COUNTERS.index(self.unit)
        if final or not self._samples:
            t, start = self._t0, self._base[p]
        else:
            t, start = self._samples[0]
        dt = now - t
        return (n - start) / dt if dt > 0 else None

    # Drawing (the meter's thread only) -------------------------------------------------

    def _run(self) -> None:
        period = max(self.interval, _BAR_TICK_S) if self.mode == "log" else _BAR_TICK_S
        self._draw(final=False, first=True)
        while not self._stop.wait(period):
            self._draw(final=False)
        self._draw(final=True)

    def _draw(self, *, final: bool, first: bool = False) -> None:
        if self._broken:
            return
        try:
            now = time.monotonic()
            with self._lock:
                n = self._count[COUNTERS.index(self.unit)]
            self._samples.append((now, n))
            while self._samples and now - self._samples[0][0] > _RATE_WINDOW_S:
                self._samples.popleft()
            if self.mode == "bar":
                self._draw_bar(final)
            elif self.mode == "plain":
                self._draw_plain(final)
            elif self._log_due(first, final):
                self.logger.info("%s: %s", self.desc, self.text(final=final))
                self.lines += 1
        except Exception as exc:  # a closed pipe, a terminal gone: stop drawing, never the work
            self._broken = True
            log.debug("progress display of %s turned off: %r", self.desc, exc)

    def _log_due(self, first: bool, final: bool) -> bool:
        """Log lines come every ``interval``, the first after one interval, and a final
        one when any came before (a run shorter than the interval ends with its summary
        alone); ``interval=0`` logs every tick, the first and the final included."""
        if self.interval == 0:
            return True
        return (final and self.lines > 0) or not (first or final)

    def _draw_bar(self, final: bool) -> None:
        p = COUNTERS.index(self.unit)
        with self._lock:
            n, total = self._count[p], self._total[p]
        columns = _terminal(self.stream)[0]
        room = columns - len(self.desc) - (22 if total else 2)  # "desc: 100%|" + 10-col bar
        stats = self.text(final=final, percent=False, width=max(room, 20))
        if self._bar is None:
            self._bar = _make_bar(self.desc, total, self._base[p], self.stream, stats)
        self._bar.ncols = columns
        self._bar.stats = stats
        self._bar.n = n if total is None else min(n, total)
        self._bar.refresh()
        if final:
            self._bar.close()

    def _draw_plain(self, final: bool) -> None:
        line = f"{self.desc}: {self.text(final=final)}"
        if _isatty(self.stream):
            width = _terminal(self.stream)[0] - 1
            line = line[:width]
            pad = " " * max(0, self._plain_width - len(line))
            self._plain_width = len(line)
            self.stream.write(f"\r{line}{pad}" + ("\n" if final else ""))
        else:
            now = time.monotonic()
            due = now - max(self._plain_last, self._t0) >= max(self.interval, _BAR_TICK_S)
            if not (due or final):
                return
            self._plain_last = now
            self.stream.write(line + "\n")
        self.stream.flush()
        self.lines += 1


def _make_bar(desc: str, total: int | None, initial: int, stream: TextIO, stats: str) -> Any:
    """A tqdm bar whose numbers are this module's (binary sizes, counted nouns)."""
    tqdm = importlib.import_module("tqdm")

    class _Bar(tqdm.tqdm):  # type: ignore[misc,name-defined]  # tqdm's documented extension
        stats = ""

        @property
        def format_dict(self) -> dict[str, Any]:
            d: dict[str, Any] = super().format_dict
            d["stats"] = self.stats
            return d

    _Bar.stats = stats  # before tqdm's first draw, in its constructor
    shape = "{desc}: {percentage:3.0f}%|{bar}| {stats}" if total else "{desc}: {stats}"
    return _Bar(
        total=total or None,
        initial=initial,
        desc=desc,
        file=stream,
        bar_format=shape,
        ncols=_terminal(stream)[0],  # and again at each redraw: the terminal may be resized
        nrows=_terminal(stream)[1],
        mininterval=0,  # the meter's thread already paces the redraws
        leave=True,
    )
