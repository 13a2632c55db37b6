"""``ProducerOptions``: the settings of a cache in producer mode, as one frozen object."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._keywords import given, refuse

if TYPE_CHECKING:
    from ..codec.schema import Schema
    from ..conversion import ConvertOptions

__all__ = ["DEFAULT_SHARD_SIZE", "ProducerOptions", "producer_options"]

DEFAULT_SHARD_SIZE = "256MiB"
"""The source bytes one partition (one shard) covers when nothing else is said."""


@dataclass(frozen=True)
class ProducerOptions:
    """Producer mode: convert a remote of raw samples into local shards while training runs.

    Given to :class:`ShardCache` as ``producer=``, or as its flat keywords (see there;
    a keyword given beside ``producer=`` is an :class:`~recordkit.errors.OptionError`).

    Attributes:
        format: the converter that reads the remote (``converters.available()``:
            ``jsonl``, ``imagefolder``, ``numpy``, ...).
        schema: the schema to write (``None``: inferred from the source, as
            ``recordkit convert`` does).
        source_options: the converter's options (kept as a read-only mapping).
        convert_options: the conversion settings
            (:class:`recordkit.conversion.ConvertOptions`: ``shard_size``, the source
            bytes one partition and so one shard covers, which should be a small
            fraction of ``max_bytes`` so that eviction frees room in small steps;
            ``compress``, ``partition_items``, ``retries`` for transient source
            errors, ``fsync``, ...); ``max_records`` must be ``None``, a
            partition is one shard. ``None``: ``ConvertOptions(shard_size="256MiB")``.
        inactivity_timeout: a writer process that reports no progress for this
            many seconds is stopped (terminate, then kill) and its partition
            retried later; ``None`` waits forever. With ``fill_workers=0``
            partitions are converted in the calling thread instead of writer
            processes (debugging; ``memory://`` sources).
    """

    format: str
    schema: Schema | None = None
    source_options: Mapping[str, Any] | None = None
    convert_options: ConvertOptions | None = None
    inactivity_timeout: float | None = 900.0

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or not self.format:
            raise TypeError(f"format must be a converter name, got {self.format!r}")
        timeout = self.inactivity_timeout
        if timeout is not None and timeout <= 0:
            raise ValueError(f"inactivity_timeout must be > 0 or None, got {timeout}")
        if self.convert_options is not None and self.convert_options.max_records is not None:
            raise ValueError(
                "convert_options.max_records must be None: in producer mode a partition is "
                "one shard (bound it with shard_size or partition_items)"
            )
        frozen = types.MappingProxyType(dict(self.source_options or {}))
        object.__setattr__(self, "source_options", frozen)

    def conversion(self) -> ConvertOptions:
        """The conversion settings (the default ones where none were given)."""
        if self.convert_options is not None:
            return self.convert_options
        from ..conversion import ConvertOptions

        return ConvertOptions(shard_size=DEFAULT_SHARD_SIZE)


_FLAT = ("format", "schema", "source_options", "convert_options", "inactivity_timeout")


def producer_options(
    producer: ProducerOptions | None,
    *,
    format: str | None,
    schema: Schema | None,
    source_options: Mapping[str, Any] | None,
    shard_size: int | str,
    compress: str | None,
    convert_options: ConvertOptions | None,
    inactivity_timeout: float | None,
) -> ProducerOptions | None:
    """``ShardCache``'s producer settings from ``producer=`` or its flat keywords
    (``None``: shard mode). Called inside ``ShardCache.__init__`` (``@accepts_options``).

    Raises:
        OptionError: a setting given two ways (a flat keyword beside ``producer=``;
            ``shard_size=``/``compress=`` beside ``convert_options=``).
        ValueError: producer settings without a format (shard mode), or bad values.
    """
    passed = given()
    if producer is not None:
        if not isinstance(producer, ProducerOptions):
            raise TypeError(f"producer= takes a ProducerOptions, got {type(producer).__name__}")
        flat = [k for k in (*_FLAT, "shard_size", "compress") if k in passed]
        refuse(flat, "producer", "ProducerOptions", flat)
        return producer
    if format is None:
        extras = {
            "schema": schema,
            "source_options": source_options,
            "compress": compress,
            "convert_options": convert_options,
        }
        named = [k for k, v in extras.items() if v is not None]
        named += ["shard_size"] if shard_size != DEFAULT_SHARD_SIZE else []
        named += ["inactivity_timeout"] if inactivity_timeout != 900.0 else []
        if named:
            raise ValueError(f"{', '.join(sorted(named))}: producer mode only; give format= too")
        return None
    if convert_options is not None:
        both = [k for k in ("shard_size", "compress") if k in passed]
        refuse(both, "convert_options", "ConvertOptions", both)
    elif shard_size != DEFAULT_SHARD_SIZE or compress is not None:
        from ..conversion import ConvertOptions

        convert_options = ConvertOptions(shard_size=shard_size, compress=compress)
    return ProducerOptions(
        format=format,
        schema=schema,
        source_options=source_options,
        convert_options=convert_options,
        inactivity_timeout=inactivity_timeout,
    )
