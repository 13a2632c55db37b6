"""Converters found by name: built-in, from the ``recordkit.converters`` entry-point group,
or registered in this process.

``convert()``, format inference and the cache's producer mode look a source up here by
its name and import its class by module path, as an entry point is loaded: the
converters (``recordkit.converters``, a floor above this package, since they use
recordkit's public API) are plugins, never imported by name from below.
``recordkit.converters.get``, ``available`` and ``register`` are these functions,
``register`` checking that the class is a ``recordkit.converters.Source``.
"""

from __future__ import annotations

import difflib
import importlib
from importlib import metadata
from typing import Any

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "available", "get", "register", "registered"]

ENTRY_POINT_GROUP = "recordkit.converters"

# Built-ins resolve without package metadata (a source checkout that was never
# installed); pyproject.toml declares the same names in the entry-point group.
BUILTIN = {
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

registered: dict[str, type[Any]] = {}
"""The classes :func:`register` added in this process, by name (they override the others)."""

# What convert() calls on a source class and its instances (recordkit.converters.Source).
_SOURCE_METHODS = ("list_items", "resolve_schema", "samples", "claims")


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """The names of every converter: built-in, from entry points, and registered."""
    return sorted({*BUILTIN, *_entry_points(), *registered})


def register(name: str, cls: type[Any]) -> None:
    """Make ``cls`` available as ``name`` in this process (overrides other sources)."""
    if not _is_source(cls):
        raise TypeError(f"register({name!r}, ...): expected a Source subclass, got {cls!r}")
    registered[name] = cls


def get(name: str) -> type[Any]:
    """The source class (a ``recordkit.converters.Source``) for ``name``.

    Raises:
        ValueError: no converter has that name (the message lists those that do).
        TypeError: the name's entry point is not a source class.
    """
    if name in registered:
        return registered[name]
    target = BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        names = available()
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"no converter named {name!r}{hint}; available: {', '.join(names)}")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not _is_source(cls):
        raise TypeError(f"converter {name!r} ({target}) is not a Source subclass")
    return cls  # type: ignore[no-any-return]


def _is_source(cls: Any) -> bool:
    return isinstance(cls, type) and all(callable(getattr(cls, m, None)) for m in _SOURCE_METHODS)
