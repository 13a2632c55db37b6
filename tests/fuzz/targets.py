"""Fuzz targets over datasets on disk: Example payloads, manifests, indexes (and shards).

Each target is an object with ``setup(scratch)`` (run once, before the memory
cap), ``strategy()`` (a Hypothesis strategy of examples) and
``check(example, scratch)``, which builds the dataset the example describes and
holds every reader to the reference (``readers.py``), yielding words for the
statistics.
"""

from __future__ import annotations

import copy
import gc
import io
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import zstandard
from hypothesis import strategies as st

import recordkit as rk
from recordkit.codec import decode_example, encode_example
from recordkit.format.complete import MARKER_NAME
from recordkit.format.index import format_index, scan_index
from recordkit.format.manifest import MANIFEST_NAME, Manifest
from recordkit.reader import ReadOptions
from recordkit.storage import open_target
from recordkit.writer.shard import ShardWriter

from .readers import attempt, canon, check_readers, check_skipping, check_verify, reference

SCHEMAS = [
    rk.Schema(
        b=rk.Bytes(),
        bl=rk.Bytes((None,)),
        i=rk.Int64(),
        il=rk.Int64((None,)),
        f=rk.Float32((2,)),
        t=rk.Tensor("uint8", (4,)),
        tv=rk.Tensor("float16", (None, 2)),
        tz=rk.Tensor("int32", (None,), compression="zstd"),
        tb=rk.Tensor("bool", (3,)),
    ),
    rk.Schema(x=rk.Tensor("float32", (2, None), compression="zstd"), y=rk.Int64((3,))),
    rk.Schema(z=rk.Tensor("uint8", (8,), compression="zstd"), w=rk.Float32((None,))),
]


def sample(schema: rk.Schema, seed: int) -> dict[str, Any]:
    """A valid sample of ``schema``, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name, ftype in schema.features.items():
        shape = tuple(int(rng.integers(0, 4)) if d is None else d for d in ftype.shape)
        if isinstance(ftype, rk.Bytes):
            n = shape[0] if shape else None
            values = [rng.bytes(int(rng.integers(0, 6))) for _ in range(n or 1)]
            out[name] = values if shape else values[0]
        elif isinstance(ftype, rk.Int64):
            out[name] = rng.integers(-(2**62), 2**62, size=shape)
        elif isinstance(ftype, rk.Float32):
            out[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            dtype = np.dtype(ftype.dtype)
            raw = rng.bytes(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
            out[name] = (
                np.frombuffer(raw, dtype).reshape(shape)
                if dtype.kind != "b"
                else (np.frombuffer(raw, np.uint8).reshape(shape) % 2).astype(bool)
            )
    return out


def _zstd(data: bytes, sized: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=sized).compress(data)


def _bomb(sized: bool) -> bytes:
    """A frame of 64 MiB of zeros (a few KB): over the fuzz limits' 8 MiB a record."""
    out = io.BytesIO()
    cctx = zstandard.ZstdCompressor(write_content_size=sized)
    with cctx.stream_writer(out, size=(64 << 20) if sized else -1, closefd=False) as w:
        for _ in range(64):
            w.write(bytes(1 << 20))
    return out.getvalue()


BOMBS: list[bytes] = []

# -- Example payloads -------------------------------------------------------------------------

_INTS = st.one_of(st.integers(-3, 8), st.sampled_from([-(2**63), 2**63 - 1, 2**31, -1, 1 << 40]))
_NAMES = st.sampled_from(["b", "bl", "i", "il", "f", "t", "tv", "tz", "tb", "x", "y", "z", "w"])


@st.composite
def _bytes_value(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["raw", "zstd", "zstd-unsized", "bomb", "sized", "garbage-frame"]))
    if kind == "raw":
        return draw(st.binary(max_size=40))
    if kind == "sized":  # the right length for a fixed tensor, sometimes
        return draw(st.sampled_from([bytes(4), bytes(3), bytes(8), bytes(12), bytes(16)]))
    if kind == "bomb":
        return BOMBS[draw(st.integers(0, len(BOMBS) - 1))]
    data = draw(st.binary(max_size=64))
    frame = _zstd(data, sized=kind == "zstd")
    if kind == "garbage-frame":
        cut = draw(st.integers(0, len(frame)))
        return frame[:cut] + draw(st.binary(max_size=8))
    return frame


