"""Other people's TFRecords, written by TensorFlow itself (issue 15, items 3 and 4).

Compressed files are refused by name (never "corrupt"), verified as streams, and
converted to an indexed copy whose every value matches TensorFlow's own reader.
Reading a foreign folder writes nothing into it: indexes go to the per-user cache
(pointed at a temporary directory by ``tests/conftest.py``).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import recordkit as rk
from recordkit.cli import main
from recordkit.errors import CompressedTFRecordError, CorruptRecordError
from recordkit.reader import ReadOptions
from recordkit.reader.index import store as index_cache

pytestmark = pytest.mark.tf

N = 40


@pytest.fixture(scope="module")
def tf() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TensorFlow's import-time deprecation noise
        return pytest.importorskip("tensorflow")


def _write(tf: ModuleType, path: Path, compression: str = "", n: int = N) -> Path:
    """``n`` Examples (id, name, vec) through ``tf.io.TFRecordWriter``."""
    options = tf.io.TFRecordOptions(compression_type=compression)
    with tf.io.TFRecordWriter(str(path), options=options) as w:
        for i in range(n):
            feature = {
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"r{i}".encode()])),
                "vec": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i / 2, -i])),
            }
            ex = tf.train.Example(features=tf.train.Features(feature=feature))
            w.write(ex.SerializeToString())
    return path


def _tf_values(tf: ModuleType, path: Path, compression: str = "") -> list[dict[str, object]]:
    """TensorFlow's own reading of the file, as plain Python values."""
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "name": tf.io.FixedLenFeature([], tf.string),
        "vec": tf.io.FixedLenFeature([3], tf.float32),
    }
    out = []
    for raw in tf.data.TFRecordDataset(str(path), compression_type=compression):
        parsed = tf.io.parse_single_example(raw, spec)
        out.append({k: v.numpy() for k, v in parsed.items()})
    return out


