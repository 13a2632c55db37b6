"""``ensure_index``: a shard's index, validated whole, rebuilt when missing or stale
(moved here from tests/format/test_index.py with the code it tests)."""

import os

from recordkit.format import frame, index_path, load_index
from recordkit.reader.index import ensure_index


def _shard(tmp_path, payloads, name="s.tfrecord"):
    p = tmp_path / name
    p.write_bytes(b"".join(frame(x) for x in payloads))
    return str(p)


def test_ensure_index_builds_and_rebuilds(tmp_path, caplog):
    path = _shard(tmp_path, [b"a", b"bb", b"ccc"])
    idx = index_path(path)
    assert idx == path + ".idx"
    assert not os.path.exists(idx)
    first = ensure_index(path)
    assert load_index(idx).tolist() == first.tolist()
    with open(idx, "wb") as f:
        f.write(b"0 17\n17 18\n")  # stale: one record short
    assert ensure_index(path).tolist() == first.tolist()
    assert "rebuilding index" in caplog.text
    assert load_index(idx).tolist() == first.tolist()


def test_empty_shard(tmp_path):
    path = _shard(tmp_path, [])
    assert ensure_index(path).shape == (0, 2)
