"""BatchDecoder and the native batch functions, pinned to the reference decoder.

The invariant: for every record, ``BatchDecoder.decode`` gives exactly what
``read_record`` + ``Schema.decode(payload, copy=True)`` give (values equal in
type, dtype, shape and bit pattern), and reports a record bad exactly when
those raise, with an error of the same class and reason. Every test runs on
both implementations: the C extension and its pure Python twin; the main ones
also with every batch taking the fused CRC + copy path of large records.
Set ``RECORDKIT_REQUIRE_NATIVE=1`` (in CI) to fail rather than skip when the
extension did not build.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recordkit.codec import Bytes, Float32, Int64, Schema, Tensor, decode_example, encode_example
from recordkit.errors import CorruptRecordError, SchemaError, UnknownFieldError
from recordkit.format import crc32c as reference_crc32c
from recordkit.format import frame, iter_records, read_record
from recordkit.reader import _contract, _fallback, decode
from recordkit.reader.decode import BatchDecoder

from .conftest import IMPLS, _native

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def slow_ok(max_examples: int) -> settings:
    return settings(
        deadline=None,
        max_examples=max_examples,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


@pytest.fixture(params=["plain", "fused"])
def fuse(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Also run with every record taking the fused CRC + copy path (gather_verified)."""
    if request.param == "fused":
        monkeypatch.setattr(_contract, "FUSE_MIN_BYTES", 0)
    return str(request.param)


@pytest.fixture
def native() -> ModuleType:
    if _native is None:
        pytest.skip("recordkit.native._ext is not built")
    return _native


# ------------------------------------------------------------------------------ helpers


def shard(payloads: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Frame payloads into one buffer; return it with the index (offsets, framed sizes)."""
    framed = [frame(p) for p in payloads]
    sizes = np.array([len(f) for f in framed], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return b"".join(framed), offsets, sizes


def reference(schema, buf, offsets, sizes, *, columns=None, verify=True) -> list[Any]:
    """Per record: the reference's decoded dict, or the error it raises."""
    out: list[Any] = []
    for offset, size in zip(offsets.tolist(), sizes.tolist()):
        try:
            payload = read_record(buf, offset, verify=verify, expected_size=size)
            out.append(schema.decode(payload, copy=True, columns=columns))
        except CorruptRecordError as err:
            out.append(err.with_traceback(None))  # its frames would keep buf exported
    return out


def assert_value(got: Any, want: Any) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()  # bit patterns: NaN payloads, -0.0
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_value(g, w)
    else:
        assert type(got) is type(want) is bytes and got == want


def assert_matches(dec: BatchDecoder, batch, ref: list[Any]) -> None:
    bad = {i: r for i, r in enumerate(ref) if isinstance(r, Exception)}
    assert [i for i, _ in batch.bad] == sorted(bad)
    for i, err in batch.bad:
        assert type(err) is type(bad[i]) and err.reason == bad[i].reason
        assert (err.path, err.offset, err.record) == (None, None, None)
        assert err.__traceback__ is None and err.__cause__ is None
    good = [r for r in ref if not isinstance(r, Exception)]
    assert batch.n == len(good)
    expected_cols = set(dec.columns)
    for name in dec.columns:
        col = batch.columns[name]
        padded = isinstance(dec.schema[name], Bytes) and not dec.schema[name].shape
        padded = padded and dec.bytes_as == "padded"
        if padded:
            expected_cols.add(name + "/lengths")
            lengths = batch.columns[name + "/lengths"]
            assert col.dtype == np.uint8 and lengths.dtype == np.int64
            assert col.shape == (len(good), max([len(r[name]) for r in good], default=0))
        elif isinstance(col, np.ndarray):
            assert col.shape[0] == len(good)
        else:
            assert len(col) == len(good)
        for row, rec in enumerate(good):
            if padded:
                length = int(lengths[row])
                assert not col[row, length:].any()
                assert_value(col[row, :length].tobytes(), rec[name])
            elif isinstance(col, np.ndarray):
                assert_value(col[row, ...], rec[name])
            else:
                assert_value(col[row], rec[name])
    assert set(batch.columns) == expected_cols


def check(schema, buf, offsets, sizes, **kw) -> Any:
    """Decode with BatchDecoder and compare with the reference; return the batch."""
    verify = kw.get("verify", True)
    dec = BatchDecoder(schema, **kw)
    batch = dec.decode(buf, offsets, sizes)
    ref = reference(schema, buf, offsets, sizes, columns=kw.get("columns"), verify=verify)
    assert_matches(dec, batch, ref)
    assert batch.nbytes == int(sizes.sum())
    return batch


# protobuf wire building blocks, for encodings our writer never produces
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, wire: int, body: bytes = b"") -> bytes:
    head = varint(number << 3 | wire)
    return head + (varint(len(body)) + body if wire == 2 else body)


def entry(key: bytes, feature: bytes) -> bytes:
    return field(1, 2, field(1, 2, key) + field(2, 2, feature))


def example(*entries: bytes, trailer: bytes = b"") -> bytes:
    return field(1, 2, b"".join(entries)) + trailer


def packed_ints(*values: int) -> bytes:
    return field(3, 2, field(1, 2, b"".join(varint(v) for v in values)))


def floats(*values: float) -> bytes:
    return field(2, 2, field(1, 2, struct.pack(f"<{len(values)}f", *values)))


def byteslist(*values: bytes) -> bytes:
    return field(1, 2, b"".join(field(1, 2, v) for v in values))


# ------------------------------------------------------------------------------ schemas

SCHEMA = Schema(
    image=Bytes(),
    label=Int64(),
    emb=Float32((3,)),
    raw=Tensor("int16", (2, 2)),
    z=Tensor("float32", (2,), compression="zstd"),
    tags=Bytes((None,)),
    ragged=Int64((None, 2)),
    vol=Tensor("uint8", (None, None)),
)


def sample(i: int) -> dict[str, Any]:
    return {
        "image": bytes([i % 256]) * (i % 7),
        "label": (-1) ** i * i * 10**15,
        "emb": np.array([i, -0.0, np.nan], np.float32),
        "raw": np.arange(4, dtype=np.int16).reshape(2, 2) * i,
        "z": np.array([i, 1 / (i + 1)], np.float32),
        "tags": [b"t"] * (i % 3),
        "ragged": np.arange(2 * (i % 3)).reshape(-1, 2),
        "vol": np.full((i % 2, 3), i, np.uint8),
    }


