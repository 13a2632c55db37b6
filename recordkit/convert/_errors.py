"""Conversion errors (defined in :mod:`recordkit.errors`) and the helpers that classify them.

``ConvertError``, ``DiskFullError`` and ``PartitionsFailedError`` are
:mod:`recordkit.errors`'s, re-exported so ``recordkit.convert`` imports go on working.
"""

from __future__ import annotations

import errno

from ..errors import ConvertError, DiskFullError, PartitionsFailedError, RecordkitError

__all__ = ["ConvertError", "DiskFullError", "PartitionsFailedError", "add_note", "is_transient"]


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where notes are not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


_TRANSIENT_ERRNOS = {
    errno.EAGAIN,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.EHOSTUNREACH,
    errno.ENETDOWN,
    errno.ENETUNREACH,
    errno.EPIPE,
    errno.ETIMEDOUT,
}
# Client libraries whose errors are network trouble unless they say otherwise.
_TRANSIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "http.client")
_PERMANENT_STATUS = {400, 401, 403, 404, 405, 410, 416}


def is_transient(exc: BaseException) -> bool:
    """Whether retrying could help: a network error or a 5xx/429, not missing data or bad bytes."""
    if isinstance(exc, (RecordkitError, FileNotFoundError, PermissionError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int) and 400 <= status < 600:
        return status not in _PERMANENT_STATUS
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in _TRANSIENT_ERRNOS
    module = type(exc).__module__ or ""
    if module.startswith(_TRANSIENT_MODULES):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_transient(cause)
