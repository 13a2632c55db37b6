"""Converter sources for the producer-mode tests, importable by spawned writer processes.

Writer processes unpickle the source object, so its class must live in a module they
can import (not in a test function). Each adds one fault to the real JSONL converter,
steered by files in a folder the test gives as an option, because the test and the
writer are different processes.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from recordkit import Schema
from recordkit.converters.base import Item
from recordkit.converters.jsonl import JsonlSource


class GatedJsonl(JsonlSource):
    """JSONL whose item ``block`` (a key) stops mid-partition until ``gate/release`` exists.

    On reaching that item the writer writes ``gate/blocked`` holding its pid, yields
    a few records (so the shard's temp file has begun), then waits; a test kills it
    there. Once ``gate/release`` exists the item converts normally.
    """

    name: ClassVar[str] = "gated-jsonl"
    defaults: ClassVar[Mapping[str, Any]] = {**JsonlSource.defaults, "gate": "", "block": ""}

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        gate = str(self.options["gate"])
        release = os.path.join(gate, "release")
        for n, payload in enumerate(super().records(item, schema)):
            if n == 2 and item.key == self.options["block"] and not os.path.exists(release):
                tmp = os.path.join(gate, f"blocked.{os.getpid()}")
                with open(tmp, "w") as f:
                    f.write(str(os.getpid()))
                os.replace(tmp, os.path.join(gate, "blocked"))
                deadline = time.monotonic() + 120  # the test kills it long before
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.02)
            yield payload


class DiskFullJsonl(JsonlSource):
    """JSONL whose writer hits ``ENOSPC`` while ``full/<n>`` files are left: each
    failure uses one up (``full/always``: every time)."""

    name: ClassVar[str] = "full-jsonl"
    defaults: ClassVar[Mapping[str, Any]] = {**JsonlSource.defaults, "full": ""}

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        folder = str(self.options["full"])
        for n, payload in enumerate(super().records(item, schema)):
            if n == 1 and self._use_one(folder):
                raise OSError(errno.ENOSPC, "No space left on device")
            yield payload

    @staticmethod
    def _use_one(folder: str) -> bool:
        if os.path.exists(os.path.join(folder, "always")):
            return True
        for name in sorted(os.listdir(folder)):
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                continue  # another writer took it
            return True
        return False


class FlakyJsonl(JsonlSource):
    """JSONL whose reads fail with a transient ``ConnectionResetError`` on the second
    item of a partition while ``flaky/<n>`` files are left: each failure uses one up."""

    name: ClassVar[str] = "flaky-jsonl"
    defaults: ClassVar[Mapping[str, Any]] = {**JsonlSource.defaults, "flaky": ""}

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        folder = str(self.options["flaky"])
        for n, payload in enumerate(super().records(item, schema)):
            if n == 1 and item.key.endswith("1.jsonl") and DiskFullJsonl._use_one(folder):
                raise ConnectionResetError(errno.ECONNRESET, "connection reset by the source")
            yield payload
