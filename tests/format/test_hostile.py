"""Hostile manifests and sidecars: each attack is refused by name, never a hang or a crash."""

import json
import os
import time

import pytest

import recordkit as rk
from recordkit.errors import (
    CorruptRecordError,
    InvalidIndexError,
    ManifestError,
    RecordkitError,
    SchemaError,
)
from recordkit.format import MANIFEST_NAME, Manifest, ShardInfo, index_path, load_index, open_map
from recordkit.format.manifest import (
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_DEPTH,
    normalize_shard_path,
    read_manifest,
)
from recordkit.reader.index import ensure_index

pytestmark = pytest.mark.timeout(60)


def _dataset(tmp_path, records=3, shards=1):
    root = tmp_path / "ds"
    schema = rk.Schema(x=rk.Int64())
    with rk.Writer(root, schema, max_records=records, fsync=False) as w:
        for i in range(records * shards):
            w.write({"x": i})
    return root


def _edit_manifest(root, change):
    path = root / MANIFEST_NAME
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [("a", "a"), ("./a", "a"), ("b/../a", "a"), ("a//", "a"), ("d/./e", "d/e")],
)
def test_shard_paths_are_normalised(spelling, canonical):
    assert ShardInfo(spelling, 1, 16).path == canonical


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "names no file"),
        (".", "names no file"),
        ("a/..", "names no file"),
        ("/etc/passwd", "absolute"),
        ("..", "escapes"),
        ("../x", "escapes"),
        ("a/../../x", "escapes"),
        ("a\0b", "NUL"),
    ],
)
def test_bad_shard_paths_are_refused(bad, message):
    with pytest.raises(ManifestError, match=message):
        normalize_shard_path(bad)


@pytest.mark.parametrize("second", ["./part-00000.tfrecord", "x/../part-00000.tfrecord"])
def test_one_shard_listed_under_two_spellings_is_refused(tmp_path, second):
    root = _dataset(tmp_path)
    path = _edit_manifest(root, lambda d: d["shards"].append({**d["shards"][0], "path": second}))
    with pytest.raises(ManifestError, match="listed twice") as info:
        rk.Dataset(root)
    assert path in str(info.value) and second in str(info.value)
    report = rk.verify(root)
    assert not report.ok and "listed twice" in str(report)


@pytest.mark.parametrize(("bad", "message"), [("a\0b", "NUL"), (".", "names no file")])
def test_bad_shard_path_in_a_manifest_names_the_file(tmp_path, bad, message):
    root = _dataset(tmp_path)
    path = _edit_manifest(root, lambda d: d["shards"][0].update(path=bad))
    with pytest.raises(ManifestError, match=message) as info:
        read_manifest(root)
    assert str(info.value).startswith(path) and "shards[0]" in str(info.value)


def test_deeply_nested_manifest_is_a_manifest_error(tmp_path):
    root = _dataset(tmp_path)
    text = (root / MANIFEST_NAME).read_text()
    deep = "[" * 100_000 + "]" * 100_000  # json.loads alone gives RecursionError
    (root / MANIFEST_NAME).write_text(
        text.replace('"metadata": {}', f'"metadata": {{"a": {deep}}}')
    )
    with pytest.raises(ManifestError, match="nests 100002 levels") as info:
        rk.Dataset(root)
    assert MANIFEST_NAME in str(info.value)


def test_nesting_limit_is_exact_and_ignores_brackets_in_strings():
    def doc(depth, noise=""):
        meta = "[" * (depth - 2) + "]" * (depth - 2)
        return (
            '{"format": "recordkit", "format_version": 1, "schema": {"features": []}, '
            f'"shards": [], "metadata": {{"m": {meta}, "s": "{noise}"}}}}'
        )

    assert Manifest.loads(doc(MAX_MANIFEST_DEPTH, noise='[[[[\\"{{{{' * 50)).shards == ()
    with pytest.raises(ManifestError, match="levels deep"):
        Manifest.loads(doc(MAX_MANIFEST_DEPTH + 1))


def test_unterminated_strings_do_not_make_the_depth_check_slow():
    start = time.perf_counter()
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.loads('{"a": "' + '\\"' * 2_000_000)
    assert time.perf_counter() - start < 10


