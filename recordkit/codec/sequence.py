"""Decoding ``tf.train.SequenceExample`` whole: its context and every feature list.

From ``tensorflow/core/example/example.proto`` and ``feature.proto``::

    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
    FeatureLists    { map<string, FeatureList> feature_list = 1; }  // key = 1, value = 2
    FeatureList     { repeated Feature feature = 1; }

Read with the protobuf parser's semantics, as :func:`~recordkit.codec.decode_example`
reads an Example (:mod:`recordkit.codec.messages`; a repeated ``FeatureList`` value
merges: its steps concatenate), a field a message does not define included. An
Example payload reads as a SequenceExample with no feature lists.

:class:`SequenceSchema` says what a set of SequenceExamples holds (each context
feature and feature list, its kinds, how many records hold it, the lengths seen):
``recordkit convert`` builds it from every record it copies and stores it as the
manifest's schema of a dataset whose payload kind is ``sequence_example``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import CorruptRecordError, SchemaError, UnknownFieldError
from .messages import Scope, entry_key, list_values, parse_features, unknown_field
from .wire import KIND_OF_TAG, LEN1, LEN2, malformed, read_len, read_varint, skip

__all__ = [
    "SequenceSchema",
    "as_stored",
    "decode_sequence_example",
    "has_feature_lists",
    "sequence_example_values",
]

Values = tuple[str | None, Any]


def decode_sequence_example(
    payload: bytes | bytearray | memoryview,
) -> tuple[dict[str, Values], dict[str, list[Values]]]:
    """Parse a serialized ``tf.train.SequenceExample``.

    Returns:
        ``(context, feature_lists)``: the context as :func:`decode_example`
        returns an Example's features, and feature list name -> one
        ``(kind, values)`` per step, in order (steps may differ in length and,
        as in the protobuf, in kind).

    Raises:
        UnknownFieldError: the payload holds a field its message does not define.
        CorruptRecordError: the payload is not a well-formed message.
    """
    buf = memoryview(payload)
    if buf.ndim != 1 or buf.itemsize != 1:
        buf = buf.cast("B")
    end = len(buf)
    spans: dict[str, list[Any]] = {}
    lists: dict[str, list[list[Any]]] = {}
    pos = 0
    try:
        while pos < end:
            tag, pos = read_varint(buf, pos, end)
            if tag == LEN1:
                size, pos = read_len(buf, pos, end)
                parse_features(buf, pos, pos + size, spans, _CONTEXT)
                pos += size
            elif tag == LEN2:
                size, pos = read_len(buf, pos, end)
                _parse_feature_lists(buf, pos, pos + size, lists)
                pos += size
            else:
                raise unknown_field(buf, 0, end, pos, tag, "the SequenceExample", _MESSAGE)
        context = {name: list_values(buf, state, name, _CONTEXT) for name, state in spans.items()}
        steps = {
            name: [list_values(buf, s, name, _step(i)) for i, s in enumerate(states)]
            for name, states in lists.items()
        }
    except IndexError:
        raise _sequence_error(malformed("truncated field", end)) from None
    except UnknownFieldError:  # named for a SequenceExample already
        raise
    except CorruptRecordError as exc:  # the Example parsers' errors, named for what this is
        raise _sequence_error(exc) from None
    return context, steps


def _sequence_error(exc: CorruptRecordError) -> CorruptRecordError:
    return CorruptRecordError(exc.reason.replace(_EXAMPLE, _SEQUENCE, 1))


_EXAMPLE, _SEQUENCE = "malformed tf.train.Example", "malformed tf.train.SequenceExample"
_MESSAGE = "tf.train.SequenceExample"
_CONTEXT = Scope(_MESSAGE, "SequenceExample.context", "context feature", "context Feature")


def _step(i: int) -> Scope:
    """How errors name step ``i`` of a feature list (its lists' values)."""
    return Scope(_MESSAGE, "", f"step {i} of feature list", "")


def _parse_feature_lists(
    buf: memoryview, pos: int, end: int, lists: dict[str, list[list[Any]]]
) -> None:
    start = pos
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        if tag != LEN1:
            raise unknown_field(
                buf, start, end, pos, tag, "SequenceExample.feature_lists", _MESSAGE
            )
        size, pos = read_len(buf, pos, end)
        stop = pos + size
        key: Any = b""
        key_at = entry = pos
        steps: list[list[Any]] = []
        while pos < stop:  # a map entry: key = 1, value = 2, in any order, repeated
            tag, pos = read_varint(buf, pos, stop)
            if tag == LEN1:
                size, pos = read_len(buf, pos, stop)
                key_at, key = pos, buf[pos : pos + size]
                pos += size
            elif tag == LEN2:
                size, pos = read_len(buf, pos, stop)
                # merge: the steps concatenate
                steps.extend(_parse_feature_list(buf, pos, pos + size, (entry, stop), len(steps)))
                pos += size
            else:
                where = f"the map entry of feature list {entry_key(buf, entry, stop)}"
                raise unknown_field(buf, entry, stop, pos, tag, where, _MESSAGE)
        try:
            lists[str(key, "utf-8")] = steps  # a repeated key replaces the earlier entry
        except UnicodeDecodeError:
            raise malformed("feature list key is not valid UTF-8", key_at) from None


def _parse_feature_list(
    buf: memoryview, pos: int, end: int, entry: tuple[int, int], first: int
) -> list[list[Any]]:
    """The steps of one ``FeatureList`` (``entry``: its map entry's bounds, ``first``:
    the number of its first step, for errors)."""
    start = pos
    steps: list[list[Any]] = []
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        if tag == LEN1:
            size, pos = read_len(buf, pos, end)
            steps.append(_parse_feature(buf, pos, pos + size, entry, first + len(steps)))
            pos += size
        else:
            where = f"FeatureList {entry_key(buf, *entry)}"
            raise unknown_field(buf, start, end, pos, tag, where, _MESSAGE)
    return steps


def _parse_feature(
    buf: memoryview, pos: int, end: int, entry: tuple[int, int], step: int
) -> list[Any]:
    start = pos
    state: list[Any] = [None, None]
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        kind = KIND_OF_TAG.get(tag)
        if kind is None:
            where = f"the Feature of step {step} of feature list {entry_key(buf, *entry)}"
            raise unknown_field(buf, start, end, pos, tag, where, _MESSAGE)
        size, pos = read_len(buf, pos, end)
        if state[0] == kind:  # the same oneof member again: protobuf merges
            state[1].append((pos, pos + size))
        else:  # a different member replaces the one set before
            state = [kind, [(pos, pos + size)]]
        pos += size
    return state


def as_stored(kind: str | None, values: Any) -> Any:
    """One decoded list as an owned value, typed as stored: ``list[bytes]``, or a 1-d
    ``int64`` / ``float32`` array; a feature with no list set is ``[]``."""
    if kind == "bytes":
        return [bytes(v) for v in values]
    if kind == "int64":
        return np.array(values, dtype=np.int64)
    if kind == "float":
        return np.array(values, dtype=np.float32)
    return []  # a Feature with no list set: TensorFlow reads it as an empty list


def sequence_example_values(payload: bytes | bytearray | memoryview) -> dict[str, Any]:
    """A SequenceExample whole, as owned values: ``{"context": {name: value},
    "feature_lists": {name: [step, ...]}}``, every value as :func:`as_stored` gives it.

    Raises:
        CorruptRecordError: the payload is not a well-formed message.
    """
    context, lists = decode_sequence_example(payload)
    return {
        "context": {n: as_stored(k, v) for n, (k, v) in context.items()},
        "feature_lists": {n: [as_stored(k, v) for k, v in steps] for n, steps in lists.items()},
    }


def has_feature_lists(payload: bytes | bytearray | memoryview) -> bool:
    """Whether a payload has a top-level field 2 (a SequenceExample's ``feature_lists``).

    Reads only the top-level tags and lengths (a few bytes per record), so it is
    cheap enough for every record of a conversion. ``False`` for an Example and
    for a SequenceExample written without feature lists: the two are the same bytes.

    Raises:
        CorruptRecordError: the top level is not well-formed (named as an Example's:
            this is asked of records taken for Examples).
    """
    buf = memoryview(payload)
    if buf.ndim != 1 or buf.itemsize != 1:
        buf = buf.cast("B")
    end, pos = len(buf), 0
    try:
        while pos < end:
            tag, pos = read_varint(buf, pos, end)
            if tag == LEN2:
                return True
            pos = skip(buf, pos, end, tag)
    except IndexError:
        raise malformed("truncated field", end) from None
    return False


_KINDS = ("bytes", "float", "int64")
_UNSET = "unset"  # a Feature with no list set (TensorFlow reads it as an empty list)


def _stat() -> list[Any]:
    # [records holding it, {kind: count}, min values, max values, min steps, max steps]
    return [0, {}, None, None, None, None]


def _lengths(lo: int | None, hi: int | None, n: int) -> tuple[int, int]:
    return (n if lo is None or n < lo else lo), (n if hi is None or n > hi else hi)


class SequenceSchema:
    """What a set of ``tf.train.SequenceExample`` records holds.

    For each context feature: how many records hold it, the kinds it holds (records
    per kind; ``"unset"`` counts a ``Feature`` with no list set) and the range of
    its number of values. For each feature list: how many records hold it, the
    range of its number of steps, the kinds of its steps (steps per kind) and the
    range of values per step. Built with :meth:`add` (one record at a time) and
    :meth:`update` (another schema), stored with :meth:`to_json`.

    A schema built from every record of a dataset names everything its records
    hold: :meth:`check` refuses a record that holds a feature, or a kind, that it
    does not name; ``recordkit.tf`` takes TensorFlow's parsing specs from it.

    Attributes:
        records: the records it was built from.
    """

    def __init__(self) -> None:
        self.records = 0
        self._context: dict[str, list[Any]] = {}
        self._lists: dict[str, list[Any]] = {}

    def add(self, context: Mapping[str, Values], feature_lists: Mapping[str, list[Values]]) -> None:
        """Count one record (:func:`decode_sequence_example`'s output)."""
        self.records += 1
        for name, (kind, values) in context.items():
            stat = self._context.setdefault(name, _stat())
            stat[0] += 1
            key = kind or _UNSET
            stat[1][key] = stat[1].get(key, 0) + 1
            if kind is not None:
                stat[2], stat[3] = _lengths(stat[2], stat[3], len(values))
        for name, steps in feature_lists.items():
            stat = self._lists.setdefault(name, _stat())
            stat[0] += 1
            stat[4], stat[5] = _lengths(stat[4], stat[5], len(steps))
            kinds = stat[1]
            for kind, values in steps:
                key = kind or _UNSET
                kinds[key] = kinds.get(key, 0) + 1
                if kind is not None:
                    stat[2], stat[3] = _lengths(stat[2], stat[3], len(values))

    def update(self, other: SequenceSchema) -> None:
        """Add what ``other`` counted (the schema of more records)."""
        self.records += other.records
        for mine, theirs in ((self._context, other._context), (self._lists, other._lists)):
            for name, stat in theirs.items():
                into = mine.get(name)
                if into is None:
                    mine[name] = [stat[0], dict(stat[1]), *stat[2:]]
                    continue
                into[0] += stat[0]
                for kind, count in stat[1].items():
                    into[1][kind] = into[1].get(kind, 0) + count
                for lo, hi in ((2, 3), (4, 5)):
                    if stat[lo] is not None:
                        into[lo], into[hi] = _lengths(into[lo], into[hi], stat[lo])
                        into[lo], into[hi] = _lengths(into[lo], into[hi], stat[hi])

    @classmethod
    def merged(cls, schemas: Iterable[SequenceSchema]) -> SequenceSchema:
        """One schema counting what all of ``schemas`` counted."""
        out = cls()
        for schema in schemas:
            out.update(schema)
        return out

    def kinds(self, part: str) -> dict[str, list[str]]:
        """Name -> the kinds it holds (sorted; ``"unset"`` left out) in ``part``,
        ``"context"`` or ``"feature_lists"``."""
        stats = self._part(part)
        return {n: sorted(k for k in s[1] if k != _UNSET) for n, s in sorted(stats.items())}

    def _part(self, part: str) -> dict[str, list[Any]]:
        if part == "context":
            return self._context
        if part == "feature_lists":
            return self._lists
        raise ValueError(f"part must be 'context' or 'feature_lists', got {part!r}")

    def check(
        self, context: Mapping[str, Values], feature_lists: Mapping[str, list[Values]]
    ) -> None:
        """Refuse a record that holds a feature, or a kind, this schema does not name.

        Raises:
            CorruptRecordError: naming the feature and the kind.
        """
        for part, stats, held in (
            ("context feature", self._context, [(n, [v]) for n, v in context.items()]),
            ("feature list", self._lists, list(feature_lists.items())),
        ):
            for name, steps in held:
                stat = stats.get(name)
                if stat is None:
                    raise CorruptRecordError(
                        f"the record holds {part} {name!r}, which the schema of this "
                        "dataset does not name"
                    )
                for kind, _ in steps:
                    if kind is not None and kind not in stat[1]:
                        raise CorruptRecordError(
                            f"the record holds {part} {name!r} as {kind}, which the schema "
                            f"of this dataset does not name (it has {', '.join(stat[1])})"
                        )

    def decode(
        self, payload: bytes | bytearray | memoryview, *, limits: Any = None
    ) -> dict[str, Any]:
        """A record whole (as ``sequence_example_values`` gives it), checked against the schema.

        ``limits`` is accepted for the Example schema's signature; a SequenceExample
        holds no compressed values, so it decodes to about its own size.

        Raises:
            CorruptRecordError: a malformed record, or one the schema does not describe.
        """
        context, lists = decode_sequence_example(payload)
        self.check(context, lists)
        return {
            "context": {n: as_stored(k, v) for n, (k, v) in context.items()},
            "feature_lists": {n: [as_stored(k, v) for k, v in s] for n, s in lists.items()},
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready form (names sorted, so equal schemas write equal bytes)."""

        def entry(name: str, stat: list[Any], lists: bool) -> dict[str, Any]:
            out: dict[str, Any] = {"name": name, "records": stat[0]}
            if lists:
                out["steps"] = [stat[4], stat[5]]
            out["kinds"] = dict(sorted(stat[1].items()))
            out["values"] = None if stat[2] is None else [stat[2], stat[3]]
            return out

        return {
            "records": self.records,
            "context": [entry(n, s, False) for n, s in sorted(self._context.items())],
            "feature_lists": [entry(n, s, True) for n, s in sorted(self._lists.items())],
        }

    @classmethod
    def from_json(cls, data: Any) -> SequenceSchema:
        """Rebuild a schema from :meth:`to_json` output.

        Raises:
            SchemaError: anything else (naming the entry).
        """
        if not isinstance(data, Mapping) or set(data) != {"records", "context", "feature_lists"}:
            raise SchemaError(
                "a SequenceExample schema is {'records': N, 'context': [...], "
                f"'feature_lists': [...]}}, got {_short(data)}"
            )
        out = cls()
        out.records = _count(data["records"], "records")
        for part, lists in (("context", False), ("feature_lists", True)):
            entries = data[part]
            if not isinstance(entries, list):
                raise SchemaError(f"SequenceExample schema: {part} must be a list")
            stats = out._part(part)
            for entry in entries:
                name, stat = _entry_from_json(entry, part, lists)
                if name in stats:
                    raise SchemaError(f"SequenceExample schema: {part} {name!r} appears twice")
                stats[name] = stat
        return out

    def describe(self) -> list[str]:
        """One line per context feature and feature list, for humans."""
        lines = []
        for part, stats in (("context", self._context), ("feature_lists", self._lists)):
            for name, stat in sorted(stats.items()):
                kinds = ", ".join(stat[1]) or _UNSET
                held = f"in {stat[0]} of {self.records} records"
                steps = f", {_span(stat[4], stat[5])} steps" if part == "feature_lists" else ""
                many = "value" if stat[2] == stat[3] == 1 else "values"
                values = "" if stat[2] is None else f", {_span(stat[2], stat[3])} {many}"
                per = " per step" if part == "feature_lists" and values else ""
                lines.append(f"{part}/{name}: {kinds} ({held}{steps}{values}{per})")
        return lines

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SequenceSchema) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"SequenceSchema(records={self.records}, context={sorted(self._context)}, "
            f"feature_lists={sorted(self._lists)})"
        )


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _short(data: Any) -> str:
    text = repr(data)
    return text if len(text) <= 80 else text[:77] + "..."


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise SchemaError(f"SequenceExample schema: {what} must be a count, got {_short(value)}")
    return value


def _range(value: Any, what: str) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    if not isinstance(value, list) or len(value) != 2:
        raise SchemaError(f"SequenceExample schema: {what} must be [min, max] or null")
    lo, hi = _count(value[0], what), _count(value[1], what)
    if lo > hi:
        raise SchemaError(f"SequenceExample schema: {what} {value} has min > max")
    return lo, hi


def _entry_from_json(entry: Any, part: str, lists: bool) -> tuple[str, list[Any]]:
    keys = {"name", "records", "kinds", "values"} | ({"steps"} if lists else set())
    if not isinstance(entry, Mapping) or set(entry) != keys:
        raise SchemaError(
            f"SequenceExample schema: each {part} entry has the keys {sorted(keys)}, "
            f"got {_short(entry)}"
        )
    name = entry["name"]
    if not isinstance(name, str):
        raise SchemaError(f"SequenceExample schema: {part} name {_short(name)} is not a string")
    kinds = entry["kinds"]
    if not isinstance(kinds, Mapping) or not all(k in (*_KINDS, _UNSET) for k in kinds):
        raise SchemaError(
            f"SequenceExample schema: {part} {name!r}: kinds must map "
            f"{', '.join((*_KINDS, _UNSET))} to counts, got {_short(kinds)}"
        )
    stat = _stat()
    stat[0] = _count(entry["records"], f"{part} {name!r} records")
    stat[1] = {k: _count(n, f"{part} {name!r} kinds") for k, n in kinds.items()}
    stat[2], stat[3] = _range(entry["values"], f"{part} {name!r} values")
    if lists:
        stat[4], stat[5] = _range(entry["steps"], f"{part} {name!r} steps")
    return name, stat
