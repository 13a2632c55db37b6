"""One retry policy for every remote read and write: storage, convert and the cache.

A failure is sorted into one of four kinds by :func:`classify`, which reads the
whole exception chain (the error raised, its ``__cause__`` and ``__context__``)
and the status codes the client libraries attach:

========== ====================================================================
absent     HTTP 404/410, S3 ``NoSuchKey``/``NoSuchBucket``, a local file that
           is not there. The only answer that means "not there".
forbidden  HTTP 401/403, S3 ``AccessDenied`` and the other permission codes,
           a local ``PermissionError``. Never retried.
transient  HTTP 5xx, 408, 425, 429, a connection that was refused, reset or
           cut short, a deadline that passed (connect or read). Retried.
permanent  anything else (another 4xx, a bad argument, a bug). Not retried.
========== ====================================================================

Reading the chain matters: fsspec's HTTP ``info()`` (and so ``size()``,
``exists()`` and ``sizes()``) turns *every* failure into a
``FileNotFoundError`` raised *from* the real error, so a 503 looks like a
missing file unless the cause is read.

:class:`RetryPolicy` holds the settings (tries, backoff, and the deadlines of
every remote request) and runs the retry loop (:meth:`RetryPolicy.call`); the
deadlines reach fsspec through :meth:`RetryPolicy.storage_options`, which
:class:`recordkit.storage.Location` applies to every filesystem it opens.
Only the standard library at import time.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .errors import RecordkitError, add_note

__all__ = ["DEFAULT_POLICY", "Kind", "RetryPolicy", "classify", "describe", "is_transient"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
Kind = Literal["absent", "forbidden", "transient", "permanent"]

_TRANSIENT_ERRNOS = {
    errno.EAGAIN,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.EHOSTUNREACH,
    errno.ENETDOWN,
    errno.ENETRESET,
    errno.ENETUNREACH,
    errno.EPIPE,
    errno.ETIMEDOUT,
    errno.EREMOTEIO,  # s3fs: S3's InternalError
}
# Client libraries whose errors are network trouble unless a status says otherwise.
_TRANSIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "http.client")
_ABSENT_STATUS = {404, 410}
_FORBIDDEN_STATUS = {401, 403}
_TRANSIENT_STATUS = {408, 425, 429}
_ABSENT_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "404"}
_FORBIDDEN_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "403",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "TooManyRequests",
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from or during, nearest first (bounded)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: BaseException) -> int | None:
    """The HTTP status an error carries (aiohttp, botocore, requests, urllib), if any."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata")
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        return status if isinstance(status, int) else None
    # ``code`` only on HTTP errors (urllib's, gcsfs'): aiohttp's parser errors carry a
    # ``code`` of 400 for a body cut short, which is the client's verdict, not the server's.
    names = ["status", "status_code"]
    if "httperror" in type(exc).__name__.lower():
        names.append("code")
    for name in names:
        value = getattr(exc, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value < 600:
            return value
    value = getattr(response, "status_code", None)  # requests.HTTPError
    return value if isinstance(value, int) else None


def _code(exc: BaseException) -> str | None:
    """An S3-style error code (``NoSuchKey``, ``AccessDenied``, ``SlowDown``), if any."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error")
        code = error.get("Code") if isinstance(error, dict) else None
        return str(code) if code is not None else None
    return None


def classify(exc: BaseException) -> Kind:
    """What a failed remote (or local) request means; see the module doc.

    A status or S3 error code anywhere in the chain decides; without one, a
    network-level error anywhere in the chain makes it transient; then a
    ``FileNotFoundError`` is absent and a ``PermissionError`` forbidden.
    """
    chain = list(_chain(exc))
    for e in chain:
        code = _code(e)
        if code in _ABSENT_CODES:
            return "absent"
        if code in _FORBIDDEN_CODES:
            return "forbidden"
        if code in _TRANSIENT_CODES:
            return "transient"
        status = _status(e)
        if status is None:
            continue
        if status in _ABSENT_STATUS:
            return "absent"
        if status in _FORBIDDEN_STATUS:
            return "forbidden"
        if status >= 500 or status in _TRANSIENT_STATUS:
            return "transient"
        if status >= 400:
            return "permanent"
    for e in chain:
        if isinstance(e, RecordkitError):
            break  # our own verdicts say what they are
        if isinstance(e, (TimeoutError, ConnectionError)) or type(e).__name__ == "FSTimeoutError":
            return "transient"
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return "transient"
        if (type(e).__module__ or "").startswith(_TRANSIENT_MODULES):
            return "transient"
    if isinstance(exc, FileNotFoundError):
        return "absent"
    if isinstance(exc, PermissionError):
        return "forbidden"
    return "permanent"


def is_transient(exc: BaseException) -> bool:
    """Whether retrying could help: a network error or a 5xx/429, not missing data or bad bytes.

    recordkit's own errors (a corrupt record, a bad manifest) are never transient.
    """
    return not isinstance(exc, RecordkitError) and classify(exc) == "transient"


def describe(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of an error, one line, at most ``limit`` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How remote requests are retried, and how long one may take.

    Attributes:
        attempts: tries per request, the first included. 6 tries with the
            default backoff ride out about 15 s of a remote being unreachable,
            longer than the restart of an object-store endpoint or a load balancer.
        backoff: seconds before the second try; doubled after each failure.
        max_backoff: the longest wait between two tries.
        connect_timeout: seconds a connection may take to open (``None``: the
            client library's default). 10 s covers three lost SYNs.
        read_timeout: seconds a request may go without receiving a byte — the
            response's headers or the next piece of its body (``None``: no
            limit). Not a limit on the whole transfer, so a large shard over a
            slow link is fine; a server that stops sending is not. 30 s: a
            healthy object store sends its first byte within a second or two.
            Applied to HTTP(S) (aiohttp's ``sock_connect``/``sock_read``, with
            its 300 s total limit lifted) and S3 (botocore's ``connect_timeout``
            and ``read_timeout``); other fsspec filesystems keep their own
            settings (pass them in ``storage_options``).
        cooldown: the cache: seconds before a shard whose download failed
            (after the tries above) is downloaded again; doubled with each
            failure of the same shard, up to ``max_cooldown``. Other shards go
            ahead meanwhile.
        max_cooldown: the longest such wait.
        shard_attempts: the cache's ``fill()`` (and ``recordkit cache fill``)
            gives up on a shard after this many failed downloads and reports
            it; the background fill of a training run never gives up.
    """

    attempts: int = 6
    backoff: float = 0.5
    max_backoff: float = 8.0
    connect_timeout: float | None = 10.0
    read_timeout: float | None = 30.0
    cooldown: float = 5.0
    max_cooldown: float = 300.0
    shard_attempts: int = 4

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.shard_attempts < 1:
            raise ValueError(
                f"attempts and shard_attempts must be >= 1, got {self.attempts}, "
                f"{self.shard_attempts}"
            )
        waits = (self.backoff, self.max_backoff, self.cooldown, self.max_cooldown)
        if not all(w >= 0 for w in waits):
            raise ValueError(f"backoff and cooldown must be >= 0, got {waits}")
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")

    def delays(self) -> Iterator[float]:
        """The waits before the second, third, ... tries."""
        delay = self.backoff
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(self.max_backoff, delay * 2)

    def cooldown_after(self, failures: int) -> float:
        """Seconds before a shard that failed ``failures`` times in a row is tried again."""
        wait: float = self.cooldown * 2.0 ** max(0, min(failures, 64) - 1)
        return min(self.max_cooldown, wait)

    def call(
        self,
        fn: Callable[[], _T],
        *,
        what: str,
        retry_if: Callable[[BaseException], bool] = is_transient,
        sleep: Callable[[float], None] = time.sleep,
    ) -> _T:
        """``fn()``, tried again after each failure that ``retry_if`` accepts.

        The last error is raised as it is, with a note saying how many tries it
        took when there was more than one.

        Args:
            fn: the request.
            what: names it in log lines and notes (``"ranged read of s3://..."``).
            retry_if: which failures another try may fix (default: transient ones).
            sleep: the wait between tries (tests pass a fast one).
        """
        delays = self.delays()
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:
                delay = next(delays, None) if retry_if(exc) else None
                if delay is None:
                    if attempt > 1:
                        add_note(exc, f"{what}: gave up after {attempt} attempt(s)")
                    raise
                log.warning(
                    "%s failed (attempt %d/%d, retrying in %.3g s): %s",
                    what,
                    attempt,
                    self.attempts,
                    delay,
                    describe(exc),
                )
            sleep(delay)

    def storage_options(self, url: str, options: dict[str, Any] | None) -> dict[str, Any]:
        """``options`` for fsspec with this policy's deadlines added for ``url``'s protocol.

        Settings the caller gave in ``options`` win (an aiohttp ``timeout`` in
        ``client_kwargs``, ``connect_timeout``/``read_timeout`` in ``config_kwargs``).
        """
        out = dict(options or {})
        protocol = url.split("://", 1)[0].lower() if "://" in url else ""
        if protocol in ("http", "https"):
            client = dict(out.get("client_kwargs") or {})
            if "timeout" not in client:
                import aiohttp

                client["timeout"] = aiohttp.ClientTimeout(
                    total=None, sock_connect=self.connect_timeout, sock_read=self.read_timeout
                )
            out["client_kwargs"] = client
        elif protocol in ("s3", "s3a"):
            config = dict(out.get("config_kwargs") or {})
            if self.connect_timeout is not None:
                config.setdefault("connect_timeout", self.connect_timeout)
            if self.read_timeout is not None:
                config.setdefault("read_timeout", self.read_timeout)
            out["config_kwargs"] = config
        return out


DEFAULT_POLICY = RetryPolicy()
