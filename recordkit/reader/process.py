"""Decode in a separate loader process; hand chunks over through shared memory.

:class:`ProcessReader` has :class:`~recordkit.reader.pipeline.RecordReader`'s
``read`` interface, but its reader threads run in a spawned child process, with
a GIL of their own: the training process only receives chunks. Arrays are never
pickled: the child copies each decoded chunk into one of ``slots`` shared-memory
segments and sends a small control message (slot, offsets, dtypes, shapes and
counters). The parent maps the slot's arrays in place, zero-copy. A slot goes
back to the child only when every array, view and tensor made from it is gone
(the same lease-and-finalizer scheme as :mod:`recordkit.reader.buffers`), so a
batch stays valid however long user code keeps it; if user code keeps batches
of all ``slots`` chunks while asking for more, :class:`RuntimeError` says so
instead of deadlocking.

The parent creates, grows (on the child's request) and unlinks every segment,
so nothing is left in ``/dev/shm`` when the child is killed. The child is a
:class:`recordkit._procs.Child` (a fresh interpreter that exits with its parent)
and is stopped when the iteration ends, is closed or collected: a stop message,
then join → terminate → kill, with a log line at each step.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import mmap
import os
import pickle
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Generator
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from .._procs import Child, Deadline, receive
from ..codec.schema import Schema
from ..errors import CorruptRecordError, LoaderTimeoutError, RecordkitError
from .buffers import BufferPool, Lease
from .decode import BatchDecoder, split_bytes
from .pipeline import Chunk, OnError, ReaderStats, RecordReader, TaskDone
from .plan import EpochPlan, Split
from .shards import ShardSet

__all__ = ["ProcessReader"]

_ENTRY = f"{__name__}:_child_entry"

log = logging.getLogger(__name__)

_ALIGN = 64
_POLL_SECONDS = 1.0
_JOIN_SECONDS = 5.0
# The default progress deadline. A hard NFS mount reports "server not responding"
# after one major timeout (timeo=600 deciseconds x retrans=2: about 180 s) and
# then recovers on its own when the server is back; 300 s lets a loader ride out
# one such stall and still turns a stopped or wedged loader into an error.
DEFAULT_PROGRESS_TIMEOUT = 300.0


def _address(shm: SharedMemory) -> int:
    """The mapping's address, without keeping a buffer export (which would block close)."""
    c = ctypes.c_char.from_buffer(shm.buf)  # type: ignore[arg-type]
    try:
        return ctypes.addressof(c)
    finally:
        del c


def _attach(name: str, size: int) -> mmap.mmap:
    """Map a parent-owned segment in the child.

    Not through ``SharedMemory``: before Python 3.13 that registers the segment
    with a resource tracker of the child's own, which would unlink it when the
    child exits. The parent owns, and unlinks, every segment.
    """
    if os.name == "nt":
        return mmap.mmap(-1, size, tagname=name)  # type: ignore[call-arg]
    import _posixshmem  # CPython's own module behind SharedMemory

    fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


# -- the child ---------------------------------------------------------------------------


class _ChildReader(RecordReader):
    """Collects what ``RecordReader`` would count and warn about, to send it to the parent."""

    pending: list[tuple[int, float, list[CorruptRecordError]]]

    def _account(self, done: TaskDone, waited: float) -> None:
        self.pending.append((done.nbytes, done.seconds, done.skipped))


