"""A shard's index as the readers open and hold it (the ``.idx`` format itself, its
bytes, is :mod:`recordkit.format.index`).

- ``text``: the ``.idx`` parser, native (``recordkit/native/index.c``) or NumPy,
  whole or a block of lines at a time;
- ``shard_index``: :class:`ShardIndex`, the compact boundaries and their checks per run;
- ``store``: the per-user on-disk store (index texts for shards recordkit did not
  write, binary copies of parsed boundaries); it keeps files and hands back arrays;
- ``open``: how a reader gets an index (sidecar, store, else a CRC-checked scan):
  :func:`open_index`, :func:`ensure_index`.

Imports go one way: ``open`` -> ``shard_index`` -> ``store`` -> ``text`` -> ``recordkit.format``.
"""

from .open import ensure_index, load_index_file, open_index
from .shard_index import ShardIndex
from .text import parse_bounds

__all__ = ["ShardIndex", "ensure_index", "load_index_file", "open_index", "parse_bounds"]
