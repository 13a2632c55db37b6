"""tensorflow-datasets folders: their splits, shards and feature types, without TFDS.

A dataset that ``tfds`` prepared lives in a version folder
(``~/tensorflow_datasets/mnist/3.0.1/``) holding ``dataset_info.json`` (name,
splits with their shard lengths, file-name template), ``features.json`` (the
``FeaturesDict``) and the shards, ``mnist-train.tfrecord-00000-of-00001``. The
records are ``tf.train.Example``\\ s that hold each feature as TFDS serialized it
(int32 as int64 lists, float64 as float lists, ``Tensor(encoding="zlib")`` as
compressed bytes, images encoded). :func:`tfds_folder` recognises such a folder
(or a shard inside one); :class:`TFDSInfo` lists its splits and describes each
feature; :class:`TFDSView` turns decoded records into what ``tfds`` itself
returns: each feature in its own dtype and shape, ``ClassLabel`` as int64
(names in :attr:`TFDSInfo.class_names`), ``Text`` as ``str``, ``Image`` as its
encoded bytes (or decoded to ``uint8`` with ``decode_images``). Nested features
are flattened with ``/`` (``objects/bbox``), as in the records.

Nothing is written into the folder. Features this module does not know
(``Video``, ``Audio``, nested ``Sequence``, optional tensors, ...) are refused by
name when the folder is opened, never read in part.
"""

from __future__ import annotations

import io
import json
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from ..codec.features import Bytes, FeatureType, Float32, Int64, Tensor
from ..codec.limits import DEFAULT_RECORD_BYTES, DecodeLimits
from ..codec.schema import Schema
from ..errors import (
    CorruptRecordError,
    MissingDependencyError,
    RecordTooLargeError,
    SchemaError,
    ShardNotFoundError,
)
from ..format.manifest import ShardInfo
from .decode import Alloc, BatchDecoder, DecodedBatch

__all__ = [
    "TFDSBatchDecoder",
    "TFDSFeature",
    "TFDSInfo",
    "TFDSView",
    "tfds_folder",
    "tfds_hint",
]

INFO_NAME = "dataset_info.json"
FEATURES_NAME = "features.json"
_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_INTS = frozenset(f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)) | {"bool"}
_FLOATS = frozenset({"float16", "float32", "float64"})
_STRINGS = frozenset({"string", "str", "bytes", "object"})
_CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_ADVICE = "read it raw (rk.Dataset(path, raw=True)) or pass a schema"


