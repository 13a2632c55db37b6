"""The runner's packed and list columns (``COL_PACKED``, ``COL_PACKED_INT64``,
``COL_BYTES_LIST``; ``recordkit.tf``'s ragged numbers and lists of bytes), against the
reference decoder: values, sizes, the room a task needs, and what they refuse."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from recordkit.codec import Bytes, Float32, Int64, Schema, Tensor, encode_example
from recordkit.codec.wire import varint
from recordkit.format.framing import frame
from recordkit.reader import _contract, decode
from recordkit.reader._contract import ColumnSpec
from recordkit.reader.decode import BatchDecoder

pytestmark = pytest.mark.skipif(
    decode.IMPLEMENTATION != "native", reason="the runner is part of the native extension"
)

C = _contract
SCHEMA = Schema(
    i=Int64(),
    il=Int64((None,)),
    f2=Float32((None, 2)),
    t=Tensor("int16", (None,)),
    bl=Bytes((None,)),
)
LISTS = {
    "il": ColumnSpec(C.COL_PACKED_INT64, 0, 0, 1, False, C.KIND_INT64, True),
    "f2": ColumnSpec(C.COL_PACKED, 0, 8, 0, True, C.KIND_FLOAT, True),
    "t": ColumnSpec(C.COL_PACKED, 0, 2, 0, True, C.KIND_BYTES, False),
    "bl": ColumnSpec(C.COL_BYTES_LIST, 0, 0, 0, False, C.KIND_BYTES, True),
}


def _records(n: int, big: bool, seed: int = 0) -> list[dict[str, tuple[str | None, Any]]]:
    """Records of the schema: lists of 0 to 5 (big: floats of 5,000 and more, the fused
    two-pass path), int64s of 1 to 10 bytes, some features absent (ragged: no values)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        m = int(rng.integers(0, 6))
        rec: dict[str, tuple[str | None, Any]] = {
            "i": ("int64", [k]),
            "il": ("int64", [(-1) ** j * 9**j for j in range(m * 3)]),
            "f2": ("float", rng.standard_normal(2 * (m + 2500 * big)).astype(np.float32)),
            "t": ("bytes", [rng.integers(-(2**15), 2**15, m, dtype=np.int16).tobytes()]),
            "bl": ("bytes", [rng.bytes(j * 3) for j in range(m)]),
        }
        if k % 7 == 3:
            del rec["il"], rec["bl"]
        if k % 11 == 5:
            rec["f2"] = (None, [])  # a Feature with no list set
        out.append(rec)
    return out


def _task(payloads: list[bytes]) -> tuple[bytes, np.ndarray]:
    framed = [frame(p) for p in payloads]
    sizes = np.array([len(f) for f in framed], np.int64)
    table = np.zeros((len(framed), 3), np.int64)
    table[:, 1] = np.cumsum(sizes) - sizes
    table[:, 2] = sizes
    return b"".join(framed), table


def _runner(
    schema: Schema = SCHEMA, lists: dict[str, ColumnSpec] = LISTS
) -> tuple[Any, BatchDecoder]:
    dec = BatchDecoder(schema, bytes_as="padded", ragged_as="list")
    runner = dec.packed_runner(lists)
    assert runner is not None
    return runner, dec


def _outs(dec: BatchDecoder, n: int, rooms: list[int]) -> tuple[np.ndarray, ...]:
    fixed = [p for p in dec.plans if p.mode != "list"]
    outs = list(_contract.task_outputs(fixed, n, [], np.empty))
    r = iter(rooms)
    for p in dec.plans:
        if p.mode != "list":
            continue
        mode = LISTS[p.name].mode
        outs.append(np.zeros(next(r), np.int64 if mode == C.COL_PACKED_INT64 else np.uint8))
        if mode == C.COL_BYTES_LIST:
            outs.append(np.zeros(next(r), np.int64))
        outs.append(np.full(n, -1, np.int64))
    return tuple(outs)