def small_shard(n: int = 4) -> tuple[bytes, np.ndarray, np.ndarray]:
    return shard([SCHEMA.encode(sample(i)) for i in range(n)])


# ------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize("bytes_as", ["padded", "list"])
def test_decodes_every_feature_type(impl, bytes_as):
    buf, offsets, sizes = small_shard(6)
    batch = check(SCHEMA, buf, offsets, sizes, bytes_as=bytes_as)
    assert batch.n == 6 and not batch.bad
    assert batch.columns["label"].shape == (6,) and batch.columns["emb"].shape == (6, 3)
    assert batch.columns["raw"].dtype == np.int16 and batch.columns["z"].shape == (6, 2)


def test_columns_select_and_validate(impl):
    buf, offsets, sizes = small_shard()
    batch = check(SCHEMA, buf, offsets, sizes, columns=["vol", "label"])
    assert list(batch.columns) == ["label", "vol"]  # schema order
    with pytest.raises(SchemaError, match="not in the schema"):
        BatchDecoder(SCHEMA, columns=["nope"])
    with pytest.raises(SchemaError, match="sequence of names"):
        BatchDecoder(SCHEMA, columns="label")


def test_empty_batch_and_empty_schema(impl):
    buf, offsets, sizes = small_shard()
    batch = check(SCHEMA, buf, offsets[:0], sizes[:0])
    assert batch.n == 0 and batch.columns["image"].shape == (0, 0)
    check(Schema(), buf, offsets, sizes)


def test_offsets_in_any_order_with_repeats(impl):
    buf, offsets, sizes = small_shard(5)
    order = np.array([4, 0, 0, 3, 1, 4])
    check(SCHEMA, buf, offsets[order], sizes[order])


def test_alloc_provides_every_batch_array(impl):
    buf, offsets, sizes = small_shard()
    given_out: list[np.ndarray] = []

    def alloc(shape, dtype):
        arr = np.full(shape, 0x5A, dtype) if np.dtype(dtype).kind != "b" else np.empty(shape, dtype)
        given_out.append(arr)
        return arr

    batch = BatchDecoder(SCHEMA).decode(buf, offsets, sizes, alloc=alloc)
    arrays = [v for v in batch.columns.values() if isinstance(v, np.ndarray)]
    assert len(arrays) == len(given_out) == 6
    assert all(any(a is g for g in given_out) for a in arrays)
    assert_matches(BatchDecoder(SCHEMA), batch, reference(SCHEMA, buf, offsets, sizes))
    with pytest.raises(ValueError, match="alloc"):
        BatchDecoder(SCHEMA).decode(buf, offsets, sizes, alloc=lambda s, d: np.empty(s, np.int8))


def test_bad_records_are_reported_with_the_reference_error(impl, fuse):
    payloads = [SCHEMA.encode(sample(i)) for i in range(6)]
    other = Schema(image=Bytes(), label=Int64((2,)))
    payloads[1] = other.encode({"image": b"x", "label": [1, 2]})  # label count, missing emb...
    payloads[4] = payloads[4][:-3]  # truncated inside the Example
    buf, offsets, sizes = shard(payloads)
    data = bytearray(buf)
    data[int(offsets[2] + sizes[2]) - 1] ^= 0x40  # the stored payload CRC
    data[int(offsets[3]) + 2] ^= 0x01  # length field: length CRC
    batch = check(SCHEMA, bytes(data), offsets, sizes)
    assert [i for i, _ in batch.bad] == [1, 2, 3, 4]
    assert "payload CRC mismatch" in batch.bad[1][1].reason
    # verify=False: the payload CRC is not checked, the record decodes
    batch = check(SCHEMA, bytes(data), offsets, sizes, verify=False)
    assert [i for i, _ in batch.bad] == [1, 3, 4]


def test_count_and_kind_mismatches_take_the_reference_path(impl):
    schema = Schema(a=Int64((2,)), b=Float32(), c=Tensor("uint8", (3,)), d=Bytes(), e=Int64((0,)))
    good = {"a": ("int64", [1, 2]), "b": ("float", [1.0]), "c": ("bytes", [b"abc"])}
    good |= {"d": ("bytes", [b""]), "e": ("int64", [])}
    variants = [
        good,
        good | {"a": ("int64", [1, 2, 3])},
        good | {"a": ("float", [1.0, 2.0])},
        good | {"b": ("float", [])},
        good | {"c": ("bytes", [b"ab"])},
        good | {"c": ("bytes", [b"abc", b"abc"])},
        good | {"d": ("bytes", [])},
        good | {"d": (None, None)},
        good | {"e": (None, None)},  # no kind reads as empty: fine for shape (0,)
        {k: v for k, v in good.items() if k != "b"},
    ]
    buf, offsets, sizes = shard([encode_example(v) for v in variants])
    batch = check(schema, buf, offsets, sizes)
    assert [i for i, _ in batch.bad] == [1, 2, 3, 4, 5, 6, 7, 9]


