"""The pipeline shapes of :func:`recordkit.tf.dataset`, one builder each.

``dataset()`` checks its arguments into a :class:`Request`, opens the cache (if
any) and calls the one builder that reads what it was given:

=========================  ============================================================
builder                    reads
=========================  ============================================================
:func:`whole_epochs`       a remote dataset through a shard cache, every record every
                           epoch, in the plan's order (the cache's default)
:func:`growing_epochs`     what a growing cache holds at each epoch's start, through
                           ``TFRecordDataset``
:func:`sequence_examples`  ``tf.train.SequenceExample`` records, whole
:func:`tfds_split`         a local tensorflow-datasets folder, in the plan's order,
                           with tfds's dtypes and shapes
:func:`plan_ordered`       local data shuffled or split over pipelines, in the plan's
                           order (checkpointable positions)
:func:`tfrecord_files`     one unshuffled pipeline, or ``gs://``: TensorFlow's own
                           ``TFRecordDataset`` over the shard list
=========================  ============================================================

Images (``decode_images=``) are a step inside the builders that parse records, not a
shape of their own. Every builder returns the dataset ``prefetch``-ed; the two in the
plan's order prefetch inside each pass and carry the :class:`~recordkit.tf.pipes.Passes`
that number its epochs (:func:`numbered`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._deps import require
from ..codec import Schema
from ..errors import ShardNotFoundError
from ..format.index import INDEX_SUFFIX
from ..images import ImageOptions
from ..reader.growing import CacheEpochs
from ..reader.mix import make_mix, open_sources
from ..reader.options import ReadOptions
from ..reader.plan import PlanOptions
from ..reader.whole import TaskFeed, WholeEpochs
from .decode import padded_bytes
from .files import (
    cached_files,
    check_finished,
    column_names,
    feature_spec,
    is_tfds,
    locate,
    says_sequences,
    shard_files,
)
from .images import file_locator, images_step, task_locator
from .native import NativeTasks, takes
from .pipes import Passes, native, no_model_thread, planned
from .tasks import PlanTasks

tf = require("tensorflow", extra="tf")

__all__ = [
    "PASSES",
    "Request",
    "growing_epochs",
    "numbered",
    "plan_ordered",
    "sequence_examples",
    "tfds_split",
    "tfrecord_files",
    "whole_epochs",
]

_TFDS_IMAGES_ONLY = (
    "decode_images=True is for tensorflow-datasets folders; name the Bytes() features "
    "that hold encoded images in other data (decode_images='image')"
)


@dataclass(frozen=True)
class Request:
    """What ``dataset()`` was asked for (its arguments, checked), and where it reads."""

    path_or_url: str  # as given (os.fspath)
    batch_size: int | None
    shuffle: bool
    seed: int
    drop_last: bool
    columns: Sequence[str] | None
    schema: Schema | None
    split: str | None
    records: Any  # a record range (or one per dataset), split name taken out
    options: ReadOptions  # the tuning, whole
    epoch: int
    epochs: int | None
    input_context: Any
    paths: Sequence[str]  # the datasets read (one, or several read as one)

    @property
    def mixing(self) -> bool:
        """Several datasets, a record range or weights: read through the epoch plan."""
        return len(self.paths) > 1 or any(
            x is not None for x in (self.records, self.options.weights, self.options.epoch_records)
        )

    @property
    def path(self) -> str:
        """The path without a ``file://`` scheme."""
        from ..storage import strip_file_scheme

        return strip_file_scheme(self.path_or_url)

    @property
    def local(self) -> bool:
        return "://" not in self.path

    @property
    def pipelines(self) -> tuple[int, int]:
        """``(number of input pipelines, this one's id)``."""
        ctx = self.input_context
        return (1, 0) if ctx is None else (ctx.num_input_pipelines, ctx.input_pipeline_id)

    @property
    def tfds_images(self) -> bool:
        """``decode_images=True``: a tensorflow-datasets folder's ``Image`` features."""
        return self.options.decode_images is True

    @property
    def named_images(self) -> str | Sequence[str] | ImageOptions | None:
        """``decode_images=`` names or options: ``Bytes()`` features of any other data."""
        images = self.options.decode_images
        if isinstance(images, (bool, type(None))):
            return None
        return images

    def wants_tfds(self) -> bool:
        """A local tensorflow-datasets folder (asked for, or found there)."""
        return self.local and (self.split is not None or self.tfds_images or is_tfds(self.path))

    @property
    def padded(self) -> bool:
        """``bytes_as="padded"``: ``Bytes()`` values as padded ``uint8`` rows and lengths."""
        return self.options.bytes_as == "padded"

    def bytes_layout(self, ds: Any, schema: Schema) -> Any:
        """``ds`` with its ``Bytes()`` values laid out as ``bytes_as`` asks."""
        if not self.padded:
            return ds
        return padded_bytes(ds, schema, batched=self.batch_size is not None)

    def repeated(self, ds: Any) -> Any:
        """``ds`` (one epoch) repeated ``epochs`` times, prefetched."""
        if self.epochs != 1:
            ds = ds.repeat(self.epochs)
        return ds.prefetch(tf.data.AUTOTUNE).with_options(no_model_thread(tf.data.Options()))


