"""Shared by the reader tests: the two implementations of the native batch functions, and
the ``impl`` fixture that runs a test on each (``BatchDecoder`` too)."""

from __future__ import annotations

from types import ModuleType

import pytest

from recordkit.reader import _fallback, decode

try:
    from recordkit.native import _ext as _native
except ImportError:  # built without a compiler: only the fallback is tested
    _native = None  # type: ignore[assignment]

IMPLS = {"native": _native, "fallback": _fallback}


@pytest.fixture(params=list(IMPLS))
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The implementation under test; BatchDecoder uses it too."""
    module = IMPLS[request.param]
    if module is None:
        pytest.skip("recordkit.native._ext is not built")
    monkeypatch.setattr(decode, "_impl", module)
    return module
