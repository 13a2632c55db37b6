"""Command-line values shared by the ``recordkit`` subcommands (standard library only)."""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

__all__ = ["Parser", "count", "json_object", "positive"]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def count(text: str) -> int:
    """An integer >= 0 (``argparse`` ``type=``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive(text: str) -> int:
    """An integer >= 1 (``argparse`` ``type=``)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def json_object(flag: str, text: str | None) -> dict[str, Any] | None:
    """A JSON-object command-line value (``None`` when not given).

    Raises:
        ValueError: not JSON, or not an object; the message names ``flag``.
    """
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {text!r}")
    return value
