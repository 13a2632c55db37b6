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
import csv
import gzip
import hashlib
import json
import logging
import lzma
import os
import stat
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from recordkit import Schema
from recordkit.errors import (
    OptionError,
    RecordkitError,
    SchemaError,
    SourceError,
    SourceNotFoundError,
)
from recordkit.storage import Location, is_temp_name, strip_file_scheme

__all__ = [
    "COMMON_OPTIONS",
    "Item",
    "Source",
    "SourceError",
    "SourceNotFoundError",
    "check_member_name",
    "source_errors",
]

log = logging.getLogger(__name__)

#: Options every converter takes, with their defaults. ``follow_symlinks``: read
#: files and directories that symlinks inside a local source resolve to outside
#: it (by default such a link is refused by name: a source tree that links to
#: ``/etc/passwd`` must not put that file into a dataset).
COMMON_OPTIONS: Mapping[str, Any] = {"follow_symlinks": False}


def _check_kind(fmt: str, key: str, value: Any, default: Any) -> None:
    """Refuse an option value of another kind than its default (``None`` takes any):
    an :class:`~recordkit.errors.OptionError` (a ``ValueError``)."""
    if default is None or value is None:
        return
    kinds: tuple[type, ...]
    if isinstance(default, bool):
        kinds, what = (bool,), "true or false"
    elif isinstance(default, (int, float)):
        kinds, what = (int, float), "a number"
    elif isinstance(default, str):
        kinds, what = (str,), "a string"
    elif isinstance(default, (tuple, list)):
        kinds, what = (tuple, list), "a list"
    else:
        return
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise OptionError(f"{fmt}: option {key} must be {what}, got {value!r}")


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
    #: option name -> default; anything else passed as an option is refused, and a
    #: value of another kind than its default (a number, a string, a bool, a list).
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: The endings of this format's file names, in lower case. ``recordkit convert``
    #: without ``--from`` takes the one format whose files a source holds, told by
    #: :meth:`claims`; a format without endings is never told that way, nor is a
    #: subclass that does not declare its own.
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: File names that travel with this format's files (its index or metadata, e.g.
    #: MDS's ``index.json``): where this format claims files, no other format's claim
    #: on a file of that name counts (``.json`` alone would look like ``jsonl``).
    companions: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict[str, Any] | None = None,
        schema: Schema | None = None,
        **options: Any,
    ) -> None:
        known = {**COMMON_OPTIONS, **self.defaults}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"{self.name}: unknown option(s) {unknown}; it takes {sorted(known)}")
        for key, value in options.items():
            _check_kind(self.name, key, value, known[key])
        self.location = Location(url, storage_options)
        self.schema = schema
        self.options = {**known, **options}

    def check_choice(self, key: str, choices: Sequence[Any]) -> None:
        """Refuse an option value that is not one of ``choices`` (``ValueError``)."""
        value = self.options[key]
        if value not in choices:
            raise ValueError(f"{self.name}: {key} must be one of {choices}, got {value!r}")

    def __getstate__(self) -> dict[str, Any]:
        # The versions are the plan's business: writer processes do not need them.
        state = dict(self.__dict__)
        state.pop("_found_versions", None)
        state.pop("_every_version", None)
        return state

    @property
    def _versions(self) -> dict[str, str]:
        found: dict[str, str] | None = self.__dict__.get("_found_versions")
        if found is None:
            found = self.__dict__["_found_versions"] = {}
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location.url!r})"

    @classmethod
    def claims(cls, rel: str) -> bool:
        """Whether a file of a source (``rel``: its path below the source, or its name
        for a one-file source) looks like one of this format's, by :attr:`suffixes`."""
        return bool(cls.suffixes) and rel.lower().endswith(cls.suffixes)

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
        entries = self.walk()
        if entries and entries[0][0] == "":
            return entries[:1]
        files = [(r, s) for r, s in entries if match(r)]
        if not files:
            raise SourceNotFoundError(f"{self.name}: no {what} files under {self.location.url}")
        return files

    def walk(self) -> list[tuple[str, int]]:
        """Every file under the source as ``(relative posix path, size)``, sorted.

        Like :meth:`Location.walk <recordkit.storage.Location.walk>`, and for a
        local source also: directory symlinks are followed; a symlink (to a file
        or a directory) that resolves outside the source's root is refused by
        name unless the ``follow_symlinks`` option is set; a symlink loop, a
        dangling link and a FIFO or device are refused by name too (reading a
        FIFO would block for ever). Converters list their files through this.

        Raises:
            SourceError: one of the above, naming the path below the source.
        """
        if self.location.remote:
            found = self.location.walk_versions()
        else:
            found = _walk_local(self.name, strip_file_scheme(self.location.url), self._follow)
        # the content identity of each file, for the plan (see versions)
        self._versions.update((rel, version) for rel, _, version in found)
        return [(rel, size) for rel, size, _ in found]

    @property
    def versions(self) -> dict[str, str]:
        """``{relative path: content identity}`` of every file :meth:`walk` listed (its
        modification time, ETag, version id or generation; a SHA-256 where a server
        says none of these). The plan records each item's, so that a rerun over
        files regenerated at the same names and sizes is a different conversion."""
        return dict(self._versions)

    def item_version(self, item: Item) -> str:
        """The content identity of the file ``item`` comes from: the version of its
        ``ref``'s first element or of its key, when :meth:`walk` listed that path;
        for an item read from several files (a row range of ``.npy`` columns) a
        hash of every listed file's (``all=...``); ``""`` when nothing was listed
        (the item's key, size and ``ref`` identify it)."""
        for rel in (item.ref[0] if item.ref else None, item.key):
            if isinstance(rel, str) and rel in self._versions:
                return self._versions[rel]
        if not self._versions:
            return ""
        every = self.__dict__.get("_every_version")
        if every is None:
            blob = json.dumps(sorted(self._versions.items())).encode()
            every = self.__dict__["_every_version"] = "all=" + hashlib.sha256(blob).hexdigest()
        return str(every)

    @property
    def _follow(self) -> bool:
        return bool(self.options.get("follow_symlinks", False))

    def check_inside(self, rel: str) -> None:
        """Check again, just before reading it, that ``rel`` resolves inside a local source.

        :meth:`walk` checked at planning time; a link swapped since then is caught here.

        Raises:
            SourceError: ``rel`` now resolves outside the source (without ``follow_symlinks``).
        """
        if self.location.remote or self._follow or not rel:
            return
        root = os.path.realpath(strip_file_scheme(self.location.url))
        target = os.path.realpath(os.path.join(root, *rel.split("/")))
        if not _inside(root, target):
            raise SourceError(_escape_message(self.name, rel, target, root))

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
    if ":" in parts[0] and len(parts[0]) == 2:  # a Windows drive, "C:"
        raise SourceError(f"{container}: member name {name!r} is absolute; refused")
    return name


