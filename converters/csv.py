"""``csv``: comma-separated files with a header row; columns become features.

Options:
    delimiter: the field separator (default ``","``; ``"\\t"`` for TSV).
    infer_rows: how many leading rows type inference looks at (default 1000).
    columns, drop, fill, nulls: which columns to convert and what nulls become
        (see :class:`converters._tabular.TabularOptions`). In a CSV file a null
        is an empty cell in a number, list or tensor column (or in a text
        column named in ``fill``); in a text column an empty cell is the empty
        string.

Inferred types: a column whose cells all parse as integers -> ``Int64``, as
numbers -> ``Float32``, anything else -> ``Bytes`` (UTF-8); empty cells do not
decide a type. With a schema, list
and tensor columns are read from JSON arrays in the cell (``"[1, 2, 3]"``).
Files are read whole (a quoted field may hold a newline, so a file cannot be cut
at arbitrary bytes); many files convert in parallel.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from recordkit import Schema
from recordkit.errors import RecordkitError

from ._inference import infer_columns
from ._tabular import (
    TABULAR_OPTIONS,
    SkipCount,
    TabularSource,
    files_as_items,
    open_text,
    shape_row,
)
from .base import Item, SourceError, source_errors

__all__ = ["CsvSource"]


class CsvSource(TabularSource):
    """CSV/TSV files (``*.csv``, ``*.tsv``, optionally ``.gz``) with a header -> records."""

    name: ClassVar[str] = "csv"
    defaults: ClassVar[Mapping[str, Any]] = {
        "delimiter": ",",
        "infer_rows": 1000,
        **TABULAR_OPTIONS,
    }
    suffixes: ClassVar[tuple[str, ...]] = (".csv", ".tsv", ".csv.gz", ".tsv.gz")

    def list_items(self) -> list[Item]:
        return files_as_items(self, self.suffixes)

    def _rows(self, item: Item) -> Iterator[tuple[int, dict[str, str]]]:
        rel = item.ref[0]
        with source_errors(item.key), open_text(self.location, rel) as f:
            reader = csv.DictReader(f, delimiter=str(self.options["delimiter"]), strict=True)
            try:
                for row in reader:
                    if None in row or None in row.values():
                        raise SourceError(
                            f"{item.key}: line {reader.line_num}: "
                            f"{len(reader.fieldnames or [])} columns in the header, "
                            "a different number in this row"
                        )
                    yield reader.line_num, row
            except csv.Error as exc:
                raise SourceError(f"{item.key}: line {reader.line_num}: {exc}") from exc

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        limit = int(self.options["infer_rows"])
        rows = itertools.islice((r for it in items for _, r in self._rows(it)), limit)
        where = items[0].key if items else self.location.url
        return infer_columns(rows, where=where, strings=True, opts=self.tabular)

    def shaped(self, item: Item, schema: Schema, skips: SkipCount) -> Iterator[Mapping[str, Any]]:
        opts = self.tabular
        for line, row in self._rows(item):
            where = f"{item.key}: line {line}"
            try:
                sample = shape_row(row, schema, opts, where=where, text=True)
            except RecordkitError:
                raise
            except ValueError as exc:  # a cell that does not parse as its column's type
                raise SourceError(f"{where}: {exc}") from exc
            if sample is None:
                skips.rows += 1
            else:
                yield sample
