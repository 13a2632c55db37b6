"""``tfrecord``: foreign TFRecord files (TensorFlow's writer, other tools) -> re-sharded.

Every record's length and payload CRC is checked as it streams by, and (by
default) every payload is decoded against the schema, so what comes out is
verified; payloads are copied byte for byte, not re-encoded. The output is
re-sharded to the requested shard size and gets ``.idx`` files and a manifest.
GZIP- and ZLIB-compressed TFRecord files (``TFRecordOptions(compression_type=
"GZIP" | "ZLIB")``) are recognised by their first bytes and read as streams.

The schema is inferred from the first records (``recordkit.Schema.infer``)
unless given.

A tensorflow-datasets folder (a local one with ``dataset_info.json`` and
``features.json``) converts one split (option ``split``, needed when it has
several), its shards in ``dataset_info.json``'s order, with tfds's types:
records are decoded as tfds serialized them and written again in the dtype
and shape tfds returns (``Tensor`` features for int32, float64, bool, ...;
``Text`` as UTF-8 ``Bytes``; ``Image`` as the encoded bytes, or decoded to
``uint8`` with ``decode_images``), so the copy reads in tfds's shapes
everywhere; the manifest's metadata gets ``{"tfds": {...}}`` (class names).

Options:
    infer_records: how many leading records inference looks at (default 64).
    check_payloads: decode each payload against the schema (default True).
    max_record_bytes: a length field above this is corruption (default 2 GiB).
    max_decode_bytes: with ``check_payloads``, the bytes one record's zstd values
        may decompress to (``recordkit.DecodeLimits(record_bytes=...)``; default
        ``None``: derived from the schema, 256 MiB for variable shapes). A record
        over it is refused by name before the memory is allocated.
    split: the split of a tensorflow-datasets folder.
    decode_images: store a tensorflow-datasets folder's images decoded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, ClassVar

from recordkit import DecodeLimits, Schema
from recordkit.codec import decode_example
from recordkit.errors import CorruptRecordError
from recordkit.format import OVERHEAD, open_stream, read_stream, sniff_compression
from recordkit.reader.tfds import TFDSView, tfds_folder
from recordkit.storage import strip_file_scheme

from .base import Item, Source, SourceError, source_errors

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
        "split": None,
        "decode_images": False,
    }

    def _tfds(self) -> TFDSView | None:
        """The tensorflow-datasets split this source is (``None``: plain TFRecords)."""
        if self.location.remote:
            if self.options["split"] is not None:
                raise SourceError("tfrecord: split= reads local tensorflow-datasets folders")
            return None
        found = tfds_folder(strip_file_scheme(self.location.url))
        if found is None:
            if self.options["split"] is not None or self.options["decode_images"]:
                raise SourceError(
                    f"tfrecord: {self.location.url} is not a tensorflow-datasets folder; the "
                    "options split and decode_images are for those"
                )
            return None
        info, file = found
        try:
            split = info.choose_split(self.options["split"], file)
        except ValueError as exc:
            raise SourceError(f"tfrecord: {exc}") from None
        view = info.view(split, decode_images=bool(self.options["decode_images"]))
        if self.schema is not None:
            raise SourceError(
                "tfrecord: a tensorflow-datasets folder converts with tfds's own types; "
                "give no schema"
            )
        return view
    suffixes: ClassVar[tuple[str, ...]] = (".tfrecord", ".tfrecords", ".tfrec")

    @classmethod
    def claims(cls, rel: str) -> bool:
        """``*.tfrecord``, ``*.tfrecords``, ``*.tfrec``, ``*.tfrecord-00000-of-00010``."""
        return _is_tfrecord_name(rel)

    def list_items(self) -> list[Item]:
        view = self._tfds()
        if view is not None:
            infos = view.info.shard_infos(view.split)
            root = strip_file_scheme(self.location.url)
            if os.path.isfile(root):  # one shard of the split
                name = os.path.basename(root)
                return [Item(name, i.bytes, ("",)) for i in infos if i.path == name]
            return [Item(i.path, i.bytes, (i.path,)) for i in infos]
        files = self.matching_files(_is_tfrecord_name, "TFRecord")
        return [Item(self.item_key(r), s, (r,)) for r, s in files]

    def resolve_schema(self, items: Sequence[Item]) -> Schema:
        view = self._tfds()
        if view is not None:
            return view.output_schema
        return super().resolve_schema(items)

    def metadata(self, items: Sequence[Item]) -> dict[str, Any]:
        view = self._tfds()
        return {"tfds": view.info.to_json(view.split)} if view is not None else {}

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
        view = self._tfds()
        if view is not None:
            yield from self._tfds_records(item, view, schema)
            return
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

    def _tfds_records(self, item: Item, view: TFDSView, schema: Schema) -> Iterator[bytes]:
        """A tfds split's records, decoded as tfds wrote them and encoded in its types."""
        most = self.options["max_decode_bytes"]
        limits = DecodeLimits(record_bytes=None if most is None else int(most))
        view = view.with_options(decode_images=view.decode_images, limits=limits)
        path = self.location.join(item.ref[0])
        offset = 0
        for record, payload in enumerate(self._payloads(item)):
            try:
                sample = view.sample(view.schema.decode(payload, copy=True, limits=limits))
            except CorruptRecordError as exc:
                raise exc.located(path, offset, record) from exc
            offset += len(payload) + OVERHEAD
            yield schema.encode(sample)
