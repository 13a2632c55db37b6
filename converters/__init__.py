"""Converters from common dataset formats to recordkit, found by name.

Each module holds one :class:`~recordkit.converters.base.Source`. Built-in names:
``imagefolder``, ``jsonl``, ``csv``, ``numpy``, ``parquet``, ``webdataset``,
``tfrecord``, ``mds`` (MosaicML Streaming), ``hf`` (Hugging Face ``datasets``
saved to disk) and ``arrayrecord`` (Grain's ArrayRecord). Third parties add
their own through the ``recordkit.converters`` entry-point group::

    [project.entry-points."recordkit.converters"]
    myformat = "mypackage.converter:MySource"

or at run time with :func:`register` (in-process only: writer subprocesses
import the class by its module path, so it must be importable there).
"""

from __future__ import annotations

import difflib
import importlib
from importlib import metadata

from .base import Item, Source, SourceError, SourceNotFoundError, source_errors

__all__ = [
    "ENTRY_POINT_GROUP",
    "Item",
    "Source",
    "SourceError",
    "SourceNotFoundError",
    "available",
    "get",
    "register",
    "source_errors",
]

ENTRY_POINT_GROUP = "recordkit.converters"

# Built-ins resolve without package metadata (a source checkout that was never
# installed); pyproject.toml declares the same names in the entry-point group.
_BUILTIN = {
    "arrayrecord": "recordkit.converters.arrayrecord:ArrayRecordSource",
    "csv": "recordkit.converters.csv:CsvSource",
    "hf": "recordkit.converters.hf:HFDatasetSource",
    "imagefolder": "recordkit.converters.imagefolder:ImageFolderSource",
    "jsonl": "recordkit.converters.jsonl:JsonlSource",
    "mds": "recordkit.converters.mds:MDSSource",
    "numpy": "recordkit.converters.numpy:NumpySource",
    "parquet": "recordkit.converters.parquet:ParquetSource",
    "tfrecord": "recordkit.converters.tfrecord:TFRecordSource",
    "webdataset": "recordkit.converters.webdataset:WebDatasetSource",
}
_registered: dict[str, type[Source]] = {}


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """The names of every converter: built-in, from entry points, and registered."""
    return sorted({*_BUILTIN, *_entry_points(), *_registered})


def register(name: str, cls: type[Source]) -> None:
    """Make ``cls`` available as ``name`` in this process (overrides other sources)."""
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise TypeError(f"register({name!r}, ...): expected a Source subclass, got {cls!r}")
    _registered[name] = cls


def get(name: str) -> type[Source]:
    """The :class:`Source` class for ``name``.

    Raises:
        ValueError: no converter has that name (the message lists those that do).
    """
    if name in _registered:
        return _registered[name]
    target = _BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        names = available()
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"no converter named {name!r}{hint}; available: {', '.join(names)}")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise TypeError(f"converter {name!r} ({target}) is not a Source subclass")
    return cls
