"""One (flattened) tensorflow-datasets feature: parsed from ``features.json``, how it is
stored in the records, what reading it gives (:class:`TFDSFeature`).

The folder (:class:`~recordkit.reader.tfds.TFDSInfo`) holds these; its view
(:class:`~recordkit.reader.tfds.TFDSView`) reads through them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...codec.features import Bytes, FeatureType, Float32, Int64, Tensor
from ...errors import SchemaError

__all__ = ["ADVICE", "TFDSFeature", "parse_features"]

_INTS = frozenset(f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)) | {"bool"}
_FLOATS = frozenset({"float16", "float32", "float64"})
_STRINGS = frozenset({"string", "str", "bytes", "object"})
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


def parse_features(
    node: Mapping[str, Any], name: str, seq: tuple[int | None, ...], out: list[TFDSFeature]
) -> None:
    """Flatten one ``features.json`` node (proto JSON) into ``out``."""
    cls = str(node.get("pythonClassName", "?")).rsplit(".", 1)[-1]
    if "featuresDict" in node:
        for child, sub in (node["featuresDict"].get("features") or {}).items():
            parse_features(sub, f"{name}/{child}" if name else child, seq, out)
        return
    if "sequence" in node:
        if seq:
            raise SchemaError(f"feature {name!r}: a Sequence inside a Sequence (stored ragged)")
        length = int(node["sequence"].get("length", -1))
        parse_features(node["sequence"]["feature"], name, (None if length < 0 else length,), out)
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
        dtype = _dtype(name, box.get("dtype", "float32"))
        out.append(TFDSFeature(name, "bbox", dtype, seq + (_dims(box) or (4,)), sequence=n))
    else:
        raise SchemaError(f"feature {name!r}: tfds {cls} is not supported")


def _dtype(name: str, text: str) -> str:
    text = str(text).lower()
    if text in _STRINGS:
        return "string"
    if text in _INTS or text in _FLOATS:
        return text
    raise SchemaError(f"feature {name!r}: dtype {text!r} is not supported")
