"""Converter sources with one fault each, for the engine tests; writer processes import
them by module path, so they live here and not in a test function."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from recordkit import Schema
from recordkit.converters.base import Item
from recordkit.converters.jsonl import JsonlSource


class _InWriter(JsonlSource):
    """JSONL that misbehaves on item ``at`` (a key), only in a process other than
    ``parent`` (so the same conversion run inline, or rerun with ``at=""``, is clean)."""

    defaults: ClassVar[Mapping[str, Any]] = {**JsonlSource.defaults, "at": "", "parent": 0}

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        for n, payload in enumerate(super().records(item, schema)):
            if n == 2 and item.key == self.options["at"] and os.getpid() != self.options["parent"]:
                self.misbehave()
            yield payload

    def misbehave(self) -> None:
        raise NotImplementedError


class KillingJsonl(_InWriter):
    """Its writer process is SIGKILLed (out of memory, say) on item ``at``."""

    name: ClassVar[str] = "killing-jsonl"

    def misbehave(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class HangingJsonl(_InWriter):
    """Its writer process hangs on item ``at`` (for a minute; the test stops it first)."""

    name: ClassVar[str] = "hanging-jsonl"

    def misbehave(self) -> None:
        time.sleep(60)


class PickyError(Exception):
    """An exception pickle cannot take across (it holds a lock)."""

    def __init__(self, row: int, reason: str) -> None:
        super().__init__(f"row {row}: {reason}")
        self.lock = threading.Lock()


class PickyJsonl(_InWriter):
    """Raises :class:`PickyError` on item ``at``."""

    name: ClassVar[str] = "picky-jsonl"

    def misbehave(self) -> None:
        raise PickyError(2, "no good")


class DyingOnceJsonl(_InWriter):
    """Its writer process is SIGKILLed on item ``at`` the first time only (the file
    ``once`` records it): a worker lost mid-partition, whose task a cluster runs again."""

    name: ClassVar[str] = "dying-once-jsonl"
    defaults: ClassVar[Mapping[str, Any]] = {**_InWriter.defaults, "once": ""}

    def misbehave(self) -> None:
        try:
            with open(self.options["once"], "x"):
                pass
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)
