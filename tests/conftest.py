"""Fixtures for the whole suite."""

from __future__ import annotations

import os

import pytest

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
