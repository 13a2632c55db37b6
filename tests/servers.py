"""Real servers for remote tests, started on 127.0.0.1 and stopped by the test.

Two context managers, usable directly or wrapped in fixtures (see
``tests/conversion/conftest.py``)::

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
        http.inject(Faults(rate=0.3, seed=1))  # seeded faults of every kind (see Faults)
        http.fault_next(1, "flip", path_prefix="/d/a")  # this fault on the next answer there
        http.injected                       # Counter of the faults injected so far

``mock_aws()`` does not work with s3fs (aiobotocore bypasses its patches), so S3
tests need the server. Python's ``http.server`` ignores ``Range`` and answers
with the whole body, and fsspec then silently reads everything; this server
answers ``206 Partial Content`` (single ranges: ``a-b``, ``a-``, ``-n``), ``416``
for unsatisfiable ranges, advertises ``Accept-Ranges: bytes`` and lists
directories as HTML links, which is what fsspec's HTTP filesystem parses.

With :class:`Faults` it misbehaves as a flaky server or proxy does, seeded:
5xx answers, bodies cut off mid-way (the connection closes early), bodies
that are short although ``Content-Length`` agrees (a lying proxy), flipped
bits, ``Range`` ignored (``200`` and the whole file), a new ``ETag`` and
``Last-Modified`` on every answer, the bytes of another file of the same kind
(an object swapped between the listing and the download), and stalls (no byte
for ``stall_s`` seconds, before the headers or mid-body).
"""

from __future__ import annotations

import collections
import contextlib
import html
import http.server
import logging
import os
import random
import re
import socket
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAULT_KINDS", "Faults", "HttpServer", "S3Server", "http_server", "s3_server"]

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

FAULT_KINDS = ("5xx", "cut", "short", "flip", "norange", "etag", "swap", "stall")


@dataclass
class Faults:
    """Seeded misbehaviour of the HTTP server (see the module doc).

    Attributes:
        rate: the share of answers (under ``path_prefix``) that get a fault.
        kinds: which faults to draw from (``FAULT_KINDS``). ``"etag"`` is not
            drawn: with it every answer carries a new ``ETag``/``Last-Modified``.
        seed: the random generator's seed (draws happen in request order).
        stall_s: how long a stall lasts (ended early when the server stops).
        path_prefix: only requests for paths under it misbehave.
    """

    rate: float = 0.3
    kinds: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    stall_s: float = 2.0
    path_prefix: str = "/"


@dataclass
class _Plan:
    """One answer's fault, drawn under the server's lock."""

    kind: str | None = None
    status: int = 503
    where: float = 0.5  # where in the body a cut, flip or stall happens (a fraction)
    bit: int = 0
    early: bool = False  # a stall before the headers
    etag: str | None = None
    modified: int = 0


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

    def _plan(self, path: str, ranged: bool, body: bool) -> _Plan:
        """Draw this answer's fault (``kind=None``: none)."""
        faults = self.server.faults or Faults(rate=0.0, kinds=())
        if not self.path.startswith(faults.path_prefix) and not self.server.forced:
            return _Plan()
        with self.server.lock:
            rng = self.server.rng
            plan = _Plan()
            forced = self.server.forced
            at = next((k for k, f in enumerate(forced) if self.path.startswith(f[1])), None)
            if at is not None and self.command == "GET":
                kind, _ = forced.pop(at)
                plan.kind = kind
                plan.where, plan.bit = rng.random(), rng.randrange(8)
                plan.early = rng.random() < 0.5
                self.server.injected[kind] += 1
                return plan
            if not self.path.startswith(faults.path_prefix):
                return plan
            if "etag" in faults.kinds:
                plan.etag = f'"{rng.getrandbits(64):016x}"'
                plan.modified = rng.randrange(1 << 31)
                self.server.injected["etag"] += 1
            if rng.random() >= faults.rate:
                return plan
            kinds = [k for k in faults.kinds if k != "etag"]
            if self.command == "HEAD" or not body:
                kinds = [k for k in kinds if k in ("5xx", "stall")]
            if not ranged:
                kinds = [k for k in kinds if k != "norange"]
            if _sibling(path) is None:
                kinds = [k for k in kinds if k != "swap"]
            if not kinds:
                return plan
            plan.kind = rng.choice(sorted(kinds))
            plan.status = rng.choice((500, 502, 503, 504))
            plan.where, plan.bit, plan.early = rng.random(), rng.randrange(8), rng.random() < 0.5
            self.server.injected[plan.kind] += 1
        return plan

    def _stall(self) -> None:
        faults = self.server.faults
        self.server.stopping.wait(faults.stall_s if faults is not None else 600.0)

    def _answer(
        self,
        plan: _Plan,
        status: int,
        body: bytes,
        headers: dict[str, str],
    ) -> None:
        """Send ``body`` (or only the headers for HEAD) with ``plan``'s fault."""
        try:
            if plan.kind == "stall" and (plan.early or not body or self.command == "HEAD"):
                self._stall()
            if plan.kind == "5xx":
                self.send_error(plan.status, "injected fault")
                return
            declared = len(body)
            if plan.kind == "flip" and body:
                flipped = bytearray(body)
                flipped[min(len(body) - 1, int(plan.where * len(body)))] ^= 1 << plan.bit
                body = bytes(flipped)
            elif plan.kind == "short" and body:
                body = body[: int(plan.where * len(body))]
                declared = len(body)  # the lie no HTTP client can see
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if plan.etag is not None:
                self.send_header("ETag", plan.etag)
                self.send_header("Last-Modified", self.date_time_string(plan.modified))
            self.send_header("Content-Length", str(declared))
            self.end_headers()
            if self.command == "HEAD":
                return
            if plan.kind == "cut" and body:
                self.wfile.write(body[: int(plan.where * len(body))])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if plan.kind == "stall" and not plan.early and body:
                half = int(plan.where * len(body))
                self.wfile.write(body[:half])
                self.wfile.flush()
                self._stall()
                body = body[half:]
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True  # the client gave up (a deadline): fine

    def do_HEAD(self) -> None:
        if not self._injected_failure():
            self._serve()

    def do_GET(self) -> None:
        if not self._injected_failure():
            self._serve()

    def _serve(self) -> None:
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            parts = urllib.parse.urlsplit(self.path)
            if not parts.path.endswith("/"):
                self.send_response(301)
                new = urllib.parse.urlunsplit((*parts[:2], parts.path + "/", *parts[3:]))
                self.send_header("Location", new)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            listing = _listing(path)
            plan = self._plan(path, ranged=False, body=True)
            self._answer(plan, 200, listing, {"Content-Type": "text/html; charset=utf-8"})
            return
        if not os.path.isfile(path):
            self.send_error(404, "File not found")
            return
        header = self.headers.get("Range")
        plan = self._plan(path, ranged=header is not None, body=True)
        if plan.kind == "swap":
            path = _sibling(path) or path
        with open(path, "rb") as f:
            data = f.read()
        size = len(data)
        ctype = self.guess_type(path)
        if header is None or plan.kind == "norange":
            self._answer(plan, 200, data, {"Content-Type": ctype})
            return
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
        self._answer(
            plan,
            206,
            data[start : end + 1],
            {"Content-Type": ctype, "Content-Range": f"bytes {start}-{end}/{size}"},
        )


