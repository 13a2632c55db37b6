"""tensorflow-datasets splits in ``recordkit.tf``: stored features -> tfds's, as TensorFlow ops.

Used by :mod:`recordkit.tf` alone. Each record's parsed (stored) features become
what ``tfds`` itself yields: numbers cast to the feature's dtype (``tf.cast``,
``tf.bitcast`` for uint64), ``Image`` decoded with ``tf.io.decode_image``
where asked, and values tfds encodes itself (zlib tensors, tensors of two or more
unknown dims, encoded tensors in a ``Sequence``) finished by
:class:`recordkit.reader.tfds.TFDSView` in a ``tf.numpy_function`` (the slow
path, as zstd values are: Python once per record, within the decode limits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._deps import require
from ..reader.tfds import TFDSFeature, TFDSView
from .decode import tf_dtype

tf = require("tensorflow", extra="tf")

__all__ = ["finisher"]


def finisher(
    view: TFDSView, columns: Sequence[str] | None
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """One parsed record's stored features -> tfds's features (names as tfds flattens them)."""
    wanted = [f for n, f in view.info.features.items() if columns is None or n in set(columns)]

    def one(f: TFDSFeature, parsed: dict[str, Any]) -> Any:
        if f.per_record(view.decode_images) and f.kind != "image" and f.kind != "text":
            return _python(view, f, parsed)
        if f.kind == "image":
            if not view.decode_images:
                return parsed[f.name]
            channels = f.shape[-1] or 0
            dtype = tf_dtype(f.dtype)

            def decode(data: Any) -> Any:
                img = tf.io.decode_image(
                    data, channels=channels, dtype=dtype, expand_animations=False
                )
                img.set_shape(f.shape[f.sequence :])
                return img

            if f.sequence:
                return tf.map_fn(decode, parsed[f.name], fn_output_signature=dtype)
            return decode(parsed[f.name])
        value = parsed[f.name]
        if f.kind == "tensor" and f.encoding == "none" and f.dtype != "string":
            if f.dtype == "uint64":
                return tf.bitcast(value, tf.uint64)
            return tf.cast(value, tf_dtype(f.dtype))
        return value

    def finish(parsed: dict[str, Any]) -> dict[str, Any]:
        return {f.name: one(f, parsed) for f in wanted}

    return finish


def _python(view: TFDSView, f: TFDSFeature, parsed: dict[str, Any]) -> Any:
    keys = list(f.stored())

    def run(*values: Any) -> np.ndarray:
        stored = {
            k: (v if not isinstance(v, np.ndarray) or v.dtype != object else list(v))
            for k, v in zip(keys, values)
        }
        out = view.value(f, stored)
        return np.ascontiguousarray(out) if not isinstance(out, list) else np.stack(out)

    out = tf.numpy_function(run, [parsed[k] for k in keys], tf_dtype(f.dtype), stateful=False)
    out.set_shape(f.shape)
    return out
