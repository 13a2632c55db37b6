"""``parquet``: Parquet files through pyarrow (recordkit's ``parquet`` extra).

One item per row group, so large files convert in parallel. Columns become
features: integers and bools -> ``Int64``, floats -> ``Float32``, strings and
binary -> ``Bytes``, lists of those -> ``(None,)`` lists (``(n,)`` for
fixed-size lists). Give a schema for anything else, or for exact float64
(``Tensor("float64", ())``).

Options:
    columns, drop, fill, nulls: which columns to convert (only those are
        read) and what nulls become (see
        :class:`converters._tabular.TabularOptions`). A null is an Arrow null;
        a list holding nulls is refused (``nulls="skip"`` leaves its row out).
        With a schema, the schema's features are the columns read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit._deps import require
from recordkit.errors import SchemaError

from ._tabular import (
    TABULAR_OPTIONS,
    SkipCount,
    TabularSource,
    null_hint,
    plural,
    zero_value,
)
from .base import Item, SourceError, source_errors

__all__ = ["ParquetSource"]


def _pyarrow() -> Any:
    """pyarrow, with ``pa.compute`` and ``pa.parquet`` imported."""
    for module in ("pyarrow.compute", "pyarrow.parquet", "pyarrow"):
        pa = require(module, extra="parquet", what="the parquet converter")
    return pa


def _feature(name: str, t: Any) -> Any:
    pa = _pyarrow()
    types = pa.types
    if types.is_integer(t) or types.is_boolean(t):
        return Int64()
    if types.is_floating(t):
        return Float32()
    if types.is_string(t) or types.is_large_string(t) or types.is_binary(t):
        return Bytes()
    if types.is_large_binary(t) or types.is_fixed_size_binary(t):
        return Bytes()
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        shape = (t.list_size,) if types.is_fixed_size_list(t) else (None,)
        inner = _feature(name, t.value_type)
        if isinstance(inner, Tensor) or inner.shape:
            raise SchemaError(f"column {name!r}: nested lists ({t}); give a schema")
        return type(inner)(shape)
    raise SchemaError(f"column {name!r}: arrow type {t} has no inferred feature; give a schema")


class ParquetSource(TabularSource):
    """Parquet files (``*.parquet``, ``*.pq``) -> records, one item per row group."""

    name: ClassVar[str] = "parquet"
    defaults: ClassVar[Mapping[str, Any]] = {**TABULAR_OPTIONS}
    suffixes: ClassVar[tuple[str, ...]] = (".parquet", ".pq")

    @contextlib.contextmanager
    def _file(self, rel: str, where: str) -> Iterator[Any]:
        pq = _pyarrow().parquet
        # pyarrow's complaints (a cut-off footer, a bad page) become one-line
        # SourceErrors naming the file or row group, raised from the body too.
        with source_errors(where), self.location.open(rel, block_size=8 << 20) as f:
            yield pq.ParquetFile(f)

    def list_items(self) -> list[Item]:
        _pyarrow()
        files = self.matching_files(lambda r: r.lower().endswith(self.suffixes), ".parquet")
        items = []
        for rel, _ in files:
            key = self.item_key(rel)
            with self._file(rel, key) as pf:
                meta = pf.metadata
            for rg in range(meta.num_row_groups):
                size = meta.row_group(rg).total_byte_size
                items.append(Item(f"{key}#rowgroup{rg}", int(size), (rel, rg)))
        return items

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        if not items:
            raise SchemaError(f"parquet: {self.location.url} has no row groups; give a schema")
        with self._file(items[0].ref[0], items[0].key) as pf:
            arrow = pf.schema_arrow
        kept = self.tabular.select(arrow.names, items[0].key)
        return Schema({name: _feature(name, arrow.field(name).type) for name in kept})

    def shaped(self, item: Item, schema: Schema, skips: SkipCount) -> Iterator[Mapping[str, Any]]:
        rel, rg = item.ref
        names = list(schema.features)
        with self._file(rel, item.key) as pf:
            missing = sorted(set(names) - set(pf.schema_arrow.names))
            if missing:
                raise SourceError(f"{item.key}: columns {missing} are not in the file")
            table = pf.read_row_group(rg, columns=names)
        opts = self.tabular
        skip = np.zeros(table.num_rows, dtype=bool)
        columns = {}
        for name in names:
            column = table.column(name)
            values = column.to_pylist()
            ftype = schema[name]
            if column.null_count:
                nulls = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                if name in opts.fill or opts.nulls == "fill":
                    value = opts.fill[name] if name in opts.fill else zero_value(ftype)
                    values = [value if v is None else v for v in values]
                elif opts.nulls == "skip":
                    skip |= nulls
                else:
                    first = int(np.flatnonzero(nulls)[0])
                    raise SourceError(
                        f"{item.key}: column {name!r} holds {plural(column.null_count, 'null')} "
                        f"(the first in row {first} of the row group); {null_hint(name)}"
                    )
            inner = _inner_nulls(column)
            if inner is not None:
                if opts.nulls != "skip":
                    first = int(np.flatnonzero(inner)[0])
                    raise SourceError(
                        f"{item.key}: column {name!r}: the list in row {first} of the row group "
                        "holds nulls, which a fill cannot replace; nulls='skip' (-o nulls=skip) "
                        f"leaves such rows out, drop=[{name!r}] the column"
                    )
                skip |= inner
            if isinstance(ftype, Tensor):
                values = [v if v is None else np.asarray(v, dtype=ftype.dtype) for v in values]
            columns[name] = values
        skips.rows += int(skip.sum())
        keep = np.flatnonzero(~skip).tolist() if skip.any() else range(table.num_rows)
        for i in keep:
            yield {name: columns[name][i] for name in names}


def _inner_nulls(column: Any) -> np.ndarray | None:
    """For a list column: the rows whose list holds a null element (``None``: no such row)."""
    pa = _pyarrow()
    types = pa.types
    t = column.type
    if not (types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t)):
        return None
    flat = pa.chunked_array([c.flatten() for c in column.chunks], type=t.value_type)
    if not flat.null_count:
        return None
    pc = pa.compute
    # The row of each element: its list's index, from the lists' lengths.
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0).to_numpy(), dtype=np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    bad = np.zeros(len(lengths), dtype=bool)
    bad[rows[np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)]] = True
    return bad
