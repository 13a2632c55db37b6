"""User functions for the recordkit.write tests; writer processes import them by name."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import recordkit as rk

SCHEMA = rk.Schema(n=rk.Int64(), k=rk.Int64(), text=rk.Bytes())
SPEC = "n:int64,k:int64,text:bytes"


def squares(n: int) -> Iterator[dict[str, Any]]:
    """0 to 3 samples per input (none for multiples of 4), texts of varied length."""
    for k in range(n % 4):
        yield {"n": n, "k": k, "text": "x" * ((n * 7 + k) % 50)}


def expected(inputs: range) -> list[tuple[int, int, bytes]]:
    """What ``squares`` writes for ``inputs``, in order."""
    return [(n, k, b"x" * ((n * 7 + k) % 50)) for n in inputs for k in range(n % 4)]


def slow_squares(n: int) -> Iterator[dict[str, Any]]:
    """``squares``, a little slower (so a test can kill a run in the middle)."""
    time.sleep(0.03)
    yield from squares(n)


def fails_where_told(n: int) -> Iterator[dict[str, Any]]:
    """``squares``, but raises for each input with a file in ``$RK_TEST_FAIL_DIR``."""
    folder = os.environ.get("RK_TEST_FAIL_DIR", "")
    if folder and os.path.exists(os.path.join(folder, str(n))):
        raise ValueError(f"input {n} is unlucky")
    yield from squares(n)


def fails_in(folder: str, n: int) -> Iterator[dict[str, Any]]:
    """``squares``, but raises for each input with a file in ``folder``; bound with
    ``functools.partial`` (a cluster's workers do not see this process's environment)."""
    if os.path.exists(os.path.join(folder, str(n))):
        raise ValueError(f"input {n} is unlucky")
    yield from squares(n)


def one(n: int) -> dict[str, Any] | None:
    """One sample, returned (not yielded); none for odd inputs."""
    return None if n % 2 else {"n": n, "k": 0, "text": str(n)}


def not_a_sample(n: int) -> Iterator[Any]:
    """A good sample, then a list."""
    yield {"n": n, "k": 0, "text": ""}
    yield [n]


class Tagged:
    """A callable instance (pickled with its tag)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, n: int) -> dict[str, Any]:
        return {"n": n, "k": 1, "text": self.tag}


def describe(x: Any) -> dict[str, Any]:
    """The input's repr: what the function received."""
    return {"n": 0, "k": 0, "text": repr(x)}
