"""``recordkit.Schema``: named, typed features; encode samples, decode records.

The feature types, and the errors encoding and decoding raise, are in
:mod:`recordkit.codec.features`; the shape rules in :mod:`recordkit.codec.shapes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ..errors import SchemaError
from ..format.framing import DEFAULT_MAX_RECORD_BYTES
from .budget import DecodeBudget
from .example import decode_example, encode_example
from .features import (
    INFERRED,
    REQUIRED,
    Bytes,
    FeatureBase,
    FeatureType,
    Float32,
    Int64,
    Tensor,
)
from .limits import DecodeLimits
from .schema_json import feature_from_json
from .shapes import Features, Shape, fmt_shape

__all__ = ["Bytes", "FeatureType", "Float32", "Int64", "Schema", "Tensor"]


class Schema:
    """Named, ordered feature types: how samples become ``tf.train.Example`` records.

    ``Schema({"image": Tensor("uint8", (None, None, 3)), "label": Int64()})`` or
    ``Schema(image=..., label=...)``. Immutable and hashable; iterating yields the
    feature names in order.

    Args:
        features: feature name -> :data:`FeatureType`, in the order records store them.
        **kw: more features, after those in ``features``.
    """

    __slots__ = ("_features", "_keys")
    _features: Mapping[str, FeatureType]
    _keys: frozenset[str]

    def __init__(self, features: Mapping[str, FeatureType] | None = None, /, **kw: Any) -> None:
        merged = dict(features or {})
        merged.update(kw)
        for name, ftype in merged.items():
            if not isinstance(name, str) or not name:
                raise SchemaError(f"feature names must be non-empty str, got {name!r}")
            if not isinstance(ftype, FeatureBase):
                raise SchemaError(
                    f"feature {name!r}: expected Bytes, Int64, Float32 or Tensor, got {ftype!r}"
                )
            if ftype.min_record_bytes() > DEFAULT_MAX_RECORD_BYTES:
                raise SchemaError(
                    f"feature {name!r}: {ftype!r} claims {ftype.min_record_bytes()} bytes per "
                    f"record, more than the record limit of {DEFAULT_MAX_RECORD_BYTES}"
                )
        keys = set(merged)
        for name, ftype in merged.items():
            if ftype.shape_feature:
                if f"{name}/shape" in merged:
                    raise SchemaError(
                        f"feature {name + '/shape'!r} collides with the shape companion of "
                        f"{name!r} (whose shape {fmt_shape(ftype.shape)} has two or more None dims)"
                    )
                keys.add(f"{name}/shape")
        object.__setattr__(self, "_features", MappingProxyType(merged))
        object.__setattr__(self, "_keys", frozenset(keys))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Schema is immutable")

    @property
    def features(self) -> Mapping[str, FeatureType]:
        """A read-only mapping of feature name -> type, in order."""
        return self._features

    @property
    def names(self) -> tuple[str, ...]:
        """The feature names, in order."""
        return tuple(self._features)

    def __getitem__(self, name: str) -> FeatureType:
        return self._features[name]

    def zstd_bytes(self, columns: Any = None) -> tuple[int, bool]:
        """(bytes the fixed-shape zstd values of ``columns`` (default: all) decompress to
        per record, whether any is variable): what :class:`DecodeLimits` derives its
        defaults from (each feature type's ``zstd_bytes``)."""
        fixed, variable = 0, False
        wanted = None if columns is None else set(columns)
        for name, ftype in self._features.items():
            if wanted is None or name in wanted:
                size, varies = ftype.zstd_bytes()
                fixed, variable = fixed + size, variable or varies
        return fixed, variable

    def __iter__(self) -> Iterator[str]:
        return iter(self._features)

    def __len__(self) -> int:
        return len(self._features)

    def __contains__(self, name: object) -> bool:
        return name in self._features

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schema):
            return NotImplemented
        return list(self._features.items()) == list(other._features.items())

    def __reduce__(self) -> tuple[Any, ...]:
        # DataLoader workers started with "spawn" receive the dataset by pickle;
        # the schema crosses as its JSON form, not as Python objects.
        return (Schema.from_json, (self.to_json(),))

    def __hash__(self) -> int:
        return hash(tuple(self._features.items()))

    def __repr__(self) -> str:
        return f"Schema({dict(self._features)!r})"

    def encode(self, sample: Mapping[str, Any]) -> bytes:
        """Validate ``sample`` and serialize it as a ``tf.train.Example``.

        Args:
            sample: feature name -> value (numpy arrays, Python scalars and lists,
                bytes-like or str for :class:`Bytes`).

        A feature with a ``default`` may be left out of ``sample`` (or be ``None``):
        the record then lacks it, and reads back as the default.

        Raises:
            SchemaError: a missing required or an extra feature, a wrong shape, or
                a value that does not convert to its type without loss.
        """
        if not isinstance(sample, Mapping):
            raise SchemaError(f"a sample must be a mapping, got {type(sample).__name__}")
        out: Features = {}
        given = 0
        for name, ftype in self._features.items():
            value = sample.get(name, REQUIRED)
            if value is REQUIRED or value is None:
                if ftype.default is REQUIRED:
                    why = "is missing feature" if value is REQUIRED else "has None for feature"
                    raise SchemaError(f"sample {why} {name!r}, which has no default")
                given += value is None
                continue  # an optional feature the sample lacks: the record lacks it too
            given += 1
            ftype._encode(name, value, out)
        if len(sample) != given:
            extra = [name for name in sample if name not in self._features]
            raise SchemaError(f"sample has features not in the schema: {extra}")
        return encode_example(out)

    def decode(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        copy: bool = False,
        limits: DecodeLimits | None = None,
        budget: DecodeBudget | None = None,
        columns: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Decode a ``tf.train.Example`` record into the schema's features.

        Args:
            payload: the record; results may be views into it unless ``copy``.
            copy: return owned, writable values (bytes, arrays) instead of views.
            limits: the bytes the record's zstd values may decompress to
                (default: :class:`~recordkit.codec.DecodeLimits`'s, derived from
                the schema).
            budget: instead of ``limits``: a :class:`~recordkit.codec.DecodeBudget`
                that several records share (a batch decoder passes its own and
                calls its ``start_record`` before each record).
            columns: decode only these features (in schema order).

        Returns:
            Feature name -> value: ``memoryview``/``bytes`` (or a list of them) for
            :class:`Bytes`, and ndarrays of the feature's shape for the others.

        Raises:
            RecordTooLargeError: the zstd values would decompress to more than
                the limits allow (raised before the allocation).
            CorruptRecordError: a malformed record, or one that lacks a feature or
                holds the wrong kind or number of values for it.
            SchemaError: a name in ``columns`` that is not in the schema.
        """
        items: Iterable[tuple[str, FeatureType]] = self._features.items()
        keys: Any = self._keys
        if columns is not None:
            items, keys = self._select(columns)
        if budget is None:
            budget = (limits or DecodeLimits()).budget(self, 1, columns)
        record = decode_example(payload, keys=keys)
        return {name: ftype._decode(name, record, copy, budget) for name, ftype in items}

    def _select(self, columns: Sequence[str]) -> tuple[list[tuple[str, FeatureType]], set[str]]:
        if isinstance(columns, str):
            raise SchemaError(f"columns must be a sequence of names, got the str {columns!r}")
        unknown = [c for c in columns if c not in self._features]
        if unknown:
            raise SchemaError(f"columns not in the schema: {unknown}; it has {list(self)}")
        wanted = set(columns)
        items = [(n, t) for n, t in self._features.items() if n in wanted]
        keys = wanted | {f"{n}/shape" for n, t in items if t.shape_feature}
        return items, keys

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form: ``{"features": [{"name": ..., "type": ..., ...}, ...]}``."""
        return {"features": [ftype.to_json(name) for name, ftype in self._features.items()]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schema:
        """Rebuild a schema from :meth:`to_json` output.

        Raises:
            SchemaError: an unknown type or key, a bad shape, dtype or name.
        """
        if isinstance(data, Mapping) and "feature_lists" in data and "features" not in data:
            raise SchemaError(
                "this is the schema of tf.train.SequenceExample records (a manifest whose "
                'payload is "sequence_example"), not of Examples: read them whole '
                "(rk.Dataset, RecordDataset, recordkit.tf.dataset without a cache)"
            )
        if not isinstance(data, Mapping) or not isinstance(data.get("features"), list):
            raise SchemaError(f"schema JSON must be {{'features': [...]}}, got {data!r}")
        features: dict[str, FeatureType] = {}
        for entry in data["features"]:
            name, ftype = feature_from_json(entry)
            if name in features:
                raise SchemaError(f"schema JSON: feature {name!r} appears twice")
            features[name] = ftype
        return cls(features)

    @classmethod
    def infer(
        cls,
        examples: Iterable[Mapping[str, tuple[str | None, Any]]],
        *,
        where: Sequence[str] | None = None,
        notes: list[str] | None = None,
    ) -> Schema:
        """Guess a schema from decoded records (:func:`decode_example` output).

        For TFRecords written without one. Per key: the kind it holds; a length
        that is always 1 gives shape ``()``, always ``n > 1`` gives ``(n,)``, and
        anything else ``(None,)``. A key that some records lack is
        ``(None,)`` with ``default=[]`` (as TFX and ``tf.io.VarLenFeature`` read
        such features): a record without it reads as no values, one with it as
        its values, so every value is kept and batches (padded, or ragged in
        TensorFlow). Keys never set in any record are dropped.

        Args:
            examples: the decoded records.
            where: each record's ``file:offset:record``, for the error message.
            notes: where to say each feature made optional (a list to append to).

        Raises:
            SchemaError: a key holding different kinds in different records; the
                message says it whole (how many records of each kind, and where
                the first record that disagrees is).
        """
        seen: dict[str, list[Any]] = {}  # name -> [min length, max length, records, first]
        kinds: dict[str, dict[str, list[int]]] = {}  # name -> kind -> [records, first]
        missing_first: dict[str, int] = {}  # name -> first record without it
        count = 0
        for record in examples:
            for name, (kind, values) in record.items():
                size = 0 if kind is None else len(values)
                stat = seen.setdefault(name, [size, size, 0, count])
                stat[0], stat[1] = min(stat[0], size), max(stat[1], size)
                stat[2] += 1
                if kind is not None:
                    kinds.setdefault(name, {}).setdefault(kind, [0, count])[0] += 1
            for name in seen.keys() - record.keys():
                missing_first.setdefault(name, count)
            count += 1
        for name, stat in seen.items():  # a key that first appears after records without it
            if stat[3] > 0:
                missing_first[name] = 0

        def at(i: int) -> str:
            return where[i] if where is not None and i < len(where) else f"record {i}"

        advice = "read it raw (rk.Dataset(path, raw=True)), or pass a schema"
        # Kinds that differ first, then keys that are missing, so the message does not
        # depend on the order a writer put a record's features in (a protobuf map).
        for name, several in kinds.items():
            if len(several) > 1:
                counts = " and ".join(
                    f"{k} in {n} records" if i == 0 else f"{k} in {n}"
                    for i, (k, (n, _)) in enumerate(several.items())
                )
                first = sorted(f for n, f in several.values())[1]  # where a second kind appears
                raise SchemaError(f"feature {name!r} is {counts} (first: {at(first)}); {advice}")
        features: dict[str, FeatureType] = {}
        for name, (low, high, present, _) in seen.items():
            held = kinds.get(name)
            if not held:
                continue
            kind = next(iter(held))
            ftype_cls: type[Bytes | Int64 | Float32] = INFERRED[kind]
            if present != count:
                features[name] = ftype_cls((None,), default=[])
                if notes is not None:
                    notes.append(
                        f"feature {name!r} is in {present} of {count} records (first without "
                        f"it: {at(missing_first[name])}): {features[name]!r}, a record "
                        "without it reads as no values (give a schema with another default "
                        "to read it otherwise)"
                    )
                continue
            shape: Shape = () if low == high == 1 else (low,) if low == high > 1 else (None,)
            features[name] = ftype_cls(shape)
        return cls(features)
