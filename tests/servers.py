"""Real servers for remote tests, started on 127.0.0.1 and stopped by the test.

Two context managers, usable directly or wrapped in fixtures (see
``tests/convert/conftest.py``)::

    with s3_server() as s3:                 # moto's S3 in server mode, port chosen by the OS
        url = s3.bucket()                   # a fresh, empty bucket: "s3://b-1a2b3c..."
        fs = s3.filesystem()                # an s3fs filesystem talking to it
        recordkit.Writer(url + "/ds", schema, storage_options=s3.storage_options)
        subprocess.run([...], env={**os.environ, **s3.env})   # for child processes

    with http_server(root) as http:         # serves the files under root, honouring Range
        http.url                            # "http://127.0.0.1:PORT" (root is "/")
        http.requests                       # [(method, path, range header or None), ...]
        http.fail_next(2, status=503)       # the next 2 requests fail (a transient outage)
        http.fail_next(1, path_prefix="/d/")  # ... only requests for paths under /d/

``mock_aws()`` does not work with s3fs (aiobotocore bypasses its patches), so S3
tests need the server. Python's ``http.server`` ignores ``Range`` and answers
with the whole body, and fsspec then silently reads everything; this server
answers ``206 Partial Content`` (single ranges: ``a-b``, ``a-``, ``-n``), ``416``
for unsatisfiable ranges, advertises ``Accept-Ranges: bytes`` and lists
directories as HTML links, which is what fsspec's HTTP filesystem parses.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HttpServer", "S3Server", "http_server", "s3_server"]

# Every test server lives at most this long; a hung test cannot leave it behind.
_JOIN_TIMEOUT_S = 10


@dataclass
class S3Server:
    """A running moto S3 server.

    Attributes:
        endpoint_url: ``http://127.0.0.1:PORT``.
        storage_options: pass to fsspec / recordkit for ``s3://`` URLs.
        env: environment variables that point boto/s3fs in a child process at it.
    """

    endpoint_url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def filesystem(self) -> Any:
        """A fresh s3fs filesystem for this server (no instance or listing cache)."""
        import s3fs

        return s3fs.S3FileSystem(
            skip_instance_cache=True, use_listings_cache=False, **self.storage_options
        )

    def bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default); return ``s3://name``."""
        import boto3

        name = name or f"b-{uuid.uuid4().hex[:12]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        try:
            client.create_bucket(Bucket=name)
        finally:
            client.close()
        return f"s3://{name}"


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 (an OS-chosen port); stop it on exit."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO; a converter test makes hundreds.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        yield S3Server(
            endpoint_url=endpoint,
            storage_options={
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            },
            env={
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            },
        )
    finally:
        server.stop()


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range ``Range`` support; directories as HTML listings."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read self.server.requests instead of stderr noise

    def end_headers(self) -> None:
        self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def _injected_failure(self) -> bool:
        with self.server.lock:
            self.server.requests.append((self.command, self.path, self.headers.get("Range")))
            prefix = self.server.failure_prefix
            if self.server.failures <= 0 or not self.path.startswith(prefix):
                return False
            self.server.failures -= 1
            status = self.server.failure_status
        self.send_error(status, "injected failure")
        return True

    def do_HEAD(self) -> None:
        if not self._injected_failure():
            super().do_HEAD()

    def do_GET(self) -> None:
        if self._injected_failure():
            return
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        if header is None or not os.path.isfile(path):
            super().do_GET()
            return
        size = os.path.getsize(path)
        match = _RANGE.match(header.strip())
        if not match or match.groups() == ("", ""):
            self.send_error(400, f"unsupported Range {header!r} (single ranges only)")
            return
        first, last = match.groups()
        if first == "":  # suffix range: the last N bytes
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
        end = min(end, size - 1)
        if start >= size or start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    lock: threading.Lock
    requests: list[tuple[str, str, str | None]]
    failures: int
    failure_status: int
    failure_prefix: str


@dataclass
class HttpServer:
    """A running Range-capable HTTP server.

    Attributes:
        url: ``http://127.0.0.1:PORT``; the served root directory is ``/``.
        root: the directory served.
    """

    url: str
    root: str
    _server: _Server

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """Every request so far: ``(method, path, Range header or None)``."""
        with self._server.lock:
            return list(self._server.requests)

    def fail_next(self, n: int, *, status: int = 503, path_prefix: str = "/") -> None:
        """Answer the next ``n`` requests for paths under ``path_prefix`` with ``status``."""
        with self._server.lock:
            self._server.failures = n
            self._server.failure_status = status
            self._server.failure_prefix = path_prefix


@contextlib.contextmanager
def http_server(root: str | os.PathLike[str]) -> Iterator[HttpServer]:
    """Serve ``root`` over HTTP on 127.0.0.1 (an OS-chosen port); stop it on exit."""
    root = os.fspath(root)

    def handler(*args: Any, **kwargs: Any) -> _RangeHandler:
        return _RangeHandler(*args, directory=root, **kwargs)

    server = _Server(("127.0.0.1", 0), handler)
    server.lock = threading.Lock()
    server.requests = []
    server.failures = 0
    server.failure_status = 503
    server.failure_prefix = "/"
    thread = threading.Thread(target=server.serve_forever, name="http-server", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield HttpServer(url=f"http://{host}:{port}", root=root, _server=server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(_JOIN_TIMEOUT_S)