def _check(outs: tuple[np.ndarray, ...], needs: tuple[int, ...], recs: list[dict]) -> None:
    """The slots hold each record's values as the reference decoder gives them."""
    label, il, il_n, f2, f2_n, t, t_n, bl, bl_len, bl_n = outs
    assert label.tolist() == list(range(len(recs)))
    want_il = [list(r["il"][1]) if "il" in r else [] for r in recs]
    assert il_n.tolist() == [len(v) for v in want_il]
    assert il[: needs[1]].tolist() == [x for v in want_il for x in v] and needs[1] == sum(
        map(len, want_il)
    )
    want_f2 = [
        np.asarray(r["f2"][1], np.float32) if r["f2"][0] else np.empty(0, np.float32) for r in recs
    ]
    assert f2_n.tolist() == [4 * len(v) for v in want_f2]
    assert f2[: needs[3]].tobytes() == b"".join(v.tobytes() for v in want_f2)
    assert t_n.tolist() == [len(r["t"][1][0]) for r in recs]
    assert t[: needs[5]].tobytes() == b"".join(r["t"][1][0] for r in recs)
    want_bl = [r["bl"][1] if "bl" in r else [] for r in recs]
    assert bl_n.tolist() == [len(v) for v in want_bl]
    flat = [x for v in want_bl for x in v]
    assert bl_len[: needs[8]].tolist() == [len(x) for x in flat]
    assert bl[: needs[7]].tobytes() == b"".join(flat)


