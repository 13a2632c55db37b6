"""``parquet``: Parquet files through pyarrow (recordkit's ``parquet`` extra).

One item per row group, so large files convert in parallel. Columns become
features: integers and bools -> ``Int64``, floats -> ``Float32``, strings and
binary -> ``Bytes``, lists of those -> ``(None,)`` lists (``(n,)`` for
fixed-size lists). Give a schema for anything else, or for exact float64
(``Tensor("float64", ())``). Nulls are refused, naming the column and row group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit._deps import install_command
from recordkit.errors import MissingDependencyError, SchemaError

from .base import Item, Source, SourceError, source_errors

__all__ = ["ParquetSource"]


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # registers pa.parquet
    except ImportError as exc:
        raise MissingDependencyError(
            "'pyarrow' is required for the parquet converter but is not installed: "
            + install_command("parquet")
        ) from exc
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


class ParquetSource(Source):
    """Parquet files (``*.parquet``, ``*.pq``) -> records, one item per row group."""

    name: ClassVar[str] = "parquet"
    defaults: ClassVar[Mapping[str, Any]] = {}
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
        return Schema({f.name: _feature(f.name, f.type) for f in arrow})

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        rel, rg = item.ref
        with self._file(rel, item.key) as pf:
            table = pf.read_row_group(rg)
        names = list(schema.features)
        missing = sorted(set(names) - set(table.column_names))
        if missing:
            raise SourceError(f"{item.key}: columns {missing} are not in the file")
        columns = {}
        for name in names:
            column = table.column(name)
            if column.null_count:
                raise SourceError(f"{item.key}: column {name!r} holds {column.null_count} nulls")
            values = column.to_pylist()
            feature = schema[name]
            if isinstance(feature, Tensor):
                values = [np.asarray(v, dtype=feature.dtype) for v in values]
            columns[name] = values
        for i in range(table.num_rows):
            yield {name: columns[name][i] for name in names}