def _same(ours: list[dict[str, object]], theirs: list[dict[str, object]]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert int(a["id"]) == int(b["id"])  # type: ignore[call-overload]
        assert a["name"] == b["name"]
        np.testing.assert_array_equal(np.asarray(a["vec"], np.float32), b["vec"])


# ------------------------------------------------------------------ compressed files


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_compressed_is_refused_by_name_never_corrupt(tf: ModuleType, tmp_path: Path, kind: str):
    path = _write(tf, tmp_path / "data.tfrecord", kind)
    with pytest.raises(CompressedTFRecordError) as info:
        rk.Dataset(path)
    assert not isinstance(info.value, CorruptRecordError)
    message = str(info.value)
    assert f"{kind}-compressed TFRecord" in message
    assert f"recordkit convert --from tfrecord {path} DEST" in message
    assert "corrupt" not in message.lower() and "CRC" not in message
    assert info.value.compression == kind and info.value.path == str(path)
    with pytest.raises(CompressedTFRecordError, match=f"{kind}-compressed TFRecord"):
        rk.Dataset(tmp_path)  # the folder too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.tfrecord"]


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_verify_checks_compressed_as_a_stream(
    tf: ModuleType, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
):
    path = _write(tf, tmp_path / "data.tfrecord", kind)
    report = rk.verify(tmp_path)
    assert report.ok, str(report)
    assert report.records == N
    assert any(f"{kind}-compressed TFRecord" in n.message for n in report.notes)
    assert main(["verify", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{kind}-compressed TFRecord" in err and "recordkit convert --from tfrecord" in err
    assert "corrupt" not in err.lower()


def test_verify_finds_damage_inside_a_gzip_stream(tf: ModuleType, tmp_path: Path):
    # Written uncompressed by TF, one payload byte flipped, then gzipped: the stream
    # decompresses cleanly and the record's CRC catches the flip.
    import gzip

    plain = _write(tf, tmp_path / "plain.bin")
    data = bytearray(plain.read_bytes())
    data[20] ^= 0xFF  # inside record 0's payload
    plain.unlink()
    (tmp_path / "data.tfrecord").write_bytes(gzip.compress(bytes(data)))
    report = rk.verify(tmp_path)
    assert not report.ok
    message = report.problems[0].message
    assert message.startswith("payload CRC mismatch") and message.endswith("(GZIP stream)")
    assert report.problems[0].record == 0


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_convert_makes_an_indexed_copy(tf: ModuleType, tmp_path: Path, kind: str):
    src = tmp_path / "src"
    src.mkdir()
    _write(tf, src / "data.tfrecord", kind)
    dst = tmp_path / "dst"
    assert main(["convert", "--from", "tfrecord", str(src), str(dst)]) == 0
    ds = rk.Dataset(dst)
    _same(list(ds), _tf_values(tf, src / "data.tfrecord", kind))
    assert rk.verify(dst).ok


# ------------------------------------------------------- no side effects on foreign data


def _foreign(tf: ModuleType, root: Path) -> Path:
    root.mkdir()
    _write(tf, root / "train.tfrecord-00000-of-00002", n=25)
    _write(tf, root / "train.tfrecord-00001-of-00002", n=15)
    return root


def _listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir())


def test_reading_writes_nothing_beside_foreign_shards(tf: ModuleType, tmp_path: Path):
    root = _foreign(tf, tmp_path / "tfds")
    before = _listing(root)
    ds = rk.Dataset(root)
    theirs = _tf_values(tf, root / "train.tfrecord-00000-of-00002")
    theirs += _tf_values(tf, root / "train.tfrecord-00001-of-00002")
    _same(list(ds), theirs)
    _same([ds[i] for i in range(len(ds))], theirs)
    assert _listing(root) == before
    cached = sorted(Path(index_cache.cache_dir() or "").glob("*.idx"))
    assert len(cached) == 2 and all(p.suffix == ".idx" for p in cached)
    # The cached index is the one `recordkit index` would write.
    rk.build_index(root)
    beside = sorted(p.read_bytes() for p in root.glob("*.idx"))
    assert sorted(p.read_bytes() for p in cached) == beside


def test_torch_reader_writes_nothing_beside_foreign_shards(tf: ModuleType, tmp_path: Path):
    pytest.importorskip("torch")
    from recordkit.torch import RecordDataset

    root = _foreign(tf, tmp_path / "tfds")
    before = _listing(root)
    ids = sorted(int(s["id"]) for s in RecordDataset(root, batch_size=None))
    assert ids == sorted(list(range(25)) + list(range(15)))
    assert _listing(root) == before


def test_cached_index_is_validated_not_trusted(
    tf: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    root = _foreign(tf, tmp_path / "tfds")
    rk.Dataset(root)
    directory = Path(index_cache.cache_dir() or "")
    entries = sorted(directory.glob("*.idx"))
    for p in entries:  # a lying index: contiguous, but the wrong record sizes
        lines = p.read_text().splitlines()
        p.write_text("".join(f"{i * 16} 16\n" for i in range(len(lines))))
    with caplog.at_level("WARNING", logger="recordkit.reader.index.store"):
        ds = rk.Dataset(root)
    assert len(ds) == 40 and [int(ds[i]["id"]) for i in (0, 24, 25, 39)] == [0, 24, 0, 14]
    assert "dropping cached index" in caplog.text
    assert all(
        p.read_text().startswith("0 ") and not p.read_text().startswith("0 16\n")
        for p in directory.glob("*.idx")
    )


def test_cache_key_follows_size_and_mtime(tf: ModuleType, tmp_path: Path):
    root = _foreign(tf, tmp_path / "tfds")
    rk.Dataset(root)
    directory = Path(index_cache.cache_dir() or "")
    first = {p.name for p in directory.glob("*.idx")}
    _write(tf, root / "train.tfrecord-00001-of-00002", n=7)  # rewritten in place
    assert len(rk.Dataset(root)) == 32
    assert len({p.name for p in directory.glob("*.idx")} - first) == 1


def test_cache_is_bounded(tf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = _foreign(tf, tmp_path / "tfds")
    directory = Path(index_cache.cache_dir() or "")
    rk.Dataset(root)
    sizes = {p.name: p.stat().st_size for p in directory.glob("*.idx")}
    for p in directory.glob("*.idx"):
        p.unlink()
    # Room for the larger index alone: writing the second drops the first.
    monkeypatch.setenv(index_cache.ENV_INDEX_CACHE_BYTES, str(max(sizes.values())))
    rk.Dataset(root)
    left = [p.name for p in directory.glob("*.idx")]
    assert len(left) == 1 and sum(sizes[n] for n in left) <= max(sizes.values())


def test_cache_off_keeps_indexes_in_memory(
    tf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = _foreign(tf, tmp_path / "tfds")
    directory = Path(index_cache.cache_dir() or "")
    monkeypatch.setenv(index_cache.ENV_INDEX_CACHE, "off")
    before = _listing(root)
    assert len(rk.Dataset(root)) == 40
    assert _listing(root) == before
    assert not any(directory.iterdir())


def test_write_index_puts_it_beside_when_asked(tf: ModuleType, tmp_path: Path):
    root = _foreign(tf, tmp_path / "tfds")
    rk.Dataset(root, write_index=True)
    assert len(list(root.glob("*.idx"))) == 2


def test_verify_clean_unindexed_folder_exits_0_with_a_note(
    tf: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    root = _foreign(tf, tmp_path / "tfds")
    report = rk.verify(root)
    assert report.ok and report.records == 40
    assert [n.message.startswith("no index beside this shard") for n in report.notes] == [True] * 2
    assert main(["verify", str(root)]) == 0
    err = capsys.readouterr().err
    assert "note: " in err and "recordkit index" in err and ": OK" in err
    assert not list(root.glob("*.idx"))


# -------------------------------------------------- records whose features differ


def _write_varying(tf: ModuleType, path: Path, n: int = 60) -> Path:
    """Crawled-metadata style: 'v' int64 in even records and bytes in odd ones,
    'opt' only in every third, 'empty' an empty float list, 'unset' a Feature with no list."""
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(n):
            f = tf.train.Feature
            feature = {
                "id": f(int64_list=tf.train.Int64List(value=[i])),
                "v": f(int64_list=tf.train.Int64List(value=[i, -i]))
                if i % 2 == 0
                else f(bytes_list=tf.train.BytesList(value=[b"x" * i])),
                "empty": f(float_list=tf.train.FloatList(value=[])),
                "unset": f(),
            }
            if i % 3 == 0:
                feature["opt"] = f(float_list=tf.train.FloatList(value=[i / 4] * (i % 5)))
            ex = tf.train.Example(features=tf.train.Features(feature=feature))
            w.write(ex.SerializeToString())
    return path


def _tf_as_stored(tf: ModuleType, path: Path) -> list[dict[str, object]]:
    """TensorFlow's own protobuf, each feature as it is stored."""
    out = []
    for raw in tf.data.TFRecordDataset(str(path)):
        ex = tf.train.Example.FromString(raw.numpy())
        record: dict[str, object] = {}
        for name, feature in ex.features.feature.items():
            kind = feature.WhichOneof("kind")
            record[name] = (kind, list(getattr(feature, kind).value) if kind else [])
        out.append(record)
    return out


def test_raw_reading_returns_each_record_as_stored(tf: ModuleType, tmp_path: Path):
    path = _write_varying(tf, tmp_path / "meta.tfrecord")
    ds = rk.Dataset(path, raw=True)
    assert ds.schema is None
    theirs = _tf_as_stored(tf, path)
    ours = list(ds)
    assert len(ours) == len(theirs) == 60
    dtypes = {"int64_list": np.int64, "float_list": np.float32}
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        for name, (kind, values) in b.items():  # type: ignore[misc]
            if kind == "bytes_list":
                assert a[name] == values
            elif kind is None:
                assert a[name] == []
            else:
                assert a[name].dtype == dtypes[kind] and a[name].ndim == 1
                np.testing.assert_array_equal(a[name], np.asarray(values, dtypes[kind]))
    assert ours[0]["empty"].dtype == np.float32 and ours[0]["empty"].shape == (0,)
    assert ds[7]["v"] == [b"x" * 7] and list(ds[8]["v"]) == [8, -8]
    with pytest.raises(ValueError, match="not both"):
        rk.Dataset(path, rk.Schema(id=rk.Int64()), raw=True)


def test_inference_reports_a_conflict_whole(tf: ModuleType, tmp_path: Path):
    path = _write_varying(tf, tmp_path / "meta.tfrecord")
    with pytest.raises(rk.errors.SchemaError) as info:
        rk.Dataset(path)
    offset = len(_tf_payload(tf, path, 0)) + 16  # record 1, the first bytes 'v'
    assert str(info.value) == (
        f"feature 'v' is int64 in 30 records and bytes in 30 (first: {path}:{offset}:1); "
        "read it raw (rk.Dataset(path, raw=True)), or pass a schema"
    )


def _tf_payload(tf: ModuleType, path: Path, i: int) -> bytes:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))][i]


def _only_int_v(tf: ModuleType, tmp_path: Path) -> tuple[Path, list[bytes]]:
    """The varying records whose 'v' is int64: 'opt' (0 to 4 floats) in 10 of 30."""
    path = _write_varying(tf, tmp_path / "meta.tfrecord")
    folder = tmp_path / "nov"
    folder.mkdir()
    payloads = [r.numpy() for r in tf.data.TFRecordDataset(str(path))][::2]
    with tf.io.TFRecordWriter(str(folder / "a.tfrecord")) as w:
        for payload in payloads:
            w.write(payload)
    return folder, payloads


def _opt_values(tf: ModuleType, payloads: list[bytes]) -> list[list[float]]:
    out = []
    for payload in payloads:
        feature = tf.train.Example.FromString(payload).features.feature
        out.append(list(feature["opt"].float_list.value) if "opt" in feature else [])
    return out


def test_a_key_some_records_lack_is_inferred_optional_and_batches(
    tf: ModuleType, tmp_path: Path, caplog
):
    folder, payloads = _only_int_v(tf, tmp_path)
    want = _opt_values(tf, payloads)
    assert sum(1 for v in want if v) < 10 < len(want)  # some present with no values, too
    with caplog.at_level(logging.INFO, logger="recordkit"):
        ds = rk.Dataset(folder)
    assert ds.schema["opt"] == rk.Float32((None,), default=[])
    assert re.search(
        r"feature 'opt' is in 10 of 30 records \(first without it: .*a\.tfrecord:\d+:1\): "
        r"Float32\(\(None,\), default=\[\]\)",
        caplog.text,
    )
    assert [s["opt"].tolist() for s in ds] == want
    from recordkit.torch import RecordDataset

    got: dict[int, list[float]] = {}
    for batch in RecordDataset(folder, batch_size=8, shuffle=True, seed=1):
        lengths = batch["opt/lengths"].tolist()
        assert batch["opt"].shape[1] == max(lengths)
        for row, i in enumerate(batch["id"].tolist()):
            got[i] = batch["opt"][row, : lengths[row]].tolist()
    assert [got[2 * k] for k in range(30)] == want  # each record once, value for value
    import recordkit.tf as rtf

    ragged = [b["opt"] for b in rtf.dataset(folder, batch_size=8)]
    assert [row for r in ragged for row in r.to_list()] == want


def test_convert_keeps_a_key_some_records_lack(tf: ModuleType, tmp_path: Path, capsys):
    folder, payloads = _only_int_v(tf, tmp_path)
    code = main(["convert", "--from", "tfrecord", str(folder), str(tmp_path / "dst")])
    assert code == 0
    err = capsys.readouterr().err
    assert "feature 'opt' is in 10 of 30 records" in err
    out = rk.Dataset(tmp_path / "dst")
    assert out.schema["opt"] == rk.Float32((None,), default=[])
    assert [s["opt"].tolist() for s in out] == _opt_values(tf, payloads)


def test_convert_stops_with_the_whole_conflict(tf: ModuleType, tmp_path: Path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _write_varying(tf, src / "meta.tfrecord")
    code = main(["convert", "--from", "tfrecord", str(src), str(tmp_path / "dst")])
    assert code != 0
    err = capsys.readouterr().err
    assert "feature 'v' is int64 in 30 records and bytes in 30" in err
    assert f"{src / 'meta.tfrecord'}:" in err


# ------------------------------------------------------------------ SequenceExamples


def _write_sequences(tf: ModuleType, path: Path, n: int = 6) -> Path:
    """Per-step ragged lists: 'tokens' int64 steps of 1..3 values (one empty step in
    record 4), 'words' bytes steps, 'scores' float steps; the context holds 'id'."""
    f = tf.train.Feature
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(n):
            ctx = tf.train.Features(feature={"id": f(int64_list=tf.train.Int64List(value=[i]))})
            tokens = [
                f(int64_list=tf.train.Int64List(value=[] if i == 4 and s == 0 else range(s + 1)))
                for s in range(i % 3 + 1)
            ]
            words = [f(bytes_list=tf.train.BytesList(value=[b"w%d" % s] * s)) for s in range(i)]
            scores = [f(float_list=tf.train.FloatList(value=[i / 8, -s])) for s in range(2)]
            lists = tf.train.FeatureLists(
                feature_list={
                    "tokens": tf.train.FeatureList(feature=tokens),
                    "words": tf.train.FeatureList(feature=words),
                    "scores": tf.train.FeatureList(feature=scores),
                }
            )
            w.write(tf.train.SequenceExample(context=ctx, feature_lists=lists).SerializeToString())
    return path


def _tf_value(feature: object) -> tuple[str | None, list[object]]:
    kind = feature.WhichOneof("kind")  # type: ignore[attr-defined]
    return kind, list(getattr(feature, kind).value) if kind else []


def _same_as_stored(ours: object, kind: str | None, values: list[object]) -> None:
    if kind == "bytes_list" or kind is None:
        assert ours == values
    else:
        dtype = np.int64 if kind == "int64_list" else np.float32
        assert isinstance(ours, np.ndarray) and ours.dtype == dtype and ours.ndim == 1
        np.testing.assert_array_equal(ours, np.asarray(values, dtype))


def test_sequence_example_read_whole(tf: ModuleType, tmp_path: Path):
    path = _write_sequences(tf, tmp_path / "seq.tfrecord")
    ours = list(rk.Dataset(path, sequence_example=True))
    theirs = [
        tf.train.SequenceExample.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))
    ]
    assert len(ours) == len(theirs) == 6
    for a, b in zip(ours, theirs, strict=True):
        assert set(a["context"]) == set(b.context.feature)
        for name, feature in b.context.feature.items():
            _same_as_stored(a["context"][name], *_tf_value(feature))
        assert set(a["feature_lists"]) == set(b.feature_lists.feature_list)
        for name, flist in b.feature_lists.feature_list.items():
            assert len(a["feature_lists"][name]) == len(flist.feature)
            for step, feature in zip(a["feature_lists"][name], flist.feature, strict=True):
                _same_as_stored(step, *_tf_value(feature))
    assert ours[4]["feature_lists"]["tokens"][0].shape == (0,)  # an empty step, kept
    # TensorFlow's own parser agrees on the ragged steps too.
    _, lists = tf.io.parse_single_sequence_example(
        _tf_payload(tf, path, 5), sequence_features={"tokens": tf.io.RaggedFeature(tf.int64)}
    )
    assert [s.tolist() for s in ours[5]["feature_lists"]["tokens"]] == lists["tokens"].to_list()
    with pytest.raises(ValueError, match="not both"):
        rk.Dataset(path, rk.Schema(id=rk.Int64()), sequence_example=True)


def test_sequence_example_is_refused_never_read_in_part(tf: ModuleType, tmp_path: Path):
    path = _write_sequences(tf, tmp_path / "seq.tfrecord")
    with pytest.raises(
        rk.errors.SequenceExampleError, match=rf"{path}:0:0: payload is a tf.train.SequenceExample"
    ):
        rk.Dataset(path)
    ds = rk.Dataset(path, rk.Schema(id=rk.Int64()))  # a schema of its context alone
    with pytest.raises(
        rk.errors.SequenceExampleError,
        match=r"feature list; read it whole with rk.Dataset\(path, sequence_example=True\)",
    ):
        ds[0]
    with pytest.raises(rk.errors.SequenceExampleError):
        rk.Dataset(path, raw=True)[3]
    report = rk.verify(path, schema=rk.Schema(id=rk.Int64()))
    assert len(report.problems) == 6
    assert all("SequenceExample" in p.message for p in report.problems)


def test_sequence_example_batch_path_refuses(tf: ModuleType, tmp_path: Path):
    pytest.importorskip("torch")
    from recordkit.torch import RecordDataset

    path = _write_sequences(tf, tmp_path / "seq.tfrecord")
    ds = RecordDataset(path, schema=rk.Schema(id=rk.Int64()), batch_size=3)
    with pytest.raises(rk.errors.SequenceExampleError, match="SequenceExample"):
        next(iter(ds))


def _sequence_equal(a: dict, b: dict) -> None:
    """Two whole SequenceExample samples (tensors or arrays) hold the same values."""
    assert set(a) == {"context", "feature_lists"} and a.keys() == b.keys()
    for part in ("context", "feature_lists"):
        assert a[part].keys() == b[part].keys()
        for name in a[part]:
            x, y = a[part][name], b[part][name]
            if part == "context":
                x, y = [x], [y]
            assert len(x) == len(y)
            for u, v in zip(x, y):
                u = u.numpy() if hasattr(u, "numpy") else u
                if isinstance(v, list):
                    assert u == v
                else:
                    assert u.dtype == v.dtype
                    np.testing.assert_array_equal(u, v)


def test_sequence_example_record_dataset(tf: ModuleType, tmp_path: Path):
    pytest.importorskip("torch")
    from recordkit.torch import RecordDataset

    path = _write_sequences(tf, tmp_path / "seq.tfrecord", n=11)
    reference = list(rk.Dataset(path, sequence_example=True))  # checked against TF above
    samples = list(RecordDataset(path, options=ReadOptions(sequence_example=True, num_threads=2)))
    assert len(samples) == 11
    for a, b in zip(samples, reference):
        _sequence_equal(a, b)
    batches = list(
        RecordDataset(path, batch_size=4, options=ReadOptions(sequence_example=True, num_threads=2))
    )
    assert [len(b) for b in batches] == [4, 4, 3]
    for a, b in zip([s for batch in batches for s in batch], reference):
        _sequence_equal(a, b)
    # A transform, on threads too, runs with each batch's records known (what
    # DecodeImages names when an image does not decode): record i holds id i.
    from recordkit._origins import current

    def records(batch):
        origins = current()
        assert origins is not None and len(origins) == len(batch)
        return [(origins.locate(j)[2], int(s["context"]["id"][0])) for j, s in enumerate(batch)]

    located = RecordDataset(
        path,
        batch_size=4,
        transform=records,
        options=ReadOptions(sequence_example=True, transform_threads=2),
    )
    assert [pair for batch in located for pair in batch] == [(i, i) for i in range(11)]
    ranged = RecordDataset(
        path, records="[3:8]", shuffle=True, options=ReadOptions(sequence_example=True)
    )
    assert sorted(int(s["context"]["id"][0]) for s in ranged) == list(range(3, 8))
    shuffled = list(
        RecordDataset(path, shuffle=True, seed=3, options=ReadOptions(sequence_example=True))
    )
    ids = sorted(int(s["context"]["id"][0]) for s in shuffled)
    assert ids == list(range(11))
    with pytest.raises(ValueError, match="no schema, columns"):
        RecordDataset(
            path, schema=rk.Schema(id=rk.Int64()), options=ReadOptions(sequence_example=True)
        )
    # A record that does not decode is a bad record: named, or skipped with on_error.
    from recordkit.format import frame

    with open(path, "ab") as f:
        f.write(frame(b"\x12\xff"))  # feature_lists whose length runs past the payload
    with pytest.raises(rk.errors.CorruptRecordError, match=rf"{path}:\d+:11: malformed"):
        list(RecordDataset(path, options=ReadOptions(sequence_example=True)))
    kept = list(RecordDataset(path, options=ReadOptions(sequence_example=True, on_error="skip")))
    assert len(kept) == 11
    # A corrupt frame is named when the index is rebuilt (not a BufferError).
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(rk.errors.CorruptRecordError, match=rf"{path}:0:0: "):
        RecordDataset(path, options=ReadOptions(sequence_example=True))


def test_sequence_example_tf_dataset(tf: ModuleType, tmp_path: Path):
    from recordkit import tf as rktf

    path = _write_sequences(tf, tmp_path / "seq.tfrecord", n=7)
    reference = list(rk.Dataset(path, sequence_example=True))
    ours = list(rktf.dataset(path, options=ReadOptions(sequence_example=True)))
    assert len(ours) == 7
    for a, b in zip(ours, reference):
        assert a["context"]["id"].numpy().tolist() == b["context"]["id"].tolist()
        for name, steps in b["feature_lists"].items():
            got = a["feature_lists"][name].to_list()
            want = [s if isinstance(s, list) else s.tolist() for s in steps]
            if name == "scores":
                np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want))
            else:
                assert got == want, name
        assert set(a["feature_lists"]) <= set(b["feature_lists"]) | {"words"}
    (batch,) = list(rktf.dataset(path, batch_size=7, options=ReadOptions(sequence_example=True)))
    assert batch["feature_lists"]["tokens"].shape[0] == 7
    # A feature the leading records lack fails the pipeline by name, never dropped.
    extra = tmp_path / "extra"
    extra.mkdir()
    _write_sequences(tf, extra / "a.tfrecord", n=2)
    f = tf.train.Feature
    ctx = tf.train.Features(feature={"late": f(bytes_list=tf.train.BytesList(value=[b"x"]))})
    with tf.io.TFRecordWriter(str(extra / "b.tfrecord")) as w:
        w.write(tf.train.SequenceExample(context=ctx).SerializeToString())
    with pytest.raises(tf.errors.OpError, match="context feature 'late' as bytes"):
        list(rktf.dataset(extra, options=ReadOptions(sequence_example=True)))


