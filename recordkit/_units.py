"""Human-readable byte sizes: ``"256MiB"`` (binary) and ``"256MB"`` (decimal)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
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
