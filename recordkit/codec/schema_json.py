"""The JSON form of a schema's features (``Schema.to_json`` / ``Schema.from_json``).

The parser; each feature type writes its own entry (``to_json``), defaults by the
value rules of :mod:`recordkit.codec.json_values`.

Each feature is ``{"name", "type", "shape"}`` (a tensor adds ``"dtype"`` and
``"compression"``), and ``"default"`` for an optional one: numbers as (nested)
lists, non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (so the
manifest stays strict JSON), bytes as ``{"base64": ...}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import SchemaError
from .features import REQUIRED, TYPES, FeatureType, Tensor
from .json_values import default_from_json, default_to_json

__all__ = ["default_from_json", "default_to_json", "feature_from_json"]


def feature_from_json(entry: Any) -> tuple[str, FeatureType]:
    if not isinstance(entry, Mapping):
        raise SchemaError(f"schema JSON: each feature must be an object, got {entry!r}")
    name, type_name = entry.get("name"), entry.get("type")
    if not isinstance(name, str) or not name:
        raise SchemaError(f"schema JSON: feature names must be non-empty strings, got {name!r}")
    cls = TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise SchemaError(
            f"schema JSON: feature {name!r} has unknown type {type_name!r} "
            f"(expected one of {sorted(TYPES)})"
        )
    allowed = {"name", "type", "shape", "default"}
    allowed |= {"dtype", "compression"} if cls is Tensor else set()
    unknown = set(entry) - allowed
    if unknown:
        raise SchemaError(f"schema JSON: feature {name!r} has unknown keys {sorted(unknown)}")
    shape = entry.get("shape", [])
    if not isinstance(shape, list):
        raise SchemaError(f"schema JSON: feature {name!r} has shape {shape!r}, not a list")
    default = REQUIRED
    if "default" in entry:
        default = default_from_json(name, entry["default"])
    if cls is Tensor:
        if not isinstance(entry.get("dtype"), str):
            raise SchemaError(f"schema JSON: tensor {name!r} needs a dtype name")
        ftype: FeatureType = Tensor(
            entry["dtype"], tuple(shape), entry.get("compression"), default=default
        )
    else:
        ftype = cls(tuple(shape), default=default)  # type: ignore[call-arg]  # not Tensor
    return name, ftype
