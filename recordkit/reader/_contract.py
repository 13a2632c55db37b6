"""The contract between the reader's Python and its C decoder, ``recordkit.native._ext``.

Everything that crosses that boundary is defined here, once; the C side
(``recordkit/native/recordkit.h``) holds the same numbers and points here, and
:func:`check` compares the two when the extension is loaded. The pure Python
twins (:mod:`recordkit.reader._fallback`) take their constants from here too.

**Batch calls** (``parse_batch``, used by :class:`~recordkit.reader.decode.BatchDecoder`):

- a *status* per record, an ``int32``: ``STATUS_OK`` or the first of the
  ``STATUS_*`` checks that fails, in the order :func:`recordkit.format.read_record`
  makes them;
- four ``int64`` per record and key, its *span*: ``(kind, count, start, nbytes)``;
  ``kind`` is a ``KIND_*`` (``KIND_COMPLEX`` or-ed in when a numeric list is
  spread over several chunks, or a ``BytesList`` over several submessages that
  protobuf merges), ``start`` an absolute offset in the shard;
- *expect*: a ``(kind, count, nbytes)`` triple per fast feature (:func:`expected`),
  ``ANY`` where any value will do; a well-formed record whose spans differ gets
  ``STATUS_UNEXPECTED`` and takes the reference path.

**Runner tasks** (``recordkit.native._ext.Runner``, used by
:class:`~recordkit.reader.pipeline.RecordReader`):

- ``Runner(keys, expect, columns, verify, max_record_bytes, FUSE_MIN_BYTES)``:
  ``columns`` holds a :class:`ColumnSpec` per decoded feature, in schema order
  (:func:`column_spec`);
- ``submit(bufs, rec, outs)``: ``bufs`` the shards' buffers, ``rec`` an ``(n, 3)``
  ``int64`` table of ``(index into bufs, offset, framed size)`` per record, ``outs``
  the *output slots* (:func:`task_outputs`): per column in schema order, a bytes
  column takes two (its values, ``n * width`` ``uint8`` at the width guessed for
  it, then its lengths, ``n`` ``int64``), any other one (``(n, *shape)`` of its
  dtype);
- ``wait(id) -> (ok, widths, seconds)``: ``ok`` false means a record the fast path
  does not take (the task is then decoded the reference way); ``widths`` the row
  width of each column as written (a bytes column: its widest value, the rows
  closed up to it; :func:`task_columns` reads the slots back);
- ``run(bufs, rec, outs) -> (ok, widths, needs)``: the same task run by the calling
  thread, the GIL released once for all of it (``recordkit.tf``'s native path);
  ``needs``, per slot, the elements each slot of a packed or list column filled (or,
  ``ok`` false, would have filled: one that exceeds its slot says to run the task
  again with that much room).

Packed and list columns (``recordkit.tf``'s native path only: ragged numbers and lists
of bytes) append each record's values, in record order, to one values slot, with the
record's size beside it: ``COL_PACKED`` the bytes of a float list or of a raw tensor's
one value (slots: values ``uint8``, then each record's bytes, ``n`` ``int64``);
``COL_PACKED_INT64`` an int64 list decoded (values ``int64``, then each record's count);
``COL_BYTES_LIST`` a list of bytes values (their bytes ``uint8``, each value's length
``int64``, each record's count of values, ``n`` ``int64``). Their values are any size:
a record's span is checked by the column itself (its kind; ``ColumnSpec.empty_ok``: an
absent feature is no values; ``row_bytes``/``nvalues``: the size a multiple of it, or
a list's exact count), so their ``expect`` triple is ``(ANY, ANY, ANY)``.

A bytes column's width is guessed before the task runs (:class:`WidthGuess`): a
value wider than the guess sends its task to the reference path, which is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from ..codec import FeatureType

__all__ = [
    "ANY",
    "COL_BYTES",
    "COL_BYTES_LIST",
    "COL_FIXED",
    "COL_INT64",
    "COL_PACKED",
    "COL_PACKED_INT64",
    "FUSE_MIN_BYTES",
    "KIND_ABSENT",
    "KIND_BYTES",
    "KIND_COMPLEX",
    "KIND_FLOAT",
    "KIND_INT64",
    "KIND_NONE",
    "STATUS_LENGTH_CRC",
    "STATUS_LENGTH_MISMATCH",
    "STATUS_MALFORMED",
    "STATUS_OK",
    "STATUS_OUT_OF_BOUNDS",
    "STATUS_PAYLOAD_CRC",
    "STATUS_TOO_LARGE",
    "STATUS_TRUNCATED",
    "STATUS_UNEXPECTED",
    "Alloc",
    "ColumnSpec",
    "FeaturePlan",
    "WidthGuess",
    "allocate",
    "check",
    "column_spec",
    "expected",
    "task_columns",
    "task_outputs",
]

Alloc = Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray]

# Record status codes, in the order recordkit.format.read_record checks them.
STATUS_OK = 0
STATUS_OUT_OF_BOUNDS = 1  # offset < 0 or past the end of the buffer
STATUS_TRUNCATED = 2  # the header, or the record it announces, runs past the end
STATUS_LENGTH_CRC = 3
STATUS_TOO_LARGE = 4  # the length field exceeds max_record_bytes
STATUS_LENGTH_MISMATCH = 5  # the length field disagrees with the index's framed size
STATUS_PAYLOAD_CRC = 6
STATUS_MALFORMED = 7  # not a well-formed tf.train.Example, or one with a field it does not define
STATUS_UNEXPECTED = 8  # well-formed, but a span is not what ``expect`` asks for

# Span kinds: spans[i, k, 0].
KIND_ABSENT = 0
KIND_BYTES = 1
KIND_FLOAT = 2
KIND_INT64 = 3
KIND_NONE = 4  # the Feature is present with no list set
KIND_COMPLEX = 0x10  # or-ed in: a list spread over several chunks (or BytesLists)

# Runner column modes: how one output column is filled.
COL_BYTES = 0  # one bytes value per record, zero-padded rows, plus its lengths
COL_FIXED = 1  # exactly row_bytes per record (float32s, raw tensors), copied
COL_INT64 = 2  # exactly count packed varints per record, decoded to int64
COL_PACKED = 3  # a float list's (or a raw tensor's) bytes, any size, appended; their sizes
COL_PACKED_INT64 = 4  # an int64 list, any size, decoded and appended; their counts
COL_BYTES_LIST = 5  # a list of bytes values appended; each value's length; their counts

ANY = -1  # in an expect triple: any value

# From this mean framed size up, the largest bytes/float column of a batch is
# copied by gather_verified (the Runner: fused copy), which checks the payload CRC
# in the same pass over memory: measured here 1.2x faster than a CRC pass and then
# a copy at 16 KiB records, 1.45x at 256 KiB; about even at 8 KiB, slower below
# (an extra call).
FUSE_MIN_BYTES = 16 << 10

_U8 = np.dtype(np.uint8)
_I64 = np.dtype(np.int64)

# The constants the extension must define with exactly these values.
_SHARED = tuple(n for n in __all__ if n.startswith(("STATUS_", "KIND_")))
_RUNNER_ONLY = (
    "COL_BYTES",
    "COL_FIXED",
    "COL_INT64",
    "COL_PACKED",
    "COL_PACKED_INT64",
    "COL_BYTES_LIST",
)


@dataclass(frozen=True, slots=True)
class FeaturePlan:
    """How one feature is decoded.

    ``mode``: ``"int64"``/``"float"`` (fixed-shape numbers), ``"raw"``/``"zstd"``
    (fixed-shape tensors), ``"bytes"`` (one value), ``"list"`` (per record, in
    Python; never a native column).
    """

    name: str
    ftype: FeatureType
    mode: str
    key: int  # index into the keys passed to parse_batch / Runner (fast modes)
    shape: tuple[int, ...] = ()
    dtype: np.dtype[Any] = _U8
    row_bytes: int = 0  # bytes per record ("raw"/"zstd": the exact size of the value)
    count: int = 0  # elements per record


def expected(plan: FeaturePlan) -> tuple[int, int, int]:
    """The ``(kind, count, nbytes)`` a fast feature's span must have (``ANY``: any)."""
    if plan.mode == "int64":
        return (KIND_INT64, plan.count, ANY)
    if plan.mode == "float":
        return (KIND_FLOAT, plan.count, plan.row_bytes)
    if plan.mode == "raw":
        return (KIND_BYTES, 1, plan.row_bytes)
    return (KIND_BYTES, 1, ANY)  # "zstd", "bytes"


