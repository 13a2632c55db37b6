"""Planning, determinism, resume after failures, and the errors a user meets."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.codec import parse_schema
from recordkit.conversion import ConvertOptions, make_plan, plan_conversion
from recordkit.converters import SourceError, SourceNotFoundError
from recordkit.errors import (
    CorruptRecordError,
    DatasetExistsError,
    DiskFullError,
    PartitionsFailedError,
    SchemaError,
)

from .cases import assert_samples_equal, imagefolder, numpy_npz, read_all


def tree(root: Path) -> dict[str, bytes]:
    """Every file below root (relative name -> bytes)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _rows(root: Path, files: int = 6, rows: int = 40) -> list[dict]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for f in range(files):
        with open(root / f"f{f:02d}.jsonl", "w") as fh:
            for i in range(rows):
                row = {"id": len(out), "text": "x" * (i % 17), "v": [i, f]}
                fh.write(json.dumps(row) + "\n")
                out.append(row)
    return out


def test_plan_is_pure_and_deterministic(tmp_path):
    _rows(tmp_path / "src")
    opts = ConvertOptions(shard_size="1KiB")
    _, plan = plan_conversion(tmp_path / "src", format="jsonl", options=opts)
    _, again = plan_conversion(tmp_path / "src", format="jsonl", options=opts)
    assert plan.fingerprint == again.fingerprint and plan == again
    assert len(plan.partitions) == 6  # each file is over 1 KiB: a partition each
    assert [p.items[0].key for p in plan.partitions] == [f"f{i:02d}.jsonl" for i in range(6)]
    items = [i for p in plan.partitions for i in p.items]
    regrouped = make_plan("jsonl", items, plan.schema, {}, ConvertOptions(shard_size="1MiB"))
    assert len(regrouped.partitions) == 1 and regrouped.fingerprint != plan.fingerprint
    assert plan.shard_prefix(3) == "part-00003" and plan.metadata["convert"]["from"] == "jsonl"


def test_workers_do_not_change_the_bytes(tmp_path):
    expected = _rows(tmp_path / "src")
    rk.convert(tmp_path / "src", tmp_path / "a", format="jsonl", workers=0, shard_size="2KiB")
    rk.convert(tmp_path / "src", tmp_path / "b", format="jsonl", workers=2, shard_size="2KiB")
    a = tree(tmp_path / "a")
    assert a == tree(tmp_path / "b")
    assert "part-00000-00000.tfrecord" in a and "part-00005-00000.tfrecord.idx" in a
    assert_samples_equal(read_all(tmp_path / "a"), expected)


def test_failed_partitions_are_reported_together_and_resume(tmp_path):
    expected = _rows(tmp_path / "src")
    rk.convert(tmp_path / "src", tmp_path / "ref", format="jsonl", workers=0, shard_size="2KiB")
    good = {n: (tmp_path / "src" / n).read_bytes() for n in ("f01.jsonl", "f04.jsonl")}
    times = {n: os.stat(tmp_path / "src" / n).st_mtime_ns for n in good}
    for name in good:
        with open(tmp_path / "src" / name, "r+b") as f:  # same size: the same partitions
            f.seek(100)
            f.write(b"\x00not json")
    schema = rk.Dataset(tmp_path / "ref").schema  # inference would read the bad rows first
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(
            tmp_path / "src",
            tmp_path / "out",
            format="jsonl",
            workers=2,
            shard_size="2KiB",
            schema=schema,
        )
    group = info.value
    assert isinstance(group, PartitionsFailedError) and len(group.exceptions) == 2
    notes = ["\n".join(e.__notes__) for e in group.exceptions]
    assert "partition 1 " in notes[0] and "f01.jsonl" in notes[0]
    assert "partition 4 " in notes[1] and "f04.jsonl" in notes[1]
    assert all(isinstance(e, SourceError) for e in group.exceptions)
    assert not (tmp_path / "out" / "recordkit.json").exists()
    markers = sorted(os.listdir(tmp_path / "out" / ".recordkit-convert"))
    done = [f"part-{i:05d}.done.json" for i in (0, 2, 3, 5)]
    assert markers == [*done, "plan.json", "source.json.zst"]
    for name, data in good.items():  # the files fixed: only their partitions are redone
        (tmp_path / "src" / name).write_bytes(data)
        os.utime(tmp_path / "src" / name, ns=(times[name], times[name]))  # as ref saw them
    result = rk.convert(
        tmp_path / "src", tmp_path / "out", format="jsonl", workers=0, shard_size="2KiB"
    )
    assert result.resumed == 4 and result.partitions == 6
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")
    assert_samples_equal(read_all(tmp_path / "out"), expected)
    again = rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", shard_size="2KiB")
    assert again.resumed == 6  # complete with the same plan: nothing to do
    assert tree(tmp_path / "out") == tree(tmp_path / "ref")


