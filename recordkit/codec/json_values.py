"""A default value in the schema JSON, both ways (the value rules of
:mod:`recordkit.codec.schema_json`; a leaf, so a feature type writes its own entry).

Numbers as (nested) lists, non-finite floats as the strings ``"nan"``, ``"inf"``,
``"-inf"`` (so the manifest stays strict JSON), bytes as ``{"base64": ...}``.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from ..errors import SchemaError

__all__ = ["default_from_json", "default_to_json"]


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
