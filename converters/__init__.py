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

from recordkit.conversion import sources as _sources
from recordkit.conversion.sources import ENTRY_POINT_GROUP, available

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

# The public faces of the registry, ``recordkit.conversion.sources``.


def register(name: str, cls: type[Source]) -> None:
    """Make ``cls`` available as ``name`` in this process (overrides other sources)."""
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise TypeError(f"register({name!r}, ...): expected a Source subclass, got {cls!r}")
    _sources.register(name, cls)


def get(name: str) -> type[Source]:
    """The :class:`Source` class for ``name``.

    Raises:
        ValueError: no converter has that name (the message lists those that do).
    """
    cls = _sources.get(name)
    if not issubclass(cls, Source):
        raise TypeError(f"converter {name!r} is not a Source subclass")
    return cls