def test_convert_told_examples_refuses_sequence_examples(tf: ModuleType, tmp_path: Path, capsys):
    # Converting them whole (detected, or told) is tests/compat/test_sequence_convert.py's.
    src = tmp_path / "src"
    src.mkdir()
    _write_sequences(tf, src / "seq.tfrecord")
    argv = ["convert", "--from", "tfrecord", str(src), str(tmp_path / "dst")]
    assert main([*argv, "-o", "sequence_example=false"]) != 0
    err = capsys.readouterr().err
    assert f"{src / 'seq.tfrecord'}:0:0: a tf.train.SequenceExample" in err
    assert "mixed input is refused" in err and "sequence_example=False" in err
    assert not (tmp_path / "dst" / "recordkit.json").exists()


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_stream_reader_names_a_compressed_file(tf: ModuleType, tmp_path: Path, kind: str):
    from recordkit.format import open_stream, read_stream, sniff_compression

    path = _write(tf, tmp_path / "data.tfrecord", kind)
    with open(path, "rb") as f, pytest.raises(CompressedTFRecordError, match=f"{kind}-compressed"):
        next(read_stream(f, path=str(path)))
    empty = _write(tf, tmp_path / "empty.tfrecord", kind, n=0)  # 8 bytes for ZLIB
    with open(empty, "rb") as f, pytest.raises(CompressedTFRecordError):
        next(read_stream(f, path=str(empty)))
    with pytest.raises(CompressedTFRecordError):
        rk.Dataset(empty)
    with open(path, "rb") as f:
        head = f.read(12)
        f.seek(0)
        payloads = list(read_stream(open_stream(f, sniff_compression(head)), path=str(path)))
    assert payloads == [
        r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=kind)
    ]


