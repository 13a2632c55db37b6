"""``recordkit.Dataset``: the reference reader (in order, or random access by index).

This is the simple, obviously-correct reader the fast ones are checked against:
it memory-maps each shard, validates (or rebuilds) its index, checks every CRC
and decodes one record at a time on the calling thread, each copied out of the
map first (:mod:`recordkit.format.guard`: a shard truncated under the reader raises
:class:`~recordkit.errors.ShardChangedError`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .codec.example import decode_example
from .codec.limits import DecodeLimits
from .codec.schema import Schema
from .codec.sequence import SequenceSchema, as_stored, sequence_example_values
from .errors import CorruptRecordError, ManifestError, SchemaError
from .format import guard
from .format.framing import read_record
from .format.manifest import MANIFEST_NAME, ShardInfo
from .reader.finding import find_shards
from .reader.shards import MappedShard, open_shards
from .reader.tfds import TFDSInfo

__all__ = ["Dataset", "find_shards"]

log = logging.getLogger(__name__)


class Dataset:
    r"""Read a recordkit dataset, a folder of foreign TFRecords, or a single shard.

    ``len(ds)`` is the number of records, ``ds[i]`` decodes record ``i`` (global
    over shards in dataset order, negative indices count from the end), and
    iterating yields every record in order. Each sample is a ``dict``: ``Bytes``
    features as ``bytes`` (a list of ``bytes`` for list shapes), numeric and
    ``Tensor`` features as NumPy arrays of the feature's shape (0-d for scalars).
    Samples own their memory; they stay valid after :meth:`close`.

    Args:
        path: a dataset directory (with ``recordkit.json``), a directory of
            TFRecord files without one (found by the names engines give them:
            ``*.tfrecord``, ``*.tfrecords``, ``*.tfr``, ``data-00000-of-00004``,
            or any file that begins with a TFRecord frame, as Ray's
            ``{uuid}_{task}.tar``), one TFRecord file, a glob of files
            (``"out/data-*-of-*"``), or a list of files or datasets read as one.
        schema: overrides the manifest's schema; required for nothing, but for
            foreign data it saves inferring one from the first records.
        partial: read a directory where a write of ours did not finish (the
            shards it published, with a WARNING) instead of refusing it.
        limits: the bytes one record's zstd values may decompress to (default:
            derived from the schema, 256 MiB for variable shapes; see
            :class:`~recordkit.codec.DecodeLimits`).
        raw: return each record's features as that record holds them, without a
            schema: its own keys, ``bytes`` lists as ``list[bytes]``, ``int64``
            and ``float`` lists as 1-d ``int64`` / ``float32`` arrays (empty
            ones kept, typed as stored), a feature with no list set as ``[]``.
            For foreign data whose records differ (optional keys, a key of
            different kinds); ``schema`` is then ``None``.
        sequence_example: the payloads are ``tf.train.SequenceExample``\ s:
            read each whole, as ``{"context": {...}, "feature_lists": {name:
            [step, ...]}}`` with every value as ``raw`` gives it (steps may
            differ in length). Implies ``raw``. Without it, a SequenceExample
            is a :class:`~recordkit.errors.SequenceExampleError`, never its
            context alone. A dataset whose manifest says its payloads are
            SequenceExamples (``recordkit convert`` of them) is read so without
            it; see :attr:`sequence_schema`.
        write_index: write indexes rebuilt for foreign shards beside them (best
            effort). By default they go to the per-user index cache
            (``RECORDKIT_INDEX_CACHE``), so reading never writes into a folder
            recordkit did not write.
        split: the split of a tensorflow-datasets folder to read (``"train"``);
            needed when it has more than one (or give the path of one of its
            shards). Samples then hold tfds's values: each feature in its own
            dtype and shape (``ClassLabel`` as int64, ``Text`` as ``str``,
            ``Image`` as encoded bytes), nested names joined by ``/``; see
            :attr:`tfds` for the class names. With ``schema`` or ``raw``, the
            records as stored instead.
        decode_images: in a tensorflow-datasets folder, decode ``Image``
            features to ``uint8`` arrays ``(h, w, c)`` with Pillow, as tfds does.

    A dataset pickles by reference, never with its maps or data: the shards' paths,
    record counts and sizes, the schema and the options travel (a few hundred bytes
    plus about a hundred per shard), and each process maps the shards it reads on
    first use, checking each against its size then. So it is a random-access source
    for loaders that copy it into worker processes, forked or spawned: Grain's
    ``DataLoader(data_source=rk.Dataset(path), worker_count=N)`` (see
    ``docs/howto/grain.md``), or a torch map-style ``DataLoader``.

    Raises:
        ShardNotFoundError: the path, or a shard the manifest lists, does not exist.
        ManifestError: the manifest is malformed or disagrees with the shards.
        IncompleteDatasetError: a write of ours did not finish here (not ``partial``).
        CorruptRecordError: on reading a corrupt record (names file, offset, record).
        RecordTooLargeError: on reading a record over ``limits`` (before allocating).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        schema: Schema | None = None,
        *,
        raw: bool = False,
        sequence_example: bool = False,
        write_index: bool = False,
        partial: bool = False,
        limits: DecodeLimits | None = None,
        split: str | None = None,
        decode_images: bool = False,
    ) -> None:
        if limits is not None and not isinstance(limits, DecodeLimits):
            raise TypeError(f"limits must be a DecodeLimits or None, got {limits!r}")
        self.limits = limits or DecodeLimits()
        raw = raw or sequence_example
        if raw and schema is not None:
            raise ValueError("Dataset: pass a schema or raw=True (sequence_example=True), not both")
        self.sequence_example = sequence_example
        # Raw reading needs no schema: an empty one spares inference (which would
        # refuse records that differ, the very data raw reading is for).
        if not isinstance(path, (str, os.PathLike)):  # files (or datasets) read as one
            from .reader.mix import open_sources

            self._set = open_sources(
                [os.fspath(p) for p in path], Schema({}) if raw else schema, partial=partial
            )
        else:
            self._set = open_shards(
                path,
                Schema({}) if raw else schema,
                write_index=write_index,
                partial=partial,
                split=split,
            )
        self.manifest = self._set.manifest
        if self.manifest is not None and self.manifest.sequence_example:
            if schema is not None:
                self._set.close()
                raise ValueError(
                    f"{path}: its manifest says the records are tf.train.SequenceExamples, "
                    "read whole: pass no schema"
                )
            self.sequence_example = raw = True
        self.raw = raw
        self.root = self._set.root
        self.schema: Schema | None = None if raw else self._set.schema
        view = self._set.view
        if decode_images and view is None:
            raise ValueError("decode_images=True is for tensorflow-datasets folders")
        self._view = view.with_options(decode_images=decode_images, limits=limits) if view else None
        self._starts = np.concatenate(([0], np.cumsum(self._set.counts)))

    @property
    def shards(self) -> list[ShardInfo]:
        """The shards in dataset order (record counts and sizes as found on disk)."""
        return list(self._set.infos)

    @property
    def metadata(self) -> dict[str, Any]:
        """The manifest's metadata; for a tensorflow-datasets folder ``{"tfds": {...}}``
        (name, version, split, splits, class names, features); else empty."""
        if self._view is not None:
            return {"tfds": self._view.info.to_json(self._view.split)}
        return dict(self.manifest.metadata) if self.manifest else {}

    @property
    def sequence_schema(self) -> SequenceSchema | None:
        """What the records of a SequenceExample dataset hold, from its manifest (each
        context feature and feature list, its kinds, counts and lengths); ``None``
        for other data."""
        if self.manifest is None or not self.manifest.sequence_example:
            return None
        try:
            return SequenceSchema.from_json(self.manifest.schema)
        except SchemaError as exc:
            where = os.path.join(self.root, MANIFEST_NAME)
            raise ManifestError(f"bad SequenceExample schema: {exc}", path=where) from exc

    @property
    def tfds(self) -> TFDSInfo | None:
        """The tensorflow-datasets folder read (``None`` for other data): its splits,
        features and ``class_names`` (``ds.tfds.class_names["label"][3]``)."""
        return self._view.info if self._view is not None else None

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _decode(self, shard: MappedShard, i: int) -> dict[str, Any]:
        offset, size = int(shard.offsets[i]), int(shard.sizes[i])
        # One size check and one guarded copy of the framed record: everything after
        # reads the copy, never the map.
        framed = guard.read(shard.buf, offset, size, path=shard.path, offset=offset, record=i)
        try:
            payload = read_record(framed, 0, expected_size=size)
        except CorruptRecordError as exc:
            shard.payload(i)  # read from the map: the exact error, or ShardChangedError
            raise exc.located(shard.path, offset, i) from exc  # (the map reads clean now)
        try:
            if self.sequence_example:
                return sequence_example_values(payload)
            if self.schema is None:
                return {n: as_stored(k, v) for n, (k, v) in decode_example(payload).items()}
            values = self.schema.decode(payload, copy=True, limits=self.limits)
            return values if self._view is None else self._view.sample(values)
        except CorruptRecordError as exc:
            raise exc.located(shard.path, offset, i) from exc

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # One shard mapped at a time (held while its records are read), so a
        # dataset of any number of shards iterates within the map budget.
        for s in range(len(self._set)):
            with self._set.use(s) as shard:
                for i in range(shard.records):
                    yield self._decode(shard, i)

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self)
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"Dataset indices must be integers, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"record {index} out of range for a dataset of {n} records")
        index = int(index) % n
        s = int(np.searchsorted(self._starts, index, side="right")) - 1
        with self._set.use(s) as shard:
            return self._decode(shard, index - int(self._starts[s]))

    def close(self) -> None:
        """Unmap every shard (maps are opened again on the next read)."""
        self._set.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Dataset({self.root!r}, shards={len(self._set)}, records={len(self)}, "
            f"schema={self.schema!r})"
        )