@st.composite
def _structured(draw: st.DrawFn, schema: rk.Schema) -> bytes:
    """An Example built feature by feature: right, wrong or missing kinds and values."""
    names = list(schema.features) + [f"{n}/shape" for n in schema.features]
    names += draw(st.lists(_NAMES, max_size=2))
    features: dict[str, tuple[str | None, Any]] = {}
    for name in names:
        kind = draw(st.sampled_from(["bytes", "int64", "float", None, "skip"]))
        if kind == "skip":
            continue
        if kind == "bytes":
            values: Any = draw(st.lists(_bytes_value(), max_size=3))
        elif kind == "int64":
            values = draw(st.lists(_INTS, max_size=4))
        elif kind == "float":
            values = draw(st.lists(st.floats(width=32), max_size=4))
        else:
            values = []
        features[name] = (kind, values)
    return encode_example(features)


@st.composite
def _mutated(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "delete", "dup"]))
        at = draw(st.integers(0, len(buf)))
        if op == "flip" and buf:
            at = min(at, len(buf) - 1)
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[at : at + draw(st.integers(1, 8))]
        elif op == "dup":
            buf[at:at] = buf[at : at + draw(st.integers(1, 16))]
    return bytes(buf)


@st.composite
def _payload(draw: st.DrawFn, schema: rk.Schema) -> bytes:
    kinds = ["valid"] * 5 + ["mutated", "structured", "structured", "random", "value", "bomb"]
    kind = draw(st.sampled_from(kinds))
    if kind == "random":
        return draw(st.binary(max_size=80))
    if kind == "structured":
        return draw(_structured(schema))
    valid = schema.encode(sample(schema, draw(st.integers(0, 2**32))))
    if kind in ("value", "bomb"):  # a valid record but for one value (a bomb, a bad frame...)
        features = {
            k: (t, list(v) if t == "bytes" else v) for k, (t, v) in decode_example(valid).items()
        }
        zstd = sorted(k for k, f in schema.features.items() if getattr(f, "compression", None))
        if kind == "bomb" and zstd:
            name = draw(st.sampled_from(zstd))
            features[name] = ("bytes", [draw(st.sampled_from(BOMBS))])
            return encode_example(features)
        name = draw(st.sampled_from(sorted(features)))
        if features[name][0] == "bytes":
            features[name] = ("bytes", [draw(_bytes_value())] * len(features[name][1]))
        else:
            wire = draw(st.sampled_from(["int64", "float"]))
            features[name] = (wire, draw(st.lists(_INTS, max_size=3)))
        return encode_example(features)
    return valid if kind == "valid" else draw(_mutated(valid))


@st.composite
def _payload_dataset(draw: st.DrawFn) -> tuple[int, list[list[bytes]]]:
    which = draw(st.integers(0, len(SCHEMAS) - 1))
    shards = draw(
        st.lists(st.lists(_payload(SCHEMAS[which]), min_size=1, max_size=5), min_size=1, max_size=2)
    )
    return which, shards


def write_raw(root: str, schema: rk.Schema, shards: list[list[bytes]]) -> None:
    """A dataset of these payloads, exactly (framing, index and manifest all valid)."""
    target = open_target(root)
    infos = []
    for k, payloads in enumerate(shards):
        w = ShardWriter(target, f"part-{k:05d}.tfrecord", fsync=False)
        for p in payloads:
            w.write(p)
        infos.append(w.publish())
    Manifest(schema.to_json(), tuple(infos)).write(root)


def _fresh(scratch: str, name: str = "ds") -> str:
    root = os.path.join(scratch, name)
    shutil.rmtree(root, ignore_errors=True)
    return root