def _listing(path: str) -> bytes:
    """A directory as HTML links (what fsspec's HTTP filesystem parses)."""
    rows = []
    for name in sorted(os.listdir(path)):
        shown = name + "/" if os.path.isdir(os.path.join(path, name)) else name
        link = urllib.parse.quote(shown)
        rows.append(f'<li><a href="{link}">{html.escape(shown)}</a></li>')
    return ("<html><body><ul>\n" + "\n".join(rows) + "\n</ul></body></html>\n").encode()


def _sibling(path: str) -> str | None:
    """Another file of the same kind beside ``path`` (a shard for a shard, an index
    for an index), or ``None``."""
    folder, name = os.path.split(path)
    kind = name.rsplit(".", 1)[-1] if "." in name else ""
    try:
        names = sorted(n for n in os.listdir(folder) if n.rsplit(".", 1)[-1] == kind)
    except OSError:
        return None
    names = [n for n in names if os.path.isfile(os.path.join(folder, n))]
    if name not in names or len(names) < 2:
        return None
    return os.path.join(folder, names[(names.index(name) + 1) % len(names)])


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    lock: threading.Lock
    requests: list[tuple[str, str, str | None]]
    failures: int
    failure_status: int
    failure_prefix: str
    faults: Faults | None
    rng: random.Random
    injected: collections.Counter[str]
    forced: list[tuple[str, str]]
    stopping: threading.Event


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

    @property
    def injected(self) -> collections.Counter[str]:
        """How many faults of each kind were injected so far."""
        with self._server.lock:
            return collections.Counter(self._server.injected)

    def fail_next(self, n: int, *, status: int = 503, path_prefix: str = "/") -> None:
        """Answer the next ``n`` requests for paths under ``path_prefix`` with ``status``."""
        with self._server.lock:
            self._server.failures = n
            self._server.failure_status = status
            self._server.failure_prefix = path_prefix

    def fault_next(self, n: int, kind: str, *, path_prefix: str = "/") -> None:
        """Give the next ``n`` GET answers for paths under ``path_prefix`` the fault ``kind``
        (one of ``FAULT_KINDS`` but ``"etag"``; a stall lasts ``Faults.stall_s``, or
        until the server stops when no :class:`Faults` are set)."""
        if kind not in FAULT_KINDS or kind == "etag":
            raise ValueError(f"unknown fault {kind!r}")
        with self._server.lock:
            self._server.forced.extend([(kind, path_prefix)] * n)

    def inject(self, faults: Faults | None) -> None:
        """Misbehave from now on as ``faults`` says (``None``: behave); resets the counts."""
        with self._server.lock:
            self._server.faults = faults
            self._server.rng = random.Random(faults.seed if faults else 0)
            self._server.injected = collections.Counter()


@contextlib.contextmanager
def http_server(root: str | os.PathLike[str], faults: Faults | None = None) -> Iterator[HttpServer]:
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
    server.forced = []
    server.stopping = threading.Event()
    thread = threading.Thread(target=server.serve_forever, name="http-server", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        http = HttpServer(url=f"http://{host}:{port}", root=root, _server=server)
        http.inject(faults)
        yield http
    finally:
        server.stopping.set()  # stalls end now
        server.shutdown()
        server.server_close()
        thread.join(_JOIN_TIMEOUT_S)
