"""Groups of reading settings as frozen objects: :class:`ReadOptions`, :class:`CacheOptions`.

``recordkit.torch.RecordDataset`` takes its reading settings either as flat
keywords (the convenient form) or whole, as ``options=ReadOptions(...)``; its
cache settings as ``cache=``, ``cache_dir=``, ... or whole, as
``cache_options=CacheOptions(...)`` (``recordkit.tf.dataset`` takes
``cache_options=`` too). Each setting is accepted one way per call: a flat
keyword given beside the object that holds it is an
:class:`~recordkit.errors.OptionError` naming it, never silently one of the two.
Derive a variant with ``dataclasses.replace``::

    base = ReadOptions(batch_size=256, shuffle=True, num_threads=8)
    train = RecordDataset("data/train", options=base)
    val = RecordDataset("data/val", options=dataclasses.replace(base, shuffle=False))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .._keywords import accepts_options, given, refuse
from ..codec.limits import DecodeLimits
from ..codec.schema import Schema
from .ragged import check_ragged_as

if TYPE_CHECKING:
    from ..cache import ShardCache

__all__ = ["CacheOptions", "ReadOptions", "accepts_options", "merge_options"]

DEFAULT_LOADER_TIMEOUT = 300.0
"""Seconds the training process waits for the loader process's next chunk (see
``recordkit.reader.process.DEFAULT_PROGRESS_TIMEOUT``, the same number)."""

_O = TypeVar("_O", "ReadOptions", "CacheOptions")


@dataclass(frozen=True)
class ReadOptions:
    """How ``recordkit.torch.RecordDataset`` reads: every setting but the path and the cache.

    Each field is the ``RecordDataset`` keyword of the same name, with the same
    default and meaning (see :class:`recordkit.torch.RecordDataset`); the values
    are checked when the object is made. ``columns`` is kept as a tuple.
    """

    batch_size: int | None = None
    shuffle: bool = False
    seed: int = 0
    num_threads: int | None = None
    drop_last: bool = False
    on_error: Literal["raise", "skip", "warn"] = "raise"
    columns: Sequence[str] | None = None
    transform: Callable[[Any], Any] | None = None
    transform_threads: int = 0
    bytes_as: Literal["padded", "list"] = "padded"
    ragged_as: Literal["padded", "list"] = "padded"
    verify: bool = True
    limits: DecodeLimits | None = None
    schema: Schema | None = None
    block_records: int = 0
    window_blocks: int = 8192
    prefetch: int | None = None
    rank: int | None = None
    world_size: int | None = None
    pin_memory: bool = False
    reader_process: bool = False
    loader_timeout: float | None = DEFAULT_LOADER_TIMEOUT
    partial: bool = False
    split: str | None = None
    decode_images: bool = False
    sequence_example: bool = False
    raw: bool = False
    records: slice | str | Sequence[slice | str | None] | None = None
    weights: Sequence[float] | None = None
    epoch_records: int | None = None

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip", "warn"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'warn', got {self.on_error!r}")
        if self.bytes_as not in ("padded", "list"):
            raise ValueError(f"bytes_as must be 'padded' or 'list', got {self.bytes_as!r}")
        check_ragged_as(self.ragged_as)
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}")
        if self.transform_threads < 0:
            raise ValueError(f"transform_threads must be >= 0, got {self.transform_threads}")
        if self.loader_timeout is not None and not self.loader_timeout > 0:
            raise ValueError(f"loader_timeout must be > 0 or None, got {self.loader_timeout!r}")
        if (self.sequence_example or self.raw) and (
            self.schema is not None or self.columns is not None or self.decode_images
        ):
            what = "sequence_example=True" if self.sequence_example else "raw=True"
            raise ValueError(f"{what} reads records whole: no schema, columns or decode_images")
        if self.columns is not None:
            if isinstance(self.columns, str):
                raise TypeError(f"columns must be a sequence of names, got {self.columns!r}")
            object.__setattr__(self, "columns", tuple(self.columns))


@dataclass(frozen=True)
class CacheOptions:
    """How a reader reads a remote dataset through a local shard cache (see ``docs/cache.md``).

    The flat keywords of ``RecordDataset`` and ``recordkit.tf.dataset`` are
    these fields with a ``cache_`` prefix (``cache_dir=`` is :attr:`dir`), and
    ``cache=`` is :attr:`cache`.

    Attributes:
        cache: a :class:`recordkit.cache.ShardCache` to read through; the
            reader's path is then only a label.
        dir: instead of ``cache``: cache the remote path in this directory.
        limit: the disk budget for ``dir`` (bytes or ``"50GiB"``).
        epochs: ``"whole"`` (every epoch reads every record, the shards fetched
            ahead within the budget) or ``"growing"`` (each epoch reads what has
            arrived).
        timeout: seconds a reader waits for one shard (whole epochs) or an epoch
            start for a first complete shard (growing epochs); ``None``: no limit.
    """

    cache: ShardCache | None = None
    dir: str | os.PathLike[str] | None = None
    limit: int | str | None = None
    epochs: Literal["whole", "growing"] = "whole"
    timeout: float | None = 600.0

    def __post_init__(self) -> None:
        if self.epochs not in ("whole", "growing"):
            raise ValueError(
                f"cache_epochs must be one of ('whole', 'growing'), got {self.epochs!r}"
            )

    @property
    def used(self) -> bool:
        """Whether a cache is named (``cache`` or ``dir``)."""
        return self.cache is not None or self.dir is not None


def _keyword(cls: type[Any], field: str) -> str:
    """The flat keyword of ``cls``'s ``field``."""
    if cls is CacheOptions and field != "cache":
        return f"cache_{field}"
    return field


def _fields(cls: type[Any]) -> dict[str, str]:
    """``{flat keyword: field}`` of an options class."""
    return {_keyword(cls, f.name): f.name for f in dataclasses.fields(cls)}


def merge_options(
    cls: type[_O], options: _O | None, flat: Mapping[str, Any], *, keyword: str
) -> _O:
    """The settings of ``cls`` given either whole (``options``) or as flat keywords.

    Args:
        cls: :class:`ReadOptions` or :class:`CacheOptions`.
        options: the object given as ``keyword=`` (``None``: not given).
        flat: the function's flat keywords (name → value, given or default).
        keyword: the name of the options parameter, for the message.

    Raises:
        OptionError: a flat keyword was given beside ``options`` (it names it).
        TypeError: ``options`` is not a ``cls``.
    """
    names = _fields(cls)
    passed = given()
    if options is None:
        return cls(**{field: flat[key] for key, field in names.items() if key in flat})
    if not isinstance(options, cls):
        raise TypeError(f"{keyword}= takes a {cls.__name__}, got {type(options).__name__}")
    both = [k for k in names if k in passed]
    refuse(both, keyword, cls.__name__, [names[k] for k in sorted(both)])
    return options
