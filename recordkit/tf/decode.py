"""Turning parsed ``tf.train.Example`` features into ``recordkit.tf``'s elements.

Used by :mod:`recordkit.tf` alone (which documents what each feature becomes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._deps import require
from ..codec import Bytes, Schema, Tensor
from ..codec.limits import DecodeBudget, DecodeLimits

tf = require("tensorflow", extra="tf")

__all__ = ["COMPANION", "decoder", "fast", "padded_bytes", "tf_dtype"]

# The companion feature that holds a record's shape (two or more ``None`` dims).
COMPANION = "/shape"


def tf_dtype(np_dtype: Any) -> Any:
    """TensorFlow's dtype of a NumPy dtype (or its name), in native byte order."""
    dtype = np.dtype(np_dtype)
    return tf.bool if dtype.kind == "b" else tf.as_dtype(dtype.newbyteorder("="))


def decoder(
    schema: Schema, names: list[str], *, batched: bool, limits: DecodeLimits | None = None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Turn parsed features into the output element (one record, or a parsed batch)."""
    cap = (limits or DecodeLimits()).record_limit(schema, names)

    def shape_of(name: str, ftype: Any, parsed: dict[str, Any], count: Any) -> Any:
        if ftype.shape_feature:
            return parsed[name + COMPANION]
        known = math.prod(d for d in ftype.shape if d is not None)
        return [count // known if d is None else d for d in ftype.shape]

    def one(name: str, ftype: Any, parsed: dict[str, Any]) -> Any:
        value = parsed[name]
        if isinstance(ftype, Tensor):
            dtype = tf_dtype(ftype.dtype)
            if ftype.compression:
                value = _zstd(value, ftype, name, cap)
            else:
                value = tf.io.decode_raw(value, dtype, little_endian=True)
            if None not in ftype.shape:
                return tf.reshape(value, list(ftype.shape))
            count = tf.size(value, out_type=tf.int64)
            return tf.reshape(value, shape_of(name, ftype, parsed, count))
        if None not in ftype.shape or isinstance(ftype, Bytes):
            return value
        count = tf.size(value, out_type=tf.int64)
        return tf.reshape(value, shape_of(name, ftype, parsed, count))

    def per_record(parsed: dict[str, Any]) -> dict[str, Any]:
        return {n: one(n, schema[n], parsed) for n in names}

    def per_batch(parsed: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for n in names:
            ftype, value = schema[n], parsed[n]
            if isinstance(ftype, Tensor):
                value = tf.io.decode_raw(value, tf_dtype(ftype.dtype), little_endian=True)
                value = tf.reshape(value, [-1, *ftype.shape])
            out[n] = value
        return out

    return per_batch if batched else per_record


def _zstd(value: Any, ftype: Tensor, name: str, cap: int) -> Any:
    dtype = np.dtype(ftype.dtype)
    size = None if None in ftype.shape else math.prod(ftype.shape) * dtype.itemsize  # type: ignore[arg-type]

    def decompress(frame: bytes) -> np.ndarray:
        # TensorFlow decodes the features one by one: each value within the record limit.
        raw = DecodeBudget(cap, cap).decompress(name, frame, size)
        return np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="), copy=False)

    out = tf.numpy_function(decompress, [value], tf_dtype(dtype), stateful=False)
    out.set_shape([None])
    return out


def fast(schema: Schema, names: list[str]) -> bool:
    """Whether a whole batch decodes with vectorised ops (no per-record shapes, no zstd)."""
    for n in names:
        ftype = schema[n]
        if None in ftype.shape or (isinstance(ftype, Tensor) and ftype.compression):
            return False
    return True


def padded_bytes(ds: Any, schema: Schema, *, batched: bool) -> Any:
    """``ds`` with each ``tf.string`` ``Bytes()`` feature (one value per record) as
    zero-padded ``uint8`` rows and ``name/lengths`` (``bytes_as="padded"``), the torch
    reader's layout: ``decode_raw``, padded to the batch's longest; without a batch, each
    record's value is its ``uint8`` bytes, ``(length,)``, and its length. (The native
    path's rows come so: :meth:`~recordkit.tf.native.NativeTasks.trimmed`.)

    Raises:
        ValueError: a feature named ``{name}/lengths`` is also read.
    """
    spec = ds.element_spec
    names = [
        n
        for n in spec
        if n in schema
        and isinstance(schema[n], Bytes)
        and not schema[n].shape
        and spec[n].dtype == tf.string
    ]
    for n in names:
        if n + "/lengths" in spec:
            raise ValueError(
                f"feature {n + '/lengths'!r} collides with the lengths column of the padded "
                f"bytes feature {n!r}; use bytes_as='list'"
            )
    if not names:
        return ds

    def pad(element: dict[str, Any]) -> dict[str, Any]:
        out = dict(element)
        for n in names:
            value = element[n]
            lengths = tf.cast(tf.strings.length(value), tf.int64)
            if batched:
                width = tf.cast(tf.maximum(tf.reduce_max(lengths), 0), tf.int32)
                # decode_raw pads (or cuts) every value to the fixed length; 0 it refuses
                rows = tf.io.decode_raw(value, tf.uint8, fixed_length=tf.maximum(width, 1))
                value = rows[:, :width]
            else:
                value = tf.io.decode_raw(value, tf.uint8)
            out[n], out[n + "/lengths"] = value, lengths
        return out

    return ds.map(pad, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
