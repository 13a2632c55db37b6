"""The C extension, loaded here and nowhere else.

The sources beside this file build one module, ``recordkit.native._ext``
(``recordkit.h`` maps its units: CRC-32C, the SIGBUS guard, the Example span parse,
the batch functions, the Runner, the ``.idx`` parser, the shuffle's permutation).
``ext`` is that module, or ``None`` when it was not built (no C compiler: setup.py
builds it with ``optional=True``) or ``RECORDKIT_NO_NATIVE=1`` is set; every user
then takes its pure Python/NumPy twin (``recordkit/reader/_fallback.py``,
``recordkit/reader/order.py``, ``recordkit/reader/index/text.py``), which gives the
same results and is pinned to it by tests. The choice is made once, at import.

``tfop.cc`` is the TensorFlow op of ``recordkit.tf``'s native path, a library of
its own (``recordkit.native._tfop``): it links against the installed TensorFlow,
so setup.py builds it only where TensorFlow is importable (``recordkit/tf/native.py``
loads it, or reads the same values without it).
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["DISABLED", "ext"]

DISABLED: bool = os.environ.get("RECORDKIT_NO_NATIVE", "") not in ("", "0")
"""``RECORDKIT_NO_NATIVE=1``: the pure Python twins even where the extension is built."""


def _load() -> ModuleType | None:
    if DISABLED:
        return None
    try:
        from . import _ext
    except ImportError:  # built without a C compiler
        return None
    return _ext


ext: ModuleType | None = _load()
"""The built extension, or ``None`` (see the module's docstring)."""