WIRE = {
    "unpacked int64 list": example(
        entry(b"a", field(3, 2, b"".join(field(1, 0, varint(v)) for v in (1, -1))))
    ),
    "one unpacked int64": example(entry(b"a", field(3, 2, field(1, 0, varint(2**63))))),
    "packed int64 in two chunks": example(
        entry(b"a", field(3, 2, field(1, 2, varint(5)) + field(1, 2, varint(6))))
    ),
    "merged int64 lists": example(entry(b"a", packed_ints(7) + packed_ints(8))),
    "empty chunk then a packed one": example(entry(b"a", packed_ints() + packed_ints(9, 10))),
    "kind replaced then merged": example(
        entry(b"a", packed_ints(1) + floats(1.0) + packed_ints(2) + packed_ints(3))
    ),
    "10-byte varint with high bits": example(
        entry(b"a", field(3, 2, field(1, 2, b"\xff" * 9 + b"\x7f" + b"\x01")))
    ),
    "one unpacked float": example(entry(b"f", field(2, 2, field(1, 5, b"\x00\x00\xc0\x7f")))),
    "floats in two chunks": example(entry(b"f", floats(1.0) + floats(-0.0))),
    "duplicate key, last wins": example(entry(b"a", packed_ints(1)), entry(b"a", packed_ints(2))),
    "duplicate key, last is no kind": example(entry(b"a", packed_ints(1)), entry(b"a", b"")),
    "value before key": example(field(1, 2, field(2, 2, packed_ints(4)) + field(1, 2, b"a"))),
    "key given twice": example(
        field(1, 2, field(1, 2, b"x") + field(2, 2, packed_ints(4)) + field(1, 2, b"a"))
    ),
    "features twice": example(entry(b"a", packed_ints(1))) + example(entry(b"f", floats(2.0))),
    "unknown fields": example(
        entry(b"a", packed_ints(3) + field(9, 0, varint(5)) + field(10, 1, b"12345678")),
        field(7, 5, b"1234"),
        trailer=field(15, 2, b"abc") + field(14, 0, varint(2**70 >> 7)),
    ),
    "unknown fields inside a list": example(
        entry(b"a", field(3, 2, field(2, 0, varint(1)) + field(1, 2, varint(11))))
    ),
    "unknown field in an unwanted Feature": example(
        entry(b"a", packed_ints(1)), entry(b"zz", field(9, 0, varint(1)))
    ),
    "unknown field in an unwanted list": example(
        entry(b"a", packed_ints(1)), entry(b"zz", field(3, 2, field(2, 0, varint(1))))
    ),
    "unknown field in a map entry": example(field(1, 2, field(1, 2, b"a") + field(3, 0, b"\x01"))),
    "int64 as fixed32": example(entry(b"a", field(3, 2, field(1, 5, b"abcd")))),
    "float as a varint": example(entry(b"f", field(2, 2, field(1, 0, varint(1))))),
    "bytes as a varint": example(entry(b"b", field(1, 2, field(1, 0, varint(1))))),
    "a group in the Example": example(
        entry(b"a", packed_ints(1)), trailer=field(1, 3) + field(1, 4)
    ),
    "overlong tag": example(entry(b"a", b"\x9a\x00" + varint(2) + field(1, 2, varint(12)))),
    "bytes lists merged": example(entry(b"b", byteslist(b"x") + byteslist(b"y"))),
    "one of two bytes values": example(entry(b"b", byteslist(b"x", b"y"))),
    "invalid utf-8 in another key": example(
        entry(b"\xff", packed_ints(1)), entry(b"a", packed_ints(1))
    ),
    "surrogate in a key": example(entry(b"\xed\xa0\x80", b"")),
    "field number 0": example(entry(b"a", packed_ints(1)), field(0, 0, b"\x00")),
    "wire type 3": example(entry(b"a", packed_ints(1))) + b"\x0b",
    "11-byte varint": example(entry(b"a", field(3, 2, field(1, 2, b"\xff" * 10 + b"\x01")))),
    "truncated packed varint": example(entry(b"a", field(3, 2, field(1, 2, b"\x01\x80")))),
    "floats not a multiple of 4": example(entry(b"f", field(2, 2, field(1, 2, b"\0" * 5)))),
    "length past the end": b"\x0a\x05\x0a\x03",
    "bad list ignored when unwanted": example(
        entry(b"a", packed_ints(1)), entry(b"zz", field(3, 2, field(1, 2, b"\x80")))
    ),
    "empty payload": b"",
}
WIRE_SCHEMAS = [
    Schema(a=Int64(), f=Float32()),
    Schema(a=Int64((None,))),
    Schema(a=Int64((2,))),
    Schema(f=Float32((None,))),
    Schema(b=Bytes()),
    Schema(b=Bytes((None,))),
    Schema(b=Tensor("uint8", (1,))),
]


@pytest.mark.parametrize("schema", WIRE_SCHEMAS, ids=repr)
def test_wire_variants_match_the_reference(impl, fuse, schema):
    buf, offsets, sizes = shard(list(WIRE.values()))
    for bytes_as in ("padded", "list"):
        check(schema, buf, offsets, sizes, bytes_as=bytes_as)


# ------------------------------------------------------------------------------ hypothesis

DTYPES = ["bool", "int8", "uint16", "int32", "uint64", "float16", "float32", "complex64"]
DIMS = st.lists(st.one_of(st.none(), st.integers(0, 3)), max_size=3).map(tuple)


def _maybe(make, *args):
    try:
        return make(*args)
    except SchemaError:
        return None


FTYPES = st.one_of(
    st.just(Bytes()),
    st.builds(lambda n: Bytes((n,)), st.one_of(st.none(), st.integers(0, 3))),
    st.builds(lambda d: _maybe(Int64, d), DIMS),
    st.builds(lambda d: _maybe(Float32, d), DIMS),
    st.builds(
        lambda t, d, c: _maybe(Tensor, t, d, c),
        st.sampled_from(DTYPES),
        DIMS,
        st.sampled_from([None, "zstd"]),
    ),
).filter(lambda f: f is not None)
NAMES = st.text(alphabet="ab/é😀", min_size=1, max_size=3)


@st.composite
def schemas(draw) -> Schema:
    features = draw(st.dictionaries(NAMES, FTYPES, min_size=1, max_size=4))
    try:
        return Schema(features)
    except SchemaError:  # a name that collides with a /shape companion
        return draw(st.nothing())


def value_of(draw, ftype) -> Any:
    shape = tuple(draw(st.integers(0, 3)) if d is None else d for d in ftype.shape)
    if ftype.shape.count(None) == 1:  # the None dim is recovered from the count: no zero dims
        shape = tuple(max(d, 1) for d in shape)
    size = int(np.prod(shape))
    if isinstance(ftype, Bytes):
        values = draw(st.lists(st.binary(max_size=9), min_size=size, max_size=size))
        return values if ftype.shape else draw(st.binary(max_size=20))
    if isinstance(ftype, Int64):
        ints = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=size, max_size=size))
        return np.array(ints, np.int64).reshape(shape)
    if isinstance(ftype, Float32):
        bits = draw(st.lists(st.integers(0, 2**32 - 1), min_size=size, max_size=size))
        return np.array(bits, np.uint32).view(np.float32).reshape(shape)
    dtype = np.dtype(ftype.dtype)
    raw = draw(st.binary(min_size=size * dtype.itemsize, max_size=size * dtype.itemsize))
    if dtype.kind == "b":
        return (np.frombuffer(raw, np.uint8) & 1).astype(bool).reshape(shape)
    return np.frombuffer(raw, dtype).reshape(shape)


