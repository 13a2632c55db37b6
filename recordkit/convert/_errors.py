"""Conversion errors (defined in :mod:`recordkit.errors`) and the helpers that classify them.

``ConvertError``, ``DiskFullError`` and ``PartitionsFailedError`` are
:mod:`recordkit.errors`'s, re-exported so ``recordkit.convert`` imports go on working;
``is_transient`` is :mod:`recordkit.retry`'s (the one retry policy's classification).
"""

from __future__ import annotations

from ..errors import ConvertError, DiskFullError, PartitionsFailedError
from ..retry import is_transient

__all__ = ["ConvertError", "DiskFullError", "PartitionsFailedError", "add_note", "is_transient"]


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where notes are not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
