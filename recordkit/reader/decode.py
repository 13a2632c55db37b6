"""Decode whole batches of records with no per-record Python on the common path.

One native call (``recordkit.native._ext.parse_batch``) checks the framing and CRCs
of every record of a batch, locates each wanted feature's values in the shard,
and flags the records whose values are not where the fast path wants them (one
packed run of the right count). A few more calls copy the values into the
batch arrays: ``gather`` for bytes and floats, ``varints`` for int64s, and for
large records ``gather_verified``, which checks the payload CRC while it copies
the biggest column (one pass over memory instead of two). All of them release
the GIL for the whole batch, so reader threads decode in parallel. Python runs
per batch and per feature, plus per record only where a record needs it:

- a record that the fast path cannot take (a bad CRC, a wrong count, a list
  split over several chunks, ...) is decoded by the reference path
  (:func:`recordkit.format.read_record` + :meth:`recordkit.codec.Schema.decode`),
  which either gives its values or the exact error the reference raises (a
  batch whose fused copy finds a bad CRC is decoded again the plain way);
- zstd tensors are decompressed one record at a time (zstandard releases the GIL);
- ragged numbers whose only ``None`` is the first dim are copied (or their varints
  decoded) for the whole batch by one more native call, from the spans the scan found
  (:func:`~recordkit.reader.decode_run.packed`); other features of variable shape, and
  lists of bytes, are decoded per record.

For every record, the result is what ``Schema.decode(payload, copy=True)``
gives, and a record is reported bad exactly when that (with ``read_record``)
raises.

A shard that another program truncates while it is mapped is an error, never
SIGBUS: ``decode`` checks the map's size before it reads, the native calls read
inside a SIGBUS guard, and the per-record Python work reads private copies made
under the same guard (:mod:`recordkit.format.guard`); both raise
:class:`~recordkit.errors.ShardChangedError` naming the file, offset and record.

``RECORDKIT_NO_NATIVE=1`` swaps the native functions for their pure Python twins
in :mod:`recordkit.reader._fallback` (and leaves only the size checks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import numpy as np

from ..codec import Bytes, Float32, Int64, Schema, Tensor
from ..codec.limits import DecodeLimits
from ..errors import CorruptRecordError, SchemaError, ShardChangedError
from ..format import guard
from ..format.framing import DEFAULT_MAX_RECORD_BYTES
from ..native import ext
from . import _contract, _fallback
from ._contract import Alloc, FeaturePlan
from .decode_run import BatchRun, bytes_lists, packed
from .ragged import check_ragged_as, ragged_axes

__all__ = ["IMPLEMENTATION", "Alloc", "BatchDecoder", "DecodedBatch", "split_bytes"]


def _load() -> tuple[ModuleType, str]:
    if ext is None:  # no C compiler, or RECORDKIT_NO_NATIVE=1: the pure Python twins
        return _fallback, "fallback"
    _contract.check(ext)  # built from other sources: refused, never half-trusted
    return ext, "native"


_impl, IMPLEMENTATION = _load()
"""``"native"`` or ``"fallback"``: which implementation this process decodes with."""

_I64 = np.dtype(np.int64)
_U8 = np.dtype(np.uint8)
_F4 = np.dtype("<f4")


def split_bytes(buf: Any, starts: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """``[bytes(buf[s:s + n]) for s, n in zip(starts, lengths)]``, the objects made by
    one native call (``bytes_lists``): a few times faster than slicing in Python."""
    return _impl.bytes_lists(buf, starts, lengths, None)  # type: ignore[no-any-return]


@dataclass
class DecodedBatch:
    """The result of :meth:`BatchDecoder.decode`.

    Attributes:
        columns: feature name -> one row per good record, in input order: an
            array for fixed-shape features (``name + "/lengths"`` too for padded
            bytes and ragged numbers), else a list of per-record values.
        bad: ``(position in the batch, error)`` for every record that failed;
            the error has no location yet (``err.located(path, offset, record)``).
        n: the number of good records (rows).
        nbytes: framed bytes of all input records, good or bad.
    """

    columns: dict[str, Any]
    bad: list[tuple[int, CorruptRecordError]] = field(default_factory=list)
    n: int = 0
    nbytes: int = 0


class BatchDecoder:
    """Decodes batches of framed records into per-feature batch arrays.

    Safe to share between threads: ``decode`` keeps no state on the instance.

    Args:
        schema: the dataset's schema.
        columns: decode only these features (default all), in schema order.
        verify: check payload CRCs (length CRCs are always checked).
        bytes_as: a scalar :class:`~recordkit.codec.Bytes` feature becomes a
            zero-padded ``uint8`` array ``(n, max_len)`` plus ``name + "/lengths"``
            (``"padded"``), or a list of ``bytes`` (``"list"``).
        ragged_as: a number feature with ``None`` dims becomes a list of arrays
            (``"list"``), or a zero-padded array plus ``name + "/lengths"``
            (``"padded"``, ``recordkit.reader.ragged``).
        limits: the bytes one record, and one call of :meth:`decode`, may
            decompress to (default: derived from the schema, see
            :class:`~recordkit.codec.DecodeLimits`).
        max_record_bytes: a length field above this is corruption.

    Attributes:
        plans: each feature read, how it is located and copied (what a
            :class:`~recordkit.reader.decode_run.BatchRun` reads, with the next four);
            ``list_names``: those decoded per record; ``python_features``: whether any
            needs per-record Python (lists, zstd); ``ragged``: the padded features with
            ``None`` dims and their axes; ``columns_arg``: the reference path's columns.

    Raises:
        SchemaError: a column not in the schema, or a padded column's
            ``"/lengths"`` name taken by another feature.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        columns: Sequence[str] | None = None,
        verify: bool = True,
        bytes_as: Literal["padded", "list"] = "padded",
        limits: DecodeLimits | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        ragged_as: Literal["padded", "list"] = "list",
    ) -> None:
        if bytes_as not in ("padded", "list"):
            raise ValueError(f"bytes_as must be 'padded' or 'list', got {bytes_as!r}")
        check_ragged_as(ragged_as)
        if max_record_bytes < 0:
            raise ValueError(f"max_record_bytes must be >= 0, got {max_record_bytes}")
        if limits is not None and not isinstance(limits, DecodeLimits):
            raise TypeError(f"limits must be a DecodeLimits or None, got {limits!r}")
        if columns is not None:
            if isinstance(columns, str):
                raise SchemaError(f"columns must be a sequence of names, got the str {columns!r}")
            unknown = [c for c in columns if c not in schema]
            if unknown:
                raise SchemaError(f"columns not in the schema: {unknown}; it has {list(schema)}")
        self.schema = schema
        self.verify = bool(verify)
        self.bytes_as = bytes_as
        self.limits = limits or DecodeLimits()
        self.max_record_bytes = max_record_bytes
        wanted = set(schema.names if columns is None else columns)
        self.columns: tuple[str, ...] = tuple(n for n in schema.names if n in wanted)
        self.columns_arg = None if columns is None else list(self.columns)
        self.ragged_as = ragged_as
        self.ragged = ragged_axes(schema, self.columns) if ragged_as == "padded" else {}
        self.plans, keys = self._plan()
        # surrogatepass: a name no record can hold (a lone surrogate) still gets a key
        self._keys = tuple(k.encode("utf-8", "surrogatepass") for k in keys)
        # What the fast path needs of each fast feature's span: (kind, count, nbytes).
        fast = [p for p in self.plans if p.mode != "list"]
        self._expect = np.array([_contract.expected(p) for p in fast], np.int64).reshape(-1, 3)
        self.list_names = [p.name for p in self.plans if p.mode == "list"]
        # ragged numbers copied for the whole batch (decode_run.packed), not per record
        self.packed = packed(self.plans, keys)
        # lists of bytes made into bytes for the whole batch (decode_run.bytes_lists)
        self.bytes_lists = bytes_lists(self.plans, keys)
        self.python_features = any(p.mode in ("list", "zstd") for p in self.plans)
        self._fusable = [
            p
            for p in self.plans
            if p.mode in ("raw", "float") or (p.mode == "bytes" and bytes_as == "padded")
        ]
        names = {p.name for p in self.plans if p.mode == "bytes" and bytes_as == "padded"}
        for name in names:
            if name + "/lengths" in schema:
                raise SchemaError(
                    f"feature {name + '/lengths'!r} collides with the lengths column of "
                    f"padded bytes feature {name!r}; use bytes_as='list'"
                )

    def _plan(self) -> tuple[list[FeaturePlan], list[str]]:
        plans: list[FeaturePlan] = []
        fast_keys: list[str] = []
        slow_keys: list[str] = []
        for name in self.columns:
            ftype = self.schema[name]
            shape = ftype.shape
            fixed = None not in shape
            count = math.prod(d for d in shape if d is not None)
            key = len(fast_keys)
            if isinstance(ftype, Int64) and fixed:
                plan = FeaturePlan(name, ftype, "int64", key, _ints(shape), _I64, 8 * count, count)
            elif isinstance(ftype, Float32) and fixed:
                plan = FeaturePlan(name, ftype, "float", key, _ints(shape), _F4, 4 * count, count)
            elif isinstance(ftype, Tensor) and fixed:
                dtype = np.dtype(ftype.dtype)
                mode = "zstd" if ftype.compression else "raw"
                nbytes = count * dtype.itemsize
                plan = FeaturePlan(name, ftype, mode, key, _ints(shape), dtype, nbytes, count)
            elif isinstance(ftype, Bytes) and not shape:
                plan = FeaturePlan(name, ftype, "bytes", key)
            else:
                plan = FeaturePlan(name, ftype, "list", -1)
                slow_keys.append(name)
                if ftype.shape_feature:
                    slow_keys.append(f"{name}/shape")
            if plan.mode != "list":
                fast_keys.append(name)
            plans.append(plan)
        return plans, fast_keys + slow_keys

    # ------------------------------------------------------------- whole tasks

    @property
    def impl(self) -> ModuleType:
        """The native functions, or their pure Python twins (``IMPLEMENTATION``)."""
        return _impl

    def runner(self) -> Any | None:
        """A ``recordkit.native._ext.Runner`` decoding whole tasks with no GIL, or ``None``.

        ``None`` when the native extension is not in use, or when a feature needs
        Python per record (zstd tensors, variable shapes, lists, ``bytes_as="list"``):
        :meth:`decode` on reader threads then. The runner takes exactly the records
        :meth:`decode` takes on its fast path and gives identical columns (see
        :meth:`runner_outputs`, :meth:`runner_columns`); any other record makes its
        task fall back to :meth:`decode`.
        """
        runner_type = getattr(_impl, "Runner", None)
        if runner_type is None or self.python_features or not self.plans:
            return None
        if self.bytes_as == "list" and any(p.mode == "bytes" for p in self.plans):
            return None
        return runner_type(
            self._keys,
            self._expect,
            tuple(_contract.column_spec(plan) for plan in self.plans),
            self.verify,
            self.max_record_bytes,
            _contract.FUSE_MIN_BYTES,
        )

    def packed_runner(self, lists: dict[str, _contract.ColumnSpec]) -> Any | None:
        """A ``Runner`` like :meth:`runner`'s whose columns are the fast features' (in
        schema order, slots as :meth:`runner_outputs`) and then, for each feature decoded
        per record (``"list"``), the packed or list column ``lists`` gives for it, its key
        set here (``recordkit.tf``'s native path: ragged numbers, lists of bytes).

        ``None`` without the native ``Runner``, or when a feature decoded per record is
        not in ``lists`` (zstd tensors, a ``name/shape`` companion), or with
        ``bytes_as="list"`` bytes.
        """
        runner_type = getattr(_impl, "Runner", None)
        slow = [p for p in self.plans if p.mode == "list"]
        if (
            runner_type is None
            or not self.plans
            or any(p.mode == "zstd" for p in self.plans)
            or any(p.name not in lists for p in slow)
            or (self.bytes_as == "list" and any(p.mode == "bytes" for p in self.plans))
        ):
            return None
        fast = [p for p in self.plans if p.mode != "list"]
        keys = [k.decode("utf-8", "surrogatepass") for k in self._keys]
        columns = [_contract.column_spec(p) for p in fast]
        columns += [lists[p.name]._replace(key=keys.index(p.name)) for p in slow]
        anything = np.full((len(slow), 3), _contract.ANY, np.int64)
        return runner_type(
            self._keys,
            np.concatenate([self._expect, anything]),
            tuple(columns),
            self.verify,
            self.max_record_bytes,
            _contract.FUSE_MIN_BYTES,
        )

    def runner_outputs(
        self, n: int, bytes_widths: Sequence[int], alloc: Alloc
    ) -> tuple[np.ndarray, ...]:
        """The output arrays of a runner task of ``n`` records, in slot order.

        ``bytes_widths`` gives, for each bytes feature in schema order, the row
        width to allocate: a task whose widest value is wider is left to
        :meth:`decode`.
        """
        return _contract.task_outputs(self.plans, n, bytes_widths, alloc)

    def runner_columns(
        self, outs: Sequence[np.ndarray], widths: Sequence[int], n: int
    ) -> dict[str, Any]:
        """The columns of a finished runner task (as :meth:`decode` gives them)."""
        return _contract.task_columns(self.plans, outs, widths, n)

    @property
    def bytes_features(self) -> list[str]:
        """The padded bytes features, in schema order (one width each for the runner)."""
        return [p.name for p in self.plans if p.mode == "bytes"]

    # ------------------------------------------------------------------ decode

    def decode(
        self,
        buf: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        alloc: Alloc | None = None,
        *,
        path: str | None = None,
        records: np.ndarray | None = None,
    ) -> DecodedBatch:
        """Decode the records at ``offsets`` (framed ``sizes`` from the index) of ``buf``.

        Args:
            buf: the shard's bytes (an ``mmap``, or any contiguous buffer).
            offsets: int64 record start offsets.
            sizes: int64 framed sizes (payload + 16), as the index gives them.
            alloc: allocates every batch-sized output array, ``alloc(shape, dtype)``
                (default ``np.empty``); it must return a C-contiguous writable
                array of exactly that shape and dtype.
            path: the shard's file, for a :class:`ShardChangedError`.
            records: the records' numbers in the shard, for the same.

        Returns:
            The good records' columns and the bad records' errors.

        Raises:
            ShardChangedError: ``buf`` is a map whose file shrank (before
                or while it was read), naming the first record it cuts off.
        """
        offsets = np.asarray(offsets, _I64)
        sizes = np.asarray(sizes, _I64)
        if offsets.ndim != 1 or sizes.shape != offsets.shape:
            raise ValueError(
                f"offsets and sizes must be 1-d and of equal length, got shapes "
                f"{offsets.shape} and {sizes.shape}"
            )
        nbytes = int(sizes.sum())
        fuse = (
            self.verify
            and bool(self._fusable)
            and nbytes >= len(offsets) * _contract.FUSE_MIN_BYTES
        )
        try:
            if len(offsets):
                guard.check_size(buf)
            batch = self._decode(buf, offsets, sizes, nbytes, fuse, alloc or np.empty)
            if batch is None:  # a payload CRC failed in the fused copy: the plain way finds it
                batch = self._decode(buf, offsets, sizes, nbytes, False, alloc or np.empty)
            assert batch is not None
            if batch.bad:  # bad bytes from a map whose file shrank since are that change
                guard.check_size(buf)
        except (guard.MapFault, ShardChangedError) as exc:
            err = guard.changed_in_batch(buf, offsets, sizes, path, records, exc)
        else:
            return batch
        # Raised here, with no context: the failed call's frames hold views of buf.
        raise err

    def _decode(
        self,
        buf: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        nbytes: int,
        fuse: bool,
        alloc: Alloc,
    ) -> DecodedBatch | None:
        n = len(offsets)
        # Records whose spans are not what the fast path expects get a nonzero
        # status too: whatever is unusual about a record, the reference decides.
        # With fuse, payload CRCs are checked later, by gather_verified.
        status_b, spans_b = _impl.parse_batch(
            buf,
            offsets,
            sizes,
            self._keys,
            self.verify and not fuse,
            self.max_record_bytes,
            self._expect,
        )
        status = np.frombuffer(status_b, np.int32)
        spans = np.frombuffer(spans_b, np.int64).reshape(n, len(self._keys), 4)
        run = BatchRun(self, buf, offsets, sizes, spans, status)
        if fuse:  # the column with the most bytes
            run.fused = max(self._fusable, key=lambda p: int(spans[:, p.key, 3].sum())).name
        try:
            columns, rows = run.finish(alloc)
        finally:
            run.view = None  # never keep buf exported past the call
        if run.crc_failed:
            return None
        return DecodedBatch(columns, run.bad, rows, nbytes)


def _ints(shape: tuple[int | None, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d is not None)
