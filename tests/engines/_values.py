"""The records the engine tests send both ways, what each engine stores for them, and
one check that every recordkit reader gives those values back.

A record's features are compared as stored (``rk.Dataset(raw=True)``'s view): a bytes
feature as its ``list[bytes]``, a number feature as its values' bits (NaN, -0.0 and the
infinities compare exactly; float32 is what a ``float_list`` holds).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import recordkit as rk
from recordkit.reader import ReadOptions

N = 40  # records: small, and enough for two shards and a few batches
I64 = np.iinfo(np.int64)
FLOATS = [float("nan"), -0.0, float("inf"), float("-inf"), 1.1, 1e-45, 3.4e38, 0.1]
BYTES = [b"\xff\xfe\x00", b"", b"\x80", b"plain", "é".encode("latin-1")]
TEXT = ["héllo", "", "日本", "a\x00b"]


def items(n: int = N) -> list[dict[str, Any]]:
    """Varied records as a user hands them to an engine: Python ints at the int64
    extremes, Python floats (float64) with NaN/-0.0/inf and values float32 rounds, bytes
    that are not UTF-8 and empty, text, int and float lists of varying length (empty
    too), an int that is sometimes missing (None), and a float32 array."""
    extremes = [I64.max, I64.min, 0, -1, 1 << 53]
    out = []
    for k in range(n):
        out.append(
            {
                "id": k,
                "i": extremes[k % len(extremes)],
                "f": FLOATS[k % len(FLOATS)],
                "b": BYTES[k % len(BYTES)],
                "s": TEXT[k % len(TEXT)],
                "l": list(range(-k, -k + k % 4)) if k % 4 else [],
                "fl": [FLOATS[(k + j) % len(FLOATS)] for j in range(k % 3)],
                "n": None if k % 3 == 1 else k * 1000,
                "a": np.arange(6, dtype=np.float32).reshape(2, 3) * k - 0.5,
            }
        )
    return out


# Each column's kind, as Ray's writer reads it from the Arrow type.
KINDS = {
    "id": "int64",
    "i": "int64",
    "f": "float",
    "b": "bytes",
    "s": "text",
    "l": "int64",
    "fl": "float",
    "n": "int64",
    "a": "tensor",
}


def stored(item: Mapping[str, Any], tensor: Any) -> dict[str, Any]:
    """What an engine that writes ``tf.train.Example``s the way Ray Data does stores for
    ``item``: a scalar as a one-value list, a float as float32, text as UTF-8, None as
    an empty list of the column's kind, an array as ``tensor(array)`` bytes (Ray:
    ``tf.io.serialize_tensor``)."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        kind = KINDS[name]
        if kind == "tensor":
            out[name] = [tensor(value)]
        elif kind == "bytes":
            out[name] = [value]
        elif kind == "text":
            out[name] = [value.encode()]
        else:
            values = [] if value is None else value if isinstance(value, list) else [value]
            out[name] = np.array(values, np.int64 if kind == "int64" else np.float32)
    return out


def bits(value: Any) -> Any:
    """A value in a form that compares exactly: bytes lists as lists, numbers as
    ``(dtype, values' bits)``."""
    if isinstance(value, (bytes, bytearray)):  # a Bytes() feature read with a schema
        return [bytes(value)]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bytes, bytearray)) for v in value):
        return [bytes(v) for v in value]
    arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if arr.dtype == np.float32:
        return ("float32", arr.reshape(-1).view(np.uint32).tolist())
    return (arr.dtype.name, arr.reshape(-1).tolist())


def assert_same_record(got: Mapping[str, Any], want: Mapping[str, Any], where: str) -> None:
    """Every feature of ``want``, value for value (bits for floats) and kind for kind
    (an empty int64 list is not an empty float list); no other feature."""
    assert sorted(got) == sorted(want), f"{where}: features {sorted(got)} != {sorted(want)}"
    for name, value in want.items():
        g, w = bits(got[name]), bits(value)
        assert g == w, f"{where}: feature {name!r}: {g} != {w}"