@pytest.mark.parametrize("big", [False, True], ids=["one pass", "fused two passes"])
def test_packed_and_list_columns_hold_each_records_values(big: bool) -> None:
    recs = _records(40, big)
    buf, table = _task([encode_example(r) for r in recs])
    runner, dec = _runner()
    payload = int(table[:, 2].sum())
    outs = _outs(dec, len(recs), [payload, payload, payload, payload, payload // 2])
    ok, _, needs = runner.run((buf,), table, outs)
    assert ok
    _check(outs, needs, recs)


def test_a_task_too_big_for_its_room_says_what_it_needs() -> None:
    """Too little room: not done, and ``needs`` counts every record's values (the
    decoder counts on past the room); run again with that much, it is done."""
    recs = _records(30, False, seed=4)
    buf, table = _task([encode_example(r) for r in recs])
    runner, dec = _runner()
    ok, _, needs = runner.run((buf,), table, _outs(dec, len(recs), [3, 1, 1, 2, 1]))
    assert not ok
    rooms = [needs[1], needs[3], needs[5], needs[7], needs[8]]
    assert all(rooms)
    outs = _outs(dec, len(recs), rooms)
    ok, _, again = runner.run((buf,), table, outs)
    assert ok and again == needs
    _check(outs, again, recs)


def _field(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + varint(len(body)) + body


def _merged_bytes_list() -> bytes:
    """An Example whose "bl" Feature holds two BytesLists (protobuf merges them)."""
    first = _field(0x0A, _field(0x0A, b"ab"))
    second = _field(0x0A, _field(0x0A, b"cd") + _field(0x0A, b"e"))
    entry = _field(0x0A, b"bl") + _field(0x12, first + second)
    return _field(0x0A, _field(0x0A, entry))


@pytest.mark.parametrize(
    "case",
    [
        "merged bytes lists",
        "floats where int64s",
        "a float count the shape refuses",
        "absent tensor",
        "two tensor values",
    ],
)
def test_what_the_columns_refuse_is_left_to_the_reference(case: str) -> None:
    """Not done, with no more room asked for: the reference decoder then decides (the
    merged list's three values; an error)."""
    schema = Schema(
        bl=Bytes((None,)), il=Int64((None,)), f2=Float32((None, 2)), t=Tensor("int16", (None,))
    )
    good = {
        "bl": ("bytes", [b"x"]),
        "il": ("int64", [1]),
        "f2": ("float", [1, 2]),
        "t": ("bytes", [b"\0\0"]),
    }
    bad = dict(good)
    if case == "floats where int64s":
        bad["il"] = ("float", [1.0])
    elif case == "a float count the shape refuses":
        bad["f2"] = ("float", [1.0, 2.0, 3.0])
    elif case == "absent tensor":
        del bad["t"]
    elif case == "two tensor values":
        bad["t"] = ("bytes", [b"\0\0", b"\0\0"])
    payloads = [encode_example(good), encode_example(bad), encode_example(good)]
    if case == "merged bytes lists":
        payloads[1] = _merged_bytes_list() + encode_example(
            {k: v for k, v in good.items() if k != "bl"}
        )
    buf, table = _task(payloads)
    dec = BatchDecoder(schema, bytes_as="padded", ragged_as="list")
    runner = dec.packed_runner(LISTS)
    outs: list[np.ndarray] = []
    for p in dec.plans:
        mode = LISTS[p.name].mode
        outs.append(np.zeros(64, np.int64 if mode == C.COL_PACKED_INT64 else np.uint8))
        if mode == C.COL_BYTES_LIST:
            outs.append(np.zeros(64, np.int64))
        outs.append(np.zeros(3, np.int64))
    ok, _, needs = runner.run((buf,), table, tuple(outs))
    assert not ok and max(needs) <= 64
    ref = dec.decode(buf, table[:, 1], table[:, 2])
    if case == "merged bytes lists":
        assert not ref.bad and ref.columns["bl"][1] == [b"ab", b"cd", b"e"]
    else:
        assert [pos for pos, _ in ref.bad] == [1]


def test_bad_column_specs_and_outputs_are_refused() -> None:
    dec = BatchDecoder(Schema(il=Int64((None,))), bytes_as="padded", ragged_as="list")
    with pytest.raises(ValueError, match="bad spec"):
        dec.packed_runner({"il": ColumnSpec(6, 0, 0, 0, False, 0, True)})
    with pytest.raises(ValueError, match="bad spec"):
        dec.packed_runner({"il": ColumnSpec(C.COL_PACKED, 0, 0, 0, False, C.KIND_INT64, True)})
    runner = dec.packed_runner({"il": LISTS["il"]})
    buf, table = _task([encode_example({"il": ("int64", [1, 2])})] * 2)
    with pytest.raises(ValueError, match="lengths output must hold 2"):
        runner.run((buf,), table, (np.zeros(4, np.int64), np.zeros(3, np.int64)))
    with pytest.raises(ValueError, match="values output must hold int64"):
        runner.run((buf,), table, (np.zeros(5, np.uint8), np.zeros(2, np.int64)))
    with pytest.raises(ValueError, match="expected 2 output buffers"):
        runner.run((buf,), table, (np.zeros(4, np.int64),))
    # a zstd tensor, or a list feature given no column: no runner
    zstd = BatchDecoder(Schema(z=Tensor("int8", (None,), compression="zstd")), ragged_as="list")
    assert zstd.packed_runner({}) is None
    assert dec.packed_runner({}) is None


@pytest.mark.parametrize("big", [False, True], ids=["one pass", "fused two passes"])
def test_a_bad_payload_crc_is_refused(big: bool) -> None:
    """A byte flipped inside a packed value: the payload CRC (fused with that value's
    copy for large records) refuses the task."""
    recs = _records(6, big, seed=9)
    buf, table = _task([encode_example(r) for r in recs])
    at = int(table[3, 1]) + int(table[3, 2]) // 2  # inside record 3 (its floats, when big)
    bad = bytearray(buf)
    bad[at] ^= 0x40
    runner, dec = _runner()
    payload = int(table[:, 2].sum())
    rooms = [payload, payload, payload, payload, payload // 2]
    assert runner.run((buf,), table, _outs(dec, 6, rooms))[0]
    ok, _, needs = runner.run((bytes(bad),), table, _outs(dec, 6, rooms))
    assert not ok and all(
        need <= room
        for need, room in zip([needs[1], needs[3], needs[5], needs[7], needs[8]], rooms)
    )
