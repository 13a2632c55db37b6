"""Turning a tensorflow-datasets split's stored values into tfds's, per record and per batch."""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..._deps import install_command
from ...codec.features import Bytes, FeatureType
from ...codec.limits import DEFAULT_RECORD_BYTES, DecodeLimits
from ...codec.schema import Schema
from ...errors import (
    CorruptRecordError,
    MissingDependencyError,
    RecordTooLargeError,
    SchemaError,
)
from ..decode import Alloc, BatchDecoder, DecodedBatch
from ._info import ADVICE, TFDSFeature, TFDSInfo

__all__ = ["TFDSBatchDecoder", "TFDSView", "decode_image"]

_CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


class TFDSView:
    """Stored record values -> tfds's values, for one split of a :class:`TFDSInfo`.

    Picklable (plain data). :attr:`schema` decodes the records;
    :meth:`sample` and :meth:`columns` finish what it decoded.

    Attributes:
        info: the folder.
        split: the split read.
        decode_images: decode ``Image`` features to arrays (Pillow).
        schema: the stored features, as recordkit decodes them.
        output_schema: a schema with the dtype and shape of each value returned.
    """

    def __init__(self, info: TFDSInfo, split: str, decode_images: bool = False) -> None:
        self.info = info
        self.split = split
        self.decode_images = decode_images
        stored: dict[str, FeatureType] = {}
        for f in info.features.values():
            try:
                stored.update(f.stored())
            except SchemaError as exc:
                raise SchemaError(f"{info.root}: {exc}; {ADVICE}") from None
        self.schema = Schema(stored)
        self.output_schema = Schema({n: f.output(decode_images) for n, f in info.features.items()})
        self.limits = DecodeLimits()

    def with_options(
        self, *, decode_images: bool = False, limits: DecodeLimits | None = None
    ) -> TFDSView:
        """A copy that decodes images (or not), under ``limits``."""
        view = TFDSView(self.info, self.split, decode_images)
        view.limits = limits or DecodeLimits()
        return view

    @property
    def names(self) -> list[str]:
        return list(self.info.features)

    def stored_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """The stored features that hold ``columns`` (tfds names)."""
        if columns is None:
            return None
        unknown = [c for c in columns if c not in self.info.features]
        if unknown:
            raise SchemaError(f"columns not in the dataset: {unknown}; it has {self.names}")
        wanted = set(columns)
        return [key for n, f in self.info.features.items() if n in wanted for key in f.stored()]

    # -- one record ----------------------------------------------------------------------

    def sample(
        self, stored: Mapping[str, Any], columns: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """One record's tfds values from ``Schema.decode(payload, copy=True)`` output."""
        out: dict[str, Any] = {}
        for name, f in self.info.features.items():
            if columns is not None and name not in columns:
                continue
            out[name] = self.value(f, stored)
        return out

    def value(self, f: TFDSFeature, stored: Mapping[str, Any]) -> Any:
        """Feature ``f`` of one record, from its stored values (``Schema.decode`` output)."""
        if f.dynamic:
            shape = [int(d) for d in np.asarray(stored[f"{f.name}/shape"])]
            return self._tensor(f, stored[f"{f.name}/value"], shape)
        value = stored[f.name]
        if f.kind == "text":
            if f.sequence:
                return [_text(f, v) for v in value]
            return _text(f, value)
        if f.kind == "image":
            if not self.decode_images:
                return [bytes(v) for v in value] if f.sequence else bytes(value)
            if f.sequence:
                return _stack(f, [self._image(f, v) for v in value])
            return self._image(f, value)
        if f.kind == "tensor" and f.encoding != "none":
            if f.encoding == "bytes" and not f.sequence:
                return value  # decoded by recordkit as Tensor(dtype, shape)
            inner = list(f.shape[f.sequence :])
            if not f.sequence:
                return self._tensor(f, value, inner)
            return _stack(f, [self._tensor(f, v, inner) for v in value])
        if f.dtype == "string":
            return value
        return _cast(f, np.asarray(value))

    def _tensor(self, f: TFDSFeature, data: Any, shape: Sequence[int | None]) -> np.ndarray:
        dtype = np.dtype(f.dtype)
        known = [d for d in shape if d is not None]
        if shape.count(None) > 1:
            raise CorruptRecordError(f"feature {f.name!r}: stored shape {shape} is not a shape")
        size = math.prod(known) * dtype.itemsize if None not in shape else None
        if f.encoding == "zlib":
            data = _inflate(f.name, data, size, self.limits.record_bytes or DEFAULT_RECORD_BYTES)
        raw = bytes(data)
        if len(raw) % dtype.itemsize or (size is not None and len(raw) != size):
            raise CorruptRecordError(
                f"feature {f.name!r}: {len(raw)} bytes do not hold a {f.dtype} tensor of "
                f"shape {tuple(shape)}"
            )
        count = len(raw) // dtype.itemsize
        if None in shape:
            unit = math.prod(known)
            if unit == 0 or count % unit:
                raise CorruptRecordError(
                    f"feature {f.name!r}: {count} elements do not fit shape {tuple(shape)}"
                )
            shape = tuple(count // unit if d is None else d for d in shape)
        array = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype, copy=False)
        return array.reshape(shape)

    def _image(self, f: TFDSFeature, data: Any) -> np.ndarray:
        return decode_image(f, bytes(data), self.limits.record_bytes or DEFAULT_RECORD_BYTES)

    # -- whole batches -------------------------------------------------------------------

    def columns(
        self, cols: Mapping[str, Any], n: int, columns: Sequence[str] | None = None
    ) -> tuple[dict[str, Any], list[tuple[int, CorruptRecordError]]]:
        """A batch's tfds columns from ``BatchDecoder`` columns of ``n`` records.

        Numbers are cast whole; values that need work per record (zlib, text,
        decoded images) are made row by row, and a row that fails is returned
        in the second item (``(row, error)``) and left out of every column.
        """
        out: dict[str, Any] = {}
        bad: dict[int, CorruptRecordError] = {}
        per_row: list[TFDSFeature] = []
        for name, f in self.info.features.items():
            if columns is not None and name not in columns:
                continue
            if f.per_record(self.decode_images):
                per_row.append(f)
                continue
            col = cols[name]
            if f.kind == "tensor" and f.encoding == "none" and f.dtype != "string":
                col = _cast(f, col) if isinstance(col, np.ndarray) else [_cast(f, c) for c in col]
            out[name] = col
            if name + "/lengths" in cols:
                out[name + "/lengths"] = cols[name + "/lengths"]
        made: dict[str, list[Any]] = {f.name: [] for f in per_row}
        for i in range(n):
            try:
                row = {f.name: self.value(f, _Row(cols, i)) for f in per_row}
            except CorruptRecordError as exc:
                bad[i] = exc
                continue
            for name, value in row.items():
                made[name].append(value)
        if bad:
            keep = np.array([i not in bad for i in range(n)], dtype=bool)
            out = {
                k: v[keep] if isinstance(v, np.ndarray) else _keep(v, keep) for k, v in out.items()
            }
        for f in per_row:
            values = made[f.name]
            fixed = None not in f.shape and not isinstance(self.output_schema[f.name], Bytes)
            out[f.name] = _stack_rows(f, values) if fixed else values
        return {n: out[n] for n in self._order(out)}, sorted(bad.items())

    def _order(self, out: Mapping[str, Any]) -> list[str]:
        names = []
        for name in self.info.features:
            if name in out:
                names.append(name)
                if name + "/lengths" in out:
                    names.append(name + "/lengths")
        return names


def _keep(values: list[Any], keep: np.ndarray) -> list[Any]:
    return [v for v, k in zip(values, keep.tolist()) if k]


def _stack_rows(f: TFDSFeature, values: list[Any]) -> np.ndarray:
    if not values:
        return np.empty((0, *f.shape), dtype=f.dtype)  # type: ignore[arg-type]
    return np.stack(values)


class _Row(Mapping[str, Any]):
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


def _cast(f: TFDSFeature, value: np.ndarray) -> np.ndarray:
    if f.dtype == "uint64":
        return value.view(np.uint64)  # tfds stores uint64 as its int64 bits
    if value.dtype == np.dtype(f.dtype):
        return value
    return value.astype(f.dtype)


def _stack(f: TFDSFeature, arrays: list[np.ndarray]) -> Any:
    inner = f.shape[f.sequence :]
    if None in inner:
        return arrays
    if not arrays:
        return np.empty((0, *inner), dtype=f.dtype)
    return np.stack(arrays)


def _text(f: TFDSFeature, value: Any) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(
            f"feature {f.name!r}: a tfds Text value that is not UTF-8 ({exc.reason} at byte "
            f"{exc.start}); read it as bytes with schema=TFDSInfo(...).view(split).schema"
        ) from None


def _inflate(name: str, data: Any, size: int | None, cap: int) -> bytes:
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


class TFDSBatchDecoder(BatchDecoder):
    """A :class:`~recordkit.reader.decode.BatchDecoder` whose batches hold tfds's values.

    Records are decoded by the stored schema, then :meth:`TFDSView.columns`
    finishes them on the same reader thread; a record that fails there is a bad
    record like any other (``on_error`` applies, the error names file, offset
    and record). Always the threaded path: the native whole-task runner knows
    nothing of tfds's encodings.

    Args:
        view: the split's view (its ``decode_images`` and limits apply).
        columns: tfds feature names to read (default all).
        verify, bytes_as, limits: as :class:`BatchDecoder`.
    """

    def __init__(
        self,
        view: TFDSView,
        *,
        columns: Sequence[str] | None = None,
        verify: bool = True,
        bytes_as: Literal["padded", "list"] = "padded",
        limits: DecodeLimits | None = None,
    ) -> None:
        super().__init__(
            view.schema,
            columns=view.stored_columns(columns),
            verify=verify,
            bytes_as=bytes_as,
            limits=limits,
        )
        self.view = view
        self.wanted = None if columns is None else list(columns)

    def runner(self) -> Any | None:
        """``None``: tfds's values are finished in Python, on the threaded path."""
        return None

    def decode(
        self,
        buf: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        alloc: Alloc | None = None,
        *,
        path: str | None = None,
        records: np.ndarray | None = None,
    ) -> DecodedBatch:
        """Decode like ``BatchDecoder.decode``, then finish tfds's values (bad rows named)."""
        batch = super().decode(buf, offsets, sizes, alloc, path=path, records=records)
        failed = {pos for pos, _ in batch.bad}
        good = [i for i in range(len(offsets)) if i not in failed]
        columns, bad = self.view.columns(batch.columns, batch.n, self.wanted)
        errors = batch.bad + [(good[row], err) for row, err in bad]
        return DecodedBatch(
            columns, sorted(errors, key=lambda e: e[0]), batch.n - len(bad), batch.nbytes
        )
