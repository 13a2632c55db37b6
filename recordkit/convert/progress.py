"""Progress is a protocol with a no-op default; the CLI plugs in a bar or log lines.

Library code never prints. :class:`TqdmProgress` draws a tqdm bar (bytes, rate,
ETA, items) and is what the CLI uses when stderr is a terminal;
:class:`LogProgress` logs a line every ``interval`` seconds otherwise. When the
source's sizes are unknown (:func:`recordkit.write`'s inputs), both count items.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from .._units import format_size

__all__ = ["LogProgress", "NullProgress", "Progress", "TqdmProgress", "choose_progress"]

log = logging.getLogger("recordkit.convert")


class Progress(Protocol):
    """Receives a conversion's progress. Calls come from one thread."""

    def start(self, items: int, size: int, done_items: int, done_size: int) -> None:
        """Total ``items`` / source bytes ``size``; ``done_*`` were published by an earlier run."""

    def update(self, items: int, size: int, records: int) -> None:
        """More items / source bytes / records done (negative when an attempt is retried)."""

    def close(self) -> None:
        """The conversion ended (finished or failed)."""


class NullProgress:
    """Ignores progress (the default)."""

    def start(self, items: int, size: int, done_items: int, done_size: int) -> None:
        """Ignore the totals."""

    def update(self, items: int, size: int, records: int) -> None:
        """Ignore an update."""

    def close(self) -> None:
        """Nothing to close."""


class LogProgress:
    """Logs ``items, bytes, rate, ETA`` at INFO every ``interval`` seconds (and at the end).

    Args:
        interval: seconds between lines.
    """

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.items = self.size = self.records = 0
        self.total_items = self.total_size = 0
        self._t0 = self._last = 0.0
        self._size0 = self._items0 = 0

    def start(self, items: int, size: int, done_items: int, done_size: int) -> None:
        """Remember the totals and the starting point."""
        self.total_items, self.total_size = items, size
        self.items, self.size, self._size0 = done_items, done_size, done_size
        self._items0 = done_items
        self._t0 = self._last = time.monotonic()

    def update(self, items: int, size: int, records: int) -> None:
        """Count; log if ``interval`` has passed."""
        self.items += items
        self.size += size
        self.records += records
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        """The current status line."""
        elapsed = max(1e-9, (now or time.monotonic()) - self._t0)
        if not self.total_size and self.total_items:  # sizes unknown: count items
            per_s = (self.items - self._items0) / elapsed
            left_items = self.total_items - self.items
            eta_items = f"{left_items / per_s:.0f} s" if per_s > 0 else "?"
            return (
                f"{self.items}/{self.total_items} items "
                f"({100.0 * self.items / self.total_items:.0f}%), {per_s:.1f} items/s, "
                f"ETA {eta_items}, {self.records} records"
            )
        rate = (self.size - self._size0) / elapsed
        left = self.total_size - self.size
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        pct = 100.0 * self.size / self.total_size if self.total_size else 100.0
        return (
            f"{self.items}/{self.total_items} items, {format_size(self.size)}/"
            f"{format_size(self.total_size)} ({pct:.0f}%), {format_size(int(rate))}/s, "
            f"ETA {eta}, {self.records} records"
        )

    def close(self) -> None:
        """Log the final line."""
        log.info("%s", self.line())


class TqdmProgress:
    """A tqdm bar over source bytes (over items when their sizes are unknown), with
    items and records as its postfix.

    Args:
        desc: the bar's label.
        **tqdm_kwargs: passed to ``tqdm.tqdm`` (``file``, ``disable``, ...).
    """

    def __init__(self, desc: str = "convert", **tqdm_kwargs: Any) -> None:
        from .._deps import require

        self._tqdm = require("tqdm", extra="progress")
        self._desc = desc
        self._kwargs = tqdm_kwargs
        self._bar: Any = None
        self._by_items = False
        self.items = self.records = self.total_items = 0

    def start(self, items: int, size: int, done_items: int, done_size: int) -> None:
        """Open the bar."""
        self.total_items, self.items = items, done_items
        self._by_items = not size and items > 0
        if self._by_items:
            unit: dict[str, Any] = {"total": items, "initial": done_items, "unit": "item"}
        else:
            unit = {"total": size, "initial": done_size, "unit": "B", "unit_scale": True}
            unit["unit_divisor"] = 1024
        self._bar = self._tqdm.tqdm(desc=self._desc, **unit, **self._kwargs)

    def update(self, items: int, size: int, records: int) -> None:
        """Advance the bar."""
        self.items += items
        self.records += records
        if self._bar is not None:
            self._bar.update(items if self._by_items else size)
            self._bar.set_postfix_str(
                f"{self.items}/{self.total_items} items, {self.records} records", refresh=False
            )

    def close(self) -> None:
        """Close the bar."""
        if self._bar is not None:
            self._bar.close()


def choose_progress(mode: str, interval: float = 10.0, desc: str = "convert") -> Progress | None:
    """The progress a command shows: ``"bar"`` (tqdm; log lines without it), ``"log"``,
    ``"none"``, or ``"auto"`` (a bar when stderr is a terminal, log lines otherwise)."""
    import sys

    if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
        try:
            return TqdmProgress(desc)
        except ImportError:
            return LogProgress(interval)
    if mode == "none":
        return None
    return LogProgress(interval)
