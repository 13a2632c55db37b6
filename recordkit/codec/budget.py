"""What is left of a decode limit during one decode call (:class:`DecodeBudget`).

A leaf: the feature types decompress their zstd values through it, and
:class:`~recordkit.codec.limits.DecodeLimits` makes one per call from a schema.
"""

from __future__ import annotations

from typing import Any

from ..errors import RecordTooLargeError
from .compression import zstd_decompress

__all__ = ["DecodeBudget"]


class DecodeBudget:
    """What is left of a :class:`DecodeLimits` during one decode call.

    Not thread-safe: one per call. :meth:`start_record` before each record's values.

    Args:
        record: the record limit (bytes).
        batch: the batch limit (bytes).
    """

    __slots__ = ("batch", "batch_left", "record", "record_left")

    def __init__(self, record: int, batch: int) -> None:
        self.record, self.batch = record, batch
        self.record_left, self.batch_left = record, batch

    def start_record(self) -> None:
        """Begin the next record: its values count against a fresh record limit."""
        self.record_left = self.record

    def decompress(self, name: str, frame: Any, expected_size: int | None) -> bytes | bytearray:
        """Decompress feature ``name``'s frame within what is left, and count it.

        Raises:
            RecordTooLargeError: the frame declares (or produces) more than is
                left; names the feature, the sizes and the limit.
            CorruptRecordError: the frame is malformed or of the wrong size.
        """
        record_side = self.record_left <= self.batch_left
        cap = self.record_left if record_side else self.batch_left
        try:
            out = zstd_decompress(frame, expected_size=expected_size, max_size=cap)
        except RecordTooLargeError as exc:
            if record_side:
                limit = (
                    f"record_bytes={self.record} ({self.record - cap} already used by this record)"
                )
            else:
                limit = f"batch_bytes={self.batch} ({self.batch - cap} already used by this batch)"
            raise RecordTooLargeError(
                f"feature {name!r}: {exc.reason}: DecodeLimits({limit}); raise it with "
                f"limits=DecodeLimits(...) if such values are expected"
            ) from None
        self.record_left -= len(out)
        self.batch_left -= len(out)
        return out