class _Payloads:
    """Example payloads (valid, mutated, built feature by feature, random) in valid shards."""

    readers: list[str] | None = None

    def setup(self, scratch: str) -> None:
        import recordkit.torch  # noqa: F401  (imported before the memory cap)

        BOMBS[:] = [_bomb(True), _bomb(False)]

    def strategy(self) -> st.SearchStrategy[Any]:
        return _payload_dataset()

    def check(self, example: tuple[int, list[list[bytes]]], scratch: str) -> Iterator[str]:
        which, shards = example
        root = _fresh(scratch)
        write_raw(root, SCHEMAS[which], shards)
        expected = reference(root)
        yield f"reference: {expected[0] if expected[0] == 'data' else type(expected[1]).__name__}"
        for name, word in check_readers(root, expected, self.readers).items():
            yield f"{name}: {word}"
        yield f"verify: {check_verify(root, expected)}"
        yield from check_skipping(root)


payloads = _Payloads()

# -- manifests ----------------------------------------------------------------------------------

_NASTY_PATHS = [
    "./part-00000.tfrecord",
    "part-00000.tfrecord/",
    "sub/../part-00000.tfrecord",
    "../x",
    "/etc/passwd",
    "",
    ".",
    "..",
    "a\x00b",
    "part-00001.tfrecord",
    "missing.tfrecord",
    "part-00000.tfrecord.idx",
    "recordkit.json",
    "x" * 300,
    "dir",
    "fifo",
    "zero",
    "loop",
    "part-00000.TFRECORD",
    "\u00e9.tfrecord",
    "//part-00000.tfrecord",
]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=8,
)
_VALUES = st.one_of(
    _JSON,
    st.sampled_from(_NASTY_PATHS),
    st.sampled_from(
        [
            0,
            1,
            -1,
            2**63,
            4,
            5,
            8,
            None,
            "uint8",
            "zstd",
            "tensor",
            "bytes",
            [None],
            [-1],
            [1 << 40],
            [2, None],
        ]
    ),
)
# sampled_from hands out the same list object each time: edits must not change it
_VALUES = _VALUES.map(copy.deepcopy)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def _tree_edit(draw: st.DrawFn, doc: Any) -> Any:
    """One edit at a drawn place of a JSON document: replace, delete, insert, duplicate."""
    path = draw(st.sampled_from(_paths(doc)))
    if not path:
        return draw(_VALUES)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    op = draw(st.sampled_from(["replace", "replace", "delete", "insert", "duplicate"]))
    if op == "replace":
        parent[key] = draw(_VALUES)
    elif op == "delete":
        del parent[key]
    elif op == "insert" and isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = draw(_VALUES)
    elif op == "insert":
        parent.insert(key, draw(_VALUES))
    elif isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    return doc


class _Template:
    """A small valid dataset to start every example from."""

    root = ""
    doc: Any = None

    def setup(self, scratch: str) -> None:
        import recordkit.torch  # noqa: F401

        self.root = os.path.join(scratch, "template")
        schema = SCHEMAS[0]
        with rk.Writer(self.root, schema, max_records=4, fsync=False) as w:
            for i in range(8):
                w.write(sample(schema, i))
        with open(os.path.join(self.root, MANIFEST_NAME)) as f:
            self.doc = json.load(f)

    def copy(self, scratch: str) -> str:
        root = _fresh(scratch)
        shutil.copytree(self.root, root)
        os.mkdir(os.path.join(root, "dir"))
        os.mkfifo(os.path.join(root, "fifo"))
        os.symlink("/dev/zero", os.path.join(root, "zero"))
        os.symlink("loop", os.path.join(root, "loop"))
        return root

    def check_all(self, root: str, schema: rk.Schema | None = None) -> Iterator[str]:
        expected = reference(root, schema)
        yield f"reference: {expected[0] if expected[0] == 'data' else type(expected[1]).__name__}"
        for name, word in check_readers(root, expected, schema=schema).items():
            yield f"{name}: {word}"
        yield f"verify: {check_verify(root, expected, schema)}"


@st.composite
def _manifest_text(draw: st.DrawFn, doc: Any) -> bytes:
    kind = draw(st.sampled_from(["tree", "tree", "tree", "text", "deep", "special"]))
    if kind == "special":
        return draw(
            st.sampled_from([b"", b"null", b"[]", b"{}", b"\xff\xfe", b'{"format": "recordkit"}'])
        )
    if kind == "deep":
        n = draw(st.integers(10, 200_000))
        return b"[" * n + b"]" * n
    edited = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        edited = draw(_tree_edit(edited))
    text = json.dumps(edited, allow_nan=True).encode()
    return text if kind == "tree" else draw(_mutated(text))


