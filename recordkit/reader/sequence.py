"""A batch decoder for ``tf.train.SequenceExample`` records, read whole.

Each record is copied out of the map under the SIGBUS guard, its framing and
CRCs checked, and decoded by :func:`recordkit.codec.sequence_example_values`
(context plus every feature list, per-step ragged, typed as stored). A record
that does not decode is a bad record like any other (``on_error`` applies; the
reader names file, offset and record). Python per record: sequence data is
ragged, and there is no schema to vectorise over.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codec.example import decode_example
from ..codec.schema import Schema
from ..codec.sequence import as_stored, sequence_example_values
from ..errors import CorruptRecordError
from ..format import guard
from ..format.framing import read_record
from .decode import Alloc, BatchDecoder, DecodedBatch
from .shards import ShardSet

__all__ = ["SAMPLE", "RawBatchDecoder", "SequenceBatchDecoder", "read_whole"]

#: The one column a sequence batch holds: a list of samples (dicts).
SAMPLE = "sample"


class SequenceBatchDecoder(BatchDecoder):
    """Decodes batches of SequenceExample records into one column of whole samples, record
    by record on the threaded path (no features: no runner).

    Args:
        verify: check payload CRCs (length CRCs are always checked).
    """

    def __init__(self, *, verify: bool = True) -> None:
        super().__init__(Schema({}), verify=verify, bytes_as="list")

    @staticmethod
    def values(payload: bytes | memoryview) -> dict[str, Any]:
        """One record whole (a SequenceExample's context and feature lists)."""
        return sequence_example_values(payload)

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
        """The records at ``offsets`` as ``{"sample": [sample, ...]}``; bad ones listed."""
        samples: list[dict[str, Any]] = []
        bad: list[tuple[int, CorruptRecordError]] = []
        nbytes = 0
        for pos, (offset, size) in enumerate(zip(offsets.tolist(), sizes.tolist())):
            record = None if records is None else int(records[pos])
            nbytes += size
            framed = guard.read(buf, offset, size, path=path, offset=offset, record=record)
            try:
                payload = read_record(framed, 0, expected_size=size, verify=self.verify)
                samples.append(self.values(payload))
            except CorruptRecordError as exc:
                bad.append((pos, exc))
        return DecodedBatch({SAMPLE: samples}, bad, len(samples), nbytes)


class RawBatchDecoder(SequenceBatchDecoder):
    """Decodes Example records whole, as stored (``raw=True``): each record's own
    features, ``bytes`` lists as ``list[bytes]``, numbers as 1-d arrays typed as
    stored, a feature with no list set as ``[]``; a record that is not an Example
    read whole (a SequenceExample, unknown fields) is a bad record, never a part.
    """

    @staticmethod
    def values(payload: bytes | memoryview) -> dict[str, Any]:
        return {n: as_stored(k, v) for n, (k, v) in decode_example(payload).items()}


def read_whole(path: str, told: bool, shards: ShardSet, *refused: Any) -> bool:
    """Whether a reader reads SequenceExamples whole: ``told`` so, or the manifest
    says so (``recordkit convert`` of SequenceExamples). Then nothing in
    ``refused`` (a schema, columns, decode_images) may be set.

    Raises:
        ValueError: one of ``refused`` is set (neither ``None`` nor ``False``).
    """
    manifest = shards.manifest
    said = manifest is not None and manifest.sequence_example
    if (told or said) and any(x is not None and x is not False for x in refused):
        why = "sequence_example=True:" if told else "its manifest says its records are"
        raise ValueError(
            f"{path}: {why} tf.train.SequenceExamples, read whole: no schema, columns or "
            "decode_images"
        )
    return told or said
