"""PyTorch integration: a memory-mapped, thread-based ``IterableDataset``.

``RecordDataset`` reads shards through ``mmap`` and their indexes, and a pool of
reader threads verifies CRCs, decodes and assembles whole batches in native code
with the GIL released, off the training thread. Output order is a pure function
of (seed, epoch, rank, world size, shard set) — see :mod:`recordkit.reader.plan` —
and, with ``batch_size`` set, does not depend on the number of ``DataLoader``
workers or reader threads.

Batch layout (``batch_size`` set; the table in ``docs/pytorch.md``): a ``dict`` of
tensors, fixed shapes ``(batch, *shape)``; ``Bytes()`` zero-padded ``uint8`` plus
``"{name}/lengths"`` (``bytes_as="padded"``, the default) or ``bytes`` lists; number
features with ``None`` dims zero-padded plus ``"{name}/lengths"``
(``ragged_as="padded"``, the default; ``recordkit.reader.ragged``) or tensor
lists; ``Bytes`` lists as lists. Without ``batch_size``: one sample at a time, each
number a tensor of its record's shape, ``Bytes()`` as ``bytes``. Batch in recordkit
(faster; the order does not depend on workers) or with
``DataLoader(ds, batch_size=N, collate_fn=ds.collate)``, which gives the same layout.
"""

from .._deps import require

require("torch", extra="torch")

from ..reader.options import CacheOptions, ReadOptions  # noqa: E402
from .collate import collate  # noqa: E402
from .dataset import RecordDataset  # noqa: E402
from .images import DecodeImages  # noqa: E402
from .loader import DataLoader  # noqa: E402
from .map import RecordMapDataset  # noqa: E402
from .prefetch import DevicePrefetcher  # noqa: E402

__all__ = [
    "CacheOptions",
    "DataLoader",
    "DecodeImages",
    "DevicePrefetcher",
    "ReadOptions",
    "RecordDataset",
    "RecordMapDataset",
    "collate",
]
