"""The shard cache's errors, defined with every other in :mod:`recordkit.errors`.

Kept so that ``recordkit.cache._errors`` imports go on working; the classes are
:mod:`recordkit.errors`'s (``CacheFullError`` is a ``DiskFullError``).
"""

from __future__ import annotations

from ..errors import CacheFullError, DownloadError, ProduceError

__all__ = ["CacheFullError", "DownloadError", "ProduceError"]
