"""``recordkit.conversion``: turn a dataset in another format into a recordkit dataset.

``recordkit.convert(src, dst, format="jsonl")`` is :func:`recordkit.conversion.convert`
(``docs/convert.md``). The same engine writes a function's samples:
:func:`recordkit.write` (``docs/howto/write.md``).

Importing it is light (no fsspec, no dask, no ray): filesystems are built when a
conversion starts, Dask or Ray only when ``engine="dask"`` or ``"ray"`` runs.
"""

from __future__ import annotations

from .function import FunctionSource, write
from .infer import Inferred, infer_format
from .partition import PartitionResult, PartitionTask, Tally, run_partition, write_items
from .plan import ConvertOptions, Partition, Plan, make_plan
from .progress import LogProgress, NullProgress, Progress, TqdmProgress
from .run import ConvertResult, convert, incomplete_at, plan_conversion

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "FunctionSource",
    "Inferred",
    "LogProgress",
    "NullProgress",
    "Partition",
    "PartitionResult",
    "PartitionTask",
    "Plan",
    "Progress",
    "Tally",
    "TqdmProgress",
    "convert",
    "incomplete_at",
    "infer_format",
    "make_plan",
    "plan_conversion",
    "run_partition",
    "write",
    "write_items",
]
