"""Conversion errors, all :class:`~recordkit.errors.RecordkitError` subclasses.

::

    RecordkitError
    └── ConvertError (RuntimeError)              a conversion that could not finish
        ├── DiskFullError (OSError)              no space left where shards are written
        └── PartitionsFailedError (ExceptionGroup)   one or more partitions failed;
                                                     a note on each child names the
                                                     partition and its source items
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..errors import RecordkitError
from ..retry import is_transient

__all__ = ["ConvertError", "DiskFullError", "PartitionsFailedError", "add_note", "is_transient"]


class ConvertError(RecordkitError, RuntimeError):
    """A conversion that could not finish; published partitions are kept for a rerun."""


class DiskFullError(ConvertError, OSError):
    """No space left on the device (or quota) where shards are staged or written."""


if sys.version_info >= (3, 11):
    _Group = ExceptionGroup  # noqa: F821 (a builtin since 3.11)
else:  # pragma: no cover - Python 3.10

    class _Group(Exception):
        """A minimal ``ExceptionGroup`` for Python 3.10: ``message`` and ``exceptions``."""

        def __init__(self, message: str, exceptions: Sequence[BaseException]) -> None:
            super().__init__(message, tuple(exceptions))
            self.message = message
            self.exceptions = tuple(exceptions)

        def __str__(self) -> str:
            n = len(self.exceptions)
            return f"{self.message} ({n} sub-exception{'s' if n != 1 else ''})"


class PartitionsFailedError(_Group, ConvertError):
    """Partitions that failed, together: an ``ExceptionGroup`` of their errors.

    Each child carries a note (``exc.__notes__``) naming its partition and the
    source items it was converting. Partitions that succeeded are published and
    a rerun resumes after them.
    """


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where notes are not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