def test_recordkit_tf_names_a_compressed_file(tf: ModuleType, tmp_path: Path):
    import recordkit.tf

    _write(tf, tmp_path / "data.tfrecord", "GZIP")
    with pytest.raises(CompressedTFRecordError, match="GZIP-compressed TFRecord"):
        recordkit.tf.dataset(tmp_path, batch_size=4)


def test_cache_lists_its_directory_once_per_process(
    tf: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # 100k foreign shards must not cost a directory listing per shard.
    root = _foreign(tf, tmp_path / "tfds")
    for i in range(2, 12):
        _write(tf, root / f"train.tfrecord-{i:05d}-of-00012", n=3)
    listings = []
    real_scandir = os.scandir

    def counting_scandir(path):  # type: ignore[no-untyped-def]
        listings.append(os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(index_cache.os, "scandir", counting_scandir)
    assert len(rk.Dataset(root)) == 70
    assert [p for p in listings if p == index_cache.cache_dir()] == [index_cache.cache_dir()]
    assert len(list(Path(index_cache.cache_dir() or "").glob("*.idx"))) == 12


def test_head_shows_raw_and_sequence_records(
    tf: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    meta = _write_varying(tf, tmp_path / "meta.tfrecord")
    assert main(["head", "--raw", "-n", "2", str(meta)]) == 0
    out = capsys.readouterr().out
    assert "v: int64[2] [0, 0]" in out and "v: [bytes[1] b'x']" in out and "unset: []" in out
    seq = _write_sequences(tf, tmp_path / "seq.tfrecord")
    assert main(["head", "--sequence-example", "-n", "3", str(seq)]) == 0
    out = capsys.readouterr().out
    assert "context/id: int64[1] [2]" in out
    assert "feature_lists/tokens: [int64[1] [0], int64[2] [0, 1], int64[3] [0, 1, 2]]" in out
