"""Lists of bytes made for the whole batch: ``bytes_lists`` (native and its twin) and the
records :class:`BatchDecoder` takes through it, against the reference decoder."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recordkit.codec import Bytes, Int64, Schema, encode_example
from recordkit.reader import _fallback, decode
from recordkit.reader.decode import BatchDecoder
from tests.reader.test_decode import (
    byteslist,
    check,
    entry,
    example,
    field,
    packed_ints,
    shard,
    slow_ok,
)

from .conftest import IMPLS


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def value(v: bytes) -> bytes:
    return field(1, 2, v)  # BytesList.value


# ------------------------------------------------------------------------ bytes_lists


def test_bytes_lists_walks_each_list_from_its_first_value(impl):
    long = bytes(range(256)) * 3  # a length of two varint bytes
    data = b"??" + value(b"abc") + value(b"") + value(long) + value(b"d")
    first = data.index(b"abc")
    last = len(data) - 1
    got = impl.bytes_lists(data, i64(first, 0, last), i64(3, 0, 1), i64(3, 0, 1))
    assert got == [[b"abc", b"", long], [], [b"d"]]
    assert all(type(v) is bytes for vs in got for v in vs)
    flat = impl.bytes_lists(data, i64(first, 0, last), i64(3, 0, 1), None)
    assert flat == [b"abc", b"", b"d"]  # one value each: the first (nbytes 0: b"")
    assert impl.bytes_lists(b"", i64(), i64(), i64()) == []
    assert impl.bytes_lists(memoryview(data)[2:], i64(first - 2), i64(3), i64(1)) == [[b"abc"]]


def test_bytes_lists_refuses_what_does_not_hold_its_count(impl):
    data = value(b"ab") + value(b"c")
    bad = [
        (i64(2), i64(2), i64(3), "record 0: a value after the first is not framed"),
        (i64(2), i64(9), i64(1), "record 0: the span is outside the buffer"),
        (i64(-1), i64(1), i64(1), "record 0: the span is outside the buffer"),
        (i64(0, 2), i64(0, 2), i64(0, 2), None),  # fine: the control
    ]
    for starts, nbytes, counts, says in bad:
        if says is None:
            assert impl.bytes_lists(data, starts, nbytes, counts) == [[], [b"ab", b"c"]]
            continue
        with pytest.raises(ValueError, match=says):
            impl.bytes_lists(data, starts, nbytes, counts)
    cut = value(b"ab") + b"\x0a\x05xy"  # the second value's length runs past the end
    with pytest.raises(ValueError, match="record 0: a value runs past the end of the buffer"):
        impl.bytes_lists(cut, i64(2), i64(2), i64(2))
    with pytest.raises(ValueError, match=r"counts\[1\] = -1 is invalid"):
        impl.bytes_lists(data, i64(2, 2), i64(2, 2), i64(1, -1))
    with pytest.raises(ValueError, match="differ in length"):
        impl.bytes_lists(data, i64(2, 2), i64(2), i64(1, 1))


@given(st.lists(st.lists(st.binary(max_size=300), max_size=6), max_size=20))
@slow_ok(60)
def test_bytes_lists_twins_agree(lists):
    data = b"".join(b"".join(value(v) for v in vs) + b"\x00" for vs in lists)
    starts, nbytes, counts, at = [], [], [], 0
    for vs in lists:
        body = b"".join(value(v) for v in vs)
        head = len(value(vs[0])) - len(vs[0]) if vs else 0
        starts.append(at + head if vs else 0)
        nbytes.append(len(vs[0]) if vs else 0)
        counts.append(len(vs))
        at += len(body) + 1
    args = (data, i64(*starts), i64(*nbytes), i64(*counts))
    for module in IMPLS.values():
        if module is not None:
            assert module.bytes_lists(*args) == lists


# ----------------------------------------------------------------- spans and decoding


def _merged(key: bytes, *lists: list[bytes]) -> bytes:
    """One features entry whose Feature holds several BytesList submessages."""
    feature = b"".join(byteslist(*vs) for vs in lists)
    return entry(key, feature)


def test_a_bytes_list_in_several_submessages_is_complex_in_both_twins():
    payloads = [
        example(entry(b"t", byteslist(b"a", b"b"))),
        example(_merged(b"t", [b"a"], [b"b"])),
        example(_merged(b"t", [], [b"b"])),
    ]
    buf, offsets, sizes = shard(payloads)
    got = []
    for module in IMPLS.values():
        if module is None:
            continue
        _, spans = module.parse_batch(buf, offsets, sizes, (b"t",), True)
        got.append(np.frombuffer(spans, np.int64).reshape(3, 4)[:, :2].tolist())
    kb, complex_ = _fallback.KIND_BYTES, _fallback.KIND_BYTES | _fallback.KIND_COMPLEX
    assert got[0] == [[kb, 2], [complex_, 2], [complex_, 1]]
    assert all(g == got[0] for g in got)


SCHEMA = Schema(
    tags=Bytes((None,), default=[]),
    pair=Bytes((2,)),
    must=Bytes((None,)),
    label=Int64(),
)


def _records() -> list[bytes]:
    """Every way a record can hold (or not hold) its lists of bytes."""
    good = [
        entry(b"pair", byteslist(b"p", b"q")),
        entry(b"must", byteslist(b"m")),
        entry(b"label", packed_ints(1)),
    ]
    out = []
    for tags in (
        entry(b"tags", byteslist(b"x" * 200, b"", b"y")),  # a two-byte length
        entry(b"tags", byteslist()),  # present, empty
        b"",  # absent: the default []
        entry(b"tags", b""),  # a Feature with no list set
        _merged(b"tags", [b"a"], [b"b", b"c"]),  # merged: per record
        entry(b"tags", packed_ints(3)),  # another kind: the reference's error
    ):
        out.append(example(tags, *good))
    out.append(example(entry(b"pair", byteslist(b"p")), *good[1:]))  # one of two: an error
    out.append(example(*good[:1], *good[2:]))  # `must` absent: an error
    out.append(example(entry(b"must", b""), *good[:1], *good[2:]))  # no list set
    out.append(example(*good, entry(b"pair", byteslist(b"r", b"s"))))  # a later entry wins
    return out


@pytest.mark.parametrize("bytes_as", ["padded", "list"])
def test_every_way_a_record_holds_a_list_decodes_as_the_reference(impl, bytes_as):
    buf, offsets, sizes = shard(_records() * 3)
    batch = check(SCHEMA, buf, offsets, sizes, bytes_as=bytes_as)
    assert batch.bad and batch.n  # both kinds are here
    check(SCHEMA, buf, offsets, sizes, columns=["pair", "label"], bytes_as=bytes_as)


@given(
    st.lists(
        st.tuples(st.lists(st.binary(max_size=150), max_size=4), st.binary(max_size=40)),
        min_size=1,
        max_size=30,
    )
)
@slow_ok(40)
def test_lists_and_bytes_as_list_match_the_reference(rows):
    schema = Schema(tags=Bytes((None,)), one=Bytes())
    payloads = [
        encode_example({"tags": ("bytes", tags), "one": ("bytes", [one])}) for tags, one in rows
    ]
    buf, offsets, sizes = shard(payloads)
    for module in IMPLS.values():
        if module is None:
            continue
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(decode, "_impl", module)
            batch = BatchDecoder(schema, bytes_as="list").decode(buf, offsets, sizes)
        assert batch.columns["tags"] == [tags for tags, _ in rows]
        assert batch.columns["one"] == [one for _, one in rows]
