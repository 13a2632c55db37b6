"""Fixtures for the cache tests: datasets with checkable records, and real servers."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import tempfile
import threading

import numpy as np
import pytest

import recordkit as rk
from recordkit.cache import directory
from tests.servers import s3_server

SCHEMA = rk.Schema(i=rk.Int64(), x=rk.Tensor("uint8", (None,)))


def sample(i: int, size: int) -> dict:
    """Record ``i``: its number and ``size`` bytes that depend on it (so any mix-up shows)."""
    return {"i": i, "x": (np.arange(size, dtype=np.int64) * 7 + i).astype(np.uint8)}


def check_sample(s: dict) -> int:
    """Assert a decoded record is intact; return its number."""
    i = int(s["i"])
    x = np.asarray(s["x"])
    assert np.array_equal(x, (np.arange(len(x), dtype=np.int64) * 7 + i).astype(np.uint8)), i
    return i


def write_dataset(
    url, *, shards: int, records: int, size: int, storage_options=None, overwrite=False
):
    """A dataset of ``shards`` shards of ``records`` records of about ``size`` bytes each."""
    with rk.Writer(
        url,
        SCHEMA,
        max_records=records,
        storage_options=storage_options,
        fsync=False,
        overwrite=overwrite,
    ) as w:
        for i in range(shards * records):
            w.write(sample(i, size + (i % 5)))
    return w.manifest


def disk_bytes(root) -> int:
    """Every byte under the cache directory, its bookkeeping included (what the budget limits).

    Fill workers rename and remove files meanwhile: a walk that meets a file gone
    between listing and stat starts over (skipping it could miss the renamed file).
    """
    while True:
        total = 0
        try:
            for dirpath, _, filenames in os.walk(root):
                total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in filenames)
        except FileNotFoundError:
            continue
        return total


_OVERHEAD: dict[str, int] = {}


def overhead(remote, **options) -> int:
    """What a cache of ``remote`` (made with ``options``) counts for its own files when
    it holds all of it, plus the slack it keeps free: add it to a budget meant for
    so many shards."""
    key = repr((os.fspath(remote), sorted(options.items())))
    if key not in _OVERHEAD:
        from recordkit.cache import ShardCache

        with tempfile.TemporaryDirectory() as scratch:
            cache = ShardCache(remote, scratch, max_bytes="1GiB", fill_workers=0, **options)
            cache.fill()
            _OVERHEAD[key] = cache.status().bookkeeping + directory.BOOKKEEPING_SLACK
    return _OVERHEAD[key]


def visible_shards(root) -> list[str]:
    """Shard files a directory listing shows (what a naive reader would open)."""
    return sorted(n for n in os.listdir(root) if n.endswith(".tfrecord") and ".tmp-" not in n)


class BudgetWatch:
    """CacheEvents that checks the budget on the disk at every publish."""

    def __init__(self, root, max_bytes: int) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.published_paths: list[str] = []
        self.evicted_paths: list[str] = []
        self.over: list[tuple[str, int]] = []
        self.bytes = 0

    def downloaded(self, nbytes: int) -> None:
        self.bytes += nbytes

    def published(self, shard, used: int) -> None:
        self.published_paths.append(shard.path)
        on_disk = disk_bytes(self.root)
        if on_disk > self.max_bytes or used > self.max_bytes:
            self.over.append((shard.path, max(on_disk, used)))

    def evicted(self, path: str) -> None:
        self.evicted_paths.append(path)


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server for the whole module (each test makes its own bucket)."""
    with s3_server() as server:
        yield server


class _CuttingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with ``Range`` support; the next ``server.cut`` ranged answers are
    cut to half their length while ``Content-Length`` claims the half is all (a proxy
    or server that lies), which no HTTP client can detect by itself."""

    server: _CuttingServer

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        with self.server.lock:
            self.server.requests.append(header)
        if header is None or not os.path.isfile(path):
            return super().do_GET()
        m = re.match(r"^bytes=(\d+)-(\d+)$", header)
        if not m:
            return self.send_error(400, "unsupported range")
        size = os.path.getsize(path)
        start, end = int(m.group(1)), min(int(m.group(2)), size - 1)
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        with self.server.lock:
            cut = self.server.cut > 0
            self.server.cut -= cut
        if cut:
            body = body[: len(body) // 2]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _CuttingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    cut = 0
    lock = threading.Lock()
    requests: list


@contextlib.contextmanager
def cutting_http_server(root):
    """An HTTP server on 127.0.0.1 over ``root``; set ``server.cut = n`` to cut answers."""
    handler = functools.partial(_CuttingHandler, directory=os.fspath(root))
    server = _CuttingServer(("127.0.0.1", 0), handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