class _Manifests(_Template):
    """``recordkit.json`` edited as a tree (paths, counts, sizes, schema) or as text."""

    def strategy(self) -> st.SearchStrategy[Any]:
        nodes = st.sampled_from(
            ["loop", "dangling", "fifo", "dir", "zero", "marker-fifo", "marker-loop", "marker-dir"]
        )
        return st.one_of(st.deferred(lambda: _manifest_text(self.doc)), nodes)

    def check(self, example: bytes | str, scratch: str) -> Iterator[str]:
        root = self.copy(scratch)
        path = os.path.join(root, MANIFEST_NAME)
        if isinstance(example, str) and example.startswith("marker-"):
            # an in-progress marker that is not a file, beside a whole dataset
            marker = os.path.join(root, MARKER_NAME)
            if example == "marker-fifo":
                os.mkfifo(marker)
            elif example == "marker-loop":
                os.symlink(MARKER_NAME, marker)
            else:
                os.mkdir(marker)
        elif isinstance(example, str):  # not a regular file
            os.unlink(path)
            if example in ("loop", "dangling", "zero"):
                target = {"loop": MANIFEST_NAME, "dangling": "gone", "zero": "/dev/zero"}
                os.symlink(target[example], path)
            elif example == "fifo":
                os.mkfifo(path)
            else:
                os.mkdir(path)
        else:
            with open(path, "wb") as f:
                f.write(example)
        yield from self.check_all(root)


manifests = _Manifests()

# -- indexes and shards -------------------------------------------------------------------------


@st.composite
def _index_edit(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(
        st.sampled_from(["text", "entries", "random", "special", "other", "shard", "shard+index"])
    )
    if kind == "random":
        return kind, draw(st.binary(max_size=200))
    if kind == "special":
        return kind, draw(st.sampled_from(["missing", "empty", "dir", "fifo", "zero", "loop"]))
    if kind == "entries":
        ops = draw(
            st.lists(
                st.tuples(st.integers(0, 8), st.integers(-2, 2**40), st.integers(-2, 2**40)),
                max_size=4,
            )
        )
        return kind, ops
    if kind in ("shard", "shard+index"):
        flips = draw(
            st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=3)
        )
        cut = draw(st.one_of(st.none(), st.integers(0, 10**6)))
        return kind, (flips, cut)
    return kind, draw(st.integers(0, 2**32))


