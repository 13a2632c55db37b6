"""``numpy``: ``.npy`` / ``.npz`` arrays split along their first axis, one record per row.

Layouts:

- a directory of ``.npy`` files: each file is a feature named after it
  (``images.npy``, ``labels.npy``), all with the same number of rows;
- one ``.npy`` file: a single feature named after it;
- one ``.npz`` file or a directory of them: each archive's arrays are the
  features (the same names in every archive), rows concatenated in file order.

Arrays are read by row range straight from the file (remote files by ranged
reads), never loaded whole, and never with ``allow_pickle``: object arrays are
refused. Fortran-ordered arrays are refused too (they cannot be read by rows).

Options:
    item_bytes: target bytes per item (a row range), default 16 MiB.

Types: integer rows of shape ``()`` -> ``Int64``, float32 scalars -> ``Float32``,
anything else -> ``Tensor(dtype, row shape)`` (exact dtype, compressible with
``compress="zstd"``).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, ClassVar

import numpy as np

from recordkit import Float32, Int64, Schema, Tensor
from recordkit.format import DEFAULT_MAX_RECORD_BYTES

from .base import Item, Source, SourceError, SourceNotFoundError, source_errors

__all__ = ["NumpySource"]


@dataclass(frozen=True)
class _Header:
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int  # where the data starts in the (member) file

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


def _read_header(f: IO[bytes], where: str) -> _Header:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
    except ValueError as exc:
        raise SourceError(f"{where}: not a .npy array: {exc}") from exc
    if dtype.hasobject:
        raise SourceError(f"{where}: object arrays need pickle, which recordkit never loads")
    if fortran and len(shape) > 1:
        raise SourceError(f"{where}: Fortran-ordered array; save it C-ordered to convert by rows")
    if not shape:
        raise SourceError(f"{where}: a 0-d array has no rows to split")
    header = _Header(tuple(shape), dtype, f.tell())
    if header.row_bytes > DEFAULT_MAX_RECORD_BYTES:  # one row is one record
        raise SourceError(
            f"{where}: rows of shape {shape[1:]} are {header.row_bytes} bytes, over the record "
            f"limit of {DEFAULT_MAX_RECORD_BYTES}; refused before reading one"
        )
    return header


def _read_rows(f: IO[bytes], header: _Header, start: int, stop: int) -> np.ndarray:
    f.seek(header.offset + start * header.row_bytes)
    want = (stop - start) * header.row_bytes
    data = f.read(want)
    if len(data) != want:
        raise SourceError(f"array file is truncated: wanted {want} bytes at row {start}")
    rows = np.frombuffer(data, dtype=header.dtype).reshape((stop - start, *header.shape[1:]))
    return rows.astype(header.dtype.newbyteorder("<"), copy=False)


class NumpySource(Source):
    """NumPy ``.npy`` / ``.npz`` files -> one record per row."""

    name: ClassVar[str] = "numpy"
    defaults: ClassVar[Mapping[str, Any]] = {"item_bytes": 16 << 20}
    suffixes: ClassVar[tuple[str, ...]] = (".npy", ".npz")

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        # Found by list_items in the parent; travels with the source to the workers.
        self._headers: dict[str, dict[str, _Header]] = {}
        self._columns = False
        self._npy_files: dict[str, str] = {}

    def _npz_headers(self, rel: str) -> dict[str, _Header]:
        with source_errors(rel), self.location.open(rel) as f, zipfile.ZipFile(f) as zf:
            out = {}
            for member in zf.namelist():
                if not member.endswith(".npy"):
                    continue
                with zf.open(member) as m:
                    out[member[: -len(".npy")]] = _read_header(m, f"{rel}:{member}")
            return out

    def list_items(self) -> list[Item]:
        self.check_exists()
        entries = self.walk()
        npy = [r for r, _ in entries if r.endswith(".npy")]
        npz = [r for r, _ in entries if r.endswith(".npz")]
        if entries and entries[0][0] == "":  # a single file
            url = self.location.url
            stem = url.rstrip("/").rsplit("/", 1)[-1]
            if url.endswith(".npz"):
                npz = [""]
            else:
                npy = [""]
        if npy and npz:
            raise SourceError(f"numpy: {self.location.url} mixes .npy and .npz files")
        if not npy and not npz:
            raise SourceNotFoundError(f"numpy: no .npy or .npz files under {self.location.url}")
        if npy:
            self._columns = True
            headers = {}
            for rel in npy:
                name = (rel or stem).rsplit("/", 1)[-1][: -len(".npy")]
                with self.location.open(rel) as f:
                    headers[name] = _read_header(f, rel or self.location.url)
                self._npy_files[name] = rel
            self._headers = {"": headers}
        else:
            self._headers = {rel: self._npz_headers(rel) for rel in npz}
        items = []
        names = None
        for rel, headers in self._headers.items():
            where = rel or self.location.url
            if names is None:
                names = list(headers)
            elif sorted(headers) != sorted(names):
                raise SourceError(f"numpy: {where} holds {sorted(headers)}, not {sorted(names)}")
            rows = {h.shape[0] for h in headers.values()}
            if len(rows) != 1:
                raise SourceError(f"numpy: {where}: arrays differ in rows: {sorted(rows)}")
            n = rows.pop()
            row_bytes = max(1, sum(h.row_bytes for h in headers.values()))
            # Even row ranges of at most item_bytes (no sliver of a few rows at the end).
            pieces = max(1, -(-n * row_bytes // int(self.options["item_bytes"])))
            step = max(1, -(-n // pieces))
            for start in range(0, n, step):
                stop = min(n, start + step)
                key = f"{where if rel else 'arrays'}[{start}:{stop}]"
                items.append(Item(key, (stop - start) * row_bytes, (rel, start, stop)))
        return items

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        headers = next(iter(self._headers.values()))
        features: dict[str, Any] = {}
        for name, h in headers.items():
            row_shape = h.shape[1:]
            if not row_shape and h.dtype.kind in "iu" and h.dtype != np.uint64:
                features[name] = Int64()
            elif not row_shape and h.dtype == np.float32:
                features[name] = Float32()
            else:
                features[name] = Tensor(h.dtype.newbyteorder("<").name, row_shape)
        return Schema(features)

    def _chunk(self, rel: str, start: int, stop: int) -> dict[str, np.ndarray]:
        headers = self._headers[rel]
        out = {}
        if self._columns:
            for name, h in headers.items():
                with self.location.open(self._npy_files[name], block_size=4 << 20) as f:
                    out[name] = _read_rows(f, h, start, stop)
            return out
        with (
            source_errors(rel),
            self.location.open(rel, block_size=4 << 20) as f,
            zipfile.ZipFile(f) as zf,
        ):
            for name, h in headers.items():
                with zf.open(name + ".npy") as m:
                    out[name] = _read_rows(m, h, start, stop)
        return out

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        rel, start, stop = item.ref
        try:
            chunk = self._chunk(rel, start, stop)
        except SourceError as exc:
            raise SourceError(f"{item.key}: {exc}") from exc
        names = list(schema.features)
        missing = sorted(set(names) - set(chunk))
        if missing:
            raise SourceError(f"{item.key}: the schema names {missing}, not in the arrays")
        for i in range(stop - start):
            yield {name: chunk[name][i] for name in names}
