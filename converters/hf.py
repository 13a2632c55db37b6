"""``hf``: Hugging Face ``datasets`` saved with ``save_to_disk`` (recordkit's ``hf`` extra).

A saved ``Dataset`` is a folder of Arrow stream files (``data-00000-of-00002.arrow``)
with ``state.json`` (which files, in order) and ``dataset_info.json`` (the
features); a saved ``DatasetDict`` has ``dataset_dict.json`` and one such folder
per split. Read with pyarrow alone (``datasets`` is not needed); one item per
Arrow file. Features follow ``dataset_info.json``:

==============================================  ===========================================
``datasets`` feature                            recordkit feature
==============================================  ===========================================
``Value`` int8..int64, uint8..uint32, bool      ``Int64()``
``Value("float32")``                            ``Float32()``
``Value`` float16, float64, uint64              ``Tensor(dtype, ())`` (exact)
``Value`` string, binary                        ``Bytes()``
``ClassLabel``                                  ``Int64()``, its names in the manifest's metadata
``Image``                                       ``Bytes()``: the encoded image as stored
``Sequence``/``List`` of one of these           the same with a ``(None,)`` or ``(length,)`` dim
``Array2D`` .. ``Array5D``, nested lists        ``Tensor(dtype, shape)`` (``None`` where it varies)
nested ``dict`` (``Sequence`` of a ``dict``)    one feature per leaf, named ``outer/inner``
==============================================  ===========================================

A list dim becomes ``Int64``/``Float32`` where those hold it (one unknown dim at
most), else a ``Tensor`` keeping the dtype. Nulls, images stored as a path
only, ragged nested lists and other feature types (``Audio``, ``Video``,
``Translation``, ...) are refused by name (the column, and the file and row).
The manifest's metadata gets ``{"hf": {"split": ..., "class_names": {...},
"features": <dataset_info.json's>}}``.

Options:
    split: the split of a saved ``DatasetDict`` (needed when it has several;
        or give the split's folder).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit._deps import require
from recordkit.errors import SchemaError

from .base import Item, Source, SourceError, SourceNotFoundError, source_errors

__all__ = ["HFDatasetSource"]

_INTS = {f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)} | {"bool"}
_FLOATS = {"float16", "float32", "float64"}
_STRINGS = {"string", "large_string", "binary", "large_binary"}
_STAR = "*"  # a path step: every element of a list


def _pyarrow() -> Any:
    require("pyarrow.ipc", extra="hf", what="the hf converter")  # registers pa.ipc
    return require("pyarrow", extra="hf", what="the hf converter")


@dataclass(frozen=True, slots=True)
class _Leaf:
    """One feature: where its value is in a row, what it is, and its list dims."""

    name: str
    path: tuple[str, ...]
    kind: str  # "int", "float", "bytes", "image", "class_label"
    dtype: str
    dims: tuple[int | None, ...]
    names: tuple[str, ...] | None = None

    def feature(self) -> Any:
        dims = self.dims
        if self.kind in ("bytes", "image"):
            if len(dims) > 1:
                raise SchemaError(f"feature {self.name!r}: nested lists of {self.kind}")
            return Bytes(dims)
        if self.kind == "array" or dims.count(None) > 1:
            return Tensor(self.dtype, dims)
        if self.dtype in _INTS and self.dtype != "uint64":
            return Int64(dims)
        if self.dtype == "float32":
            return Float32(dims)
        return Tensor(self.dtype, dims)


def _leaves(
    node: Any, name: str, path: tuple[str, ...], dims: tuple[int | None, ...], out: list[_Leaf]
) -> None:
    """Flatten a ``dataset_info.json`` features node into ``out``."""
    if isinstance(node, Mapping) and "_type" not in node:
        for child, sub in node.items():
            _leaves(sub, f"{name}/{child}" if name else child, (*path, child), dims, out)
        return
    if isinstance(node, list):  # the older form of a list feature: [feature]
        _leaves(node[0], name, (*path, _STAR), (*dims, None), out)
        return
    kind = node.get("_type")
    if kind in ("Sequence", "List", "LargeList"):
        inner = node["feature"]
        length = node.get("length", -1)
        dim = None if length is None or int(length) < 0 else int(length)
        if isinstance(inner, Mapping) and "_type" not in inner and kind == "Sequence":
            # Sequence(dict) is stored as a dict of lists
            for child, sub in inner.items():
                wrapped = {"_type": "Sequence", "feature": sub, "length": length}
                _leaves(wrapped, f"{name}/{child}", (*path, child), dims, out)
            return
        _leaves(inner, name, (*path, _STAR), (*dims, dim), out)
        return
    if kind == "Value":
        dtype = str(node["dtype"])
        if dtype in _STRINGS:
            out.append(_Leaf(name, path, "bytes", dtype, dims))
        elif dtype in _INTS or dtype in _FLOATS:
            out.append(_Leaf(name, path, "int" if dtype in _INTS else "float", dtype, dims))
        else:
            raise SchemaError(f"feature {name!r}: Value({dtype!r}) has no recordkit type")
    elif kind == "ClassLabel":
        names = tuple(str(n) for n in node.get("names") or ())
        out.append(_Leaf(name, path, "class_label", "int64", dims, names or None))
    elif kind == "Image":
        out.append(_Leaf(name, path, "image", "bytes", dims))
    elif kind in ("Array2D", "Array3D", "Array4D", "Array5D"):
        shape = tuple(None if d is None else int(d) for d in node["shape"])
        dtype = str(node["dtype"])
        if dtype not in _INTS | _FLOATS:
            raise SchemaError(f"feature {name!r}: {kind} of {dtype}")
        out.append(_Leaf(name, path, "array", dtype, (*dims, *shape)))
    else:
        raise SchemaError(f"feature {name!r}: datasets {kind} is not supported")


def _get(row: Any, path: tuple[str, ...]) -> Any:
    for i, step in enumerate(path):
        if step == _STAR:
            return None if row is None else [_get(item, path[i + 1 :]) for item in row]
        row = None if row is None else row[step]
    return row


def _has_null(value: Any) -> bool:
    return value is None or (isinstance(value, list) and any(_has_null(v) for v in value))


class HFDatasetSource(Source):
    """Hugging Face ``datasets`` saved with ``save_to_disk`` (a ``Dataset`` or ``DatasetDict``)."""

    name: ClassVar[str] = "hf"
    # save_to_disk's Arrow files (``data-00000-of-00001.arrow``); its dataset_info.json
    # says nothing alone (a tensorflow-datasets folder holds one too), but goes with them.
    suffixes: ClassVar[tuple[str, ...]] = (".arrow",)
    companions: ClassVar[tuple[str, ...]] = ("dataset_info.json", "state.json", "dataset_dict.json")
    defaults: ClassVar[Mapping[str, Any]] = {"split": None}

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._folder: str | None = None  # the split's folder, relative to the source
        self._features: dict[str, Any] | None = None

    def _read_json(self, rel: str) -> Any:
        with source_errors(rel):
            return json.loads(self.location.read_bytes(rel))

    def _split_folder(self) -> str:
        if self._folder is None:
            self.check_exists()
            split = self.options["split"]
            if self.location.exists("dataset_dict.json"):
                splits = list(self._read_json("dataset_dict.json").get("splits") or [])
                if split is None and len(splits) == 1:
                    split = splits[0]
                if split is None:
                    raise SourceError(
                        f"hf: {self.location.url} is a saved DatasetDict with the splits "
                        f"{', '.join(splits)}: choose one with -o split=NAME"
                    )
                if split not in splits:
                    raise SourceNotFoundError(
                        f"hf: {self.location.url} has no split {split!r}; it has {splits}"
                    )
                self._folder = f"{split}/"
            elif self.location.exists("state.json"):
                if split is not None:
                    raise SourceError(
                        f"hf: {self.location.url} is one Dataset; split= is for a DatasetDict"
                    )
                self._folder = ""
            else:
                raise SourceNotFoundError(
                    f"hf: {self.location.url} is not a folder written by save_to_disk "
                    "(no state.json or dataset_dict.json)"
                )
        return self._folder

    def list_items(self) -> list[Item]:
        _pyarrow()
        folder = self._split_folder()
        state = self._read_json(folder + "state.json")
        if state.get("_indices_files"):
            raise SourceError(
                f"hf: {self.location.join(folder + 'state.json')}: the dataset has an indices "
                "mapping (a select/shuffle not flattened); save it with "
                "dataset.flatten_indices().save_to_disk(...)"
            )
        files = [f["filename"] for f in state.get("_data_files", [])]
        if not files:
            raise SourceNotFoundError(f"hf: {self.location.url}: state.json lists no data files")
        sizes = dict(self.walk())
        items = []
        for name in files:
            rel = folder + name
            if "/" in name or name.startswith(".") or rel not in sizes:
                raise SourceError(
                    f"hf: state.json lists {name!r}, which is not in {self.location.url}"
                )
            items.append(Item(rel, sizes[rel], (rel,)))
        return items

    def _leaf_list(self) -> list[_Leaf]:
        folder = self._split_folder()
        if self._features is None:
            info = self._read_json(folder + "dataset_info.json")
            self._features = info.get("features") or {}
        out: list[_Leaf] = []
        try:
            _leaves(self._features, "", (), (), out)
        except (SchemaError, KeyError, TypeError, ValueError) as exc:
            raise SourceError(
                f"hf: {self.location.join(folder + 'dataset_info.json')}: {exc}; give a schema"
            ) from None
        return out

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        try:
            return Schema({leaf.name: leaf.feature() for leaf in self._leaf_list()})
        except SchemaError as exc:
            raise SourceError(f"hf: {exc}; give a schema") from None

    def metadata(self, items: Sequence[Item]) -> dict[str, Any]:
        leaves = self._leaf_list()
        split = self._split_folder().rstrip("/") or None
        names = {leaf.name: list(leaf.names) for leaf in leaves if leaf.names}
        return {"hf": {"split": split, "class_names": names, "features": self._features}}

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        pa = _pyarrow()
        leaves = {leaf.name: leaf for leaf in self._leaf_list()}
        missing = [n for n in schema.features if n not in leaves]
        if missing:
            raise SourceError(f"{item.key}: features {missing} are not in dataset_info.json")
        row = 0
        with source_errors(item.key), self.location.open(item.ref[0], block_size=8 << 20) as f:
            for batch in pa.ipc.open_stream(f):
                for record in batch.to_pylist():
                    yield {
                        n: self._value(item, row, leaves[n], schema[n], record)
                        for n in schema.features
                    }
                    row += 1

    def _value(self, item: Item, row: int, leaf: _Leaf, ftype: Any, record: Any) -> Any:
        value = _get(record, leaf.path)
        if leaf.kind == "image":
            value = _image(item, row, leaf, value)
        if _has_null(value):
            raise SourceError(f"{item.key}: row {row}: feature {leaf.name!r} holds a null")
        if isinstance(value, bool):
            return int(value)
        if isinstance(ftype, Tensor) or (ftype.shape and not isinstance(ftype, Bytes)):
            try:
                array = np.asarray(value, dtype=getattr(ftype, "dtype", None) or leaf.dtype)
            except ValueError as exc:
                raise SourceError(
                    f"{item.key}: row {row}: feature {leaf.name!r} is ragged ({exc}); give a schema"
                ) from None
            shape = ftype.shape
            if array.size == 0 and array.ndim < len(shape):  # [] for a (None, 3) feature
                array = array.reshape(tuple(0 if d is None else d for d in shape))
            if array.ndim != len(shape):
                raise SourceError(
                    f"{item.key}: row {row}: feature {leaf.name!r} has shape {array.shape}, "
                    f"not of rank {len(shape)}; give a schema"
                )
            return array
        return value


def _image(item: Item, row: int, leaf: _Leaf, value: Any) -> Any:
    def one(v: Any) -> Any:
        if v is None:
            return None
        data = v.get("bytes") if isinstance(v, Mapping) else None
        if data is None:
            path = v.get("path") if isinstance(v, Mapping) else None
            raise SourceError(
                f"{item.key}: row {row}: image {leaf.name!r} is stored as the path {path!r}, "
                "not as bytes; save it with the images embedded (cast the column to Image() "
                "after loading the files, or dataset.map(..., features=...)), then convert"
            )
        return data

    if isinstance(value, list):
        return [one(v) for v in value]
    return one(value)
