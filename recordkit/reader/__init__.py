"""The read floor: every way recordkit reads shards, and the pieces they share.

Nothing here imports a framework. The read paths, from the simplest to the fastest:

==============================================  ==========================================
read path                                       use it when
==============================================  ==========================================
:class:`recordkit.Dataset` (``dataset.py``)     you want obviously-correct reading: one
                                                record at a time on the calling thread, in
                                                order or by index. The reference the fast
                                                paths are tested against; debugging,
                                                small data, tools.
the thread pool, ``RecordReader``               training from PyTorch (what
(``pipeline.py``)                               :class:`recordkit.torch.RecordDataset`
                                                runs): reader threads verify, decode and
                                                batch whole tasks of the epoch plan off
                                                the training thread, into reused buffers.
the native runner (``decode.py``,               automatically, inside the thread pool,
``pipeline.py``, ``recordkit/native/``)         for schemas it covers: a whole task
                                                (CRC, Example spans, batch copies) in one
                                                C call with the GIL released. Nothing to
                                                choose; ``RecordReader(native_tasks=...)``
                                                turns it off.
the loader process, ``ProcessReader``           the training step's Python holds the GIL
(``process.py``)                                so hard that reader threads starve
                                                (``ReadOptions(reader_process=True)``):
                                                the same threads in a spawned process,
                                                chunks handed over in shared memory.
:class:`recordkit.torch.RecordMapDataset`       your own sampler needs random access by
(``recordkit/torch/map.py``)                    global index (``ds[i]``, batched
                                                ``__getitems__``).
:mod:`recordkit.tf`                             TensorFlow: ``tf.data`` from the epoch plan
                                                (``recordkit/tf/build.py`` names its
                                                pipeline shapes), or TensorFlow's own
                                                ``TFRecordDataset``.
:func:`recordkit.verify` (``verify.py``)        checking a dataset, not training on it:
                                                every frame, index, CRC and payload, with
                                                every problem reported, nothing decoded
                                                into batches.
==============================================  ==========================================

What they share, exported here for the packages above (``recordkit.torch``,
``recordkit.tf``, ``recordkit.dataset``, ``recordkit.verify``, the converters):

- shards: ``ShardSet`` (a dataset's shards, mapped on demand within a budget),
  ``open_shards``, ``find_shards``, ``MappedShard``,
  ``ProcessLocalShards`` (a reader object that DataLoader or Grain workers copy);
- the epoch plan: :class:`EpochPlan`, :class:`PlanOptions`, :class:`Split` (the order
  as a pure function of seed, epoch, rank, world size and the shard set);
- decoding and batching: ``BatchDecoder``, ``RecordReader``,
  :class:`ReaderStats`, ``Chunk``, ``BufferPool``, ``ProcessReader``;
- reading through a shard cache: ``open_cache``, ``WholeEpochs``,
  ``CacheEpochs``, ``TaskFeed``;
- settings as objects: ``ReadOptions``, ``CacheOptions`` (documented with
  :mod:`recordkit.torch`);
- tensorflow-datasets folders: :class:`TFDSInfo`, :class:`TFDSView`, :func:`tfds_folder`.

The names load on first use, so importing one module of this package (a writer
process, ``recordkit.Dataset``) does not load the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers; at run time the names load on first use (below)
    from .buffers import BufferPool
    from .decode import BatchDecoder
    from .epochs import open_cache
    from .finding import find_shards
    from .growing import CacheEpochs
    from .local import ProcessLocalShards
    from .mapped import MappedShard
    from .options import CacheOptions, ReadOptions
    from .pipeline import Chunk, ReaderStats, RecordReader
    from .plan import EpochPlan, PlanOptions, Split
    from .process import ProcessReader
    from .shards import ShardSet, open_shards
    from .tfds import TFDSInfo, TFDSView, tfds_folder
    from .whole import TaskFeed, WholeEpochs

# module -> the names it defines, as imported above
_MODULES = {
    ".buffers": ("BufferPool",),
    ".decode": ("BatchDecoder",),
    ".epochs": ("open_cache",),
    ".finding": ("find_shards",),
    ".growing": ("CacheEpochs",),
    ".local": ("ProcessLocalShards",),
    ".mapped": ("MappedShard",),
    ".options": ("CacheOptions", "ReadOptions"),
    ".pipeline": ("Chunk", "ReaderStats", "RecordReader"),
    ".plan": ("EpochPlan", "PlanOptions", "Split"),
    ".process": ("ProcessReader",),
    ".shards": ("ShardSet", "open_shards"),
    ".tfds": ("TFDSInfo", "TFDSView", "tfds_folder"),
    ".whole": ("TaskFeed", "WholeEpochs"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "BatchDecoder",
    "BufferPool",
    "CacheEpochs",
    "CacheOptions",
    "Chunk",
    "EpochPlan",
    "MappedShard",
    "PlanOptions",
    "ProcessLocalShards",
    "ProcessReader",
    "ReadOptions",
    "ReaderStats",
    "RecordReader",
    "ShardSet",
    "Split",
    "TFDSInfo",
    "TFDSView",
    "TaskFeed",
    "WholeEpochs",
    "find_shards",
    "open_cache",
    "open_shards",
    "tfds_folder",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
