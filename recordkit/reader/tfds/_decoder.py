"""The reader's decoder of a tensorflow-datasets split: batches of tfds's values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ...codec.limits import DecodeLimits
from ..decode import Alloc, BatchDecoder, DecodedBatch
from ._info import TFDSView

__all__ = ["TFDSBatchDecoder"]


class TFDSBatchDecoder(BatchDecoder):
    """A :class:`~recordkit.reader.decode.BatchDecoder` whose batches hold tfds's values.

    Records are decoded by the stored schema, then :meth:`TFDSView.columns`
    finishes them on the same reader thread; a record that fails there is a bad
    record like any other (``on_error`` applies, the error names file, offset
    and record). Always the threaded path: the native whole-task runner knows
    nothing of tfds's encodings.

    Args:
        view: the split's view (its ``decode_images`` and limits apply).
        columns: tfds feature names to read (default all).
        verify, bytes_as, limits: as :class:`BatchDecoder`.
    """

    def __init__(
        self,
        view: TFDSView,
        *,
        columns: Sequence[str] | None = None,
        verify: bool = True,
        bytes_as: Literal["padded", "list"] = "padded",
        limits: DecodeLimits | None = None,
    ) -> None:
        super().__init__(
            view.schema,
            columns=view.stored_columns(columns),
            verify=verify,
            bytes_as=bytes_as,
            limits=limits,
        )
        self.view = view
        self.wanted = None if columns is None else list(columns)

    def runner(self) -> Any | None:
        """``None``: tfds's values are finished in Python, on the threaded path."""
        return None

    def decode(
        self,
        buf: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        alloc: Alloc | None = None,
        *,
        path: str | None = None,
        records: np.ndarray | None = None,
    ) -> DecodedBatch:
        """Decode like ``BatchDecoder.decode``, then finish tfds's values (bad rows named)."""
        batch = super().decode(buf, offsets, sizes, alloc, path=path, records=records)
        failed = {pos for pos, _ in batch.bad}
        good = [i for i in range(len(offsets)) if i not in failed]
        columns, bad = self.view.columns(batch.columns, batch.n, self.wanted)
        errors = batch.bad + [(good[row], err) for row, err in bad]
        return DecodedBatch(
            columns, sorted(errors, key=lambda e: e[0]), batch.n - len(bad), batch.nbytes
        )
