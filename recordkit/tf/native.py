"""``recordkit.tf``'s native path: a task's records decoded in C straight into dense tensors.

For the schemas :func:`takes`, one stateless ``tf.numpy_function`` per task of the epoch
plan (:class:`~recordkit.tf.tasks.PlanTasks`) hands the task's records, in stream order,
to the torch reader's :class:`~recordkit.reader.decode.BatchDecoder`: its runner checks
framing and CRCs, parses and copies in C with the GIL released once; a record it does
not take sends the task to the reference decoder (exact values, or the error naming
file, offset and record). No ``parse_example`` on the way. The arrays come from a
:class:`~recordkit.reader.buffers.BufferPool` of 64-byte aligned slabs, which
``numpy_function`` wraps without a copy and the pool takes back when TensorFlow lets go
(fresh memory costs a page fault per 4 KiB: 35 ms for a 16 MiB task instead of 2.4 ms);
a pass's end lets the slabs go (:meth:`NativeTasks.release`). ``Bytes()`` values leave
as padded ``uint8`` rows and lengths (``bytes_as="padded"``), or become ``tf.string``
through the ``RecordkitStrings`` op (``recordkit/native/tfop.cc``), else through
``tf.strings.substr`` (``RECORDKIT_NO_TFOP=1``: two copies more, same values).
``docs/tensorflow.md`` (the native path) says which schemas take it and why.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._deps import require
from ..codec import Bytes, Float32, Int64, Schema, Tensor
from ..codec.limits import DecodeLimits
from ..format.framing import OVERHEAD
from ..reader import decode as _decode
from ..reader import task_lists
from ..reader.buffers import BufferPool
from ..reader.decode import BatchDecoder
from ..reader.task_lists import TaskLists
from .decode import tf_dtype
from .tasks import PlanTasks
from .tasks import groups as shard_groups

tf = require("tensorflow", extra="tf")

__all__ = ["NativeTasks", "strings_op", "takes"]

log = logging.getLogger(__name__)

# Bytes() values from this size up become views into the task's buffer, smaller ones are
# copied (recordkit/native/tfop.cc says why). W1/W2 (256 KiB / 1 KiB values) read at the same
# speed with 0 and 4096 here; a view keeps the whole task buffer alive.
_VIEW_MIN = 4096
# The text that recordkit/native/tfop.cc embeds before the TensorFlow version it was built for.
_BUILT_FOR = b"recordkit-tfop-built-for-tensorflow "
_NO_OP = object()
_op: Any = None  # the loaded op library, _NO_OP once it failed to load


def strings_op() -> Any | None:
    """The ``RecordkitStrings`` op (``tf.load_op_library`` of ``recordkit/native/_tfop*.so``), or
    ``None``: not built, ``RECORDKIT_NO_TFOP=1``, or built for another TensorFlow."""
    global _op
    if os.environ.get("RECORDKIT_NO_TFOP", "") not in ("", "0"):
        return None
    if _op is None:
        _op = _load() or _NO_OP
    return None if _op is _NO_OP else _op


def _load() -> Any | None:
    native = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "native")
    found = sorted(glob.glob(os.path.join(native, "_tfop*.so")))
    if not found:
        return None
    path = found[0]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    at = data.find(_BUILT_FOR)
    built = data[at + len(_BUILT_FOR) : data.find(b"\0", at)].decode() if at >= 0 else "?"
    if built != tf.__version__:  # another TensorFlow's ABI: never loaded
        log.info(
            "recordkit.tf: %s was built for TensorFlow %s, this is %s; tf.string values take "
            "the substr path (reinstall recordkit to rebuild it)",
            path,
            built,
            tf.__version__,
        )
        return None
    try:
        return tf.load_op_library(path)
    except Exception as exc:  # any failure to load means the fallback
        log.info(
            "recordkit.tf: %s does not load (%s); tf.string values take the substr path", path, exc
        )
        return None


def takes(schema: Schema, names: Sequence[str]) -> bool:
    """Whether every feature in ``names`` decodes natively into a dense or ragged tensor
    (``RECORDKIT_TF_NATIVE=0`` turns the native path off: ``parse_example`` then).

    Taken: the runner's columns (``recordkit/reader/_contract.py``; ragged ones
    :func:`~recordkit.reader.task_lists.list_column`): fixed-shape
    ``Int64``/``Float32``, uncompressed fixed-shape ``Tensor``, and ``Bytes()``, with
    or without a default; and its packed and list columns: numbers whose first dim is
    the only ``None`` (``Int64((None,))``, ``Float32((None, 4))``, an uncompressed
    ``Tensor(dtype, (None, ...))``), lists of bytes (``Bytes((n,))``, ``Bytes((None,))``).
    Not taken: zstd tensors (decompressed per record in Python), ``None`` past the first
    dim or two ``None`` dims (a ``name/shape`` companion per record), a fixed dim of 0.
    """
    if os.environ.get("RECORDKIT_TF_NATIVE", "") == "0":
        return False
    if _decode.IMPLEMENTATION != "native" or not names:
        return False
    for name in names:
        ftype = schema[name]
        if None in ftype.shape and task_lists.list_column(ftype) is None:
            return False
        if isinstance(ftype, Bytes):
            if (not ftype.shape and name + "/lengths" in schema) or 0 in ftype.shape:
                return False
        elif isinstance(ftype, Tensor):
            if ftype.compression:
                return False
        elif not isinstance(ftype, (Int64, Float32)):
            return False
    return True


def _as_parsed(schema: Schema, names: Sequence[str]) -> Schema:
    """``schema`` with each feature ``parse_example`` reads as a ``RaggedFeature``
    (numbers with ``None`` dims, ``Bytes((None,))``) defaulting to no values: a record
    without it reads so on every path (the reference decoder would refuse it)."""
    features = {}
    for name in schema.names:
        ftype = schema[name]
        ragged = None in ftype.shape and not isinstance(ftype, Tensor)
        if name in names and ragged and ftype.required:
            ftype = dataclasses.replace(ftype, default=[])
        features[name] = ftype
    return Schema(features)


def _aligned(nbytes: int) -> np.ndarray:
    """A slab whose data is 64-byte aligned: TensorFlow wraps (not copies) such arrays."""
    raw = np.empty(nbytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + nbytes]


class _Slabs:
    """Makes a pool's slabs (:func:`_aligned`) and counts those alive: in the pool's
    free list, or under arrays not yet let go of."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live = 0

    def __call__(self, nbytes: int) -> np.ndarray:
        slab = _aligned(nbytes)
        with self._lock:
            self.live += 1
        weakref.finalize(slab, self._gone)
        return slab

    def _gone(self) -> None:
        with self._lock:
            self.live -= 1


