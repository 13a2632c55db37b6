"""Objects that carry a shard set into other processes and map it again in each.

A reader object that DataLoader workers or Grain's worker processes copy (forked or
pickled) takes its :class:`~recordkit.reader.shards.ShardSet` along: record counts,
sizes and the schema, no maps. Each process maps the shards it reads on demand and
makes its own buffers.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..codec.schema import Schema
from .options import ReadOptions
from .shards import ShardSet, open_shards
from .tfds import TFDSView

__all__ = ["OPEN_LOCK", "ProcessLocalShards"]

# Guards (re)opening the shard maps of a reader object; opening is rare (once per
# process), so one lock for all of them is enough.
OPEN_LOCK = threading.Lock()


class ProcessLocalShards:
    """Shard maps (and what hangs off them) live in one process each.

    Subclasses set ``path`` and ``read_options`` (its ``partial``, ``decode_images`` and
    ``limits`` are read here; optionally ``schema`` and ``split``) and call :meth:`_open`
    for the shard set.
    """

    path: str
    schema: Schema
    read_options: ReadOptions
    _shards: ShardSet | None = None
    _pid = -1  # the process that opened (or took over) the shard set

    def _open(self) -> ShardSet:
        shards = self._shards
        if shards is not None and self._pid == os.getpid():
            return shards
        with OPEN_LOCK:  # several threads may iterate one reader: open once
            if self._shards is None:
                self._shards = self._open_shards()
            self._pid = os.getpid()
            return self._shards

    def _open_shards(self) -> ShardSet:
        return open_shards(
            self.path,
            getattr(self, "schema", None),
            partial=self.read_options.partial,
            split=getattr(self, "split", None),
        )

    def _view(self) -> TFDSView | None:
        """A tensorflow-datasets split's view, with this reader's options (or ``None``)."""
        view, read = self._open().view, self.read_options
        if view is None:
            if read.decode_images:
                raise ValueError("decode_images=True is for tensorflow-datasets folders")
            return None
        return view.with_options(decode_images=bool(read.decode_images), limits=read.limits)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pid"] = -1  # the shard set pickles without its maps
        return state
