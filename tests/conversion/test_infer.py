"""``recordkit convert`` without ``--from``: the format told from the source's files, or
an error listing what was found (never a guess)."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest

import recordkit as rk
from recordkit.conversion import infer_format
from recordkit.errors import SourceNotFoundError

from .test_formats import NAMES, _make


@pytest.mark.parametrize("case", NAMES)
def test_every_format_is_told_from_its_files(case, tmp_path):
    fmt, src_rel, _ = _make(case, tmp_path / "src")
    (tmp_path / "src" / "README.md").write_text("about this data\n")  # no format claims it
    (tmp_path / "src" / ".DS_Store").write_bytes(b"\0\0")
    inferred = infer_format(str(tmp_path / "src" / src_rel))
    assert inferred.format == fmt
    assert inferred.files >= 1 and inferred.example


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("rows.jsonl", "jsonl"),
        ("rows.jsonl.gz", "jsonl"),
        ("table.csv", "csv"),
        ("table.parquet", "parquet"),
        ("arrays.npz", "numpy"),
        ("column.npy", "numpy"),
        ("shard.tar", "webdataset"),
        ("shard.tar.gz", "webdataset"),
        ("train.tfrecord", "tfrecord"),
        ("train.tfrecord-00001-of-00004", "tfrecord"),
        ("data.tfrecord.gz", "tfrecord"),
    ],
)
def test_one_file_is_told_from_its_name(name, fmt, tmp_path):
    (tmp_path / name).write_bytes(b"x")
    inferred = infer_format(str(tmp_path / name))
    assert (inferred.format, inferred.files, inferred.example) == (fmt, 1, name)
    assert str(inferred) == f"--from {fmt}, told from {name}"


def test_a_recordkit_dataset_reads_as_tfrecords_its_sidecars_aside(tmp_path):
    with rk.Writer(tmp_path / "ds", rk.Schema(x=rk.Int64()), max_records=2) as w:
        for i in range(5):
            w.write({"x": i})
    inferred = infer_format(str(tmp_path / "ds"))  # recordkit.json and .idx claim nothing
    assert (inferred.format, inferred.files) == ("tfrecord", 3)


def test_two_formats_is_an_error_naming_both(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "b.csv").write_text("x\n1\n")
    (tmp_path / "c.csv").write_text("x\n2\n")
    with pytest.raises(ValueError) as info:
        infer_format(str(tmp_path))
    message = str(info.value)
    assert "2 csv files (b.csv), 1 jsonl file (a.jsonl)" in message
    assert message.endswith("pass --from csv or --from jsonl")


def test_images_outside_class_folders_are_not_an_imagefolder(tmp_path):
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    with pytest.raises(ValueError, match=r"\(\.png\) \(images at the top: imagefolder needs"):
        infer_format(str(tmp_path))


def test_unknown_files_list_what_was_found(tmp_path):
    (tmp_path / "a.xyz").write_bytes(b"1")
    (tmp_path / "b.bin").write_bytes(b"1")
    with pytest.raises(ValueError, match=r"from its files \(\.bin, \.xyz\); pass --from FORMAT"):
        infer_format(str(tmp_path))


def test_a_missing_source(tmp_path):
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        infer_format(str(tmp_path / "nothing"))


def test_a_tar_of_samples_converts_without_from(tmp_path):
    """End to end through the command line: the format is said on stderr, then converted."""
    import io
    import subprocess
    import sys

    with tarfile.open(tmp_path / "samples.tar", "w") as tar:
        for i in range(4):
            for ext, data in (("cls", str(i).encode()), ("txt", f"t{i}".encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = subprocess.run(
        [sys.executable, "-m", "recordkit", "convert", "samples.tar", "out", "--workers", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "recordkit convert: --from webdataset, told from samples.tar" in out.stderr
    labels = [int(np.asarray(s["cls"])) for s in rk.Dataset(tmp_path / "out")]
    assert labels == [0, 1, 2, 3]


@pytest.mark.remote
def test_a_remote_source_is_told_from_its_listing(tmp_path, s3):
    pytest.importorskip("s3fs")
    fs = s3.filesystem()
    bucket = s3.bucket()
    fs.pipe(f"{bucket}/rows/part-0.parquet", b"x")
    fs.pipe(f"{bucket}/rows/part-1.parquet", b"x")
    fs.pipe(f"{bucket}/rows/_SUCCESS", b"")
    inferred = infer_format(f"{bucket}/rows", s3.storage_options)
    assert (inferred.format, inferred.files) == ("parquet", 2)


def test_a_subclass_of_a_converter_does_not_claim_its_files(tmp_path):
    """A plugin built on a built-in (registered under its own name) leaves inference as
    it was, unless it declares its own suffixes."""
    from recordkit import converters
    from recordkit.conversion import sources
    from recordkit.converters.jsonl import JsonlSource

    class Quiet(JsonlSource):
        name = "quiet-jsonl"

    class Loud(JsonlSource):
        name = "loud-jsonl"
        suffixes = (".jsonl",)

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    saved = dict(sources.registered)
    try:
        converters.register(Quiet.name, Quiet)
        assert infer_format(str(tmp_path / "a.jsonl")).format == "jsonl"
        converters.register(Loud.name, Loud)
        with pytest.raises(ValueError, match="pass --from jsonl or --from loud-jsonl"):
            infer_format(str(tmp_path / "a.jsonl"))
    finally:
        sources.registered.clear()
        sources.registered.update(saved)
