"""Regenerate the golden TFRecord files in ``tests/data/golden/`` with real TensorFlow.

Every shard here is written by ``tf.io.TFRecordWriter``; payloads are ``tf.train.Example``
messages serialised by TensorFlow's own protobuf (``deterministic=True``, so a rerun with
the same TF/protobuf gives byte-identical files), except ``wire_variants.tfrecord``,
whose payloads are hand-encoded protobuf that TensorFlow accepts but never emits itself
(unpacked repeated fields, duplicate map keys, ...), and ``unknown_fields.tfrecord``,
whose Examples hold fields that their messages do not define: TensorFlow's parser
skips them (what they hold is dropped, silently), recordkit refuses each such record
with an ``UnknownFieldError`` naming the field. The script checks that TensorFlow
parses each of those the way this file says it does before writing it.

The tests (``tests/compat/test_golden.py``) do not trust expectations stored here: they
ask TensorFlow live what each record contains and compare recordkit against that.

Run from the repository root::

    python tests/data/make_golden.py

It rewrites every file in ``tests/data/golden/`` and ``README.md`` there, which records
the TensorFlow and protobuf versions used.
"""

from __future__ import annotations

import hashlib
import os
import platform
import struct
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf  # after TF_CPP_MIN_LOG_LEVEL is set, or TF logs at import

GOLDEN = Path(__file__).resolve().parent / "golden"

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

# The >16 MiB record: just past 2**24 so that any 24-bit length assumption breaks, and an
# odd tail so that the size is not a multiple of the pattern or a page. A repeating
# 251-byte pattern (prime, so it never lines up with powers of two) keeps git's zlib copy
# of the file tiny.
LARGE_PAYLOAD_BYTES = 2**24 + 4099
LARGE_PATTERN = bytes((i * 37 + 11) % 256 for i in range(251))


def _f32(bits: int) -> float:
    """The Python float whose float32 rounding has exactly these bits."""
    return float(np.uint32(bits).view(np.float32))


def _bytes(*values: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _ints(*values: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def _floats(*values: float) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))


def _example(features: dict[str, tf.train.Feature]) -> bytes:
    example = tf.train.Example(features=tf.train.Features(feature=features))
    return example.SerializeToString(deterministic=True)


# --------------------------------------------------------------------------------------
# scalars.tfrecord: one fixed-shape schema for every record, so a reader can infer it.


def scalars_records() -> list[bytes]:
    labels = [0, 1, -1, I64_MIN, I64_MAX, 2**31, -(2**31) - 1]
    names = [b"", b"a", b"\x00\xff\x00", "caf\u00e9 \U0001f600".encode(), b"x" * 300, b"\n", b"z"]
    scores = [
        0.0,
        _f32(0x80000000),  # -0.0
        float("inf"),
        float("-inf"),
        float("nan"),
        _f32(0x00000001),  # smallest subnormal
        _f32(0x7F7FFFFF),  # float32 max
    ]
    records = []
    for i, (label, name, score) in enumerate(zip(labels, names, scores, strict=True)):
        records.append(
            _example(
                {
                    "label": _ints(label),
                    "name": _bytes(name),
                    "score": _floats(score),
                    "triple": _ints(i, -i, I64_MIN + i),
                    "quad": _floats(
                        float(i) / 3.0,
                        _f32(0xFFC00000),  # -nan
                        _f32(0x7FC00001),  # quiet nan with a payload
                        -float(i) * 1e30,
                    ),
                }
            )
        )
    return records


# --------------------------------------------------------------------------------------
# lists.tfrecord: the same keys and kinds in every record, list lengths vary (incl. 0).


def lists_records() -> list[bytes]:
    tags = [
        [b"one"],
        [],
        [b"a", b"", b"c\x00d"],
        [b"\xff" * 17, b"q"],
        [],
    ]
    ids = [[1, 2, 3], [], [I64_MIN, I64_MAX, -1, 0], [42], [7] * 33]
    weights = [
        [0.5],
        [float("nan"), float("inf"), float("-inf"), -0.0],
        [],
        [1e-45, 3.4028234663852886e38, -1.5],
        [float(v) for v in range(20)],
    ]
    return [
        _example({"tags": _bytes(*t), "ids": _ints(*i), "weights": _floats(*w)})
        for t, i, w in zip(tags, ids, weights, strict=True)
    ]


# --------------------------------------------------------------------------------------
# edge.tfrecord: records that differ from each other on purpose.


