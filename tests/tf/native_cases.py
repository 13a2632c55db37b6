"""What the tests of ``recordkit.tf``'s native path share: the count of its tasks by the
runner and by the exact way, and a foreign shard of given payloads."""

from __future__ import annotations

from pathlib import Path

import pytest

import recordkit as rk
from recordkit.format.framing import frame


def count_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the native path's tasks: by the runner (``run``), and the exact way."""
    from recordkit.tf import native

    seen = {"run": 0, "decode": 0}
    run, decode = native.NativeTasks._run, native.NativeTasks._decode

    def counted_run(self, *args):  # type: ignore[no-untyped-def]
        seen["run"] += 1
        return run(self, *args)

    def counted_decode(self, *args):  # type: ignore[no-untyped-def]
        seen["decode"] += 1
        return decode(self, *args)

    monkeypatch.setattr(native.NativeTasks, "_run", counted_run)
    monkeypatch.setattr(native.NativeTasks, "_decode", counted_decode)
    return seen


def foreign(root: Path, payloads: list[bytes]) -> Path:
    """One indexed shard of these payloads in ``root`` (a foreign folder the native path
    takes): the shard's path."""
    root.mkdir()
    shard = root / "part-00000.tfrecord"
    shard.write_bytes(b"".join(frame(p) for p in payloads))
    rk.build_index(str(shard))
    return shard


def offset(shard: Path, record: int) -> int:
    """Where record ``record`` of ``shard`` starts."""
    data, at = shard.read_bytes(), 0
    for _ in range(record):
        at += int.from_bytes(data[at : at + 8], "little") + 16
    return at
