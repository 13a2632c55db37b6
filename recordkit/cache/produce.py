"""Producer mode: raw samples in, local shards out, in writer subprocesses.

The cache's catalog is a conversion plan (:func:`recordkit.conversion.plan_conversion`):
one entry per partition, each producing exactly one shard
``{prefix}-PPPPP-00000.tfrecord`` (no roll-over inside a partition; its size is
bounded by ``shard_size`` / ``partition_items`` of the source). Entries look
like foreign shards to the rest of the cache (``crc32c=None``; records and size
are what production found), so the fill order, eviction, pins and snapshots
are shard mode's.

Filling one entry, nothing visible before the last step: the cache reserves an
estimate of the output; a writer process (:mod:`.writer`; one per fill worker,
reused) converts the partition into the reservation's temp names with the
reservation as a hard cap; a partition that outgrows it is redone with a larger
reservation (the estimate and the redo: ``docs/cache.md``, "How the budget is
kept"); the cache publishes the staged index and then the shard, as a download is
published, and records its size, record count and source bytes (the next estimates
learn from them). A writer that fails, dies or goes silent for
``inactivity_timeout`` (terminate, then kill) is a :class:`ProduceError`: the
partition is tried again later while the others go ahead. ``gc`` removes the temp
files of dead reservations, and shards of another plan (the source or options
changed).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import threading
from typing import Any

from .._version import __version__
from ..codec.schema import Schema
from ..conversion import ConvertOptions, Plan, Tally
from ..errors import CacheFullError, ProduceError
from ..format.manifest import Manifest, ShardInfo
from ..retry import is_transient
from .directory import CacheDir
from .producer_options import ProducerOptions
from .reservation import Reservation, ShardState
from .shared import FillContext
from .staged import Staged, discard
from .writer import ProduceTask, WriterPool, run_task

__all__ = ["Producer", "shard_name"]

log = logging.getLogger(__name__)

# The reservation of the first partitions, before any output/source ratio is known:
# twice the source bytes. Images, arrays and tar members come out about their own size
# (plus framing and index); text of small numbers grows 2-4x; a partition that outgrows
# its reservation is redone with a larger one, so a low guess costs one redo, a high
# one only evicts early.
_FIRST_RATIO = 2.0
# Over the largest ratio seen so far: the next partition may hold longer strings or
# larger images than any before.
_HEADROOM = 1.25
# On top of every estimate: an index line or two, a partition whose items claim 0 bytes.
_SLACK = 4096


def shard_name(prefix: str, partition: int) -> str:
    """The one shard partition ``partition`` produces: ``part-00003-00000.tfrecord``."""
    return f"{prefix}-{partition:05d}-00000.tfrecord"


# -- the filler -------------------------------------------------------------------------------


class Producer:
    """Producer mode's filler: the catalog is a conversion plan, filling is converting.

    Args:
        context: the cache's settings a filler needs.
        directory: the cache directory (where the catalog is saved).
        producer: the producer settings; ``None`` for a reader-only cache, which
            takes everything from the ``saved`` catalog.
        saved: the directory's saved catalog (reader-only caches).
    """

    mode = "producer"
    retriable: tuple[type[BaseException], ...] = (ProduceError,)

    def __init__(
        self,
        context: FillContext,
        directory: CacheDir,
        *,
        producer: ProducerOptions | None,
        saved: dict[str, Any] | None,
    ) -> None:
        self.context = context
        self.dir = directory
        self._saved = saved if producer is None else None
        if producer is not None:
            from ..conversion import sources

            sources.get(producer.format)  # an unknown name fails now, listing the known ones
            options = producer.conversion()
            self.format = producer.format
            self._schema = producer.schema
            self._source_options = dict(producer.source_options or {})
            self.inactivity_timeout = producer.inactivity_timeout
        else:  # a reader-only cache: what the filling process saved
            assert saved is not None
            self.format = str(saved["format"])
            self._schema = Schema.from_json(saved["manifest"]["schema"])
            self._source_options = dict(saved.get("source_options") or {})
            options = ConvertOptions(**saved["options"])
            self.inactivity_timeout = ProducerOptions.inactivity_timeout  # the default
        if options.max_records is not None:
            raise ValueError(
                "convert_options.max_records must be None: in producer mode a partition is "
                "one shard (bound it with shard_size or partition_items)"
            )
        self.options = options
        self.fingerprint = ""
        self.schema_json: dict[str, Any] = {}
        self.metadata: dict[str, Any] = {}
        self._index: dict[str, int] = {}
        self._plan: tuple[Any, Plan] | None = None
        self._plan_lock = threading.Lock()
        self._need: dict[str, int] = {}  # partitions that outgrew a reservation: the next one
        self._floor = 0.0  # an output/source ratio that an outgrown partition proved
        self._pool: WriterPool | None = None
        self._pool_lock = threading.Lock()
        # Other processes cannot see a memory:// source.
        self._inline = context.fill_workers == 0 or context.remote_url.startswith("memory://")

    # -- the catalog ---------------------------------------------------------------------------

    def _make_plan(self) -> tuple[Any, Plan]:
        from ..conversion import plan_conversion

        return plan_conversion(
            self.context.remote_url,
            format=self.format,
            schema=self._schema,
            options=self.options,
            storage_options=self.context.storage_options,
            source_options=self._source_options,
        )

    def _catalog_doc(self, plan: Plan) -> dict[str, Any]:
        source_options: dict[str, Any] | None = self._source_options
        try:
            json.dumps(source_options)
        except (TypeError, ValueError):
            log.warning("source options are not JSON; reader-only caches cannot re-plan")
            source_options = None
        manifest = Manifest(
            schema=plan.schema.to_json(),
            shards=(),
            metadata=dict(plan.metadata),
            created_by=f"recordkit {__version__}",
        )
        return {
            "remote": self.context.remote_url,
            "max_bytes": self.context.max_bytes,
            "mode": self.mode,
            "format": self.format,
            "plan": plan.fingerprint,
            "manifest": manifest.to_json(),
            "options": dataclasses.asdict(self.options),
            "source_options": source_options,
            "shards": [
                ShardInfo(shard_name(self.options.prefix, p.index), 0, p.size).to_json()
                for p in plan.partitions
            ],
        }

    def _load(self, doc: dict[str, Any]) -> list[ShardInfo]:
        self.fingerprint = str(doc["plan"])
        self.schema_json = dict(doc["manifest"]["schema"])
        self.metadata = dict(doc["manifest"].get("metadata") or {})
        infos = [ShardInfo(**s) for s in doc["shards"]]
        self._index = {info.path: i for i, info in enumerate(infos)}
        return infos

    def catalog(self) -> list[ShardInfo]:
        """Plan the conversion (or, reader-only or offline, take the saved plan's catalog)."""
        url = self.context.remote_url
        if self._saved is not None:
            return self._load(self._saved)
        try:
            source, plan = self._make_plan()
        except Exception as exc:
            saved = self.dir.load_catalog()
            usable = (
                saved is not None
                and saved.get("remote") == url
                and saved.get("format") == self.format
            )
            if not usable or not (isinstance(exc, OSError) or is_transient(exc)):
                raise
            assert saved is not None
            log.warning("source %s unreachable (%r); using the saved catalog", url, exc)
            return self._load(saved)
        with self._plan_lock:
            self._plan = (source, plan)
        doc = self._catalog_doc(plan)
        self.dir.save_catalog(doc, max_bytes=self.context.max_bytes)
        log.info(
            "producer cache of %s (%s): %d partitions, plan %s",
            url,
            self.format,
            len(plan.partitions),
            plan.fingerprint[:12],
        )
        return self._load(doc)

    def _planned(self) -> tuple[Any, Plan]:
        """The source and plan (planned now in a reader-only or offline cache)."""
        with self._plan_lock:
            if self._plan is None:
                try:
                    self._plan = self._make_plan()
                except Exception as exc:
                    raise ProduceError(
                        f"cannot plan the conversion of {self.context.remote_url}: {exc!r}"
                    ) from exc
            plan = self._plan[1]
        if plan.fingerprint != self.fingerprint:
            raise ProduceError(
                f"the source {self.context.remote_url} changed since the cache's catalog was made "
                f"(plan {self.fingerprint[:12]}, now {plan.fingerprint[:12]}); restart the "
                "filling cache to re-plan"
            )
        return self._plan

    # -- the budget ----------------------------------------------------------------------------

    def _ratio(self, state: ShardState) -> float:
        """Output bytes (shard and index) to reserve per source byte."""
        seen = state.max_ratio(self.fingerprint)
        ratio = seen * _HEADROOM if seen is not None else _FIRST_RATIO
        return max(ratio, self._floor * _HEADROOM)

    def need(self, info: ShardInfo, state: ShardState, capacity: int) -> int:
        """The reservation a partition starts with: its exact size if it was produced
        before, else an estimate from its source bytes (see the module doc), never
        more than ``capacity`` (the budget less the bookkeeping)."""
        meta = state.meta(info.path)
        if meta.get("plan") == self.fingerprint and "bytes" in meta:
            exact = int(meta["bytes"]) + int(meta.get("index_bytes", 0))
            return min(capacity, exact)
        estimate = math.ceil(info.bytes * self._ratio(state)) + _SLACK
        return min(capacity, max(estimate, self._need.get(info.path, 0)))

    def _outgrown(
        self, info: ShardInfo, items: tuple[Any, ...], outcome: tuple[Any, ...], capacity: int
    ) -> int:
        """The next reservation of a partition that outgrew ``cap`` (``capacity``: the
        most one shard may take, the budget less the cache's bookkeeping)."""
        cap, items_done, source_done = (int(x) for x in outcome[1:])
        if cap >= capacity:
            raise CacheFullError(
                f"the partition converts to more than the whole cache budget of "
                f"{self.context.max_bytes} bytes, {capacity} of them for shards beside the "
                f"cache's bookkeeping (it passed them after {items_done} of {len(items)} "
                "source items); use a smaller shard_size or partition_items, or a larger budget",
                path=info.path,
            )
        # Of the item that was being written, at most all of it was read.
        current = int(items[items_done].size) if items_done < len(items) else 0
        self._floor = max(self._floor, cap / max(1, source_done + current))
        total = sum(int(i.size) for i in items)
        bigger = max(2 * cap, math.ceil(total * self._floor * _HEADROOM) + _SLACK)
        bigger = min(capacity, bigger)
        self._need[info.path] = max(self._need.get(info.path, 0), bigger)
        log.info(
            "%s: the output outgrew its reservation of %d bytes; redoing it with %d",
            info.path,
            cap,
            bigger,
        )
        return bigger

    # -- filling -------------------------------------------------------------------------------

    def _run(self, task: ProduceTask, where: str, room: Reservation) -> tuple[Any, ...]:
        """Produce in a writer process (or inline): ``("done", Staged)``,
        ``("outgrew", ...)`` or ``("abandoned",)``; the rest raises."""
        # Source bytes count as "downloaded" as the writer converts them; an attempt that
        # does not publish takes its count back, since the partition is produced again.
        tally = Tally(lambda items, size, records: room.events.downloaded(size))

        def on_bytes(nbytes: int) -> None:
            tally(0, nbytes, 0)

        if self._inline:
            outcome = run_task(task, on_bytes)
        else:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = WriterPool()
                pool = self._pool
            outcome = pool.run(
                task, on_bytes, timeout=self.inactivity_timeout, abandon=room.abandoning
            )
        kind = outcome[0]
        if kind != "done":
            tally.undo()
        if kind == "full":
            raise OSError(outcome[1], outcome[2])
        if kind == "error":
            raise ProduceError(f"{where}: {outcome[1]}", path=task.path, details=outcome[2])
        if kind == "died":
            raise ProduceError(
                f"{where}: the writer process died ({outcome[1]}); out of memory, or killed?",
                path=task.path,
            )
        if kind == "silent":
            raise ProduceError(
                f"{where}: the writer process reported no progress for {outcome[1]:.0f} s "
                "and was stopped (inactivity_timeout)",
                path=task.path,
            )
        return outcome

    def fill(self, info: ShardInfo, room: Reservation) -> None:
        """Convert the partition within ``room`` (growing it if it must), publish it."""
        source, plan = self._planned()
        part = plan.partitions[self._index[info.path]]
        where = f"partition {part.index} (source items: {part.describe()})"
        try:
            while True:
                task = ProduceTask(
                    path=info.path,
                    final=room.final,
                    lease_id=room.id,
                    cap=room.bytes,
                    items=part.items,
                    source=source,
                    schema=plan.schema.to_json(),
                    fsync=self.options.fsync,
                    retry=self.options.retry_policy,
                )
                outcome = room.stage(functools.partial(self._run, task, where, room))
                if outcome[0] == "done":
                    break
                if outcome[0] == "abandoned":
                    return
                bigger = self._outgrown(info, part.items, outcome, room.capacity)
                if not room.grow(bigger):
                    return  # no room now: the fill order comes back to it, with ``bigger``
            staged: Staged = outcome[1]
            extra = {
                "bytes": staged.bytes,
                "index_bytes": staged.index_bytes,
                "source_bytes": part.size,
                "plan": self.fingerprint,
            }
            room.publish(staged, extra, crc32c=None)
        finally:
            # What a stopped, killed or failed writer left (nothing after a publish).
            discard(room.staged)

    def keep(self, info: ShardInfo | None, size: int, meta: dict[str, Any], path: str) -> bool:
        """A shard stays if this plan produced it (same name, plan and size); the plan
        names its sources' versions, so sources regenerated at the same sizes are
        another plan (and a re-adopted copy, with no plan recorded, goes)."""
        return (
            info is not None
            and meta.get("plan") == self.fingerprint
            and int(meta.get("bytes", -1)) == size
        )

    def snapshot_manifest(self, shards: list[ShardInfo]) -> Manifest:
        """The plan's schema and metadata, listing the snapshot's shards."""
        return Manifest(
            schema=self.schema_json,
            shards=tuple(shards),
            metadata=self.metadata,
            created_by=f"recordkit {__version__}",
        )

    def close(self) -> None:
        """Stop the writer processes (they are spawned again when needed)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
