"""TensorFlow: read recordkit datasets into ``tf.data``, in the epoch plan's order.

:func:`dataset` builds a ``tf.data.Dataset`` from a dataset's manifest (or a folder
of foreign TFRecords plus a schema) with no Python in the per-record path: records
in the order of :class:`~recordkit.reader.plan.EpochPlan` (the one ``recordkit.torch``
reads), one stateless ``tf.numpy_function`` per task, decoded natively into dense
tensors where the schema allows (``recordkit/tf/native.py``), else by
``tf.io.parse_example``; or TensorFlow's own ``TFRecordDataset`` for one unshuffled
pipeline of other schemas, the growing shard cache and ``gs://``.
``recordkit/tf/build.py`` lists the pipeline shapes, ``docs/tensorflow.md`` which
path reads what. :func:`feature_spec` gives the ``parse_example`` spec to users who
build their own pipeline.

What each feature becomes (``B`` = the batch dimension, absent without ``batch_size``):

=====================================  ==================================================
schema                                 element
=====================================  ==================================================
``Bytes()``                            ``tf.string`` ``[B]`` (``ReadOptions(bytes_as=
                                       "padded")``: ``uint8`` ``[B, longest]`` and
                                       ``name/lengths`` ``int64`` ``[B]``)
``Bytes((n,))``                        ``tf.string`` ``[B, n]``
``Bytes((None,))``                     ``tf.string`` ragged ``[B, None]``
``Int64(shape)`` / ``Float32(shape)``  ``tf.int64`` / ``tf.float32`` ``[B, *shape]``
``Tensor(dtype, shape)``               ``dtype`` ``[B, *shape]``
=====================================  ==================================================

A shape with ``None`` dims gives, batched, a ``tf.RaggedTensor`` whose ragged
dims are those ``None`` dims (per-record shapes are honoured: one ``None`` is
recovered from the element count, two or more from the ``name/shape``
companion feature). A zstd-compressed ``Tensor`` is decompressed in a
``tf.numpy_function`` -- the slow path: Python, under the GIL, once per record.

Remote datasets: paths TensorFlow reads natively (local paths and ``gs://``)
go straight to TensorFlow's file system layer; other URLs (``s3://``,
``http(s)://``, ...) raise an error naming the local shard cache, through which
they are read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .._deps import require
from ..codec import Schema
from ..reader.epochs import open_cache
from ..reader.mix import refuse_cache, sources
from ..reader.options import CacheOptions, ReadOptions, read_options
from ..reader.select import take_split
from ..storage import strip_file_scheme
from .build import PASSES, Request, choose
from .files import feature_spec, says_sequences, shard_files

tf = require("tensorflow", extra="tf")

# ReadOptions and CacheOptions are importable from here too (the same classes as
# recordkit.torch's, documented there): not in __all__, so the API page has them once.
__all__ = [
    "EpochCallback",
    "dataset",
    "feature_spec",
    "set_epoch",
    "shard_files",
]


def dataset(
    path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    batch_size: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    drop_last: bool = False,
    columns: Sequence[str] | None = None,
    schema: Schema | None = None,
    split: str | None = None,
    records: slice | str | Sequence[slice | str | None] | None = None,
    cache: Any = None,
    options: ReadOptions | None = None,
    epoch: int = 0,
    epochs: int | None = 1,
    input_context: Any = None,
) -> Any:
    """A ``tf.data.Dataset`` of a recordkit dataset (or a folder of TFRecords).

    The order of every epoch is the epoch plan's
    (:class:`recordkit.reader.plan.EpochPlan`, the one ``recordkit.torch``
    reads): a pure function of ``seed``, the epoch number and the position,
    never of TensorFlow's random state, so ``tf.random.set_seed`` does not
    change it, and an iterator saved with ``tf.train.Checkpoint(iterator=it)``
    continues the same stream, mid-epoch and across epochs, in a new process.
    One unshuffled pipeline of a schema the native path does not take (or given
    ``ReadOptions.num_threads``) reads through TensorFlow's own ``TFRecordDataset``;
    ``docs/tensorflow.md`` says which path reads what.

    Args:
        path_or_url: a dataset directory (with ``recordkit.json``), a folder of
            TFRecord files, one file, or a ``gs://`` URL of any of these; or a
            list of local ones, read as one (``docs/howto/mixing.md``): every
            record of each once per epoch, shuffled together; their schemas
            must agree on the features read (else a
            :class:`~recordkit.errors.SchemaError` naming the feature).
        batch_size: batch this many records (``parse_example`` on whole batches);
            ``None`` yields single records.
        shuffle: a new order every epoch, mixed like a uniform permutation on
            sorted data too (blocks of records in a keyed order, then records
            within windows of many blocks). Every pass over the dataset (each
            ``iter(ds)`` that is read from) reads the next epoch.
        seed: the shuffle seed (0 to 2**63 - 1).
        drop_last: drop the last, smaller batch; with ``input_context`` the
            shuffled epoch is cut to a multiple of the global batch
            (``batch_size`` times the number of pipelines), so every pipeline
            yields the same number of full batches.
        columns: decode only these features (default: all).
        schema: the schema of a foreign folder (default: inferred from its first
            records); overrides a manifest's.
        split: the split of a local tensorflow-datasets folder (needed when it
            has several; or give one of its shards): elements then hold tfds's
            dtypes and shapes, as ``tfds.load`` gives them (``columns`` names
            tfds's features). Read through the epoch plan, record by record.
        records: read only these records, the same every epoch (shuffled among
            themselves): ``slice(0, 10_000)`` or a split string, ``"[:10%]"``,
            ``"[1000:2000]"``, ``"train[:10%]"`` (tensorflow-datasets' split
            syntax; the name is ``split=``). For a list of datasets, a list of
            one range (or ``None``) per dataset. Read through the epoch plan.
        cache: read the remote dataset through a shard cache: a
            :class:`recordkit.cache.ShardCache` (``path_or_url`` is then only a
            label) or a :class:`CacheOptions` (which documents its ``epochs``).
            Whole epochs: the plan's order, the length known, and
            ``tf.train.Checkpoint`` resumes mid-epoch; one iterator at a time.
            Growing epochs: ``input_context`` splits by shard only, the length is
            unknown, and the order is not the plan's. See ``docs/cache.md``.
        options: the tuning, whole (:class:`ReadOptions`, which documents each
            field; those marked *torch* are refused here). What only this reader
            does with two of them: ``decode_images``: ``Bytes()`` features holding encoded
            images (a name, names, or :class:`~recordkit.images.ImageOptions`
            for the channels and the key feature) to decode with
            ``tf.io.decode_image``, per record, into ``uint8`` ``[H, W, C]``
            (``[B, None, None, C]`` ragged when batched: resize in a ``map`` with
            ``batch_size=None``, then batch). An image that does not decode fails
            the pipeline with TensorFlow's ``InvalidArgumentError`` carrying the
            :class:`~recordkit.errors.ImageDecodeError` message: the record's
            ``file:offset:record``, the feature, the source key (``path``) and
            why. Records are then read one by one (no vectorised batch parse).
            In a tensorflow-datasets folder, ``True`` decodes its ``Image``
            features with ``tf.io.decode_image`` (as tfds does).
            ``sequence_example``: the records are ``tf.train.SequenceExample``
            messages: each element is ``{"context": {name: 1-d tensor},
            "feature_lists": {name: ragged [steps, None]}}`` from
            ``tf.io.parse_single_sequence_example``, with specs (each feature's
            kind) from the first file's leading records; a record holding a
            feature or kind they lack fails the pipeline by name instead of being
            read in part. Batches are ragged (``ragged_batch``). Files are read in
            order (shuffled with ``shuffle``: by file, then in a buffer of
            ``shuffle_buffer`` records); no ``schema``, ``columns`` or cache.
            Implied by a manifest that says the records are SequenceExamples
            (``recordkit convert`` of them): the specs are then its schema,
            which names every feature each record holds, and TensorFlow parses
            with no check per record.
        epoch: the number of the first epoch this dataset yields (the plan's
            epoch: with ``shuffle``, each epoch number has its own order).
        epochs: epochs one pass over the dataset (one iterator) yields,
            numbered ``epoch``, ``epoch + 1``, ...; ``None`` repeats without
            end. Iterating the same dataset again reads the next epochs: each
            Keras ``fit`` epoch, or each ``for batch in ds`` of a loop, has a
            new order (see :func:`set_epoch` and :class:`EpochCallback` to
            number them yourself).
        input_context: a ``tf.distribute.InputContext``: pipelines split each
            epoch by global batch, as ``torch.distributed`` ranks do: pipeline
            *i* takes the *i*-th ``batch_size`` slice of each global batch.
            Each record is read by exactly one pipeline per epoch (the last,
            partial global batch is shared evenly unless ``drop_last``).

    The dataset knows its length (``len(ds)``: batches, or records, of this
    pipeline, times ``epochs``) where there is a manifest or a local folder, so
    Keras knows the steps per epoch.

    Raises:
        ShardNotFoundError: no dataset at the path, or a URL TensorFlow cannot read.
        SchemaError: a column not in the schema.
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if epochs is not None and epochs < 1:
        raise ValueError(f"epochs must be >= 1 or None, got {epochs}")
    read = read_options(options, "recordkit.tf.dataset")
    cached = CacheOptions.of(cache)
    paths, label = sources(path_or_url)
    split, records = take_split(split, records)
    if cached.used:  # a list, a record range or weights: refused with a cache
        refuse_cache(label, paths, records, read.weights, read.epoch_records)
    if input_context is not None:  # validates the pipeline numbers
        shard_files([], input_context.num_input_pipelines, input_context.input_pipeline_id)
    if cached.used and (split is not None or read.decode_images):
        raise ValueError(
            f"{label}: split= and decode_images= are for a local "
            "tensorflow-datasets folder, not a dataset read through a shard cache"
        )
    request = Request(
        path_or_url=label,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        columns=columns,
        schema=schema,
        split=split,
        records=records,
        options=read,
        epoch=epoch,
        epochs=epochs,
        input_context=input_context,
        paths=paths,
    )
    if request.mixing and (read.sequence_example or says_sequences(strip_file_scheme(paths[0]))):
        raise ValueError(f"{label}: SequenceExamples are not read as a list, records= or weights=")
    ds = choose(request, open_cache(request.path_or_url, cached))
    if not hasattr(ds, PASSES):
        setattr(ds, PASSES, None)  # not in the plan's order: no epoch number to set
    return ds


def set_epoch(ds: Any, epoch: int) -> None:
    """The next pass over ``ds`` (each ``iter(ds)``) reads epoch ``epoch`` (and the
    ``epochs - 1`` after it), as ``DistributedSampler.set_epoch`` does in PyTorch.

    Without it, each pass reads the epochs after the last one a pass over ``ds``
    began, which is a new order every pass; call it to tie the epochs to your own
    count (a run resumed at epoch ``k`` reads epoch ``k``'s order). A dataset whose
    order is not the plan's (unshuffled, through ``TFRecordDataset``: the same every
    pass; or shuffled by TensorFlow: new every pass) has no epoch to set: nothing
    changes.

    Args:
        ds: a dataset :func:`dataset` returned (not one made from it).
        epoch: the plan's epoch number (>= 0).

    Raises:
        TypeError: ``ds`` is not a dataset :func:`dataset` returned.
    """
    if not hasattr(ds, PASSES):
        raise TypeError(
            "set_epoch takes the dataset recordkit.tf.dataset() returned; a dataset made "
            "from it (ds.map(...), ds.take(...)) does not carry its epochs"
        )
    passes = getattr(ds, PASSES)
    if passes is not None:
        passes.set(epoch)


class EpochCallback(tf.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
    """A Keras callback that makes ``fit``'s epoch ``e`` read the dataset's epoch
    ``epoch + e * epochs`` (the ``epoch`` and ``epochs`` it was built with).

    Keras ``fit`` already reads a new order every epoch without it (each of its
    epochs is a new pass). With it the order also follows Keras' own epoch number,
    so a run that ``BackupAndRestore`` (or ``initial_epoch``) resumes at epoch ``k``
    reads epoch ``k``'s order, as the uninterrupted run did::

        ds = recordkit.tf.dataset(path, batch_size=32, shuffle=True, seed=0)
        model.fit(ds.map(to_xy), epochs=5, callbacks=[recordkit.tf.EpochCallback(ds)])

    Args:
        ds: a dataset :func:`dataset` returned (the one given to ``fit``, or the one
            it was made from with ``map``: they share its epochs).

    Raises:
        TypeError: ``ds`` is not a dataset :func:`dataset` returned.
    """

    def __init__(self, ds: Any) -> None:
        super().__init__()
        if not hasattr(ds, PASSES):
            raise TypeError(
                "EpochCallback takes the dataset recordkit.tf.dataset() returned; a "
                "dataset made from it (ds.map(...)) does not carry its epochs"
            )
        self.ds = ds

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        """Keras starts epoch ``epoch``: its pass reads the plan's matching epoch."""
        passes = getattr(self.ds, PASSES)
        if passes is not None:
            passes.set(passes.first + epoch * (passes.per_pass or 1))
