"""Each epoch's shards when a reader reads through the shard cache: :func:`open_cache`
picks, from the reader's ``cache=``, :class:`~recordkit.reader.whole.WholeEpochs`
(``epochs="whole"``, the default) or :class:`~recordkit.reader.growing.CacheEpochs`
(``epochs="growing"``), for every framework adapter. Both log to
``recordkit.reader.epochs`` (how much each epoch reads).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .growing import Agree, CacheEpochs
from .options import CacheOptions
from .whole import WholeEpochs

__all__ = ["open_cache"]


def open_cache(
    remote: str,
    options: CacheOptions,
    *,
    agree: Agree | None = None,
    agree_min: Callable[[int], int] | None = None,
) -> CacheEpochs | WholeEpochs | None:
    """The epoch source for a reader's ``cache=`` (``None``: no cache).

    A cache made here from ``options.dir`` is the reader's: growing epochs start
    its fill workers (they run until the source is closed or garbage collected);
    whole epochs stream the shards in themselves.

    Args:
        remote: the remote dataset the cache holds.
        options: the reader's cache settings.
        agree: for several ranks (growing epochs), the shard paths every rank holds.
        agree_min: for several ranks (whole epochs), the smallest of every rank's value.
    """
    if not options.used:
        return None
    made = None
    if options.cache is None:
        from ..cache import ShardCache

        made = ShardCache(remote, os.fspath(options.dir), max_bytes=options.limit)  # type: ignore[arg-type]
    if options.epochs == "growing":
        if made is not None:
            return CacheEpochs(made.start(), timeout=options.timeout, owned=True, agree=agree)
        return CacheEpochs(options.cache, timeout=options.timeout, agree=agree)
    if made is not None:
        made.gc()  # a directory left by a killed run: its temp files go (no fill workers here)
    return WholeEpochs(made or options.cache, timeout=options.timeout, agree_min=agree_min)
