"""``arrayrecord``: ArrayRecord files, Grain's format (recordkit's ``arrayrecord`` extra).

Files ``*.array_record`` (and tensorflow-datasets' ``*.array_record-00000-of-00004``)
are read with the ``array-record`` package's own reader; a large file is cut
into ranges of records that convert in parallel. What a record holds is up to
its writer, so the ``records`` option says how to store it:

- ``"example"``: each record is a serialized ``tf.train.Example`` (tfds's and
  many Grain pipelines' payload). It is copied byte for byte, as the
  ``tfrecord`` converter copies payloads, and checked against the schema
  (inferred from the first records, ``Schema.infer``, unless given).
- ``"bytes"``: each record is stored whole as ``{"record": Bytes()}`` (JSON,
  msgpack, pickles you will decode yourself: recordkit never unpickles them).
- ``"auto"`` (default): ``"example"`` when the first record decodes as an
  Example with at least one feature, else ``"bytes"``.

The ``array-record`` reader opens paths, not Python file objects: a remote
source (``s3://``, ``gs://``, ``http(s)://``) is copied, one file at a time, to
a temporary local file in the writer process, and removed after.

Options:
    records: ``"auto"``, ``"example"`` or ``"bytes"`` (see above).
    range_records: records per item when a file is cut (default 65536).
    infer_records: records inference reads (default 64).
    max_record_bytes: a record longer than this is refused by name (default 2 GiB).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from recordkit import Bytes, DecodeLimits, Schema
from recordkit._deps import install_command
from recordkit.codec import decode_example
from recordkit.errors import CorruptRecordError, MissingDependencyError
from recordkit.format import DEFAULT_MAX_RECORD_BYTES
from recordkit.storage import strip_file_scheme

from .base import Item, Source, SourceError, SourceNotFoundError

__all__ = ["ArrayRecordSource"]

_MODES = ("auto", "example", "bytes")
_BYTES_SCHEMA = Schema(record=Bytes())


def _module() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as exc:
        raise MissingDependencyError(
            "'array-record' is required for the arrayrecord converter but is not installed: "
            + install_command("arrayrecord")
        ) from exc
    return array_record_module


def _is_array_record(rel: str) -> bool:
    base = rel.rsplit("/", 1)[-1].lower()
    return base.endswith(".array_record") or ".array_record-" in base


def _failed(key: str, exc: Exception) -> SourceError:
    return SourceError(f"{key}: array_record: {' '.join(str(exc).split())}")


class ArrayRecordSource(Source):
    """ArrayRecord files (Grain, tensorflow-datasets' ``array_record`` format)."""

    name: ClassVar[str] = "arrayrecord"
    suffixes: ClassVar[tuple[str, ...]] = (".array_record",)

    @classmethod
    def claims(cls, rel: str) -> bool:
        """``*.array_record`` and sharded ``*.array_record-00000-of-00010``."""
        return ".array_record" in rel.rsplit("/", 1)[-1].lower()

    defaults: ClassVar[Mapping[str, Any]] = {
        "records": "auto",
        "range_records": 65536,
        "infer_records": 64,
        "max_record_bytes": DEFAULT_MAX_RECORD_BYTES,
    }

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.check_choice("records", _MODES)
        if int(self.options["range_records"]) < 1:
            raise ValueError(
                f"arrayrecord: range_records must be >= 1, got {self.options['range_records']!r}"
            )
        self.mode: str | None = None  # "example" or "bytes", once planned

    @contextlib.contextmanager
    def _local(self, rel: str) -> Iterator[str]:
        """A local path of the file ``rel`` (a temporary copy of a remote one)."""
        self.check_inside(rel)
        if not self.location.remote:
            root = strip_file_scheme(self.location.url)
            yield os.path.join(root, rel) if rel else root
            return
        with tempfile.TemporaryDirectory(prefix="recordkit-arrayrecord-") as tmp:
            path = os.path.join(tmp, "file.array_record")
            with self.location.open(rel, block_size=8 << 20) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
            yield path

    @contextlib.contextmanager
    def _reader(self, rel: str, key: str) -> Iterator[Any]:
        module = _module()
        with self._local(rel) as path:
            try:
                reader = module.ArrayRecordReader(path)
            except (RuntimeError, ValueError) as exc:
                raise _failed(key, exc) from exc
            failed = True
            try:
                yield reader
                failed = False
            except (RuntimeError, ValueError) as exc:
                raise _failed(key, exc) from exc
            finally:
                try:
                    reader.close()
                except (RuntimeError, ValueError) as exc:
                    # (the reader repeats a read's failure here: the first one is raised)
                    if not failed:
                        raise _failed(key, exc) from exc

    def list_items(self) -> list[Item]:
        _module()
        files = self.matching_files(_is_array_record, ".array_record")
        step = int(self.options["range_records"])
        items = []
        for rel, size in files:
            key = self.item_key(rel)
            with self._reader(rel, key) as reader:
                count = int(reader.num_records())
            if count <= step:
                items.append(Item(key, size, (rel, 0, count)))
                continue
            for start in range(0, count, step):
                stop = min(count, start + step)
                part = max(1, size * (stop - start) // count)
                items.append(Item(f"{key}[{start}:{stop}]", part, (rel, start, stop)))
        return items

    def _records(self, item: Item, limit: int | None = None) -> Iterator[bytes]:
        rel, start, stop = item.ref
        if limit is not None:
            stop = min(stop, start + limit)
        most = int(self.options["max_record_bytes"])
        with self._reader(rel, item.key) as reader:
            for lo in range(start, stop, 1024):  # in runs: the reader reads ahead within one
                hi = min(stop, lo + 1024)
                for i, record in enumerate(reader.read(lo, hi)):
                    if len(record) > most:
                        raise SourceError(
                            f"{item.key}: record {lo + i} is {len(record)} bytes, over the limit "
                            f"of {most} (option max_record_bytes)"
                        )
                    yield record

    def _mode(self, items: Sequence[Item]) -> str:
        mode = str(self.options["records"])
        if mode != "auto":
            return mode
        first = next((r for item in items for r in self._records(item, 1)), None)
        if first is None:
            return "bytes"
        try:
            return "example" if decode_example(first) else "bytes"
        except CorruptRecordError:
            return "bytes"

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        self.mode = self._mode(items)
        if self.mode == "bytes":
            return _BYTES_SCHEMA
        limit = int(self.options["infer_records"])
        examples: list[dict[str, Any]] = []
        where: list[str] = []
        for item in items:
            for i, record in enumerate(self._records(item, limit - len(examples))):
                try:
                    examples.append(decode_example(record))
                except CorruptRecordError as exc:
                    raise SourceError(
                        f"{item.key}: record {item.ref[1] + i} is not a tf.train.Example ({exc}); "
                        "convert with -o records=bytes to keep each record whole"
                    ) from None
                where.append(f"{item.key}:record {item.ref[1] + i}")
            if len(examples) >= limit:
                break
        if not examples:
            raise SourceNotFoundError(f"arrayrecord: no records in {self.location.url}")
        notes: list[str] = []
        schema = Schema.infer(examples, where=where, notes=notes)
        for note in notes:  # said by `recordkit convert` as its own lines
            logging.getLogger("recordkit.conversion.infer").info("%s", note)
        return schema

    def resolve_schema(self, items: Sequence[Item]) -> Schema:
        if self.schema is None:
            return self.infer_schema(items)
        self.mode = "bytes" if self.schema == _BYTES_SCHEMA else "example"
        return self.schema

    def metadata(self, items: Sequence[Item]) -> dict[str, Any]:
        return {"arrayrecord": {"records": self.mode}}

    def records(self, item: Item, schema: Schema) -> Iterator[bytes]:
        if self.mode == "bytes" or (self.mode is None and schema == _BYTES_SCHEMA):
            for record in self._records(item):
                yield _BYTES_SCHEMA.encode({"record": record})
            return
        limits = DecodeLimits()
        for i, record in enumerate(self._records(item)):
            try:
                schema.decode(record, limits=limits)
            except CorruptRecordError as exc:
                raise SourceError(f"{item.key}: record {item.ref[1] + i}: {exc}") from None
            yield record
