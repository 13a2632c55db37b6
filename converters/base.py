"""The :class:`Source` protocol every converter implements, and its :class:`Item`.

A source is planned in the parent process and read in writer subprocesses:

1. ``list_items()`` lists the source's items (files, row ranges, row groups) in a
   deterministic order; the planner cuts them into partitions;
2. ``resolve_schema(items)`` returns the schema (the one given, or one inferred
   from the first items) and ``metadata(items)`` what goes into the manifest;
3. in a writer subprocess, ``records(item, schema)`` yields each item's records,
   encoded. Samples never leave the process that read them.

A source object is pickled into the writer subprocess, so it must hold only
small, picklable state: the :class:`~recordkit.storage.Location` (which
rebuilds its filesystem in each process), options, and what planning found.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from recordkit import Schema
from recordkit.errors import RecordkitError, SchemaError
from recordkit.storage import Location

__all__ = ["Item", "Source", "SourceError", "SourceNotFoundError", "check_member_name"]


class SourceError(RecordkitError, ValueError):
    """Source data that cannot be converted (names the item and, where known, the row)."""


class SourceNotFoundError(RecordkitError, FileNotFoundError):
    """The source URL does not exist, or holds nothing this converter can read."""


@dataclass(frozen=True, slots=True)
class Item:
    """One unit of a source that a partition is made of.

    Attributes:
        key: a stable, readable name, used in error notes and the plan
            (``"cat/001.jpg"``, ``"x.npz[0:4096]"``).
        size: its size in bytes (an estimate is fine): partitions are balanced
            on it and progress counts it.
        ref: converter-specific, JSON-ready detail (e.g. ``(path, start, stop)``).
    """

    key: str
    size: int
    ref: tuple[Any, ...] = ()


class Source(abc.ABC):
    """A dataset in some foreign format that ``recordkit convert`` can read.

    Subclasses set :attr:`name` (the ``--from`` value) and implement
    :meth:`list_items`, :meth:`infer_schema` and :meth:`samples` (or
    :meth:`records` to hand over payloads that are already encoded).

    Args:
        url: a local path or fsspec URL of a file or directory.
        storage_options: fsspec options for remote URLs (credentials, endpoint).
        schema: the schema to write; ``None`` infers one from the source.
        options: format-specific options (see each converter's docstring);
            unknown ones are an error.
    """

    #: the converter's name, the value of ``recordkit convert --from``.
    name: ClassVar[str] = ""
    #: option name -> default; anything else passed as an option is refused.
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        schema: Schema | None = None,
        **options: Any,
    ) -> None:
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"{self.name}: unknown option(s) {unknown}; it takes {sorted(self.defaults)}"
            )
        self.location = Location(url, storage_options)
        self.schema = schema
        self.options = {**self.defaults, **options}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location.url!r})"

    def check_exists(self) -> None:
        """Raise :class:`SourceNotFoundError` when the source URL does not exist."""
        if not self.location.exists():
            raise SourceNotFoundError(f"{self.name}: source {self.location.url} does not exist")

    def matching_files(self, match: Callable[[str], bool], what: str) -> list[tuple[str, int]]:
        """``(relative path, size)`` of the files under the source that ``match``, sorted.

        A source that is one file gives ``[("", size)]`` whatever its name.

        Raises:
            SourceNotFoundError: the source does not exist, or holds no such file.
        """
        self.check_exists()
        entries = self.location.walk()
        if entries and entries[0][0] == "":
            return entries[:1]
        files = [(r, s) for r, s in entries if match(r)]
        if not files:
            raise SourceNotFoundError(f"{self.name}: no {what} files under {self.location.url}")
        return files

    def item_key(self, rel: str) -> str:
        """An item's name: its relative path, or the file name for a one-file source."""
        return rel or self.location.url.rstrip("/").rsplit("/", 1)[-1]

    @abc.abstractmethod
    def list_items(self) -> list[Item]:
        """The source's items in a deterministic order (sorted names, row ranges)."""

    @abc.abstractmethod
    def infer_schema(self, items: Sequence[Item]) -> Schema:
        """A schema guessed from the source (usually its first items)."""

    def resolve_schema(self, items: Sequence[Item]) -> Schema:
        """The schema to write: the one given, else :meth:`infer_schema`'s guess."""
        return self.schema if self.schema is not None else self.infer_schema(items)

    def metadata(self, items: Sequence[Item]) -> dict[str, Any]:
        """JSON-ready metadata for the manifest (e.g. class names). Empty by default."""
        return {}

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        """The samples of one item, as mappings that ``schema.encode`` accepts."""
        raise NotImplementedError(f"{type(self).__name__} implements neither samples nor records")

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        """The encoded records of one item (by default, each sample encoded)."""
        for row, sample in enumerate(self.samples(item, schema)):
            try:
                yield schema.encode(sample)
            except SchemaError as exc:
                raise SchemaError(f"{item.key}: sample {row}: {exc}") from exc


def check_member_name(container: str, name: str) -> str:
    """Return ``name`` if it is a safe relative member path; raise :class:`SourceError`.

    Archive members are streamed, never extracted, but their names still become
    sample keys: absolute names, ``..`` components, and NUL bytes are refused so
    a hostile archive cannot name anything outside itself.
    """
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith(("/", "\\")) or ".." in parts or "\x00" in name:
        raise SourceError(f"{container}: member name {name!r} escapes the archive; refused")
    with contextlib.suppress(ValueError):
        if ":" in parts[0] and len(parts[0]) == 2:  # a Windows drive, "C:"
            raise SourceError(f"{container}: member name {name!r} is absolute; refused")
    return name