@dataclass(frozen=True, slots=True)
class TFDSFeature:
    """One (flattened) TFDS feature: what it is, how it is stored, what reading gives.

    Attributes:
        name: its key, nested names joined by ``/`` (``"objects/bbox"``).
        kind: ``"tensor"`` (``Tensor``, ``Scalar``), ``"image"``, ``"class_label"``,
            ``"text"`` or ``"bbox"``.
        dtype: the NumPy dtype name tfds returns (``"string"`` for bytes tensors).
        shape: the shape tfds returns, ``None`` for a dim that varies (a
            ``Sequence``'s length comes first).
        encoding: ``"none"``, ``"bytes"`` or ``"zlib"`` (``Tensor`` only).
        sequence: 1 when the feature sits in a ``Sequence`` (its first dim).
        class_names: a ``ClassLabel``'s names (``"0"``, ``"1"``, ... without a names file).
        image_format: an ``Image``'s ``encoding_format`` (``"png"``, ``"jpeg"`` or ``None``).
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int | None, ...]
    encoding: str = "none"
    sequence: int = 0
    class_names: tuple[str, ...] | None = None
    image_format: str | None = None

    @property
    def dynamic(self) -> bool:
        """Stored as ``name/shape`` + ``name/value`` (two or more unknown dims, encoded)."""
        inner = self.shape[self.sequence :]
        return self.kind == "tensor" and self.encoding != "none" and inner.count(None) > 1

    def stored(self) -> dict[str, FeatureType]:
        """The record's features that hold this one, as recordkit feature types."""
        seq = self.shape[: self.sequence]
        if self.kind == "image":
            return {self.name: Bytes(seq)}  # encoded, one per step of a Sequence
        if self.kind == "text" or (self.kind == "tensor" and self.dtype == "string"):
            if len(self.shape) > 1:
                raise SchemaError(f"feature {self.name!r}: strings of shape {self.shape}")
            return {self.name: Bytes(self.shape)}
        if self.dynamic:
            if seq:
                raise SchemaError(f"feature {self.name!r}: a Sequence of ragged tensors")
            return {
                f"{self.name}/shape": Int64((len(self.shape),)),
                f"{self.name}/value": Bytes(()),
            }
        if self.kind == "tensor" and self.encoding != "none":
            if self.encoding == "bytes" and not seq:  # recordkit's own raw tensor layout
                return {self.name: Tensor(self.dtype, self.shape)}
            return {self.name: Bytes(seq)}
        if self.shape.count(None) > 1:
            raise SchemaError(f"feature {self.name!r}: shape {self.shape} has two unknown dims")
        if self.dtype in _INTS:
            return {self.name: Int64(self.shape)}
        return {self.name: Float32(self.shape)}

    def per_record(self, decode_images: bool) -> bool:
        """Whether a batch's values are made record by record (not cast or passed whole)."""
        if self.kind == "image":
            return decode_images
        if self.kind == "text":
            return True
        if self.kind == "tensor" and self.encoding != "none":
            return self.encoding == "zlib" or bool(self.sequence) or self.dynamic
        return False

    def output(self, decode_images: bool) -> FeatureType:
        """A recordkit feature type with the dtype and shape reading gives (for ``collate``)."""
        if self.kind == "image":
            return (
                Tensor(self.dtype, self.shape)
                if decode_images
                else Bytes(self.shape[: self.sequence])
            )
        if self.kind == "text" or self.dtype == "string":
            return Bytes(self.shape)
        if self.dtype == "int64" and self.shape.count(None) <= 1:
            return Int64(self.shape)
        if self.dtype == "float32" and self.shape.count(None) <= 1:
            return Float32(self.shape)
        return Tensor(self.dtype, self.shape)


def _dims(proto: Mapping[str, Any]) -> tuple[int | None, ...]:
    dims = (proto.get("shape") or {}).get("dimensions") or []
    return tuple(None if int(d) < 0 else int(d) for d in dims)


def _parse(
    node: Mapping[str, Any], name: str, seq: tuple[int | None, ...], out: list[TFDSFeature]
) -> None:
    """Flatten one ``features.json`` node (proto JSON) into ``out``."""
    cls = str(node.get("pythonClassName", "?")).rsplit(".", 1)[-1]
    if "featuresDict" in node:
        for child, sub in (node["featuresDict"].get("features") or {}).items():
            _parse(sub, f"{name}/{child}" if name else child, seq, out)
        return
    if "sequence" in node:
        if seq:
            raise SchemaError(f"feature {name!r}: a Sequence inside a Sequence (stored ragged)")
        length = int(node["sequence"].get("length", -1))
        _parse(node["sequence"]["feature"], name, (None if length < 0 else length,), out)
        return
    n = len(seq)
    if "tensor" in node:
        t = node["tensor"]
        if t.get("optional"):
            raise SchemaError(f"feature {name!r}: an optional {cls} (absent from some records)")
        dtype = _dtype(name, t.get("dtype", ""))
        encoding = str(t.get("encoding", "none")).lower() or "none"
        if encoding not in ("none", "bytes", "zlib"):
            raise SchemaError(f"feature {name!r}: unknown encoding {encoding!r}")
        out.append(TFDSFeature(name, "tensor", dtype, seq + _dims(t), encoding, n))
    elif "classLabel" in node:
        count = int(node["classLabel"].get("numClasses", 0))
        names = tuple(str(i) for i in range(count)) or None  # tfds's names without a file
        out.append(TFDSFeature(name, "class_label", "int64", seq, sequence=n, class_names=names))
    elif "text" in node:
        if node["text"]:
            raise SchemaError(f"feature {name!r}: a Text feature with an encoder")
        out.append(TFDSFeature(name, "text", "string", seq, sequence=n))
    elif "image" in node:
        img = node["image"]
        dtype = _dtype(name, img.get("dtype", "uint8"))
        fmt = img.get("encodingFormat") or None
        out.append(
            TFDSFeature(name, "image", dtype, seq + _dims(img), sequence=n, image_format=fmt)
        )
    elif "boundingBox" in node:
        box = node["boundingBox"]
        dims = _dims(box) or (4,)
        out.append(TFDSFeature(name, "bbox", _dtype(name, box.get("dtype", "float32")), seq + dims))
        if n:
            out[-1] = replace(out[-1], sequence=n)
    else:
        raise SchemaError(f"feature {name!r}: tfds {cls} is not supported")


