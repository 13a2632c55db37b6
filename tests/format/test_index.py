import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recordkit.errors import InvalidIndexError, TruncatedRecordError
from recordkit.format import (
    frame,
    index_path,
    parse_index,
    scan_index,
    validate_index,
    write_index,
)
from recordkit.format.index import format_index


def _shard(tmp_path, payloads, name="s.tfrecord"):
    p = tmp_path / name
    p.write_bytes(b"".join(frame(x) for x in payloads))
    return str(p)


def test_scan_matches_framing(tmp_path):
    path = _shard(tmp_path, [b"", b"ab", b"x" * 1000])
    entries = scan_index(path)
    assert entries.tolist() == [[0, 16], [16, 18], [34, 1016]]


def test_format_is_dali_text(tmp_path):
    entries = np.array([[0, 16], [16, 18]])
    assert format_index(entries) == b"0 16\n16 18\n"


@given(st.lists(st.tuples(st.integers(0, 10**15), st.integers(16, 10**12)), max_size=50))
def test_parse_roundtrip(rows):
    entries = np.array(rows, dtype=np.int64).reshape(-1, 2)
    assert parse_index(format_index(entries)).tolist() == entries.tolist()


def test_parse_without_final_newline():
    assert parse_index(b"0 16\n16 20").tolist() == [[0, 16], [16, 20]]


@pytest.mark.parametrize(
    "text",
    [
        b"0 16 3\n",
        b"0\n",
        b"0  16\n",
        b"0 16\n\n",
        b"a b\n",
        b"0 -16\n",
        b" 0 16\n",
        b"0\t16\n",
        b"0 16\r\n",
        b"0 99999999999999999999\n",
    ],
)
def test_parse_rejects_malformed(text):
    with pytest.raises(InvalidIndexError, match="malformed index line"):
        parse_index(text, path="x.idx")


def test_parse_million_lines_is_vectorised():
    """No per-line Python on the way: counted calls, not a clock (CI machines are noisy)."""
    import sys

    sizes = np.full(1_000_000, 1040, dtype=np.int64)
    entries = np.stack([np.cumsum(sizes) - sizes, sizes], axis=1)
    text = format_index(entries)
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        parsed = parse_index(text)
    finally:
        sys.setprofile(None)
    assert np.array_equal(parsed, entries)
    assert calls < 1_000, f"{calls} Python calls to parse 1,000,000 lines"


def test_validate_catches_stale_index(tmp_path):
    path = _shard(tmp_path, [b"aaaa", b"bbbb"])
    data = Path(path).read_bytes()
    validate_index(scan_index(path), data)
    # Same total size, different split: only the length-field check can tell.
    other = _shard(tmp_path, [b"aa", b"bbbbbb"], "o.tfrecord")
    with pytest.raises(InvalidIndexError, match="length field") as info:
        validate_index(scan_index(other), data, path=path)
    assert info.value.record == 0 and info.value.offset == 0
    with pytest.raises(InvalidIndexError, match="covers 20 bytes"):
        validate_index(scan_index(path)[:1], data)
    bad = scan_index(path)
    bad[1, 0] += 1
    with pytest.raises(InvalidIndexError, match="does not match"):
        validate_index(bad, data)
    with pytest.raises(InvalidIndexError, match="empty"):
        validate_index(np.empty((0, 2), np.int64), data)


def test_out_of_bounds_entry(tmp_path):
    path = _shard(tmp_path, [b"aaaa"])
    data = Path(path).read_bytes()
    with pytest.raises(InvalidIndexError):
        validate_index(np.array([[0, 1 << 40]]), data)


def test_scan_reports_truncation(tmp_path):
    p = tmp_path / "t.tfrecord"
    p.write_bytes(frame(b"abc") + frame(b"defg")[:-2])
    with pytest.raises(TruncatedRecordError) as info:
        scan_index(str(p))
    assert (info.value.offset, info.value.record) == (19, 1)


def test_write_index_is_atomic_and_exact(tmp_path):
    path = _shard(tmp_path, [b"x"] * 3)
    write_index(index_path(path), scan_index(path))
    assert Path(index_path(path)).read_bytes() == b"0 17\n17 17\n34 17\n"
    assert sorted(os.listdir(tmp_path)) == ["s.tfrecord", "s.tfrecord.idx"]
