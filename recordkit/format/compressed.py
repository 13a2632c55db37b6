"""GZIP- and ZLIB-compressed TFRecord files: detect them, stream them, name them.

TensorFlow writes these with ``TFRecordOptions(compression_type="GZIP" | "ZLIB")``:
the whole file is one compressed stream, so records have no byte offsets a map
could address. recordkit's random-access readers refuse them with
:class:`~recordkit.errors.CompressedTFRecordError`, whose message names the
compression and gives the ``recordkit convert`` command that makes an indexed
copy; :func:`open_stream` reads them in order (``recordkit convert`` and
``recordkit verify`` do).
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from typing import BinaryIO

from ..errors import CompressedTFRecordError
from .crc import masked_crc32c

__all__ = ["compressed_error", "detect_compression", "open_stream", "sniff_compression"]

_GZIP_MAGIC = b"\x1f\x8b"


def detect_compression(head: bytes | memoryview) -> str | None:
    """``"GZIP"``, ``"ZLIB"`` or ``None`` from a file's first bytes.

    Call it only on a file whose first record does not frame: an uncompressed
    record's length field can begin with the same bytes.
    """
    head = bytes(head[:2])
    if len(head) < 2:
        return None
    if head == _GZIP_MAGIC:
        return "GZIP"
    # RFC 1950: CM = 8 (deflate), CINFO <= 7, and the two header bytes are a multiple of 31.
    if head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0:
        return "ZLIB"
    return None


def sniff_compression(head: bytes | memoryview) -> str | None:
    """``"GZIP"``, ``"ZLIB"`` or ``None`` from a TFRecord file's first 12 (or more) bytes.

    ``None`` when they are a valid record header (its length CRC matches): a
    plain TFRecord, whatever its first bytes look like.
    """
    head = bytes(head[:12])
    if len(head) == 12 and masked_crc32c(head[:8]) == struct.unpack("<I", head[8:])[0]:
        return None
    return detect_compression(head)


def compressed_error(path: str, kind: str) -> CompressedTFRecordError:
    """The error a random-access reader raises for a compressed TFRecord file."""
    return CompressedTFRecordError(
        f"{kind}-compressed TFRecord: it has no record offsets to map, so recordkit "
        "reads it only as a stream; make an indexed copy with: "
        f"recordkit convert --from tfrecord {path} DEST",
        path=path,
        offset=0,
        compression=kind,
    )


class _ZlibReader(io.RawIOBase):
    """A readable stream that inflates a ZLIB-wrapped file object as it is read."""

    def __init__(self, raw: BinaryIO, chunk: int = 1 << 20) -> None:
        self._raw = raw
        self._z = zlib.decompressobj()
        self._chunk = chunk
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending and not self._z.eof:
            data = self._raw.read(self._chunk)
            if not data:
                self._pending = self._z.flush()
                if not self._z.eof:
                    raise EOFError("ZLIB stream ends before its end marker")
                break
            self._pending = self._z.decompress(data)
        n = min(len(b), len(self._pending))
        b[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def open_stream(raw: BinaryIO, kind: str | None) -> BinaryIO:
    """``raw`` (positioned at 0) decompressed as ``kind`` (``None``: as it is)."""
    if kind is None:
        return raw
    if kind == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if kind == "ZLIB":
        return io.BufferedReader(_ZlibReader(raw), buffer_size=1 << 20)
    raise ValueError(f"unknown TFRecord compression {kind!r}; expected 'GZIP' or 'ZLIB'")