@st.composite
def payloads(draw, schema: Schema) -> bytes:
    """A record for ``schema``: valid, or a near miss the reference may reject."""
    choice = draw(st.integers(0, 9))
    if choice < 3:  # a valid sample
        return schema.encode({n: value_of(draw, t) for n, t in schema.features.items()})
    if choice < 7:  # the same, encoded as protobuf may but our writer never does
        payload = schema.encode({n: value_of(draw, t) for n, t in schema.features.items()})
        # ... and now and then with fields the Example does not define (refused)
        return draw(rewired(payload, unknown=draw(st.integers(0, 3)) == 0))
    if choice < 8:  # the same names, any kinds and counts (or no kind at all)
        names = list(schema.names) + [f"{n}/shape" for n in schema.names]
        kinds = st.sampled_from(["bytes", "int64", "float", None])
        chosen = draw(st.lists(st.sampled_from(names), unique=True))
        features: dict[str, Any] = {}
        for name in chosen:
            kind = draw(kinds)
            if kind == "bytes":
                features[name] = (kind, draw(st.lists(st.binary(max_size=8), max_size=3)))
            else:
                features[name] = (kind, draw(st.lists(st.integers(-3, 3), max_size=5)))
        return encode_example(features)
    # Example.features given twice: the maps merge, later keys win
    return draw(payloads(schema)) + draw(payloads(schema))


def _chunks(draw, values: list[Any]) -> list[list[Any]]:
    """``values`` cut into 1 to 3 runs (empty runs included)."""
    ncuts = draw(st.integers(0, 2))
    cuts = sorted(draw(st.lists(st.integers(0, len(values)), min_size=ncuts, max_size=ncuts)))
    bounds = [0, *cuts, len(values)]
    return [values[a:b] for a, b in itertools.pairwise(bounds)]


def _list_messages(draw, kind: str, values: Any, unknown: bool) -> bytes:
    """One feature's values as 1-3 list submessages (which protobuf merges); with
    ``unknown``, perhaps with a field the list does not define."""
    tag = {"bytes": 1, "float": 2, "int64": 3}[kind]
    out = b""
    for part in _chunks(draw, list(values)):
        body = b""
        for run in _chunks(draw, part):
            if kind == "bytes":
                body += b"".join(field(1, 2, bytes(v)) for v in run)
            elif draw(st.booleans()):  # packed (an empty run writes nothing)
                data = (
                    np.array(run, np.float32).tobytes()
                    if kind == "float"
                    else b"".join(varint(int(v)) for v in run)
                )
                body += field(1, 2, data) if data else b""
            elif kind == "float":
                body += b"".join(field(1, 5, np.float32(v).tobytes()) for v in run)
            else:
                body += b"".join(field(1, 0, varint(int(v))) for v in run)
            if unknown and draw(st.integers(0, 5)) == 0:
                body += field(7, 0, varint(1))  # an unknown field inside the list
        out += field(tag, 2, body)
    return out


@st.composite
def rewired(draw, payload: bytes, unknown: bool = False) -> bytes:
    """``payload`` re-encoded with wire choices protobuf reads as the same Example:
    reordered entries, stale duplicates, value before key, unpacked or split
    lists, merged list submessages, replaced oneof members; with ``unknown``, also
    fields a message does not define (protobuf skips them; the reference refuses
    the record)."""
    entries = []
    for name, (kind, values) in draw(st.permutations(list(decode_example(payload).items()))):
        key = field(1, 2, name.encode())
        if draw(st.integers(0, 3)) == 0:  # an earlier entry for the same key: replaced
            entries.append(field(1, 2, key + field(2, 2, byteslist(b"stale"))))
        feature = b""
        if kind is not None:
            if draw(st.integers(0, 3)) == 0:  # another oneof member first: replaced
                feature += packed_ints(5) if kind == "bytes" else byteslist(b"x")
            feature += _list_messages(draw, kind, values, unknown)
        if unknown and draw(st.integers(0, 4)) == 0:
            feature += field(9, 1, b"12345678")  # an unknown field in the Feature
        value = field(2, 2, feature)
        entries.append(field(1, 2, value + key if draw(st.booleans()) else key + value))
    cut = draw(st.integers(0, len(entries)))  # Example.features given once or twice
    out = field(1, 2, b"".join(entries[:cut])) if cut else b""
    out += field(1, 2, b"".join(entries[cut:]))
    if not unknown:
        assert _canonical(out) == _canonical(payload)  # the same Example
        return out
    if draw(st.booleans()):
        out += field(15, 2, b"unknown")  # an unknown field in the Example
    with contextlib.suppress(UnknownFieldError):  # perhaps none was drawn
        assert _canonical(out) == _canonical(payload)
    return out


def _canonical(payload: bytes) -> list[Any]:
    return sorted(
        (name, kind, [bytes(v) for v in values] if kind == "bytes" else repr(values))
        for name, (kind, values) in decode_example(payload).items()
    )


@st.composite
def batches(draw):
    schema = draw(schemas())
    records = draw(st.lists(payloads(schema), min_size=1, max_size=6))
    buf, offsets, sizes = shard(records)
    order = draw(st.lists(st.integers(0, len(records) - 1), max_size=8))
    columns = None
    if draw(st.booleans()):
        columns = draw(st.lists(st.sampled_from(schema.names), unique=True))
    return schema, buf, offsets[order], sizes[order], columns


@slow_ok(150)
@given(case=batches(), bytes_as=st.sampled_from(["padded", "list"]))
def test_random_schemas_match_the_reference(impl, fuse, case, bytes_as):
    schema, buf, offsets, sizes, columns = case
    check(schema, buf, offsets, sizes, columns=columns, bytes_as=bytes_as)


REWIRE_SCHEMA = Schema(
    a=Int64((3,)),
    b=Int64(),
    c=Float32((2, 2)),
    d=Float32(),
    e=Bytes(),
    f=Tensor("int16", (2,)),
    g=Int64((None,)),
    h=Bytes((None,)),
)


