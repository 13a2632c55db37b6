"""``recordkit.Writer``: samples in, published shards and a manifest out."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from .._units import parse_size
from .._version import __version__
from ..codec.schema import Schema
from ..errors import NO_SPACE, DatasetExistsError, DiskFullError, SchemaError
from ..format import TMP_MARKER
from ..format.complete import MARKER_NAME, mark_finished, mark_started, marker_bytes
from ..format.manifest import MANIFEST_NAME, SHARD_PATTERNS, Manifest, ShardInfo
from ..storage import is_temp_name, open_target
from .lease import Lease
from .sequence import ShardSequence

__all__ = ["Writer"]

log = logging.getLogger(__name__)


def _is_shard_name(name: str) -> bool:
    """A TFRecord shard by the readers' patterns (not an index, not a temp file)."""
    return (
        not name.endswith(".idx")
        and not is_temp_name(name)
        and any(fnmatch.fnmatchcase(name, p) for p in SHARD_PATTERNS)
    )


class Writer:
    """Write samples into a recordkit dataset: indexed TFRecord shards plus a manifest.

    Use it as a context manager::

        schema = recordkit.Schema(image=recordkit.Bytes(), label=recordkit.Int64())
        with recordkit.Writer("out/", schema, shard_size="256MiB") as w:
            w.write({"image": jpeg_bytes, "label": 3})

    Each shard is ``{prefix}-{NNNNN}.tfrecord`` with its index
    ``{prefix}-{NNNNN}.tfrecord.idx``; both are published atomically (temp file,
    fsync, rename; the index before the shard). ``recordkit.json`` is written
    when the block exits normally; if it raises, the shard in progress is
    discarded and no manifest is written, so the dataset never looks complete:
    until the manifest is published the directory holds the in-progress marker,
    which readers refuse (:class:`~recordkit.errors.IncompleteDatasetError`) without
    ``partial=True``, whether the writer raised, was killed or is still running.

    Args:
        path_or_url: the dataset directory: a local path or an fsspec URL
            (``s3://bucket/prefix``, ``memory://x``). Created if missing.
        schema: the :class:`~recordkit.Schema` every sample must fit.
        shard_size: start a new shard once the next record would take a shard past
            this many bytes. An int, or a string with ``KiB``/``MiB``/``GiB``
            (powers of 1024) or ``KB``/``MB``/``GB`` (powers of 1000). 256 MiB
            keeps shards few enough to list quickly and small enough to cache,
            download and shuffle at shard granularity. A single record larger
            than this gets a shard of its own.
        max_records: also start a new shard after this many records (``None``: no limit).
        prefix: shard file name prefix.
        metadata: JSON-serialisable metadata stored in the manifest (e.g. class names).
        overwrite: replace an existing dataset in the directory. Without it, a
            directory holding a manifest or shards with this prefix is an error.
        storage_options: passed to fsspec for remote URLs.
        fsync: fsync each shard before publishing it (default). A published shard
            then survives a power cut; turn it off only for scratch data, where
            it saves the wait for the disk (TensorFlow's writer never fsyncs).
        break_lock: take over a remote destination's lease whose holder this
            host cannot see (``docs/howto/concurrency.md``).

    Raises:
        DestinationBusyError: another writer holds the directory (one writer per
            destination; the lease is held until the manifest is published or
            the block raises).
        DatasetExistsError: the directory holds a dataset, or shards this writer
            did not write (foreign TFRecords), and not ``overwrite``.
        recordkit.errors.DiskFullError: no space left where a shard is written (its
            path named).
    """

    def __init__(
        self,
        path_or_url: str | os.PathLike[str],
        schema: Schema,
        *,
        shard_size: int | str = "256MiB",
        max_records: int | None = None,
        prefix: str = "part",
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        fsync: bool = True,
        break_lock: bool = False,
    ) -> None:
        if not isinstance(schema, Schema):
            raise SchemaError(f"schema must be a recordkit.Schema, got {type(schema).__name__}")
        self.shard_size = parse_size(shard_size)
        if self.shard_size <= 0:
            raise ValueError(f"shard_size must be positive, got {shard_size!r}")
        if max_records is not None and max_records <= 0:
            raise ValueError(f"max_records must be positive or None, got {max_records!r}")
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise ValueError(f"prefix must be a plain file name prefix, got {prefix!r}")
        if TMP_MARKER in prefix:  # its shards would be taken for temp files, and removed
            raise ValueError(f"prefix must not contain {TMP_MARKER!r}, got {prefix!r}")
        self.schema = schema
        self.max_records = max_records
        self.prefix = prefix
        self.metadata = dict(metadata or {})
        self.fsync = fsync
        self._closed = True  # until everything below is in place
        self._lease = Lease(
            path_or_url, storage_options, what="a recordkit.Writer", break_lock=break_lock
        )
        self._lease.acquire()  # before anything is looked at: one writer at a time
        try:
            self._target = open_target(path_or_url, storage_options)
            self.root = self._target.root
            self._prepare(overwrite)
            self._sequence = ShardSequence(
                self._target,
                prefix,
                shard_size=self.shard_size,
                max_records=max_records,
                fsync=fsync,
            )
        except BaseException:
            self._lease.release()
            raise
        self._closed = False
        self.manifest: Manifest | None = None

    def _prepare(self, overwrite: bool) -> None:
        names = self._target.listdir()
        ours = [n for n in names if n == MANIFEST_NAME or n.startswith(f"{self.prefix}-")]
        finished = [n for n in ours if not is_temp_name(n)]
        if finished and not overwrite:
            raise DatasetExistsError(
                f"{self.root} already holds a dataset ({len(finished)} files such as "
                f"{finished[0]!r}); pass overwrite=True to replace it"
            )
        # Shards of someone else's: a manifest of ours would hide them from every reader.
        foreign = sorted(n for n in names if n not in ours and _is_shard_name(n))
        if foreign and not overwrite:
            raise DatasetExistsError(
                f"{self.root} holds {len(foreign)} TFRecord file(s) this writer did not write "
                f"(such as {foreign[0]!r}): its manifest would hide them from every reader; "
                "write somewhere else, or pass overwrite=True to make this the dataset there"
            )
        if foreign:
            log.warning(
                "%s: %d TFRecord file(s) such as %r are not part of the dataset written there",
                self.root,
                len(foreign),
                foreign[0],
            )
        # Marked before anything is removed or written, so no moment of this write
        # leaves a folder that reads as a smaller whole dataset.
        mark_started(self._target, "writer")
        # The manifest goes first, so the directory stops claiming to be complete
        # before any shard it lists disappears.
        for name in sorted(ours, key=lambda n: n != MANIFEST_NAME):
            self._target.remove(name)

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """The shards published so far."""
        return self._sequence.shards

    @property
    def records_written(self) -> int:
        """Records written so far (the shard in progress included)."""
        return self._sequence.records

    @property
    def bytes_written(self) -> int:
        """Framed bytes written so far (the shard in progress included)."""
        return self._sequence.bytes

    def write(self, sample: Mapping[str, Any]) -> None:
        """Encode ``sample`` with the schema and append it (``SchemaError`` if it does not fit)."""
        self.write_encoded(self.schema.encode(sample))

    def write_encoded(self, payload: bytes | bytearray | memoryview) -> None:
        """Append a serialised ``tf.train.Example`` that the caller vouches fits the schema.

        Used to re-shard foreign TFRecords without decoding them.
        """
        if self._closed:
            raise ValueError("write to a closed Writer")
        with self._no_space():
            self._sequence.write(payload)

    @contextlib.contextmanager
    def _no_space(self) -> Iterator[None]:
        """An ``OSError`` of a full device or quota becomes a :class:`DiskFullError`
        naming where it was written."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in NO_SPACE or isinstance(exc, DiskFullError):
                raise
            where = exc.filename or self.root
            raise DiskFullError(
                f"no space left on the device writing the dataset {self.root} (record "
                f"{self.records_written}); the published shards stay, the one in progress "
                "is discarded",
                path=str(where),
                errno=exc.errno,
            ) from exc

    def close(self) -> Manifest:
        """Publish the last shard and the manifest; return the manifest. Idempotent."""
        if self._closed:
            if self.manifest is None:
                raise ValueError("this Writer was aborted; it wrote no manifest")
            return self.manifest
        try:
            with self._no_space():
                shards = self._sequence.close()
            manifest = Manifest(
                schema=self.schema.to_json(),
                shards=shards,
                metadata=self.metadata,
                created_by=f"recordkit {__version__}",
            )
            with self._no_space():
                self._target.write_bytes(MANIFEST_NAME, manifest.dumps())
            self.manifest = manifest
            mark_finished(self._target)  # after the manifest: never a moment unmarked
        finally:
            self._closed = True
            self._target.close()
            self._lease.release()
        return manifest

    def abort(self, error: BaseException | None = None) -> None:
        """Discard the shard in progress and write no manifest. Published shards stay.

        The in-progress marker stays too (recording ``error`` when given), so the
        directory keeps saying that this write did not finish.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._sequence.discard()
            if error is not None:
                note = f"record {self.records_written}: {type(error).__name__}: {error}"
                try:
                    self._target.write_bytes(MARKER_NAME, marker_bytes("writer", error=note))
                except Exception:  # the marker is there already; the reason is a bonus
                    log.debug("could not record the error in the marker", exc_info=True)
        finally:
            self._target.close()
            self._lease.release()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort(exc)

    def __del__(self) -> None:
        # A Writer dropped without close() must not leave a half-written temp file.
        if not getattr(self, "_closed", True):
            self.abort()
