"""Index texts parsed a block of lines at a time (``ShardIndex.from_text``).

A reader loading a large ``.idx`` counts its lines, parses its first and last
blocks and 16 spread ones (the spot checks), and parses any other block the first
time one of its records is located. Whatever is wrong with a line is still an
``InvalidIndexError`` naming the file and the line, raised before any record of
that block is located; lines that were never needed are never parsed. A text cut
short under its map is an error, not a SIGBUS.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import recordkit.reader.index.shard_index as si
import recordkit.reader.index.text as text_mod
from recordkit.errors import InvalidIndexError
from recordkit.format.index import format_index
from recordkit.reader.index.shard_index import LAZY_MIN_TEXT, ShardIndex
from recordkit.reader.index.text import FILL_RECORDS, parse_bounds

pytestmark = pytest.mark.skipif(si._c is None, reason="the native extension is not built")

N = 20_000  # ~250 KB of text: past LAZY_MIN_TEXT


def _text(n=N, seed=0):
    sizes = np.random.default_rng(seed).integers(16, 5000, n)
    entries = np.stack([np.cumsum(sizes) - sizes, sizes], axis=1)
    return format_index(entries), int(sizes.sum())


def _lazy(tmp_path, text, size, records=None):
    path = tmp_path / "s.tfrecord.idx"
    path.write_bytes(text)
    data, _ = text_mod.map_text(str(path), 1 << 40)
    return ShardIndex.from_text(data, size, source=str(path), records=records), str(path)


def test_blocks_are_parsed_as_needed_and_agree_with_a_whole_parse(tmp_path):
    text, size = _text()
    assert len(text) >= LAZY_MIN_TEXT
    index, _ = _lazy(tmp_path, text, size, records=N)
    whole = parse_bounds(text, size)
    assert index is not None and not index.complete and index.records == N
    assert index.nbytes == size
    filled = int(index._filled.sum())
    assert filled == 2  # the first and the last block, at load
    recs = np.random.default_rng(1).integers(0, N, 300)
    offsets, sizes = index.lookup(recs)
    assert (offsets == whole[recs]).all() and (sizes == whole[recs + 1] - whole[recs]).all()
    assert not index.complete and index._filled.sum() <= 2 + len(np.unique(recs // FILL_RECORDS))
    assert (index.bounds == whole).all() and index.complete  # .bounds fills in the rest


@pytest.mark.parametrize("line", [5 * FILL_RECORDS + 3, 5 * FILL_RECORDS, 6 * FILL_RECORDS - 1])
def test_a_malformed_line_is_caught_when_its_block_is_needed(tmp_path, line):
    text, size = _text()
    lines = text.split(b"\n")
    lines[line] = lines[line].replace(b" ", b"x", 1)
    bad = b"\n".join(lines)
    index, path = _lazy(tmp_path, bad, size, records=N)
    assert index is not None  # the load checks do not read that block
    index.lookup(np.array([0, 10 * FILL_RECORDS, N - 1]))  # other blocks are fine
    with pytest.raises(InvalidIndexError, match=f"malformed index line {line + 1}") as err:
        index.lookup(np.array([5 * FILL_RECORDS + 1]))
    assert err.value.path == path and err.value.record == line
    with pytest.raises(InvalidIndexError, match="malformed index line"):
        parse_bounds(bad, size, where=path)  # the whole parse says the same


def test_a_block_that_does_not_follow_the_one_before_is_caught(tmp_path):
    text, size = _text()
    lines = text.split(b"\n")
    k = 7 * FILL_RECORDS  # the first line of block 7 moved by one byte
    off, sz = map(int, lines[k].split())
    lines[k] = f"{off + 1} {sz - 1}".encode()
    index, _ = _lazy(tmp_path, b"\n".join(lines), size, records=N)
    with pytest.raises(InvalidIndexError, match="does not match the shard") as err:
        index.lookup(np.array([k - 1]))  # block 6: its last entry meets block 7's first
    assert err.value.record == k and err.value.offset == off + 1
    with pytest.raises(InvalidIndexError, match="does not match the shard"):
        ShardIndex.from_text(index._pending.data, size, source="x", records=N).bounds  # noqa: B018


def test_the_end_and_the_count_are_checked_at_load(tmp_path):
    text, size = _text()
    with pytest.raises(InvalidIndexError, match="covers"):
        _lazy(tmp_path, text, size + 16, records=N)
    index, _ = _lazy(tmp_path, text, size, records=N + 1)
    assert index is None  # not the manifest's count: the caller parses whole (and says so)


def test_a_text_cut_short_under_its_map_is_an_error_not_a_crash(tmp_path):
    text, size = _text(n=100_000)
    index, path = _lazy(tmp_path, text, size, records=100_000)
    os.truncate(path, 4096)  # a program rewriting it in place
    with pytest.raises(InvalidIndexError, match="cut short") as err:
        index.lookup(np.array([90_000]))
    assert err.value.path == path and err.value.record == 90_000 // FILL_RECORDS * FILL_RECORDS
    assert err.value.offset >= 4096  # where in the index file the page vanished


def test_an_unchanged_text_gives_a_lazy_index_through_open_index(tmp_path):
    import recordkit as rk
    from recordkit.format import open_map

    schema = rk.Schema(i=rk.Int64())
    with rk.Writer(tmp_path / "ds", schema) as w:
        for i in range(N):
            w.write({"i": i})
    (shard,) = sorted((tmp_path / "ds").glob("*.tfrecord"))
    buf = open_map(shard)
    from recordkit.reader.index.open import open_index

    index = open_index(shard, buf=buf, write=False, cache=False, records=N)
    assert not index.complete  # parsed as needed
    offsets, _ = index.locate(np.arange(0, N, 997), buf, path=str(shard))
    whole = parse_bounds((tmp_path / "ds" / (shard.name + ".idx")).read_bytes(), len(buf))
    assert (offsets == whole[:N:997]).all()
    buf.close()
