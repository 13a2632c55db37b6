import random

import pytest

import recordkit as rk
from recordkit.cli import main

SCHEMA = rk.Schema(data=rk.Bytes(), label=rk.Int64(), vec=rk.Float32((4,)))


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "ds"
    rng = random.Random(0)
    with rk.Writer(root, SCHEMA, max_records=20) as w:
        for i in range(50):
            w.write({"data": rng.randbytes(rng.randrange(0, 200)), "label": i, "vec": [i] * 4})
    return root


def _data_files(root):
    return sorted(p for p in root.iterdir() if p.name.endswith((".tfrecord", ".idx")))


def test_clean_dataset_passes(corpus, capsys):
    report = rk.verify(corpus)
    assert report.ok, str(report)
    assert (report.shards, report.records) == (3, 50)
    assert main(["verify", str(corpus)]) == 0


def test_every_single_bit_flip_is_found(corpus):
    rng = random.Random(1234)
    files = _data_files(corpus)
    for trial in range(300):
        path = rng.choice(files)
        original = path.read_bytes()
        pos = rng.randrange(len(original))
        bit = rng.randrange(8)
        flipped = bytearray(original)
        flipped[pos] ^= 1 << bit
        path.write_bytes(bytes(flipped))
        try:
            report = rk.verify(corpus)
            assert not report.ok, f"trial {trial}: flip of bit {bit} at {path.name}:{pos} missed"
            assert any(p.path.endswith(path.name) for p in report.problems), report
        finally:
            path.write_bytes(original)
    assert rk.verify(corpus).ok


def test_every_truncation_is_found(corpus):
    rng = random.Random(99)
    files = _data_files(corpus)
    for trial in range(100):
        path = rng.choice(files)
        original = path.read_bytes()
        cut = rng.randrange(len(original))
        path.write_bytes(original[:cut])
        try:
            report = rk.verify(corpus)
            assert not report.ok, f"trial {trial}: truncation of {path.name} at {cut} missed"
        finally:
            path.write_bytes(original)


def test_bad_record_is_located_and_rest_still_checked(corpus, capsys):
    shard = corpus / "part-00001.tfrecord"
    offsets = [
        int(x.split()[0]) for x in (corpus / "part-00001.tfrecord.idx").read_text().split("\n") if x
    ]
    data = bytearray(shard.read_bytes())
    data[offsets[3] + 3] ^= 0x01  # length field of record 3
    data[offsets[10] + 13] ^= 0x01  # payload of record 10
    shard.write_bytes(bytes(data))
    report = rk.verify(corpus)
    where = {(p.offset, p.record) for p in report.problems if p.path == str(shard)}
    assert (offsets[3], 3) in where and (offsets[10], 10) in where
    assert main(["verify", str(corpus)]) == 1
    out = capsys.readouterr().out
    assert f"{shard}:{offsets[3]}:3: length CRC mismatch" in out
    assert f"{shard}:{offsets[10]}:10: payload CRC mismatch" in out


def test_missing_index_and_shard(corpus):
    (corpus / "part-00000.tfrecord.idx").unlink()
    (corpus / "part-00002.tfrecord").unlink()
    messages = [p.message for p in rk.verify(corpus).problems]
    assert any("index missing" in m for m in messages)
    assert any("missing" in m and "manifest" in m for m in messages)


def test_build_index_restores(corpus):
    idx = corpus / "part-00000.tfrecord.idx"
    original = idx.read_bytes()
    idx.unlink()
    written = rk.build_index(corpus)
    assert len(written) == 3
    assert idx.read_bytes() == original


@pytest.mark.parametrize("case", ["empty", "pngs", "above"])
def test_verify_fails_when_it_verified_nothing(tmp_path, case):
    """An empty folder, a folder of PNGs, the folder above a dataset: not "OK"."""
    import subprocess
    import sys

    root = tmp_path / "x"
    root.mkdir()
    if case == "pngs":
        for n in ("a.png", "b.png"):
            (root / n).write_bytes(b"\x89PNG\r\n\x1a\n")
    elif case == "above":
        with rk.Writer(root / "train", rk.Schema(i=rk.Int64())) as w:
            w.write({"i": 1})
    report = rk.verify(root)
    assert not report.ok and report.shards == 0
    assert "nothing to verify" in str(report)
    want = {"empty": "the folder is empty", "pngs": "a.png, b.png", "above": "one level down"}
    assert want[case] in str(report)
    run = subprocess.run([sys.executable, "-m", "recordkit", "verify", str(root)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1 and "nothing to verify" in run.stdout + run.stderr
    with rk.Writer(tmp_path / "none", rk.Schema(i=rk.Int64())):
        pass  # a dataset of no records is a dataset: nothing wrong with it
    assert rk.verify(tmp_path / "none").ok
