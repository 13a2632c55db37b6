"""Command-line values shared by the ``recordkit`` subcommands (standard library only)."""

from __future__ import annotations

import argparse
import json
from typing import Any, NoReturn

__all__ = [
    "Parser",
    "add_progress_options",
    "count",
    "json_object",
    "key_values",
    "positive",
    "progress_mode",
]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            2, f"{self.prog}: error: {message}{_did_you_mean(message)} (see {self.prog} --help)\n"
        )


def _did_you_mean(message: str) -> str:
    """``"; did you mean 'convert'?"`` for argparse's "invalid choice: 'covert' (choose
    from 'a', 'b')" when one choice is close; ``""`` otherwise."""
    import difflib
    import re

    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if found is None:
        return ""
    choices = re.findall(r"'([^']*)'", found.group(2))
    close = difflib.get_close_matches(found.group(1), choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


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


def add_progress_options(parser: argparse.ArgumentParser) -> None:
    """``--progress`` and ``--log-interval``, the same on every command that shows progress."""
    parser.add_argument(
        "--progress",
        choices=["auto", "bar", "log", "plain", "none"],
        default="auto",
        help="auto: a tqdm bar when stderr is a terminal (a plain line without tqdm), "
        "INFO log lines with rate and ETA otherwise; plain: one line, no tqdm "
        "(default auto; -q means none)",
    )
    parser.add_argument(
        "--log-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between progress log lines (default 10)",
    )


def progress_mode(args: argparse.Namespace) -> str:
    """The progress display a command's arguments ask for (``-q``: none)."""
    if getattr(args, "quiet", 0):
        return "none"
    return str(getattr(args, "progress", "auto"))


def key_values(pairs: list[str]) -> dict[str, Any]:
    """``--option KEY=VALUE`` pairs as a dict: VALUE as JSON, else the plain string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a plain string, e.g. delimiter=;
    return out
