"""The test servers behave like the real thing where it matters to fsspec."""

import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.remote


def _get(url, range_=None):
    req = urllib.request.Request(url, headers={"Range": range_} if range_ else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.headers, resp.read()


def test_http_honours_range(http):
    Path(http.root, "f.bin").write_bytes(bytes(range(100)))
    status, headers, body = _get(f"{http.url}/f.bin", "bytes=10-19")
    assert status == 206 and body == bytes(range(10, 20))
    assert headers["Content-Range"] == "bytes 10-19/100"
    assert _get(f"{http.url}/f.bin", "bytes=-5")[2] == bytes(range(95, 100))
    assert _get(f"{http.url}/f.bin", "bytes=98-")[2] == b"\x62\x63"
    status, headers, body = _get(f"{http.url}/f.bin")
    assert status == 200 and len(body) == 100 and headers["Accept-Ranges"] == "bytes"
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(f"{http.url}/f.bin", "bytes=100-")
    assert info.value.code == 416
    info.value.close()
    assert ("GET", "/f.bin", "bytes=10-19") in http.requests


def test_http_fail_next(http):
    (Path(http.root) / "x").write_bytes(b"x")
    http.fail_next(1, status=503)
    with pytest.raises(urllib.error.HTTPError) as info:
        _get(f"{http.url}/x")
    assert info.value.code == 503
    info.value.close()
    assert _get(f"{http.url}/x")[2] == b"x"


def test_fsspec_reads_ranges_over_http(http):
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    data = bytes(range(256)) * 4096  # 1 MiB
    (Path(http.root) / "big.bin").write_bytes(data)
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    with fs.open(f"{http.url}/big.bin", "rb", block_size=4096) as f:
        f.seek(500_000)
        assert f.read(10) == data[500_000:500_010]
    ranged = [r for r in http.requests if r[1] == "/big.bin" and r[2]]
    assert ranged, http.requests
    assert f"{http.url}/big.bin" in fs.ls(http.url + "/", detail=False)


def test_s3_server_with_s3fs(s3):
    pytest.importorskip("s3fs")
    url = s3.bucket()
    fs = s3.filesystem()
    fs.pipe(f"{url}/a/b.txt", b"hello")
    assert fs.cat(f"{url}/a/b.txt") == b"hello"
    assert fs.cat_file(f"{url}/a/b.txt", start=1, end=3) == b"el"
    assert fs.ls(f"{url}/a", detail=False) == [f"{url[5:]}/a/b.txt"]
