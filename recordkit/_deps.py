"""Optional dependencies: import them on demand and name the extra when absent."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming ``extra``.

    Args:
        module: the importable module name, e.g. ``"torch"``.
        extra: the recordkit extra that installs it, e.g. ``"torch"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{module!r} is required for this feature but is not installed: "
            f"pip install 'recordkit[{extra}]'"
        ) from exc
