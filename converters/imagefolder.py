"""``imagefolder``: one directory per class, image files inside (torchvision's layout).

``root/cat/001.jpg`` becomes ``{"image": <the file's bytes>, "label": 0,
"path": "cat/001.jpg"}``; images are stored as their encoded bytes (decode them
at read time), classes are the sorted names of the top-level directories, and
the manifest's metadata holds ``{"classes": [...]}`` so ``label`` can be named.

Each file is checked before it is stored, so a file that is not an image (a
0-byte ``.jpg``, a text file named ``.jpg``) is caught here, naming its path,
and not in a training job's transform much later.

Options:
    extensions: the image file suffixes taken (case-insensitive); default the
        common ones (``.jpg .jpeg .png .bmp .gif .webp .tif .tiff .ppm .pgm``).
    check: ``"header"`` (default): the file must start with the signature of
        JPEG, PNG, GIF, BMP, WEBP, TIFF or PPM/PGM; ``"decode"``: Pillow must
        also decode it whole (the ``images`` extra; slower, catches truncated
        and corrupt images); ``"none"``: store any bytes.
    on_error: ``"raise"`` (default): a file that fails the check is a
        ``SourceError`` naming it; ``"skip"``: it is left out with a warning
        naming it (the summary then shows fewer records than items).
    order: ``"interleaved"`` (default): the images are written in a seeded order
        that mixes the classes (sorted by a keyed hash of each path, as
        tensorflow-datasets shuffles at write time), so every shard holds every
        class and any reader of the result, ``tf.data`` included, starts from
        unsorted data; ``"sorted"``: class by class, in path order.
    seed: the key of the interleaved order (default 0); the same seed gives the
        same order on any machine, so a resumed conversion is byte-identical.
    follow_symlinks: see :data:`recordkit.converters.base.COMMON_OPTIONS`.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from recordkit import Bytes, Int64, Schema
from recordkit._deps import install_command
from recordkit.errors import MissingDependencyError
from recordkit.format import DEFAULT_MAX_RECORD_BYTES

from .base import Item, Source, SourceError, SourceNotFoundError

__all__ = ["ImageFolderSource"]

log = logging.getLogger(__name__)

_SCHEMA = Schema(image=Bytes(), label=Int64(), path=Bytes())
_CHECKS = ("header", "decode", "none")
_ON_ERROR = ("raise", "skip")
# Leading bytes of each format Pillow reads that the default extensions name.
_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    *((b"P%d" % n, "PNM") for n in range(1, 8)),
)


def image_kind(data: bytes) -> str | None:
    """The image format ``data`` starts with (``"JPEG"``, ``"PNG"``, ...), or ``None``."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((kind for magic, kind in _SIGNATURES if data.startswith(magic)), None)


def _decode(data: bytes) -> None:
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError(
            "imagefolder check='decode' needs Pillow, which is not installed: "
            + install_command("images")
        ) from exc
    with Image.open(io.BytesIO(data)) as img:
        img.load()


class ImageFolderSource(Source):
    """Class-per-directory images -> ``image`` bytes, ``label`` and ``path``."""

    name: ClassVar[str] = "imagefolder"
    defaults: ClassVar[Mapping[str, Any]] = {
        "extensions": (
            *(".jpg", ".jpeg", ".png", ".bmp", ".gif"),
            *(".webp", ".tif", ".tiff", ".ppm", ".pgm"),
        ),
        "check": "header",
        "on_error": "raise",
        "order": "interleaved",
        "seed": 0,
    }

    suffixes: ClassVar[tuple[str, ...]] = tuple(defaults["extensions"])

    @classmethod
    def claims(cls, rel: str) -> bool:
        """An image (by the default extensions) inside a class directory."""
        return "/" in rel and super().claims(rel)

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.classes: list[str] = []
        self.check_choice("check", _CHECKS)
        self.check_choice("order", ("interleaved", "sorted"))
        self.check_choice("on_error", _ON_ERROR)

    def list_items(self) -> list[Item]:
        self.check_exists()
        if not self.location.isdir():
            raise SourceError(f"imagefolder: {self.location.url} is a file, not a directory")
        suffixes = tuple(s.lower() for s in self.options["extensions"])
        images = [(r, s) for r, s in self.walk() if r.lower().endswith(suffixes)]
        stray = [r for r, _ in images if "/" not in r]
        if stray:
            raise SourceError(
                f"imagefolder: {stray[0]!r} is not inside a class directory "
                f"({len(stray)} such files under {self.location.url})"
            )
        if not images:
            raise SourceNotFoundError(f"imagefolder: no images under {self.location.url}")
        self.classes = sorted({r.split("/", 1)[0] for r, _ in images})
        label = {c: i for i, c in enumerate(self.classes)}
        if self.options["order"] == "interleaved":
            # A keyed hash, not a random generator: the same order on any machine and
            # NumPy version, and an image keeps its place relative to the others when
            # images are added.
            key = str(int(self.options["seed"])).encode()
            images.sort(key=lambda rs: hashlib.blake2b(rs[0].encode(), key=key).digest())
        return [Item(r, s, (r, label[r.split("/", 1)[0]])) for r, s in images]

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        return _SCHEMA

    def resolve_schema(self, items: Sequence[Item]) -> Schema:
        if self.schema is not None and self.schema != _SCHEMA:
            raise SourceError(f"imagefolder writes the schema {_SCHEMA!r}; got {self.schema!r}")
        return _SCHEMA

    def metadata(self, items: Sequence[Item]) -> dict[str, Any]:
        return {"classes": list(self.classes)}

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        rel, label = item.ref
        self.check_inside(rel)
        if item.size > DEFAULT_MAX_RECORD_BYTES:  # one image is one record
            raise SourceError(
                f"imagefolder: {rel}: {item.size} bytes, over the record limit of "
                f"{DEFAULT_MAX_RECORD_BYTES}; refused before reading it"
            )
        data = self.location.read_bytes(rel)
        try:
            self._check(rel, data)
        except SourceError as exc:
            if self.options["on_error"] == "raise":
                raise
            log.warning("skipped: %s", exc)
            return
        yield {"image": data, "label": label, "path": rel}

    def _check(self, rel: str, data: bytes) -> None:
        check = self.options["check"]
        if check == "none":
            return
        if image_kind(data) is None:
            what = "an empty file" if not data else f"{len(data)} bytes starting {data[:8]!r}"
            raise SourceError(f"imagefolder: {rel}: not an image ({what})")
        if check == "decode":
            try:
                _decode(data)
            except MissingDependencyError:
                raise
            except Exception as exc:  # bytes in memory: whatever Pillow raises is about them
                text = " ".join(str(exc).split())
                raise SourceError(
                    f"imagefolder: {rel}: not a readable image ({type(exc).__name__}: {text})"
                ) from exc
