"""How much a :class:`~recordkit.reader.shards.ShardSet` holds: maps open, indexes kept."""

from __future__ import annotations

import os
import resource

__all__ = ["ENV_KEEP_INDEX", "ENV_MAX_OPEN", "kept_index_bytes", "max_open_shards"]

# The map budget is a share of the descriptor limit: the rest is for the process
# itself, a second reader over the same data, sockets, DataLoader pipes.
_FD_SHARE = 4
_MIN_OPEN, _MAX_OPEN = 8, 4096  # 4096 maps stay far below vm.max_map_count (65530)
ENV_MAX_OPEN = "RECORDKIT_MAX_OPEN_SHARDS"
ENV_KEEP_INDEX = "RECORDKIT_KEEP_INDEX_BYTES"
_KEEP_INDEX_BYTES = 16 << 20


def _env_int(name: str, minimum: int) -> int | None:
    """The integer in environment variable ``name`` (``None`` when unset or blank)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        n = minimum - 1
    if n < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return n


def max_open_shards() -> int:
    """How many shards one :class:`ShardSet` keeps mapped at most.

    ``RECORDKIT_MAX_OPEN_SHARDS`` if set, else a quarter of the soft
    ``RLIMIT_NOFILE`` (256 under the common default of 1024), clamped to
    [8, 4096]. Every process (DataLoader worker, rank) has its own budget, as it
    has its own descriptor limit.
    """
    n = _env_int(ENV_MAX_OPEN, 1)
    if n is not None:
        return n
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_OPEN
    return max(_MIN_OPEN, min(_MAX_OPEN, soft // _FD_SHARE))


def kept_index_bytes() -> int:
    """Bytes of indexes a :class:`ShardSet` keeps for shards it has unmapped.

    ``RECORDKIT_KEEP_INDEX_BYTES`` if set (0 keeps none), else 16 MiB. A kept
    index holds no descriptor; when its shard is mapped again, unchanged (same
    device, inode, size and modification time), the reader uses it instead of
    loading the index again.
    """
    n = _env_int(ENV_KEEP_INDEX, 0)
    return _KEEP_INDEX_BYTES if n is None else n
