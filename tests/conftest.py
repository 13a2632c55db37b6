"""Fixtures for the whole suite."""

from __future__ import annotations

import pytest


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
