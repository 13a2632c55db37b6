"""The compact schema text of ``--schema`` (and ``recordkit.codec.parse_schema``).

``name:type[shape][=default],...``, a schema's JSON, or ``@file.json``: the command
line's way to say a schema (``recordkit convert``, ``write``, ``cache``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import SchemaError
from .features import REQUIRED, Bytes, Float32, Int64, Tensor
from .schema import Schema

__all__ = ["parse_schema"]

_SPEC = re.compile(
    r"^\s*([^:\s]+)\s*:\s*(tensor:)?([a-z0-9]+)\s*(?:\[([^\]]*)\])?\s*(?:=\s*(.*?))?\s*$"
)


def parse_schema(text: str) -> Any:
    """A ``recordkit.Schema`` from ``--schema``: JSON, ``@file.json``, or a compact spec.

    The compact spec is ``name:type[shape],...``: ``bytes``, ``int64`` and
    ``float32`` are Example features (``int64[3]``, ``float32[None]``, ``bytes[]``
    for a list of any length); any other numpy dtype (``uint8[32,32,3]``,
    ``float64``) is a ``Tensor``; ``tensor:int64[4]`` forces a ``Tensor``. ``=VALUE``
    (JSON) makes a feature optional with that default: ``label:int64=-1``,
    ``tokens:int64[None]=[]``, ``lang:bytes="en"``.
    """
    text = text.strip()
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SchemaError(f"--schema {text}: cannot read {text[1:]!r}: {exc}") from exc
    if text.startswith("{"):
        try:
            return Schema.from_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"--schema is not valid JSON: {exc}") from exc
    features: dict[str, Any] = {}
    for part in _split_top(text):
        match = _SPEC.match(part)
        if not match:
            raise SchemaError(
                f"--schema: cannot parse {part!r}; expected name:type[shape][=default]"
            )
        name, forced, kind, dims, default_text = match.groups()
        default: Any = REQUIRED
        if default_text is not None:
            try:
                default = json.loads(default_text)
            except json.JSONDecodeError:
                raise SchemaError(
                    f'--schema: the default in {part!r} is not JSON (text is quoted: "en")'
                ) from None
        shape: tuple[int | None, ...] = ()
        if dims is not None:
            shape = tuple(
                None if d.strip() in ("", "None", "none", "?") else int(d)
                for d in (dims.split(",") if dims.strip() else [""])
            )
        try:
            if not forced and kind in ("bytes", "int64", "float32"):
                example = {"bytes": Bytes, "int64": Int64, "float32": Float32}[kind]
                features[name] = example(shape, default=default)
            else:
                features[name] = Tensor(kind, shape, default=default)
        except SchemaError as exc:
            raise SchemaError(f"--schema: feature {name!r}: {exc}") from None
    if not features:
        raise SchemaError("--schema is empty")
    return Schema(features)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]
