"""Shared by the tabular converters (jsonl, csv, parquet): column options, nulls, inference.

:class:`TabularOptions` is what ``columns=``, ``drop=``, ``fill=`` and ``nulls=``
mean, and :class:`TabularSource` applies them for all three converters: the
columns kept (before inference, so a dropped column cannot stop it), what a null
becomes (an error that names the options that fix it, a skipped row, or a fill
value), and the count of skipped rows that the conversion's summary reports.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import io
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit.errors import OptionError, SchemaError
from recordkit.storage import Location

from .base import Item, Source, SourceError

__all__ = [
    "MISSING",
    "NULL_POLICIES",
    "TABULAR_OPTIONS",
    "Rows",
    "SkipCount",
    "TabularOptions",
    "TabularSource",
    "check_fill",
    "convert_value",
    "files_as_items",
    "null_hint",
    "open_text",
    "shape_row",
    "zero_value",
]

log = logging.getLogger(__name__)

#: What ``nulls=`` takes: a null in a column without a ``fill`` value is an error
#: (the default: data is never changed unasked), leaves its row out (counted), or
#: becomes the type's zero (``0``, ``0.0``, empty bytes, an empty list, zeros).
NULL_POLICIES = ("error", "skip", "fill")
#: The options every tabular converter takes, with their defaults.
# ``drop`` defaults to None (no column), not (): Source refuses a value of another kind
# than a list default, and ``-o drop=a,b`` (or ``drop="a,b"``) is a string.
TABULAR_OPTIONS: Mapping[str, Any] = {"columns": None, "drop": None, "fill": {}, "nulls": "error"}


class _Missing:
    """A key that a JSON row does not have (it counts as a null)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _names(option: str, value: Any) -> tuple[str, ...]:
    """Column names from a list, or a comma-separated string (``-o drop=a,b``)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise OptionError(f"{option} must be a list of column names (or 'a,b'), got {value!r}")
    if len(set(value)) != len(value):
        raise OptionError(f"{option} names a column twice: {list(value)}")
    return tuple(value)


def _jsonable(value: Any) -> Any:
    """A fill value in the manifest's JSON (bytes as base64: exact, any bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class TabularOptions:
    """The column options of the tabular converters, validated.

    Attributes:
        columns: keep only these columns (in this order); ``None``: all of them.
        drop: leave these columns out.
        fill: column -> the value its nulls become (a value of the column's
            type: ``0``, ``"n/a"``, ``[0.0, 0.0]``).
        nulls: a null in a column without a ``fill`` value: ``"error"``
            (default), ``"skip"`` (leave the row out; counted in the
            conversion's result) or ``"fill"`` (the type's zero, see
            :func:`zero_value`).
    """

    columns: tuple[str, ...] | None = None
    drop: tuple[str, ...] = ()
    fill: dict[str, Any] = field(default_factory=dict)
    nulls: str = "error"

    def __post_init__(self) -> None:
        if self.columns is not None:
            object.__setattr__(self, "columns", _names("columns", self.columns))
            if not self.columns:
                raise OptionError("columns is empty: name at least one column, or leave it out")
        object.__setattr__(self, "drop", _names("drop", self.drop))
        both = sorted(set(self.columns or ()) & set(self.drop))
        if both:
            raise OptionError(f"columns and drop both name {both}")
        fill = self.fill
        if isinstance(fill, str):  # -o fill=... that was not JSON
            raise OptionError(
                f"fill must be a mapping of column -> value (-o 'fill={{\"x\": 0}}'), got {fill!r}"
            )
        if not isinstance(fill, Mapping) or not all(isinstance(k, str) for k in fill):
            raise OptionError(f"fill must be a mapping of column name -> value, got {fill!r}")
        none = sorted(k for k, v in fill.items() if v is None)
        if none:
            raise OptionError(f"fill: the value for {none} is None; give one of the column's type")
        dropped = sorted(set(fill) & set(self.drop))
        if dropped:
            raise OptionError(f"fill names {dropped}, which drop leaves out")
        object.__setattr__(self, "fill", dict(fill))
        if self.nulls not in NULL_POLICIES:
            raise OptionError(f"nulls must be one of {NULL_POLICIES}, got {self.nulls!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> TabularOptions:
        """The options from a source's option dict (see :data:`TABULAR_OPTIONS`)."""
        drop = options["drop"]
        return cls(
            options["columns"], () if drop is None else drop, options["fill"], options["nulls"]
        )

    @property
    def default(self) -> bool:
        """Whether no column option was given (the output is what it always was)."""
        return self == TabularOptions()

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, for the manifest metadata and the plan fingerprint."""
        return {
            "columns": list(self.columns) if self.columns is not None else None,
            "drop": list(self.drop),
            "fill": {k: _jsonable(v) for k, v in sorted(self.fill.items())},
            "nulls": self.nulls,
        }

    def select(self, available: Sequence[str], where: str) -> list[str]:
        """The columns kept out of ``available``, in output order.

        Raises:
            SchemaError: ``columns`` or ``drop`` names a column that is not there.
        """
        unknown = [c for c in (*(self.columns or ()), *self.drop) if c not in available]
        if unknown:
            raise SchemaError(
                f"{where}: {'columns' if self.columns and unknown[0] in self.columns else 'drop'}"
                f" names {unknown}, not in the source; it has {list(available)}"
            )
        kept = [c for c in (self.columns or available) if c not in self.drop]
        if not kept:
            raise SchemaError(f"{where}: drop={list(self.drop)} leaves no column to convert")
        return kept

    def keeps(self, name: str) -> bool:
        """Whether a source column of this name is converted (not left out)."""
        return name not in self.drop and (self.columns is None or name in self.columns)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def null_hint(name: str) -> str:
    """What to pass to convert a column that holds nulls (both the Python and CLI spelling)."""
    return (
        f"to convert anyway, pass one of nulls='skip' (leave those rows out), nulls='fill' "
        f"(0 or empty), fill={{{name!r}: <value>}}, drop=[{name!r}] "
        f"(on the command line: -o nulls=skip, -o nulls=fill, -o 'fill={{\"{name}\": <value>}}', "
        f"-o drop={name})"
    )


def zero_value(ftype: Any) -> Any:
    """What ``nulls="fill"`` puts in place of a null: the type's zero, of its shape.

    ``0`` / ``0.0`` / ``b""`` for scalars, a list of those for a fixed length,
    an empty list for a variable one, zeros (``None`` dims empty) for a tensor.
    """
    if isinstance(ftype, Tensor):
        return np.zeros(tuple(d or 0 for d in ftype.shape), dtype=ftype.dtype)
    zero: Any = b"" if isinstance(ftype, Bytes) else 0.0 if isinstance(ftype, Float32) else 0
    if not ftype.shape:
        return zero
    if None in ftype.shape:
        return []
    return np.full(ftype.shape, zero).tolist() if zero != b"" else [zero] * ftype.shape[0]


class SkipCount:
    """The rows of one item a policy left out (read when the item is done)."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows = 0


class Rows(Iterator[bytes]):
    """An item's encoded records, and (``skipped``) the rows left out on the way.

    The conversion reads ``skipped`` once the iterator is exhausted and adds it
    to the partition's result, so the summary and the manifest report it.
    """

    def __init__(
        self, samples: Iterator[Mapping[str, Any]], schema: Schema, item: Item, skips: SkipCount
    ) -> None:
        self._samples = enumerate(samples)
        self._schema = schema
        self._item = item
        self._skips = skips

    @property
    def skipped(self) -> int:
        """Rows left out so far (all of them, once exhausted)."""
        return self._skips.rows

    def __iter__(self) -> Rows:
        return self

    def __next__(self) -> bytes:
        row, sample = next(self._samples)
        try:
            return self._schema.encode(sample)
        except SchemaError as exc:
            raise SchemaError(f"{self._item.key}: sample {row}: {exc}") from exc


class TabularSource(Source):
    """A source of rows with named columns: applies :class:`TabularOptions`.

    Subclasses put :data:`TABULAR_OPTIONS` into their ``defaults``, infer
    schemas of the columns ``self.tabular`` keeps, and yield samples from
    :meth:`shaped`, counting the rows they leave out in its ``skips``.
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.tabular = TabularOptions.from_options(self.options)

    def resolve_schema(self, items: Sequence[Item]) -> Schema:
        """The schema (given, or inferred from the kept columns); checks the options against it."""
        opts = self.tabular
        if self.schema is None:
            schema = self.infer_schema(items)
            check_fill(schema, opts, f"{self.name}: {items[0].key if items else self.location.url}")
            return schema
        where = f"{self.name}: the schema given"
        names = list(self.schema.names)
        in_schema = sorted(set(opts.drop) & set(names))
        if in_schema:
            raise SchemaError(f"{where} has {in_schema}, which drop leaves out")
        if opts.columns is not None and set(opts.columns) != set(names):
            raise SchemaError(
                f"{where} has {names}; columns={list(opts.columns)} differs (leave columns out "
                "with a schema: the schema's features are the columns converted)"
            )
        check_fill(self.schema, opts, where)
        return self.schema

    def metadata(self, items: Sequence[Item]) -> dict[str, Any]:
        # In the manifest, and so in the plan's fingerprint: a rerun with another
        # fill value or null policy is another dataset, never "already complete".
        return {} if self.tabular.default else {"tabular": self.tabular.to_json()}

    def shaped(self, item: Item, schema: Schema, skips: SkipCount) -> Iterator[Mapping[str, Any]]:
        """The item's samples with the options applied; count skipped rows in ``skips``."""
        raise NotImplementedError

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        return self.shaped(item, schema, SkipCount())

    def records(self, item: Item, schema: Schema) -> Rows:
        skips = SkipCount()
        return Rows(self.shaped(item, schema, skips), schema, item, skips)


def check_fill(schema: Schema, opts: TabularOptions, where: str) -> None:
    """Every ``fill`` value names a converted column and fits its type (else ``SchemaError``)."""
    unknown = sorted(set(opts.fill) - set(schema.names))
    if unknown:
        raise SchemaError(
            f"{where}: fill names {unknown}, not among the columns converted {list(schema.names)}"
        )
    for name, value in opts.fill.items():
        try:
            Schema({name: schema[name]}).encode({name: value})
        except SchemaError as exc:
            raise SchemaError(
                f"{where}: fill value {value!r} for column {name!r} does not fit "
                f"{schema[name]!r}: {exc}"
            ) from exc


def shape_row(
    row: Mapping[str, Any],
    schema: Schema,
    opts: TabularOptions,
    *,
    where: str,
    text: bool,
) -> dict[str, Any] | None:
    """One source row as a sample of ``schema``, or ``None`` when ``nulls="skip"`` drops it.

    A null is ``None``, a key the row lacks (JSON), or (``text``, CSV) an empty
    cell in a number, list or tensor column, or in a bytes column named in ``fill``.

    Raises:
        SchemaError: the row has columns the schema has not (naming ``drop``).
        SourceError: a null that no option covers (naming the options that do).
    """
    features = schema.features
    extra = [k for k in row if k not in features and opts.keeps(k)]
    if extra:
        missing = [k for k in features if k not in row]
        lacks = f"missing {missing}, " if missing else ""
        raise SchemaError(
            f"{where}: {lacks}unexpected {extra}: the schema has {list(features)}; "
            f"drop={extra} (-o drop={','.join(extra)}) leaves the unexpected out"
        )
    sample: dict[str, Any] = {}
    for name, ftype in features.items():
        value = row.get(name, MISSING)
        if (
            value is None
            or value is MISSING
            or (
                text
                and value == ""
                and (not isinstance(ftype, Bytes) or ftype.shape or name in opts.fill)
            )
        ):
            if name in opts.fill:
                sample[name] = opts.fill[name]
            elif opts.nulls == "skip":
                return None
            elif opts.nulls == "fill":
                sample[name] = zero_value(ftype)
            else:
                what = "missing" if value is MISSING else "empty" if value == "" else "null"
                raise SourceError(f"{where}: column {name!r} is {what}; {null_hint(name)}")
            continue
        try:
            sample[name] = convert_value(name, value, ftype, text=text)
        except (ValueError, TypeError) as exc:
            raise SourceError(
                f"{where}: column {name!r} is {_type_name(ftype)} in the schema, this row holds "
                f"{value!r} ({exc}); give a schema that fits every row, such as --schema "
                f"'{_schema_hint(schema, name)}' (schema= in Python), or drop=[{name!r}]"
            ) from None
    return sample


def _type_name(ftype: Any) -> str:
    if isinstance(ftype, Tensor):
        return f"{ftype.dtype}{list(ftype.shape) if ftype.shape else ''}"
    kind = {Int64: "int64", Float32: "float32", Bytes: "bytes"}.get(type(ftype), repr(ftype))
    return f"{kind}{list(ftype.shape) if getattr(ftype, 'shape', ()) else ''}"


def _schema_hint(schema: Schema, name: str) -> str:
    """The schema as ``--schema`` takes it, with ``name`` as bytes (text keeps anything)."""
    parts = (f"{n}:{'bytes' if n == name else _type_name(t)}" for n, t in schema.features.items())
    return ",".join(parts)


def files_as_items(
    source: Source, suffixes: Sequence[str], *, chunk_bytes: int | None = None
) -> list[Item]:
    """Items for the matching files under ``source`` (or the file itself), sorted
    (:meth:`~converters.base.Source.matching_files`).

    With ``chunk_bytes``, uncompressed files larger than that are cut into byte
    ranges (``ref = (rel, start, stop)``) read as whole lines; others are one
    item each (``ref = (rel, 0, None)``).
    """
    ends = tuple(suffixes)
    files = source.matching_files(lambda r: r.lower().endswith(ends), "/".join(suffixes))
    items = []
    for rel, size in files:
        key = source.item_key(rel)
        if chunk_bytes and size > chunk_bytes and not _is_gzip(source.location, rel):
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
