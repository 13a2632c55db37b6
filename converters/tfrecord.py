"""``tfrecord``: foreign TFRecord files (TensorFlow's writer, other tools) -> re-sharded.

Every record's length and payload CRC is checked as it streams by, and (by
default) every payload is decoded against the schema, so what comes out is
verified; payloads are copied byte for byte, not re-encoded. The output is
re-sharded to the requested shard size and gets ``.idx`` files and a manifest.
GZIP- and ZLIB-compressed TFRecord files (``TFRecordOptions(compression_type=
"GZIP" | "ZLIB")``) are recognised by their first bytes and read as streams.

The schema is inferred from the first records (``recordkit.Schema.infer``)
unless given.

Options:
    infer_records: how many leading records inference looks at (default 64).
    check_payloads: decode each payload against the schema (default True).
    max_record_bytes: a length field above this is corruption (default 2 GiB).
    max_decode_bytes: with ``check_payloads``, the bytes one record's zstd values
        may decompress to (``recordkit.DecodeLimits(record_bytes=...)``; default
        ``None``: derived from the schema, 256 MiB for variable shapes). A record
        over it is refused by name before the memory is allocated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, ClassVar

from recordkit import DecodeLimits, Schema
from recordkit.codec import decode_example
from recordkit.errors import CorruptRecordError
from recordkit.format import OVERHEAD, open_stream, read_stream, sniff_compression

from .base import Item, Source, source_errors

__all__ = ["TFRecordSource", "read_records"]


def read_records(f: BinaryIO, *, path: str, max_record_bytes: int = 2**31) -> Iterator[bytes]:
    """Stream the payloads of a TFRecord file, checking every CRC as they pass.

    :func:`recordkit.format.read_stream`, under the name this module has always had.

    Raises:
        TruncatedRecordError: the file ends inside a record (a partial header too).
        CorruptRecordError: a length or payload CRC mismatch (path, offset, record).
        RecordTooLargeError: a length field above ``max_record_bytes``.
    """
    return read_stream(f, path=path, max_record_bytes=max_record_bytes)


def _is_tfrecord_name(rel: str) -> bool:
    base = rel.rsplit("/", 1)[-1].lower()
    return (".tfrecord" in base or base.endswith(".tfrec")) and not base.endswith(".idx")


class TFRecordSource(Source):
    """TFRecord files (``*.tfrecord``, ``*.tfrecords``, ``*.tfrecord-00000-of-00010``)."""

    name: ClassVar[str] = "tfrecord"
    defaults: ClassVar[Mapping[str, Any]] = {
        "infer_records": 64,
        "check_payloads": True,
        "max_record_bytes": 2**31,
        "max_decode_bytes": None,
    }

    suffixes: ClassVar[tuple[str, ...]] = (".tfrecord", ".tfrecords", ".tfrec")

    @classmethod
    def claims(cls, rel: str) -> bool:
        """``*.tfrecord``, ``*.tfrecords``, ``*.tfrec``, ``*.tfrecord-00000-of-00010``."""
        return _is_tfrecord_name(rel)

    def list_items(self) -> list[Item]:
        files = self.matching_files(_is_tfrecord_name, "TFRecord")
        return [Item(self.item_key(r), s, (r,)) for r, s in files]

    def _payloads(self, item: Item) -> Iterator[bytes]:
        rel = item.ref[0]
        path = self.location.join(rel)
        with source_errors(item.key), self.location.open(rel, block_size=8 << 20) as raw:
            head = raw.read(12)
            raw.seek(0)
            f = open_stream(raw, sniff_compression(head))
            yield from read_records(
                f, path=path, max_record_bytes=int(self.options["max_record_bytes"])
            )

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        limit = int(self.options["infer_records"])
        examples: list[dict[str, Any]] = []
        where: list[str] = []  # file:offset:record of each, for inference's messages
        for item in items:
            path, offset = self.location.join(item.ref[0]), 0
            for record, payload in enumerate(self._payloads(item)):
                if len(examples) >= limit:
                    break
                try:
                    examples.append(decode_example(payload))
                except CorruptRecordError as exc:
                    raise exc.located(path, offset, record) from exc
                where.append(f"{path}:{offset}:{record}")
                offset += len(payload) + OVERHEAD
            if len(examples) >= limit:
                break
        return Schema.infer(examples, where=where)

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        check = bool(self.options["check_payloads"])
        most = self.options["max_decode_bytes"]
        limits = DecodeLimits(record_bytes=None if most is None else int(most))
        path = self.location.join(item.ref[0])
        offset = 0
        for record, payload in enumerate(self._payloads(item)):
            if check:
                try:
                    schema.decode(payload, limits=limits)
                except CorruptRecordError as exc:
                    raise exc.located(path, offset, record) from exc
            offset += len(payload) + OVERHEAD
            yield payload
