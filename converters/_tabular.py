"""Shared by the row-shaped converters (jsonl, csv): file discovery and type inference."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit.errors import SchemaError
from recordkit.storage import Location

from .base import Item, Source, SourceNotFoundError

__all__ = ["convert_value", "files_as_items", "infer_columns", "open_text"]


def files_as_items(
    source: Source, suffixes: Sequence[str], *, fmt: str, chunk_bytes: int | None = None
) -> list[Item]:
    """Items for the matching files under ``source`` (or the file itself), sorted.

    With ``chunk_bytes``, uncompressed files larger than that are cut into byte
    ranges (``ref = (rel, start, stop)``) read as whole lines; others are one
    item each (``ref = (rel, 0, None)``).
    """
    location = source.location
    entries = source.walk()  # symlinks out of the source refused here
    single = entries == [("", entries[0][1])] if entries else False
    ends = tuple(suffixes)
    files = entries if single else [(r, s) for r, s in entries if r.lower().endswith(ends)]
    if not files:
        raise SourceNotFoundError(f"{fmt}: no {'/'.join(suffixes)} files under {location.url}")
    items = []
    for rel, size in files:
        key = rel or location.url.rstrip("/").rsplit("/", 1)[-1]
        if (
            chunk_bytes
            and size > chunk_bytes
            and not rel.endswith(".gz")
            and not (single and location.url.endswith(".gz"))
        ):
            for start in range(0, size, chunk_bytes):
                stop = min(size, start + chunk_bytes)
                items.append(Item(f"{key}[{start}:{stop}]", stop - start, (rel, start, stop)))
        else:
            items.append(Item(key, size, (rel, 0, None)))
    return items


def _is_gzip(location: Location, rel: str) -> bool:
    return (rel or location.url).endswith(".gz")


@contextlib.contextmanager
def open_text(location: Location, rel: str) -> Iterator[io.TextIOWrapper]:
    """Open a text file (gunzipped when its name ends in ``.gz``), UTF-8, newlines kept.

    A context manager: the file underneath is closed too (``GzipFile`` leaves a
    file object it was given open, also when reading it fails).
    """
    with location.open(rel, block_size=4 << 20) as raw:
        stream: BinaryIO = raw
        if _is_gzip(location, rel):
            stream = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        with io.TextIOWrapper(stream, encoding="utf-8", newline="") as text:
            yield text


def byte_range_lines(location: Location, rel: str, start: int, stop: int) -> Iterator[bytes]:
    """The lines whose first byte lies in ``[start, stop)``: ranges tile a file exactly."""
    with location.open(rel, block_size=4 << 20) as f:
        if start > 0:
            f.seek(start - 1)
            f.readline()  # the line that began before start belongs to the previous range
        pos = f.tell()
        while pos < stop:
            line = f.readline()
            if not line:
                return
            pos += len(line)
            yield line


def _kind(value: Any) -> str:
    if isinstance(value, (bool, int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if value is None:
        return "null"
    return "json"


def _infer_list(name: str, values: list[Any]) -> Any:
    lengths = {len(v) for v in values}
    shape: tuple[int | None, ...] = (lengths.pop(),) if len(lengths) == 1 else (None,)
    kinds = {_kind(x) for v in values for x in v}
    if not kinds or kinds <= {"int"}:
        return Int64(shape)
    if kinds <= {"int", "float"}:
        return Float32(shape)
    if kinds == {"str"}:
        return Bytes(shape)
    if kinds == {"list"}:
        arrays = [np.asarray(v) for v in values]
        if all(a.dtype.kind in "iub" for a in arrays):
            dtype = "int64"
        elif all(a.dtype.kind in "iubf" for a in arrays):
            dtype = "float32"
        else:
            raise SchemaError(f"column {name!r}: nested lists of {kinds}; give a schema")
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            return Tensor(dtype, (None,) * max(a.ndim for a in arrays))
        return Tensor(dtype, shapes.pop())
    raise SchemaError(f"column {name!r}: lists mixing {sorted(kinds)}; give a schema")


def infer_columns(rows: Iterable[Mapping[str, Any]], *, where: str, strings: bool) -> Schema:
    """A schema for rows of JSON values, or (``strings``) of CSV text cells.

    JSON: ints and bools -> ``Int64``, any float -> ``Float32``, strings and
    objects (stored as JSON text) -> ``Bytes``, lists -> list shapes. CSV: a
    column whose cells all parse as ints -> ``Int64``, as numbers -> ``Float32``,
    otherwise ``Bytes``.
    """
    columns: dict[str, list[Any]] = {}
    count = 0
    for count, row in enumerate(rows, 1):  # noqa: B007 (count is used after the loop)
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
    if not count:
        raise SchemaError(f"{where}: no rows to infer a schema from; give a schema")
    features: dict[str, Any] = {}
    for name, values in columns.items():
        if len(values) != count:
            raise SchemaError(
                f"{where}: column {name!r} is in {len(values)} of the first {count} rows; "
                "a schema needs it in every row"
            )
        kinds = {_kind(v) for v in values} if not strings else {_text_kind(v) for v in values}
        if "null" in kinds:
            raise SchemaError(f"{where}: column {name!r} holds nulls; give a schema or fill them")
        if kinds <= {"int"}:
            features[name] = Int64()
        elif kinds <= {"int", "float"}:
            features[name] = Float32()
        elif kinds == {"list"}:
            features[name] = _infer_list(name, values)
        else:
            features[name] = Bytes()
    return Schema(features)


def _text_kind(cell: str) -> str:
    try:
        int(cell)
        return "int"
    except ValueError:
        pass
    try:
        float(cell)
        return "float"
    except ValueError:
        return "str"


def convert_value(name: str, value: Any, ftype: Any, *, text: bool) -> Any:
    """Turn a JSON value (or, with ``text``, a CSV cell) into what ``ftype`` encodes."""
    if isinstance(ftype, Bytes):
        if ftype.shape:
            items = json.loads(value) if text else value
            return [x if isinstance(x, str) else json.dumps(x, sort_keys=True) for x in items]
        if isinstance(value, str):
            return value
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if not text:
        return int(value) if isinstance(value, bool) else value
    if not ftype.shape and isinstance(ftype, Int64):
        return int(value)
    if not ftype.shape and isinstance(ftype, Float32):
        return float(value)
    return json.loads(value)  # list and tensor cells hold JSON arrays
