"""One call of :meth:`BatchDecoder.decode <recordkit.reader.decode.BatchDecoder.decode>`:
the per-record work and the assembly of the batch's columns (:class:`BatchRun`).

The decoder plans the features once and runs the native scan; a run takes the scan's
result for one batch, decodes the records the fast path flagged (zstd values, lists,
the reference path for anything else, under the SIGBUS guard), and copies every
column into the batch arrays. The decoder itself keeps no per-call state.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import numpy as np

from ..codec import Bytes, Int64, Tensor
from ..errors import CorruptRecordError
from ..format import guard
from ..format.framing import HEADER_SIZE, OVERHEAD, read_record
from ._contract import (
    KIND_ABSENT,
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT64,
    KIND_NONE,
    Alloc,
    FeaturePlan,
)
from ._contract import allocate as _alloc
from .ragged import first_dim_ragged, number_dtype, pad

if TYPE_CHECKING:
    from ..codec.limits import DecodeBudget, DecodeLimits
    from ..codec.schema import Schema

__all__ = ["BatchRun", "BytesLists", "Packed", "Planned", "bytes_lists", "packed", "unlocated"]

_I64 = np.dtype(np.int64)
_U8 = np.dtype(np.uint8)


def _new(alloc: Alloc, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An array of its own (``ragged_as="list"``: each record's value a view of it)."""
    return np.empty(shape, dtype)


def unlocated(err: CorruptRecordError) -> CorruptRecordError:
    """A copy without location or traceback: nothing in it may keep the buffer exported."""
    copy = err.located(None, None, None)
    copy.__cause__ = None
    return copy


class Packed(NamedTuple):
    """A ragged number feature (``None`` as its first dim only) whose records' values are
    copied (or their varints decoded) for the whole batch at once, not per record."""

    key: int  # its index in the decoder's keys (the scan's spans)
    kind: int  # the list a record holds: KIND_INT64, KIND_FLOAT, or KIND_BYTES (a Tensor)
    unit: int  # per row of the first dim: values (int64) or bytes (the others)
    inner: tuple[int, ...]  # the dims after the first
    dtype: np.dtype[Any]
    empty_ok: bool  # a record without it (a default of []) has no rows


def packed(plans: list[FeaturePlan], keys: list[str]) -> dict[str, Packed]:
    """The ``"list"`` features :class:`BatchRun` decodes for the whole batch: numbers whose
    only ``None`` is the first dim, uncompressed (``Int64((None,))``, ``Float32((None,
    4))``, ``Tensor(dtype, (None, 2))``); the others stay per record."""
    out: dict[str, Packed] = {}
    for plan in plans:
        ftype = plan.ftype
        inner = first_dim_ragged(ftype) if plan.mode == "list" else None
        if inner is None:
            continue
        dtype = number_dtype(ftype)
        count = math.prod(inner)
        if isinstance(ftype, Int64):
            kind, unit = KIND_INT64, count
        elif isinstance(ftype, Tensor):
            kind, unit = KIND_BYTES, count * dtype.itemsize
        else:
            kind, unit = KIND_FLOAT, count * 4
        out[plan.name] = Packed(keys.index(plan.name), kind, unit, inner, dtype, not ftype.required)
    return out


def _taken(spans: np.ndarray, pk: Packed) -> np.ndarray:
    """Per record, whether its value of ``pk`` is one :meth:`BatchRun._packed_column` copies:
    one list of its kind in one chunk, a whole number of rows (or absent, if that is
    no rows); anything else is left to the per-record decoder (its values or error)."""
    kind, count, nbytes = spans[:, pk.key, 0], spans[:, pk.key, 1], spans[:, pk.key, 3]
    size = count if pk.kind == KIND_INT64 else nbytes
    ok = (kind == pk.kind) & (size % pk.unit == 0)
    if pk.kind == KIND_BYTES:
        ok &= count == 1
    elif pk.kind == KIND_FLOAT:
        ok &= nbytes == 4 * count
    if pk.empty_ok:
        ok |= (kind == KIND_ABSENT) | (kind == KIND_NONE)
    return ok  # type: ignore[no-any-return]


