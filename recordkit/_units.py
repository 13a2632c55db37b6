"""Numbers for humans: byte sizes (``"256MiB"`` binary, ``"256MB"`` decimal), rates,
durations and counted nouns. Every command's summary formats through these."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    **{f"{p}b": 1000**i for i, p in enumerate("kmgt", 1)},  # SI: KB, MB, GB, TB
    **{f"{p}ib": 1024**i for i, p in enumerate("kmgt", 1)},  # IEC: KiB, MiB, GiB, TiB
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str) -> int:
    """Return a byte count from an int or a string such as ``"256MiB"`` or ``"1.5GB"``.

    ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024; ``KB``/``MB``/``GB``/``TB``
    are powers of 1000 (as the SI and IEC define them). Units are case-insensitive.
    """
    if isinstance(value, bool):
        raise ValueError(f"size must be an int or a string like '256MiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must be >= 0, got {value!r}")
        return value
    match = _SIZE.match(str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot parse size {value!r}: use a number with KiB/MiB/GiB/TiB (binary) "
            "or KB/MB/GB/TB (decimal), e.g. '256MiB'"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_size(n: int) -> str:
    """Format a byte count with a binary unit, e.g. ``format_size(3 << 20) == '3.0 MiB'``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    """A transfer rate with a binary unit, e.g. ``'12.5 MiB/s'``."""
    return f"{format_size(int(bytes_per_s))}/s"


def format_duration(seconds: float) -> str:
    """A duration for humans: ``'42 s'``, ``'3 min 05 s'``, ``'2 h 07 min'``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` in the right number: ``'1 shard'``, ``'2 shards'``, ``'0 shards'``.

    Args:
        n: the count.
        word: the singular.
        many: the plural when it is not ``word + "s"`` (``plural(2, "index", "indexes")``).
    """
    return f"{n} {noun(n, word, many)}"


def noun(n: int, word: str, many: str | None = None) -> str:
    """``word`` in the number ``n`` asks for, without the number (``plural``'s noun)."""
    return word if n == 1 else (many or word + "s")
