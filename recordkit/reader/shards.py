"""A dataset's shards, mapped on demand within a budget of open maps.

Shared by every reader. Opening a dataset costs O(shards), never O(records): the
record counts and sizes come from the manifest (a folder without one has its
shards counted once, when it is opened). A shard is mapped, and its index
loaded and validated against the map (or rebuilt by a CRC-checked scan), when
a reader first asks for it, before any of its records are returned; records are
then addressed by ``(offset, framed size)`` straight into the map.

Every ``mmap`` holds a file descriptor, so open maps are a budgeted resource: a
:class:`ShardSet` keeps at most :func:`max_open_shards` shards mapped and
unmaps the least recently used one that no reader holds (:meth:`ShardSet.acquire`
/ :meth:`ShardSet.release`). A map that a native reader thread still reads
(an exported buffer) is never closed: the buffer protocol refuses, and the
shard stays open until it is free.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from ..codec.example import decode_example
from ..codec.schema import Schema
from ..errors import (
    CorruptRecordError,
    ManifestError,
    RecordkitError,
    ShardChangedError,
    ShardNotFoundError,
)
from ..format.complete import check_complete
from ..format.crc import file_crc32c
from ..format.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
)
from ..storage import is_remote, strip_file_scheme
from . import _opening
from ._budgets import kept_index_bytes, max_open_shards
from .finding import check_listed, has_glob, shard_infos
from .generation import Identity, Pin, pin
from .index import ShardIndex
from .mapped import MappedShard
from .tfds import INFO_NAME, TFDSInfo, TFDSView, tfds_folder, tfds_hint

__all__ = [
    "Gate",
    "MappedShard",
    "ShardSet",
    "open_shards",
]

log = logging.getLogger(__name__)

# How many leading records to look at when inferring a foreign dataset's schema.
_INFER_RECORDS = 64


class Gate(Protocol):
    """Says when a shard may be mapped (a cache that fetches shards as they are needed).

    Attributes:
        limit: the most shard bytes one reader task may touch (what the cache can
            hold at once beside the next task's); 0: no limit.
    """

    limit: int

    def ready(self, rel: str) -> bool:
        """Whether shard ``rel`` (its path relative to the root) is there now."""

    def wait(self, rel: str) -> float:
        """Block until it is; return the seconds waited."""


def _replaced(path: str) -> ShardChangedError:
    return ShardChangedError(
        "this shard was replaced since this reader first mapped it (another file now): "
        "reading it would mix two versions of the dataset; open the dataset again",
        path=path,
    )


class ShardSet:
    """A dataset's shards: what they hold (always) and their maps (on demand).

    Cheap to make and to pickle (to DataLoader workers and the like): record
    counts and sizes are arrays, maps are opened per process as readers ask for
    them. Thread-safe.

    Args:
        root: the dataset directory.
        manifest: the manifest, or ``None`` for a directory without one.
        infos: the shards in dataset order, with their record counts and sizes
            (from the manifest, a cache, or counting).
        schema: the schema (given, from the manifest, or inferred).
        write_index: write an index rebuilt for a foreign shard beside it (default:
            the per-user cache, ``recordkit.reader.index.store``; a manifest's
            shards always get theirs back beside them).
        max_open: maps kept open at most (default :func:`max_open_shards`).

    Attributes:
        counts: records per shard (int64).
        nbytes: bytes per shard (int64).
    """

    def __init__(
        self,
        root: str,
        manifest: Manifest | None,
        infos: Sequence[ShardInfo],
        schema: Schema | None = None,
        *,
        write_index: bool = False,
        max_open: int | None = None,
        view: TFDSView | None = None,
        counted_by: str | None = None,
    ) -> None:
        self.root = root
        # A tensorflow-datasets split: how its records become tfds's values (or None).
        self.view = view
        # Where foreign record counts come from ("/data/x/dataset_info.json"), if not counting.
        self.counted_by = counted_by
        self.manifest = manifest
        self.infos = list(infos)
        self.counts = np.fromiter((i.records for i in self.infos), np.int64, len(self.infos))
        self.nbytes = np.fromiter((i.bytes for i in self.infos), np.int64, len(self.infos))
        self.write_index = write_index
        self.max_open = max_open or max_open_shards()
        self._lock = threading.Lock()
        self._open: OrderedDict[int, MappedShard] = OrderedDict()  # least recently used first
        # Shards being opened now, by whichever thread began it: the others wait on these.
        self._opening: dict[int, Future[None]] = {}
        # Indexes of shards unmapped by the budget, least recently unmapped first, for
        # when they are mapped again (kept_index_bytes): (file identity, index).
        self._kept: OrderedDict[int, tuple[tuple[int, ...], ShardIndex]] = OrderedDict()
        self._kept_bytes = 0
        self.keep_index_bytes = kept_index_bytes()
        #: the generations this set's shards were opened at (recordkit.reader.generation)
        self.pins: list[Pin] = []
        # each shard's file as it was first mapped in this process: a map again must be it
        self._seen: dict[int, Identity] = {}
        self._pid = os.getpid()
        _LIVE.add(self)
        #: set by a reader through a shard cache that fetches shards as they are needed:
        #: ``gate.wait(info.path)`` before a shard is first mapped, ``gate.ready(path)``
        #: to ask without waiting (see ``recordkit.cache.Stream``)
        self.gate: Gate | None = None
        if schema is None and view is not None:
            schema = view.schema
        self.schema: Schema = schema if schema is not None else self._schema()

    def _schema(self) -> Schema:
        if self.manifest is not None:
            if self.manifest.sequence_example:  # read whole (reader/sequence.py), no Example schema
                return Schema({})
            return Schema.from_json(self.manifest.schema)
        examples: list[dict[str, Any]] = []
        where: list[str] = []  # file:offset:record of each, for inference's messages
        for i in range(len(self.infos)):
            if len(examples) >= _INFER_RECORDS:
                break
            with self.use(i) as shard:
                take = min(shard.records, _INFER_RECORDS - len(examples))
                for j in range(take):
                    offset = shard.entry(j)[0]
                    try:
                        examples.append(decode_example(shard.payload(j)))
                    except CorruptRecordError as exc:
                        raise exc.located(shard.path, offset, j) from exc
                    where.append(f"{shard.path}:{offset}:{j}")
        if not examples:
            raise RecordkitError(f"cannot infer a schema from {self.root}: it has no records")
        notes: list[str] = []
        schema = Schema.infer(examples, where=where, notes=notes)
        log.info("inferred schema from %d records: %r", len(examples), schema)
        for note in notes:
            log.info("%s: %s", self.root, note)
        return schema

    def __len__(self) -> int:
        return len(self.infos)

    @property
    def records(self) -> int:
        return int(self.counts.sum())

    @property
    def avg_record_bytes(self) -> float:
        """Mean framed record size (1.0 for an empty set)."""
        count = self.records
        return int(self.nbytes.sum()) / count if count else 1.0

    def fingerprint(self) -> str:
        """A short hash of the shard set (paths, record counts, sizes) for resume checks."""
        h = hashlib.sha256()
        for info in self.infos:
            h.update(f"{info.path}\0{info.records}\0{info.bytes}\n".encode())
        return h.hexdigest()[:16]

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.infos[i].path)

    # -- maps ----------------------------------------------------------------------------

    def acquire(self, i: int) -> MappedShard:
        """Shard ``i``, mapped and indexed, held until :meth:`release`.

        A shard already open is checked for having shrunk; a shard opened now is
        checked against its expected size and record count. A shard is opened
        once however many threads ask for it at the same time (the others wait
        for that open; if it fails, each tries for itself, and raises its own error).
        """
        while True:
            with self._lock:
                self._forked()
                shard = self._open.get(i)
                if shard is not None:
                    self._open.move_to_end(i)
                    shard.check()
                    shard.pins += 1
                    self._trim()
                    return shard
                opening = self._opening.get(i)
                if opening is None:
                    opening = self._opening[i] = Future()
                    break
            opening.result()  # another thread opens it: wait, then take it from the set
        try:
            shard = self._open_one(i)
        except BaseException:
            self._settle({i: None})
            raise
        self._settle({i: shard})
        return shard

    def acquire_many(self, ids: Sequence[int]) -> list[MappedShard]:
        """Shards ``ids`` (distinct), each as :meth:`acquire` gives it, held until released.

        The ones nobody has mapped yet, with indexes large enough to be worth it, are
        opened together (:mod:`recordkit.reader._opening` says why). On an error
        nothing stays held.
        """
        ids = [int(i) for i in ids]
        with self._lock:
            self._forked()
            mine = [  # a small index (or a kept one) opens faster here than on a thread
                i
                for i in ids
                if self.counts[i] >= _opening.PARALLEL_MIN_RECORDS
                and i not in self._open
                and i not in self._opening
                and i not in self._kept
            ]
            if len(mine) > 1:
                for i in mine:
                    self._opening[i] = Future()
        if len(mine) < 2:
            return self._acquire_each(ids, {})
        opened, failure = _opening.open_all(self._open_one, self._settle, mine)
        self._settle({i: opened.get(i) for i in mine})  # each held once, for this call
        if failure is not None:
            for shard in opened.values():
                self.release(shard)
            raise failure
        return self._acquire_each(ids, opened)

    def _acquire_each(
        self, ids: Sequence[int], held_already: dict[int, MappedShard]
    ) -> list[MappedShard]:
        held: list[MappedShard] = []
        try:
            for i in ids:
                shard = held_already.pop(i, None)
                held.append(shard if shard is not None else self.acquire(i))
        except BaseException:
            for shard in [*held, *held_already.values()]:
                self.release(shard)
            raise
        return held

    def _settle(self, outcomes: dict[int, MappedShard | None]) -> None:
        """Publish shards this thread opened (each held once, for the opener), or
        the failure to open them (``None``), and wake whoever waits for them."""
        with self._lock:
            waiting = []
            for i, shard in outcomes.items():
                if shard is not None:
                    shard.pins += 1
                    self._open[i] = shard
                opening = self._opening.pop(i, None)
                if opening is not None:
                    waiting.append(opening)
            self._trim()
        for opening in waiting:
            opening.set_result(None)

    def _open_one(self, i: int) -> MappedShard:
        """Shard ``i`` mapped and indexed (not yet in the set): after its gate, if any."""
        gate = self.gate
        if gate is not None:
            gate.wait(self.infos[i].path)
        with self._lock:
            kept = self._kept.pop(i, None)
            if kept is not None:
                self._kept_bytes -= kept[1].memory
        pinned = next((p for p in self.pins if p.first <= i < p.stop), None)
        path = os.path.join(self.root, self.infos[i].path)
        try:
            shard = MappedShard(
                self.root,
                self.infos[i],
                write_index=self.write_index,
                listed=self._listed(i),
                counted_by=self.counted_by,
                kept=kept,
            )
        except (ManifestError, ShardNotFoundError) as exc:
            if i in self._seen:  # mapped before: the file changed, not the manifest
                raise _replaced(path) from exc
            if pinned is not None:
                pinned.check(path)  # a dataset replaced under the reader says so, not this
            raise
        try:
            self._one_generation(i, shard, pinned)
        except BaseException:
            shard.close()
            raise
        return shard

    def _one_generation(self, i: int, shard: MappedShard, pinned: Pin | None) -> None:
        """Shard ``i``, just mapped, is of the generation this set opened (see
        :mod:`recordkit.reader.generation`): the file mapped before, or, mapped for
        the first time, one that the pinned manifest still lists."""
        seen = self._seen.get(i)
        if seen is not None and seen != shard.identity:
            # Another file: the same generation only if it holds the very bytes the
            # manifest lists (a copy put back, a file restored from a backup).
            expected = self.infos[i].crc32c
            if expected is None or file_crc32c(shard.path) != expected:
                raise _replaced(shard.path)
            self._seen[i] = shard.identity
            return
        if seen is None:
            if pinned is not None:
                pinned.check(shard.path)  # after the map: a later replacement is caught next
            self._seen[i] = shard.identity

    def _listed(self, i: int) -> bool:
        """Whether shard ``i`` is a manifest's (ours), not a foreign file."""
        return self.manifest is not None

    def ready(self, ids: Sequence[int] | np.ndarray) -> bool:
        """Whether shards ``ids`` can be mapped without waiting for a gate."""
        gate = self.gate
        if gate is None:
            return True
        return all(i in self._open or gate.ready(self.infos[i].path) for i in ids)

    def wait(self, ids: Sequence[int] | np.ndarray) -> float:
        """Wait until shards ``ids`` can be mapped; the seconds waited."""
        gate = self.gate
        if gate is None:
            return 0.0
        return sum(gate.wait(self.infos[i].path) for i in ids if i not in self._open)

    def release(self, shard: MappedShard) -> None:
        """Let go of a shard from :meth:`acquire` (it stays mapped while the budget allows)."""
        with self._lock:
            shard.pins -= 1
            self._trim()

    @contextlib.contextmanager
    def use(self, i: int) -> Iterator[MappedShard]:
        """``with shards.use(i) as shard:`` — :meth:`acquire` and :meth:`release`."""
        shard = self.acquire(i)
        try:
            yield shard
        finally:
            self.release(shard)

    def evict(self, i: int) -> None:
        """Unmap shard ``i`` now unless a reader holds it (a cache reader is done with it)."""
        with self._lock:
            shard = self._open.get(i)
            if shard is not None and not shard.pins and shard.close():
                del self._open[i]

    @property
    def open_count(self) -> int:
        """Shards mapped now."""
        return len(self._open)

    def _trim(self) -> None:
        excess = len(self._open) - self.max_open
        if excess <= 0:
            return
        for i, shard in list(self._open.items()):
            if shard.pins == 0 and shard.close():
                del self._open[i]
                self._keep(i, shard)
                excess -= 1
                if not excess:
                    return
        # Every open shard is held by a reader: the budget is exceeded until they let go.
        log.debug("%d shard(s) over the map budget of %d, all in use", excess, self.max_open)

    def _keep(self, i: int, shard: MappedShard) -> None:
        """Keep an unmapped shard's index for its next map (within the byte budget)."""
        nbytes = shard.index.memory
        if nbytes > self.keep_index_bytes:
            return
        self._kept[i] = (shard.identity, shard.index)
        self._kept_bytes += nbytes
        while self._kept_bytes > self.keep_index_bytes:
            _, (_, index) = self._kept.popitem(last=False)
            self._kept_bytes -= index.memory

    def _forked(self) -> None:
        # A forked child inherits the parent's maps: drop them (unmapping in the
        # child is harmless) and map anew in this process.
        if self._pid != os.getpid():
            for shard in self._open.values():
                shard.close()
            self._open.clear()
            self._opening.clear()  # the parent's threads opening them are not here
            self._pid = os.getpid()

    def close(self) -> None:
        """Unmap every shard (a map with live views goes when they do); forget
        the indexes kept for unmapped ones."""
        with self._lock:
            for shard in self._open.values():
                shard.close()
            self._open.clear()
            self._kept.clear()
            self._kept_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_open", "_opening", "_kept"):  # they stay in their process
            del state[name]
        state["_kept_bytes"] = 0
        state["_seen"] = {}  # what this process mapped; another checks its own maps
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._open = OrderedDict()
        self._opening = {}
        self._kept = OrderedDict()
        self._pid = os.getpid()
        _LIVE.add(self)


# A fork (DataLoader workers) copies a lock that a reader thread of the parent may hold
# at that moment; the child's copy would stay locked for ever. Give every set a fresh
# one in the child (its maps are dropped by _forked on first use).
_LIVE: weakref.WeakSet[ShardSet] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for shards in list(_LIVE):
        shards._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def open_shards(
    path: str | os.PathLike[str],
    schema: Schema | None = None,
    *,
    write_index: bool = False,
    partial: bool = False,
    split: str | None = None,
) -> ShardSet:
    """The shard set of a dataset directory, a folder of TFRecords, or one file.

    With a manifest this reads only the manifest; without one, every shard is
    counted (see :func:`count_shards`). Nothing is mapped until a reader asks.
    A directory where a write of ours did not finish is refused unless
    ``partial`` (then its published shards are read, with a WARNING).

    A tensorflow-datasets folder (or one of its shards) is read by its
    ``dataset_info.json``: the shards of ``split`` (required when it has several),
    counted from there, and, unless ``schema`` is given, the set's ``view`` says
    how its records become tfds's values (:mod:`recordkit.reader.tfds`).

    Raises:
        ShardNotFoundError: the path does not exist.
        ManifestError: the manifest is malformed.
        IncompleteDatasetError: an unfinished write's directory, without ``partial``.
    """
    if is_remote(path):
        raise ShardNotFoundError(
            f"{os.fspath(path)!r} is remote: recordkit reads local shards; copy or cache "
            "them to local disk first"
        )
    local = os.path.abspath(strip_file_scheme(path))
    if os.path.isdir(local):
        check_complete(local, partial)
    # A tensorflow-datasets folder (ours win: a folder with a manifest is a recordkit dataset).
    folder = local if os.path.isdir(local) else os.path.dirname(local)
    ours = os.path.exists(os.path.join(folder, MANIFEST_NAME))
    found = None if ours or has_glob(local) else tfds_folder(local)
    if found is not None:
        return _open_tfds(*found, schema, split, write_index)
    if split is not None:
        raise ValueError(
            f"split={split!r}: {local} is not a tensorflow-datasets folder (no "
            f"dataset_info.json and features.json){tfds_hint(local)}; split= is for those"
        )
    root, manifest, infos = shard_infos(local, write_index)
    if manifest is not None:
        check_listed(root, infos)
    shards = ShardSet(root, manifest, infos, schema, write_index=write_index)
    pinned = pin(root, manifest, 0, len(infos))
    if pinned is not None:
        shards.pins.append(pinned)
    return shards


def _open_tfds(
    info: TFDSInfo, file: str | None, schema: Schema | None, split: str | None, write_index: bool
) -> ShardSet:
    """A tensorflow-datasets split (or one shard of it), counted from its metadata."""
    chosen = info.choose_split(split, file)
    infos = info.shard_infos(chosen)
    if file is not None:
        infos = [i for i in infos if i.path == file]
        if not infos:
            raise ShardNotFoundError(
                f"{os.path.join(info.root, file)}: not a shard of split {chosen!r}"
            )
    # With a schema of the user's, records come as it decodes them: no tfds view.
    view = info.view(chosen) if schema is None else None
    return ShardSet(
        info.root,
        None,
        infos,
        schema,
        write_index=write_index,
        view=view,
        counted_by=os.path.join(info.root, INFO_NAME),
    )