def edge_records() -> list[bytes]:
    return [
        # An Example with no features at all: serialises to zero bytes of Features body.
        tf.train.Example().SerializeToString(deterministic=True),
        # An Example whose Features message is present but empty.
        _example({}),
        # A zero-length record: legal framing, an empty payload (parses as an empty Example).
        b"",
        # Unicode and punctuation in keys.
        _example(
            {
                "caf\u00e9": _ints(1),
                "\u65e5\u672c\u8a9e/\u30ad\u30fc": _bytes("\u5024".encode()),
                "emoji \U0001f680": _floats(2.5),
                "with/slash and space": _ints(-3),
                "\u00df\u0130\u03a3": _bytes(b""),
            }
        ),
        # Empty lists of every kind next to non-empty ones.
        _example(
            {
                "empty_bytes": _bytes(),
                "empty_int64": _ints(),
                "empty_float": _floats(),
                "one_empty_value": _bytes(b""),
                "many": _ints(*range(-5, 300, 7)),
            }
        ),
        # A Feature with no kind set at all (the `kind` oneof is empty).
        _example({"no_kind": tf.train.Feature(), "x": _ints(5)}),
        # Mixed kinds, multi-valued, extreme values.
        _example(
            {
                "b": _bytes(b"\x00", b"\x01\x02", b"", b"\xff" * 1000),
                "i": _ints(I64_MIN, -1, 0, 1, I64_MAX, 2**32, -(2**32)),
                "f": _floats(
                    float("inf"), float("-inf"), float("nan"), -0.0, 0.0, _f32(0x00800000)
                ),
            }
        ),
    ]


# --------------------------------------------------------------------------------------
# wire_variants.tfrecord: valid protobuf encodings that TF's serialiser never produces.
# Only encodings where tf.train.Example.FromString and tf.io.parse_single_example agree
# are included (TF's fast parser keeps only the first chunk of a packed field split in
# two, which protobuf concatenates: no single "TF answer" exists for that, so it is out).


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _ld(field: int, body: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(body)) + body


def _entry(key: str, feature: bytes, *, value_first: bool = False) -> bytes:
    k, v = _ld(1, key.encode()), _ld(2, feature)
    return _ld(1, v + k if value_first else k + v)


def _raw_example(*entries: bytes, trailer: bytes = b"") -> bytes:
    return _ld(1, b"".join(entries)) + trailer


def _packed_ints(*values: int) -> bytes:
    return _ld(3, _ld(1, b"".join(_varint(v) for v in values)))


# (name, payload, what FromString must give: {key: (kind, values)})
WireCase = tuple[str, bytes, dict[str, tuple[str | None, list[object]]]]


def wire_cases() -> list[WireCase]:
    unpacked_ints = [1, -1, I64_MAX, I64_MIN]
    unpacked_floats = [1.5, -0.0, float("inf")]
    return [
        (
            "unpacked int64_list",
            _raw_example(
                _entry("a", _ld(3, b"".join(_tag(1, 0) + _varint(v) for v in unpacked_ints)))
            ),
            {"a": ("int64_list", unpacked_ints)},
        ),
        (
            "unpacked float_list",
            _raw_example(
                _entry(
                    "a",
                    _ld(2, b"".join(_tag(1, 5) + struct.pack("<f", v) for v in unpacked_floats)),
                )
            ),
            {"a": ("float_list", unpacked_floats)},
        ),
        (
            "duplicate map key: the last entry wins",
            _raw_example(_entry("d", _packed_ints(1)), _entry("d", _packed_ints(2))),
            {"d": ("int64_list", [2])},
        ),
        (
            "duplicate map key with a different kind: the last entry wins",
            _raw_example(_entry("d", _packed_ints(1)), _entry("d", _ld(1, _ld(1, b"x")))),
            {"d": ("bytes_list", [b"x"])},
        ),
        (
            "map entry with the value before the key",
            _raw_example(_entry("v", _packed_ints(7), value_first=True)),
            {"v": ("int64_list", [7])},
        ),
        (
            "Example.features given twice: the two messages merge",
            _raw_example(_entry("a", _packed_ints(1))) + _raw_example(_entry("b", _packed_ints(2))),
            {"a": ("int64_list", [1]), "b": ("int64_list", [2])},
        ),
        (
            "map entry without a value: a Feature with no kind",
            _raw_example(_ld(1, _ld(1, b"nv"))),
            {"nv": (None, [])},
        ),
        (
            "map entry without a key: the empty key",
            _raw_example(_ld(1, _ld(2, _packed_ints(4)))),
            {"": ("int64_list", [4])},
        ),
    ]


def unknown_field_cases() -> list[WireCase]:
    """Examples with a field their message does not define: TensorFlow skips it."""
    return [
        (
            "fields in the Example itself (a newer writer's top-level fields)",
            _raw_example(
                _entry("a", _packed_ints(1)),
                trailer=_tag(15, 2) + _varint(3) + b"abc" + _tag(14, 5) + b"\0\0\0\0",
            ),
            {"a": ("int64_list", [1])},
        ),
        (
            "a varint in a Feature, after its list",
            _raw_example(_entry("a", _packed_ints(1) + _tag(9, 0) + _varint(5))),
            {"a": ("int64_list", [1])},
        ),
        (
            "a varint in an Int64List, between its values",
            _raw_example(
                _entry(
                    "a", _ld(3, _ld(1, _varint(1)) + _tag(2, 0) + _varint(7) + _ld(1, _varint(2)))
                )
            ),
            {"a": ("int64_list", [1, 2])},
        ),
        (
            "a fixed32 in a BytesList",
            _raw_example(_entry("b", _ld(1, _ld(1, b"x") + _tag(5, 5) + b"\0\0\0\0"))),
            {"b": ("bytes_list", [b"x"])},
        ),
        (
            "a varint in a map entry, after its value (protobuf then drops the whole entry; "
            "tf.io.parse_example refuses the record)",
            _raw_example(_ld(1, _ld(1, b"c") + _ld(2, _packed_ints(3)) + _tag(3, 0) + _varint(1))),
            {},
        ),
        (
            "floats as fixed64 values (a known field number, another wire type)",
            _raw_example(_entry("f", _ld(2, _tag(1, 1) + b"\0" * 8))),
            {"f": ("float_list", [])},
        ),
    ]


