"""Which decoder reads a reader's records, from its :class:`~recordkit.reader.options.ReadOptions`.

The decoder settings (``verify``, ``bytes_as``, ``limits``, ``ragged_as``) are read
from the options here and nowhere else: the reader threads' decoder, the loader
process's and ``RecordMapDataset``'s are all made by :func:`make_decoder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ..codec.schema import Schema
from .decode import BatchDecoder
from .options import ReadOptions
from .sequence import RawBatchDecoder, SequenceBatchDecoder
from .tfds import TFDSBatchDecoder, TFDSView

__all__ = ["decoder_keywords", "make_decoder"]


def decoder_keywords(
    options: ReadOptions,
    columns: Sequence[str] | None,
    *,
    ragged_as: Literal["padded", "list"],
    bytes_as: Literal["padded", "list"] | None = None,
) -> dict[str, Any]:
    """The :class:`~recordkit.reader.decode.BatchDecoder` keywords of ``options``
    (``bytes_as``: the options' unless given, ``"padded"`` if neither says;
    ``ragged_as``: the reader's layout)."""
    return {
        "columns": columns,
        "verify": options.verify,
        "bytes_as": bytes_as or options.bytes_as or "padded",
        "limits": options.limits,
        "ragged_as": ragged_as,
    }


def make_decoder(
    schema: Schema,
    options: ReadOptions,
    columns: Sequence[str] | None,
    *,
    view: TFDSView | None,
    sequence_example: bool,
    ragged_as: Literal["padded", "list"],
    bytes_as: Literal["padded", "list"] | None = None,
) -> BatchDecoder:
    """The decoder of a reader: SequenceExamples or ``raw`` records whole, a
    tensorflow-datasets split through its ``view``, anything else by ``schema``.

    Raises:
        SchemaError: a column not in the schema.
    """
    if sequence_example:
        return SequenceBatchDecoder(verify=options.verify)
    if options.raw:
        return RawBatchDecoder(verify=options.verify)
    keywords = decoder_keywords(options, columns, ragged_as=ragged_as, bytes_as=bytes_as)
    if view is not None:
        del keywords["ragged_as"]  # tfds's own shapes
        return TFDSBatchDecoder(view, **keywords)
    return BatchDecoder(schema, **keywords)