def test_oversized_manifest_is_refused_before_parsing(tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    with open(root / MANIFEST_NAME, "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ManifestError, match="over the limit") as info:
        read_manifest(root)
    assert MANIFEST_NAME in str(info.value)


@pytest.mark.parametrize(
    ("feature", "name"),
    [
        ({"name": "t", "type": "tensor", "dtype": "float32", "shape": [1 << 40]}, "t"),
        ({"name": "v", "type": "tensor", "dtype": "uint8", "shape": [None, 1 << 32]}, "v"),
        ({"name": "i", "type": "int64", "shape": [1 << 20, 1 << 20]}, "i"),
    ],
)
def test_schema_claiming_more_than_a_record_is_refused_on_load(tmp_path, feature, name):
    root = _dataset(tmp_path)
    path = _edit_manifest(root, lambda d: d["schema"]["features"].append(feature))
    with pytest.raises(ManifestError, match=f"feature {name!r}.*record limit") as info:
        rk.Dataset(root)
    assert str(info.value).startswith(path)
    with pytest.raises(SchemaError, match=f"feature {name!r}.*record limit"):
        rk.Schema.from_json({"features": [feature]})


def test_large_but_possible_fixed_shapes_still_load():
    schema = rk.Schema(t=rk.Tensor("uint8", (1 << 30,)), z=rk.Tensor("float64", (0, 1 << 40)))
    assert rk.Schema.from_json(schema.to_json()) == schema


def test_index_that_is_a_fifo_never_blocks(tmp_path, caplog):
    root = _dataset(tmp_path)
    shard = str(root / "part-00000.tfrecord")
    os.unlink(index_path(shard))
    os.mkfifo(index_path(shard))
    with pytest.raises(InvalidIndexError, match="is a FIFO") as info:
        load_index(index_path(shard))
    assert index_path(shard) in str(info.value)
    # Readers rebuild it in memory and leave the FIFO alone.
    assert [s["x"] for s in rk.Dataset(root)] == [0, 1, 2]
    assert "rebuilding index" in caplog.text
    assert os.path.exists(index_path(shard)) and not os.path.isfile(index_path(shard))
    problems = str(rk.verify(root))
    assert "FIFO" in problems and index_path(shard) in problems


def test_index_that_is_a_directory_is_an_index_error(tmp_path):
    root = _dataset(tmp_path)
    shard = str(root / "part-00000.tfrecord")
    os.unlink(index_path(shard))
    os.mkdir(index_path(shard))
    with pytest.raises(InvalidIndexError, match="is a directory"):
        load_index(index_path(shard))
    assert ensure_index(shard).shape == (3, 2)
    assert os.path.isdir(index_path(shard))
    assert "is a directory" in str(rk.verify(root))


def test_oversized_index_is_refused_unread(tmp_path):
    root = _dataset(tmp_path)
    shard = root / "part-00000.tfrecord"
    with open(index_path(shard), "r+b") as f:
        f.truncate(1 << 30)  # sparse
    with pytest.raises(InvalidIndexError, match="over the limit"):
        load_index(index_path(shard), max_bytes=1000)
    assert ensure_index(str(shard)).shape == (3, 2)  # rebuilt, the big file never read


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_manifest_or_shard_that_is_not_a_file(tmp_path, kind):
    root = _dataset(tmp_path)
    for name in (MANIFEST_NAME, "part-00000.tfrecord"):
        target = root / name
        os.replace(target, root / (name + ".moved"))
        os.mkfifo(target) if kind == "fifo" else os.mkdir(target)
        error = ManifestError if name == MANIFEST_NAME else CorruptRecordError
        with pytest.raises(error, match=r"not a regular file|is a directory") as info:
            read_manifest(root) if name == MANIFEST_NAME else open_map(target)
        assert str(target) in str(info.value)
        assert isinstance(info.value, RecordkitError)
        (os.rmdir if kind == "dir" else os.unlink)(target)
        os.replace(root / (name + ".moved"), target)


def test_dataset_whose_shard_is_a_fifo_is_refused(tmp_path):
    root = _dataset(tmp_path)
    shard = root / "part-00000.tfrecord"
    os.unlink(shard)
    os.mkfifo(shard)
    with pytest.raises(CorruptRecordError, match="is a FIFO"):
        rk.Dataset(root)
    assert "is a FIFO" in str(rk.verify(root))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "b", "records": 1}, r"shards\[1\]: malformed entry: KeyError\('bytes'\)"),
        ({"path": 7, "records": 1, "bytes": 1}, r"shards\[1\]: malformed entry"),
        ("b", r"shards\[1\]: malformed entry"),
        ({"path": "b", "records": -1, "bytes": 1}, r"shards\[1\]: negative"),
    ],
)
def test_a_malformed_shard_entry_is_named(entry, message):
    doc = {"format": "recordkit", "format_version": 1, "schema": {"features": []}}
    doc["shards"] = [{"path": "a", "records": 1, "bytes": 1}, entry]
    with pytest.raises(ManifestError, match=message):
        Manifest.loads(json.dumps(doc), path="m.json")


@pytest.mark.torch
def test_record_dataset_refuses_a_huge_claimed_shape_before_allocating(tmp_path):
    # Was: MemoryError: Unable to allocate 40.0 TiB for the batch buffer.
    torch_rk = pytest.importorskip("recordkit.torch")
    root = _dataset(tmp_path)
    huge = {"name": "t", "type": "tensor", "dtype": "float32", "shape": [1 << 40]}
    path = _edit_manifest(root, lambda d: d["schema"]["features"].append(huge))
    with pytest.raises(ManifestError, match=r"feature 't'.*record limit") as info:
        next(iter(torch_rk.RecordDataset(root, batch_size=4)))
    assert str(info.value).startswith(path)