def test_existing_output_is_never_clobbered(tmp_path):
    _rows(tmp_path / "src", files=2)
    rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", workers=0)
    with pytest.raises(DatasetExistsError, match="different source or options"):
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", workers=0, shard_size="1KiB")
    with pytest.raises(DatasetExistsError):
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", workers=0, resume=False)
    rk.convert(
        tmp_path / "src",
        tmp_path / "out",
        format="jsonl",
        workers=0,
        shard_size="1KiB",
        overwrite=True,
    )
    assert len(rk.Dataset(tmp_path / "out").shards) > 2


def test_missing_source(tmp_path):
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        rk.convert(tmp_path / "nope", tmp_path / "out", format="jsonl", workers=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \.jsonl"):
        rk.convert(tmp_path / "empty", tmp_path / "out", format="jsonl", workers=0)
    with pytest.raises(ValueError, match="no converter named 'xml'"):
        rk.convert(tmp_path / "empty", tmp_path / "out", format="xml")


def test_bad_schema(tmp_path):
    _rows(tmp_path / "src", files=1)
    schema = rk.Schema(id=rk.Int64(), text=rk.Bytes(), other=rk.Float32())
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", schema=schema, workers=0)
    (err,) = info.value.exceptions
    assert isinstance(err, SchemaError) and "missing ['other']" in str(err)
    with pytest.raises(SchemaError, match="cannot parse"):
        parse_schema("id:int64,oops")
    with pytest.raises(SchemaError, match="dtype"):
        parse_schema("x:complex256[2]")


def test_parse_schema():
    spec = "id:int64, text:bytes, emb:float32[3], img:uint8[4,None,3], t:tensor:int64"
    schema = parse_schema(spec)
    assert schema == rk.Schema(
        id=rk.Int64(),
        text=rk.Bytes(),
        emb=rk.Float32((3,)),
        img=rk.Tensor("uint8", (4, None, 3)),
        t=rk.Tensor("int64", ()),
    )
    assert parse_schema(json.dumps(schema.to_json())) == schema
    assert parse_schema("tags:bytes[]") == rk.Schema(tags=rk.Bytes((None,)))


def test_full_disk_is_a_clear_error(tmp_path, monkeypatch):
    _rows(tmp_path / "src", files=2)

    def full(fd, buffers):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(tmp_path / "src", tmp_path / "out", format="jsonl", workers=0)
    assert all(isinstance(e, DiskFullError) for e in info.value.exceptions)
    assert "no space left" in str(info.value.exceptions[0])
    assert not [p for p in (tmp_path / "out").rglob("*") if ".tmp-" in p.name]


def test_compress_zstd(tmp_path):
    _, expected = numpy_npz(tmp_path)
    rk.convert(tmp_path, tmp_path / "out", format="numpy", compress="zstd", workers=0)
    ds = rk.Dataset(tmp_path / "out")
    assert ds.schema["image"].compression == "zstd"
    assert_samples_equal(list(ds), expected)


@pytest.mark.remote
def test_transient_http_errors_are_retried(tmp_path, http):
    _, expected = imagefolder(Path(http.root))
    http.fail_next(2, status=503, path_prefix="/dog/0")  # listing (HEAD) or image reads
    rk.convert(
        http.url + "/",
        tmp_path / "out",
        format="imagefolder",
        workers=0,
        options=ConvertOptions(retry_backoff=0.01),
    )
    assert_samples_equal(read_all(tmp_path / "out"), expected)
    assert sum(1 for r in http.requests if r[1].startswith("/dog/")) >= 5 + 2
    http.fail_next(100, status=404, path_prefix="/dog/0")  # not transient: no retries
    with pytest.raises((PartitionsFailedError, FileNotFoundError)):
        rk.convert(
            http.url + "/",
            tmp_path / "out2",
            format="imagefolder",
            workers=0,
            options=ConvertOptions(retry_backoff=0.01),
        )


def test_webdataset_refuses_path_traversal(tmp_path):
    (tmp_path / "src").mkdir()
    for bad in ("../evil.txt", "/etc/passwd.txt", "a/../../x.txt"):
        with tarfile.open(tmp_path / "src" / "s.tar", "w") as tar:
            for name in ("ok/0.txt", bad):
                info = tarfile.TarInfo(name)
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(PartitionsFailedError) as info:
            rk.convert(
                tmp_path / "src",
                tmp_path / "out",
                format="webdataset",
                workers=0,
                schema=rk.Schema(__key__=rk.Bytes(), txt=rk.Bytes()),
                overwrite=True,
            )
        (err,) = info.value.exceptions
        assert isinstance(err, SourceError) and "escapes the archive" in str(err), bad
    assert not list(tmp_path.rglob("evil*")) and not list(tmp_path.rglob("x.txt"))


@pytest.mark.parametrize("name", ["C:/evil.txt", "c:\\evil.txt"])
def test_a_member_named_from_a_windows_drive_is_refused(name: str) -> None:
    from recordkit.converters.base import check_member_name

    assert check_member_name("s.tar", "C-drive/ok.txt") == "C-drive/ok.txt"
    with pytest.raises(SourceError, match="is absolute; refused"):
        check_member_name("s.tar", name)


def test_tfrecord_corruption_names_file_offset_record(tmp_path):
    from .cases import tfrecord

    tfrecord(tmp_path)
    victim = tmp_path / "data.tfrecord-00001-of-00003"
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF  # the last record's payload CRC
    victim.write_bytes(bytes(data))
    schema = rk.Schema(label=rk.Int64(), text=rk.Bytes(), emb=rk.Float32((2,)))
    with pytest.raises(PartitionsFailedError) as info:
        rk.convert(tmp_path, tmp_path / "out", format="tfrecord", workers=0, schema=schema)
    (err,) = info.value.exceptions
    assert isinstance(err, CorruptRecordError)
    assert err.path.endswith("data.tfrecord-00001-of-00003") and err.record == 4
    assert err.offset is not None and err.offset > 0


_PLUGIN = '''
from recordkit.converters import Item, Source
from recordkit import Int64, Schema


class CountSource(Source):
    """Counts to n (the source URL is ignored)."""

    name = "count"
    defaults = {"n": 10}

    def check_exists(self):
        pass

    def list_items(self):
        return [Item(f"range{i}", 8 * 5, (i * 5, i * 5 + 5)) for i in range(self.options["n"] // 5)]

    def infer_schema(self, items):
        return Schema(x=Int64())

    def samples(self, item, schema):
        for x in range(*item.ref):
            yield {"x": x}
'''


def test_third_party_converter_through_entry_points(tmp_path):
    site = tmp_path / "site"
    (site / "countplug").mkdir(parents=True)
    (site / "countplug" / "__init__.py").write_text(_PLUGIN)
    dist = site / "countplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: countplug\nVersion: 0.1\n")
    entry = "[recordkit.converters]\ncount = countplug:CountSource\n"
    (dist / "entry_points.txt").write_text(entry)
    code = (
        "import recordkit as rk\nfrom recordkit import converters\n"
        "assert 'count' in converters.available(), converters.available()\n"
        "r = rk.convert('unused', 'out', format='count', workers=1, source_options={'n': 20})\n"
        "print(r.records, [int(s['x']) for s in rk.Dataset('out')][-1])\n"
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["20", "19"]


def test_cli(tmp_path):
    expected = _rows(tmp_path / "src", files=3)
    script = str(Path(sys.executable).with_name("recordkit"))
    cmd = [
        script,
        "convert",
        str(tmp_path / "src"),
        str(tmp_path / "out"),
        "--from",
        "jsonl",
        "--schema",
        "id:int64,text:bytes,v:int64[2]",
        "--workers",
        "1",
        "--shard-size",
        "2KiB",
        "--log-interval",
        "0",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "converted 3 items" in out.stderr and "120 records" in out.stderr
    assert "items," in out.stderr and "ETA" in out.stderr  # log lines: stderr is not a tty
    assert_samples_equal(read_all(tmp_path / "out"), expected)
    bad = subprocess.run(
        [*cmd[:3], str(tmp_path / "out2"), "--from", "jsonl", "--schema", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "cannot parse 'x'" in bad.stderr
    (tmp_path / "src" / "f00.jsonl").write_text('{"id": 1, "text": "a", "v": [1, 2]}\n{oops\n')
    failed = subprocess.run(
        [*cmd[:3], str(tmp_path / "out3"), *cmd[4:8]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1
    assert "1 of 1 partitions failed" in failed.stderr and "f00.jsonl" in failed.stderr


def test_numpy_refuses_pickled_arrays(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError, match="pickle"):
        rk.convert(tmp_path / "o.npy", tmp_path / "out", format="numpy", workers=0)


def test_memory_urls_convert_in_process(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    expected = _rows(tmp_path / "src", files=2)
    fs = fsspec.filesystem("memory")
    fs.put(str(tmp_path / "src") + "/", "memory://convert-test/src/", recursive=True)
    try:
        result = rk.convert(
            "memory://convert-test/src", "memory://convert-test/out", format="jsonl", workers=2
        )
        assert result.records == len(expected)
        assert fs.exists("memory://convert-test/out/recordkit.json")
        assert fs.exists("memory://convert-test/out/part-00000-00000.tfrecord.idx")
        with pytest.raises(ValueError, match="Dask workers cannot see it"):
            rk.convert("memory://convert-test/src", tmp_path / "o", format="jsonl", engine="dask")
    finally:
        fs.rm("memory://convert-test", recursive=True)
