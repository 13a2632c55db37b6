"""Decoding ``tf.train.SequenceExample`` whole: its context and every feature list.

From ``tensorflow/core/example/example.proto`` and ``feature.proto``::

    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
    FeatureLists    { map<string, FeatureList> feature_list = 1; }  // key = 1, value = 2
    FeatureList     { repeated Feature feature = 1; }

Read with the protobuf parser's semantics, as :func:`~recordkit.codec.decode_example`
reads an Example: a repeated map key replaces the earlier entry, a repeated
``FeatureList`` value merges (its steps concatenate), the last ``oneof`` member
of a ``Feature`` wins and repeated occurrences of the same member merge. An
Example payload reads as a SequenceExample with no feature lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .example import (
    _KIND_OF_TAG,
    _LEN1,
    _LEN2,
    _bad,
    _bytes_values,
    _float_values,
    _int64_values,
    _parse_features,
    _read_len,
    _read_varint,
    _skip,
)

__all__ = ["as_stored", "decode_sequence_example", "sequence_example_values"]

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
            tag, pos = _read_varint(buf, pos, end)
            if tag == _LEN1:
                size, pos = _read_len(buf, pos, end)
                _parse_features(buf, pos, pos + size, spans)
                pos += size
            elif tag == _LEN2:
                size, pos = _read_len(buf, pos, end)
                _parse_feature_lists(buf, pos, pos + size, lists)
                pos += size
            else:
                pos = _skip(buf, pos, end, tag)
        context = {name: _values(buf, state) for name, state in spans.items()}
        steps = {name: [_values(buf, s) for s in states] for name, states in lists.items()}
    except IndexError:
        raise _bad("truncated field", end) from None
    return context, steps


def _parse_feature_lists(
    buf: memoryview, pos: int, end: int, lists: dict[str, list[list[Any]]]
) -> None:
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        if tag != _LEN1:
            pos = _skip(buf, pos, end, tag)
            continue
        size, pos = _read_len(buf, pos, end)
        stop = pos + size
        key: Any = b""
        key_at = pos
        steps: list[list[Any]] = []
        while pos < stop:  # a map entry: key = 1, value = 2, in any order, repeated
            tag, pos = _read_varint(buf, pos, stop)
            if tag == _LEN1:
                size, pos = _read_len(buf, pos, stop)
                key_at, key = pos, buf[pos : pos + size]
                pos += size
            elif tag == _LEN2:
                size, pos = _read_len(buf, pos, stop)
                steps.extend(_parse_feature_list(buf, pos, pos + size))  # merge: concatenate
                pos += size
            else:
                pos = _skip(buf, pos, stop, tag)
        try:
            lists[str(key, "utf-8")] = steps  # a repeated key replaces the earlier entry
        except UnicodeDecodeError:
            raise _bad("feature list key is not valid UTF-8", key_at) from None


def _parse_feature_list(buf: memoryview, pos: int, end: int) -> list[list[Any]]:
    steps = []
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        if tag == _LEN1:
            size, pos = _read_len(buf, pos, end)
            steps.append(_parse_feature(buf, pos, pos + size))
            pos += size
        else:
            pos = _skip(buf, pos, end, tag)
    return steps


def _parse_feature(buf: memoryview, pos: int, end: int) -> list[Any]:
    state: list[Any] = [None, None]
    while pos < end:
        tag, pos = _read_varint(buf, pos, end)
        kind = _KIND_OF_TAG.get(tag)
        if kind is None:
            pos = _skip(buf, pos, end, tag)
            continue
        size, pos = _read_len(buf, pos, end)
        if state[0] == kind:  # the same oneof member again: protobuf merges
            state[1].append((pos, pos + size))
        else:  # a different member replaces the one set before
            state = [kind, [(pos, pos + size)]]
        pos += size
    return state


def _values(buf: memoryview, state: list[Any]) -> Values:
    kind, runs = state
    if kind is None:
        return (None, None)
    if kind == "bytes":
        return ("bytes", _bytes_values(buf, runs))
    if kind == "float":
        return ("float", _float_values(buf, runs))
    return ("int64", _int64_values(buf, runs))


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
