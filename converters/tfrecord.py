"""``tfrecord``: foreign TFRecord files (TensorFlow's writer, other tools) -> re-sharded.

Every record's length and payload CRC is checked as it streams by, and (by
default) every payload is decoded against the schema, so what comes out is
verified; payloads are copied byte for byte, not re-encoded. The output is
re-sharded to the requested shard size and gets ``.idx`` files and a manifest.
GZIP- and ZLIB-compressed TFRecord files (``TFRecordOptions(compression_type=
"GZIP" | "ZLIB")``) are recognised by their first bytes and read as streams.

The schema is inferred from the first records (``recordkit.Schema.infer``)
unless given.

``tf.train.SequenceExample`` records (detected from the leading records, or said
with ``sequence_example=True``) are copied byte for byte too, each decoded whole on
the way, and the manifest says ``"payload": "sequence_example"`` with a
:class:`recordkit.codec.SequenceSchema` counted over every record. A SequenceExample
among records taken for Examples is mixed input, refused by name (checked on every
record, ``check_payloads`` or not).

A local tensorflow-datasets folder converts one split, written again in the dtypes
and shapes tfds returns, its class names in the manifest's metadata. Both are told
at length in ``docs/howto/foreign-tfrecords.md``.

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
    sequence_example: ``True``: the records are SequenceExamples; ``False``: they
        are Examples (a SequenceExample is then refused); ``None`` (default):
        detected from the leading ``infer_records`` records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from recordkit import DecodeLimits, Schema
from recordkit.codec import decode_example, decode_sequence_example
from recordkit.codec.sequence import SequenceSchema, has_feature_lists
from recordkit.errors import CorruptRecordError, SequenceExampleError
from recordkit.format import OVERHEAD, open_stream, read_stream, sniff_compression
from recordkit.reader.finding import compressed_names, find_shards
from recordkit.reader.tfds import TFDSView, tfds_folder
from recordkit.storage import strip_file_scheme

from .base import Item, Source, SourceError, source_errors

# What inference decided (a feature some records lack): said by `recordkit convert`.
said = logging.getLogger("recordkit.conversion.infer")

__all__ = ["TFRecordSource"]


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
        "sequence_example": None,
    }
    # (payload kind, how it was decided): set when the schema is resolved, in the
    # parent, and pickled with the source into the writer processes.
    _payload: tuple[str, str] | None = None

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
        if self.options["sequence_example"]:
            raise SourceError(
                "tfrecord: a tensorflow-datasets folder holds tf.train.Examples; "
                "sequence_example=True is for TFRecords of SequenceExamples"
            )
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
        found = self._found_by_readers()
        files = self.matching_files(lambda r: _is_tfrecord_name(r) or r in found, "TFRecord")
        return [Item(self.item_key(r), s, (r,)) for r, s in files]

    def _found_by_readers(self) -> frozenset[str]:
        """The files of a local folder the readers take as TFRecords that these suffixes
        miss: Apache Beam's ``data-00000-of-00004``, ``*.tfr``, Ray Data's
        ``{uuid}_{task}.tar`` (by their content, compressed or not). So every folder
        ``rk.Dataset`` reads converts. The top level only, as the readers look."""
        if self.location.remote:
            return frozenset()
        root = strip_file_scheme(self.location.url)
        if not os.path.isdir(root):
            return frozenset()
        return frozenset(find_shards(root)) | frozenset(compressed_names(root))

    def resolve_schema(self, items: Sequence[Item]) -> Schema:
        view = self._tfds()
        if view is not None:
            self._payload = ("example", "a tensorflow-datasets folder")
            return view.output_schema
        wanted = self.options["sequence_example"]
        if wanted not in (None, True, False):
            raise SourceError(f"tfrecord: sequence_example must be true or false, got {wanted!r}")
        if wanted and self.schema is not None:
            raise SourceError(
                "tfrecord: a schema describes tf.train.Example features, not "
                "SequenceExamples; leave it out with sequence_example=True"
            )
        if self.schema is not None:  # a schema says Examples: nothing to read here
            self._payload = ("example", "a schema was given")
            return self.schema
        leading = self._leading(items)
        if wanted is None:  # detect: one record with feature_lists makes them SequenceExamples
            first = None
            for where, payload in leading:
                try:
                    if has_feature_lists(payload):
                        first = where
                        break
                except CorruptRecordError as exc:
                    path, offset, record = where.rsplit(":", 2)
                    raise exc.located(path, int(offset), int(record)) from exc
            if first is None:
                why = f"the leading {len(leading)} records hold no feature_lists"
            else:
                wanted, why = True, f"detected: {first} holds feature_lists"
        else:
            why = f"sequence_example={wanted}"
        self._payload = ("example", why)
        if not wanted:
            return self._infer(leading)
        if not self.options["check_payloads"]:
            raise SourceError(
                f"tfrecord: the records are tf.train.SequenceExamples ({why}): they are "
                "always decoded (the manifest's schema counts every record), so "
                "check_payloads=false does not apply"
            )
        for where, payload in leading:  # a malformed one fails here, before any writing
            try:
                decode_sequence_example(payload)
            except CorruptRecordError as exc:
                path, offset, record = where.rsplit(":", 2)
                raise exc.located(path, int(offset), int(record)) from exc
        self._payload = ("sequence_example", why)
        return Schema({})

    def payload_kind(self) -> tuple[str, str]:
        """What the records are, and how that was decided (see ``recordkit.conversion``)."""
        if self._payload is None:
            raise RuntimeError("tfrecord: payload_kind() before resolve_schema()")
        return self._payload

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
            yield from read_stream(
                f, path=path, max_record_bytes=int(self.options["max_record_bytes"])
            )

    def _located(self, item: Item) -> Iterator[tuple[tuple[str, int, int], bytes]]:
        """The payloads of one item, each with its ``(path, offset, record)``."""
        path, offset = self.location.join(item.ref[0]), 0
        for record, payload in enumerate(self._payloads(item)):
            yield (path, offset, record), payload
            offset += len(payload) + OVERHEAD

    def _leading(self, items: Sequence[Item]) -> list[tuple[str, bytes]]:
        """The first ``infer_records`` payloads, each with its ``file:offset:record``."""
        limit = int(self.options["infer_records"])
        found: list[tuple[str, bytes]] = []
        for item in items:
            for (path, offset, record), payload in self._located(item):
                if len(found) >= limit:
                    break
                found.append((f"{path}:{offset}:{record}", payload))
            if len(found) >= limit:
                break
        return found

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        return self._infer(self._leading(items))

    def _infer(self, leading: Sequence[tuple[str, bytes]]) -> Schema:
        examples: list[dict[str, Any]] = []
        for where, payload in leading:
            try:
                try:
                    examples.append(decode_example(payload))
                except SequenceExampleError:
                    raise self._mixed() from None
            except CorruptRecordError as exc:
                path, offset, record = where.rsplit(":", 2)
                raise exc.located(path, int(offset), int(record)) from exc
        notes: list[str] = []
        schema = Schema.infer(examples, where=[w for w, _ in leading], notes=notes)
        for note in notes:
            said.info("%s", note)
        return schema

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        view = self._tfds()
        if view is not None:
            yield from self._tfds_records(item, view, schema)
            return
        if self._payload is not None and self._payload[0] == "sequence_example":
            # A writer that does not ask for sequence_records (the cache's producer):
            # refused by name rather than written as Examples.
            raise SourceError(
                f"tfrecord: {item.key}: the records are tf.train.SequenceExamples "
                f"({self._payload[1]}), which this writer cannot keep whole; make a "
                "dataset of them with recordkit convert --from tfrecord"
            )
        check = bool(self.options["check_payloads"])
        limits = self._limits()
        for at, payload in self._located(item):
            try:
                if has_feature_lists(payload):  # cheap: top-level tags only, every record
                    raise self._mixed()
                if check:
                    schema.decode(payload, limits=limits)
            except CorruptRecordError as exc:
                raise exc.located(*at) from exc
            yield payload

    def _limits(self) -> DecodeLimits:
        most = self.options["max_decode_bytes"]
        return DecodeLimits(record_bytes=None if most is None else int(most))

    def _mixed(self) -> SequenceExampleError:
        why = self._payload[1] if self._payload is not None else "taken for Examples"
        return SequenceExampleError(
            f"a tf.train.SequenceExample (it has feature_lists) among records converted as "
            f"tf.train.Examples ({why}): mixed input is refused, since an Example dataset "
            "would lose its feature lists; if every record is a SequenceExample, convert "
            "with -o sequence_example=true (sequence_example=True), else convert the two "
            "kinds apart"
        )

    def sequence_records(self, item: Item, found: SequenceSchema) -> Iterator[bytes]:
        """The payloads of one item, each decoded whole and counted into ``found``.

        Raises:
            CorruptRecordError: a payload that does not decode completely (file,
                offset and record named); nothing of it is written.
        """
        for at, payload in self._located(item):
            try:
                context, lists = decode_sequence_example(payload)
            except CorruptRecordError as exc:
                raise exc.located(*at) from exc
            found.add(context, lists)
            yield payload

    def _tfds_records(self, item: Item, view: TFDSView, schema: Schema) -> Iterator[bytes]:
        """A tfds split's records, decoded as tfds wrote them and encoded in its types."""
        limits = self._limits()
        view = view.with_options(decode_images=view.decode_images, limits=limits)
        for at, payload in self._located(item):
            try:
                sample = view.sample(view.schema.decode(payload, copy=True, limits=limits))
            except CorruptRecordError as exc:
                raise exc.located(*at) from exc
            yield schema.encode(sample)
