"""``imagefolder``: one directory per class, image files inside (torchvision's layout).

``root/cat/001.jpg`` becomes ``{"image": <the file's bytes>, "label": 0,
"path": "cat/001.jpg"}``; images are stored as their encoded bytes (decode them
at read time), classes are the sorted names of the top-level directories, and
the manifest's metadata holds ``{"classes": [...]}`` so ``label`` can be named.

Options:
    extensions: the image file suffixes taken (case-insensitive); default the
        common ones (``.jpg .jpeg .png .bmp .gif .webp .tif .tiff .ppm .pgm``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from recordkit import Bytes, Int64, Schema

from .base import Item, Source, SourceError, SourceNotFoundError

__all__ = ["ImageFolderSource"]

_SCHEMA = Schema(image=Bytes(), label=Int64(), path=Bytes())


class ImageFolderSource(Source):
    """Class-per-directory images -> ``image`` bytes, ``label`` and ``path``."""

    name: ClassVar[str] = "imagefolder"
    defaults: ClassVar[Mapping[str, Any]] = {
        "extensions": (
            *(".jpg", ".jpeg", ".png", ".bmp", ".gif"),
            *(".webp", ".tif", ".tiff", ".ppm", ".pgm"),
        ),
    }

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.classes: list[str] = []

    def list_items(self) -> list[Item]:
        self.check_exists()
        if not self.location.isdir():
            raise SourceError(f"imagefolder: {self.location.url} is a file, not a directory")
        suffixes = tuple(s.lower() for s in self.options["extensions"])
        images = [(r, s) for r, s in self.location.walk() if r.lower().endswith(suffixes)]
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
        yield {"image": self.location.read_bytes(rel), "label": label, "path": rel}
