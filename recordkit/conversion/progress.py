"""A conversion's progress: a protocol with a no-op default, shown by the one meter.

Library code never prints. :class:`TqdmProgress` (a bar), :class:`LogProgress`
(INFO lines with rate and ETA) and :func:`choose_progress` (what the CLI uses)
are :class:`recordkit._progress.Meter` displays, the same as ``verify``,
``index`` and ``cache fill`` show: sizes in binary units, counted nouns. When the
source's sizes are unknown (:func:`recordkit.write`'s inputs), they count items.
"""

from __future__ import annotations

import logging
from typing import Protocol, TextIO

from .._progress import Meter

__all__ = [
    "LogProgress",
    "MeterProgress",
    "NullProgress",
    "Progress",
    "TqdmProgress",
    "choose_progress",
]


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


class MeterProgress:
    """A conversion's :class:`Progress` shown by a :class:`~recordkit._progress.Meter`:
    over source bytes, or over items when their sizes are unknown, with items and
    records beside.

    Args:
        desc: the label (``"convert"``, ``"write"``).
        mode: the meter's mode: ``"auto"``, ``"bar"``, ``"log"``, ``"plain"``.
        interval: seconds between log lines.
        item: what an item is called (``"input"`` for :func:`recordkit.write`).
        file: where a bar or plain line is drawn (default: stderr).
    """

    def __init__(
        self,
        desc: str = "convert",
        *,
        mode: str = "auto",
        interval: float = 10.0,
        item: str = "item",
        file: TextIO | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.meter = Meter(
            desc, mode=mode, interval=interval, stream=file, item=item, logger=logger
        )

    def start(self, items: int, size: int, done_items: int, done_size: int) -> None:
        """Start the meter with the totals."""
        self.meter.unit = "items" if not size and items > 0 else "bytes"
        self.meter.start(
            bytes=size or None,
            items=items,
            done={"items": done_items, "bytes": done_size, "records": 0},
        )

    def update(self, items: int, size: int, records: int) -> None:
        """Count (cheap: the meter draws on its own thread)."""
        self.meter.add(items=items, bytes=size, records=records)

    def close(self) -> None:
        """Show the final state."""
        self.meter.close()


class _Delegates:
    """``start``, ``update`` and ``close`` handed to a :class:`MeterProgress` (composition,
    so the public classes' documented bases stay ``object``)."""

    shown: MeterProgress

    def start(self, items: int, size: int, done_items: int, done_size: int) -> None:
        """Start showing, with the totals."""
        self.shown.start(items, size, done_items, done_size)

    def update(self, items: int, size: int, records: int) -> None:
        """Count (cheap: the display is drawn on its own thread)."""
        self.shown.update(items, size, records)

    def close(self) -> None:
        """Show the final state."""
        self.shown.close()


class LogProgress:
    """Logs the progress at INFO every ``interval`` seconds (and at the end), on the
    ``recordkit.progress`` logger: items, bytes, records, rate and ETA.

    Args:
        interval: seconds between lines.
        desc: the label.
    """

    start = _Delegates.start  # composition, not a base: see _Delegates
    update = _Delegates.update
    close = _Delegates.close

    def __init__(self, interval: float = 10.0, desc: str = "convert") -> None:
        self.shown = MeterProgress(desc, mode="log", interval=interval)


class TqdmProgress:
    """A tqdm bar over source bytes (over items when their sizes are unknown), with
    items and records beside it.

    Args:
        desc: the bar's label.
        file: where the bar is drawn (default: stderr).

    Raises:
        MissingDependencyError: tqdm is not installed (``choose_progress`` falls back instead).
    """

    start = _Delegates.start  # composition, not a base: see _Delegates
    update = _Delegates.update
    close = _Delegates.close

    def __init__(self, desc: str = "convert", *, file: TextIO | None = None) -> None:
        from .._deps import require

        require("tqdm", extra="progress")
        self.shown = MeterProgress(desc, mode="bar", file=file)


def choose_progress(
    mode: str, interval: float = 10.0, desc: str = "convert", item: str = "item"
) -> Progress | None:
    """The progress a command shows: ``"bar"`` (tqdm; a plain line without it),
    ``"log"``, ``"plain"``, ``"none"``, or ``"auto"`` (a bar when stderr is a
    terminal, log lines otherwise)."""
    if mode == "none":
        return None
    return MeterProgress(desc, mode=mode, interval=interval, item=item)
