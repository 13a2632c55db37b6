"""Turning a tensorflow-datasets feature's stored values into tfds's: casts, text,
zlib tensors, images, rows and stacks (what :class:`~recordkit.reader.tfds.TFDSView`
applies per record and per batch)."""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..._deps import install_command
from ...errors import (
    CorruptRecordError,
    MissingDependencyError,
    RecordTooLargeError,
    SchemaError,
)
from ._feature import TFDSFeature

__all__ = [
    "Row",
    "cast_value",
    "decode_image",
    "inflate",
    "stack_rows",
    "stack_values",
    "text_value",
]

_CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def stack_rows(f: TFDSFeature, values: list[Any]) -> np.ndarray:
    if not values:
        return np.empty((0, *f.shape), dtype=f.dtype)  # type: ignore[arg-type]
    return np.stack(values)


class Row(Mapping[str, Any]):
    """Row ``i`` of ``BatchDecoder`` columns, as ``Schema.decode`` gives one record."""

    def __init__(self, cols: Mapping[str, Any], i: int) -> None:
        self.cols, self.i = cols, i

    def __getitem__(self, key: str) -> Any:
        col = self.cols[key]
        lengths = self.cols.get(key + "/lengths")
        if lengths is not None:
            return col[self.i, : int(lengths[self.i])].tobytes()
        return col[self.i]

    def __iter__(self) -> Any:
        return iter(self.cols)

    def __len__(self) -> int:
        return len(self.cols)


def cast_value(f: TFDSFeature, value: np.ndarray) -> np.ndarray:
    if f.dtype == "uint64":
        return value.view(np.uint64)  # tfds stores uint64 as its int64 bits
    if value.dtype == np.dtype(f.dtype):
        return value
    return value.astype(f.dtype)


def stack_values(f: TFDSFeature, arrays: list[np.ndarray]) -> Any:
    inner = f.shape[f.sequence :]
    if None in inner:
        return arrays
    if not arrays:
        return np.empty((0, *inner), dtype=f.dtype)
    return np.stack(arrays)


def text_value(f: TFDSFeature, value: Any) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(
            f"feature {f.name!r}: a tfds Text value that is not UTF-8 ({exc.reason} at byte "
            f"{exc.start}); read it as bytes with schema=TFDSInfo(...).view(split).schema"
        ) from None


def inflate(name: str, data: Any, size: int | None, cap: int) -> bytes:
    """zlib-decompress a value within ``cap`` bytes (exactly ``size`` where known)."""
    limit = cap if size is None else min(cap, size)
    if size is not None and size > cap:
        raise RecordTooLargeError(
            f"feature {name!r}: decompresses to {size} bytes, over DecodeLimits(record_bytes="
            f"{cap}); raise it with limits=DecodeLimits(...) if such values are expected"
        )
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(bytes(data), limit + 1)
    except zlib.error as exc:
        raise CorruptRecordError(f"feature {name!r}: bad zlib data ({exc})") from None
    if len(out) > limit:
        if size is not None and limit == size:
            raise CorruptRecordError(
                f"feature {name!r}: zlib data holds more than the {size} bytes of its shape"
            )
        raise RecordTooLargeError(
            f"feature {name!r}: zlib data decompresses to more than DecodeLimits(record_bytes="
            f"{cap}); raise it with limits=DecodeLimits(...) if such values are expected"
        )
    if not inflater.eof:
        raise CorruptRecordError(f"feature {name!r}: zlib data is cut short")
    return out


def decode_image(f: TFDSFeature, data: bytes, cap: int) -> np.ndarray:
    """An encoded image as tfds decodes it: ``uint8`` (or ``uint16``) ``(h, w, c)``.

    Raises:
        MissingDependencyError: Pillow is not installed.
        CorruptRecordError: the bytes are not an image of the feature's shape.
        RecordTooLargeError: it would decode to more than ``cap`` bytes.
    """
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError(
            "decode_images=True needs Pillow, which is not installed: " + install_command("images")
        ) from exc
    channels = f.shape[-1]
    if f.dtype not in ("uint8", "uint16") or (f.dtype == "uint16" and channels != 1):
        raise SchemaError(
            f"feature {f.name!r}: decoding {f.dtype} images with {channels} channels is not "
            "supported; read the encoded bytes (decode_images=False)"
        )
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        c = channels or len(img.getbands())
        if w * h * c * np.dtype(f.dtype).itemsize > cap:
            raise RecordTooLargeError(
                f"feature {f.name!r}: a {w}x{h} image decodes to more than DecodeLimits("
                f"record_bytes={cap})"
            )
        if f.dtype == "uint16":
            array = np.asarray(img.convert("I;16"), dtype=np.uint16)
        else:
            mode = _CHANNEL_MODES.get(channels) if channels else None
            if mode is None and channels:
                raise SchemaError(f"feature {f.name!r}: images with {channels} channels")
            array = np.asarray(img.convert(mode) if mode and img.mode != mode else img)
            array = np.asarray(array, dtype=np.uint8)
    except (RecordTooLargeError, SchemaError):
        raise
    except Exception as exc:  # bytes in memory: whatever Pillow raises is about them
        text = " ".join(str(exc).split())
        raise CorruptRecordError(
            f"feature {f.name!r}: not a readable image ({type(exc).__name__}: {text})"
        ) from None
    if array.ndim == 2:
        array = array[:, :, None]
    want = f.shape[f.sequence :]
    if len(want) != 3 or any(d is not None and d != g for d, g in zip(want, array.shape)):
        raise CorruptRecordError(
            f"feature {f.name!r}: image of shape {array.shape}, the feature's is {tuple(want)}"
        )
    return np.ascontiguousarray(array)