def _dtype(name: str, text: str) -> str:
    text = str(text).lower()
    if text in _STRINGS:
        return "string"
    if text in _INTS or text in _FLOATS:
        return text
    raise SchemaError(f"feature {name!r}: dtype {text!r} is not supported")


@dataclass(frozen=True, slots=True)
class _Split:
    name: str
    shard_lengths: tuple[int, ...]
    template: str

    def files(self, dataset: str, file_format: str) -> list[str]:
        count = len(self.shard_lengths)
        digits = max(5, len(str(count)))
        out = []
        for i in range(count):
            index, total = f"{i:0{digits}d}", f"{count:0{digits}d}"
            out.append(
                self.template.format(
                    DATASET=dataset,
                    SPLIT=self.name,
                    FILEFORMAT=file_format,
                    SHARD_INDEX=index,
                    NUM_SHARDS=total,
                    SHARD_X_OF_Y=f"{index}-of-{total}",
                )
            )
        return out


@dataclass(frozen=True)
class TFDSInfo:
    """A tensorflow-datasets version folder, read from its JSON files.

    Attributes:
        root: the folder (absolute).
        name: the dataset's name (``"mnist"``).
        version: its version (``"3.0.1"``).
        file_format: the shards' format (``"tfrecord"``).
        splits: split name -> records per shard, in shard order.
        features: the flattened features, in ``features.json``'s order.
        supervised_keys: ``(input, target)`` feature names, where the dataset has them.
    """

    root: str
    name: str
    version: str
    file_format: str
    splits: Mapping[str, tuple[int, ...]]
    features: Mapping[str, TFDSFeature]
    supervised_keys: tuple[str, ...] | None = None
    _templates: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, root: str) -> TFDSInfo:
        """Read ``dataset_info.json`` and ``features.json`` (and the ``*.labels.txt`` files).

        Raises:
            SchemaError: a file that is not what tfds writes, or a feature this
                module does not read (named, with the advice to read raw).
        """
        info_path = os.path.join(root, INFO_NAME)
        feat_path = os.path.join(root, FEATURES_NAME)
        info = _load_json(info_path)
        feats = _load_json(feat_path)
        if "type" in feats and "content" in feats:
            raise SchemaError(
                f"{feat_path}: features.json in the format of tfds before 4.0; regenerate "
                f"the dataset with a recent tensorflow-datasets, or {_ADVICE}"
            )
        flat: list[TFDSFeature] = []
        try:
            _parse(feats, "", (), flat)
        except SchemaError as exc:
            raise SchemaError(f"{feat_path}: {exc}; {_ADVICE}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SchemaError(f"{feat_path}: not a tfds features.json ({exc!r})") from None
        features = {f.name: _with_names(root, f) for f in flat}
        splits: dict[str, tuple[int, ...]] = {}
        templates: dict[str, str] = {}
        try:
            for split in info.get("splits", []):
                splits[split["name"]] = tuple(int(n) for n in split.get("shardLengths", []))
                templates[split["name"]] = split.get("filepathTemplate") or _TEMPLATE
            supervised = info.get("supervisedKeys", {}).get("tuple", {}).get("items")
            keys = tuple(i["featureKey"] for i in supervised) if supervised else None
            name, version = str(info["name"]), str(info.get("version", ""))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SchemaError(f"{info_path}: not a tfds dataset_info.json ({exc!r})") from None
        file_format = str(info.get("fileFormat") or "tfrecord")
        return cls(
            os.path.abspath(root), name, version, file_format, splits, features, keys, templates
        )

    @property
    def class_names(self) -> dict[str, list[str]]:
        """``ClassLabel`` feature -> its class names (index ``i`` names label ``i``)."""
        return {n: list(f.class_names or ()) for n, f in self.features.items() if f.class_names}

    def split_files(self, split: str) -> list[tuple[str, int]]:
        """``(file name, records)`` of each shard of ``split``, in order."""
        if split not in self.splits:
            raise ShardNotFoundError(
                f"{self.root}: tfds dataset {self.name!r} has no split {split!r}; "
                f"it has {self._split_list()}"
            )
        meta = _Split(split, self.splits[split], self._templates.get(split, _TEMPLATE))
        return list(zip(meta.files(self.name, self.file_format), self.splits[split]))

    def _split_list(self) -> str:
        return ", ".join(f"{s} ({sum(n)} records)" for s, n in self.splits.items()) or "none"

    def choose_split(self, split: str | None, file: str | None = None) -> str:
        """The split to read: ``split``, the one ``file`` belongs to, or the only one."""
        if split is not None:
            return split
        if file is not None:
            for name in self.splits:
                if file in dict(self.split_files(name)):
                    return name
            raise ShardNotFoundError(
                f"{os.path.join(self.root, file)}: not a shard that {INFO_NAME} lists"
            )
        if len(self.splits) == 1:
            return next(iter(self.splits))
        raise ValueError(
            f"{self.root} is a tensorflow-datasets folder with the splits "
            f"{self._split_list()}: choose one with split='NAME' (recordkit convert: "
            "-o split=NAME), or give the path of one of its shards"
        )

    def shard_infos(self, split: str) -> list[ShardInfo]:
        """The split's shards, their record counts from ``dataset_info.json``.

        Raises:
            ShardNotFoundError: a shard the split lists is not in the folder.
        """
        if self.file_format != "tfrecord":
            raise ShardNotFoundError(
                f"{self.root}: tfds dataset {self.name!r} is stored as {self.file_format!r}, "
                "not TFRecord; convert it with: recordkit convert --from arrayrecord "
                f"{self.root} DEST"
            )
        infos = []
        for name, records in self.split_files(split):
            path = os.path.join(self.root, name)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise ShardNotFoundError(
                    f"shard not found: {path} ({INFO_NAME} lists it in split {split!r})"
                ) from None
            infos.append(ShardInfo(name, records, size))
        return infos

    def view(self, split: str, *, decode_images: bool = False) -> TFDSView:
        """How this folder's records become tfds's values (:class:`TFDSView`)."""
        return TFDSView(self, split, decode_images)

    def to_json(self, split: str | None = None) -> dict[str, Any]:
        """What a reader's ``metadata["tfds"]`` (and a converted manifest) holds."""
        return {
            "name": self.name,
            "version": self.version,
            "split": split,
            "splits": {s: sum(n) for s, n in self.splits.items()},
            "class_names": self.class_names,
            "supervised_keys": list(self.supervised_keys) if self.supervised_keys else None,
            "features": {
                n: {"kind": f.kind, "dtype": f.dtype, "shape": list(f.shape)}
                for n, f in self.features.items()
            },
        }


def _load_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not JSON ({exc})") from None


def _with_names(root: str, feature: TFDSFeature) -> TFDSFeature:
    if feature.kind != "class_label":
        return feature
    # tfds names the file by the feature's path, "/" as "-" ("objects-label.labels.txt").
    path = os.path.join(root, feature.name.replace("/", "-") + ".labels.txt")
    try:
        with open(path, encoding="utf-8") as f:
            names = tuple(line.rstrip("\r\n") for line in f if line.strip())
    except FileNotFoundError:
        return feature  # ClassLabel(num_classes=n): no names file, names "0", "1", ...
    return replace(feature, class_names=names)


def tfds_folder(path: str) -> tuple[TFDSInfo, str | None] | None:
    """The tfds folder ``path`` is (or whose shard it is), and that shard's name.

    ``None`` when ``path`` is neither a folder with ``dataset_info.json`` and
    ``features.json`` nor a file in one.
    """
    root, file = (path, None) if os.path.isdir(path) else os.path.split(path)
    if not (
        os.path.isfile(os.path.join(root, INFO_NAME))
        and os.path.isfile(os.path.join(root, FEATURES_NAME))
    ):
        return None
    return TFDSInfo.load(root), file


def tfds_hint(path: str) -> str:
    """A hint naming the tfds version folders under ``path`` ("" when there are none)."""
    try:
        subs = sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return ""
    found = [s for s in subs if os.path.isfile(os.path.join(path, s, INFO_NAME))]
    if not found:
        return ""
    return f" (it holds the tensorflow-datasets version folder(s) {', '.join(found)}: read one)"


# -- turning stored values into tfds's ----------------------------------------------------


class TFDSView:
    """Stored record values -> tfds's values, for one split of a :class:`TFDSInfo`.

    Picklable (plain data). :attr:`schema` decodes the records;
    :meth:`sample` and :meth:`columns` finish what it decoded.

    Attributes:
        info: the folder.
        split: the split read.
        decode_images: decode ``Image`` features to arrays (Pillow).
        schema: the stored features, as recordkit decodes them.
        output_schema: a schema with the dtype and shape of each value returned.
    """

    def __init__(self, info: TFDSInfo, split: str, decode_images: bool = False) -> None:
        self.info = info
        self.split = split
        self.decode_images = decode_images
        stored: dict[str, FeatureType] = {}
        for f in info.features.values():
            try:
                stored.update(f.stored())
            except SchemaError as exc:
                raise SchemaError(f"{info.root}: {exc}; {_ADVICE}") from None
        self.schema = Schema(stored)
        self.output_schema = Schema({n: f.output(decode_images) for n, f in info.features.items()})
        self.limits = DecodeLimits()

    def with_options(
        self, *, decode_images: bool = False, limits: DecodeLimits | None = None
    ) -> TFDSView:
        """A copy that decodes images (or not), under ``limits``."""
        view = TFDSView(self.info, self.split, decode_images)
        view.limits = limits or DecodeLimits()
        return view

    @property
    def names(self) -> list[str]:
        return list(self.info.features)

    def stored_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """The stored features that hold ``columns`` (tfds names)."""
        if columns is None:
            return None
        unknown = [c for c in columns if c not in self.info.features]
        if unknown:
            raise SchemaError(f"columns not in the dataset: {unknown}; it has {self.names}")
        wanted = set(columns)
        return [key for n, f in self.info.features.items() if n in wanted for key in f.stored()]

    # -- one record ----------------------------------------------------------------------

    def sample(
        self, stored: Mapping[str, Any], columns: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """One record's tfds values from ``Schema.decode(payload, copy=True)`` output."""
        out: dict[str, Any] = {}
        for name, f in self.info.features.items():
            if columns is not None and name not in columns:
                continue
            out[name] = self.value(f, stored)
        return out

    def value(self, f: TFDSFeature, stored: Mapping[str, Any]) -> Any:
        """Feature ``f`` of one record, from its stored values (``Schema.decode`` output)."""
        if f.dynamic:
            shape = [int(d) for d in np.asarray(stored[f"{f.name}/shape"])]
            return self._tensor(f, stored[f"{f.name}/value"], shape)
        value = stored[f.name]
        if f.kind == "text":
            if f.sequence:
                return [_text(f, v) for v in value]
            return _text(f, value)
        if f.kind == "image":
            if not self.decode_images:
                return [bytes(v) for v in value] if f.sequence else bytes(value)
            if f.sequence:
                return _stack(f, [self._image(f, v) for v in value])
            return self._image(f, value)
        if f.kind == "tensor" and f.encoding != "none":
            if f.encoding == "bytes" and not f.sequence:
                return value  # decoded by recordkit as Tensor(dtype, shape)
            inner = list(f.shape[f.sequence :])
            if not f.sequence:
                return self._tensor(f, value, inner)
            return _stack(f, [self._tensor(f, v, inner) for v in value])
        if f.dtype == "string":
            return value
        return _cast(f, np.asarray(value))

    def _tensor(self, f: TFDSFeature, data: Any, shape: Sequence[int | None]) -> np.ndarray:
        dtype = np.dtype(f.dtype)
        known = [d for d in shape if d is not None]
        if shape.count(None) > 1:
            raise CorruptRecordError(f"feature {f.name!r}: stored shape {shape} is not a shape")
        size = math.prod(known) * dtype.itemsize if None not in shape else None
        if f.encoding == "zlib":
            data = _inflate(f.name, data, size, self.limits.record_bytes or DEFAULT_RECORD_BYTES)
        raw = bytes(data)
        if len(raw) % dtype.itemsize or (size is not None and len(raw) != size):
            raise CorruptRecordError(
                f"feature {f.name!r}: {len(raw)} bytes do not hold a {f.dtype} tensor of "
                f"shape {tuple(shape)}"
            )
        count = len(raw) // dtype.itemsize
        if None in shape:
            unit = math.prod(known)
            if unit == 0 or count % unit:
                raise CorruptRecordError(
                    f"feature {f.name!r}: {count} elements do not fit shape {tuple(shape)}"
                )
            shape = tuple(count // unit if d is None else d for d in shape)
        array = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype, copy=False)
        return array.reshape(shape)

    def _image(self, f: TFDSFeature, data: Any) -> np.ndarray:
        return decode_image(f, bytes(data), self.limits.record_bytes or DEFAULT_RECORD_BYTES)

    # -- whole batches -------------------------------------------------------------------

    def columns(
        self, cols: Mapping[str, Any], n: int, columns: Sequence[str] | None = None
    ) -> tuple[dict[str, Any], list[tuple[int, CorruptRecordError]]]:
        """A batch's tfds columns from ``BatchDecoder`` columns of ``n`` records.

        Numbers are cast whole; values that need work per record (zlib, text,
        decoded images) are made row by row, and a row that fails is returned
        in the second item (``(row, error)``) and left out of every column.
        """
        out: dict[str, Any] = {}
        bad: dict[int, CorruptRecordError] = {}
        per_row: list[TFDSFeature] = []
        for name, f in self.info.features.items():
            if columns is not None and name not in columns:
                continue
            if f.per_record(self.decode_images):
                per_row.append(f)
                continue
            col = cols[name]
            if f.kind == "tensor" and f.encoding == "none" and f.dtype != "string":
                col = _cast(f, col) if isinstance(col, np.ndarray) else [_cast(f, c) for c in col]
            out[name] = col
            if name + "/lengths" in cols:
                out[name + "/lengths"] = cols[name + "/lengths"]
        made: dict[str, list[Any]] = {f.name: [] for f in per_row}
        for i in range(n):
            try:
                row = {f.name: self.value(f, _Row(cols, i)) for f in per_row}
            except CorruptRecordError as exc:
                bad[i] = exc
                continue
            for name, value in row.items():
                made[name].append(value)
        if bad:
            keep = np.array([i not in bad for i in range(n)], dtype=bool)
            out = {
                k: v[keep] if isinstance(v, np.ndarray) else _keep(v, keep) for k, v in out.items()
            }
        for f in per_row:
            values = made[f.name]
            fixed = None not in f.shape and not isinstance(self.output_schema[f.name], Bytes)
            out[f.name] = _stack_rows(f, values) if fixed else values
        return {n: out[n] for n in self._order(out)}, sorted(bad.items())

    def _order(self, out: Mapping[str, Any]) -> list[str]:
        names = []
        for name in self.info.features:
            if name in out:
                names.append(name)
                if name + "/lengths" in out:
                    names.append(name + "/lengths")
        return names


def _keep(values: list[Any], keep: np.ndarray) -> list[Any]:
    return [v for v, k in zip(values, keep.tolist()) if k]


def _stack_rows(f: TFDSFeature, values: list[Any]) -> np.ndarray:
    if not values:
        return np.empty((0, *f.shape), dtype=f.dtype)  # type: ignore[arg-type]
    return np.stack(values)


class _Row(Mapping[str, Any]):
    """Row ``i`` of ``BatchDecoder`` columns, as ``Schema.decode`` gives one record."""

    def __init__(self, cols: Mapping[str, Any], i: int) -> None:
        self.cols, self.i = cols, i

    def __getitem__(self, key: str) -> Any:
        col = self.cols[key]
        lengths = self.cols.get(key + "/lengths")
        if lengths is not None:
            return col[self.i, : int(lengths[self.i])].tobytes()
        return col[self.i]

    def __iter__(self) -> Any:
        return iter(self.cols)

    def __len__(self) -> int:
        return len(self.cols)


def _cast(f: TFDSFeature, value: np.ndarray) -> np.ndarray:
    if f.dtype == "uint64":
        return value.view(np.uint64)  # tfds stores uint64 as its int64 bits
    if value.dtype == np.dtype(f.dtype):
        return value
    return value.astype(f.dtype)


def _stack(f: TFDSFeature, arrays: list[np.ndarray]) -> Any:
    inner = f.shape[f.sequence :]
    if None in inner:
        return arrays
    if not arrays:
        return np.empty((0, *inner), dtype=f.dtype)
    return np.stack(arrays)


def _text(f: TFDSFeature, value: Any) -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(
            f"feature {f.name!r}: a tfds Text value that is not UTF-8 ({exc.reason} at byte "
            f"{exc.start}); read it as bytes with schema=TFDSInfo(...).view(split).schema"
        ) from None


def _inflate(name: str, data: Any, size: int | None, cap: int) -> bytes:
    """zlib-decompress a value within ``cap`` bytes (exactly ``size`` where known)."""
    limit = cap if size is None else min(cap, size)
    if size is not None and size > cap:
        raise RecordTooLargeError(
            f"feature {name!r}: decompresses to {size} bytes, over DecodeLimits(record_bytes="
            f"{cap}); raise it with limits=DecodeLimits(...) if such values are expected"
        )
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(bytes(data), limit + 1)
    except zlib.error as exc:
        raise CorruptRecordError(f"feature {name!r}: bad zlib data ({exc})") from None
    if len(out) > limit:
        if size is not None and limit == size:
            raise CorruptRecordError(
                f"feature {name!r}: zlib data holds more than the {size} bytes of its shape"
            )
        raise RecordTooLargeError(
            f"feature {name!r}: zlib data decompresses to more than DecodeLimits(record_bytes="
            f"{cap}); raise it with limits=DecodeLimits(...) if such values are expected"
        )
    if not inflater.eof:
        raise CorruptRecordError(f"feature {name!r}: zlib data is cut short")
    return out


def decode_image(f: TFDSFeature, data: bytes, cap: int) -> np.ndarray:
    """An encoded image as tfds decodes it: ``uint8`` (or ``uint16``) ``(h, w, c)``.

    Raises:
        MissingDependencyError: Pillow is not installed.
        CorruptRecordError: the bytes are not an image of the feature's shape.
        RecordTooLargeError: it would decode to more than ``cap`` bytes.
    """
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError(
            "decode_images=True needs Pillow, which is not installed: pip install pillow"
        ) from exc
    channels = f.shape[-1]
    if f.dtype not in ("uint8", "uint16") or (f.dtype == "uint16" and channels != 1):
        raise SchemaError(
            f"feature {f.name!r}: decoding {f.dtype} images with {channels} channels is not "
            "supported; read the encoded bytes (decode_images=False)"
        )
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        c = channels or len(img.getbands())
        if w * h * c * np.dtype(f.dtype).itemsize > cap:
            raise RecordTooLargeError(
                f"feature {f.name!r}: a {w}x{h} image decodes to more than DecodeLimits("
                f"record_bytes={cap})"
            )
        if f.dtype == "uint16":
            array = np.asarray(img.convert("I;16"), dtype=np.uint16)
        else:
            mode = _CHANNEL_MODES.get(channels) if channels else None
            if mode is None and channels:
                raise SchemaError(f"feature {f.name!r}: images with {channels} channels")
            array = np.asarray(img.convert(mode) if mode and img.mode != mode else img)
            array = np.asarray(array, dtype=np.uint8)
    except (RecordTooLargeError, SchemaError):
        raise
    except Exception as exc:  # bytes in memory: whatever Pillow raises is about them
        text = " ".join(str(exc).split())
        raise CorruptRecordError(
            f"feature {f.name!r}: not a readable image ({type(exc).__name__}: {text})"
        ) from None
    if array.ndim == 2:
        array = array[:, :, None]
    want = f.shape[f.sequence :]
    if len(want) != 3 or any(d is not None and d != g for d, g in zip(want, array.shape)):
        raise CorruptRecordError(
            f"feature {f.name!r}: image of shape {array.shape}, the feature's is {tuple(want)}"
        )
    return np.ascontiguousarray(array)


class TFDSBatchDecoder(BatchDecoder):
    """A :class:`~recordkit.reader.decode.BatchDecoder` whose batches hold tfds's values.

    Records are decoded by the stored schema, then :meth:`TFDSView.columns`
    finishes them on the same reader thread; a record that fails there is a bad
    record like any other (``on_error`` applies, the error names file, offset
    and record). Always the threaded path: the native whole-task runner knows
    nothing of tfds's encodings.

    Args:
        view: the split's view (its ``decode_images`` and limits apply).
        columns: tfds feature names to read (default all).
        verify, bytes_as, limits: as :class:`BatchDecoder`.
    """

    def __init__(
        self,
        view: TFDSView,
        *,
        columns: Sequence[str] | None = None,
        verify: bool = True,
        bytes_as: Literal["padded", "list"] = "padded",
        limits: DecodeLimits | None = None,
    ) -> None:
        super().__init__(
            view.schema,
            columns=view.stored_columns(columns),
            verify=verify,
            bytes_as=bytes_as,
            limits=limits,
        )
        self.view = view
        self.wanted = None if columns is None else list(columns)

    def runner(self) -> Any | None:
        """``None``: tfds's values are finished in Python, on the threaded path."""
        return None

    def decode(
        self,
        buf: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        alloc: Alloc | None = None,
        *,
        path: str | None = None,
        records: np.ndarray | None = None,
    ) -> DecodedBatch:
        """Decode like ``BatchDecoder.decode``, then finish tfds's values (bad rows named)."""
        batch = super().decode(buf, offsets, sizes, alloc, path=path, records=records)
        failed = {pos for pos, _ in batch.bad}
        good = [i for i in range(len(offsets)) if i not in failed]
        columns, bad = self.view.columns(batch.columns, batch.n, self.wanted)
        errors = batch.bad + [(good[row], err) for row, err in bad]
        return DecodedBatch(
            columns, sorted(errors, key=lambda e: e[0]), batch.n - len(bad), batch.nbytes
        )