class ColumnSpec(NamedTuple):
    """One Runner column, as ``Runner(..., columns, ...)`` takes it (a plain tuple)."""

    mode: int  # COL_*
    key: int  # index into the keys
    row_bytes: int  # COL_FIXED: bytes per row; COL_PACKED: a record's bytes are a multiple
    nvalues: int  # COL_INT64: values per row (the C side's "count"); COL_PACKED_INT64: a
    # record's count is a multiple; COL_BYTES_LIST: a record's count (0: any)
    fusable: bool  # may be the column whose copy checks the payload CRC
    kind: int = KIND_ABSENT  # COL_PACKED: the list read (KIND_FLOAT, or KIND_BYTES: one value)
    empty_ok: bool = False  # packed and list columns: an absent feature reads as no values


def column_spec(plan: FeaturePlan) -> ColumnSpec:
    """The Runner column of a fast feature (not ``"list"`` or ``"zstd"``: those need Python)."""
    if plan.mode == "bytes":
        return ColumnSpec(COL_BYTES, plan.key, 0, 0, True)
    if plan.mode == "int64":
        return ColumnSpec(COL_INT64, plan.key, 0, plan.count, False)
    if plan.mode in ("float", "raw"):
        return ColumnSpec(COL_FIXED, plan.key, plan.row_bytes, 0, True)
    raise ValueError(f"feature {plan.name!r} ({plan.mode}) is not a native column")


