"""``jsonl``: JSON Lines files, one object per line; keys become features.

Options:
    chunk_bytes: files larger than this are cut into byte ranges (whole lines
        each) that different partitions read in parallel; 64 MiB by default.
        Gzipped files (``*.gz``) are read whole.
    infer_rows: how many leading rows type inference looks at (default 1000).
    columns, drop, fill, nulls: which keys to convert and what nulls become
        (see :class:`converters._tabular.TabularOptions`). A JSON ``null`` and
        a key that a row does not have are both nulls.

Inferred types: ints and bools -> ``Int64``, floats -> ``Float32``, strings ->
``Bytes`` (UTF-8), objects -> ``Bytes`` holding their JSON text, lists of those
-> list shapes (``(n,)`` when every row has ``n``, else ``(None,)``), nested
numeric lists -> ``Tensor``. Give a schema for anything else (or for exact
float64: ``Tensor("float64", ())``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from ._inference import RowsSource
from ._tabular import TABULAR_OPTIONS, byte_range_lines, files_as_items, open_text
from .base import Item, SourceError, source_errors

__all__ = ["JsonlSource"]


class JsonlSource(RowsSource):
    """JSON Lines (``*.jsonl``, ``*.ndjson``, ``*.json``, optionally ``.gz``) -> records."""

    name: ClassVar[str] = "jsonl"
    defaults: ClassVar[Mapping[str, Any]] = {
        "chunk_bytes": 64 << 20,
        "infer_rows": 1000,
        **TABULAR_OPTIONS,
    }
    suffixes: ClassVar[tuple[str, ...]] = (
        ".jsonl",
        ".ndjson",
        ".json",
        ".jsonl.gz",
        ".ndjson.gz",
        ".json.gz",
    )

    def list_items(self) -> list[Item]:
        return files_as_items(self, self.suffixes, chunk_bytes=int(self.options["chunk_bytes"]))

    def _lines(self, item: Item) -> Iterator[tuple[str, bytes | str]]:
        rel, start, stop = item.ref
        if stop is None:
            with source_errors(item.key), open_text(self.location, rel) as f:
                for number, line in enumerate(f, 1):
                    yield f"line {number}", line
        else:
            for number, raw in enumerate(byte_range_lines(self.location, rel, start, stop)):
                yield f"line {number + 1} after byte {start}", raw

    def rows(self, item: Item) -> Iterator[tuple[str, dict[str, Any]]]:
        for where, line in self._lines(item):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise SourceError(f"{item.key}: {where}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise SourceError(f"{item.key}: {where}: expected a JSON object per line")
            yield where, row
