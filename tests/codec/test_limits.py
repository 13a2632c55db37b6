"""DecodeLimits: the bytes a record, and a batch, may decompress to."""

import numpy as np
import pytest
import zstandard

import recordkit as rk
from recordkit.codec import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_RECORD_BYTES,
    DecodeLimits,
    encode_example,
    zstd_compress,
)
from recordkit.errors import CorruptRecordError, RecordTooLargeError
from recordkit.format.framing import frame
from recordkit.reader.decode import BatchDecoder

FIXED = rk.Schema(a=rk.Tensor("uint8", (4, 4), "zstd"), b=rk.Int64())
VARIABLE = rk.Schema(a=rk.Tensor("uint8", (4, 4), "zstd"), v=rk.Tensor("uint8", (None,), "zstd"))
TWO = rk.Schema(x=rk.Tensor("uint8", (None,), "zstd"), y=rk.Tensor("uint8", (None,), "zstd"))


def test_defaults_derive_from_the_schema():
    limits = DecodeLimits()
    assert limits.record_limit(FIXED) == 16  # exactly what fixed shapes decode to
    assert limits.batch_limit(FIXED, 10) == 160
    assert limits.record_limit(VARIABLE) == 16 + DEFAULT_RECORD_BYTES
    assert limits.batch_limit(VARIABLE, 10) == 160 + DEFAULT_BATCH_BYTES
    assert limits.record_limit(VARIABLE, ["a"]) == 16  # only the columns read count
    assert limits.record_limit(rk.Schema(b=rk.Bytes())) == 0
    set_ = DecodeLimits(record_bytes=5, batch_bytes=7)
    assert set_.record_limit(VARIABLE) == 5 and set_.batch_limit(VARIABLE, 10) == 7


def test_a_record_counts_all_its_values():
    payload = TWO.encode({"x": np.ones(600, np.uint8), "y": np.ones(600, np.uint8)})
    assert TWO.decode(payload, limits=DecodeLimits(record_bytes=1200))["y"].size == 600
    with pytest.raises(RecordTooLargeError) as info:
        TWO.decode(payload, limits=DecodeLimits(record_bytes=1000))
    msg = str(info.value)
    assert "feature 'y'" in msg and "declares 600 decompressed bytes" in msg
    assert "record_bytes=1000 (600 already used by this record)" in msg


def test_a_frame_without_a_size_is_stopped_near_the_limit():
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(1 << 20))
    payload = encode_example({"x": ("bytes", [unsized]), "y": ("bytes", [zstd_compress(b"")])})
    with pytest.raises(RecordTooLargeError, match="decompresses to more than the limit of 4096"):
        TWO.decode(payload, limits=DecodeLimits(record_bytes=4096))
    assert TWO.decode(payload, limits=DecodeLimits(record_bytes=1 << 20))["x"].size == 1 << 20


def test_a_wrong_size_for_a_fixed_shape_is_corruption_not_size():
    payload = encode_example({"a": ("bytes", [zstd_compress(bytes(17))]), "b": ("int64", [1])})
    with pytest.raises(
        CorruptRecordError, match="declares 17 decompressed bytes, expected 16"
    ) as e:
        FIXED.decode(payload)
    assert not isinstance(e.value, RecordTooLargeError)


def _batch(schema, samples):
    framed = [frame(schema.encode(s)) for s in samples]
    sizes = np.array([len(f) for f in framed], np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    return b"".join(framed), offsets, sizes


@pytest.mark.parametrize("also_list", [False, True], ids=["zstd-only", "with-list"])
def test_batch_limit_refuses_the_records_that_pass_it(also_list):
    schema = rk.Schema(
        v=rk.Tensor("uint8", (None,), "zstd"), **({"l": rk.Int64((None,))} if also_list else {})
    )
    samples = [
        {"v": np.full(1000, i, np.uint8), **({"l": [i]} if also_list else {})} for i in range(4)
    ]
    buf, offsets, sizes = _batch(schema, samples)
    dec = BatchDecoder(schema, limits=DecodeLimits(record_bytes=1000, batch_bytes=2500))
    batch = dec.decode(buf, offsets, sizes)
    assert batch.n == 2 and [v[0] for v in batch.columns["v"]] == [0, 1]
    assert [pos for pos, _ in batch.bad] == [2, 3]
    for _, err in batch.bad:
        assert isinstance(err, RecordTooLargeError)
        assert "batch_bytes=2500 (2000 already used by this batch)" in str(err)
    # each call has a budget of its own
    assert (
        BatchDecoder(schema, limits=DecodeLimits(batch_bytes=2000))
        .decode(buf, offsets[:2], sizes[:2])
        .n
        == 2
    )


def test_fixed_zstd_batches_fit_their_derived_limit():
    samples = [{"a": np.full((4, 4), i, np.uint8), "b": i} for i in range(64)]
    buf, offsets, sizes = _batch(FIXED, samples)
    batch = BatchDecoder(FIXED).decode(buf, offsets, sizes)
    assert batch.n == 64 and not batch.bad and batch.columns["a"][63, 0, 0] == 63
    small = BatchDecoder(FIXED, limits=DecodeLimits(batch_bytes=16 * 10)).decode(
        buf, offsets, sizes
    )
    assert small.n == 10 and len(small.bad) == 54


def test_readers_validate_limits(tmp_path):
    with rk.Writer(tmp_path / "ds", FIXED) as w:
        w.write({"a": np.zeros((4, 4), np.uint8), "b": 1})
    with pytest.raises(TypeError, match="limits must be a DecodeLimits"):
        BatchDecoder(FIXED, limits={"record_bytes": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limits must be a DecodeLimits"):
        rk.verify(tmp_path / "ds", limits=5)  # type: ignore[arg-type]
    report = rk.verify(tmp_path / "ds", limits=DecodeLimits(record_bytes=8))
    assert len(report.problems) == 1 and "record_bytes=8" in str(report.problems[0])
