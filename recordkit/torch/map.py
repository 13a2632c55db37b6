"""``recordkit.torch.RecordMapDataset``: random access to records, for your own samplers.

Imported only by :mod:`recordkit.torch` (it imports torch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset as _TorchDataset

from .._origins import Origins, using
from ..codec.schema import Schema
from ..reader.decoders import make_decoder
from ..reader.local import ProcessLocalShards
from ..reader.options import ReadOptions, read_options
from ..reader.sequence import SAMPLE, read_whole
from .collate import collate, sequence_sample, to_torch

__all__ = ["RecordMapDataset"]


class RecordMapDataset(ProcessLocalShards, _TorchDataset):  # type: ignore[type-arg]
    """Random access to records by global index, for your own samplers.

    ``ds[i]`` decodes record ``i`` through the memory map into a ``dict`` of
    tensors (``Bytes()`` as ``bytes``); ``__getitems__`` decodes a whole list of
    indices in one native call, which ``DataLoader`` uses for batched sampling.

    Args:
        path: a dataset directory, a folder of ``.tfrecord`` files, or one file.
        columns: read only these features.
        transform: applied to each sample; while it runs the sample's record is
            known (:class:`~recordkit.torch.DecodeImages` names it when an image
            does not decode).
        schema: overrides the manifest's (or the inferred) schema.
        split: the split of a tensorflow-datasets folder (see
            :class:`~recordkit.torch.RecordDataset`).
        options: a :class:`~recordkit.reader.options.ReadOptions` of which this
            reads ``verify``, ``limits`` (a record's, and one ``__getitems__``
            call's, zstd values), ``partial``, ``decode_images`` (a
            tensorflow-datasets folder's ``Image`` features) and
            ``sequence_example`` (``ds[i]`` is one whole, as
            :class:`~recordkit.torch.RecordDataset` gives it; implied when the
            manifest says so; :meth:`collate` then makes a list); the others are
            refused.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        columns: Sequence[str] | None = None,
        schema: Schema | None = None,
        transform: Callable[[Any], Any] | None = None,
        split: str | None = None,
        options: ReadOptions | None = None,
    ) -> None:
        read = read_options(options, "recordkit.torch.RecordMapDataset")
        self.read_options = read
        self.path = os.fspath(path)
        self.split = split
        self.columns = list(columns) if columns is not None else None
        self.transform = transform
        given = schema
        if read.sequence_example and schema is None:
            schema = Schema({})  # opens foreign data without inferring an Example schema
        if schema is not None:  # opening with it: foreign data is not inferred (and refused)
            self.schema = schema
        shards = self._open()
        self.sequence_example = read_whole(
            self.path, read.sequence_example, shards, given, columns, read.decode_images
        )
        self.schema = schema or shards.schema
        self._starts = np.concatenate(([0], np.cumsum(shards.counts)))
        self._dec = make_decoder(
            self.schema,
            read,
            self.columns,
            view=None if self.sequence_example else self._view(),
            sequence_example=self.sequence_example,
            ragged_as="list",
            bytes_as="list",
        )

    def __len__(self) -> int:
        return int(self._starts[-1])

    def collate(self, samples: Sequence[dict[str, Any]]) -> Any:
        """:func:`collate` with this dataset's schema: a ``collate_fn`` for ``DataLoader``
        (SequenceExamples, ragged: the list of samples, to pad in your own)."""
        if self.sequence_example:
            return list(samples)
        view = self._view()
        return collate(samples, schema=view.output_schema if view is not None else self.schema)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        shards = self._open()
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"index out of range for a dataset of {n} records")
        idx = np.where(idx < 0, idx + n, idx)
        which = np.searchsorted(self._starts, idx, side="right") - 1
        out: list[dict[str, Any]] = [{} for _ in range(len(idx))]
        records = idx - self._starts[which]
        for s in np.unique(which).tolist():
            rows = np.flatnonzero(which == s)
            recs = idx[rows] - self._starts[s]
            with shards.use(s) as shard:
                offsets, sizes = shard.offsets[recs], shard.sizes[recs]
                batch = self._dec.decode(shard.buf, offsets, sizes, path=shard.path, records=recs)
            if batch.bad:
                pos, err = batch.bad[0]
                raise err.located(shard.path, int(offsets[pos]), int(recs[pos]))
            if self.sequence_example:
                for j, row in enumerate(rows.tolist()):
                    out[row] = sequence_sample(batch.columns[SAMPLE][j])
                continue
            for j, row in enumerate(rows.tolist()):
                out[row] = {k: to_torch(v[j]) for k, v in batch.columns.items()}
        if self.transform is not None:
            transform = self.transform  # with each sample's origin current (DecodeImages)
            out = [
                using(Origins(shards, which[i : i + 1], records[i : i + 1]), transform, x)
                for i, x in enumerate(out)
            ]
        return out
