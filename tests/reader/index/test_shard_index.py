"""The compact index readers hold: parsed and checked at load, length fields per run.

``parse_bounds`` has a C path (``recordkit/native/index.c``) and a NumPy path; both must
accept and refuse the same texts. The lazy part: a stale index that passes the
checks made at load is still caught before any record of a run it misplaces is
returned, as an ``InvalidIndexError`` (never a skippable corrupt record).
"""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import recordkit as rk
import recordkit.reader.index.shard_index as si
import recordkit.reader.index.text as text_mod
from recordkit.errors import InvalidIndexError, ShardChangedError
from recordkit.format import (
    frame,
    index_path,
    open_map,
    scan_index,
    write_index,
)
from recordkit.format.index import format_index
from recordkit.reader import ReadOptions
from recordkit.reader.index import open as index_open
from recordkit.reader.index import store as index_cache
from recordkit.reader.index.open import open_index
from recordkit.reader.index.shard_index import ShardIndex, run_shift
from recordkit.reader.index.text import parse_bounds

PATHS = [pytest.param(True, id="c"), pytest.param(False, id="numpy")]


@pytest.fixture(params=PATHS)
def native(request, monkeypatch):
    if request.param:
        if si._c is None:
            if os.environ.get("RECORDKIT_REQUIRE_NATIVE"):
                pytest.fail("recordkit.native._ext is not built")
            pytest.skip("recordkit.native._ext is not built")
    else:
        monkeypatch.setattr(si, "_c", None)  # the loads: whole texts, read
        monkeypatch.setattr(index_open, "_c", None)
        monkeypatch.setattr(text_mod, "native", None)  # the parse: NumPy's
    return request.param


def _entries(sizes):
    s = np.asarray(sizes, dtype=np.int64)
    return np.stack([np.cumsum(s) - s, s], axis=1)


@given(
    sizes=st.lists(st.integers(16, 10**9), max_size=40),
    final_newline=st.booleans(),
    c=st.booleans(),
)
def test_parse_bounds_c_and_numpy_agree(sizes, final_newline, c):
    entries = _entries(sizes)
    text = format_index(entries)
    if text and not final_newline:
        text = text[:-1]
    size = int(entries[:, 1].sum())
    if c and si._c is None:
        return
    saved = si._c
    try:
        if not c:
            si._c = text_mod.native = None
        bounds = parse_bounds(text, size)
    finally:
        si._c = text_mod.native = saved
    assert bounds.dtype == (np.uint32 if size < 1 << 32 else np.uint64)
    assert bounds.tolist() == [*entries[:, 0].tolist(), size]


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
        b"0 16\n16",
        b"\n",
    ],
)
def test_malformed_text_is_refused_by_both(native, text):
    with pytest.raises(InvalidIndexError, match="malformed index line") as info:
        parse_bounds(text, 16, where="x.idx")
    assert info.value.path == "x.idx"


@pytest.mark.parametrize(
    ("text", "size", "match", "record", "offset"),
    [
        (b"0 16\n17 16\n", 33, "does not match the shard of 33", 1, 17),  # a gap
        (b"0 16\n10 16\n", 32, "does not match", 1, 10),  # overlapping
        (b"0 15\n15 17\n", 32, "does not match", 0, 0),  # a size under 16
        (b"0 16\n16 32\n", 40, "does not match the shard of 40", 1, 16),  # past the end
        (b"4 16\n", 20, "does not match", 0, 4),  # not from 0
        (b"0 16\n", 40, "covers 16 bytes but the shard has 40", 1, 16),  # short
        (b"", 40, "empty but the shard has 40", 0, 0),
    ],
)
def test_entries_are_checked_against_the_size(native, text, size, match, record, offset):
    with pytest.raises(InvalidIndexError, match=match) as info:
        parse_bounds(text, size, where="x.idx")
    assert (info.value.record, info.value.offset, info.value.path) == (record, offset, "x.idx")


def test_empty_index_of_an_empty_shard(native):
    assert parse_bounds(b"", 0).tolist() == [0]


def test_shards_past_4_gib_get_uint64_bounds(native):
    entries = _entries([2**31, 2**31, 100])
    bounds = parse_bounds(format_index(entries), 2**32 + 100)
    assert bounds.dtype == np.uint64 and int(bounds[-1]) == 2**32 + 100


