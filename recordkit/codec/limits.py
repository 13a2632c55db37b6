"""The memory budget for decoding: how much a record, and a batch, may decode to.

A record on disk is small and bounded by its file; what it decodes to need not
be. A zstd value of a few KiB can legally inflate to gigabytes, and when the
feature's shape is variable nothing in the schema says how big it may be. So
every reader decodes under a :class:`DecodeLimits`, and a value that would pass
it is refused from its frame header (or, for a frame that does not declare its
size, as soon as its output passes the limit) with a
:class:`~recordkit.errors.RecordTooLargeError`, before the memory is allocated.

Only decompressed bytes count: every other value is no larger than (a small
multiple of, for int64 varints) the record it comes from, which the framing
already bounds by ``max_record_bytes`` and the file's size.

A leaf below the schema: a limit asks the schema what its zstd values decode to
(:meth:`~recordkit.codec.Schema.zstd_bytes`, each feature type's own
``zstd_bytes``) and hands one decode call a :class:`~recordkit.codec.budget.DecodeBudget`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .budget import DecodeBudget

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_RECORD_BYTES",
    "DecodeBudget",
    "DecodeLimits",
]

# 256 MiB per record: far above any sample a training step consumes whole (a
# 4K RGB float16 frame is 48 MiB), far below what takes a host down; a reader
# with 16 threads each holding one such value stays within a few GiB.
DEFAULT_RECORD_BYTES = 256 << 20


class _ZstdSized(Protocol):
    """What a limit reads of a schema (:class:`~recordkit.codec.Schema` is one)."""

    def zstd_bytes(self, columns: Any = None) -> tuple[int, bool]:
        """(bytes of the fixed-shape zstd values per record, whether any is variable)."""
        ...


# 1 GiB per batch (per decode call: a batch of rk.Dataset/verify/tf, a reader
# task of RecordDataset): four records at the record ceiling.
DEFAULT_BATCH_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """The bytes a record, and a batch, may decompress to (``limits=`` of every reader).

    The default (``None``) of each is derived from the schema: a fixed-shape zstd
    tensor always decodes to exactly its schema size, which is allowed; a schema
    with any variable-shape zstd tensor adds the documented ceiling
    (``DEFAULT_RECORD_BYTES``, 256 MiB, per record; ``DEFAULT_BATCH_BYTES``, 1 GiB, per
    batch). A value set here is the limit as given.

    Attributes:
        record_bytes: the most bytes the zstd values of one record may decompress
            to, all features together.
        batch_bytes: the most bytes the zstd values of one batch may decompress
            to (one decode call: a batch, or a reader thread's task of
            ``RecordDataset``, so peak memory is about threads x this).
    """

    record_bytes: int | None = None
    batch_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("record_bytes", "batch_bytes"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DecodeLimits.{name} must be an int >= 1 or None, got {value!r}")

    def record_limit(self, schema: _ZstdSized, columns: Any = None) -> int:
        """The bytes one record of ``schema`` (these ``columns``) may decompress to."""
        if self.record_bytes is not None:
            return self.record_bytes
        fixed, variable = schema.zstd_bytes(columns)
        return fixed + (DEFAULT_RECORD_BYTES if variable else 0)

    def batch_limit(self, schema: _ZstdSized, n: int, columns: Any = None) -> int:
        """The bytes a batch of ``n`` records of ``schema`` may decompress to."""
        if self.batch_bytes is not None:
            return self.batch_bytes
        fixed, variable = schema.zstd_bytes(columns)
        return n * fixed + (DEFAULT_BATCH_BYTES if variable else 0)

    def budget(self, schema: _ZstdSized, n: int, columns: Any = None) -> DecodeBudget:
        """A fresh :class:`DecodeBudget` for one decode call of ``n`` records."""
        return DecodeBudget(
            self.record_limit(schema, columns), self.batch_limit(schema, n, columns)
        )
