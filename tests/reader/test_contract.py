"""The native decoder's contract (recordkit/reader/_contract.py) against the C side."""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest

from recordkit.codec import Bytes, Float32, Int64, Schema, Tensor
from recordkit.reader import _contract, _fallback
from recordkit.reader.decode import BatchDecoder

try:
    from recordkit.native import _ext as _native
except ImportError:  # built without a compiler
    _native = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]


def _header_enums() -> dict[str, int]:
    """The ST_*, KIND_* and COL_* enumerators of recordkit/native/recordkit.h, by Python name."""
    text = (ROOT / "recordkit" / "native" / "recordkit.h").read_text()
    found = {}
    for prefix, rest, value in re.findall(
        r"\b(ST|KIND|COL)_([A-Z_0-9]+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)", text
    ):
        py = ("STATUS_" if prefix == "ST" else prefix + "_") + rest
        found[py] = int(value, 0)
    return found


def test_the_header_defines_the_contracts_constants():
    enums = _header_enums()
    shared = [n for n in _contract.__all__ if n.startswith(("STATUS_", "KIND_", "COL_"))]
    assert sorted(enums) == sorted(shared)
    for name in shared:
        assert enums[name] == getattr(_contract, name), name


def test_the_fallback_takes_its_constants_from_the_contract():
    for name in _contract.__all__:
        if name.startswith(("STATUS_", "KIND_")):
            assert getattr(_fallback, name) == getattr(_contract, name), name


@pytest.mark.skipif(_native is None, reason="recordkit.native._ext is not built")
def test_the_built_extension_agrees():
    _contract.check(_native)  # raises on any difference


def test_an_extension_that_disagrees_is_refused():
    fake = types.ModuleType("recordkit.native._ext")
    for name in _contract.__all__:
        if name.startswith(("STATUS_", "KIND_")):
            setattr(fake, name, getattr(_contract, name))
    _contract.check(fake)  # no Runner: its COL_* are not needed
    fake.STATUS_MALFORMED = 9
    with pytest.raises(ImportError, match=r"STATUS_MALFORMED.*rebuild"):
        _contract.check(fake)
    fake.STATUS_MALFORMED = _contract.STATUS_MALFORMED
    fake.Runner = object
    with pytest.raises(ImportError, match="COL_BYTES, COL_FIXED, COL_INT64"):
        _contract.check(fake)


def test_slots_and_specs_follow_the_schema_order():
    schema = Schema(
        {
            "image": Bytes(),
            "label": Int64(),
            "emb": Float32(shape=(4,)),
            "t": Tensor("uint16", (2, 3)),
        }
    )
    dec = BatchDecoder(schema)
    plans = dec.plans
    assert [_contract.column_spec(p) for p in plans] == [
        (_contract.COL_BYTES, 0, 0, 0, True, _contract.KIND_ABSENT, False),
        (_contract.COL_INT64, 1, 0, 1, False, _contract.KIND_ABSENT, False),
        (_contract.COL_FIXED, 2, 16, 0, True, _contract.KIND_ABSENT, False),
        (_contract.COL_FIXED, 3, 12, 0, True, _contract.KIND_ABSENT, False),
    ]
    assert [_contract.expected(p) for p in plans] == [
        (_contract.KIND_BYTES, 1, _contract.ANY),
        (_contract.KIND_INT64, 1, _contract.ANY),
        (_contract.KIND_FLOAT, 4, 16),
        (_contract.KIND_BYTES, 1, 12),
    ]
    outs = _contract.task_outputs(plans, 3, [5], np.empty)
    assert [(o.shape, o.dtype.str) for o in outs] == [
        ((15,), "|u1"),
        ((3,), "<i8"),
        ((3,), "<i8"),
        ((3, 4), "<f4"),
        ((3, 2, 3), "<u2"),
    ]
    outs[0][:] = np.arange(15, dtype=np.uint8)
    cols = _contract.task_columns(plans, outs, [2, 1, 16, 12], 3)
    assert list(cols) == ["image", "image/lengths", "label", "emb", "t"]
    assert cols["image"].tolist() == [[0, 1], [2, 3], [4, 5]]  # rows closed up to width 2


def test_width_guesses():
    guess = _contract.WidthGuess(["a", "b"])
    assert guess.widths(100) == [100, 100]  # nothing seen: the longest payload
    guess.observe({"a": np.zeros((2, 10)), "b": np.zeros((2, 7))})
    assert guess.widths(100) == [10, 7]  # one width so far: exactly that
    assert guess.widths(5) == [5, 5]  # never more than the longest payload
    guess.observe({"a": np.zeros((2, 12))})  # "b" absent: every record skipped
    assert guess.widths(1000) == [12 + 3 + 64, 7]  # widths differ: headroom
    with pytest.raises(ValueError, match="not a native column"):
        _contract.column_spec(_contract.FeaturePlan("x", Bytes(), "list", -1))
