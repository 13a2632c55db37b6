"""Fixtures for the whole suite."""

from __future__ import annotations

import importlib.abc
import os
import sys

import pytest

# RECORDKIT_TEST_HIDE=torch,tensorflow: run the suite as on a machine without those
# frameworks (tests/test_frameworks_optional.py collects it so): importing one raises
# ModuleNotFoundError, as it would there, and the tests that need it must skip.
_HIDDEN = {n for n in os.environ.get("RECORDKIT_TEST_HIDE", "").split(",") if n}


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in _HIDDEN:
            why = f"No module named {name!r} (hidden by RECORDKIT_TEST_HIDE)"
            raise ModuleNotFoundError(why, name=name)
        return None


if _HIDDEN:
    assert not _HIDDEN & set(sys.modules), f"{_HIDDEN & set(sys.modules)} already imported"
    sys.meta_path.insert(0, _Hide())

# Ray's driver installs its own SIGBUS/SIGSEGV handler (absl's failure handler) over
# recordkit's map guard when a test calls ray.init in this process: a file truncated
# under a reader then goes through Ray's handler first (the error loses its offset, or
# the process dies). The engine tests run Ray in-process; the rest of the suite must
# keep the guard (docs/howto/clusters.md says the same to users).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


@pytest.fixture(autouse=True)
def _index_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the per-user index cache at a fresh temporary directory for each test.

    So the suite never writes into the real home directory, and no test sees
    an index another test cached. Subprocesses inherit it through the environment.
    """
    monkeypatch.setenv("RECORDKIT_INDEX_CACHE", str(tmp_path_factory.mktemp("index-cache")))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        default=False,
        help="run the fuzz suite (tests/fuzz) deeply: thousands of examples per target, "
        "a random seed each run (printed), minutes per target",
    )
