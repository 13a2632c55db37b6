"""The ``tfrecord`` PyPI package reads recordkit datasets with recordkit's index files.

The ``tfrecord`` package registers its own copy of ``example.proto`` in the default
protobuf pool and so cannot share a process with TensorFlow (``duplicate symbol
'tensorflow.BytesList'``). Everything that imports it runs in a subprocess here, and
answers as JSON on stdout.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import recordkit

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tfrecord") is None, reason="the tfrecord package is not installed"
)

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"

N_SAMPLES = 20
MAX_RECORDS = 7  # -> shards of 7, 7 and 6 records. The tfrecord package cannot read a
# one-record shard through an index (np.loadtxt gives a 1-d array), so every shard has 2+.

# Runs in the subprocess: argv[1] is JSON arguments, stdout is the JSON answer.
_PRELUDE = """
import json, sys
import numpy as np

def enc(value):
    if isinstance(value, bytes):
        return {"bytes": [value.hex()]}
    if hasattr(value, "numpy"):  # a torch tensor, after DataLoader collation
        value = value.numpy()
    if value.dtype.kind == "S":  # tfrecord's multi-value bytes lists
        return {"bytes": [bytes(v).hex() for v in value]}
    return {"dtype": value.dtype.str, "shape": list(value.shape), "hex": value.tobytes().hex()}

ARGS = json.loads(sys.argv[1])
"""


def _in_subprocess(body: str, args: Any) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _schema() -> recordkit.Schema:
    return recordkit.Schema(
        id=recordkit.Int64(),
        name=recordkit.Bytes(),
        tags=recordkit.Bytes(shape=(None,)),
        triple=recordkit.Int64(shape=(3,)),
        ints=recordkit.Int64(shape=(None,)),
        score=recordkit.Float32(),
        grid=recordkit.Float32(shape=(2, 3)),
        image=recordkit.Tensor(np.uint8, (4, 5, 3)),
        ragged=recordkit.Tensor(np.int32, (None, None)),
        packed=recordkit.Tensor(np.float32, (8, 8), compression="zstd"),
    )


# What the tfrecord package calls each feature's type (its ``description`` values).
DESCRIPTION = {
    "id": "int",
    "name": "byte",
    "tags": "byte",
    "triple": "int",
    "ints": "int",
    "score": "float",
    "grid": "float",
    "image": "byte",
    "ragged": "byte",
    "ragged/shape": "int",
    "packed": "byte",
}


def _sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(1000 + i)
    return {
        "id": i,
        "name": f"n{i}".encode() * (i % 3),
        # tfrecord returns a multi-value bytes list as a numpy "S" array, which drops
        # trailing NUL bytes; these values have none, so the comparison stays exact.
        "tags": [b"\x00t" + bytes([j]) * j + b"!" for j in range(i % 4)],
        "triple": np.array([i, -(2**63) + i, 2**63 - 1 - i], dtype=np.int64),
        "ints": rng.integers(-(2**62), 2**62, (i * 5) % 4, dtype=np.int64),
        "score": np.float32([1.25, np.nan, -0.0, np.inf][i % 4]),
        "grid": rng.standard_normal((2, 3)).astype(np.float32),
        "image": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        "ragged": rng.integers(-(2**31), 2**31, (i % 3 + 1, i % 4), dtype=np.int32),
        "packed": np.zeros((8, 8), np.float32) + np.float32(i),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("ours")
    samples = [_sample(i) for i in range(N_SAMPLES)]
    with recordkit.Writer(root, _schema(), max_records=MAX_RECORDS) as w:
        for sample in samples:
            w.write(sample)
    shards = [root / s.path for s in recordkit.Dataset(root).shards]
    assert len(shards) == 3
    return shards, samples


# ------------------------------------------------------------------------------ index bytes

_CREATE_INDEX = """
from tfrecord.tools.tfrecord2idx import create_index
for shard, out in ARGS:
    create_index(shard, out)