def _check_wire_case(name: str, payload: bytes, expected: dict[str, tuple]) -> None:
    example = tf.train.Example.FromString(payload)
    got = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        got[key] = (kind, list(getattr(feature, kind).value) if kind else [])
    # repr, not ==: nan != nan, and -0.0 == 0.0 would hide a sign. Sorted: map order is free.
    if repr(sorted(got.items())) != repr(sorted(expected.items())):
        raise AssertionError(f"wire case {name!r}: TF parses {got!r}, expected {expected!r}")


# --------------------------------------------------------------------------------------
# large.tfrecord: one record over 16 MiB, then a small one to prove framing resumes.


def large_records() -> list[bytes]:
    reps, tail = divmod(LARGE_PAYLOAD_BYTES, len(LARGE_PATTERN))
    blob = LARGE_PATTERN * reps + LARGE_PATTERN[:tail]
    big = _example({"blob": _bytes(blob), "id": _ints(0)})
    assert len(big) > 16 * 2**20, len(big)
    return [big, _example({"blob": _bytes(b"small"), "id": _ints(1)})]


# --------------------------------------------------------------------------------------

FILES: dict[str, tuple[Callable[[], list[bytes]], str]] = {
    "scalars.tfrecord": (
        scalars_records,
        "one fixed-shape schema in every record: int64/bytes/float scalars, a 3-int64 and "
        "a 4-float list; extreme int64, inf/-inf/nan/-0.0/subnormal/float32-max, "
        "nan payloads",
    ),
    "lists.tfrecord": (
        lists_records,
        "same keys and kinds in every record, variable list lengths including empty lists",
    ),
    "edge.tfrecord": (
        edge_records,
        "heterogeneous: Example with no features, empty Features, a zero-length record "
        "(written with TFRecordWriter.write(b'')), unicode keys, empty lists of each kind, "
        "a Feature with no kind, multi-valued lists with extreme values",
    ),
    "wire_variants.tfrecord": (
        lambda: [payload for _, payload, _ in wire_cases()],
        "hand-encoded valid protobuf TF accepts but never writes: "
        + "; ".join(name for name, _, _ in wire_cases()),
    ),
    "unknown_fields.tfrecord": (
        lambda: [payload for _, payload, _ in unknown_field_cases()],
        "fields that their message does not define, which TensorFlow skips and recordkit "
        "refuses (UnknownFieldError): " + "; ".join(name for name, _, _ in unknown_field_cases()),
    ),
    "large.tfrecord": (
        large_records,
        f"a {LARGE_PAYLOAD_BYTES}-byte bytes value (>16 MiB record, repeating "
        f"{len(LARGE_PATTERN)}-byte pattern so git stores it small), then a small record",
    ),
}


def _write(path: Path, records: list[bytes]) -> None:
    tmp = path.with_name(path.name + ".tmp-make_golden")
    with tf.io.TFRecordWriter(str(tmp)) as writer:
        for record in records:
            writer.write(record)
    os.replace(tmp, path)


def _readme(rows: list[tuple[str, int, int, str, str]]) -> str:
    lines = [
        "# Golden TFRecord files",
        "",
        "Generated by `python tests/data/make_golden.py` (do not edit by hand) with:",
        "",
        f"- TensorFlow {tf.__version__}",
        f"- protobuf {_protobuf_version()}",
        f"- numpy {np.__version__}",
        f"- Python {platform.python_version()} on {platform.system()} {platform.machine()}",
        "",
        "Each file is written by `tf.io.TFRecordWriter` (no compression). The tests ask",
        "TensorFlow live what each record holds; nothing here stores expected values.",
        "",
        "| file | records | bytes | sha256 | contents |",
        "|---|---:|---:|---|---|",
    ]
    for name, count, size, digest, about in rows:
        lines.append(f"| `{name}` | {count} | {size} | `{digest[:16]}` | {about} |")
    return "\n".join(lines) + "\n"


def _protobuf_version() -> str:
    import google.protobuf

    return str(google.protobuf.__version__)


def main() -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, payload, expected in wire_cases() + unknown_field_cases():
        _check_wire_case(name, payload, expected)
    rows = []
    for name, (make, about) in FILES.items():
        records = make()
        path = GOLDEN / name
        _write(path, records)
        data = path.read_bytes()
        rows.append((name, len(records), len(data), hashlib.sha256(data).hexdigest(), about))
        print(f"wrote {path} ({len(records)} records, {len(data)} bytes)")
    (GOLDEN / "README.md").write_text(_readme(rows), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