@slow_ok(100)
@given(st.data(), st.sampled_from(["padded", "list"]))
def test_rewired_records_match_the_reference(impl, fuse, data, bytes_as):
    """Fast-path features encoded every way protobuf allows: the slow path takes over."""
    records = []
    for _ in range(data.draw(st.integers(1, 6))):
        sample = {n: value_of(data.draw, t) for n, t in REWIRE_SCHEMA.features.items()}
        payload = REWIRE_SCHEMA.encode(sample)  # fast and slow records interleave
        records.append(data.draw(rewired(payload)) if data.draw(st.booleans()) else payload)
    unknown = data.draw(st.integers(0, len(records)))  # one with unknown fields, perhaps
    if unknown < len(records):
        records[unknown] = data.draw(rewired(records[unknown], unknown=True))
    buf, offsets, sizes = shard(records)
    batch = check(REWIRE_SCHEMA, buf, offsets, sizes, bytes_as=bytes_as)
    refused = [i for i, p in enumerate(records) if _has_unknown_field(p)]
    assert [i for i, _ in batch.bad] == refused and batch.n == len(records) - len(refused)
    assert all(isinstance(err, UnknownFieldError) for _, err in batch.bad)
    parse_both(BatchDecoder(REWIRE_SCHEMA), buf, offsets, sizes)


def _has_unknown_field(payload: bytes) -> bool:
    try:
        decode_example(payload)
    except UnknownFieldError:
        return True
    return False


# ------------------------------------------------------------------------------ golden files


def _golden(name: str) -> tuple[bytes, np.ndarray, np.ndarray, list[bytes]]:
    data = (GOLDEN / name).read_bytes()
    records = [(off, bytes(p)) for off, p in iter_records(data)]
    offsets = np.array([off for off, _ in records], np.int64)
    sizes = np.array([len(p) + 16 for _, p in records], np.int64)
    return data, offsets, sizes, [p for _, p in records]


def assert_spans_match(impl, buf, status, spans, keys, payloads) -> None:
    """Every span says what decode_example says about the same record."""
    names = [k.decode("utf-8") for k in keys]
    for i, payload in enumerate(payloads):
        assert status[i] == impl.STATUS_OK
        ref = decode_example(payload)
        for k, name in enumerate(names):
            kind, count, start, nbytes = spans[i, k].tolist()
            if name not in ref:
                assert (kind, count, start, nbytes) == (impl.KIND_ABSENT, 0, 0, 0)
                continue
            ref_kind, values = ref[name]
            if ref_kind is None:
                assert (kind, count, start, nbytes) == (impl.KIND_NONE, 0, 0, 0)
                continue
            assert kind & ~impl.KIND_COMPLEX == {"bytes": 1, "float": 2, "int64": 3}[ref_kind]
            assert count == len(values)
            data = buf[start : start + nbytes]
            if ref_kind == "bytes":
                assert kind == impl.KIND_BYTES
                assert data == (bytes(values[0]) if count else b"")
            elif kind & impl.KIND_COMPLEX:
                continue  # the slow path reads it
            elif ref_kind == "float":
                assert data == values.tobytes()
            else:
                out = np.empty(count, np.int64)
                impl.varints(buf, *(np.array([v], np.int64) for v in (start, nbytes, count)), out)
                assert out.tobytes() == values.tobytes()


@pytest.mark.parametrize(
    "name", sorted(p.name for p in GOLDEN.glob("*.tfrecord") if p.name != "unknown_fields.tfrecord")
)
def test_golden_files_parse_like_decode_example(impl, name):
    buf, offsets, sizes, payloads = _golden(name)
    names = sorted({k for p in payloads for k in decode_example(p)} | {"missing"})
    keys = tuple(n.encode() for n in names)
    status_b, spans_b = impl.parse_batch(buf, offsets, sizes, keys, True)
    status = np.frombuffer(status_b, np.int32)
    spans = np.frombuffer(spans_b, np.int64).reshape(len(offsets), len(keys), 4)
    assert_spans_match(impl, buf, status, spans, keys, payloads)


def test_golden_unknown_fields_are_never_taken(impl):
    """Records holding fields their messages do not define (TensorFlow skips them): the
    fast path refuses each, whichever features are asked for, and the reference names
    the field."""
    buf, offsets, sizes, _ = _golden("unknown_fields.tfrecord")
    for keys in ((b"a", b"b", b"c", b"f"), ()):
        status_b, _ = impl.parse_batch(buf, offsets, sizes, keys, True)
        status = np.frombuffer(status_b, np.int32).tolist()
        if keys:
            assert status == [impl.STATUS_MALFORMED] * len(offsets)
        else:  # the values of no feature are read: the fields inside lists go unseen
            assert status == [impl.STATUS_MALFORMED] * 2 + [0, 0] + [impl.STATUS_MALFORMED, 0]
    schema = Schema(a=Int64((None,)), b=Bytes((None,)), f=Float32((None,)))
    batch = check(schema, buf, offsets, sizes)
    assert batch.n == 0 and all(isinstance(e, UnknownFieldError) for _, e in batch.bad)


@pytest.mark.parametrize("name", ["scalars.tfrecord", "lists.tfrecord", "large.tfrecord"])
def test_golden_files_decode_like_the_reference(impl, name):
    buf, offsets, sizes, payloads = _golden(name)
    schema = Schema.infer(decode_example(p) for p in payloads)
    check(schema, buf, offsets, sizes)


# ------------------------------------------------------------------------------ corruption


def parse_both(dec: BatchDecoder, buf, offsets, sizes, verify=True):
    """parse_batch of every available implementation, with and without the decoder's
    expectations; the implementations must agree byte for byte."""
    for expect in (None, dec._expect):
        args = (buf, offsets, sizes, dec._keys, verify, 1 << 31, expect)
        results = [m.parse_batch(*args) for m in IMPLS.values() if m is not None]
        assert all(r == results[0] for r in results[1:])


CORRUPT_SCHEMA = Schema(label=Int64(), emb=Float32((2,)), name=Bytes(), tags=Int64((None,)))


def _corrupt_shard():
    samples = [
        {"label": 300, "emb": [1.5, -2.0], "name": b"ab", "tags": [1, 2**40]},
        {"label": -1, "emb": [0.0, 3.0], "name": b"", "tags": []},
        {"label": 7, "emb": [9.0, 9.5], "name": b"xyz", "tags": [5]},
    ]
    return shard([CORRUPT_SCHEMA.encode(s) for s in samples])


def _bit_flips(buf: bytes):
    for bit in range(8 * len(buf)):
        data = bytearray(buf)
        data[bit >> 3] ^= 1 << (bit & 7)
        yield bytes(data)


