"""Every reader over one dataset directory, compared with a reference read.

Two outcomes are allowed (issue 22): the right data, or a ``RecordkitError``.
"Right" is what :func:`reference` computes from the lowest floors alone — the
manifest parsed, each listed shard scanned record by record with every CRC
checked, its record count and size compared with the manifest, each payload
decoded by ``Schema.decode`` — and every reader must agree with it:

* the reference reads data: each reader returns exactly it (a reader may only
  refuse a batch over the batch budget, ``RecordTooLargeError``);
* the reference refuses: each reader raises a ``RecordkitError``.

Any other exception type propagates and fails the example.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import recordkit as rk
from recordkit.codec import DecodeLimits
from recordkit.errors import ManifestError, RecordkitError, RecordTooLargeError
from recordkit.format.index import scan_index
from recordkit.format.manifest import read_manifest
from recordkit.reader import ReadOptions

# Small budgets, so a decompression bomb is refused long before the process's
# address-space cap (harness.py) would turn it into a MemoryError.
LIMITS = DecodeLimits(record_bytes=8 << 20, batch_bytes=32 << 20)

Outcome = tuple[str, Any]  # ("data", [canonical samples]) or ("error", RecordkitError)


def canon(value: Any) -> Any:
    """A comparable form of a decoded value, whichever reader made it (bit-exact)."""
    if hasattr(value, "numpy") and callable(value.numpy):  # a torch tensor
        value = value.numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(value)
        return ("a", a.dtype.str, a.shape, a.tobytes())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("b", bytes(value))
    if isinstance(value, (list, tuple)):
        return ("l", tuple(canon(v) for v in value))
    if isinstance(value, dict):
        return {k: canon(v) for k, v in value.items()}
    if isinstance(value, (int, float, bool)):
        return canon(np.asarray(value))
    raise TypeError(f"unexpected decoded value {type(value).__name__}")


def attempt(fn: Callable[[], Any]) -> Outcome:
    """Run a read: its data, or the ``RecordkitError`` it raised (anything else propagates)."""
    try:
        return ("data", fn())
    except RecordkitError as exc:
        return ("error", exc)


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def reference(root: str, schema: rk.Schema | None = None) -> Outcome:
    """What the dataset at ``root`` holds, read the slow, plain way (see the module doc).

    With ``schema``, ``root`` is a folder of foreign TFRecords (no manifest): its
    ``*.tfrecord`` files in name order, decoded with ``schema``.
    """

    def read() -> list[Any]:
        if schema is None:
            manifest = read_manifest(root)
            shards = [(s.path, s.records, s.bytes) for s in manifest.shards]
            decoder = rk.Schema.from_json(manifest.schema)
        else:
            names = sorted(n for n in os.listdir(root) if n.endswith(".tfrecord"))
            shards = [(n, None, None) for n in names]
            decoder = schema
        out = []
        for rel, records, nbytes in shards:
            path = os.path.join(root, *rel.split("/"))
            entries = scan_index(path, verify=True)
            size = os.path.getsize(path)
            if records is not None and (len(entries) != records or size != nbytes):
                raise ManifestError(
                    f"{rel} holds {len(entries)} records in {size} bytes, the manifest "
                    f"says {records} in {nbytes}",
                    path=root,
                )
            with open(path, "rb") as f:
                data = f.read()
            for offset, framed in entries.tolist():
                payload = data[offset + 12 : offset + framed - 4]
                out.append(canon(decoder.decode(payload, copy=True, limits=LIMITS)))
        return out

    return attempt(read)


def reference_records(root: str) -> list[Outcome]:
    """Each record's own outcome, in dataset order (the manifest and framing are
    assumed whole: for datasets written by ``write_raw``)."""
    manifest = read_manifest(root)
    schema = rk.Schema.from_json(manifest.schema)
    out = []
    for info in manifest.shards:
        path = os.path.join(root, *info.path.split("/"))
        with open(path, "rb") as f:
            data = f.read()
        for offset, framed in scan_index(path, verify=True).tolist():
            payload = data[offset + 12 : offset + framed - 4]
            out.append(attempt(lambda p=payload: canon(schema.decode(p, copy=True, limits=LIMITS))))
    return out


def check_skipping(root: str) -> Iterator[str]:
    """With ``on_error="skip"`` each reader returns exactly the records that decode."""
    good = [value for kind, value in reference_records(root) if kind == "data"]
    for native in (False, True):
        name = f"RecordDataset({'native' if native else 'threads'}, skip)"
        got = _record_dataset(root, batch_size=3, native=native, on_error="skip")
        assert got == good, f"{name}: {len(got)} record(s), expected the {len(good)} good ones"
        yield f"{name}: ok"


class NotComparable(Exception):
    """This reader's output cannot be compared with the reference's for this dataset."""


def _unbatch(batch: dict[str, Any], ragged: dict[str, tuple[int, ...]]) -> list[dict[str, Any]]:
    """Rows of a batch; a padded ragged feature cut to each row's lengths (checking the
    padding is zeros), its ``/lengths`` column dropped."""
    n = len(next(iter(batch.values())))
    lengths = {name + "/lengths" for name in ragged}
    rows = [{k: v[i] for k, v in batch.items() if k not in lengths} for i in range(n)]
    for name, axes in ragged.items():
        lengths = batch[name + "/lengths"].reshape(n, len(axes))
        for row, value, sizes in zip(rows, batch[name], lengths.tolist()):
            cut = [slice(None)] * value.dim()
            for axis, size in zip(axes, sizes):
                cut[axis] = slice(0, size)
            row[name] = value[tuple(cut)]
            pad = value.clone()
            pad[tuple(cut)] = 0
            assert not pad.any(), f"{name}: padding that is not zeros"
    return rows


def _record_dataset(
    root: str,
    schema: rk.Schema | None = None,
    *,
    batch_size: int | None,
    native: bool,
    on_error: str = "raise",
) -> list[Any]:
    from recordkit.reader.ragged import ragged_axes
    from recordkit.torch import RecordDataset

    with environ(RECORDKIT_NATIVE_TASKS="1" if native else "0"):
        ds = RecordDataset(
            root,
            batch_size=batch_size,
            schema=schema,
            options=ReadOptions(bytes_as="list", num_threads=2, limits=LIMITS, on_error=on_error),
        )
        try:
            out = []
            for item in ds:
                if batch_size and not item:  # a schema of no features: batches of {}
                    raise NotComparable("batches of no features do not say their size")
                ragged = ragged_axes(ds.schema, ds.columns) if batch_size else {}
                for sample in _unbatch(item, ragged) if batch_size else [item]:
                    out.append(canon(sample))
            return out
        finally:
            ds.close()


def _dataset(root: str, schema: rk.Schema | None = None) -> list[Any]:
    with rk.Dataset(root, limits=LIMITS, schema=schema) as ds:
        by_index = [canon(ds[i]) for i in range(len(ds))]
        in_order = [canon(s) for s in ds]
    assert by_index == in_order, "rk.Dataset: ds[i] and iteration disagree"
    return in_order


def _map_dataset(root: str, schema: rk.Schema | None = None) -> list[Any]:
    from recordkit.torch import RecordMapDataset

    ds = RecordMapDataset(root, schema=schema, options=ReadOptions(limits=LIMITS))
    one = [canon(ds[i]) for i in range(len(ds))]
    many = [canon(s) for s in ds.__getitems__(list(range(len(ds))))] if len(ds) else []
    assert one == many, "RecordMapDataset: ds[i] and __getitems__ disagree"
    return one


READERS: dict[str, Callable[[str, rk.Schema | None], list[Any]]] = {
    "rk.Dataset": _dataset,
    "RecordDataset(threads)": lambda r, s: _record_dataset(r, s, batch_size=None, native=False),
    "RecordDataset(native, batches)": lambda r, s: _record_dataset(r, s, batch_size=3, native=True),
    "RecordDataset(threads, batches)": lambda r, s: _record_dataset(
        r, s, batch_size=3, native=False
    ),
    "RecordMapDataset": _map_dataset,
}


def check_readers(
    root: str,
    expected: Outcome,
    names: list[str] | None = None,
    schema: rk.Schema | None = None,
) -> dict[str, str]:
    """Read ``root`` with each reader (all by default; ``schema`` given to each, for a
    folder without a manifest) and hold it to ``expected``.

    Returns each reader's outcome in a word (for the statistics).
    """
    seen = {}
    for name in names or list(READERS):
        try:
            kind, value = attempt(lambda name=name: READERS[name](root, schema))
        except NotComparable:
            seen[name] = "not comparable"
            continue
        if expected[0] == "data":
            if kind == "error" and isinstance(value, RecordTooLargeError) and "batch" in str(value):
                seen[name] = "batch limit"
                continue
            assert kind == "data", f"{name} raised where the data is fine: {value!r}"
            assert value == expected[1], f"{name} returned other data than the reference"
        else:
            assert kind == "error", (
                f"{name} returned {len(value)} record(s) where the reference refuses: "
                f"{expected[1]!r}"
            )
        seen[name] = kind if kind == "data" else type(value).__name__
    return seen


def check_verify(root: str, expected: Outcome, schema: rk.Schema | None = None) -> str:
    """``rk.verify`` never raises for bad data, and never says ok when the reference
    refuses (the reference's refusals are all things verify checks)."""
    report = rk.verify(root, limits=LIMITS, schema=schema)
    if expected[0] == "error":
        assert not report.ok, f"verify says ok where the reference refuses: {expected[1]!r}"
    return "ok" if report.ok else "problems"
