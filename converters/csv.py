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
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ._inference import RowsSource
from ._tabular import TABULAR_OPTIONS, files_as_items, open_text
from .base import Item, SourceError, source_errors

__all__ = ["CsvSource"]


class CsvSource(RowsSource):
    """CSV/TSV files (``*.csv``, ``*.tsv``, optionally ``.gz``) with a header -> records."""

    name: ClassVar[str] = "csv"
    defaults: ClassVar[Mapping[str, Any]] = {
        "delimiter": ",",
        "infer_rows": 1000,
        **TABULAR_OPTIONS,
    }
    suffixes: ClassVar[tuple[str, ...]] = (".csv", ".tsv", ".csv.gz", ".tsv.gz")
    text: ClassVar[bool] = True

    def list_items(self) -> list[Item]:
        return files_as_items(self, self.suffixes)

    def rows(self, item: Item) -> Iterator[tuple[str, dict[str, str]]]:
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
                    yield f"line {reader.line_num}", row
            except csv.Error as exc:
                raise SourceError(f"{item.key}: line {reader.line_num}: {exc}") from exc