class BytesLists(NamedTuple):
    """A list of bytes feature (``Bytes((n,))``, ``Bytes((None,))``) whose records' values
    are made into ``bytes`` by one native call for the whole batch, not per record."""

    key: int  # its index in the decoder's keys (the scan's spans)
    count: int  # the values each record holds (0: any number)
    empty_ok: bool  # a record without it (a default of []) holds no values


def bytes_lists(plans: list[FeaturePlan], keys: list[str]) -> dict[str, BytesLists]:
    """The ``"list"`` features that are lists of bytes (:class:`BytesLists`)."""
    out: dict[str, BytesLists] = {}
    for plan in plans:
        ftype = plan.ftype
        if plan.mode == "list" and isinstance(ftype, Bytes) and ftype.shape:
            n = ftype.shape[0]
            empty_ok = n is None and not ftype.required  # its default can only be []
            out[plan.name] = BytesLists(keys.index(plan.name), n or 0, empty_ok)
    return out


def _taken_lists(spans: np.ndarray, bl: BytesLists) -> np.ndarray:
    """Per record, whether its value of ``bl`` is one the batch's call makes: one
    ``BytesList`` in one submessage of the count the shape wants (or absent, if that
    is no values); anything else is left to the per-record decoder."""
    kind, count = spans[:, bl.key, 0], spans[:, bl.key, 1]
    ok = kind == KIND_BYTES
    if bl.count:
        ok &= count == bl.count
    if bl.empty_ok:
        ok |= (kind == KIND_ABSENT) | (kind == KIND_NONE)
    return ok  # type: ignore[no-any-return]


class Planned(Protocol):
    """What a run reads of its decoder (``BatchDecoder`` documents each)."""

    schema: Schema
    columns: tuple[str, ...]
    verify: bool
    bytes_as: Literal["padded", "list"]
    limits: DecodeLimits
    max_record_bytes: int
    plans: list[FeaturePlan]
    list_names: list[str]
    python_features: bool
    columns_arg: list[str] | None
    ragged: dict[str, Any]
    packed: dict[str, Packed]
    bytes_lists: dict[str, BytesLists]

    @property
    def impl(self) -> ModuleType: ...


