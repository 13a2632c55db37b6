"""Decoding the images a dataset stores as encoded bytes (JPEG, PNG, ...), where you ask.

What the framework decoders (``recordkit.torch.DecodeImages``, and
``recordkit.tf.dataset(..., options=ReadOptions(decode_images=...))``) share:

- :class:`ImageOptions`: which features to decode, into which channels, and
  which feature holds the sample's source key (named when an image fails);
- :func:`decode_image`: one image to a ``uint8`` array ``(H, W, C)`` with Pillow,
  raising :class:`~recordkit.errors.ImageDecodeError` when it does not decode.

``docs/howto/images.md`` says what each decoder gives, and where resizing belongs.
Pillow is the ``images`` extra; a missing Pillow's error gives the install command.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._deps import require
from .errors import ImageDecodeError, OptionError

__all__ = ["KEY_FEATURES", "MODES", "ImageDecodeError", "ImageOptions", "decode_image"]

#: The channel modes every decoder gives alike (3 channels, 1 grey, or 4 with alpha).
#: An image of another mode (grey, palette, CMYK, 16-bit) is converted, so that every
#: image of a batch has the same number of channels.
MODES = ("RGB", "L", "RGBA")
#: The features that hold a sample's source key, looked for in this order by
#: ``key="auto"`` (``imagefolder``'s ``path``, WebDataset's ``__key__``, then ``key``).
KEY_FEATURES = ("path", "__key__", "key")


@dataclass(frozen=True, slots=True)
class ImageOptions:
    """What to decode, and how (shared by the PyTorch and TensorFlow decoders).

    Attributes:
        features: the ``Bytes()`` features that hold encoded images (a name or
            several); default ``("image",)``, what ``imagefolder`` writes.
        mode: ``"RGB"`` (default), ``"L"`` (grey, one channel) or ``"RGBA"``;
            every image is converted to it, so a batch has one channel count.
        key: the feature whose value names the sample in an error (its source
            file); ``"auto"`` (default): the first of :data:`KEY_FEATURES` the
            data holds; ``None``: none.
        apply_exif_orientation: rotate JPEGs as their EXIF orientation tag says
            (default ``False``, as torchvision and Pillow).
    """

    features: tuple[str, ...] = ("image",)
    mode: str = "RGB"
    key: str | None = "auto"
    apply_exif_orientation: bool = False

    def __post_init__(self) -> None:
        features: Any = self.features
        if isinstance(features, str):
            features = (features,)
        if not isinstance(features, Sequence) or not features:
            raise OptionError(f"features must name one image feature or more, got {features!r}")
        if not all(isinstance(f, str) and f for f in features):
            raise OptionError(f"features must be feature names, got {features!r}")
        object.__setattr__(self, "features", tuple(features))
        if self.mode not in MODES:
            raise OptionError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.key is not None and not (isinstance(self.key, str) and self.key):
            raise OptionError(f"key must be a feature name, 'auto' or None, got {self.key!r}")
        if self.key in self.features:
            raise OptionError(f"key {self.key!r} is one of the image features")

    @property
    def channels(self) -> int:
        """The number of channels of a decoded image (3, 1 or 4)."""
        return {"RGB": 3, "L": 1, "RGBA": 4}[self.mode]

    def key_feature(self, names: Sequence[str]) -> str | None:
        """The feature that names a sample, among ``names`` (the data's features)."""
        if self.key is None:
            return None
        if self.key != "auto":
            return self.key if self.key in names else None
        return next((k for k in KEY_FEATURES if k in names), None)


def pillow() -> Any:
    """``PIL.Image``, or :class:`~recordkit.errors.MissingDependencyError` naming ``images``.

    Every format plugin is imported at the first call (``Image.init()``, about 80 ms):
    call it on the thread that builds a pipeline. Left to ``Image.open``, the plugins are
    imported by the first image no early plugin reads, on whichever thread decodes it;
    two TensorFlow threads doing so deadlocked (one waited on the other's module lock
    while that one, collecting garbage, dropped a ``tf.data`` iterator that waits for it).
    """
    require("PIL", extra="images")
    from PIL import Image, ImageOps  # noqa: F401  (ImageOps: EXIF orientation)

    global _PLUGINS
    if not _PLUGINS:
        Image.init()
        _PLUGINS = True
    return Image


_PLUGINS = False


def decode_image(
    data: bytes | bytearray | memoryview | np.ndarray,
    *,
    mode: str = "RGB",
    apply_exif_orientation: bool = False,
) -> np.ndarray:
    """Decode one encoded image with Pillow into a ``uint8`` array ``(H, W, C)``.

    The first frame of an animation; 16-bit images are converted to 8 bits. The
    array may be read-only (Pillow's buffer): copy it to write into it.

    Args:
        data: the encoded bytes (a ``uint8`` array is read as its bytes).
        mode: ``"RGB"``, ``"L"`` or ``"RGBA"`` (see :data:`MODES`).
        apply_exif_orientation: rotate as the EXIF orientation tag says.

    Raises:
        ImageDecodeError: the bytes are not an image Pillow reads, or are cut
            short or corrupt (the reason is Pillow's; no location: the callers
            that know the record add it with ``err.located(...)``).
        MissingDependencyError: Pillow is not installed.
    """
    if mode not in MODES:
        raise OptionError(f"mode must be one of {MODES}, got {mode!r}")
    image_mod = pillow()
    buf = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    try:
        with image_mod.open(io.BytesIO(buf)) as img:
            if apply_exif_orientation:
                from PIL import ImageOps

                img = ImageOps.exif_transpose(img)
            if img.mode != mode:
                img = img.convert(mode)
            else:
                img.load()
            out = np.asarray(img)
    except Exception as exc:  # Pillow raises OSError, ValueError, SyntaxError, ... by format
        raise ImageDecodeError(describe(exc, buf)) from exc
    return out[:, :, None] if out.ndim == 2 else out


def describe(exc: BaseException, data: bytes) -> str:
    """One line on why ``data`` did not decode: the library's reason and what the bytes are."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if not data:
        return f"an empty value ({text})"
    head = data[:8]
    return f"{type(exc).__name__}: {text} ({len(data)} bytes starting {head!r})"
