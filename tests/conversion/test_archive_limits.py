"""Tar bombs: a member or an archive that declares far more than it holds is refused unread.

The bombs are converted in a subprocess whose address space is capped at 1 GiB
above what it uses after imports, so a regression shows as a ``MemoryError``
in that child, never as the machine running out of memory.
"""

import io
import json
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import pytest

import recordkit as rk
from recordkit.converters import SourceError
from recordkit.converters.webdataset import WebDatasetSource

pytestmark = pytest.mark.timeout(120)

_ZEROS = 16 << 20
_CHILD = """
import json, resource, sys
import recordkit as rk
from recordkit.errors import RecordkitError
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
src, dst, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    rk.convert(src, dst, format="webdataset", workers=0, source_options=options)
except (RecordkitError, MemoryError) as exc:
    print(type(exc).__name__, exc, sep=": ")
    sys.exit(3)
print("converted")
"""


def _sparse_tar(path: Path, name: str, declared: int) -> None:
    """A GNU sparse tar (~10 KB) whose one member declares ``declared`` bytes of holes.

    Python's tarfile reads sparse members but cannot write them, so the header
    is built by hand: type ``S``, one map entry (512 bytes at the end), and the
    real size in the GNU ``realsize`` field.
    """
    info = tarfile.TarInfo(name)
    info.size = 512  # the bytes stored: one block
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[156:157] = b"S"
    header[386:398] = b"%011o\0" % (declared - 512)  # sparse[0].offset
    header[398:410] = b"%011o\0" % 512  # sparse[0].numbytes
    header[483:495] = b"%011o\0" % declared  # realsize
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data = bytes(header) + b"x" * 512 + bytes(1024)
    path.write_bytes(data + bytes(-len(data) % tarfile.RECORDSIZE))


def _gzip_bomb(path: Path, name: str, declared: int) -> None:
    """A legal ``.tar.gz`` whose member really holds ``declared`` zero bytes (~1000:1).

    16 MiB of zeros deflated once and ended with a full flush is a self-contained
    piece of deflate stream, so a 3 GiB member costs one compression, not 3 GiB's.
    """
    assert declared % _ZEROS == 0
    info = tarfile.TarInfo(name)
    info.size = declared
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = bytes(_ZEROS)
    head = deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH)
    piece = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = deflate.compress(bytes(1024)) + deflate.flush(zlib.Z_FINISH)
    crc = zlib.crc32(header)
    for _ in range(declared // _ZEROS):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(bytes(1024), crc)
    total = len(header) + declared + 1024
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip header, no name, mtime 0
        f.write(head)
        for _ in range(declared // _ZEROS):
            f.write(piece)
        f.write(tail)
        f.write(
            (crc & 0xFFFFFFFF).to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little")
        )


def _convert_capped(tmp_path: Path, options: dict | None = None) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(tmp_path / "src"),
            str(tmp_path / "out"),
            json.dumps(options or {}),
        ],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=root,
        env={"PYTHONPATH": str(root), "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def src(tmp_path):
    (tmp_path / "src").mkdir()
    return tmp_path / "src"


def test_sparse_tar_member_over_the_record_limit_is_refused_unread(tmp_path, src):
    _sparse_tar(src / "bomb.tar", "x/0.bin", 4 << 30)
    assert (src / "bomb.tar").stat().st_size == 10240
    with tarfile.open(src / "bomb.tar") as tar:  # the header is what we claim it is
        (member,) = tar.getmembers()
        assert member.issparse() and member.size == 4 << 30
    done = _convert_capped(tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("SourceError: bomb.tar: member 'x/0.bin' declares 4294967296")
    assert "max_member_bytes" in done.stdout


def test_sparse_tar_within_the_member_limit_trips_the_ratio(tmp_path, src):
    _sparse_tar(src / "holes.tar", "x/0.bin", 256 << 20)
    done = _convert_capped(tmp_path)
    assert done.returncode == 3, done.stderr
    assert "SourceError: holes.tar: members up to 'x/0.bin' declare 268435456 bytes" in done.stdout
    assert "100 times the archive's 10240 bytes" in done.stdout


def test_gzip_bomb_over_the_record_limit_is_refused_unread(tmp_path, src):
    _gzip_bomb(src / "bomb.tar.gz", "x/0.bin", 3 << 30)
    assert (src / "bomb.tar.gz").stat().st_size < 4 << 20
    done = _convert_capped(tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("SourceError: bomb.tar.gz: member 'x/0.bin' declares 3221225472")


def test_gzip_bomb_within_the_member_limit_trips_the_ratio_unless_allowed(tmp_path, src):
    _gzip_bomb(src / "zeros.tar.gz", "x/0.bin", _ZEROS)
    done = _convert_capped(tmp_path)
    assert done.returncode == 3, done.stderr
    assert "SourceError: zeros.tar.gz: members up to 'x/0.bin' declare 16777216" in done.stdout
    # The archive is legal: raising the ratio converts it, whole and unchanged.
    done = _convert_capped(tmp_path, {"max_expansion": 2000})
    assert done.returncode == 0 and "converted" in done.stdout, done.stdout + done.stderr
    (sample,) = list(rk.Dataset(tmp_path / "out"))
    assert sample["bin"] == bytes(_ZEROS) and sample["__key__"] == b"x/0"


def test_member_limit_applies_to_plain_tars_in_writer_processes(src):
    with tarfile.open(src / "s.tar", "w") as tar:
        for name, data in (("a/0.txt", b"small"), ("a/1.txt", b"y" * 5000)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    source = WebDatasetSource(str(src), max_member_bytes=4096)
    (item,) = source.list_items()
    schema = rk.Schema(__key__=rk.Bytes(), txt=rk.Bytes())
    with pytest.raises(SourceError, match=r"s\.tar: member 'a/1\.txt' declares 5000 bytes"):
        list(source.samples(item, schema))
    source = WebDatasetSource(str(src), max_member_bytes=5000)
    assert [s["txt"] for s in source.samples(item, schema)] == [b"small", b"y" * 5000]


@pytest.mark.parametrize("options", [{"max_member_bytes": -1}, {"max_expansion": 0}])
def test_bad_limits_are_refused(src, options):
    with pytest.raises(ValueError, match="max_member_bytes must be >= 0"):
        WebDatasetSource(str(src), **options)
