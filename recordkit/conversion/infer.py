"""Which converter a source needs, told from its file names (``recordkit convert`` without
``--from``).

Each converter says which files are its own (``Source.claims``: ``.parquet`` for
``parquet``, ``.tar`` of samples for ``webdataset``, images inside class folders for
``imagefolder``, ...); a subclass of a converter takes part only if it declares its
own ``suffixes`` (or ``claims``). A source is inferred only when exactly one converter claims
files in it; files no converter claims (a README, hidden files, index sidecars, a
manifest) are left out of the count. Anything else is an error that lists what was
found, never a guess.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import SourceNotFoundError
from ..storage import Location

__all__ = ["Inferred", "infer_format"]

log = logging.getLogger(__name__)

# Files that say nothing about a source's format: our own sidecars and manifest.
_SIDECARS = (".idx",)
_MANIFEST = "recordkit.json"


@dataclass(frozen=True)
class Inferred:
    """The converter a source needs, and why.

    Attributes:
        format: the converter's name.
        files: how many of the source's files it claims.
        example: one of them (its path below the source, or the source's name).
    """

    format: str
    files: int
    example: str

    def __str__(self) -> str:
        if self.files == 1:
            return f"--from {self.format}, told from {self.example}"
        return f"--from {self.format}, told from {self.files} files like {self.example}"


def _telling(rel: str) -> bool:
    parts = rel.split("/")
    if any(p.startswith(".") for p in parts):
        return False  # hidden files and our own state directories
    return parts[-1] != _MANIFEST and not parts[-1].lower().endswith(_SIDECARS)


def _converters() -> list[tuple[str, Any]]:
    from . import sources as converters  # the registry of converters, by name

    found = []
    for name in converters.available():
        try:
            cls = converters.get(name)
        except Exception as exc:  # a plugin that does not import says nothing here
            log.debug("converter %r not considered: %s", name, exc)
            continue
        # Only a class that says which files are its own (a subclass of a built-in
        # converter inherits its suffixes, not its claim to their files).
        if "suffixes" in vars(cls) or "claims" in vars(cls):
            found.append((name, cls))
    return found


def infer_format(src: str, storage_options: dict[str, Any] | None = None) -> Inferred:
    """The one converter whose files ``src`` holds.

    Args:
        src: a file or directory, local or remote.
        storage_options: fsspec options for a remote ``src``.

    Raises:
        SourceNotFoundError: ``src`` does not exist, or holds no files.
        ValueError: no converter, or more than one, claims its files; the message
            lists what was found and the ``--from`` values to choose from.
    """
    location = Location(src, storage_options)
    entries = location.walk()
    if not entries:
        raise SourceNotFoundError(f"{src} does not exist or holds no files")
    if entries[0][0] == "":  # one file: its name tells
        names = [location.url.rstrip("/").rsplit("/", 1)[-1]]
    else:
        names = [rel for rel, _ in entries if _telling(rel)]
    converters = _converters()
    claimers = {fmt: [rel for rel in names if cls.claims(rel)] for fmt, cls in converters}
    # A format's companion files (MDS's index.json) are its own where it claims files.
    taken = {
        name for fmt, cls in converters if claimers[fmt] for name in getattr(cls, "companions", ())
    }
    claimed: Counter[str] = Counter()
    example: dict[str, str] = {}
    for fmt, cls in converters:
        own = set(getattr(cls, "companions", ()))
        for rel in claimers[fmt]:
            base = rel.rsplit("/", 1)[-1]
            if base in taken and base not in own:
                continue
            claimed[fmt] += 1
            example.setdefault(fmt, rel)
    if len(claimed) == 1:
        fmt, n = claimed.most_common(1)[0]
        return Inferred(fmt, n, example[fmt])
    if claimed:
        found = ", ".join(
            f"{n} {fmt} file{'s' if n > 1 else ''} ({example[fmt]})"
            for fmt, n in sorted(claimed.items())
        )
        choices = " or ".join(f"--from {fmt}" for fmt in sorted(claimed))
        raise ValueError(f"cannot tell the format of {src}: it holds {found}; pass {choices}")
    ends = sorted({_ending(r) for r in names})[:8]
    seen = ", ".join(ends) if ends else "no files but hidden ones or sidecars"
    hint = ""
    if any("/" not in r and _ending(r) in _IMAGE_ENDINGS for r in names):
        hint = " (images at the top: imagefolder needs one folder per class)"
    available = ", ".join(fmt for fmt, _ in converters)
    raise ValueError(
        f"cannot tell the format of {src} from its files ({seen}){hint}; "
        f"pass --from FORMAT, one of: {available}"
    )


_IMAGE_ENDINGS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def _ending(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1].lower()
    return "." + name.rsplit(".", 1)[-1] if "." in name else name
