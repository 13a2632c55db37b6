"""``recordkit.torch.DecodeImages``: a transform that decodes image features into tensors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from .._deps import require
from .._origins import current
from ..errors import ImageDecodeError, OptionError
from ..images import ImageOptions, decode_image, describe, pillow

torch = require("torch", extra="torch")

__all__ = ["DecodeImages", "image_backend"]

log = logging.getLogger("recordkit.images")

Backend = Literal["auto", "torchvision", "pillow"]
_BYTES = (bytes, bytearray, memoryview)
_LOCK = threading.Lock()
_TORCHVISION: list[Any] = []  # [module or None], resolved once per process


def _torchvision() -> Any:
    """``torchvision.io``, or ``None`` when torchvision does not import (said once, at INFO)."""
    with _LOCK:
        if not _TORCHVISION:
            try:
                import torchvision.io as tvio

                tvio.decode_image  # noqa: B018  (an old torchvision without it counts as absent)
                tvio.ImageReadMode  # noqa: B018
            except Exception as exc:  # a build that does not match torch fails in many ways
                reason = " ".join(str(exc).split()) or type(exc).__name__
                if isinstance(exc, ModuleNotFoundError) and exc.name == "torchvision":
                    reason = "not installed"
                log.info("torchvision does not import (%s): decoding images with Pillow", reason)
                tvio = None
            _TORCHVISION.append(tvio)
        return _TORCHVISION[0]


def image_backend(backend: Backend = "auto") -> str:
    """The decoder :class:`DecodeImages` uses in this process: ``"torchvision"`` or ``"pillow"``.

    ``"auto"``: torchvision when ``torchvision.io`` imports, else Pillow (one INFO
    line on the ``recordkit.images`` logger says why). Naming a backend that
    cannot be used is an error.
    """
    if backend not in ("auto", "torchvision", "pillow"):
        raise OptionError(f"backend must be 'auto', 'torchvision' or 'pillow', got {backend!r}")
    if backend == "pillow":
        pillow()
        return "pillow"
    if _torchvision() is not None:
        return "torchvision"
    if backend == "torchvision":
        raise ImportError("backend='torchvision': torchvision.io does not import here (see log)")
    pillow()
    return "pillow"


class DecodeImages:
    """Decode encoded image features of a batch or a sample into ``uint8`` tensors.

    A ``transform`` for :class:`RecordDataset` (or :class:`RecordMapDataset`, or
    a ``DataLoader``'s output). Each image feature becomes a tensor ``(C, H, W)``
    (``layout="CHW"``, torchvision's) or ``(H, W, C)``; in a batch, a list of N
    such tensors (images differ in size: resize or crop them in your own
    transform, after this one), and its ``"{name}/lengths"`` entry is dropped.
    It takes every batch layout: padded bytes with lengths (the default), a
    list of ``bytes`` (``bytes_as="list"``, or a plain ``DataLoader``), or one
    sample's ``bytes``.

    Run it off the training thread with ``RecordDataset(options=ReadOptions(transform_threads=N))``
    (both decoders release the GIL while they decode) or in ``DataLoader``
    workers. An image that does not decode raises
    :class:`~recordkit.errors.ImageDecodeError` naming its record
    (``file:offset:record``, known when a recordkit dataset runs the transform),
    the feature, and the source key (``path`` of ``imagefolder``).

    Args:
        features: the image features (default ``"image"``).
        mode: ``"RGB"`` (default), ``"L"`` or ``"RGBA"``.
        layout: ``"CHW"`` (default) or ``"HWC"``.
        key: the feature that names a sample (``"auto"``: ``path``, ``__key__``
            or ``key``, whichever the item has; ``None``: none).
        apply_exif_orientation: rotate JPEGs as their EXIF tag says.
        backend: ``"auto"`` (torchvision when it imports, else Pillow),
            ``"torchvision"`` or ``"pillow"``. Pixel values may differ by a
            rounding step between the two (their JPEG decoders' settings).
    """

    def __init__(
        self,
        features: str | Sequence[str] = "image",
        *,
        mode: str = "RGB",
        layout: Literal["CHW", "HWC"] = "CHW",
        key: str | None = "auto",
        apply_exif_orientation: bool = False,
        backend: Backend = "auto",
    ) -> None:
        self.options = ImageOptions(
            (features,) if isinstance(features, str) else tuple(features),
            mode=mode,
            key=key,
            apply_exif_orientation=apply_exif_orientation,
        )
        if layout not in ("CHW", "HWC"):
            raise OptionError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
        self.layout = layout
        self.backend = backend
        image_backend(backend)  # fail now, not in the first batch, if it cannot decode

    def __repr__(self) -> str:
        o = self.options
        return f"DecodeImages({list(o.features)!r}, mode={o.mode!r}, layout={self.layout!r})"

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(item, dict):
            raise TypeError(f"DecodeImages takes a dict (a batch or a sample), got {type(item)}")
        decode = self._decoder()
        out = dict(item)
        key = self.options.key_feature(list(item))
        for name in self.options.features:
            if name not in item:
                raise KeyError(f"DecodeImages: no feature {name!r}; the item has {list(item)}")
            value, lengths = item[name], item.get(f"{name}/lengths")

            def one(data: Any, row: int, name: str = name) -> Any:
                try:
                    return decode(data)
                except ImageDecodeError as exc:
                    raise self._located(exc, item, name, key, row) from exc.__cause__

            if lengths is not None:  # padded bytes: (N, longest) and their lengths
                sizes = lengths.tolist()
                out[name] = [one(value[i, :n], i) for i, n in enumerate(sizes)]
                del out[f"{name}/lengths"]
            elif isinstance(value, _BYTES):  # one sample
                out[name] = one(value, 0)
            elif isinstance(value, list):  # bytes_as="list", or a plain DataLoader batch
                out[name] = [one(v, i) for i, v in enumerate(value)]
            elif isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.ndim == 1:
                out[name] = one(value, 0)
            else:
                raise TypeError(
                    f"DecodeImages: feature {name!r} is a {type(value).__name__}, not encoded "
                    "image bytes (a Bytes() feature: bytes, a list of them, or padded with lengths)"
                )
        return out

    # -- decoding ------------------------------------------------------------------------

    def _decoder(self) -> Callable[[Any], Any]:
        o = self.options
        hwc = self.layout == "HWC"
        if image_backend(self.backend) == "torchvision":
            tvio = _torchvision()
            read_mode = {
                "RGB": tvio.ImageReadMode.RGB,
                "L": tvio.ImageReadMode.GRAY,
                "RGBA": tvio.ImageReadMode.RGB_ALPHA,
            }[o.mode]

            exif = {"apply_exif_orientation": True} if o.apply_exif_orientation else {}

            def with_torchvision(data: Any) -> Any:
                raw = _as_tensor(data)
                try:
                    img = tvio.decode_image(raw, mode=read_mode, **exif)
                except (RuntimeError, ValueError) as exc:  # what torchvision raises on bad data
                    raise ImageDecodeError(describe(exc, raw.numpy().tobytes())) from exc
                if img.ndim == 4:  # an animated GIF: its first frame, as Pillow gives
                    img = img[0]
                return img.permute(1, 2, 0).contiguous() if hwc else img

            return with_torchvision

        def with_pillow(data: Any) -> Any:
            if isinstance(data, torch.Tensor):
                data = data.numpy()
            array = decode_image(data, mode=o.mode, apply_exif_orientation=o.apply_exif_orientation)
            # Pillow's arrays are read-only: the copy to a layout torch owns is the one copy.
            if hwc:
                array = array if array.flags.writeable else array.copy()
            else:
                array = np.ascontiguousarray(array.transpose(2, 0, 1))
            return torch.from_numpy(array)

        return with_pillow

    def _located(
        self, exc: ImageDecodeError, item: dict[str, Any], name: str, key: str | None, row: int
    ) -> ImageDecodeError:
        """The error with the record, the feature and the source key filled in."""
        path: str | None = None
        offset: int | None = None
        record: int | None = None
        origins = current()
        if origins is not None and row < len(origins):
            path, offset, record = origins.locate(row)
        source = _key_of(item, key, row) if key is not None else None
        where = "" if origins is not None else f" (row {row} of the item; its record is unknown)"
        named = f", source key {source!r}" if source is not None else ""
        reason = f"image feature {name!r}{named} does not decode{where}: {exc.reason}"
        return ImageDecodeError(
            reason, path=path, offset=offset, record=record, feature=name, key=source
        )


def _as_tensor(data: Any) -> Any:
    """Encoded bytes as the 1-D ``uint8`` CPU tensor torchvision decodes."""
    if isinstance(data, torch.Tensor):
        return data.contiguous()
    if isinstance(data, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8))
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)  # a writable copy: no warning


def _key_of(item: dict[str, Any], key: str, row: int) -> str | None:
    """The source key of row ``row``, as text (padded, list, or one sample's value)."""
    value = item.get(key)
    if value is None:
        return None
    lengths = item.get(f"{key}/lengths")
    if lengths is not None:
        data: Any = value[row, : int(lengths[row])]
        data = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)
    elif isinstance(value, list) or (isinstance(value, torch.Tensor) and value.ndim >= 1):
        data = value[row]  # a batch's row (a sample's key is a scalar or bytes)
    else:
        data = value
    if isinstance(data, torch.Tensor):
        data = data.item() if data.ndim == 0 else data.tolist()
    if isinstance(data, _BYTES):
        return bytes(data).decode("utf-8", "replace")
    return str(data)