def by_id(samples: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    out = {int(np.asarray(s["id"]).reshape(-1)[0]): s for s in samples}
    assert len(out) == len(samples), "a record came back twice"
    return out


def fixed_schema() -> rk.Schema:
    """The features every record holds one value of: enough to batch."""
    return rk.Schema(id=rk.Int64(), i=rk.Int64(), f=rk.Float32(), b=rk.Bytes(), s=rk.Bytes())


def full_schema() -> rk.Schema:
    """Every feature, lists of varying length as ``(None,)``."""
    return rk.Schema(
        id=rk.Int64(),
        i=rk.Int64(),
        f=rk.Float32(),
        b=rk.Bytes(),
        s=rk.Bytes(),
        l=rk.Int64((None,)),
        fl=rk.Float32((None,)),
        n=rk.Int64((None,)),
        a=rk.Bytes(),
    )


# full_schema() as `recordkit convert --schema` takes it
FULL_SPEC = (
    "id:int64,i:int64,f:float32,b:bytes,s:bytes,"
    "l:int64[None],fl:float32[None],n:int64[None],a:bytes"
)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recordkit", *args], capture_output=True, text=True, timeout=120
    )


def check_every_reader(
    path: str, want: Mapping[int, Mapping[str, Any]], tmp: Any
) -> dict[str, int]:
    """Read ``path`` with every recordkit reader and compare with ``want`` (stored
    features by id). Returns the records each reader compared equal."""
    from recordkit.torch import RecordDataset

    counts: dict[str, int] = {}
    fixed = fixed_schema()

    def compare(name: str, samples: Sequence[Mapping[str, Any]], keys: Any = None) -> None:
        got = by_id(samples)
        assert sorted(got) == sorted(want), f"{name}: ids {sorted(got)}"
        for k, w in want.items():
            w = {n: v for n, v in w.items() if keys is None or n in keys}
            assert_same_record(got[k], w, f"{name} record id={k}")
        counts[name] = len(got)

    compare("rk.Dataset(raw=True)", list(rk.Dataset(path, raw=True)))
    compare("rk.Dataset(full schema)", list(rk.Dataset(path, full_schema())))
    compare(
        "RecordDataset(options=ReadOptions(raw=True))",
        list(RecordDataset(path, batch_size=None, options=ReadOptions(raw=True))),
    )
    batches = list(RecordDataset(path, schema=fixed, batch_size=8))
    compare("RecordDataset(schema, batch_size=8)", _unbatch(batches), set(fixed.names))
    tfds = rk.tf.dataset(path, schema=fixed, batch_size=8)
    compare(
        "recordkit.tf.dataset(schema)",
        _unbatch([{k: v.numpy() for k, v in b.items()} for b in tfds]),
        set(fixed.names),
    )
    report = cli("verify", path)
    said = report.stdout + report.stderr
    assert report.returncode == 0 and f"{len(want)} records" in said and "OK" in said, said
    info = cli("info", path)
    assert info.returncode == 0 and str(len(want)) in info.stdout, info
    counts["recordkit verify/info"] = len(want)
    dest = str(tmp / "converted")
    run = cli("convert", "--from", "tfrecord", path, dest, "--schema", FULL_SPEC)
    assert run.returncode == 0, run.stderr
    compare("recordkit convert --from tfrecord, read back", list(rk.Dataset(dest)))
    return counts


def _unbatch(batches: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Samples from batches: a padded bytes column (``uint8 (N, longest)`` with its
    ``"{name}/lengths"``, torch's default) cut back to each value's length."""
    out = []
    for batch in batches:
        for r in range(len(batch["id"])):
            sample = {}
            for k, column in batch.items():
                if k.endswith("/lengths"):
                    continue
                value = column[r]
                if isinstance(value, bytes):  # TensorFlow's tf.string (np.asarray would
                    sample[k] = [value]  # drop trailing NULs)
                    continue
                value = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
                if f"{k}/lengths" in batch:
                    n = int(batch[f"{k}/lengths"][r])
                    sample[k] = [value[:n].astype(np.uint8).tobytes()]
                else:
                    sample[k] = value.reshape(1)
            out.append(sample)
    return out
