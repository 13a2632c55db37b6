"""``mds``: MosaicML Streaming datasets (``index.json`` + ``shard.NNNNN.mds[.zstd]``).

Read without ``mosaicml-streaming`` (whose install pulls a CUDA torch): the
format is small. ``index.json`` lists the shards with their columns
(names, encodings, fixed sizes), sample counts, compression and hashes; a shard
is ``u32 samples · u32 offsets[samples + 1] · its JSON config · samples`` (offsets
from the file's start), and a sample holds a
``u32`` size for each variable-size column, then every column's bytes, columns
in name order. Compressed shards (``zstd``, ``gz``, ``bz2``) are decompressed in
memory, within ``max_shard_bytes`` and to exactly the size ``index.json`` gives;
hashes ``index.json`` lists are checked where ``hashlib`` (or ``xxhash``, if
installed) has them. One item per shard.

Columns become features, losslessly:

=========================================  ===========================================
MDS encoding                               feature (value)
=========================================  ===========================================
``int``, ``int8/16/32/64``, ``uint8/16/32``  ``Int64()``
``float32``                                ``Float32()``
``uint64``, ``float16``, ``float64``       ``Tensor(dtype, ())``
``str``, ``bytes``, ``json``               ``Bytes()`` (the stored UTF-8 / bytes / JSON text)
``str_int``                                ``Int64()`` where the first samples fit, else ``Bytes()``
``str_float``                              ``Tensor("float64", ())``; ``str_decimal``: ``Bytes()``
``ndarray:DTYPE:SHAPE``                    ``Tensor(DTYPE, SHAPE)``
``ndarray:DTYPE``, ``ndarray``             ``Tensor(DTYPE, (None,) * ndim)`` (first samples)
``jpeg``, ``png``                          ``Bytes()`` (the encoded image, as stored)
``list[jpeg]``, ``list[png]``, ``jpeg_array``  ``Bytes((None,))``
``pil`` (modes L, RGB, RGBA)               ``Tensor("uint8", (None, None, channels))``
=========================================  ===========================================

``pkl`` columns are refused by name (recordkit never unpickles data), and so is
anything else this table does not list. Give a schema to choose other types
(a value is then passed to it as a Python/NumPy value: ``str``, ``int``, array).

Options:
    infer_samples: leading samples inference reads for dynamic ndarrays,
        ``pil`` and ``str_int`` (default 64).
    max_shard_bytes: the largest (decompressed) shard accepted (default 2 GiB);
        a bigger one is refused before it is read.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import itertools
import json
import posixpath
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, ClassVar

import numpy as np
import zstandard

from recordkit import Bytes, Float32, Int64, Schema, Tensor
from recordkit.errors import SchemaError
from recordkit.format import DEFAULT_MAX_RECORD_BYTES

from .base import Item, Source, SourceError, SourceNotFoundError, source_errors

__all__ = ["MDSSource"]

_U4 = np.dtype("<u4")
_SCALARS = {  # the scalar encodings, each stored as its little-endian dtype
    name: np.dtype(name).newbyteorder("<").str
    for name in [f"{sign}int{bits}" for sign in ("u", "") for bits in (8, 16, 32, 64)]
    + ["float16", "float32", "float64"]
}
_ND_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
_SHAPE_DTYPES = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}
_MODES = {"L": 1, "RGB": 3, "RGBA": 4}
_IMAGE_LISTS = ("list[jpeg]", "list[png]", "jpeg_array", "jpegarray")
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
_FROM_TEXT = {"str_int": int, "str_float": float, "str_decimal": str}


class _Bad(ValueError):
    """A column value that does not decode (the caller names the shard and sample)."""


def _ndarray(encoding: str, data: bytes) -> np.ndarray:
    parts = encoding.split(":")
    dtype = parts[1] if len(parts) > 1 else None
    shape = tuple(int(d) for d in parts[2].split(",")) if len(parts) > 2 else None
    at = 0
    if dtype is None:
        if not data:
            raise _Bad("an empty ndarray value")
        dtype = _ND_DTYPES.get(data[0])
        if dtype is None:
            raise _Bad(f"unknown ndarray dtype code {data[0]}")
        at = 1
    if shape is None:
        if len(data) <= at:
            raise _Bad("an ndarray value cut short before its shape")
        byte = data[at]
        ndim, width = byte >> 2, _SHAPE_DTYPES[byte & 3]
        end = at + 1 + ndim * np.dtype(width).itemsize
        if end > len(data):
            raise _Bad("an ndarray value cut short in its shape")
        shape = tuple(int(d) for d in np.frombuffer(data[at + 1 : end], width))
        at = end
    itemsize = np.dtype(dtype).itemsize
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(data) - at != count * itemsize:
        raise _Bad(f"{len(data) - at} bytes do not hold a {dtype} array of shape {shape}")
    return np.frombuffer(data[at:], np.dtype(dtype).newbyteorder("<")).reshape(shape)


def _pil(data: bytes) -> np.ndarray:
    if len(data) < 12:
        raise _Bad("a pil value cut short in its header")
    width, height, mode_len = (int(x) for x in np.frombuffer(data[:12], _U4))
    mode = data[12 : 12 + mode_len].decode("utf-8", "replace")
    channels = _MODES.get(mode)
    if channels is None:
        raise _Bad(f"a pil image in mode {mode!r} (recordkit reads modes {sorted(_MODES)})")
    raw = data[12 + mode_len :]
    if len(raw) != width * height * channels:
        raise _Bad(f"{len(raw)} bytes do not hold a {width}x{height} {mode} image")
    return np.frombuffer(raw, np.uint8).reshape(height, width, channels)


def _image_list(encoding: str, data: bytes) -> list[bytes]:
    at = 0 if encoding.startswith("jpeg") else 4  # list[...] has a 4-byte placeholder first
    if len(data) < at + 4:
        raise _Bad("an image list cut short in its header")
    (count,) = (int(x) for x in np.frombuffer(data[at : at + 4], _U4))
    sizes_end = at + 4 + 4 * count
    if sizes_end > len(data):
        raise _Bad(f"an image list of {count} images cut short in its sizes")
    sizes = np.frombuffer(data[at + 4 : sizes_end], _U4).astype(np.int64)
    if sizes_end + int(sizes.sum()) != len(data):
        raise _Bad(f"image list sizes add up to {int(sizes.sum())}, not the value's bytes")
    out, pos = [], sizes_end
    for size in sizes.tolist():
        out.append(data[pos : pos + size])
        pos += size
    return out


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None


def decode_value(encoding: str, data: bytes) -> Any:
    """One MDS column value, decoded to a plain Python/NumPy value (images stay encoded).

    Raises:
        ValueError: the bytes do not decode, or the encoding is not one recordkit reads.
    """
    if encoding == "bytes" or encoding in ("jpeg", "png"):
        return data
    if encoding == "str":
        return _text(data)
    if encoding == "json":
        text = _text(data)
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise _Bad(f"not JSON ({exc})") from None
        return text
    if encoding == "int" or encoding in _SCALARS:
        dtype = np.dtype(_SCALARS.get(encoding, "<i8"))
        if len(data) != dtype.itemsize:
            raise _Bad(f"{len(data)} bytes for a {encoding} scalar")
        value = np.frombuffer(data, dtype)[0]
        return int(value) if encoding == "int" else value.astype(dtype.newbyteorder("="))
    if encoding in _FROM_TEXT:
        try:
            return _FROM_TEXT[encoding](_text(data))
        except ValueError as exc:
            raise _Bad(str(exc)) from None
    if encoding == "ndarray" or encoding.startswith("ndarray:"):
        return _ndarray(encoding, data)
    if encoding == "pil":
        return _pil(data)
    if encoding in _IMAGE_LISTS:
        return _image_list(encoding, data)
    if encoding == "pkl":
        raise _Bad(
            "it is pickled (pkl): recordkit never unpickles data; re-export the column "
            "with another encoding (bytes, json, ndarray, ...)"
        )
    raise _Bad(f"MDS encoding {encoding!r} is not one recordkit reads")


def _fixed_feature(encoding: str) -> Any | None:
    """The feature an encoding maps to by itself (``None``: the data must say)."""
    if encoding in ("bytes", "str", "json", "jpeg", "png", "str_decimal"):
        return Bytes()
    if encoding in _IMAGE_LISTS:
        return Bytes((None,))
    if encoding in ("int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"):
        return Int64()
    if encoding == "float32":
        return Float32()
    if encoding in ("uint64", "float16", "float64"):
        return Tensor(encoding, ())
    if encoding == "str_float":
        return Tensor("float64", ())
    parts = encoding.split(":")
    if parts[0] == "ndarray" and len(parts) == 3:
        return Tensor(parts[1], tuple(int(d) for d in parts[2].split(",")))
    return None


def _fit(value: Any, ftype: Any) -> Any:
    """A decoded value as the feature type encodes it."""
    if isinstance(ftype, Bytes) and isinstance(value, int):
        return str(value)
    return value


class MDSSource(Source):
    """MosaicML Streaming (MDS) datasets: a folder with ``index.json`` and its shards."""

    name: ClassVar[str] = "mds"
    # The shards tell (``shard.00000.mds``, compressed ``.mds.zstd``/``.gz``/``.bz2``);
    # index.json alone says nothing (other folders hold one too), but goes with them.
    suffixes: ClassVar[tuple[str, ...]] = (".mds", ".mds.zstd", ".mds.gz", ".mds.bz2")
    companions: ClassVar[tuple[str, ...]] = ("index.json",)
    defaults: ClassVar[Mapping[str, Any]] = {
        "infer_samples": 64,
        "max_shard_bytes": DEFAULT_MAX_RECORD_BYTES,
    }

    def __init__(self, url: str, **kwargs: Any) -> None:
        if url.rstrip("/").endswith("/index.json") or url == "index.json":
            url = url.rstrip("/")[: -len("index.json")].rstrip("/") or "."
        super().__init__(url, **kwargs)
        self._index: list[dict[str, Any]] | None = None

    # -- the index ------------------------------------------------------------------------

    def _shards(self) -> list[dict[str, Any]]:
        if self._index is None:
            self.check_exists()
            if not self.location.exists("index.json"):
                raise SourceNotFoundError(f"mds: no index.json in {self.location.url}")
            with source_errors("index.json"):
                index = json.loads(self.location.read_bytes("index.json"))
            shards = index.get("shards") if isinstance(index, dict) else None
            if not isinstance(shards, list):
                raise SourceError(f"mds: {self.location.join('index.json')}: no 'shards' list")
            for i, shard in enumerate(shards):
                _check_shard_entry(i, shard)
            self._index = shards
        return self._index

    def list_items(self) -> list[Item]:
        if self.location.isdir():
            self.walk()  # the shards' versions (content identity) for the plan
        items = []
        for i, shard in enumerate(self._shards()):
            zipped = shard.get("zip_data")
            stored = zipped if zipped else shard["raw_data"]
            items.append(Item(stored["basename"], int(stored["bytes"]), (i,)))
        return items

    def _columns(self, shard: Mapping[str, Any]) -> list[tuple[str, str, int | None]]:
        return list(
            zip(
                shard["column_names"], shard["column_encodings"], shard["column_sizes"], strict=True
            )
        )

    # -- reading a shard --------------------------------------------------------------------

    def _read_shard(self, item: Item) -> bytes:
        shard = self._shards()[item.ref[0]]
        raw, zipped = shard["raw_data"], shard.get("zip_data")
        cap = int(self.options["max_shard_bytes"])
        size = int(raw["bytes"])
        if size > cap:
            raise SourceError(
                f"{item.key}: index.json says it decompresses to {size} bytes, over the limit "
                f"of {cap} (option max_shard_bytes); refused before reading it"
            )
        with source_errors(item.key):
            if zipped:
                algo = str(shard.get("compression") or "").split(":")[0]
                data = self.location.read_bytes(zipped["basename"])
                _check_hashes(item.key, data, zipped)
                data = _decompress(item.key, algo, data, size)
            else:
                data = self.location.read_bytes(raw["basename"])
        if len(data) != size:
            raise SourceError(f"{item.key}: {len(data)} bytes, index.json says {size}")
        _check_hashes(raw["basename"], data, raw)
        return data

    def _raw_samples(self, item: Item) -> Iterator[dict[str, Any]]:
        shard = self._shards()[item.ref[0]]
        data = self._read_shard(item)
        columns = self._columns(shard)
        count = int(shard["samples"])
        if len(data) < 4 * (count + 2):
            raise SourceError(f"{item.key}: {len(data)} bytes cannot hold {count} samples")
        (n,) = (int(x) for x in np.frombuffer(data[:4], _U4))
        if n != count:
            raise SourceError(f"{item.key}: the shard holds {n} samples, index.json says {count}")
        offsets = np.frombuffer(data[4 : 4 * (n + 2)], _U4).astype(np.int64)
        # (between the header and the first sample: the shard's JSON config)
        if offsets[0] < 4 * (n + 2) or offsets[-1] != len(data) or (np.diff(offsets) < 0).any():
            raise SourceError(f"{item.key}: sample offsets do not tile the shard; a corrupt shard")
        for s in range(n):
            sample = data[int(offsets[s]) : int(offsets[s + 1])]
            try:
                yield _decode_sample(sample, columns)
            except _Bad as exc:
                raise SourceError(f"{item.key}: sample {s}: {exc}") from None

    def infer_schema(self, items: Sequence[Item]) -> Schema:
        shards = self._shards()
        if not shards:
            raise SourceNotFoundError(f"mds: {self.location.url} lists no shards")
        columns = self._columns(shards[0])
        for shard in shards[1:]:
            if self._columns(shard) != columns:
                raise SourceError("mds: the shards' columns differ; give a schema")
        features: dict[str, Any] = {}
        pending = []
        for name, encoding, _ in columns:
            fixed = _fixed_feature(encoding)
            if fixed is not None and encoding != "str_int":
                features[name] = fixed
            elif encoding in ("str_int", "pil", "ndarray") or encoding.startswith("ndarray:"):
                pending.append((name, encoding))
                features[name] = None
            else:
                try:
                    decode_value(encoding, b"")
                except _Bad as exc:
                    raise SourceError(f"mds: column {name!r}: {exc}") from None
                raise SourceError(f"mds: column {name!r}: MDS encoding {encoding!r}; give a schema")
        if pending:
            limit = int(self.options["infer_samples"])
            seen = list(itertools.islice((s for i in items for s in self._raw_samples(i)), limit))
            for name, encoding in pending:
                features[name] = _infer(name, encoding, [s[name] for s in seen])
        return Schema(features)

    def samples(self, item: Item, schema: Schema) -> Iterator[Mapping[str, Any]]:
        names = list(schema.features)
        for row, sample in enumerate(self._raw_samples(item)):
            missing = [n for n in names if n not in sample]
            if missing:
                raise SourceError(f"{item.key}: sample {row}: no column(s) {missing}")
            out = {n: _fit(sample[n], schema[n]) for n in names}
            for n in names:
                value = out[n]
                if isinstance(value, int) and not _INT_MIN <= value <= _INT_MAX:
                    raise SourceError(
                        f"{item.key}: sample {row}: column {n!r} holds {value}, which does not "
                        "fit int64; give a schema with Bytes() for it"
                    )
            yield out


def _decode_sample(sample: bytes, columns: list[tuple[str, str, int | None]]) -> dict[str, Any]:
    variable = sum(1 for _, _, size in columns if not size)
    if len(sample) < 4 * variable:
        raise _Bad("cut short in its column sizes")
    head = iter(np.frombuffer(sample[: 4 * variable], _U4).tolist() if variable else [])
    sizes = [int(size) if size else int(next(head)) for _, _, size in columns]
    at = 4 * variable
    if at + sum(sizes) != len(sample):
        raise _Bad(f"column sizes add up to {at + sum(sizes)} bytes, the sample has {len(sample)}")
    out: dict[str, Any] = {}
    for (name, encoding, _), size in zip(columns, sizes):
        try:
            out[name] = decode_value(encoding, sample[at : at + size])
        except _Bad as exc:
            raise _Bad(f"column {name!r} ({encoding}): {exc}") from None
        at += size
    return out


def _infer(name: str, encoding: str, values: list[Any]) -> Any:
    if not values:
        raise SchemaError(
            f"mds: column {name!r} ({encoding}): no samples to infer from; give a schema"
        )
    if encoding == "str_int":
        fits = all(_INT_MIN <= v <= _INT_MAX for v in values)
        return Int64() if fits else Bytes()
    arrays = [np.asarray(v) for v in values]
    dtypes = {a.dtype.name for a in arrays}
    ndims = {a.ndim for a in arrays}
    if len(dtypes) != 1 or len(ndims) != 1:
        raise SchemaError(
            f"mds: column {name!r} ({encoding}) holds arrays of dtypes {sorted(dtypes)} and "
            f"ranks {sorted(ndims)} in its first samples; give a schema"
        )
    if encoding == "pil":
        channels = {a.shape[2] for a in arrays}
        if len(channels) != 1:
            raise SchemaError(f"mds: column {name!r} holds images of {sorted(channels)} channels")
        return Tensor("uint8", (None, None, channels.pop()))
    return Tensor(dtypes.pop(), (None,) * ndims.pop())


def _check_shard_entry(i: int, shard: Any) -> None:
    try:
        assert shard.get("format", "mds") == "mds", f"format {shard.get('format')!r}"
        for key in ("column_names", "column_encodings", "column_sizes"):
            assert isinstance(shard[key], list), key
        assert (
            len({len(shard[k]) for k in ("column_names", "column_encodings", "column_sizes")}) == 1
        )
        raw = shard["raw_data"]
        assert posixpath.normpath(raw["basename"]) == raw["basename"] and not raw[
            "basename"
        ].startswith(("/", "..")), raw["basename"]
        zipped = shard.get("zip_data")
        if zipped:
            assert not zipped["basename"].startswith(("/", "..")), zipped["basename"]
        int(raw["bytes"]), int(shard["samples"])
    except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SourceError(f"mds: index.json: shard {i} is not an MDS shard entry ({exc})") from None


def _check_hashes(key: str, data: bytes, entry: Mapping[str, Any]) -> None:
    for algo, want in (entry.get("hashes") or {}).items():
        digest = _hasher(algo)
        if digest is None:
            continue  # an algorithm this install lacks (xxh* without xxhash)
        got = digest(data)
        if got != want:
            raise SourceError(f"{key}: {algo} is {got}, index.json says {want}: a corrupt file")


def _hasher(algo: str) -> Callable[[bytes], str] | None:
    if algo in hashlib.algorithms_available:
        return lambda data: hashlib.new(algo, data).hexdigest()
    if algo.startswith("xxh"):
        try:
            import xxhash
        except ImportError:
            return None
        return getattr(xxhash, f"{algo}_hexdigest", None)
    return None


def _decompress(key: str, algo: str, data: bytes, size: int) -> bytes:
    """Decompress a whole shard to at most ``size + 1`` bytes (a mismatch is corruption)."""
    stream: BinaryIO
    if algo == "zstd":
        stream = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data))
    elif algo == "gz":
        stream = gzip.GzipFile(fileobj=io.BytesIO(data))  # type: ignore[assignment]
    elif algo == "bz2":
        stream = bz2.BZ2File(io.BytesIO(data))  # type: ignore[assignment]
    else:
        raise SourceError(
            f"{key}: compressed with {algo!r}; recordkit reads zstd, gz and bz2 MDS shards"
        )
    try:
        with stream:
            out = stream.read(size + 1)
    except (OSError, EOFError, ValueError, zstandard.ZstdError) as exc:
        raise SourceError(f"{key}: bad {algo} data ({exc})") from None
    if len(out) != size:
        raise SourceError(
            f"{key}: decompresses to {'more' if len(out) > size else len(out)} bytes, "
            f"index.json says {size}"
        )
    return out
