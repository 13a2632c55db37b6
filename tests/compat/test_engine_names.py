"""Finding shards the way engines name them (issue 30): Beam's ``data-00000-of-00004``,
Ray's ``{uuid}_{task}.tar``, ``*.tfr``; globs and lists; compressed folders named as
such; and a folder with nothing to read says what it skipped."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import subprocess
import sys

import pytest

import recordkit as rk
from recordkit.codec import zstd_compress
from recordkit.errors import CompressedTFRecordError, ShardNotFoundError

NAMES = {
    "beam": "data-{k:05d}-of-00004",  # Apache Beam's WriteToTFRecord default
    "tfx": "data_tfrecord-{k:05d}-of-00004",
    "ray": "{u:032x}_{k:06d}.tar",  # this Ray's write_tfrecords
    "tfr": "shard{k}.tfr",
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    with rk.Writer(root / "src", rk.Schema(i=rk.Int64()), max_records=25) as w:
        for i in range(100):
            w.write({"i": i})
    return root, sorted(p for p in (root / "src").glob("*.tfrecord"))


def _folder(root, files, engine):
    folder = root / engine
    if not folder.exists():
        folder.mkdir()
        for k, f in enumerate(files):
            shutil.copy(f, folder / NAMES[engine].format(k=k, u=0xC0FFEE + k))
    return folder


@pytest.mark.parametrize("engine", sorted(NAMES))
def test_a_folder_of_an_engines_shards_is_read_whole(shards, engine):
    folder = _folder(*shards, engine)
    ds = rk.Dataset(folder)
    assert sorted(int(s["i"]) for s in ds) == list(range(100))
    assert rk.verify(folder).ok and rk.verify(folder).shards == 4
    assert sorted(os.listdir(folder)) == sorted(  # nothing written into their folder
        NAMES[engine].format(k=k, u=0xC0FFEE + k) for k in range(4)
    )


def test_globs_and_lists_of_files(shards):
    folder = _folder(*shards, "beam")
    assert len(rk.Dataset(str(folder / "data-*-of-*"))) == 100
    two = [folder / f"data-0000{k}-of-00004" for k in (0, 3)]
    assert sorted(int(s["i"]) for s in rk.Dataset(two)) == [*range(25), *range(75, 100)]
    report = rk.verify(str(folder / "data-0000[01]-of-*"))
    assert report.ok and report.shards == 2
    with pytest.raises(ShardNotFoundError, match="no file matches"):
        rk.Dataset(str(folder / "nothing-*"))


def test_a_folder_of_compressed_tfrecords_is_named_as_such(shards, tmp_path):
    _, files = shards
    for k, f in enumerate(files):
        with open(f, "rb") as src, gzip.open(tmp_path / f"part-{k}.tfrecord.gz", "wb") as dst:
            dst.write(src.read())
    with pytest.raises(CompressedTFRecordError, match="GZIP-compressed") as info:
        rk.Dataset(tmp_path)
    assert f"recordkit convert --from tfrecord {tmp_path} DEST" in str(info.value)


def test_a_folder_with_nothing_to_read_says_what_it_skipped(tmp_path):
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    (tmp_path / "notes.bin").write_bytes(b"zz")
    with pytest.raises(ShardNotFoundError) as info:
        rk.Dataset(tmp_path)
    message = str(info.value)
    assert "skipped 2 file(s)" in message and "a.png, notes.bin" in message
    assert repr(os.path.join(str(tmp_path), "*")) in message


def test_the_cli_reads_an_engines_folder(shards):
    folder = _folder(*shards, "ray")
    run = subprocess.run(
        [sys.executable, "-m", "recordkit", "info", str(folder)], capture_output=True, text=True
    )
    assert run.returncode == 0 and "100" in run.stdout, run.stderr


@pytest.mark.parametrize("engine", sorted(NAMES))
def test_convert_takes_every_folder_the_readers_read(shards, engine, tmp_path):
    folder = _folder(*shards, engine)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordkit",
            "convert",
            "--from",
            "tfrecord",
            str(folder),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert sorted(int(s["i"]) for s in rk.Dataset(tmp_path / "out")) == list(range(100))


def test_a_gzip_stream_of_records_is_found_by_its_content(shards, tmp_path):
    """Ray's write_tfrecords(arrow_open_stream_args={"compression": "gzip"}) names its
    GZIP files {uuid}_{task}.tar: found (by inflating their first bytes), named as
    compressed, verified and converted as streams; another gzip there is not taken."""
    _, files = shards
    folder = tmp_path / "ray-gzip"
    folder.mkdir()
    for k, f in enumerate(files):
        (folder / NAMES["ray"].format(k=k, u=0xC0FFEE + k)).write_bytes(
            gzip.compress(f.read_bytes())
        )
    (folder / "notes.tar").write_bytes(gzip.compress(b"not records, gzipped"))
    with pytest.raises(CompressedTFRecordError, match="GZIP-compressed") as info:
        rk.Dataset(folder)
    assert "4 compressed TFRecord file(s) there" in "".join(getattr(info.value, "__notes__", []))
    report = rk.verify(folder)
    assert report.ok and report.shards == 4 and report.records == 100
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordkit",
            "convert",
            "--from",
            "tfrecord",
            str(folder),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert sorted(int(s["i"]) for s in rk.Dataset(tmp_path / "out")) == list(range(100))


@pytest.mark.parametrize(
    ("compress", "named"),
    [(zstd_compress, "Zstandard"), (bz2.compress, "bzip2"), (lzma.compress, "XZ")],
)
def test_other_whole_file_compressions_are_named_not_called_corrupt(
    shards, tmp_path, compress, named
):
    """Beam's compression_type=ZSTD/BZIP2 (data-00000-of-00001), Ray's
    arrow_open_stream_args={"compression": "zstd"} ({uuid}_{task}.tar): by path, and in
    a folder where the sharded name makes it a shard by name."""
    _, files = shards
    for name in ("0123_000000.tar", "beam/data-00000-of-00001"):
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(compress(files[0].read_bytes()))
        with pytest.raises(ShardNotFoundError, match=f"looks like an? {named}-compressed file"):
            rk.Dataset(path)
    with pytest.raises(ShardNotFoundError, match=f"looks like an? {named}-compressed file"):
        rk.Dataset(tmp_path / "beam")
