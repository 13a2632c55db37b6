"""recordkit: indexed, TFRecord-compatible datasets, read fast from PyTorch and TensorFlow.

``import recordkit`` is light: it never imports torch, tensorflow, fsspec, dask
or ray. The framework integrations and the heavier parts are submodules imported on
first use (``recordkit.torch``, ``recordkit.tf``, ``recordkit.conversion``,
``recordkit.cache``, ``recordkit.converters``); the framework ones raise
:class:`~recordkit.errors.MissingDependencyError` naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__
from .codec.limits import DecodeLimits
from .codec.schema import Bytes, Float32, Int64, Schema, Tensor
from .dataset import Dataset
from .verify import Problem, VerifyReport, build_index, verify
from .writer import Writer

if TYPE_CHECKING:  # what type checkers see; at run time these load on first use (below)
    from .conversion.function import write
    from .conversion.run import convert

__all__ = [
    "Bytes",
    "Dataset",
    "DecodeLimits",
    "Float32",
    "Int64",
    "Problem",
    "Schema",
    "Tensor",
    "VerifyReport",
    "Writer",
    "__version__",
    "build_index",
    "convert",
    "errors",
    "verify",
    "write",
]

# Submodules that pull in heavy frameworks (or fsspec): imported only when first touched.
# ``convert`` and ``write`` are functions of the ``conversion`` package, loaded on first use.
_LAZY_SUBMODULES = frozenset({"cache", "conversion", "converters", "images", "tf", "torch"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in ("convert", "write"):  # recordkit.convert(src, dst, ...), recordkit.write(fn, ...)
        return getattr(importlib.import_module(f"{__name__}.conversion"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES | {"convert", "write"})