def test_run_sizes_follow_the_record_size():
    assert run_shift(64 * 1000, 1000) == 6  # 64 records of 64 bytes in 4 KiB
    assert run_shift(1024 * 1000, 1000) == 2
    assert run_shift(4096 * 10, 10) == 0
    assert run_shift(10**9, 10) == 0  # big records: one a run
    assert run_shift(16 * 10**6, 10**6) == 8  # at most 256
    assert run_shift(0, 0) == 0


def _varied_shard(tmp_path, n=2000, name="s.tfrecord"):
    """A shard of n records of sizes 20..59 (so swapped neighbours do not tile alike)."""
    path = tmp_path / name
    payloads = [bytes([i % 251]) * (20 + i % 40) for i in range(n)]
    path.write_bytes(b"".join(frame(p) for p in payloads))
    return str(path), payloads


def _written_shard(tmp_path):
    """The one shard of a dataset written to tmp_path / "ds": 3000 records of varied size."""
    schema = rk.Schema(i=rk.Int64(), pad=rk.Bytes())
    with rk.Writer(tmp_path / "ds", schema) as w:
        for i in range(3000):
            w.write({"i": i, "pad": b"p" * (i % 50)})
    (shard,) = [str(p) for p in (tmp_path / "ds").glob("*.tfrecord")]
    return shard


def _swap(entries, i):
    """A stale index: records i and i + 1 swap sizes (contiguous, ends at the file size)."""
    bad = entries.copy()
    bad[i, 1], bad[i + 1, 1] = entries[i + 1, 1], entries[i, 1]
    bad[i + 1, 0] = bad[i, 0] + bad[i, 1]
    return bad


def test_memory_is_four_bytes_a_record(tmp_path):
    path, _ = _varied_shard(tmp_path)
    index = open_index(path)
    assert index.bounds.dtype == np.uint32 and index.bounds.nbytes == 4 * 2001
    assert not index.bounds.flags.writeable
    assert np.array_equal(index.entries(), scan_index(path))


def test_a_stale_run_is_caught_before_its_records(tmp_path):
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    write_index(index_path(path), _swap(true, 1000))
    buf = open_map(path)
    index = open_index(path, buf=buf, write=False, cache=False)  # passes the load checks
    assert index.source == index_path(path) and index.unchecked_runs == len(index._checked)
    run = index.run_records
    first = 1000 // run * run
    offsets, sizes = index.locate(np.arange(first), buf, path=path)
    assert np.array_equal(offsets, true[:first, 0]) and np.array_equal(sizes, true[:first, 1])
    for asked in ([first + run - 1], [5, first], [1000]):
        with pytest.raises(InvalidIndexError, match="length field") as info:
            index.locate(np.array(asked), buf, path=path)
        assert info.value.record == 1000 and info.value.path == index_path(path)
        assert info.value.offset == int(true[1000, 0])
    with pytest.raises(InvalidIndexError):
        index.entry(1001, buf, path=path)
    assert index.entry(first + run, buf, path=path) == tuple(true[first + run].tolist())
    buf.close()


def test_every_reader_stops_at_the_stale_run(tmp_path, monkeypatch):
    """Dataset and RecordDataset (native runner and reference path, on_error="skip"
    too): records before the stale run come, then InvalidIndexError, never a skip."""
    torch = pytest.importorskip("torch")
    del torch
    import recordkit.torch as rkt

    shard = _written_shard(tmp_path)
    true = scan_index(shard)
    os.unlink(index_path(shard))
    write_index(index_path(shard), _swap(true, 2000))
    got = []
    with pytest.raises(InvalidIndexError, match="stale index") as info:
        for sample in rk.Dataset(tmp_path / "ds"):
            got.append(int(sample["i"]))
    assert info.value.path == index_path(shard) and info.value.record == 2000
    assert got == list(range(len(got))) and len(got) <= 2000
    for native_tasks in ("1", "0"):
        monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", native_tasks)
        ds = rkt.RecordDataset(
            tmp_path / "ds", batch_size=100, options=ReadOptions(on_error="skip")
        )
        seen = []
        with pytest.raises(InvalidIndexError, match="stale index"):
            for batch in ds:
                seen.extend(batch["i"].tolist())
        assert seen == list(range(len(seen))) and len(seen) <= 2000


