"""CRC32C (Castagnoli) and TFRecord's masked form.

``crc32c`` (the PyPI package) uses SSE4.2/ARMv8 instructions and releases the GIL
on large buffers, which is what lets reader threads verify in parallel.
"""

from __future__ import annotations

import mmap

from crc32c import crc32c as _crc32c

__all__ = ["crc32c", "file_crc32c", "mask", "masked_crc32c", "unmask"]

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF


def crc32c(data: bytes | bytearray | memoryview | mmap.mmap, value: int = 0) -> int:
    """Return the CRC32C of ``data``, continuing from ``value`` (0 starts fresh)."""
    return _crc32c(data, value)


def mask(crc: int) -> int:
    """TFRecord's masking: rotate right by 15 bits and add a constant.

    Storing a CRC of data that itself contains CRCs is error-prone, so TFRecord
    masks the stored value (see tensorflow/core/lib/hash/crc32c.h).
    """
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def unmask(masked: int) -> int:
    """Invert :func:`mask`."""
    rot = (masked - _MASK_DELTA) & _U32
    return ((rot >> 17) | (rot << 15)) & _U32


def masked_crc32c(data: bytes | bytearray | memoryview | mmap.mmap) -> int:
    """Return ``mask(crc32c(data))``, the value TFRecord stores after a length or payload."""
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def file_crc32c(path: str) -> int | None:
    """The CRC32C of a whole file, read in 8 MiB pieces (``None`` if it cannot be read):
    what a manifest's shard checksum is."""
    crc = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                crc = crc32c(chunk, crc)
    except OSError:
        return None
    return crc
