"""``ReadOptions(decode_images=...)`` of ``recordkit.tf.dataset``: ``tf.io.decode_image``
that names what fails.

Used by :mod:`recordkit.tf` alone. A TensorFlow op that fails cannot be caught
inside a pipeline, and its error knows nothing of records; so each image is
decoded in a one-element inner dataset whose errors are dropped
(``ignore_errors``), followed by a fallback element that says "it failed". Only
then does a ``tf.numpy_function`` run: it finds the record
(``file:offset:record``) from the position the element carries, reads the
source key, asks Pillow (when installed) why the bytes do not decode, and
raises :class:`~recordkit.errors.ImageDecodeError`, whose message TensorFlow
passes on in its own error. An image that decodes costs no Python.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._deps import require
from ..codec import Bytes, Schema
from ..errors import ImageDecodeError, OptionError, SchemaError
from ..format.index import INDEX_SUFFIX, parse_index
from ..images import ImageOptions, decode_image, describe, pillow
from .tasks import PlanTasks

tf = require("tensorflow", extra="tf")

__all__ = ["ImagesStep", "Locate", "file_locator", "image_options", "images_step", "task_locator"]

#: ``locate(*position) -> (path, offset, record)``: the record at a position an element carries.
Locate = Callable[..., tuple[str, "int | None", "int | None"]]
#: ``step(element, position) -> element`` with its images decoded.
ImagesStep = Callable[[dict[str, Any], Sequence[Any]], dict[str, Any]]


def image_options(value: Any, schema: Schema, names: Sequence[str]) -> ImageOptions:
    """``decode_images=`` as :class:`ImageOptions`, checked against the features read."""
    options = value if isinstance(value, ImageOptions) else ImageOptions(value)
    if options.apply_exif_orientation:
        raise OptionError("apply_exif_orientation: tf.io.decode_image cannot; rotate in a map")
    for name in options.features:
        if name not in names:
            raise SchemaError(f"decode_images: {name!r} is not among the features read {names}")
        if schema[name] != Bytes():
            raise SchemaError(
                f"decode_images: {name!r} is {schema[name]!r}, not Bytes() (encoded image bytes)"
            )
    return options


def _decode(data: Any, mode: str) -> Any:
    """``tf.io.decode_image`` in ``mode``'s channels (JPEG and GIF refuse some counts: convert)."""
    if mode == "RGB":
        return tf.io.decode_image(data, channels=3, expand_animations=False)
    if mode == "L":
        rgb = tf.io.decode_image(data, channels=3, expand_animations=False)
        return tf.image.rgb_to_grayscale(rgb)
    img = tf.io.decode_image(data, channels=0, expand_animations=False)  # RGBA
    c = tf.shape(img)[-1]
    opaque = tf.fill(tf.concat([tf.shape(img)[:2], [1]], 0), tf.constant(255, tf.uint8))
    return tf.switch_case(
        tf.clip_by_value(c, 1, 4) - 1,
        [
            lambda: tf.concat([tf.image.grayscale_to_rgb(img[:, :, :1]), opaque], -1),
            lambda: tf.concat([tf.image.grayscale_to_rgb(img[:, :, :1]), img[:, :, 1:2]], -1),
            lambda: tf.concat([img[:, :, :3], opaque], -1),
            lambda: img[:, :, :4],
        ],
    )


def images_step(
    value: Any, schema: Schema, names: Sequence[str], locate: Locate
) -> ImagesStep | None:
    """The per-record step of ``decode_images=value`` (``None``: nothing to decode).

    ``position``, the step's second argument, is what ``locate`` takes
    (tensors: a task's epoch, number and row, or a file name and record number).
    """
    if value is None:
        return None
    options = image_options(value, schema, names)
    if importlib.util.find_spec("PIL") is not None:
        pillow()  # Pillow's plugins imported here, not on the pipeline's threads
    channels = options.channels
    key = options.key_feature(list(names))
    empty = tf.zeros([0, 0, channels], tf.uint8)

    def fail(feature: bytes, data: bytes, source: bytes, *position: Any) -> np.ndarray:
        name = feature.decode()
        path, offset, record = locate(*position)
        try:
            decode_image(data, mode=options.mode)
            reason = (
                f"tf.io.decode_image does not read it ({_format(data)}; it reads JPEG, PNG, "
                "GIF, BMP and WebP), though Pillow does"
            )
        except ImageDecodeError as exc:
            reason = exc.reason
        except ImportError:  # no Pillow to say why
            reason = describe(ValueError("tf.io.decode_image cannot decode it"), data)
        named = f", source key {source.decode('utf-8', 'replace')!r}" if key else ""
        raise ImageDecodeError(
            f"image feature {name!r}{named} does not decode: {reason}",
            path=path,
            offset=offset,
            record=record,
            feature=name,
            key=source.decode("utf-8", "replace") if key else None,
        )

    def one(name: str, data: Any, source: Any, position: Sequence[Any]) -> Any:
        tried = tf.data.Dataset.from_tensors(data).map(lambda b: (_decode(b, options.mode), True))
        fallback = tf.data.Dataset.from_tensors((empty, False))
        img, ok = tried.ignore_errors().concatenate(fallback).take(1).get_single_element()
        check = tf.cond(
            ok,
            lambda: tf.constant(0, tf.int64),
            lambda: tf.numpy_function(
                fail, [tf.constant(name), data, source, *position], tf.int64, stateful=True
            ),
        )
        with tf.control_dependencies([check]):
            img = tf.identity(img)
        img.set_shape([None, None, channels])
        return img

    def step(element: dict[str, Any], position: Sequence[Any]) -> dict[str, Any]:
        out = dict(element)
        source = element[key] if key else tf.constant(b"")
        if source.dtype != tf.string:
            source = tf.strings.as_string(source)
        if source.shape.rank:  # a key feature with a shape: its first value names the sample
            source = tf.reshape(source, [-1])[0]
        for name in options.features:
            out[name] = one(name, element[name], source, position)
        return out

    return step


def task_locator(tasks: PlanTasks) -> Locate:
    """Where row ``j`` of task ``t`` of epoch ``e`` is (the plan gives its shard and record)."""

    def locate(e: Any, t: Any, j: Any) -> tuple[str, int | None, int | None]:
        shard_ids, records = tasks.records(int(e), int(t))
        sid, record = int(shard_ids[int(j)]), int(records[int(j)])
        with tasks.shards.use(sid) as shard:
            return shard.path, int(shard.offsets[record]), record

    return locate


def file_locator(f: Any, n: Any) -> tuple[str, int | None, int | None]:
    """Where record ``n`` of file ``f`` is (its offset from the index, when there is one)."""
    path = f.decode() if isinstance(f, bytes) else str(f)
    try:
        with tf.io.gfile.GFile(path + INDEX_SUFFIX, "rb") as fh:
            entries = parse_index(fh.read(), path=path + INDEX_SUFFIX)
        offset: int | None = int(entries[int(n), 0])
    except Exception:  # already failing: a missing index must not hide the error
        offset = None
    return path, offset, int(n)


def _format(data: bytes) -> str:
    """What the bytes look like, for a message (the leading signature)."""
    if data.startswith((b"II*\x00", b"MM\x00*")):
        return "a TIFF image"
    if data[:1] == b"P" and data[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6", b"7"):
        return "a PNM image"
    return f"{len(data)} bytes starting {data[:8]!r}"
