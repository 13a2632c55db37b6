"""``recordkit.convert``: turn a dataset in another format into a recordkit dataset.

The module is itself callable: ``recordkit.convert(src, dst, format="jsonl")``
is :func:`recordkit.convert.convert`. See ``docs/convert.md``. The same engine
writes a function's samples: :func:`recordkit.write` (``docs/howto/write.md``).

Importing it is light (no fsspec, no dask, no ray): filesystems are built when a
conversion starts, Dask or Ray only when ``engine="dask"`` or ``"ray"`` runs.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from ._errors import ConvertError, DiskFullError, PartitionsFailedError, add_note, is_transient
from .function import FunctionSource, write
from .infer import Inferred, infer_format
from .partition import PartitionResult, PartitionTask, Tally, run_partition, write_items
from .plan import ConvertOptions, Partition, Plan, make_plan
from .progress import LogProgress, NullProgress, Progress, TqdmProgress
from .run import ConvertResult, convert, incomplete_at, plan_conversion

__all__ = [
    "ConvertError",
    "ConvertOptions",
    "ConvertResult",
    "DiskFullError",
    "FunctionSource",
    "Inferred",
    "LogProgress",
    "NullProgress",
    "Partition",
    "PartitionResult",
    "PartitionTask",
    "PartitionsFailedError",
    "Plan",
    "Progress",
    "Tally",
    "TqdmProgress",
    "add_note",
    "convert",
    "incomplete_at",
    "infer_format",
    "is_transient",
    "make_plan",
    "plan_conversion",
    "run_partition",
    "write",
    "write_items",
]


class _CallableModule(types.ModuleType):
    """Lets ``recordkit.convert(...)`` call :func:`convert` although it is a package.

    ``inspect.signature(recordkit.convert)`` is the function's (through
    ``__signature__``), and the package's docstring starts with the function's, so
    ``help(recordkit.convert)`` shows how to call it first. Type checkers see the
    function: ``recordkit/__init__.py`` binds ``convert`` to it for them.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> ConvertResult:
        return convert(*args, **kwargs)


_module = sys.modules[__name__]
_module.__class__ = _CallableModule
_module.__signature__ = inspect.signature(convert)  # type: ignore[attr-defined]
_module.__doc__ = (
    f"{inspect.cleandoc(convert.__doc__ or '')}\n\n"
    f"The package ``recordkit.convert``: {inspect.cleandoc(__doc__ or '')}"
)
