"""The JSON form of a schema's features (``Schema.to_json`` / ``Schema.from_json``).

Each feature is ``{"name", "type", "shape"}`` (a tensor adds ``"dtype"`` and
``"compression"``), and ``"default"`` for an optional one: numbers as (nested)
lists, non-finite floats as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (so the
manifest stays strict JSON), bytes as ``{"base64": ...}``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SchemaError
from .features import _TYPES, REQUIRED, FeatureType, Tensor

__all__ = ["default_from_json", "default_to_json", "feature_from_json"]


def default_to_json(value: Any) -> Any:
    """A default in the schema JSON: numbers as (nested) lists with non-finite floats as
    the strings "nan", "inf", "-inf"; bytes as base64 text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list):
        return [default_to_json(v) for v in value]
    arr = np.asarray(value)
    if arr.dtype.kind in "fc" and not np.isfinite(arr).all():

        def finite(x: Any) -> Any:
            if isinstance(x, list):
                return [finite(v) for v in x]
            return (
                x if math.isfinite(x) else ("nan" if math.isnan(x) else "inf" if x > 0 else "-inf")
            )

        return finite(arr.tolist())
    return arr.tolist()


def default_from_json(name: str, value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) != {"base64"} or not isinstance(value["base64"], str):
            raise SchemaError(f"schema JSON: feature {name!r} has default {value!r}")
        try:
            return base64.b64decode(value["base64"], validate=True)
        except ValueError:
            raise SchemaError(f"schema JSON: feature {name!r}: default is not base64") from None
    if isinstance(value, list):
        return [default_from_json(name, v) for v in value]
    if isinstance(value, str):
        if value not in ("nan", "inf", "-inf"):
            raise SchemaError(f"schema JSON: feature {name!r} has default {value!r}")
        return float(value)
    return value


def feature_from_json(entry: Any) -> tuple[str, FeatureType]:
    if not isinstance(entry, Mapping):
        raise SchemaError(f"schema JSON: each feature must be an object, got {entry!r}")
    name, type_name = entry.get("name"), entry.get("type")
    if not isinstance(name, str) or not name:
        raise SchemaError(f"schema JSON: feature names must be non-empty strings, got {name!r}")
    cls = _TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise SchemaError(
            f"schema JSON: feature {name!r} has unknown type {type_name!r} "
            f"(expected one of {sorted(_TYPES)})"
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
