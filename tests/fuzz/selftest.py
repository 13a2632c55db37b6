"""Targets that misbehave on purpose: the harness must catch each way (test_fuzz.py)."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st


class _Misbehaving:
    def __init__(self, how: str) -> None:
        self.how = how

    def setup(self, scratch: str) -> None:
        pass

    def strategy(self) -> st.SearchStrategy[Any]:
        return st.integers(0, 100)

    def check(self, example: int, scratch: str) -> Iterator[str]:
        if example >= 50:
            if self.how == "crash":
                ctypes.string_at(0)  # SIGSEGV
            elif self.how == "hang":
                time.sleep(3600)
            elif self.how == "memory":
                bytearray(64 << 30)  # past the address-space cap: MemoryError
            elif self.how == "wrong_type":
                raise KeyError("not a RecordkitError")
        yield "ok"


crash = _Misbehaving("crash")
hang = _Misbehaving("hang")
memory = _Misbehaving("memory")
wrong_type = _Misbehaving("wrong_type")
