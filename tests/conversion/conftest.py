"""Fixtures for the convert tests: the real S3 and HTTP servers of ``tests/servers.py``."""

import pytest

from tests.servers import http_server, s3_server


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server for the whole module (each test makes its own bucket)."""
    with s3_server() as server:
        yield server


@pytest.fixture
def http(tmp_path):
    """A Range-capable HTTP server over ``tmp_path / "www"``."""
    root = tmp_path / "www"
    root.mkdir()
    with http_server(root) as server:
        yield server