def _inside(root: str, target: str) -> bool:
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def _escape_message(name: str, rel: str, target: str, root: str) -> str:
    return (
        f"{name}: {rel!r} is a symlink to {target!r}, outside the source {root!r}; refused "
        "(set the option follow_symlinks=True, or --follow-symlinks, to read it)"
    )


def _walk_local(name: str, top: str, follow: bool) -> list[tuple[str, int, str]]:
    """:meth:`Source.walk` for a local path (see there), with each file's version."""
    if os.path.isfile(top):
        st = os.stat(top)
        return [("", st.st_size, f"mtime_ns={st.st_mtime_ns}")]  # the user named this file
    if not os.path.isdir(top):
        return []
    root = os.path.realpath(top)
    found: list[tuple[str, int, str]] = []
    real_dirs = {top: root}  # each directory walked -> where it really is
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        dirnames.sort()
        for sub in dirnames:
            full = os.path.join(dirpath, sub)
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            target = os.path.realpath(full)
            if not follow and not _inside(root, target):
                raise SourceError(_escape_message(name, rel, target, root))
            up = dirpath
            while True:  # a link to a directory that holds it would be walked for ever
                if real_dirs[up] == target:
                    raise SourceError(f"{name}: {rel!r} links back to {target!r}: a symlink loop")
                if up == top:
                    break
                up = os.path.dirname(up)
            real_dirs[full] = target
        for file in filenames:
            full = os.path.join(dirpath, file)
            rel = os.path.relpath(full, top).replace(os.sep, "/")
            if os.path.islink(full):
                target = os.path.realpath(full)
                if not follow and not _inside(root, target):
                    raise SourceError(_escape_message(name, rel, target, root))
            try:
                st = os.stat(full)
            except FileNotFoundError:
                raise SourceError(f"{name}: {rel!r} is a dangling symlink") from None
            if not stat.S_ISREG(st.st_mode):
                raise SourceError(f"{name}: {rel!r} is not a regular file (a FIFO or device)")
            found.append((rel, st.st_size, f"mtime_ns={st.st_mtime_ns}"))
    return sorted(f for f in found if not is_temp_name(f[0]))


def _data_errors() -> tuple[type[BaseException], ...]:
    """Errors by which third-party readers say "bad bytes" (not "network trouble")."""
    errors: list[type[BaseException]] = [
        csv.Error,
        json.JSONDecodeError,
        UnicodeDecodeError,
        tarfile.TarError,
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        gzip.BadGzipFile,
        lzma.LZMAError,
    ]
    # Only libraries that are already imported: a converter that uses one imports it.
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is not None:
        errors.append(pyarrow.lib.ArrowException)
    pil = sys.modules.get("PIL.Image")
    if pil is not None:
        errors += [pil.UnidentifiedImageError, pil.DecompressionBombError]
    return tuple(errors)


@contextlib.contextmanager
def source_errors(where: str) -> Iterator[None]:
    """Turn a third-party library's complaint about the data into a :class:`SourceError`.

    Wrap the code that parses one source item (pyarrow, tarfile, zipfile, gzip,
    csv, json, PIL); the error then names ``where`` (the item, and the row where
    known) on one line, with the original chained as its cause. recordkit's own
    errors, and OS and network errors (which may be transient), pass through.
    """
    try:
        yield
    except RecordkitError:
        raise
    except Exception as exc:
        if not isinstance(exc, _data_errors()):
            raise
        kind = type(exc)
        library = (kind.__module__ or "").split(".")[0]
        label = kind.__name__ if library in ("builtins", "") else f"{library} {kind.__name__}"
        text = " ".join(str(exc).split()) or "(no message)"
        raise SourceError(f"{where}: {label}: {text}") from exc
