"""Record ranges: ``records=slice(0, 10_000)`` or a split string like ``"train[:10%]"``.

A selection names a contiguous range of a dataset's records in dataset order (the
manifest's shard order, then record order within each shard), applied to the epoch
plan before anything is shuffled. The accepted forms, as Python slices and
tensorflow-datasets' split strings (``"[1000:2000]"``, ``"[:10%]"``, ``"train[:10%]"``;
a percent rounded to the nearest record, halves to even), are ``docs/howto/mixing.md``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = ["Bound", "RecordRange", "Records", "parse_records", "split_records", "take_split"]

#: what ``records=`` accepts: a slice or a split string (``None``: every record)
Records = slice | str | None

_SPLIT = re.compile(r"^\s*(?P<name>[^\[\]:]*?)\s*(?:\[(?P<lo>[^\[\]:]*):(?P<hi>[^\[\]:]*)\])?\s*$")
_BOUND = re.compile(r"^\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<pct>%?)\s*$")


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of a range: a record number, or a percent of the dataset."""

    value: Fraction
    percent: bool

    def at(self, n: int) -> int:
        """The record number this bound names in a dataset of ``n`` records (unclipped)."""
        v = round(self.value * n / 100) if self.percent else int(self.value)
        return v + n if v < 0 or (v == 0 and self.value < 0) else v


@dataclass(frozen=True, slots=True)
class RecordRange:
    """A parsed selection: ``start`` and ``stop`` bounds (``None``: the dataset's end)."""

    start: Bound | None
    stop: Bound | None
    text: str

    def span(self, n: int) -> tuple[int, int]:
        """``[lo, hi)`` of a dataset of ``n`` records, clipped to it (``lo <= hi``)."""
        lo = 0 if self.start is None else min(max(self.start.at(n), 0), n)
        hi = n if self.stop is None else min(max(self.stop.at(n), 0), n)
        return lo, max(lo, hi)


def _bound(text: str, spec: str) -> Bound | None:
    if not text.strip():
        return None
    m = _BOUND.match(text)
    if m is None:
        raise ValueError(
            f"records={spec!r}: {text.strip()!r} is not a record number or a percent "
            "(e.g. '[1000:2000]', '[:10%]', '[-5%:]')"
        )
    value = Fraction(m["num"])
    pct = bool(m["pct"])
    if pct and abs(value) > 100:
        raise ValueError(f"records={spec!r}: a percent must be in [-100%, 100%], got {text!r}")
    if not pct and value.denominator != 1:
        raise ValueError(f"records={spec!r}: a record number must be whole, got {text!r}")
    return Bound(value, pct)


def split_records(records: slice | str | None) -> tuple[str | None, RecordRange | None]:
    """``records=`` as ``(split name or None, range or None)``.

    Raises:
        ValueError: a malformed string, a slice with a step, or another type.
    """
    if records is None:
        return None, None
    if isinstance(records, slice):
        if records.step not in (None, 1):
            raise ValueError(f"records={records!r}: only contiguous ranges (no step)")
        ends = []
        for end in (records.start, records.stop):
            if end is not None and (isinstance(end, bool) or not isinstance(end, int)):
                raise ValueError(f"records={records!r}: slice ends must be integers or None")
            ends.append(None if end is None else Bound(Fraction(end), False))
        return None, RecordRange(ends[0], ends[1], repr(records))
    if not isinstance(records, str):
        raise TypeError(
            f"records must be a slice, a split string like '[:10%]' or None, got {records!r}"
        )
    m = _SPLIT.match(records)
    if m is None or (not m["name"] and m["lo"] is None):
        raise ValueError(
            f"records={records!r}: expected '[start:stop]' (record numbers or percents, "
            "e.g. '[:10%]', '[1000:2000]') or 'split[start:stop]' (e.g. 'train[:10%]')"
        )
    name = m["name"] or None
    if m["lo"] is None:
        return name, None
    return name, RecordRange(_bound(m["lo"], records), _bound(m["hi"], records), records)


def parse_records(records: slice | str | None, n: int) -> tuple[int, int]:
    """``[lo, hi)`` that ``records`` selects of ``n`` records (all of them for ``None``).

    Raises:
        ValueError: a split name (``"train[...]"``): that is for a reader's ``split=``.
    """
    name, rng = split_records(records)
    if name is not None:
        raise ValueError(
            f"records={records!r} names split {name!r}: a split name is for a "
            "tensorflow-datasets folder; give only the range here ('[...]')"
        )
    return (0, n) if rng is None else rng.span(n)


def take_split(split: str | None, records: Any) -> tuple[str | None, Any]:
    """Move a split name out of ``records`` (``"train[:10%]"``) or a range out of
    ``split`` (tensorflow-datasets' ``split="train[:10%]"``): ``(split, records)``.

    Raises:
        ValueError: both name a split (two different ones), or both a range.
    """
    if split is not None and "[" in split:
        name, rng = split_records(split)
        if records is not None:
            raise ValueError(f"split={split!r} holds a range, and records={records!r} another")
        return name, None if rng is None else rng.text[rng.text.index("[") :]
    if isinstance(records, str):
        name, rng = split_records(records)
        if name is not None:
            if split is not None and split != name:
                raise ValueError(f"records={records!r} names split {name!r}, split={split!r}")
            text = records[records.index("[") :] if rng is not None else None
            return name, text
    return split, records
