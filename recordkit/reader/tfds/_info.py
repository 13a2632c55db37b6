"""A tensorflow-datasets folder's metadata: splits, shards, and each feature's type."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...codec.features import Bytes, FeatureType, Float32, Int64, Tensor
from ...errors import SchemaError, ShardNotFoundError
from ...format.manifest import ShardInfo

if TYPE_CHECKING:
    from ._view import TFDSView

__all__ = [
    "ADVICE",
    "FEATURES_NAME",
    "INFO_NAME",
    "TFDSFeature",
    "TFDSInfo",
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
ADVICE = "read it raw (rk.Dataset(path, raw=True)) or pass a schema"


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
                f"the dataset with a recent tensorflow-datasets, or {ADVICE}"
            )
        flat: list[TFDSFeature] = []
        try:
            _parse(feats, "", (), flat)
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
        from ._view import TFDSView

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