class _Indexes(_Template):
    """A shard's ``.idx`` (text edits, entries, garbage, not a file, another shard's) and
    the shard's own bytes (flipped, cut), against every reader."""

    def strategy(self) -> st.SearchStrategy[Any]:
        return st.tuples(_index_edit(), st.integers(0, 1), st.booleans())

    def check(self, example: tuple[tuple[str, Any], int, bool], scratch: str) -> Iterator[str]:
        (kind, arg), k, foreign = example
        root = self.copy(scratch)
        if foreign:  # TFRecords of someone else's: no manifest; the schema given to readers
            os.unlink(os.path.join(root, MANIFEST_NAME))
            for name in ("dir", "fifo", "zero", "loop"):
                path = os.path.join(root, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
        shard = os.path.join(root, f"part-{k:05d}.tfrecord")
        idx = shard + ".idx"
        with open(idx, "rb") as f:
            text = f.read()
        if kind in ("shard", "shard+index"):
            flips, cut = arg
            with open(shard, "r+b") as f:
                data = bytearray(f.read())
                for at, bit in flips:
                    data[at % len(data)] ^= 1 << bit
                if cut is not None:
                    del data[cut % (len(data) + 1) :]
                f.seek(0)
                f.write(data)
                f.truncate()
            if kind == "shard+index":  # an index that matches the damaged shard, if any does
                made = attempt(lambda: format_index(scan_index(shard, verify=False)))
                text = made[1] if made[0] == "data" else text
        elif kind == "random":
            text = arg
        elif kind == "text":
            rng = np.random.default_rng(arg)
            lines = text.splitlines(keepends=True)
            op = int(rng.integers(0, 4))
            if op == 0 and lines:
                del lines[int(rng.integers(0, len(lines)))]
            elif op == 1 and lines:
                lines.insert(
                    int(rng.integers(0, len(lines))), lines[int(rng.integers(0, len(lines)))]
                )
            elif op == 2:
                lines.reverse()
            text = b"".join(lines)
            if op == 3 and text:
                buf = bytearray(text)
                buf[int(rng.integers(0, len(buf)))] = int(rng.integers(32, 127))
                text = bytes(buf)
        elif kind == "entries":
            entries = [list(map(int, line.split())) for line in text.splitlines()]
            for at, offset, size in arg:
                if entries:
                    entries[at % len(entries)] = [offset, size]
            text = "".join(f"{o} {s}\n" for o, s in entries).encode()
        elif kind == "other":
            with open(os.path.join(root, f"part-{1 - k:05d}.tfrecord.idx"), "rb") as f:
                text = f.read()
        if kind == "special":
            os.unlink(idx)
            if arg == "empty":
                open(idx, "wb").close()
            elif arg == "dir":
                os.mkdir(idx)
            elif arg == "fifo":
                os.mkfifo(idx)
            elif arg == "zero":
                os.symlink("/dev/zero", idx)
            elif arg == "loop":
                os.symlink(os.path.basename(idx), idx)
        else:
            with open(idx, "wb") as f:
                f.write(text)
        yield f"edit: {kind}{' (foreign)' if foreign else ''}"
        yield from self.check_all(root, SCHEMAS[0] if foreign else None)


indexes = _Indexes()

# -- recordkit.tf ---------------------------------------------------------------------------------


def _tf_canon(value: Any) -> Any:
    value = value.numpy() if hasattr(value, "numpy") else value
    if isinstance(value, np.ndarray) and value.dtype == object:
        return ("l", tuple(("b", bytes(v)) for v in value.tolist()))
    if isinstance(value, (bytes, np.bytes_)):
        return ("b", bytes(value))
    return canon(value)


class _TfPayloads(_Payloads):
    """The payloads target through ``recordkit.tf.dataset`` (TensorFlow alone in its process).

    TensorFlow reports errors met while the pipeline runs as its own
    ``tf.errors.OpError`` (recordkit's message inside, for recordkit's checks):
    that is the error family a TensorFlow user catches, so it counts as a refusal.
    """

    def setup(self, scratch: str) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow  # noqa: F401

        import recordkit.tf  # noqa: F401

        BOMBS[:] = [_bomb(True), _bomb(False)]

    def check(self, example: tuple[int, list[list[bytes]]], scratch: str) -> Iterator[str]:
        import tensorflow as tf

        import recordkit.tf as rtf

        from .readers import LIMITS

        which, shards = example
        root = _fresh(scratch)
        write_raw(root, SCHEMAS[which], shards)
        expected = reference(root)

        def read() -> list[Any]:
            ds = rtf.dataset(root, shuffle=False, options=ReadOptions(limits=LIMITS))
            return [{k: _tf_canon(v) for k, v in s.items()} for s in ds]

        try:
            kind, got = attempt(read)
        except tf.errors.OpError as exc:
            kind, got = "error", exc
        except UnicodeDecodeError as exc:
            # TensorFlow's own parse error quotes the payload, and its Python binding
            # cannot decode a message with a byte that is not UTF-8 (plain
            # tf.io.parse_single_example does the same): TensorFlow's bug, documented
            # in docs/reference/errors.md; accepted only when raised inside TensorFlow.
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            assert tb is not None and "tensorflow" in tb.tb_frame.f_code.co_filename, exc
            kind, got = "error", exc
        word = kind if kind == "data" else type(got).__name__
        if expected[0] == "data":
            assert kind == "data", f"recordkit.tf raised where the data is fine: {got!r}"
            assert got == expected[1], "recordkit.tf returned other data than the reference"
        else:
            assert kind == "error", (
                f"recordkit.tf read data where the reference refuses: {expected[1]!r}"
            )
        # An error's traceback holds the pipeline's iterator, and so its threads, in a
        # reference cycle: freed only by a collection (thousands of examples add up to
        # TensorFlow's thread creation failing under the address-space cap).
        del got, expected
        gc.collect()
        yield f"recordkit.tf: {word}"


tf_payloads = _TfPayloads()
