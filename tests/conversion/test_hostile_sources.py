"""Hostile source trees: symlinks out of the tree, non-images, broken third-party files.

Each is refused naming the source path (or, where asked, skipped with a warning),
never read silently or raised as another library's bare traceback.
"""

import gzip
import io
import logging
import os

import numpy as np
import pytest

import recordkit as rk
from recordkit.cli import main
from recordkit.converters import SourceError, get
from recordkit.errors import PartitionsFailedError

pytestmark = pytest.mark.timeout(120)


def _png(seed=0):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), seed, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def tree(tmp_path):
    """``src/cat/a.png`` and ``src/dog/b.png``, plus ``outside/`` beside ``src``."""
    pytest.importorskip("PIL")
    src = tmp_path / "src"
    for cls, seed in (("cat", 1), ("dog", 2)):
        (src / cls).mkdir(parents=True)
        (src / cls / f"{cls[0]}.png").write_bytes(_png(seed))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.png").write_bytes(_png(9))
    return src


def _convert(src, out, **source_options):
    return rk.convert(src, out, format="imagefolder", workers=0, source_options=source_options)


def _paths(out):
    return sorted(s["path"].decode() for s in rk.Dataset(out))


def test_file_symlink_out_of_the_tree_is_refused_by_name(tree, tmp_path):
    os.symlink("/etc/passwd", tree / "cat" / "pw.jpg")
    with pytest.raises(SourceError, match=r"'cat/pw\.jpg' is a symlink to '/etc/passwd'") as info:
        _convert(tree, tmp_path / "out")
    assert "follow_symlinks" in str(info.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.tfrecord"))


def test_directory_symlink_out_of_the_tree_needs_the_opt_in(tree, tmp_path):
    os.symlink(tmp_path / "outside", tree / "bird")
    with pytest.raises(SourceError, match=r"'bird' is a symlink to .*outside"):
        _convert(tree, tmp_path / "out")
    _convert(tree, tmp_path / "out", follow_symlinks=True)
    assert _paths(tmp_path / "out") == ["bird/secret.png", "cat/c.png", "dog/d.png"]


def test_cli_flag_follows_file_symlinks(tree, tmp_path, capsys):
    os.symlink(tmp_path / "outside" / "secret.png", tree / "cat" / "s.png")
    args = ["convert", str(tree), str(tmp_path / "out"), "--from", "imagefolder", "--workers", "0"]
    assert main([*args, "--progress", "none"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "'cat/s.png' is a symlink to" in err and len(err.splitlines()) == 1
    assert main([*args, "--progress", "none", "--follow-symlinks"]) == 0
    assert _paths(tmp_path / "out") == ["cat/c.png", "cat/s.png", "dog/d.png"]


def test_symlinks_inside_the_tree_are_read(tree, tmp_path):
    os.symlink("../cat/c.png", tree / "dog" / "copy.png")
    os.symlink("cat", tree / "lion")
    _convert(tree, tmp_path / "out")
    assert _paths(tmp_path / "out") == ["cat/c.png", "dog/copy.png", "dog/d.png", "lion/c.png"]


def test_symlink_loop_is_refused(tree, tmp_path):
    os.symlink("..", tree / "cat" / "up")
    with pytest.raises(SourceError, match=r"'cat/up' links back to .*symlink loop"):
        _convert(tree, tmp_path / "out", follow_symlinks=True)


def test_fifo_in_the_tree_is_refused_without_blocking(tree, tmp_path):
    os.mkfifo(tree / "cat" / "x.jpg")
    with pytest.raises(SourceError, match=r"'cat/x\.jpg' is not a regular file"):
        _convert(tree, tmp_path / "out")


def test_link_swapped_after_planning_is_refused_when_read(tree, tmp_path):
    source = get("imagefolder")(str(tree))
    items = source.list_items()
    os.replace(tree / "cat" / "c.png", tmp_path / "c.png")
    os.symlink(tmp_path / "outside" / "secret.png", tree / "cat" / "c.png")
    (item,) = [i for i in items if i.ref[0] == "cat/c.png"]
    with pytest.raises(SourceError, match=r"'cat/c\.png' is a symlink to"):
        list(source.samples(item, source.resolve_schema(items)))


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"", "an empty file"), (b"hello, not a jpeg\n", "18 bytes starting b'hello, n'")],
)
def test_non_image_is_an_error_naming_the_file(tree, tmp_path, content, what):
    (tree / "cat" / "bad.jpg").write_bytes(content)
    with pytest.raises(PartitionsFailedError) as info:
        _convert(tree, tmp_path / "out")
    (err,) = info.value.exceptions
    assert isinstance(err, SourceError)
    assert str(err) == f"imagefolder: cat/bad.jpg: not an image ({what})"


