"""Which keywords a call was given: the support for "each setting accepted one way".

A function that takes a group of settings both whole (a frozen options object) and
as flat keywords is decorated with ``accepts_options()``; inside it,
``given()`` says which keywords its caller passed, whatever their values, so a
flat keyword passed beside the object holding the same setting is refused by name
(``refuse()``) even when its value equals the default.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from .errors import OptionError

__all__ = ["accepts_options", "given", "refuse"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_given: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "recordkit_keywords_given", default=None
)


def accepts_options(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """Let ``function`` ask ``given()`` which keywords its caller passed."""

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        token = _given.set(frozenset(kwargs))
        try:
            return function(*args, **kwargs)
        finally:
            _given.reset(token)

    return wrapper


def given() -> frozenset[str]:
    """The keywords the caller of the innermost ``accepts_options()`` function passed."""
    names = _given.get()
    if names is None:
        raise RuntimeError("given() is for functions decorated with @accepts_options")
    return names


def refuse(keywords: Iterable[str], beside: str, holder: str, fields: Iterable[str]) -> None:
    """Raise the :class:`~recordkit.errors.OptionError` for flat ``keywords`` given beside
    ``beside=`` (an object of class ``holder`` whose ``fields`` hold the same settings)."""
    names = sorted(keywords)
    if not names:
        return
    listed = ", ".join(f"{k}=" for k in names)
    raise OptionError(
        f"{listed} given beside {beside}=: each setting is given one way; set "
        f"{', '.join(fields)} in the {holder} given as {beside}= "
        f"(dataclasses.replace() derives a variant), or leave {beside}= out"
    )
