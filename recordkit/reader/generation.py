"""One generation per reader: a dataset replaced under an open reader is never read as a mix.

The rules (``docs/howto/concurrency.md``, "one generation per reader"): a dataset's
*generation* is its manifest's content
(:attr:`recordkit.format.manifest.Manifest.generation`); a reader pins the manifest
file's identity (device, inode, size, ``mtime_ns``) and generation at open
(:class:`Pin`). Every writer of ours removes the manifest *before* it removes or
replaces a shard, so a shard first mapped while the pinned manifest is still there is
of its generation (mapped first, the manifest checked after); one first mapped after
the manifest changed is refused (:class:`~recordkit.errors.ShardChangedError`) unless
the new manifest is the same generation; and a shard mapped again must be the very
file mapped the first time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ManifestError, ShardChangedError, ShardNotFoundError
from ..format.manifest import MANIFEST_NAME, Manifest, read_manifest

__all__ = ["Identity", "Pin", "identity_of", "pin"]

Identity = tuple[int, int, int, int]


def identity_of(st: os.stat_result) -> Identity:
    """A file's identity as the checks compare it: device, inode, size, ``mtime_ns``."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Pin:
    """The generation a reader opened, for the shards ``first .. stop - 1`` of its set.

    Attributes:
        root: the dataset directory.
        identity: the manifest file's identity when the reader opened it.
        generation: the manifest's generation then.
        first, stop: the shards of the reader's set it covers.
    """

    root: str
    identity: Identity
    generation: str
    first: int
    stop: int

    def check(self, shard: str) -> None:
        """``shard`` (of this pin's dataset), just mapped for the first time, is of the
        pinned generation.

        Raises:
            ShardChangedError: the dataset was replaced (or is being rewritten) since
                the reader opened it.
        """
        path = os.path.join(self.root, MANIFEST_NAME)
        try:
            now = identity_of(os.stat(path))
        except OSError:
            now = None
        if now == self.identity:
            return
        found = "none (a write is under way)"
        if now is not None:
            try:
                generation = read_manifest(self.root).generation
            except (ManifestError, ShardNotFoundError):
                generation = None
            if generation == self.generation:
                self.identity = now  # rewritten with the same content: the same data
                return
            found = generation or "unreadable"
        raise ShardChangedError(
            f"the dataset {self.root} was replaced after this reader opened it (generation "
            f"{self.generation}; its manifest's now: {found}): this shard is not the one "
            "it opened, and reading it would mix two datasets; open the dataset again to "
            "read the new one",
            path=shard,
        )


def pin(root: str, manifest: Manifest | None, first: int, stop: int) -> Pin | None:
    """The pin of a dataset just opened with ``manifest`` (``None`` without one)."""
    if manifest is None:
        return None
    try:
        st = os.stat(os.path.join(root, MANIFEST_NAME))
    except OSError:
        return None
    return Pin(root, identity_of(st), manifest.generation, first, stop)
