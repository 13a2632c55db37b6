"""Writing datasets: :class:`ShardWriter` for one shard, :class:`ShardSequence` for a run of
shards (the roll-over rule), :class:`Writer` for a dataset."""

from .dataset import Writer
from .sequence import ShardSequence
from .shard import ShardWriter

__all__ = ["ShardSequence", "ShardWriter", "Writer"]