def allocate(alloc: Alloc, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """``alloc(shape, dtype)``, checked: C-contiguous, writable, of exactly that shape."""
    out = alloc(shape, dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(
            f"alloc{shape, dtype} returned an array of shape {out.shape} and dtype "
            f"{out.dtype} (C-contiguous: {out.flags.c_contiguous})"
        )
    if not out.flags.writeable:
        raise ValueError(f"alloc{shape, dtype} returned a read-only array")
    return out


def task_outputs(
    plans: Sequence[FeaturePlan], n: int, bytes_widths: Sequence[int], alloc: Alloc
) -> tuple[np.ndarray, ...]:
    """The output slots of a task of ``n`` records, in slot order.

    ``bytes_widths``: the row width to allocate for each bytes column, in order.
    """
    outs: list[np.ndarray] = []
    widths = iter(bytes_widths)
    for plan in plans:
        if plan.mode == "bytes":
            outs.append(allocate(alloc, (n * next(widths),), _U8))
            outs.append(allocate(alloc, (n,), _I64))
        else:
            outs.append(allocate(alloc, (n, *plan.shape), plan.dtype))
    return tuple(outs)


def task_columns(
    plans: Sequence[FeaturePlan], outs: Sequence[np.ndarray], widths: Sequence[int], n: int
) -> dict[str, Any]:
    """A finished task's columns from its slots, as ``BatchDecoder.decode`` gives them."""
    columns: dict[str, Any] = {}
    slot = 0
    for plan, width in zip(plans, widths, strict=True):
        if plan.mode == "bytes":
            columns[plan.name] = outs[slot][: n * width].reshape(n, width)
            columns[plan.name + "/lengths"] = outs[slot + 1]
            slot += 2
        else:
            columns[plan.name] = outs[slot]
            slot += 1
    return columns


class WidthGuess:
    """The row widths to allocate for a reader's bytes columns in Runner tasks.

    The widest value seen so far, with headroom; a wider one sends its task to the
    reference path, which is exact, and widens the guess. While every task has had
    the same widest value (values of one size, as often), the guess is that width
    exactly: the runner then writes rows where they stay (it closes up rows
    allocated wider, an extra pass over the column). Never more than the task's
    longest payload.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._seen = [0] * len(self.names)
        self._same = [True] * len(self.names)

    def widths(self, widest_payload: int) -> list[int]:
        """One width per bytes column for a task whose longest payload is ``widest_payload``."""
        out = []
        for seen, same in zip(self._seen, self._same, strict=True):
            if not seen:
                guess = widest_payload
            elif same:
                guess = min(widest_payload, seen)
            else:
                guess = min(widest_payload, seen + (seen >> 2) + 64)
            out.append(max(guess, 0))
        return out

    def observe(self, columns: Mapping[str, Any]) -> None:
        """Learn from a finished task's columns (a column is absent when every record was
        skipped)."""
        for k, name in enumerate(self.names):
            col = columns.get(name)
            if col is not None:
                seen, width = self._seen[k], col.shape[1]
                if seen and width != seen:
                    self._same[k] = False
                self._seen[k] = max(seen, width)


def check(native: ModuleType) -> None:
    """Raise ``ImportError`` unless ``native`` defines the contract's constants as here.

    A mismatch means an extension built from other sources than this checkout's
    (a stale ``.so``): decoding with it could give wrong data, so it is refused.
    """
    names = _SHARED + (_RUNNER_ONLY if hasattr(native, "Runner") else ())
    wrong = [n for n in names if getattr(native, n, None) != globals()[n]]
    if wrong:
        raise ImportError(
            f"recordkit.native._ext ({getattr(native, '__file__', '?')}) disagrees with "
            f"recordkit/reader/_contract.py on {', '.join(wrong)}: it was built from other "
            "sources; rebuild it (python setup.py build_ext --inplace, or reinstall recordkit)"
        )
