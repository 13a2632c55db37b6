"""Per-feature zstd compression with limits checked before anything is allocated.

A compressed feature value is one zstd frame. Frames written here always carry
their content size in the header, so a reader can refuse an oversized or
inconsistent frame from its first few bytes (a corrupt or hostile frame that
declares 1 TiB must not make the reader try to allocate 1 TiB). Frames from
elsewhere that omit the size are decoded incrementally under the same cap.

``zstandard`` compressor and decompressor objects must not be shared between
threads, and creating one per call costs more than decompressing a small value,
so each thread keeps its own.
"""

from __future__ import annotations

import threading
from typing import Any

import zstandard

from ..errors import CorruptRecordError, RecordTooLargeError

__all__ = ["DEFAULT_LEVEL", "zstd_compress", "zstd_decompress"]

# Level 3 is zstd's own default: ~300 MB/s compression with ratios close to the
# slower levels on typical tensor data; higher levels rarely pay for themselves
# when the consumer is a training loop.
DEFAULT_LEVEL = 3
_MIN_LEVEL = -(1 << 17)  # zstd's fastest negative level (ZSTD_minCLevel)

# zstd's largest block is 128 KiB and an RLE block spends 4 input bytes on it, so
# one input byte can never yield more than 32 KiB of output. The incremental path
# uses this bound to feed input in pieces that cannot overshoot the cap by more
# than _MIN_FEED * 32 KiB = 2 MiB, while feeding big pieces when far from it.
_MAX_EXPANSION = 1 << 15
_MIN_FEED = 64
_PIECES = 4

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if dctx is None:
        dctx = _local.decompressor = zstandard.ZstdDecompressor()
    return dctx


def zstd_compress(data: Any, level: int = DEFAULT_LEVEL) -> bytes:
    """Compress ``data`` into a single zstd frame that records its content size.

    Args:
        data: any C-contiguous bytes-like object.
        level: zstd compression level (1 to 22; negative levels trade ratio for speed).

    Returns:
        The zstd frame.
    """
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"zstd level must be an int, got {level!r}")
    if not _MIN_LEVEL <= level <= zstandard.MAX_COMPRESSION_LEVEL:
        raise ValueError(
            f"zstd level must be from {_MIN_LEVEL} to {zstandard.MAX_COMPRESSION_LEVEL}, "
            f"got {level!r}"
        )
    return _compressor(level).compress(data)


def zstd_decompress(data: Any, *, expected_size: int | None, max_size: int) -> bytes | bytearray:
    """Decompress one zstd frame, refusing to allocate more than ``max_size`` bytes.

    The frame header's declared content size is checked before decompressing.
    A frame that declares no size is decompressed incrementally and rejected as
    soon as its output passes the cap.

    Args:
        data: the zstd frame (bytes-like). Trailing bytes after the frame are an error.
        expected_size: the exact decompressed size the caller knows it must be, or
            ``None`` when unknown.
        max_size: the most bytes the caller accepts.

    Returns:
        The decompressed bytes.

    Raises:
        RecordTooLargeError: the frame declares, or produces, more than ``max_size``.
        CorruptRecordError: the frame is malformed or truncated, has trailing data,
            or its size differs from ``expected_size``.
    """
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(f"bad zstd frame header: {exc}") from None
    if declared == -1:  # the writer did not record a size
        return _decompress_unsized(data, expected_size, max_size)
    # A size that differs from the one the schema fixes is corruption, whatever the limit.
    if expected_size is not None and declared != expected_size:
        raise CorruptRecordError(
            f"zstd frame declares {declared} decompressed bytes, expected {expected_size}"
        )
    if declared > max_size:
        raise RecordTooLargeError(
            f"zstd frame declares {declared} decompressed bytes, over the limit of {max_size}"
        )
    try:
        return _decompressor().decompress(data, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(f"bad zstd frame: {exc}") from None


def _decompress_unsized(data: Any, expected_size: int | None, max_size: int) -> bytearray:
    cap = max_size if expected_size is None else min(max_size, expected_size)
    view = memoryview(data).cast("B")
    dobj = _decompressor().decompressobj()
    out = bytearray()
    pos, end = 0, len(view)
    try:
        while pos < end:
            if dobj.eof:
                raise CorruptRecordError(f"{end - pos} bytes of trailing data after zstd frame")
            # Feed no more input than could fill a quarter of the remaining
            # budget, so a small frame that expands enormously is stopped near
            # the cap, and the piece being appended (a second copy while it is)
            # never doubles what the value holds: peak about 1.3x the cap.
            step = max(_MIN_FEED, (cap - len(out)) // (_MAX_EXPANSION * _PIECES))
            out += dobj.decompress(view[pos : pos + step])
            pos += step
            if len(out) > cap:
                break
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(f"bad zstd frame: {exc}") from None
    if len(out) > max_size:
        raise RecordTooLargeError(
            f"zstd frame decompresses to more than the limit of {max_size} bytes"
        )
    if expected_size is not None and len(out) != expected_size:
        more = "more than" if len(out) > expected_size else "only"
        raise CorruptRecordError(
            f"zstd frame decompresses to {more} {len(out)} bytes, expected {expected_size}"
        )
    if not dobj.eof:
        raise CorruptRecordError("truncated zstd frame")
    if dobj.unused_data:
        raise CorruptRecordError(f"{len(dobj.unused_data)} bytes of trailing data after zstd frame")
    return out