def test_a_wholly_stale_index_is_rebuilt_at_load(tmp_path, caplog):
    """An index of another shard of the same size fails the spot checks: rebuilt."""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    sizes = np.full(len(true), true[:, 1].sum() // len(true))
    sizes[-1] += true[:, 1].sum() - sizes.sum()  # tiles the file, equal sizes
    write_index(index_path(path), _entries(sizes))
    index = open_index(path)
    assert "rebuilding index" in caplog.text and index.unchecked_runs == 0
    assert np.array_equal(index.entries(), true)
    assert np.array_equal(open_index(path).entries(), true)  # written back


def test_a_count_the_manifest_disputes_is_checked_whole(tmp_path, caplog):
    """A stale index with another record count is rebuilt, not blamed on the manifest."""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    merged = np.concatenate([true[:1500], [[true[1500, 0], true[1500:1502, 1].sum()]], true[1502:]])
    write_index(index_path(path), merged)
    index = open_index(path, records=len(true))
    assert "rebuilding index" in caplog.text
    assert np.array_equal(index.entries(), true)


def test_a_shard_cut_under_a_run_check_names_the_record_asked_for(tmp_path):
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    write_index(index_path(path), true)
    buf = open_map(path)
    index = open_index(path, buf=buf)  # its runs are checked as they are read
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    try:
        with pytest.raises(ShardChangedError) as info:
            index.locate(np.array([3, 1999]), buf, path=path)
        assert info.value.record == 1999
        offsets, _ = index.locate(np.array([3]), buf, path=path)  # intact: still located
        assert int(offsets[0]) == int(true[3, 0])
    finally:
        buf.close()


def test_from_entries_is_checked_and_round_trips(tmp_path):
    path, _ = _varied_shard(tmp_path, n=10)
    true = scan_index(path)
    index = ShardIndex.from_entries(true, os.path.getsize(path))
    assert index.unchecked_runs == 0 and np.array_equal(index.entries(), true)
    with pytest.raises(IndexError):
        index.entry(10, b"")


# ------------------------------------------------------------- the binary copy in the cache


@pytest.fixture
def any_size(monkeypatch):
    """Binary copies for index texts of any size (the tests' shards are small)."""
    monkeypatch.setattr(si, "BINARY_MIN_TEXT", 0)


def test_short_index_texts_are_parsed_not_copied(tmp_path):
    path, _ = _varied_shard(tmp_path)
    write_index(index_path(path), scan_index(path))
    assert os.path.getsize(index_path(path)) < si.BINARY_MIN_TEXT
    open_index(path)
    assert _bnd_files() == []


HEAD = index_cache._BOUNDS_HEADER.size  # a binary copy's header, then its boundaries


def _bnd_files():
    from recordkit.reader.index import store as index_cache

    index_cache.wait_stored()  # binary copies are written on a background thread
    directory = os.path.join(index_cache.cache_dir() or "", "bounds")
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, f) for f in os.listdir(directory))


def test_a_parsed_index_is_kept_in_binary_and_read_back(tmp_path, monkeypatch, any_size):
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    write_index(index_path(path), true)
    first = open_index(path)
    (bnd,) = _bnd_files()
    assert os.path.getsize(bnd) == HEAD + 4 * (len(true) + 1)

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(si, "parse_bounds", no_parse)
    again = open_index(path)
    assert np.array_equal(again.bounds, first.bounds) and again.source == index_path(path)
    buf = open_map(path)
    assert np.array_equal(again.locate(np.arange(len(true)), buf)[1], true[:, 1])
    buf.close()
    monkeypatch.setenv("RECORDKIT_INDEX_CACHE", "off")
    with pytest.raises(AssertionError, match="parsed again"):
        open_index(path)


