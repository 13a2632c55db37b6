"""recordkit: indexed, TFRecord-compatible datasets, read fast from PyTorch and TensorFlow.

``import recordkit`` is light: it never imports torch, tensorflow, fsspec or
dask. The framework integrations are submodules imported on first use
(``recordkit.torch``, ``recordkit.tf``); they raise
:class:`~recordkit.errors.MissingDependencyError` naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors
from ._version import __version__
from .codec.limits import DecodeLimits
from .codec.schema import Bytes, Float32, Int64, Schema, Tensor
from .dataset import Dataset
from .verify import Problem, VerifyReport, build_index, verify
from .writer import Writer

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

# Submodules that pull in heavy frameworks: imported only when first touched.
# ``convert`` is a package that is also callable: ``recordkit.convert(src, dst, format=...)``.
_LAZY_SUBMODULES = frozenset({"torch", "tf", "convert"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "write":  # recordkit.write(fn, inputs, out, schema=...): convert's engine
        return importlib.import_module(f"{__name__}.convert").write
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES | {"write"})
