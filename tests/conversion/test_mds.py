"""``--from mds``: MosaicML Streaming datasets, from golden files written by the real library.

``tests/data/make_mds.py`` wrote them with ``mosaicml-streaming``'s ``MDSWriter``
and stored what its own ``MDSReader`` reads back. The conformance suite
(``test_formats.py``) converts the compressed one locally, from S3 and over
HTTP; here: the uncompressed one, every image's pixels against the library's
decoding, and damaged or refused input, each named.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import recordkit as rk
from recordkit.converters.base import SourceError

from .cases import GOLDEN, assert_samples_equal, mds_expected, read_all

PIL = pytest.importorskip("PIL.Image")


@pytest.mark.parametrize("name", ["plain", "zstd"])
def test_every_value_as_the_library_read_it(name: str, tmp_path: Path) -> None:
    src = GOLDEN / "mds" / name
    result = rk.convert(src / "index.json", tmp_path / "out", format="mds", workers=0)
    got = read_all(tmp_path / "out")
    expected = mds_expected(src)
    assert result.records == len(got) == len(expected)
    assert_samples_equal(got, expected)
    schema = rk.Dataset(tmp_path / "out").schema
    assert schema["weight"] == rk.Tensor("float64", ()) and schema["num"] == rk.Bytes()
    assert schema["grid"] == rk.Tensor("int16", (None, None, None))
    # Images: the stored bytes decode to the pixels mosaicml-streaming's reader gave.
    with np.load(src / "expected.npz", allow_pickle=False) as npz:
        for i, sample in enumerate(got):
            for col in ("photo", "icon"):
                pixels = np.asarray(PIL.open(io.BytesIO(sample[col])))
                np.testing.assert_array_equal(pixels, npz[f"{i}/{col}"])
            assert len(sample["clips"]) == 1 + i % 2
            for k, clip in enumerate(sample["clips"]):
                np.testing.assert_array_equal(
                    np.asarray(PIL.open(io.BytesIO(clip))), npz[f"{i}/clips/{k}"]
                )
    assert rk.verify(tmp_path / "out").ok


def _copy(tmp_path: Path, name: str = "zstd") -> Path:
    dst = tmp_path / "src"
    shutil.copytree(GOLDEN / "mds" / name, dst)
    for f in dst.glob("expected.*"):
        f.unlink()
    return dst


def _index(src: Path) -> dict:
    return json.loads((src / "index.json").read_text())


def _convert(src: Path, tmp_path: Path, **options: object) -> None:
    rk.convert(src, tmp_path / "out", format="mds", workers=0, source_options=options or None)


def test_damaged_shards_are_named(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    shard = src / "shard.00002.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"shard.00002.mds.zstd: sha1 is .*, index.json says"):
        _convert(src, tmp_path)
    # Without hashes (mosaicml-streaming's default), a cut frame is still caught.
    index = _index(src)
    for s in index["shards"]:
        s["zip_data"]["hashes"] = {}
        s["raw_data"]["hashes"] = {}
    (src / "index.json").write_text(json.dumps(index))
    shard.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(SourceError, match=r"shard.00002.mds.zstd: (bad zstd data|decompresses)"):
        _convert(src, tmp_path / "again")


def test_plain_shard_cut_or_lying_is_named(tmp_path: Path) -> None:
    src = _copy(tmp_path, "plain")
    shard = src / "shard.00000.mds"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(SourceError, match=r"shard.00000.mds: \d+ bytes, index.json says"):
        _convert(src, tmp_path)
    index = _index(src)
    index["shards"][0]["raw_data"]["bytes"] = shard.stat().st_size
    index["shards"][0]["raw_data"]["hashes"] = {}
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="sample offsets do not tile the shard"):
        _convert(src, tmp_path / "again")


def test_limits_and_refusals(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    with pytest.raises(SourceError, match=r"over the limit of 1000 \(option max_shard_bytes\)"):
        _convert(src, tmp_path, max_shard_bytes=1000)
    index = _index(src)
    for s in index["shards"]:
        s["column_encodings"][s["column_names"].index("meta")] = "pkl"
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match=r"column 'meta': it is pickled \(pkl\): recordkit never"):
        _convert(src, tmp_path / "pkl")
    index["shards"][0]["raw_data"]["basename"] = "../outside.mds"
    (src / "index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="shard 0 is not an MDS shard entry"):
        _convert(src, tmp_path / "escape")
    (src / "index.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no index\.json"):
        _convert(src, tmp_path / "none")