def test_every_bit_flip(impl, fuse):
    buf, offsets, sizes = _corrupt_shard()
    for verify in (True, False) if fuse == "plain" else (True,):  # fusing needs verify
        dec = BatchDecoder(CORRUPT_SCHEMA, verify=verify)
        for data in _bit_flips(buf):
            batch = dec.decode(data, offsets, sizes)
            assert_matches(
                dec, batch, reference(CORRUPT_SCHEMA, data, offsets, sizes, verify=verify)
            )


def test_every_bit_flip_parses_the_same_in_both_implementations():
    buf, offsets, sizes = _corrupt_shard()
    for verify in (True, False):
        dec = BatchDecoder(CORRUPT_SCHEMA, verify=verify)
        for data in _bit_flips(buf):
            parse_both(dec, data, offsets, sizes, verify)


def test_every_truncation(impl):
    buf, offsets, sizes = _corrupt_shard()
    dec = BatchDecoder(CORRUPT_SCHEMA)
    for end in range(len(buf) + 1):
        data = buf[:end]
        parse_both(dec, data, offsets, sizes)
        batch = dec.decode(data, offsets, sizes)
        assert_matches(dec, batch, reference(CORRUPT_SCHEMA, data, offsets, sizes))
        assert batch.n == sum(int(o + s) <= end for o, s in zip(offsets, sizes))


