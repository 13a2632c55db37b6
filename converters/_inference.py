"""Inferring a schema from rows of JSON values or CSV text cells, and :class:`RowsSource`,
what the JSON Lines and CSV converters build on.

Every value sampled is kept as written: a column of numbers written with leading zeros
("00001": a zip code, an id) stays text, and a float column that ``float32`` cannot
give back as written is ``Tensor("float64", ())``. Each such decision is said on the
``recordkit.conversion.infer`` logger, which ``recordkit convert`` shows as its own lines.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit.errors import RecordkitError, SchemaError

from ._tabular import SkipCount, TabularOptions, TabularSource, null_hint, plural, shape_row
from .base import Item, SourceError

__all__ = ["RowsSource", "infer_columns"]

# What inference decided to keep every value: said by `recordkit convert` as its own lines.
said = logging.getLogger("recordkit.conversion.infer")


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


def infer_columns(
    rows: Iterable[Mapping[str, Any]],
    *,
    where: str,
    strings: bool,
    opts: TabularOptions | None = None,
) -> Schema:
    """A schema for rows of JSON values, or (``strings``) of CSV text cells.

    JSON: ints and bools -> ``Int64``, any float -> ``Float32``, strings and
    objects (stored as JSON text) -> ``Bytes``, lists -> list shapes. CSV: a
    column whose cells all parse as ints -> ``Int64``, as numbers -> ``Float32``,
    otherwise ``Bytes``. Only the columns ``opts`` keeps are looked at. Nulls
    (``None``, a missing key, an empty CSV cell in a number column) do not
    decide a type; a column with nulls is refused here, naming the options that
    fix it, unless ``opts`` says what to do with them.
    """
    opts = opts or TabularOptions()
    columns: dict[str, list[Any]] = {}
    count = 0
    for count, row in enumerate(rows, 1):  # noqa: B007 (count is used after the loop)
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
    if not count:
        raise SchemaError(f"{where}: no rows to infer a schema from; give a schema")
    features: dict[str, Any] = {}
    for name in opts.select(list(columns), where):
        values = columns[name]
        nulls = count - len(values)  # rows without the key
        if strings:
            cells = [v for v in values if v != ""]
            kinds = {_text_kind(v) for v in cells}
            if (cells and kinds <= {"int", "float"}) or name in opts.fill:
                nulls += len(values) - len(cells)  # empty cells: nulls, not empty strings
                values = cells
            elif len(cells) < len(values):
                kinds.add("str")  # in a text column an empty cell is the empty string
        else:
            present = [v for v in values if v is not None]
            nulls += len(values) - len(present)
            values = present
            kinds = {_kind(v) for v in values}
        if not values and name in opts.fill:
            values, kinds = [opts.fill[name]], {_kind(opts.fill[name])}
        if not values:
            raise SchemaError(
                f"{where}: column {name!r} is null in all of the first {count} rows, so its "
                f"type is unknown; give a schema, fill={{{name!r}: <value>}} or drop=[{name!r}]"
            )
        if nulls and opts.nulls == "error" and name not in opts.fill:
            raise SchemaError(
                f"{where}: column {name!r} holds {plural(nulls, 'null')} in the first "
                f"{count} rows; {null_hint(name)}"
            )
        if strings and "str" in kinds and values and _leading_zero(values):
            cell = next(v for v in values if _LEADING_ZERO.match(v))
            said.info(
                "column %r: text, not a number: it holds %r, whose leading zero a number "
                "would lose",
                name,
                cell,
            )
        if not kinds or kinds <= {"int"}:
            features[name] = Int64()
        elif kinds <= {"int", "float"}:
            lossy = _float32_loses(values, strings)
            if lossy is None:
                features[name] = Float32()
            else:  # float32 would change values as written: every value kept, in float64
                features[name] = Tensor("float64", ())
                said.info(
                    "column %r: float64, not float32: float32 would read %r back as %s",
                    name,
                    lossy,
                    np.format_float_positional(np.float32(float(lossy)), trim="-"),
                )
        elif kinds == {"list"}:
            features[name] = _infer_list(name, values)
        else:
            features[name] = Bytes()
    return Schema(features)


# A number written with a leading zero ("00001", "-07"): a code (zip, id), kept as text.
_LEADING_ZERO = re.compile(r"^[+-]?0\d")


def _leading_zero(cells: Iterable[Any]) -> bool:
    """Whether the cells would all be numbers but for leading zeros."""
    found = False
    for c in cells:
        if _LEADING_ZERO.match(c):
            found = True
            c = c.lstrip("+-").lstrip("0") or "0"
        try:
            float(c)
        except ValueError:
            return False
    return found


def _float32_loses(values: Iterable[Any], strings: bool) -> Any:
    """The first value float32 would not give back as written (``None``: it holds all).

    "Holds" means float32's shortest decimal is the same number: 19.99 and 0.1 are
    held (they read back as written); 1795895263.5 is not (1.7958953e+09).
    """
    for v in values:
        x = float(v)
        if np.isfinite(x) and float(str(np.float32(x))) != x:
            return v if strings else x
    return None


def _text_kind(cell: str) -> str:
    if _LEADING_ZERO.match(cell):
        return "str"
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


class RowsSource(TabularSource):
    """Files of rows read as mappings (JSON Lines, CSV): the schema inferred from the
    leading ``infer_rows`` rows, each row shaped by :func:`shape_row`. Subclasses list
    their files (:func:`files_as_items`) and yield the rows from :meth:`rows`."""

    #: whether the cells are text to parse (CSV) rather than JSON values
    text: ClassVar[bool] = False

    def rows(self, item: Item) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """``(where in the item, row)`` for each row of ``item``."""
        raise NotImplementedError

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        limit = int(self.options["infer_rows"])
        rows = itertools.islice((r for it in items for _, r in self.rows(it)), limit)
        where = items[0].key if items else self.location.url
        return infer_columns(rows, where=where, strings=self.text, opts=self.tabular)

    def shaped(self, item: Item, schema: Schema, skips: SkipCount) -> Iterator[Mapping[str, Any]]:
        for at, row in self.rows(item):
            where = f"{item.key}: {at}"
            try:
                sample = shape_row(row, schema, self.tabular, where=where, text=self.text)
            except RecordkitError:
                raise
            except ValueError as exc:  # a cell that does not parse as its column's type
                raise SourceError(f"{where}: {exc}") from exc
            if sample is None:
                skips.rows += 1
            else:
                yield sample