def test_non_images_can_be_skipped_with_a_warning(tree, tmp_path, caplog):
    (tree / "cat" / "empty.jpg").write_bytes(b"")
    (tree / "dog" / "text.jpg").write_bytes(b"just text")
    with caplog.at_level(logging.WARNING, logger="recordkit.converters.imagefolder"):
        result = _convert(tree, tmp_path / "out", on_error="skip")
    assert (result.items, result.records) == (4, 2)
    assert "cat/empty.jpg: not an image" in caplog.text
    assert "dog/text.jpg: not an image" in caplog.text
    assert _paths(tmp_path / "out") == ["cat/c.png", "dog/d.png"]


def test_decode_check_catches_a_truncated_image(tree, tmp_path):
    (tree / "cat" / "cut.png").write_bytes(_png(3)[:40])  # the signature survives
    _convert(tree, tmp_path / "out")  # the header check passes it
    with pytest.raises(PartitionsFailedError) as info:
        _convert(tree, tmp_path / "out2", check="decode")
    (err,) = info.value.exceptions
    assert isinstance(err, SourceError)
    assert str(err).startswith("imagefolder: cat/cut.png: not a readable image (")


@pytest.mark.parametrize("options", [{"check": "full"}, {"on_error": "ignore"}])
def test_bad_imagefolder_options(tree, options):
    with pytest.raises(ValueError, match=next(iter(options))):
        get("imagefolder")(str(tree), **options)


def test_parquet_with_its_footer_cut_off_is_one_line_naming_the_file(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "src" / "ok.parquet")
    data = (tmp_path / "src" / "ok.parquet").read_bytes()
    (tmp_path / "src" / "cut.parquet").write_bytes(data[:-20])
    with pytest.raises(SourceError, match=r"^cut\.parquet: pyarrow ArrowInvalid: .*footer") as info:
        rk.convert(tmp_path / "src", tmp_path / "out", format="parquet", workers=0)
    assert "\n" not in str(info.value)
    assert isinstance(info.value.__cause__, pa.lib.ArrowInvalid)
    args = ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--from", "parquet"]
    assert main([*args, "--progress", "none"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("recordkit convert: error: cut.parquet: pyarrow ArrowInvalid:")


def test_csv_that_is_not_utf8_names_the_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.csv").write_bytes(b"x,y\n1,\xff\xfe\n")
    with pytest.raises(SourceError, match=r"^a\.csv: UnicodeDecodeError: 'utf-8' codec"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="csv", workers=0)


def test_truncated_gzip_jsonl_names_the_file(tmp_path):
    (tmp_path / "src").mkdir()
    data = gzip.compress(b"".join(b'{"x": %d}\n' % i for i in range(1000)))
    (tmp_path / "src" / "a.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match=r"^a\.jsonl\.gz: EOFError: Compressed file ended"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", workers=0)


def test_npz_that_is_not_a_zip_names_the_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(SourceError, match=r"^a\.npz: zipfile BadZipFile"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="numpy", workers=0)


def test_npy_whose_rows_exceed_the_record_limit_is_refused_unread(tmp_path):
    (tmp_path / "src").mkdir()
    with open(tmp_path / "src" / "x.npy", "wb") as f:
        header = {"descr": "<f4", "fortran_order": False, "shape": (2, 1 << 40)}
        np.lib.format.write_array_header_1_0(f, header)
    with pytest.raises(SourceError, match=r"x\.npy: rows of shape \(1099511627776,\)"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="numpy", workers=0)


def test_walk_does_not_block_on_a_fifo_named_like_data(tmp_path):
    # jsonl lists through the same walk: a FIFO would hang a reader for ever.
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "rows.jsonl")
    with pytest.raises(SourceError, match="not a regular file"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", workers=0)


def test_truncated_gzip_tfrecord_names_the_file(tmp_path):
    from recordkit.format import frame

    (tmp_path / "src").mkdir()
    data = gzip.compress(b"".join(frame(b"x" * 100) for _ in range(100)))
    (tmp_path / "src" / "a.tfrecord").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match=r"^a\.tfrecord: EOFError"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="tfrecord", workers=0)


def test_image_file_over_the_record_limit_is_refused_unread(tree, tmp_path):
    with open(tree / "cat" / "huge.jpg", "wb") as f:
        f.truncate(3 << 30)  # sparse: no disk, and reading it would take 3 GiB
    with pytest.raises(PartitionsFailedError) as info:
        _convert(tree, tmp_path / "out")
    (err,) = info.value.exceptions
    assert str(err).startswith("imagefolder: cat/huge.jpg: 3221225472 bytes, over the record limit")
