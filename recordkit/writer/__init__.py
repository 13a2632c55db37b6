"""Writing datasets: :class:`ShardWriter` for one shard, :class:`Writer` for a dataset."""

from .dataset import Writer
from .shard import ShardWriter

__all__ = ["ShardWriter", "Writer"]