class BatchRun:
    """One call of :meth:`BatchDecoder.decode` (keeps the decoder itself stateless)."""

    def __init__(
        self,
        dec: Planned,
        buf: Any,
        offsets: np.ndarray,
        sizes: np.ndarray,
        spans: np.ndarray,
        status: np.ndarray,
    ) -> None:
        self.dec, self.buf, self.spans = dec, buf, spans
        self.impl = dec.impl  # the native functions, or their pure Python twins
        self.offsets, self.sizes = offsets, sizes
        self.view: memoryview | None = None
        # Per-record Python results, by record position: values of "zstd" and
        # "list" features on the fast path, and whole records on the slow path.
        self.extra: dict[str, dict[int, Any]] = {}
        self.slow: dict[int, dict[str, Any]] = {}
        self.bad: list[tuple[int, CorruptRecordError]] = []
        self.fused: str | None = None  # the column copied by gather_verified
        self.crc_failed = False
        self.budget: DecodeBudget = dec.limits.budget(dec.schema, len(offsets), dec.columns)
        self.all_fast = not status.any()
        self.fast = status == 0
        self.packed_ok = self.fast  # records whose ragged numbers _packed_column copies
        if not self.all_fast or dec.python_features:
            self._per_record(self.fast)
            self.all_fast = bool(self.fast.all())

    def _memview(self) -> memoryview:
        if self.view is None:
            view = memoryview(self.buf)
            self.view = view if view.ndim == 1 and view.format == "B" else view.cast("B")
        return self.view

    def _payload(self, i: int) -> bytes:
        """Record ``i``'s payload, copied (under the SIGBUS guard) for Python to parse."""
        start = int(self.offsets[i]) + HEADER_SIZE
        return self._read(i, start, int(self.sizes[i]) - OVERHEAD)

    def _read(self, i: int, start: int, length: int) -> bytes:
        # unchecked: decode checked the size; the native copy is guarded
        return guard.read(self.buf, start, length, offset=int(self.offsets[i]), check=False)

    def _per_record(self, fast: np.ndarray) -> None:
        """The Python work per record: zstd and list features (but the ragged numbers
        and lists of bytes of records whose values :meth:`_packed_column` and
        :meth:`_bytes_list_column` take for the batch), then the slow path."""
        dec = self.dec
        zstd = [p for p in dec.plans if p.mode == "zstd"]
        for plan in zstd:
            self.extra[plan.name] = {}
        # Records whose ragged numbers and lists of bytes are all taken for the batch:
        # no Python per record for them.
        self.packed_ok = fast.copy()
        for pk in dec.packed.values():
            self.packed_ok &= _taken(self.spans, pk)
        for bl in dec.bytes_lists.values():
            self.packed_ok &= _taken_lists(self.spans, bl)
        batched = dec.packed.keys() | dec.bytes_lists.keys()
        rest = [n for n in dec.list_names if n not in batched]
        values: dict[int, dict[str, Any]] = {}
        todo = fast if zstd or rest else fast & ~self.packed_ok
        for i in np.flatnonzero(todo).tolist():
            names = rest if self.packed_ok[i] else dec.list_names
            # One record's values at a time, so the budget counts them per record.
            self.budget.start_record()
            mark = self.budget.batch_left
            try:
                for plan in zstd:
                    self.extra[plan.name][i] = self._decompress(plan, i)
                if names:
                    values[i] = dec.schema.decode(
                        self._payload(i), copy=True, budget=self.budget, columns=names
                    )
            except CorruptRecordError:
                fast[i] = False  # the slow path finds the reference's error
                self.packed_ok[i] = False
                self.budget.batch_left = mark  # and counts the record again
                for plan in zstd:
                    self.extra[plan.name].pop(i, None)
        for name in dec.list_names:
            self.extra[name] = {i: v[name] for i, v in values.items() if name in v}
        for i in np.flatnonzero(~fast).tolist():
            self._reference(i)

    def _decompress(self, plan: FeaturePlan, i: int) -> bytes | bytearray:
        _, _, start, nbytes = self.spans[i, plan.key].tolist()
        return self.budget.decompress(plan.name, self._read(i, start, nbytes), plan.row_bytes)

    def _reference(self, i: int) -> None:
        dec = self.dec
        offset, size = int(self.offsets[i]), int(self.sizes[i])
        try:
            if offset < 0:  # the reference would read from the end; no index holds this
                raise CorruptRecordError(f"record offset {offset} is negative")
            payload = read_record(
                self._memview(),
                offset,
                verify=dec.verify,
                max_record_bytes=dec.max_record_bytes,
                expected_size=size,
            )
            data = guard.read(payload, 0, len(payload), offset=offset, check=False)  # a copy
            del payload
            self.budget.start_record()
            self.slow[i] = dec.schema.decode(
                data, copy=True, budget=self.budget, columns=dec.columns_arg
            )
        except CorruptRecordError as err:
            self.bad.append((i, unlocated(err)))

    # ------------------------------------------------------------------ output

    def finish(self, alloc: Alloc) -> tuple[dict[str, Any], int]:
        fast, slow = self.fast, self.slow
        if self.all_fast:
            good = rows = None  # every record, all on the fast path
            n = len(fast)
            sel = self.spans
        else:
            keep = fast.copy()
            keep[list(slow)] = True
            good = np.flatnonzero(keep)
            n = len(good)
            sel = self.spans[good]
            rows = np.flatnonzero(~fast[good])  # output rows filled from the slow path
            sel[rows, :, 2:] = 0  # gather writes zeros there; the slow values follow
        columns: dict[str, Any] = {}
        for plan in self.dec.plans:
            self._column(plan, columns, alloc, n, sel, good, rows)
        return columns, n

    def _column(
        self,
        plan: FeaturePlan,
        columns: dict[str, Any],
        alloc: Alloc,
        n: int,
        sel: np.ndarray,
        good: np.ndarray | None,
        rows: np.ndarray | None,
    ) -> None:
        name, mode, k = plan.name, plan.mode, plan.key
        if name in self.dec.packed:
            self._packed_column(plan, columns, alloc, n, good)
            return
        if name in self.dec.bytes_lists or (mode == "bytes" and self.dec.bytes_as == "list"):
            self._bytes_list_column(plan, columns, good)
            return
        order = range(len(self.fast)) if good is None else good.tolist()
        if mode == "list":
            values = [self._value(i, plan) for i in order]
            if name not in self.dec.ragged:
                columns[name] = values
            else:
                dtype, shape = number_dtype(plan.ftype), plan.ftype.shape
                columns[name], columns[name + "/lengths"] = pad(values, shape, dtype, alloc)
            return
        if mode == "bytes":
            lengths = _alloc(alloc, (n,), _I64)
            lengths[...] = sel[:, k, 3]
            slow = self._slow_rows(name, good, rows)
            for r, value in slow:
                lengths[r] = len(value)
            width = int(lengths.max()) if n else 0
            out = _alloc(alloc, (n, width), _U8)
            self._gather(name, sel[:, k, 2], sel[:, k, 3], out, width, good)
            for r, value in slow:
                out[r, : len(value)] = np.frombuffer(value, _U8)
            columns[name] = out
            columns[name + "/lengths"] = lengths
            return
        out = _alloc(alloc, (n, *plan.shape), plan.dtype)
        if mode == "int64":
            self._varints(plan, out, sel, rows)
        elif mode == "zstd":
            decoded = self.extra[name]
            flat = out.reshape(n, plan.count)
            for r, i in enumerate(order):
                if i in decoded:
                    flat[r] = np.frombuffer(decoded[i], plan.dtype)
        else:  # "float", "raw": the values are the bytes
            self._gather(name, sel[:, k, 2], sel[:, k, 3], out, plan.row_bytes, good)
        for r, value in self._slow_rows(name, good, rows):
            out[r] = value
        columns[name] = out

    def _packed_column(
        self,
        plan: FeaturePlan,
        columns: dict[str, Any],
        alloc: Alloc,
        n: int,
        good: np.ndarray | None,
    ) -> None:
        """A ragged number column (:func:`packed`): the values of the records
        :func:`_taken` took copied (or their varints decoded) by one native call for the
        batch into the padded array, the others' from the per-record decoder; padded
        with ``name/lengths``, or (``ragged_as="list"``) one view per record."""
        name, pk = plan.name, self.dec.packed[plan.name]
        order = np.arange(len(self.fast)) if good is None else good
        vec = self.packed_ok[order]
        sp = self.spans[order, pk.key]
        varints = pk.kind == KIND_INT64
        absent = (sp[:, 0] == KIND_ABSENT) | (sp[:, 0] == KIND_NONE)
        size = np.where(vec & ~absent, sp[:, 1] if varints else sp[:, 3], 0)
        lengths = size // pk.unit
        others = {int(r): self._value(int(order[r]), plan) for r in np.flatnonzero(~vec)}
        for r, value in others.items():
            lengths[r] = value.shape[0]
        widest = int(lengths.max()) if n else 0
        padded = name in self.dec.ragged
        out = (_alloc if padded else _new)(alloc, (n, widest, *pk.inner), pk.dtype)
        if varints:
            flat = out.reshape(n, widest * pk.unit)
            flat[...] = 0
            rows = np.flatnonzero(vec & ~absent)
            counts = sp[rows, 1]
            values = np.empty(int(counts.sum()), _I64)
            self.impl.varints(self.buf, sp[rows, 2], sp[rows, 3], counts, values)
            at = np.repeat(np.cumsum(counts) - counts, counts)
            flat[np.repeat(rows, counts), np.arange(len(values)) - at] = values
        else:  # the values are the bytes; rows of other records zeroed (length 0)
            starts = np.where(vec & ~absent, sp[:, 2], 0)
            rows_of = out.reshape(n, widest * math.prod(pk.inner)).view(_U8)
            self.impl.gather(self.buf, starts, size, rows_of, widest * pk.unit)
        for r, value in others.items():
            out[r, : value.shape[0]] = value
        if padded:
            lens = _alloc(alloc, (n,), _I64)
            lens[...] = lengths
            columns[name], columns[name + "/lengths"] = out, lens
        else:
            columns[name] = [out[r, : int(lengths[r])] for r in range(n)]

    def _bytes_list_column(
        self, plan: FeaturePlan, columns: dict[str, Any], good: np.ndarray | None
    ) -> None:
        """A list of bytes column (:func:`bytes_lists`), or ``bytes_as="list"``: the values
        of the records the fast path took made into ``bytes`` by one native call for the
        batch, the others' from the per-record decoder."""
        name = plan.name
        order = np.arange(len(self.fast)) if good is None else good
        bl = self.dec.bytes_lists.get(name)
        sp = self.spans[order, plan.key if bl is None else bl.key]
        if bl is None:  # one bytes value (bytes_as="list"): every fast record holds one
            vec = self.fast[order]
            starts, nbytes = np.where(vec, sp[:, 2], 0), np.where(vec, sp[:, 3], 0)
            values = self.impl.bytes_lists(self.buf, starts, nbytes, None)
        else:
            vec = self.packed_ok[order]
            counts = np.where(vec & (sp[:, 0] == KIND_BYTES), sp[:, 1], 0)
            values = self.impl.bytes_lists(self.buf, sp[:, 2], sp[:, 3], counts)
        for r in np.flatnonzero(~vec).tolist():
            values[r] = self._value(int(order[r]), plan)
        columns[name] = values

    def _gather(
        self,
        name: str,
        starts: np.ndarray,
        lengths: np.ndarray,
        out: np.ndarray,
        row_bytes: int,
        good: np.ndarray | None,
    ) -> None:
        if name != self.fused:
            self.impl.gather(self.buf, starts, lengths, out, row_bytes)
            return
        offsets, sizes = self.offsets, self.sizes
        if good is not None:
            offsets, sizes = offsets[good], sizes[good]
        status = self.impl.gather_verified(
            self.buf, offsets, sizes, starts, lengths, out, row_bytes
        )
        self.crc_failed = any(status)

    def _varints(
        self, plan: FeaturePlan, out: np.ndarray, sel: np.ndarray, rows: np.ndarray | None
    ) -> None:
        k = plan.key
        if rows is None or not len(rows):
            self.impl.varints(self.buf, sel[:, k, 2], sel[:, k, 3], sel[:, k, 1], out)
            return
        mine = np.ones(len(sel), bool)
        mine[rows] = False
        part = sel[mine]
        tmp = np.empty((len(part), *plan.shape), _I64)
        self.impl.varints(self.buf, part[:, k, 2], part[:, k, 3], part[:, k, 1], tmp)
        out[mine] = tmp

    def _slow_rows(
        self, name: str, good: np.ndarray | None, rows: np.ndarray | None
    ) -> list[tuple[int, Any]]:
        if good is None or rows is None:
            return []
        return [(r, self.slow[int(good[r])][name]) for r in rows.tolist()]

    def _value(self, i: int, plan: FeaturePlan) -> Any:
        """One record's value of a per-record ("list", or "bytes" as list) feature."""
        if not self.fast[i]:
            return self.slow[i][plan.name]
        if plan.mode == "list":
            return self.extra[plan.name][i]
        _, _, start, nbytes = self.spans[i, plan.key].tolist()
        return self._read(i, start, nbytes)
