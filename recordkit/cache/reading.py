"""The reader-facing parts of ``ShardCache``: epoch snapshots (growing epochs,
:class:`Snapshots`) and whole-epoch streams (:class:`Streams`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ShardNotFoundError
from ..format.manifest import ShardInfo
from .locks import HeldFile
from .scan import Scan
from .snapshot import Snapshot
from .stream import Stream, StreamStats
from .workers import POLL_S, FillWorkers, Part

__all__ = ["Snapshots", "Streams"]


@dataclass(eq=False)
class Snapshots(Part):
    """Takes epoch snapshots: pins and lists the complete shards (see ``ShardCache.snapshot``).

    Args:
        _workers: the fill machinery (missing shards of a resume are filled in this thread).
    """

    _workers: FillWorkers

    def _complete_infos(self, scan: Scan) -> list[ShardInfo]:
        out = []
        records: dict[str, int] | None = None
        for info in self._catalog.entries():
            if info.path in scan.complete:
                if info.crc32c is None:  # foreign: what the download found
                    if records is None:
                        records = self.dir.store.records()
                    size = scan.complete[info.path][0]
                    info = ShardInfo(info.path, records.get(info.path, 0), size, None)
                out.append(info)
        return out

    def take(
        self,
        epoch: int | None,
        *,
        min_shards: int,
        shards: Sequence[str] | None,
        timeout: float | None,
    ) -> Snapshot:
        """See ``ShardCache.snapshot``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        infos = self._catalog.entries()
        if shards is not None:
            want = list(shards)
            unknown = set(want) - {i.path for i in infos}
            if unknown:
                raise ShardNotFoundError(
                    f"not in the remote {self._catalog.remote_url}: {sorted(unknown)[:5]}"
                )
        else:
            want = None
        delay = 0.01
        hold: HeldFile | None = None  # the wanted shards already here, while the rest come
        try:
            while True:
                with self.dir.lock():
                    present = self._complete_infos(self.dir.scan())
                    if want is not None:
                        have = {i.path for i in present}
                        missing = [p for p in want if p not in have]
                        if not missing:
                            chosen = [i for i in present if i.path in set(want)]
                            return self._pin(chosen, epoch)
                        if hold is not None:
                            self.dir.release(hold)
                        hold = self.dir.pin([p for p in want if p in have])
                    elif len(present) >= min(min_shards, len(infos)):
                        return self._pin(present, epoch)
                if self._workers.failure is not None:
                    raise self._workers.failure
                if want is not None:
                    for rel in missing:
                        if self._workers.fill_one(only=rel) == "worked":
                            delay = 0.01
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"cache {self.dir.root}: {len(present)} shard(s) ready after {timeout} s "
                        f"({'the ones asked for' if want is not None else min_shards} needed)"
                    )
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                with self._wakeup.cv:  # a fill worker of this process wakes us when it publishes
                    self._wakeup.cv.wait(delay if left is None else min(delay, left))
                delay = min(POLL_S, delay * 2)
        finally:
            if hold is not None:
                self.dir.release(hold)

    def _pin(self, chosen: list[ShardInfo], epoch: int | None) -> Snapshot:
        budget = self._budget
        claim = self.dir.pin(
            [i.path for i in chosen], epoch=epoch, max_bytes=budget.max_bytes, policy=budget.policy
        )
        manifest = self._filler.snapshot_manifest(chosen)
        return Snapshot(self.dir, chosen, claim, epoch, manifest, self._wakeup.notify)


@dataclass(eq=False)
class Streams(Part):
    """The cache's whole-epoch streams, and what each is handed of the cache
    (:class:`~.stream.StreamHost`: the directory, the budget, one fetch).

    Attributes:
        stats: what the streams did, over all passes.
    """

    _open: set[Stream] = field(default_factory=set, init=False)
    stats: StreamStats = field(default_factory=StreamStats, init=False)

    def running(self) -> bool:
        """Whether a stream runs (the cache's own fill workers then fetch nothing)."""
        return bool(self._open)

    def open(
        self,
        order: Sequence[ShardInfo],
        *,
        epoch: int | None,
        timeout: float | None,
        workers: int,
        capacity: int | None,
    ) -> Stream:
        """A :class:`Stream` over ``order`` (see ``ShardCache.stream``)."""
        stream = Stream(
            self,
            order,
            epoch=epoch,
            workers=workers,
            timeout=timeout,
            stats=self.stats,
            capacity=capacity,
        )
        with self._wakeup.cv:
            self._open.add(stream)
        return stream

    # -- what a stream uses (StreamHost) -------------------------------------------------------

    @property
    def max_bytes(self) -> int:
        return self._budget.max_bytes

    @property
    def retriable(self) -> tuple[type[BaseException], ...]:
        return self._filler.retriable

    def info(self, rel: str) -> ShardInfo:
        return self._catalog.info(rel)

    def fetch(self, info: ShardInfo) -> str:
        with self.dir.lock():
            scan = self.dir.scan()
            if info.path in scan.complete:
                return "present"
            if info.path in scan.leased:
                return "elsewhere"
            room = self._reserve(info, scan, displace=False, abandoning=lambda: False)
            if room is None:
                return "blocked"
        try:
            self._filler.fill(info, room)
        finally:
            room.release()
        return "fetched"

    def ended(self, stream: Stream) -> None:
        with self._wakeup.cv:
            self._open.discard(stream)
        self._wakeup.notify()

    def room_freed(self) -> None:
        self._wakeup.notify()
