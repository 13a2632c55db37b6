"""A tensorflow-datasets folder's metadata (splits, shards, each feature's type) and
its view of a split (:class:`TFDSView`: stored values -> tfds's)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...codec.features import Bytes, FeatureType
from ...codec.limits import DEFAULT_RECORD_BYTES, DecodeLimits
from ...codec.schema import Schema
from ...errors import CorruptRecordError, SchemaError, ShardNotFoundError
from ...format.manifest import ShardInfo
from ._feature import ADVICE, TFDSFeature, parse_features
from ._values import (
    Row,
    cast_value,
    decode_image,
    inflate,
    stack_rows,
    stack_values,
    text_value,
)

__all__ = [
    "FEATURES_NAME",
    "INFO_NAME",
    "TFDSInfo",
    "TFDSView",
    "tfds_folder",
    "tfds_hint",
]

INFO_NAME = "dataset_info.json"
FEATURES_NAME = "features.json"
_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


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
                f"the dataset with a recent tensorflow-datasets, or {ADVICE}"
            )
        flat: list[TFDSFeature] = []
        try:
            parse_features(feats, "", (), flat)
        except SchemaError as exc:
            raise SchemaError(f"{feat_path}: {exc}; {ADVICE}") from None
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
        lengths = self.splits[split]
        digits = max(5, len(str(len(lengths))))
        total = f"{len(lengths):0{digits}d}"
        template = self._templates.get(split, _TEMPLATE)
        out = []
        for i, records in enumerate(lengths):
            index = f"{i:0{digits}d}"
            name = template.format(
                DATASET=self.name,
                SPLIT=split,
                FILEFORMAT=self.file_format,
                SHARD_INDEX=index,
                NUM_SHARDS=total,
                SHARD_X_OF_Y=f"{index}-of-{total}",
            )
            out.append((name, records))
        return out

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
                raise SchemaError(f"{info.root}: {exc}; {ADVICE}") from None
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
        features = self.info.features.items()
        return {n: self.value(f, stored) for n, f in features if columns is None or n in columns}

    def value(self, f: TFDSFeature, stored: Mapping[str, Any]) -> Any:
        """Feature ``f`` of one record, from its stored values (``Schema.decode`` output)."""
        if f.dynamic:
            shape = [int(d) for d in np.asarray(stored[f"{f.name}/shape"])]
            return self._tensor(f, stored[f"{f.name}/value"], shape)
        value = stored[f.name]
        if f.kind == "text":
            if f.sequence:
                return [text_value(f, v) for v in value]
            return text_value(f, value)
        if f.kind == "image":
            if not self.decode_images:
                return [bytes(v) for v in value] if f.sequence else bytes(value)
            if f.sequence:
                return stack_values(f, [self._image(f, v) for v in value])
            return self._image(f, value)
        if f.kind == "tensor" and f.encoding != "none":
            if f.encoding == "bytes" and not f.sequence:
                return value  # decoded by recordkit as Tensor(dtype, shape)
            inner = list(f.shape[f.sequence :])
            if not f.sequence:
                return self._tensor(f, value, inner)
            return stack_values(f, [self._tensor(f, v, inner) for v in value])
        if f.dtype == "string":
            return value
        return cast_value(f, np.asarray(value))

    def _tensor(self, f: TFDSFeature, data: Any, shape: Sequence[int | None]) -> np.ndarray:
        dtype = np.dtype(f.dtype)
        known = [d for d in shape if d is not None]
        if shape.count(None) > 1:
            raise CorruptRecordError(f"feature {f.name!r}: stored shape {shape} is not a shape")
        size = math.prod(known) * dtype.itemsize if None not in shape else None
        if f.encoding == "zlib":
            data = inflate(f.name, data, size, self.limits.record_bytes or DEFAULT_RECORD_BYTES)
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
                col = (
                    cast_value(f, col)
                    if isinstance(col, np.ndarray)
                    else [cast_value(f, c) for c in col]
                )
            out[name] = col
            if name + "/lengths" in cols:
                out[name + "/lengths"] = cols[name + "/lengths"]
        made: dict[str, list[Any]] = {f.name: [] for f in per_row}
        for i in range(n):
            try:
                row = {f.name: self.value(f, Row(cols, i)) for f in per_row}
            except CorruptRecordError as exc:
                bad[i] = exc
                continue
            for name, value in row.items():
                made[name].append(value)
        if bad:
            keep = np.array([i not in bad for i in range(n)], dtype=bool)
            out = {
                k: v[keep] if isinstance(v, np.ndarray) else [x for x, y in zip(v, keep) if y]
                for k, v in out.items()
            }
        for f in per_row:
            values = made[f.name]
            fixed = None not in f.shape and not isinstance(self.output_schema[f.name], Bytes)
            out[f.name] = stack_rows(f, values) if fixed else values
        return {n: out[n] for n in self._order(out)}, sorted(bad.items())

    def _order(self, out: Mapping[str, Any]) -> list[str]:
        """The features in the folder's order, each followed by its lengths if any."""
        return [m for n in self.info.features for m in (n, n + "/lengths") if m in out]


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
