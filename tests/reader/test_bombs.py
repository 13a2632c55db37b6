"""Decompression bombs: a 16 KB record whose zstd value inflates to 512 MiB.

Each reader reads the bomb in a subprocess whose address space is capped at
twice the record budget (256 MiB by default) above what it uses after imports,
with one malloc arena: a reader that allocated what the frame declares dies of
``MemoryError`` there, instead of taking the machine's memory.
"""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

import recordkit as rk
from recordkit.codec import DEFAULT_RECORD_BYTES, DecodeLimits, encode_example
from recordkit.errors import RecordTooLargeError
from recordkit.reader import ReadOptions

pytestmark = pytest.mark.timeout(120)

BOMB = 512 << 20
SCHEMA = rk.Schema(idx=rk.Int64(), x=rk.Tensor("uint8", (None,), "zstd"))
ROOT = Path(__file__).resolve().parents[2]


def _bomb(sized: bool) -> bytes:
    """One legal zstd frame (~16 KB) of 512 MiB of zeros; ``sized``: it declares so."""
    out = io.BytesIO()
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=sized)
    zeros = bytes(1 << 20)
    with cctx.stream_writer(out, size=BOMB if sized else -1, closefd=False) as w:
        for _ in range(BOMB // len(zeros)):
            w.write(zeros)
    return out.getvalue()


@pytest.fixture(scope="module", params=["sized", "unsized"])
def bomb_path(request, tmp_path_factory):
    """A dataset of 4 bomb records (a 64 KB shard), one good record first."""
    root = tmp_path_factory.mktemp(f"bomb-{request.param}") / "ds"
    frame = _bomb(request.param == "sized")
    assert len(frame) < 17_000
    with rk.Writer(root, SCHEMA) as w:
        w.write({"idx": 0, "x": np.arange(10, dtype=np.uint8)})
        for i in range(1, 5):
            w.write_encoded(encode_example({"idx": ("int64", [i]), "x": ("bytes", [frame])}))
    return root


_CHILD = """
import json, resource, sys
import recordkit as rk
from recordkit.errors import RecordTooLargeError
reader, path = sys.argv[1], sys.argv[2]
if reader in ("torch", "map"):
    from recordkit.torch import ReadOptions, RecordDataset, RecordMapDataset
elif reader == "tf":
    import tensorflow as tf
    import recordkit.tf
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 2 * int(sys.argv[3]), resource.RLIM_INFINITY))
try:
    if reader == "dataset":
        got = [s["x"].size for s in rk.Dataset(path)]
    elif reader == "torch":
        process = sys.argv[5] == "1"
        read = ReadOptions(num_threads=2, on_error=sys.argv[4], reader_process=process)
        ds = RecordDataset(path, batch_size=4, options=read)
        got = [len(b["idx"]) for b in ds]
    elif reader == "map":
        got = [len(RecordMapDataset(path).__getitems__([0, 1, 2, 3, 4]))]
    elif reader == "verify":
        report = rk.verify(path)
        got = [str(p) for p in report.problems]
    elif reader == "convert":
        schema = rk.Schema(idx=rk.Int64(), x=rk.Tensor("uint8", (None,), "zstd"))
        rk.convert(path, sys.argv[4], format="tfrecord", workers=0, schema=schema)
        got = []
    print(json.dumps(["ok", got]))
except (RecordTooLargeError, MemoryError) as exc:
    print(json.dumps([type(exc).__name__, str(exc)]))
except ExceptionGroup as group:  # convert: one per failed partition
    leaf = group
    while isinstance(leaf, ExceptionGroup):
        leaf = leaf.exceptions[0]
    print(json.dumps([type(leaf).__name__, str(leaf)]))
"""


def _run(*args):
    env = dict(os.environ, MALLOC_ARENA_MAX="1", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_dataset_refuses_the_bomb_before_allocating(bomb_path):
    kind, msg = _run("dataset", bomb_path, DEFAULT_RECORD_BYTES)
    assert kind == "RecordTooLargeError", msg
    assert "part-00000.tfrecord:" in msg and ":1: feature 'x'" in msg  # file:offset:record
    assert f"record_bytes={DEFAULT_RECORD_BYTES}" in msg


@pytest.mark.torch
@pytest.mark.parametrize("process", [0, 1], ids=["threads", "loader-process"])
def test_record_dataset_refuses_the_bomb_before_allocating(bomb_path, process):
    # The loader process inherits the address-space cap (a child of the capped one).
    pytest.importorskip("torch")
    kind, msg = _run("torch", bomb_path, DEFAULT_RECORD_BYTES, "raise", process)
    assert kind == "RecordTooLargeError", msg
    assert ".tfrecord:" in msg and "feature 'x'" in msg
    # skipped, the bombs leave the one good record
    assert _run("torch", bomb_path, DEFAULT_RECORD_BYTES, "skip", process) == ["ok", [1]]


@pytest.mark.torch
def test_record_map_dataset_refuses_the_bomb_before_allocating(bomb_path):
    pytest.importorskip("torch")
    kind, msg = _run("map", bomb_path, DEFAULT_RECORD_BYTES)
    assert kind == "RecordTooLargeError", msg
    assert "part-00000.tfrecord:" in msg and ":1: feature 'x'" in msg


def test_verify_reports_each_bomb(bomb_path):
    kind, problems = _run("verify", bomb_path, DEFAULT_RECORD_BYTES)
    assert kind == "ok"
    assert len(problems) == 4
    assert all("feature 'x'" in p and "record_bytes" in p for p in problems)


def test_convert_refuses_the_bomb_before_allocating(bomb_path, tmp_path):
    # A foreign TFRecord file (no manifest, no index) holding the bombs.
    src = tmp_path / "foreign"
    src.mkdir()
    (src / "bombs.tfrecord").write_bytes((bomb_path / "part-00000.tfrecord").read_bytes())
    kind, msg = _run("convert", src, DEFAULT_RECORD_BYTES, tmp_path / "out")
    assert kind == "RecordTooLargeError", msg
    assert "bombs.tfrecord:" in msg and ":1: feature 'x'" in msg


def test_limits_are_validated():
    with pytest.raises(ValueError, match="record_bytes must be an int >= 1"):
        DecodeLimits(record_bytes=0)
    with pytest.raises(ValueError, match="batch_bytes"):
        DecodeLimits(batch_bytes=1.5)
    with pytest.raises(TypeError, match="limits must be a DecodeLimits"):
        rk.Dataset(ROOT / "nowhere", limits=1 << 20)


def test_tiny_bomb_raises_with_sizes():
    frame = _bomb(True)
    payload = encode_example({"idx": ("int64", [1]), "x": ("bytes", [frame])})
    with pytest.raises(RecordTooLargeError, match=rf"declares {BOMB} decompressed bytes"):
        SCHEMA.decode(payload)


@pytest.mark.tf
def test_tf_dataset_refuses_the_bomb_before_allocating(bomb_path):
    # In this process (TensorFlow reserves too much address space to cap it), with
    # a 1 MiB limit, so an unsized bomb is stopped after about 1 MiB of output.
    tf = pytest.importorskip("tensorflow")
    rtf = pytest.importorskip("recordkit.tf")
    ds = rtf.dataset(
        bomb_path, batch_size=4, options=ReadOptions(limits=DecodeLimits(record_bytes=1 << 20))
    )
    with pytest.raises(
        tf.errors.OpError,
        match=r"RecordTooLargeError: .*feature 'x': zstd frame .*record_bytes=1048576",
    ):
        for _ in ds:
            pass
