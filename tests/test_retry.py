"""The one retry policy: what a failure means (``classify``), the loop, the deadlines."""

from __future__ import annotations

import errno
import logging

import pytest

from recordkit.conversion import ConvertOptions
from recordkit.errors import CorruptRecordError
from recordkit.retry import RetryPolicy, classify, is_transient


def raised_from(outer: BaseException, cause: BaseException) -> BaseException:
    """``outer`` as if raised ``from cause`` (what fsspec's HTTP ``info()`` does)."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


def http_error(status: int) -> BaseException:
    aiohttp = pytest.importorskip("aiohttp")
    from yarl import URL

    info = aiohttp.RequestInfo(URL("http://h/x"), "GET", {}, URL("http://h/x"))  # type: ignore[arg-type]
    return aiohttp.ClientResponseError(info, (), status=status, message="m")


def s3_error(code: str, status: int) -> BaseException:
    """What s3fs raises for an S3 error: its translation, raised from botocore's error."""
    botocore = pytest.importorskip("botocore.exceptions")
    from s3fs.errors import translate_boto_error

    response = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    error = botocore.ClientError(response, "GetObject")
    return raised_from(translate_boto_error(error, set_cause=False), error)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, "absent"),
        (410, "absent"),
        (403, "forbidden"),
        (401, "forbidden"),
        (500, "transient"),
        (503, "transient"),
        (429, "transient"),
        (408, "transient"),
        (400, "permanent"),
        (416, "permanent"),
    ],
)
def test_http_status(status, kind):
    assert classify(http_error(status)) == kind
    # fsspec's HTTP info() turns every failure into FileNotFoundError raised from it
    assert classify(raised_from(FileNotFoundError("http://h/x"), http_error(status))) == kind


def test_a_file_not_found_from_a_network_error_is_transient():
    aiohttp = pytest.importorskip("aiohttp")
    cut = raised_from(aiohttp.ClientPayloadError("Response payload is not completed"), ValueError())
    assert classify(raised_from(FileNotFoundError("u"), cut)) == "transient"
    assert classify(raised_from(FileNotFoundError("u"), ConnectionResetError())) == "transient"
    assert classify(FileNotFoundError("u")) == "absent"  # no cause: cat_file's 404


def test_a_body_cut_short_is_transient_whatever_its_parser_code():
    pytest.importorskip("aiohttp")
    import aiohttp
    from aiohttp.http_exceptions import ContentLengthError

    exc = raised_from(aiohttp.ClientPayloadError("not completed"), ContentLengthError("short"))
    assert getattr(exc.__cause__, "code", None) == 400  # a parser's code, not the server's
    assert classify(exc) == "transient"


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("NoSuchKey", 404, "absent"),
        ("NoSuchBucket", 404, "absent"),
        ("AccessDenied", 403, "forbidden"),
        ("SlowDown", 503, "transient"),
        ("InternalError", 500, "transient"),
        ("ServiceUnavailable", 503, "transient"),
        ("InvalidRange", 416, "permanent"),
    ],
)
def test_s3_errors(code, status, kind):
    assert classify(s3_error(code, status)) == kind


def test_local_and_network_errors():
    assert classify(PermissionError("p")) == "forbidden"
    assert classify(IsADirectoryError("d")) == "permanent"
    assert classify(TimeoutError()) == "transient"
    assert classify(OSError(errno.ECONNRESET, "reset")) == "transient"
    assert classify(ValueError("bug")) == "permanent"
    assert not is_transient(CorruptRecordError("bad", path="p"))  # our verdicts are final


def test_call_retries_what_it_is_told_to_then_raises_with_a_note(caplog):
    policy = RetryPolicy(attempts=4, backoff=1.0, max_backoff=3.0)
    waits: list[float] = []
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset")
        return "ok"

    with caplog.at_level(logging.WARNING, logger="recordkit.retry"):
        assert policy.call(flaky, what="read of u", sleep=waits.append) == "ok"
    assert waits == [1.0, 2.0] and "read of u failed (attempt 1/4" in caplog.text

    def down():
        raise ConnectionResetError("reset")

    waits.clear()
    with pytest.raises(ConnectionResetError) as info:
        policy.call(down, what="read of u", sleep=waits.append)
    assert waits == [1.0, 2.0, 3.0]
    assert info.value.__notes__ == ["read of u: gave up after 4 attempt(s)"]

    def missing():
        raise FileNotFoundError("u")

    waits.clear()
    with pytest.raises(FileNotFoundError):
        policy.call(missing, what="read of u", sleep=waits.append)
    assert waits == []  # not transient: one try


def test_settings_are_checked():
    for bad in (
        {"attempts": 0},
        {"shard_attempts": 0},
        {"backoff": -1},
        {"cooldown": -1},
        {"read_timeout": 0},
        {"connect_timeout": -2.0},
    ):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)
    assert RetryPolicy(cooldown=5, max_cooldown=30).cooldown_after(1) == 5
    assert RetryPolicy(cooldown=5, max_cooldown=30).cooldown_after(3) == 20
    assert RetryPolicy(cooldown=5, max_cooldown=30).cooldown_after(10**6) == 30


def test_deadlines_reach_fsspec_and_the_callers_own_settings_win():
    aiohttp = pytest.importorskip("aiohttp")
    policy = RetryPolicy(connect_timeout=3.0, read_timeout=7.0)
    timeout = policy.storage_options("https://h/d", None)["client_kwargs"]["timeout"]
    assert isinstance(timeout, aiohttp.ClientTimeout)
    assert (timeout.total, timeout.sock_connect, timeout.sock_read) == (None, 3.0, 7.0)
    mine = aiohttp.ClientTimeout(total=1)
    opts = policy.storage_options("http://h/d", {"client_kwargs": {"timeout": mine, "x": 1}})
    assert opts["client_kwargs"] == {"timeout": mine, "x": 1}
    s3 = policy.storage_options("s3://b/d", {"config_kwargs": {"read_timeout": 99}, "anon": True})
    assert s3 == {"config_kwargs": {"read_timeout": 99, "connect_timeout": 3.0}, "anon": True}
    assert policy.storage_options("memory://x", {"a": 1}) == {"a": 1}


def test_a_location_opens_http_with_the_deadlines():
    pytest.importorskip("aiohttp")
    from recordkit.storage import Location

    loc = Location("http://127.0.0.1:1/ds", retry=RetryPolicy(read_timeout=4.0))
    fs, _ = loc._filesystem()
    assert fs.client_kwargs["timeout"].sock_read == 4.0
    import pickle

    assert pickle.loads(pickle.dumps(loc)).retry == RetryPolicy(read_timeout=4.0)


def test_convert_options_are_the_one_policy():
    policy = ConvertOptions(retries=3, retry_backoff=0.5).retry_policy
    assert policy.attempts == 4 and list(policy.delays()) == [0.5, 1.0, 2.0]
    assert ConvertOptions(retries=0).retry_policy.attempts == 1