@slow_ok(200)
@given(st.data())
def test_random_byte_corruption(impl, data):
    buf, offsets, sizes = _corrupt_shard()
    corrupt = bytearray(buf)
    for _ in range(data.draw(st.integers(1, 4))):
        corrupt[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    parse_both(BatchDecoder(CORRUPT_SCHEMA), bytes(corrupt), offsets, sizes, False)
    check(CORRUPT_SCHEMA, bytes(corrupt), offsets, sizes, verify=False)


def test_index_entries_outside_the_buffer(impl):
    buf, _, sizes = _corrupt_shard()
    n = len(buf)
    bad_offsets = np.array([-1, -(2**63), n, n + 5, 2**62, n - 3, 0, 0, 0], np.int64)
    bad_sizes = np.array([16, 16, 16, 16, 16, 16, -1, 2**63 - 1, int(sizes[0]) + 1], np.int64)
    status_b, _ = impl.parse_batch(buf, bad_offsets, bad_sizes, (b"label",), True)
    status = np.frombuffer(status_b, np.int32).tolist()
    s = impl
    assert (
        status
        == [s.STATUS_OUT_OF_BOUNDS] * 2
        + [s.STATUS_TRUNCATED]
        + [s.STATUS_OUT_OF_BOUNDS] * 2
        + [s.STATUS_TRUNCATED]
        + [s.STATUS_LENGTH_MISMATCH] * 3
    )
    batch = BatchDecoder(CORRUPT_SCHEMA).decode(buf, bad_offsets, bad_sizes)
    assert batch.n == 0 and [i for i, _ in batch.bad] == list(range(9))
    assert "negative" in batch.bad[0][1].reason
    assert all(isinstance(e, CorruptRecordError) for _, e in batch.bad)
    # the rest agree with the reference
    ref = reference(CORRUPT_SCHEMA, buf, bad_offsets[2:], bad_sizes[2:])
    for (_, err), want in zip(batch.bad[2:], ref):
        assert type(err) is type(want) and err.reason == want.reason


def test_max_record_bytes(impl):
    buf, offsets, sizes = _corrupt_shard()
    limit = int(np.median(sizes)) - 16  # the largest record is over it
    too_large = (sizes - 16 > limit).tolist()
    assert any(too_large) and not all(too_large)
    status_b, _ = impl.parse_batch(buf, offsets, sizes, (), True, limit)
    status = np.frombuffer(status_b, np.int32).tolist()
    assert status == [impl.STATUS_TOO_LARGE if t else impl.STATUS_OK for t in too_large]
    batch = BatchDecoder(CORRUPT_SCHEMA, max_record_bytes=limit).decode(buf, offsets, sizes)
    assert [i for i, _ in batch.bad] == [i for i, t in enumerate(too_large) if t]
    assert all("exceeds max_record_bytes" in err.reason for _, err in batch.bad)


# ------------------------------------------------------------------------------ native functions


def test_feature_names_that_no_record_can_hold(impl):
    schema = Schema({"\ud800": Int64(), "ok": Int64()})  # a lone surrogate: never valid UTF-8
    buf, offsets, sizes = shard([Schema(ok=Int64()).encode({"ok": 1})])
    batch = check(schema, buf, offsets, sizes)
    assert "is missing" in batch.bad[0][1].reason
    check(schema, buf, offsets, sizes, columns=["ok"])


def test_crc32c_matches_the_crc32c_package(impl):
    rng = np.random.default_rng(1)
    data = rng.bytes(300 + 16)
    for length in range(301):
        for start in (0, 1, 3, 7):
            view = memoryview(data)[start : start + length]
            assert impl.crc32c(view) == reference_crc32c(view)
            assert impl.crc32c(view, 0xDEADBEEF) == reference_crc32c(view, 0xDEADBEEF)
    big = rng.bytes(5 << 20)
    for start, length in [(0, len(big)), (5, 3 * 8192 * 3 + 11), (3, 777), (1, len(big) - 1)]:
        view = memoryview(big)[start : start + length]
        assert impl.crc32c(view) == reference_crc32c(view)
    half = len(big) // 2 + 3
    assert impl.crc32c(big[half:], impl.crc32c(big[:half])) == reference_crc32c(big)
    assert impl.crc32c(b"123456789") == 0xE3069283
    assert impl.crc32c(b"x", -1) == reference_crc32c(b"x", -1)


def test_native_software_crc_path(native):
    rng = np.random.default_rng(2)
    data = rng.bytes(100_000)
    for length in [*range(70), 767, 768, 769, 3 * 8192 * 3 + 1, 99_990]:
        view = memoryview(data)[3 : 3 + length]
        assert native._crc32c_software(view) == reference_crc32c(view)


def test_gather(impl):
    buf = bytes(range(100))
    out = np.full((3, 4), 0xEE, np.uint8)
    starts, lengths = np.array([0, 10, 99], np.int64), np.array([4, 2, 0], np.int64)
    impl.gather(buf, starts, lengths, out, 4)
    assert out.tolist() == [[0, 1, 2, 3], [10, 11, 0, 0], [0, 0, 0, 0]]
    floats_out = np.empty((2,), np.float32)
    impl.gather(
        struct.pack("<ff", 1.5, -0.0),
        np.array([4, 0], np.int64),
        np.array([4, 4], np.int64),
        floats_out,
        4,
    )
    assert floats_out.tobytes() == struct.pack("<ff", -0.0, 1.5)
    for s, n, row in [(98, 3, 4), (-1, 1, 4), (101, 0, 4), (0, 5, 4), (0, -1, 4), (2**62, 1, 4)]:
        out = np.zeros((1, row), np.uint8)
        with pytest.raises(ValueError):
            impl.gather(buf, np.array([s], np.int64), np.array([n], np.int64), out, row)
        assert not out.any()  # nothing written on error
    with pytest.raises(ValueError):  # out of the wrong size
        impl.gather(buf, starts, lengths, np.zeros((3, 3), np.uint8), 4)
    with pytest.raises(ValueError):  # not int64
        impl.gather(buf, starts.astype(np.int32), lengths, np.zeros((3, 4), np.uint8), 4)
    with pytest.raises((TypeError, ValueError, BufferError)):  # read-only out
        impl.gather(buf, starts, lengths, bytes(12), 4)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def test_gather_verified(impl):
    payloads = [b"a" * 40 + b"VALUE" + b"z" * 7, b"", b"q" * 100]
    buf, offsets, sizes = shard(payloads)
    starts = i64(int(offsets[0]) + 12 + 40, 0, int(offsets[2]) + 12)
    lengths = i64(5, 0, 100)
    out = np.full((3, 100), 0xEE, np.uint8)
    status = impl.gather_verified(buf, offsets, sizes, starts, lengths, out, 100)
    assert np.frombuffer(status, np.int32).tolist() == [0, 0, 0]
    assert out[0, :5].tobytes() == b"VALUE" and not out[0, 5:].any() and not out[1].any()
    assert out[2].tobytes() == b"q" * 100
    for at in (int(offsets[0]) + 12, int(offsets[0]) + 12 + 42, int(offsets[1]) + 13):
        data = bytearray(buf)
        data[at] ^= 0x10  # before the span, inside it, a stored CRC
        status = impl.gather_verified(bytes(data), offsets, sizes, starts, lengths, out, 100)
        expected = [impl.STATUS_PAYLOAD_CRC if at < offsets[1] else 0, 0, 0]
        if at > offsets[1]:
            expected[1] = impl.STATUS_PAYLOAD_CRC
        assert np.frombuffer(status, np.int32).tolist() == expected
    misuse = [
        (i64(-1), i64(16), i64(0), i64(0)),  # record outside the buffer
        (i64(int(offsets[2])), i64(int(sizes[2]) + 1), i64(0), i64(0)),
        (i64(0), i64(15), i64(0), i64(0)),  # smaller than the framing
        (i64(0), i64(int(sizes[0])), i64(11), i64(1)),  # span in the header
        (i64(0), i64(int(sizes[0])), i64(int(sizes[0]) - 5), i64(2)),  # span in the footer
        (i64(0), i64(int(sizes[0])), i64(12), i64(101)),  # longer than a row
    ]
    for o, z, st_, ln in misuse:
        out = np.zeros((1, 100), np.uint8)
        with pytest.raises(ValueError):
            impl.gather_verified(buf, o, z, st_, ln, out, 100)
        assert not out.any()


def test_fused_crc_copy_path(impl, monkeypatch):
    """Big records take gather_verified; a CRC it catches sends the batch the plain way."""
    calls = []

    def spy(*args):
        calls.append(args[0])
        return impl.gather_verified(*args)

    monkeypatch.setattr(decode, "_impl", ModuleType("spy"))
    for name in ("parse_batch", "gather", "varints", "bytes_lists"):
        setattr(decode._impl, name, getattr(impl, name))
    decode._impl.gather_verified = spy
    rng = np.random.default_rng(4)
    schema = Schema(image=Bytes(), label=Int64(), small=Float32((2,)), tags=Bytes((None,)))
    samples = [
        {"image": rng.bytes(40_000 + i), "label": i, "small": [i, 1], "tags": [b"x"] * i}
        for i in range(4)
    ]
    payloads = [schema.encode(s) for s in samples]
    payloads[3] = rewired_once(payloads[3])  # a slow-path record among fast ones
    buf, offsets, sizes = shard(payloads)
    parse_both(BatchDecoder(schema), buf, offsets, sizes)
    status_b, _ = impl.parse_batch(
        buf, offsets, sizes, BatchDecoder(schema)._keys, True, 1 << 31, BatchDecoder(schema)._expect
    )
    assert np.frombuffer(status_b, np.int32).tolist() == [0, 0, 0, impl.STATUS_UNEXPECTED]
    check(schema, buf, offsets, sizes)
    assert len(calls) == 1
    for at in (100, 30_000, int(sizes[1]) - 2):  # in the image, and in the stored CRC
        data = bytearray(buf)
        data[int(offsets[1]) + at] ^= 1
        calls.clear()
        batch = check(schema, bytes(data), offsets, sizes)
        assert [i for i, _ in batch.bad] == [1] and len(calls) == 1
    check(schema, buf, offsets, sizes, verify=False)  # nothing to verify: plain gathers
    check(schema, buf, offsets, sizes, bytes_as="list")


def rewired_once(payload: bytes) -> bytes:
    """The payload with its "small" floats in two chunks: valid, but not for the fast path."""
    features = decode_example(payload)
    (a, b) = features.pop("small")[1]
    return encode_example(features) + example(entry(b"small", floats(a) + floats(b)))


def test_varints(impl):
    values = [0, 1, 127, 128, 300, -1, -(2**63), 2**63 - 1]
    data = b"".join(varint(v) for v in values)
    out = np.empty(8, np.int64)
    impl.varints(data, i64(0, 2), i64(2, len(data) - 2), i64(2, 6), out)
    assert out.tolist() == values
    impl.varints(b"\xff" * 9 + b"\x7f", i64(0), i64(10), i64(1), out[:1])
    assert out[0] == -1  # bits past 64 dropped
    impl.varints(b"", i64(0, 0), i64(0, 0), i64(0, 0), out[:0])
    bad = [
        (b"\x01\x02", 0, 2, 1),  # too many
        (b"\x01\x02", 0, 2, 3),  # too few
        (b"\x01\x82", 0, 2, 2),  # truncated
        (b"\xff" * 10 + b"\x01", 0, 11, 1),  # 11 bytes
        (b"\x01", 0, 2, 1),  # outside the buffer
        (b"\x01", -1, 1, 1),
    ]
    for data, s, n, c in bad:
        with pytest.raises(ValueError):
            impl.varints(data, i64(s), i64(n), i64(c), np.empty(c, np.int64))
    with pytest.raises(ValueError):  # out does not hold sum(counts)
        impl.varints(b"\x01", i64(0), i64(1), i64(1), np.empty(2, np.int64))
    with pytest.raises(ValueError):  # out is not int64
        impl.varints(b"\x01", i64(0), i64(1), i64(1), np.empty(1, np.float64))
    with pytest.raises(ValueError):  # a negative count
        impl.varints(b"\x01", i64(0), i64(1), i64(-1), np.empty(0, np.int64))


def test_parse_batch_argument_checks(impl):
    buf, offsets, sizes = _corrupt_shard()
    with pytest.raises(ValueError):
        impl.parse_batch(buf, offsets, sizes[:2], (), True)
    with pytest.raises(ValueError):
        impl.parse_batch(buf, offsets.astype(np.int32), sizes, (), True)
    with pytest.raises(TypeError):
        impl.parse_batch(buf, offsets, sizes, ["label"], True)
    with pytest.raises(TypeError):
        impl.parse_batch(buf, offsets, sizes, ("label",), True)
    with pytest.raises(ValueError):
        impl.parse_batch(buf, offsets, sizes, (b"a", b"a"), True)
    # strided int64 columns are fine (a column of the spans array, say)
    wide = np.stack([offsets, sizes], axis=1)
    assert impl.parse_batch(buf, wide[:, 0], wide[:, 1], (b"label",), True) == impl.parse_batch(
        buf, offsets, sizes, (b"label",), True
    )


# ------------------------------------------------------------------------------ integration


def test_mmap_is_released_after_decode(impl, tmp_path):
    buf, offsets, sizes = small_shard(5)
    data = bytearray(buf)
    data[int(offsets[1]) + 15] ^= 1  # one bad record: its error must not pin the map
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(bytes(data))
    with path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    for bytes_as in ("padded", "list"):
        batch = check(SCHEMA, mm, offsets, sizes, bytes_as=bytes_as)
        assert [i for i, _ in batch.bad] == [1]
    mm.close()  # BufferError if anything still exported it


def test_large_records(impl):
    rng = np.random.default_rng(3)
    schema = Schema(image=Bytes(), label=Int64(), t=Tensor("uint8", (300_000,)))
    payloads = [
        schema.encode(
            {"image": rng.bytes(n), "label": n, "t": rng.integers(0, 255, 300_000, np.uint8)}
        )
        for n in (256 << 10, 1, 70_001)
    ]
    buf, offsets, sizes = shard(payloads)
    check(schema, buf, offsets, sizes)
    data = bytearray(buf)
    data[int(offsets[0]) + 200_000] ^= 4
    batch = check(schema, bytes(data), offsets, sizes)
    assert [i for i, _ in batch.bad] == [0]


def test_threads_share_a_decoder(impl):
    buf, offsets, sizes = small_shard(8)
    dec = BatchDecoder(SCHEMA)
    want = reference(SCHEMA, buf, offsets, sizes)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                assert_matches(dec, dec.decode(buf, offsets, sizes), want)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.timeout(60)
def test_native_calls_release_the_gil(native):
    """Another thread runs Python code while one thread is inside one long native call.

    With the switch interval set far beyond the test's length, the interpreter
    never forces a thread switch, so the main thread can run before the worker
    finishes only if a native call releases the GIL: not a timing assertion.
    """
    payload = SCHEMA.encode(sample(3) | {"image": bytes(1 << 20)})
    buf, offsets, sizes = shard([payload] * 16)
    keys = tuple(k.encode() for k in SCHEMA.names)
    rows, out = np.zeros(16, np.int64), np.empty((16, 1 << 20), np.uint8)
    calls = {
        "parse_batch": lambda: native.parse_batch(buf, offsets, sizes, keys, True),
        "crc32c": lambda: native.crc32c(buf),
        "gather": lambda: native.gather(buf, rows, rows + (1 << 20), out, 1 << 20),
    }
    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        for name, call in calls.items():
            done = []

            def worker(call=call, done=done) -> None:
                for _ in range(20):
                    call()
                    done.append(1)

            t = threading.Thread(target=worker)
            t.start()  # returns once the worker released the GIL
            seen = len(done)
            t.join()
            assert seen < 20, f"{name} held the GIL through every call"
    finally:
        sys.setswitchinterval(old)


# The task runner has no Python twin: without it, tasks go through the thread pool
# over BatchDecoder.decode, whose results tests/reader/test_runner.py compares it with.
RUNNER_ONLY = {"Runner", *_contract._RUNNER_ONLY}
# The .idx functions are recordkit.reader.index.text's (its NumPy twin parses whole
# texts; tests/reader/index/test_shard_index.py compares them).
INDEX_ONLY = {"FileMap", "map_fd", "index_parse", "index_scan", "index_fill"}
# The shuffle's permutation; its twin is recordkit/reader/order.py (tests/reader/test_order.py).
ORDER_ONLY = {"permute", "plan_order"}


def test_implementations_share_names_and_constants(native):
    names = sorted(n for n in dir(native) if n.isupper() or not n.startswith("_"))
    skip = RUNNER_ONLY | INDEX_ONLY | ORDER_ONLY
    names = [n for n in names if n not in skip and not n.startswith("INDEX_")]
    assert sorted(_fallback.__all__) == names
    for name in names:
        if name.isupper() and name != "CRC32C_IMPL":
            assert getattr(native, name) == getattr(_fallback, name), name


@pytest.mark.skipif(not os.environ.get("RECORDKIT_REQUIRE_NATIVE"), reason="native optional")
def test_native_extension_is_built():
    assert _native is not None, "recordkit.native._ext did not build (setup.py: optional=True)"
    assert decode.IMPLEMENTATION == "native"


def test_env_var_forces_the_fallback():
    code = "from recordkit.reader import decode; print(decode.IMPLEMENTATION)"
    env = dict(os.environ, RECORDKIT_NO_NATIVE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "fallback", out.stderr
    env["RECORDKIT_NO_NATIVE"] = ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == ("native" if _native is not None else "fallback"), out.stderr