def test_a_new_text_index_is_not_read_from_an_old_copy(tmp_path, any_size):
    """The copy's header names the text it was parsed from (size, mtime_ns, inode): a
    new text is parsed, and a stale one is caught. (A text rewritten in place within
    the file system's timestamp tick, at the same size and inode, cannot be told
    apart by its stat: its copy is still checked against the shard, record by
    record, before any record is returned.)"""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    write_index(index_path(path), true)
    open_index(path)
    os.unlink(index_path(path))
    write_index(index_path(path), _swap(true, 3))  # another file
    st = os.stat(index_path(path))
    os.utime(index_path(path), ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later tick
    buf = open_map(path)
    with pytest.raises(InvalidIndexError, match="length field"):
        index = open_index(path, buf=buf, write=False)
        index.locate(np.arange(10), buf)
    buf.close()
    assert len(_bnd_files()) == 1  # one copy per shard


@pytest.mark.parametrize("damage", ["magic", "short", "last", "middle", "outside", "zeroed"])
def test_a_damaged_copy_is_dropped_and_the_text_read_instead(tmp_path, damage, any_size, caplog):
    """Never blamed on the good .idx: a copy that fails a check at load (its header,
    its first and last boundary, 16 spot checks) or later (the run of a record asked
    for) is dropped, and the text it was made from is parsed instead."""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    write_index(index_path(path), true)
    open_index(path)
    (bnd,) = _bnd_files()
    with open(bnd, "rb") as f:
        raw = bytearray(f.read())
    if damage == "magic":
        raw[0:8] = b"XXXXXXXX"
    elif damage == "short":
        raw = raw[:-4]
    elif damage == "last":
        raw[-4:] = (12345).to_bytes(4, "little")
    elif damage == "middle":  # record 1000 one byte longer, 1001 one shorter
        at = HEAD + 4 * 1001
        raw[at : at + 4] = (int(true[1001, 0]) + 1).to_bytes(4, "little")
    elif damage == "outside":  # a boundary past the end of the shard
        at = HEAD + 4 * 1500
        raw[at : at + 4] = (1 << 31).to_bytes(4, "little")
    else:  # boundaries zeroed between two of the spot checks made at load
        n = len(true)
        spots = np.arange(si.SPOT_CHECKS) * (n - 1) // (si.SPOT_CHECKS - 1)
        lo, hi = int(spots[7]) + 2, int(spots[8]) - 1
        raw[HEAD + 4 * lo : HEAD + 4 * hi] = bytes(4 * (hi - lo))
    with open(bnd, "wb") as f:
        f.write(raw)
    buf = open_map(path)
    index = open_index(path, buf=buf)
    offsets, sizes = index.locate(np.arange(len(true)), buf, path=path)
    assert np.array_equal(offsets, true[:, 0]) and np.array_equal(sizes, true[:, 1])
    assert index.source == index_path(path)
    buf.close()
    with open(index_path(path), "rb") as f:  # the text is untouched
        assert f.read() == format_index(true)
    if damage in ("middle", "outside", "zeroed"):  # caught after load: dropped
        assert _bnd_files() == []
        assert "did not fit the shard" in caplog.text
    for bnd in _bnd_files():  # a copy written again is the text's
        with open(bnd, "rb") as f:
            assert f.read()[HEAD:] == np.append(true[:, 0], true[-1].sum()).astype("<u4").tobytes()


def test_a_copy_key_that_is_not_a_file_is_passed_without_blocking(tmp_path, any_size):
    """A FIFO (or a directory) where a copy belongs: opened without blocking, never read
    from, never removed; the text is parsed."""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    write_index(index_path(path), true)
    open_index(path)
    (bnd,) = _bnd_files()
    os.unlink(bnd)
    os.mkfifo(bnd)
    index = open_index(path)  # would block forever on a blocking open
    assert np.array_equal(index.entries(), true)
    assert stat.S_ISFIFO(os.lstat(bnd).st_mode)


def test_one_copy_per_shard_however_often_it_is_opened(tmp_path, any_size):
    """A foreign shard's index text lives in the per-user cache; opening it again must
    not write another copy each time (a hit marks the text used by its access time,
    leaving the modification time the copy names)."""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    for _ in range(4):
        index = open_index(path, write=False)  # the text in the per-user cache
        assert np.array_equal(index.entries(), true)
        assert len(_bnd_files()) <= 1
    assert len(_bnd_files()) == 1


def test_a_folder_whose_name_is_not_utf8_keys_its_copies(tmp_path, any_size):
    folder = tmp_path / os.fsdecode(b"data-\xff\xfe")
    folder.mkdir()
    path, _ = _varied_shard(folder)
    true = scan_index(path)
    write_index(index_path(path), true)
    for _ in range(2):
        assert np.array_equal(open_index(path).entries(), true)
    assert len(_bnd_files()) == 1
    assert np.array_equal(open_index(path, write=False).entries(), true)


def test_lookup_reads_no_length_field_but_keeps_entries_inside_the_shard(tmp_path):
    """lookup() is for the native runner, which compares each length field as it frames
    the record: no run is checked, a stale run is not noticed here, an entry outside
    the shard (a damaged binary copy) is None, and the caller then takes locate()."""
    path, _ = _varied_shard(tmp_path)
    true = scan_index(path)
    bounds = ShardIndex.from_entries(_swap(true, 1000), os.path.getsize(path)).bounds
    index = ShardIndex(bounds.copy(), source="x.idx")  # as loaded: no run checked yet
    recs = np.array([3, 999, 1000, 1001, 1999])
    offsets, sizes = index.lookup(recs)
    assert offsets.tolist() == _swap(true, 1000)[recs, 0].tolist()
    assert sizes.tolist() == _swap(true, 1000)[recs, 1].tolist()
    assert index.unchecked_runs == len(index._checked)
    bad = bounds.copy()
    bad[1500] = bad[-1] + 1  # past the end of the shard
    damaged = ShardIndex(bad, source="x.idx")
    assert damaged.lookup(np.array([1499])) is None and damaged.lookup(np.array([1])) is not None
    assert damaged.lookup(np.array([1500])) is None  # a size under 16 (negative)


@pytest.mark.parametrize("damage", ["middle", "outside"])
@pytest.mark.parametrize("native_tasks", ["1", "0"])
def test_recorddataset_reads_past_a_damaged_copy(tmp_path, monkeypatch, damage, native_tasks):
    """Through RecordDataset (the native runner frames records from unchecked
    lookups): a binary copy damaged in the middle, or pointing outside the shard, is
    caught before any record it places is returned, dropped, and the text read:
    every record, in order, never a wrong or skipped one."""
    pytest.importorskip("torch")
    import recordkit.torch as rkt

    monkeypatch.setenv("RECORDKIT_NATIVE_TASKS", native_tasks)
    monkeypatch.setattr(si, "BINARY_MIN_TEXT", 0)  # a copy even of a small index
    shard = _written_shard(tmp_path)
    true = scan_index(shard)
    list(rkt.RecordDataset(tmp_path / "ds", batch_size=500))  # leaves the binary copy
    (bnd,) = _bnd_files()
    with open(bnd, "rb") as f:
        raw = bytearray(f.read())
    at = HEAD + 4 * 2001
    if damage == "middle":  # record 2000 one byte longer, 2001 one shorter
        raw[at : at + 4] = (int(true[2001, 0]) + 1).to_bytes(4, "little")
    else:
        raw[at : at + 4] = (1 << 31).to_bytes(4, "little")
    with open(bnd, "wb") as f:
        f.write(raw)
    ds = rkt.RecordDataset(tmp_path / "ds", batch_size=100)
    seen = [i for batch in ds for i in batch["i"].tolist()]
    assert seen == list(range(len(true)))
    assert _bnd_files() == []  # dropped; the next parse writes it again


def test_a_process_that_exits_at_once_still_leaves_its_binary_copy(tmp_path):
    """The copy is written on a background thread; a process that ends right after
    the parse (normally) finishes that write first, so the next process finds it."""
    import subprocess
    import sys

    path, _ = _varied_shard(tmp_path)
    write_index(index_path(path), scan_index(path))
    code = (
        "import sys, recordkit.reader.index.shard_index as si\n"
        "si.BINARY_MIN_TEXT = 0\n"
        "from recordkit.reader.index.open import open_index\n"
        "open_index(sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=120, env=os.environ)
    (bnd,) = _bnd_files()
    assert os.path.getsize(bnd) == HEAD + 4 * (len(scan_index(path)) + 1)