print(json.dumps("ok"))
"""


def _their_indexes(shards: list[Path], out_dir: Path) -> list[bytes]:
    outs = [out_dir / f"{shard.name}.theirs" for shard in shards]
    _in_subprocess(_CREATE_INDEX, [[str(s), str(o)] for s, o in zip(shards, outs, strict=True)])
    return [o.read_bytes() for o in outs]


def test_writer_index_identical_to_tfrecord2idx(
    written: tuple[list[Path], Any], tmp_path: Path
) -> None:
    shards, _ = written
    ours = [Path(recordkit.format.index_path(s)).read_bytes() for s in shards]
    assert ours == _their_indexes(shards, tmp_path)


def test_build_index_identical_to_tfrecord2idx_on_golden(tmp_path: Path) -> None:
    data = tmp_path / "golden"
    data.mkdir()
    shards = []
    for src in sorted(GOLDEN.glob("*.tfrecord")):
        shutil.copyfile(src, data / src.name)
        shards.append(data / src.name)
    recordkit.build_index(data)  # a directory: an index beside every shard
    ours = [Path(recordkit.format.index_path(s)).read_bytes() for s in shards]
    theirs = _their_indexes(shards, tmp_path)
    assert ours == theirs
    # edge.tfrecord holds a zero-length record: a 16-byte framed entry.
    assert b" 16\n" in theirs[[s.name for s in shards].index("edge.tfrecord")]

    # A single file path works as well.
    single = Path(recordkit.format.index_path(shards[0]))
    single.unlink()
    recordkit.build_index(shards[0])
    assert single.read_bytes() == theirs[0]


# ------------------------------------------------------------------------------ reading values


def _expected(sample: dict[str, Any]) -> dict[str, Any]:
    """A written sample in the encoded form of ``enc`` in the subprocess."""

    def arr(a: Any, dtype: Any) -> dict[str, Any]:
        a = np.asarray(a, dtype=dtype).reshape(-1)
        return {"dtype": a.dtype.str, "shape": list(a.shape), "hex": a.tobytes().hex()}

    out = {
        "id": arr(sample["id"], np.int64),
        "name": {"bytes": [sample["name"].hex()]},
        "tags": {"bytes": [t.hex() for t in sample["tags"]]},
        "triple": arr(sample["triple"], np.int64),
        "ints": arr(sample["ints"], np.int64),
        "score": arr(sample["score"], np.float32),
        "grid": arr(sample["grid"], np.float32),
        "image": {"bytes": [sample["image"].astype("<u1").tobytes().hex()]},
        "ragged": {"bytes": [sample["ragged"].astype("<i4").tobytes().hex()]},
        "ragged/shape": arr(sample["ragged"].shape, np.int64),
    }
    # The tfrecord package hands back the stored (compressed) bytes: compare what they
    # decompress to, since zstd output need not be byte-stable across library versions.
    out["packed"] = sample["packed"].astype("<f4").tobytes().hex()
    return out


def _normalise(row: dict[str, Any]) -> dict[str, Any]:
    import zstandard

    row = dict(row)
    (blob,) = row["packed"]["bytes"]
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(bytes.fromhex(blob))
    row["packed"] = raw.hex()
    return row


_LOADER = """
from tfrecord.reader import tfrecord_loader
out = []
for shard, index in ARGS["shards"]:
    rows = tfrecord_loader(shard, index, ARGS["description"], shard=(0, 1))
    out.append([{k: enc(v) for k, v in row.items()} for row in rows])
print(json.dumps(out))
"""


def test_tfrecord_loader_reads_our_shards(written: tuple[list[Path], list[Any]]) -> None:
    shards, samples = written
    args = {
        "shards": [[str(s), recordkit.format.index_path(s)] for s in shards],
        "description": DESCRIPTION,
    }
    per_shard = _in_subprocess(_LOADER, args)
    rows = [_normalise(row) for rows in per_shard for row in rows]
    assert [len(r) for r in per_shard] == [7, 7, 6]
    assert rows == [_expected(s) for s in samples]


_TORCH_DATASET = """
import numpy as np, torch
from tfrecord.torch.dataset import TFRecordDataset
np.random.seed(ARGS["seed"])
plain, workers = [], []
for shard, index in ARGS["shards"]:
    ds = TFRecordDataset(shard, index, ARGS["description"])
    # Without DataLoader workers it starts at a random indexed record and wraps around.
    plain.append([{k: enc(v) for k, v in row.items()} for row in ds])
    # With workers, each seeks to its part of the index: every record exactly once.
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    workers.append([{k: enc(v) for k, v in row.items()} for row in loader])
print(json.dumps({"plain": plain, "workers": workers}))
"""


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_tfrecord_torch_dataset_reads_our_shards(written: tuple[list[Path], list[Any]]) -> None:
    shards, samples = written
    args = {
        "shards": [[str(s), recordkit.format.index_path(s)] for s in shards],
        "description": DESCRIPTION,
        "seed": 1234,
    }
    got = _in_subprocess(_TORCH_DATASET, args)
    start = 0
    for shard_no, shard in enumerate(shards):
        want = [_expected(s) for s in samples[start : start + MAX_RECORDS]]
        start += len(want)
        plain = [_normalise(r) for r in got["plain"][shard_no]]
        # A rotation of the shard's records: the random start landed on a record boundary.
        assert len(plain) == len(want), shard
        k = want.index(plain[0])
        assert plain == want[k:] + want[:k], shard
        by_id = sorted(
            (_normalise(r) for r in got["workers"][shard_no]),
            key=lambda r: np.frombuffer(bytes.fromhex(r["id"]["hex"]), np.int64)[0],
        )
        assert by_id == want, shard