class NativeTasks:
    """Decodes the tasks of ``tasks`` into one dense tensor per feature (see the module docs).

    Args:
        tasks: the pipeline's tasks (the plan's records, the shard set, a cache feed).
        schema: the schema; every feature in ``names`` must be one :func:`takes` takes.
        names: the features to read, in schema order.
        limits: the decode limits (the records' bytes are checked against them).
    """

    def __init__(
        self,
        tasks: PlanTasks,
        schema: Schema,
        names: Sequence[str],
        limits: DecodeLimits | None,
        padded: bool = False,
    ) -> None:
        self.tasks = tasks
        self.padded = padded
        self.names = list(names)
        self.decoder = BatchDecoder(
            _as_parsed(schema, self.names),
            columns=self.names,
            bytes_as="padded",
            ragged_as="list",
            limits=limits,
        )
        # The runner's columns: the fixed features' (slots as the torch reader's), then a
        # packed or list column per ragged number or list of bytes (see takes).
        self.columns = TaskLists(self.decoder)
        self.lists = self.columns.lists
        self.inner: dict[str, tuple[int, ...]] = {}  # a ragged number's dims after the first
        # Free slabs kept: three tasks' worth. Tasks in flight come back to the pool as
        # TensorFlow lets go of them; more kept is anonymous memory held for nothing.
        task = tasks.task_units * (tasks.options.batch_size or 1) * tasks.shards.avg_record_bytes
        self._keep = max(8 << 20, int(3 * task))
        self._slabs = _Slabs()
        self.pool = BufferPool(self._keep, allocate=self._slabs)
        lists_of_bytes = any(isinstance(schema[n], Bytes) for n in self.lists)
        self.op = None if padded and not lists_of_bytes else strings_op()
        self.bytes = [n for n in self.names if isinstance(schema[n], Bytes) and not schema[n].shape]
        # The whole task in one native call (GIL released once), where the build has it.
        self.runner = self.columns.runner
        # The widest value of each bytes feature so far: the row width given to the runner
        # (a wider value refuses its task, decoded then the exact way, which widens it).
        self._widths = [0] * len(self.bytes)
        self.dtypes: dict[str, np.dtype[Any]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for n in self.names:
            ftype = schema[n]
            if isinstance(ftype, Tensor):
                self.dtypes[n] = np.dtype(ftype.dtype)
            elif isinstance(ftype, Int64):
                self.dtypes[n] = np.dtype(np.int64)
            elif isinstance(ftype, Float32):
                self.dtypes[n] = np.dtype("<f4")
            elif n in self.lists:
                self.dtypes[n] = np.dtype(object)  # tf.string
            self.shapes[n] = tuple(int(d) for d in ftype.shape if d is not None)
            if n in self.lists and not isinstance(ftype, Bytes):
                self.inner[n] = self.shapes[n]

    # -- in the numpy_function: no TensorFlow ---------------------------------------------

    def read(self, epoch: Any, task: Any) -> list[np.ndarray]:
        """A task's columns, in stream order: per feature, its array; a bytes feature
        gives ``(rows, lengths)`` when padded, else ``(values, starts, lengths)``
        (``values``: ``uint8`` for the op, or a one-element ``S`` array for ``substr``).

        Raises:
            CorruptRecordError: a record's framing, CRC or payload is bad (naming file,
                offset and record), as the ``parse_example`` path raises it.
            ShardChangedError: a shard changed under the reader.
        """
        self.pool.max_free_bytes = self._keep  # a pass reads: its slabs are reused
        feed = self.tasks.feed
        if feed is None:
            return self._read(int(epoch), int(task))
        feed.begin(int(epoch), int(task))
        try:
            return self._read(int(epoch), int(task))
        finally:
            feed.done(int(epoch), int(task))

    def _read(self, epoch: int, task: int) -> list[np.ndarray]:
        shard, rec = self.tasks.records(epoch, task)
        groups = shard_groups(shard)
        if self.runner is not None and len(rec):
            # Parallel calls each hold their task's shards: pieces of a quarter of the budget.
            cap = max(1, self.tasks.shards.max_open // 4)
            parts = []
            for lo in range(0, len(groups), cap):
                part = self._run(groups[lo : lo + cap], rec)
                if part is None:  # a record the runner does not take: the exact way
                    break
                parts.append(part)
            else:
                return self._join(len(rec), parts)
        return self._join(len(rec), self._decode(groups, rec))

    def _run(
        self, piece: list[tuple[int, np.ndarray]], rec: np.ndarray
    ) -> tuple[np.ndarray, dict[str, Any]] | None:
        """The runner's columns for the records of ``piece`` (their shards' groups), in
        stream order, with the GIL released once; ``None`` if it refused a record."""
        shards = self.tasks.shards
        assert self.runner is not None  # _read calls this only with a runner
        pos = piece[0][1] if len(piece) == 1 else np.sort(np.concatenate([i for _, i in piece]))
        table = np.empty((len(pos), 3), np.int64)  # (shard slot, offset, framed size)
        held = shards.acquire_many([s for s, _ in piece])
        try:
            for slot, (m, (_, idx)) in enumerate(zip(held, piece)):
                m.check()
                # the table's rows are pos's: one group's are all of them, in its order
                at = slice(None) if len(piece) == 1 else np.searchsorted(pos, idx)
                table[at, 0] = slot
                table[at, 1], table[at, 2] = m.lookup(rec[idx])
            widest = int(table[:, 2].max()) - OVERHEAD
            widths = [min(widest, w) if w else widest for w in self._widths]
            bufs = tuple(m.buf for m in held)
            done = self.columns.run(bufs, table, widths, self.pool.alloc)
        finally:
            for m in held:
                shards.release(m)
        if done is None:
            return None
        columns = done
        self._widths = [max(w, columns[n].shape[1]) for w, n in zip(self._widths, self.bytes)]
        return pos, columns

    def _decode(self, groups: list[tuple[int, np.ndarray]], rec: np.ndarray) -> list[Any]:
        """The columns of each shard's records by :meth:`BatchDecoder.decode`: exact for
        every record the runner does not take (its values, or its error, located)."""
        parts = []
        for s, idx in groups:
            with self.tasks.shards.use(s) as m:
                m.check()
                r = rec[idx]
                batch = self.decoder.decode(
                    m.buf, m.offsets[r], m.sizes[r], self.pool.alloc, path=m.path, records=r
                )
                if batch.bad:
                    pos, err = batch.bad[0]
                    i = int(r[pos])
                    raise err.located(m.path, int(m.offsets[i]), i)
            columns = dict(batch.columns)
            for name in self.lists:
                dtype = self.dtypes[name] if name in self.inner else None
                columns[name] = task_lists.from_records(columns[name], dtype)
            parts.append((idx, columns))
            for k, n in enumerate(self.bytes):
                self._widths[k] = max(self._widths[k], batch.columns[n].shape[1])
        return parts

    def _ragged(
        self, n: int, name: str, parts: list[tuple[np.ndarray, dict[str, Any]]]
    ) -> list[np.ndarray]:
        """A ragged feature's task arrays, in stream order: numbers ``[values, splits]``
        (flat values; where each record's rows of the first dim start, and the end), bytes
        lists ``[bytes, starts, lengths, splits]`` (``bytes`` for the op or ``substr`` as
        :meth:`_bytes` gives; splits of the values)."""
        if name in self.inner:
            if len(parts) == 1:
                values, rows = parts[0][1][name]
                return [values, task_lists.splits(rows)]
            unit = math.prod(self.inner[name])
            rows = task_lists.scatter(n, [(idx, cols[name][1]) for idx, cols in parts])
            values = task_lists.gather(
                rows * unit,
                [(idx, cols[name][1] * unit, cols[name][0]) for idx, cols in parts],
                self.dtypes[name],
            )
            return [values, task_lists.splits(rows)]
        if len(parts) == 1:
            values, lengths, counts = parts[0][1][name]
        else:
            counts = task_lists.scatter(n, [(idx, cols[name][2]) for idx, cols in parts])
            lengths = task_lists.gather(
                counts, [(idx, cols[name][2], cols[name][1]) for idx, cols in parts], np.int64
            )
            sizes = [(idx, task_lists.sums(cols[name][1], cols[name][2])) for idx, cols in parts]
            values = task_lists.gather(
                task_lists.scatter(n, sizes),
                [(idx, size, cols[name][0]) for (idx, size), (_, cols) in zip(sizes, parts)],
                np.uint8,
            )
        starts = np.cumsum(lengths) - lengths
        if self.op is None:  # substr: one tf.string holding them all (a nonzero last byte)
            values = np.append(values, np.uint8(0xFF)).view(f"S{len(values) + 1}")
        return [values, starts, lengths, task_lists.splits(counts)]

    def _join(self, n: int, parts: list[tuple[np.ndarray, dict[str, Any]]]) -> list[np.ndarray]:
        """The parts' columns as one task's, in stream order (one part: as they are)."""
        out: list[np.ndarray] = []
        one = len(parts) == 1
        for name in self.names:
            if name in self.lists:
                out.extend(self._ragged(n, name, parts))
                continue
            if name in self.bytes:
                out.extend(
                    self._rows(n, name, parts) if self.padded else self._bytes(n, name, parts)
                )
                continue
            if one:
                out.append(parts[0][1][name])
                continue
            col = self.pool.alloc((n, *self.shapes[name]), self.dtypes[name])
            for idx, cols in parts:
                col[idx] = cols[name]
            out.append(col)
        return out

    def _rows(
        self, n: int, name: str, parts: list[tuple[np.ndarray, dict[str, Any]]]
    ) -> list[np.ndarray]:
        """A bytes feature's zero-padded rows ``(n, widest)`` and lengths (``bytes_as=
        "padded"``): the part's as they are, or several parts' in one array."""
        if len(parts) == 1:
            return [parts[0][1][name], parts[0][1][name + "/lengths"]]
        width = max(cols[name].shape[1] for _, cols in parts)
        rows = self.pool.alloc((n, width), np.dtype(np.uint8))
        lengths = np.empty(n, np.int64)
        for idx, cols in parts:
            part = cols[name]
            rows[idx, : part.shape[1]] = part
            rows[idx, part.shape[1] :] = 0
            lengths[idx] = cols[name + "/lengths"]
        return [rows, lengths]

    def _bytes(
        self, n: int, name: str, parts: list[tuple[np.ndarray, dict[str, Any]]]
    ) -> list[np.ndarray]:
        """A bytes feature's ``(values, starts, lengths)``: the parts' padded rows one after
        another (a copy only with several parts, or for the ``substr`` fallback)."""
        starts = np.empty(n, np.int64)
        lengths = np.empty(n, np.int64)
        at = 0
        for idx, cols in parts:
            rows = cols[name]
            width = rows.shape[1]
            starts[idx] = at + np.arange(len(idx), dtype=np.int64) * width
            lengths[idx] = cols[name + "/lengths"]
            at += rows.size
        if self.op is not None and len(parts) == 1:
            return [parts[0][1][name].reshape(-1), starts, lengths]
        values = self.pool.alloc((at + (self.op is None),), np.dtype(np.uint8))
        at = 0
        for _, cols in parts:
            rows = cols[name]
            values[at : at + rows.size] = rows.reshape(-1)
            at += rows.size
        if self.op is not None:
            return [values, starts, lengths]
        values[at] = 0xFF  # NumPy's S type drops trailing NULs: a nonzero last byte keeps them
        return [values.view(f"S{at + 1}"), starts, lengths]

    def release(self) -> None:
        """A pass read its last task: let go of the pool's free slabs, and of each slab
        TensorFlow lets go of from now on, until the next read (the next pass)."""
        self.pool.max_free_bytes = 0
        self.pool.clear()

    @property
    def live_slabs(self) -> int:
        """The pool's slabs alive: free in the pool, or under tensors still held."""
        return self._slabs.live

    # -- in the graph -------------------------------------------------------------------------

    def _strings(self, values: Any, starts: Any, lengths: Any) -> Any:
        """``tf.string`` values cut from a task's bytes (the op's copies, or ``substr``)."""
        if self.op is not None:
            value = self.op.recordkit_strings(values, starts, lengths, view_min_bytes=_VIEW_MIN)
        else:
            value = tf.strings.substr(tf.reshape(values, []), starts, lengths)
        value.set_shape([None])
        return value

    def trimmed(self, element: dict[str, Any]) -> dict[str, Any]:
        """A batch (or record) cut from a task's padded rows, each bytes feature cut to its
        longest value (a record's: its length), the width the torch reader and the
        other paths give; a record's ragged values as dense tensors."""
        out = dict(element)
        for name in self.bytes if self.padded else ():
            rows, lengths = element[name], element[name + "/lengths"]
            out[name] = rows[..., : tf.reduce_max(lengths)]
        return out

    def element(
        self, epoch: Any, task: Any, saw: Callable[[int], None], flat: bool = False
    ) -> dict[str, Any]:
        """The task's records as ``{name: tensor [n, *shape]}`` (a bytes feature: ``tf.string``
        ``[n]``, or padded ``uint8`` ``[n, widest]`` and ``name/lengths``; a ragged one:
        ``tf.RaggedTensor`` ``[n, None, ...]``, or with ``flat`` its ``(values,
        row_splits)`` for :meth:`batches`), from one ``numpy_function`` (which tells ``saw``
        the epoch first)."""

        def read(e: Any, t: Any) -> list[np.ndarray]:
            saw(int(e))
            return self.read(e, t)

        tout = []
        for name in self.names:
            if name in self.inner:
                tout += [tf_dtype(self.dtypes[name]), tf.int64]
            elif name in self.lists:
                tout += [tf.uint8 if self.op is not None else tf.string] + [tf.int64] * 3
            elif name in self.bytes and self.padded:
                tout += [tf.uint8, tf.int64]
            elif name in self.bytes:
                tout += [tf.uint8 if self.op is not None else tf.string, tf.int64, tf.int64]
            else:
                tout.append(tf_dtype(self.dtypes[name]))
        arrays = tf.numpy_function(read, [epoch, task], tout, stateful=False)
        out: dict[str, Any] = {}
        k = 0
        for name in self.names:
            if name in self.inner:  # ragged numbers: [n, None, *inner]
                values, splits = arrays[k : k + 2]
                k += 2
                splits.set_shape([None])
                out[name] = (tf.reshape(values, [-1, *self.inner[name]]), splits)
                continue
            if name in self.lists:  # lists of bytes: [n, count] or ragged [n, None]
                values, starts, lengths, splits = arrays[k : k + 4]
                k += 4
                strings = self._strings(values, starts, lengths)
                splits.set_shape([None])
                count = self.shapes[name]
                out[name] = tf.reshape(strings, [-1, count[0]]) if count else (strings, splits)
                continue
            if name in self.bytes and self.padded:
                out[name], out[name + "/lengths"] = arrays[k : k + 2]
                out[name].set_shape([None, None])
                out[name + "/lengths"].set_shape([None])
                k += 2
                continue
            if name in self.bytes:
                values, starts, lengths = arrays[k : k + 3]
                k += 3
                value = self._strings(values, starts, lengths)
            else:
                value = arrays[k]
                k += 1
                value.set_shape([None, *self.shapes[name]])
            out[name] = value
        return out if flat else self.ragged(out)

    @staticmethod
    def ragged(element: dict[str, Any]) -> dict[str, Any]:
        """An element whose ragged features are ``(values, row_splits)`` with them as
        ``tf.RaggedTensor``."""
        return {
            name: (
                tf.RaggedTensor.from_row_splits(*value, validate=False)
                if isinstance(value, tuple)
                else value
            )
            for name, value in element.items()
        }

    def batches(self, element: dict[str, Any], batch_size: int) -> Any:
        """A task's batches (the last may be short), cut from its :meth:`element` with
        ``flat``, by slicing values and row splits (``rebatch`` of the task's
        ragged tensors: 157,000 records/s on ragged_bench's ``numbers``, these slices
        185,000; an eager loop over ready batches of the same: 254,000)."""
        first = element[self.names[0]]
        n = tf.shape(first[1])[0] - 1 if isinstance(first, tuple) else tf.shape(first)[0]
        size = tf.constant(batch_size, n.dtype)

        def cut(j: Any) -> dict[str, Any]:
            lo = tf.cast(j, n.dtype) * size
            hi = tf.minimum(lo + size, n)
            out = {}
            for name, value in element.items():
                if isinstance(value, tuple):
                    values, splits = value
                    splits = splits[lo : hi + 1]
                    values = values[splits[0] : splits[-1]]
                    out[name] = tf.RaggedTensor.from_row_splits(
                        values, splits - splits[0], validate=False
                    )
                else:
                    out[name] = value[lo:hi]
            return out

        count = tf.cast((n + size - 1) // size, tf.int64)
        return tf.data.Dataset.range(count).map(cut)