def _layout(chunk: Chunk) -> tuple[list[tuple[Any, ...]], list[tuple[int, np.ndarray]], int]:
    """Where each array of a chunk goes in a slot: (metadata, copies, bytes needed)."""
    meta: list[tuple[Any, ...]] = []
    copies: list[tuple[int, np.ndarray]] = []
    size = 0

    def place(a: np.ndarray) -> tuple[str, tuple[int, ...], int]:
        nonlocal size
        offset = size
        copies.append((offset, a))
        size += -(-a.nbytes // _ALIGN) * _ALIGN
        return a.dtype.str, a.shape, offset

    meta.append(("array", "/units", *place(chunk.units)))
    if chunk.shard_ids is not None and chunk.records is not None:  # where each row came from
        meta.append(("array", "/shard_ids", *place(chunk.shard_ids)))
        meta.append(("array", "/records", *place(chunk.records)))
    for name, value in chunk.columns.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            meta.append(("array", name, *place(value)))
        elif isinstance(value, list) and all(
            isinstance(v, np.ndarray) and v.dtype != object for v in value
        ):
            meta.append(("arrays", name, [place(v) for v in value]))
        elif isinstance(value, list) and all(isinstance(v, bytes) for v in value):
            blob = np.frombuffer(b"".join(value), np.uint8)
            meta.append(("bytes", name, place(blob)[2], [len(v) for v in value]))
        else:  # lists of bytes lists: small Python values, sent as they are
            meta.append(("object", name, value))
    return meta, copies, size


def _child_entry(conn: Connection) -> None:
    """The loader process's entry (see :class:`recordkit._procs.Child`): a plain
    interpreter, not ``multiprocessing``'s spawn, so it imports only recordkit and
    NumPy, not the parent's ``__main__`` (and so not torch)."""
    try:
        job = receive(conn)
    except EOFError:
        return
    try:
        _child_loop(job, conn)
    except BaseException as exc:
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RecordkitError(f"loader process failed: {type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            conn.send(("error", exc))


def _child_loop(job: dict[str, Any], conn: Connection) -> None:
    """The loader process: read the plan's units and hand chunks over, slot by slot."""
    from .shards import open_shards

    shards = job["shards"]
    if shards is None:
        shards = open_shards(job["path"], Schema.from_json(job["schema"]))
    if shards.fingerprint() != job["fingerprint"]:
        raise RecordkitError(f"the shards of {job['path']} changed under the loader process")
    plan = EpochPlan(
        shards.counts,
        job["options"],
        job["epoch"],
        avg_record_bytes=shards.avg_record_bytes,
        shard_bytes=shards.nbytes,
    )
    reader = _ChildReader(
        shards,
        BatchDecoder(shards.schema, **job["decoder"]),
        num_threads=job["num_threads"],
        prefetch=job["prefetch"],
        on_error="skip" if job["on_error"] == "warn" else job["on_error"],
        pool=BufferPool(),
    )
    reader.pending = []
    free = list(range(job["slots"]))
    segments: dict[int, mmap.mmap] = {}

    def wait_ctrl() -> tuple[Any, ...]:
        try:
            msg: tuple[Any, ...] = conn.recv()  # EOF when the parent is gone
        except EOFError:
            raise SystemExit(0) from None
        if msg[0] == "stop":
            raise SystemExit(0)
        return msg

    def handle(msg: tuple[Any, ...]) -> None:
        if msg[0] == "free":
            free.append(msg[1])

    chunks = reader.read(plan, job["split"], job["units"])
    try:
        for chunk in chunks:
            meta, copies, size = _layout(chunk)
            while conn.poll(0):
                handle(wait_ctrl())
            while not free:
                handle(wait_ctrl())
            slot = free.pop(0)
            seg = segments.get(slot)
            if seg is None or len(seg) < size:
                if seg is not None:
                    seg.close()
                conn.send(("grow", slot, size))
                while (msg := wait_ctrl())[0] != "segment":
                    handle(msg)
                seg = segments[slot] = _attach(msg[2], msg[3])
            for offset, a in copies:
                dst = np.ndarray(a.shape, a.dtype, buffer=seg, offset=offset)
                np.copyto(dst, a)
                del dst  # no export left behind: the segment must stay closable
            done, reader.pending = reader.pending, []
            conn.send(("chunk", slot, chunk.rows, meta, done))
        conn.send(("end",))
    finally:
        chunks.close()
        for seg in segments.values():
            seg.close()


# -- the parent --------------------------------------------------------------------------


class _Segment:
    """One parent-owned shared-memory segment; mapped while any lease on it lives."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        # Named after this process, so leftovers (there should be none) are traceable.
        name = f"rk_{os.getpid()}_{secrets.token_hex(6)}"
        self.shm = SharedMemory(name=name, create=True, size=self.size)
        self.address = _address(self.shm)
        self.unlinked = False

    def unlink(self) -> None:
        if not self.unlinked:
            self.unlinked = True
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


class _Slots:
    """The parent's side of the slot protocol (thread-safe: finalizers run anywhere)."""

    def __init__(self, ctrl: Connection, count: int) -> None:
        self.ctrl = ctrl
        self.count = count
        self.segments: dict[int, _Segment] = {}
        self.held: set[int] = set()
        self.lock = threading.Lock()
        self.closed = False

    def send(self, msg: Any) -> None:
        with self.lock:
            if not self.closed:
                with contextlib.suppress(OSError):  # the child is gone: nothing to tell
                    self.ctrl.send(msg)

    def grow(self, slot: int, size: int) -> None:
        old = self.segments.pop(slot, None)
        if old is not None:
            old.unlink()  # its leases are gone (the slot was free); the map goes with the object
        seg = _Segment(size + size // 4)  # headroom: chunk sizes vary a little
        self.segments[slot] = seg
        self.send(("segment", slot, seg.shm.name, seg.size))

    def region(self, slot: int, size: int) -> np.ndarray:
        segment = self.segments[slot]
        lease = Lease(segment, segment.address, (size,), np.dtype(np.uint8))
        with self.lock:
            self.held.add(slot)
        weakref.finalize(lease, self.release, slot)
        return np.asarray(lease)

    def release(self, slot: int) -> None:
        with self.lock:
            self.held.discard(slot)
        self.send(("free", slot))

    def all_held(self) -> bool:
        with self.lock:
            return len(self.held) >= self.count

    def close(self) -> None:
        with self.lock:
            self.closed = True
        for seg in self.segments.values():
            seg.unlink()  # live leases keep their mapping; the name is gone now


def _chunk(region: np.ndarray, meta: list[tuple[Any, ...]], rows: int) -> Chunk:
    """A chunk whose arrays are views of its slot."""

    def view(dtype: str, shape: tuple[int, ...], offset: int) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return region[offset : offset + n].view(dtype).reshape(shape)

    special: dict[str, Any] = {"/units": np.empty(0, np.int64)}
    columns: dict[str, Any] = {}
    for entry in meta:
        kind, name = entry[0], entry[1]
        if kind == "array":
            value: Any = view(*entry[2:])
            if name in ("/units", "/shard_ids", "/records"):
                special[name] = value
                continue
        elif kind == "arrays":
            value = [view(*m) for m in entry[2]]
        elif kind == "bytes":
            sizes = np.array(entry[3], np.int64)
            starts = np.cumsum(sizes) - sizes + entry[2]
            value = split_bytes(region, starts, sizes)
        else:
            value = entry[2]
        columns[name] = value
    return Chunk(
        special["/units"], columns, rows, special.get("/shard_ids"), special.get("/records")
    )


class ProcessReader:
    """Decode the units of an epoch plan in a spawned loader process, in order.

    Args:
        path: the dataset path (the child opens its own maps).
        fingerprint: the parent's ``ShardSet.fingerprint()``; the child refuses
            to read a shard set that differs.
        decoder: ``BatchDecoder`` keyword arguments (``columns``, ``verify``, ``bytes_as``).
        num_threads: reader threads in the child.
        prefetch: tasks in flight in the child.
        on_error: as :class:`~recordkit.reader.pipeline.RecordReader`; warnings
            and skip counts arrive in this process.
        slots: shared-memory segments (one chunk each) between the processes.
        stats: counters to update in this process.
        shards: the shard set to read (default: the child opens ``path``); a
            reader through a shard cache passes the cache's set, whose gate then
            waits in the child for each shard to arrive.
        progress_timeout: seconds this process may wait for the loader's next
            message (a chunk, or a request) before the loader is killed and
            :class:`~recordkit.errors.LoaderTimeoutError` raised; ``None``:
            wait forever. Time while every slot is held by this process's
            batches does not count (that is a ``RuntimeError`` at once).
    """

    def __init__(
        self,
        path: str,
        schema: Schema,
        fingerprint: str,
        *,
        decoder: dict[str, Any],
        num_threads: int,
        prefetch: int,
        on_error: OnError = "raise",
        slots: int = 4,
        stats: ReaderStats | None = None,
        progress_timeout: float | None = DEFAULT_PROGRESS_TIMEOUT,
        shards: ShardSet | None = None,
    ) -> None:
        if slots < 2:
            raise ValueError(f"slots must be >= 2, got {slots}")
        if progress_timeout is not None and not progress_timeout > 0:
            raise ValueError(f"progress_timeout must be > 0 or None, got {progress_timeout!r}")
        self.progress_timeout = progress_timeout
        self.path = path
        self.on_error = on_error
        self.slots = slots
        self.stats = stats or ReaderStats()
        self._job = {  # what the child is sent, with each pass's plan and units
            "path": path,
            "schema": schema.to_json(),
            "fingerprint": fingerprint,
            "decoder": decoder,
            "num_threads": num_threads,
            "prefetch": prefetch,
            "on_error": on_error,
            "slots": slots,
            "shards": shards,
        }

    def read(self, plan: EpochPlan, split: Split, units: range) -> Generator[Chunk, None, None]:
        """Yield decoded chunks covering ``units`` in order; stops the child when closed."""
        job = {**self._job, "options": plan.options, "epoch": plan.epoch}
        job.update(split=split, units=units)
        child = Child(_ENTRY, what="loader process")
        conn = child.conn
        slots = _Slots(conn, self.slots)
        log.debug("loader process %d started for %s", child.pid, self.path)
        try:
            slots.send(job)
            waited = 0.0
            while True:
                t0 = time.perf_counter()
                msg = self._receive(conn, child, slots)
                waited += time.perf_counter() - t0
                if msg[0] == "grow":
                    slots.grow(msg[1], msg[2])
                elif msg[0] == "chunk":
                    _, slot, rows, meta, done = msg
                    region = slots.region(slot, slots.segments[slot].size)
                    chunk = _chunk(region, meta, rows)
                    del region  # the arrays hold the lease now
                    self._account(done, waited)
                    waited = 0.0
                    yield chunk
                elif msg[0] == "end":
                    return
                else:
                    raise msg[1]
        finally:
            slots.send(("stop",))
            child.stop("asked to stop", join=_JOIN_SECONDS)
            slots.close()

    def _receive(self, conn: Connection, child: Child, slots: _Slots) -> tuple[Any, ...]:
        limit = self.progress_timeout
        deadline = Deadline(limit)
        while not conn.poll(deadline.poll(_POLL_SECONDS)):
            if deadline.expired():
                child.kill("no progress")
                raise LoaderTimeoutError(
                    f"the loader process made no progress for {limit:g} s (pid {child.pid}); "
                    "it was killed. Stopped, or stuck in I/O (a network file system)? "
                    "Raise loader_timeout if its chunks take this long"
                )
            if not child.alive() and not conn.poll(0):
                raise RecordkitError(
                    f"the loader process exited (code {child.proc.returncode}) before the "
                    "epoch ended"
                )
            if slots.all_held():
                gc.collect()  # batches in reference cycles
                if slots.all_held():
                    raise RuntimeError(
                        f"all {slots.count} shared-memory slots are held by batches that are "
                        "still referenced, so the loader process cannot hand over more: copy "
                        "the batches you keep (tensor.clone()), or read with more slots"
                    )
        try:
            msg: tuple[Any, ...] = conn.recv()
        except (EOFError, OSError):  # the child closed its end: it has died
            code = child.wait(_JOIN_SECONDS)
            raise RecordkitError(
                f"the loader process exited (code {code}) before the epoch ended"
            ) from None
        return msg

    def _account(
        self, done: list[tuple[int, float, list[CorruptRecordError]]], waited: float
    ) -> None:
        nbytes = sum(d[0] for d in done)
        seconds = sum(d[1] for d in done)
        skipped = [e for d in done for e in d[2]]
        self.stats.add(
            wait_seconds=waited, decode_seconds=seconds, bytes=nbytes, skipped=len(skipped)
        )
        for err in skipped:
            if self.on_error == "warn":
                warnings.warn(f"skipping corrupt record: {err}", RuntimeWarning, stacklevel=4)
            else:
                log.debug("skipped corrupt record: %s", err)
