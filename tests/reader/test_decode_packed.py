"""Ragged numbers copied for the whole batch (``decode_run.packed``): whatever each record
holds, :meth:`BatchDecoder.decode` gives what ``Schema.decode`` gives record by record
(padded with lengths, or a list), and reports bad exactly the records it refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from recordkit.codec import Bytes, Float32, Int64, Schema, Tensor, encode_example
from recordkit.codec.wire import varint
from recordkit.errors import CorruptRecordError
from recordkit.format.framing import frame
from recordkit.reader import decode
from recordkit.reader.decode import BatchDecoder
from recordkit.reader.ragged import pad


def _varint(v: int) -> bytes:
    return varint(v & (1 << 64) - 1)  # two's complement, as protobuf writes int64


def _field(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _varint(len(body)) + body


def _two_chunks(name: str, first: list[int], second: list[int]) -> bytes:
    """An Example whose int64 list ``name`` is two packed runs (one value, merged)."""
    runs = _field(0x0A, b"".join(map(_varint, first))) + _field(
        0x0A, b"".join(map(_varint, second))
    )
    entry = _field(0x0A, name.encode()) + _field(0x12, _field(0x1A, runs))
    return _field(0x0A, _field(0x0A, entry))


SCHEMA = Schema(
    i=Int64(),
    il=Int64((None,)),
    i2=Int64((None, 2), default=[]),
    f3=Float32((None, 3)),
    t=Tensor("float16", (None, 2)),
    tb=Tensor("bool", (None,), default=[]),
)


def _payloads() -> list[bytes]:
    """Records of every kind: lists of 0 to 6 rows, NaNs and -0.0, varints of 1 to 10
    bytes; an absent defaulted feature, one with no list set; and records the batch copy
    leaves to the reference: a list in two chunks (merged), an absent required feature,
    a count the shape refuses, floats where int64s are, two tensor values."""
    rng = np.random.default_rng(3)
    out = []
    for k in range(40):
        m = k % 7
        rec: dict[str, tuple[str | None, Any]] = {
            "i": ("int64", [k]),
            "il": ("int64", [(-1) ** j * 11**j for j in range(m * 2)]),
            "i2": ("int64", list(range(2 * m))),
            "f3": ("float", np.array([np.nan, -0.0, k] * m, np.float32)),
            "t": ("bytes", [rng.standard_normal((m, 2)).astype(np.float16).tobytes()]),
            "tb": ("bytes", [rng.integers(0, 2, m).astype(bool).tobytes()]),
        }
        if k % 9 == 4:
            del rec["i2"], rec["tb"]  # defaulted: no rows
        if k % 11 == 6:
            rec["i2"] = (None, [])  # a Feature with no list set
        out.append(encode_example(rec))
    base = {k: v for k, v in encode_example_fields().items()}
    out[10] = encode_example({**base, "il": ("int64", [])}) + _two_chunks("il", [5, -1], [7])
    out[17] = encode_example({k: v for k, v in base.items() if k != "f3"})  # required: bad
    out[23] = encode_example({**base, "i2": ("int64", [1, 2, 3])})  # 3 for (None, 2): bad
    out[29] = encode_example({**base, "il": ("float", [1.0])})  # floats: bad
    out[31] = encode_example({**base, "t": ("bytes", [b"\0\0\0\0", b""])})  # two values: bad
    return out


def encode_example_fields() -> dict[str, tuple[str, Any]]:
    return {
        "i": ("int64", [99]),
        "il": ("int64", [1]),
        "i2": ("int64", [1, 2]),
        "f3": ("float", [1, 2, 3]),
        "t": ("bytes", [b"\0\0\0\0"]),
        "tb": ("bytes", [b"\1"]),
    }


def _batch(payloads: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    framed = [frame(p) for p in payloads]
    sizes = np.array([len(f) for f in framed], np.int64)
    return b"".join(framed), np.cumsum(sizes) - sizes, sizes


def _reference(payloads: list[bytes]) -> tuple[list[dict[str, Any]], list[int]]:
    good, bad = [], []
    for k, p in enumerate(payloads):
        try:
            good.append(SCHEMA.decode(p, copy=True))
        except CorruptRecordError:
            bad.append(k)
    return good, bad


@pytest.mark.parametrize("ragged_as", ["padded", "list"])
def test_batch_copies_give_what_each_record_decodes_to(ragged_as: str) -> None:
    payloads = _payloads()
    buf, offsets, sizes = _batch(payloads)
    dec = BatchDecoder(SCHEMA, ragged_as=ragged_as)  # type: ignore[arg-type]
    assert set(dec.packed) == {"il", "i2", "f3", "t", "tb"}
    got = dec.decode(buf, offsets, sizes)
    want, bad = _reference(payloads)
    assert [pos for pos, _ in got.bad] == bad == [17, 23, 29, 31]
    assert got.n == len(want)
    assert want[10]["il"].tolist() == [5, -1, 7]  # two chunks, merged
    for name in dec.packed:
        values = [r[name] for r in want]
        if ragged_as == "padded":
            ftype = SCHEMA[name]
            rows, lengths = pad(values, ftype.shape, values[0].dtype)
            assert got.columns[name].dtype == rows.dtype and got.columns[name].shape == rows.shape
            assert got.columns[name].tobytes() == rows.tobytes(), name  # NaNs, -0.0 bit for bit
            assert got.columns[name + "/lengths"].tolist() == lengths.tolist()
        else:
            for a, b in zip(got.columns[name], values, strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_a_batch_of_only_empty_lists_and_an_empty_batch() -> None:
    empty = encode_example(
        {"i": ("int64", [1]), "il": ("int64", []), "f3": ("float", []), "t": ("bytes", [b""])}
    )
    dec = BatchDecoder(SCHEMA, ragged_as="padded")
    buf, offsets, sizes = _batch([empty] * 3)
    got = dec.decode(buf, offsets, sizes)
    assert not got.bad and got.columns["f3"].shape == (3, 0, 3)
    assert got.columns["il/lengths"].tolist() == [0, 0, 0] and got.columns["tb"].shape == (3, 0)
    none = dec.decode(b"", np.empty(0, np.int64), np.empty(0, np.int64))
    assert none.n == 0 and none.columns["t"].shape == (0, 0, 2)


def _merged_bytes(key: bytes) -> bytes:
    """An Example's features entry (to append to an Example) holding one Feature whose
    BytesList comes in two submessages, ``[b"y"]`` and ``[b"z"]``: protobuf merges them."""
    lists = b"\x0a\x03\x0a\x01y" + b"\x0a\x03\x0a\x01z"  # bytes_list, twice
    entry = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(lists)]) + lists
    return b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry


@pytest.mark.skipif(decode.IMPLEMENTATION != "native", reason="the fallback has no spans to trust")
def test_records_the_batch_copies_take_no_python_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the records the copy leaves are decoded by Schema.decode (here: none)."""
    payloads = [encode_example({**encode_example_fields(), "i": ("int64", [k])}) for k in range(20)]
    buf, offsets, sizes = _batch(payloads)
    dec = BatchDecoder(SCHEMA, ragged_as="padded")
    calls = []
    real = Schema.decode

    def counted(self, *a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(Schema, "decode", counted)
    got = dec.decode(buf, offsets, sizes)
    assert not got.bad and calls == []
    assert got.columns["i"].tolist() == list(range(20))
    mixed = Schema(i=Int64(), il=Int64((None,)), b=Bytes((None,)))  # lists of bytes too
    dec = BatchDecoder(mixed, ragged_as="padded")
    payload = encode_example({"i": ("int64", [1]), "il": ("int64", [1]), "b": ("bytes", [b"x"])})
    buf, offsets, sizes = _batch([payload] * 4)
    got = dec.decode(buf, offsets, sizes)
    assert calls == [] and got.columns["b"] == [[b"x"]] * 4
    assert got.columns["il"].tolist() == [[1]] * 4
    # A BytesList in two submessages (protobuf merges them): that record alone per record.
    two = encode_example({"i": ("int64", [2]), "il": ("int64", [])}) + _merged_bytes(b"b")
    buf, offsets, sizes = _batch([payload, two, payload])
    got = dec.decode(buf, offsets, sizes)
    assert len(calls) == 1 and got.columns["b"] == [[b"x"], [b"y", b"z"], [b"x"]]