def whole_epochs(req: Request, source: WholeEpochs) -> Any:
    """Every record of a cached remote dataset every epoch, in the epoch plan's order.

    The shards the plan needs next are fetched ahead of the readers within the
    budget (a :class:`~recordkit.reader.whole.TaskFeed` per task); the length is
    known and ``tf.train.Checkpoint`` resumes mid-epoch.
    """
    assert source.manifest is not None
    if req.options.sequence_example or source.manifest.sequence_example:
        raise ValueError(
            f"{req.path_or_url}: sequence_example=True, or a manifest that says its "
            "records are SequenceExamples: they are read whole, not through a shard cache"
        )
    pipelines, pipeline = req.pipelines
    schema = Schema.from_json(source.manifest.schema) if req.schema is None else req.schema
    options = PlanOptions(
        shuffle=req.shuffle,
        seed=req.seed,
        batch_size=req.batch_size,
        drop_last=req.drop_last,
        shard_window_bytes=source.window_bytes(req.shuffle),
    )
    shards = source.shard_set(schema)
    # a task's records span at most two shard windows (a quarter of the budget)
    task_bytes = max(1, min(4 << 20, source.capacity // 4))
    names = column_names(schema, req.columns)
    keys = feature_spec(schema, names)
    tasks = PlanTasks(shards, options, pipeline, pipelines, keys, task_bytes=task_bytes)
    tasks.feed = TaskFeed(
        source,
        shards,
        tasks.plan,
        task_units=tasks.task_units,
        tasks=tasks.tasks,
        rank=pipeline,
        world_size=pipelines,
    )
    dense = None
    if takes(schema, names):
        dense = NativeTasks(tasks, schema, names, req.options.limits, req.padded)
    ds, passes = planned(
        tasks, schema, names, req.batch_size, req.epoch, req.epochs, req.options.limits, dense=dense
    )
    return numbered(req.bytes_layout(ds, schema), passes)


def sequence_examples(req: Request) -> Any:
    """``tf.train.SequenceExample`` records, each parsed whole (``sequence_example=True``,
    or a manifest that says so): files in order, or shuffled by file then in a buffer."""
    path = req.path
    if req.schema is not None or req.columns is not None:
        raise ValueError(
            f"{path}: sequence_example=True, or a manifest that says so: records are read "
            "whole: no schema, columns or cache"
        )
    if req.options.decode_images:
        raise ValueError(
            f"{path}: sequence_example=True, or a manifest that says so: records are read "
            "whole: no decode_images"
        )
    from .sequence import pipeline as sequences

    check_finished(path, req.options.partial)
    files, _, manifest = locate(req.path_or_url, Schema({}))
    by_record = False
    if req.input_context is not None:
        files, by_record = shard_files(files, *req.pipelines)
    ds = sequences(
        files,
        req.batch_size,
        req.shuffle,
        req.seed,
        req.options.shuffle_buffer,
        req.drop_last,
        by_record,
        req.input_context,
        manifest,
        path,
    )
    return req.repeated(ds)


def tfds_split(req: Request) -> Any:
    """A split of a local tensorflow-datasets folder in the plan's order, record by record,
    with tfds's dtypes and shapes (``decode_images=True``: its ``Image`` features decoded)."""
    return _plan_ordered_local(req)


def plan_ordered(req: Request) -> Any:
    """Local data shuffled or split over input pipelines, in the epoch plan's order
    (positions ``tf.train.Checkpoint`` saves; images, if named, decoded per record)."""
    return _plan_ordered_local(req)


def _plan_ordered_local(req: Request) -> Any:
    path = req.path
    if not req.mixing and not os.path.exists(path):
        raise ShardNotFoundError(f"no such dataset: {path}")
    shards = open_sources(
        list(req.paths),
        req.schema,
        columns=req.columns,
        partial=req.options.partial,
        split=req.split,
    )
    view = shards.view
    if req.tfds_images and view is None:
        raise ValueError(_TFDS_IMAGES_ONLY)
    if view is not None and req.named_images is not None:
        raise ValueError(
            "a tensorflow-datasets folder's Image features are decoded with "
            f"decode_images=True, not decode_images={req.options.decode_images!r}"
        )
    finish = None
    if view is not None:
        from .tfds import finisher

        view = view.with_options(decode_images=req.tfds_images, limits=req.options.limits)
        names = view.stored_columns(req.columns) or list(shards.schema.names)
        finish = finisher(view, req.columns)
    else:
        names = column_names(shards.schema, req.columns)
    mix = make_mix(
        shards,
        records=req.records,
        weights=req.options.weights,
        epoch_records=req.options.epoch_records,
    )
    options = PlanOptions(
        shuffle=req.shuffle,
        seed=req.seed,
        batch_size=req.batch_size,
        drop_last=req.drop_last,
        mix=mix,
    )
    pipelines, pipeline = req.pipelines
    tasks = PlanTasks(shards, options, pipeline, pipelines, feature_spec(shards.schema, names))
    images = images_step(req.named_images, shards.schema, names, task_locator(tasks))
    dense = None
    if images is None and finish is None and takes(shards.schema, names):
        dense = NativeTasks(tasks, shards.schema, names, req.options.limits, req.padded)
    ds, passes = planned(
        tasks,
        shards.schema,
        names,
        req.batch_size,
        req.epoch,
        req.epochs,
        req.options.limits,
        images,
        finish,
        dense,
    )
    return numbered(req.bytes_layout(ds, shards.schema), passes)


def growing_epochs(req: Request, source: CacheEpochs) -> Any:
    """Each epoch, the shards complete in a growing cache when it starts (pinned until the
    next), through ``TFRecordDataset``; shuffled by shard and in a buffer, split by shard."""
    epoch_files, files, schema, manifest = cached_files(
        source, req.schema, req.seed, req.shuffle, req.input_context
    )
    return _native(req, files, schema, manifest, epoch_files)


def tfrecord_files(req: Request) -> Any:
    """The shard list through TensorFlow's own ``TFRecordDataset`` with a parallel
    interleave: one unshuffled pipeline over local data, or anything under ``gs://``."""
    check_finished(req.path, req.options.partial)
    files, schema, manifest = locate(req.path_or_url, req.schema)
    return _native(req, files, schema, manifest, None)


def _native(req: Request, files: list[str], schema: Schema, manifest: Any, epoch_files: Any) -> Any:
    names = column_names(schema, req.columns)
    spec = feature_spec(schema, names)
    if req.tfds_images:  # a cache or a URL: never a tensorflow-datasets folder
        raise ValueError(_TFDS_IMAGES_ONLY)
    images = images_step(req.named_images, schema, names, file_locator)
    counts = dict(zip(files, (s.records for s in manifest.shards))) if manifest else None
    by_record = False
    if epoch_files is not None:
        counts = None  # the set changes from epoch to epoch
    elif req.input_context is not None:
        files, by_record = shard_files(files, *req.pipelines)
    ds = native(
        files,
        manifest,
        schema,
        names,
        spec,
        counts,
        by_record,
        epoch_files,
        batch_size=req.batch_size,
        shuffle=req.shuffle,
        seed=req.seed,
        shuffle_buffer=req.options.shuffle_buffer,
        drop_remainder=req.drop_last,
        input_context=req.input_context,
        deterministic=req.options.deterministic,
        num_parallel_reads=req.options.num_threads,
        limits=req.options.limits,
        images=images,
    )
    return req.repeated(req.bytes_layout(ds, schema))


# The attribute under which a dataset in the plan's order carries its Passes.
PASSES = "_recordkit_passes"


def numbered(ds: Any, passes: Passes) -> Any:
    """``ds`` carrying the :class:`~recordkit.tf.pipes.Passes` that number its epochs
    (what ``recordkit.tf.set_epoch`` sets)."""
    setattr(ds, PASSES, passes)
    return ds


def choose(req: Request, source: WholeEpochs | CacheEpochs | None) -> Any:
    """The dataset ``req`` asks for, from the one builder that reads it."""
    if isinstance(source, WholeEpochs):
        return whole_epochs(req, source)
    if req.options.sequence_example or (source is None and says_sequences(req.path)):
        if source is not None:
            raise ValueError(
                f"{req.path}: sequence_example=True, or a manifest that says so: records are "
                "read whole: no schema, columns or cache"
            )
        return sequence_examples(req)
    if source is not None:
        return growing_epochs(req, source)
    if req.wants_tfds() and not req.mixing:
        return tfds_split(req)
    if req.mixing or (req.local and (req.shuffle or req.pipelines[0] > 1)):
        return plan_ordered(req)
    if (
        req.local
        and req.options.num_threads is None
        and not req.options.decode_images
        and dense(req)
    ):
        return plan_ordered(req)
    return tfrecord_files(req)


def dense(req: Request) -> bool:
    """Whether one unshuffled local pipeline reads natively into dense tensors, in the
    plan's order (dataset order), rather than through ``TFRecordDataset``: every feature
    read is one :mod:`recordkit.tf.native` takes, and the shards are indexed (a foreign
    folder without ``.idx`` sidecars is streamed by TensorFlow, never scanned first)."""
    check_finished(req.path, req.options.partial)
    files, schema, manifest = locate(req.path_or_url, req.schema)
    if not takes(schema, column_names(schema, req.columns)):
        return False
    return manifest is not None or all(os.path.exists(f + INDEX_SUFFIX) for f in files)
