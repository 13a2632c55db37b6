import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recordkit.errors import CorruptRecordError, RecordTooLargeError, TruncatedRecordError
from recordkit.format import (
    crc32c,
    frame,
    iter_records,
    mask,
    masked_crc32c,
    read_record,
    read_stream,
    unmask,
)


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_crc32c_continues():
    assert crc32c(b"56789", crc32c(b"1234")) == crc32c(b"123456789")


def test_empty_payload_frame():
    assert frame(b"").hex() == "000000000000000029039807d8ea82a2"


def test_hello_frame():
    assert frame(b"hello").hex() == "0500000000000000eab2043e68656c6c6fbb1f1c19"


@given(st.integers(0, 2**32 - 1))
def test_mask_roundtrip(c):
    assert unmask(mask(c)) == c


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_frame_iter_roundtrip(payloads):
    buf = b"".join(frame(p) for p in payloads)
    got = [bytes(p) for _, p in iter_records(buf)]
    assert got == payloads


@given(st.lists(st.binary(max_size=100), min_size=1, max_size=10), st.data())
def test_any_truncation_is_detected(payloads, data):
    buf = b"".join(frame(p) for p in payloads)
    cut = data.draw(st.integers(1, len(buf) - 1))
    boundaries = set()
    pos = 0
    for p in payloads:
        pos += len(p) + 16
        boundaries.add(pos)
    if cut in boundaries:
        assert len(list(iter_records(buf[:cut]))) < len(payloads)
        return
    with pytest.raises(TruncatedRecordError) as info:
        list(iter_records(buf[:cut], path="x.tfrecord"))
    assert info.value.path == "x.tfrecord"
    assert info.value.offset is not None and info.value.record is not None


@given(st.lists(st.binary(max_size=100), min_size=1, max_size=10), st.data())
def test_a_stream_reads_and_fails_as_the_buffer_does(payloads, data):
    buf = bytearray(b"".join(frame(p) for p in payloads))
    assert list(read_stream(io.BytesIO(bytes(buf)))) == payloads
    if data.draw(st.booleans()):
        buf = buf[: data.draw(st.integers(1, len(buf) - 1))]
    else:
        buf[data.draw(st.integers(0, len(buf) - 1))] ^= 1 << data.draw(st.integers(0, 7))

    def outcome(records):
        try:
            return [bytes(p) for p in records], None
        except (CorruptRecordError, TruncatedRecordError) as exc:
            return None, (type(exc), exc.offset, exc.record)

    from_buffer = outcome(p for _, p in iter_records(bytes(buf), path="x"))
    from_stream = outcome(read_stream(io.BytesIO(bytes(buf)), path="x"))
    assert from_stream[0] == from_buffer[0]
    if from_buffer[1] is not None:  # same error class (or subclass), same place
        assert from_stream[1] is not None and from_stream[1][1:] == from_buffer[1][1:]
        assert issubclass(from_stream[1][0], CorruptRecordError) == issubclass(
            from_buffer[1][0], CorruptRecordError
        )


def test_partial_length_field_is_truncation_not_eof():
    buf = frame(b"abc") + frame(b"defg")[:5]
    with pytest.raises(TruncatedRecordError, match=r"x:19:1: partial record header"):
        list(iter_records(buf, path="x"))


@pytest.mark.parametrize("byte", range(len(frame(b"hello"))))
def test_every_single_bit_flip_is_detected(byte):
    good = bytearray(frame(b"hello"))
    for bit in range(8):
        bad = bytearray(good)
        bad[byte] ^= 1 << bit
        with pytest.raises(CorruptRecordError):
            list(iter_records(bytes(bad)))


def test_crc_mismatch_names_place_and_crcs():
    buf = bytearray(frame(b"a") + frame(b"hello"))
    buf[17 + 12] ^= 0x01  # first payload byte of record 1
    with pytest.raises(CorruptRecordError) as info:
        list(iter_records(bytes(buf), path="s.tfrecord"))
    err = info.value
    assert (err.path, err.offset, err.record) == ("s.tfrecord", 17, 1)
    assert err.expected_crc == masked_crc32c(b"hello")
    assert err.actual_crc != err.expected_crc
    assert "s.tfrecord:17:1: payload CRC mismatch" in str(err)
    assert isinstance(err, ValueError)


def test_huge_length_is_rejected_before_reading():
    length = struct.pack("<Q", 1 << 40)
    buf = length + struct.pack("<I", masked_crc32c(length)) + b"x" * 8
    with pytest.raises(RecordTooLargeError, match="exceeds max_record_bytes"):
        read_record(buf, 0)


def test_length_past_end_is_truncation():
    length = struct.pack("<Q", 1000)
    buf = length + struct.pack("<I", masked_crc32c(length)) + b"x" * 8
    with pytest.raises(TruncatedRecordError):
        read_record(buf, 0)


def test_expected_size_mismatch():
    with pytest.raises(CorruptRecordError, match="index says"):
        read_record(frame(b"abc"), 0, expected_size=20)


def test_read_record_is_zero_copy():
    buf = bytearray(frame(b"hello"))
    view = read_record(buf, 0)
    buf[12] = ord("j")
    assert bytes(view) == b"jello"
