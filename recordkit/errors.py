"""The recordkit error tree: every exception recordkit raises is defined here.

Every error is a :class:`RecordkitError` *and* a builtin exception, so callers
that only know the standard library can still catch it sensibly::

    RecordkitError (Exception)
    ├── CorruptRecordError (ValueError)      bad framing, CRC mismatch, bad payload
    │   ├── SequenceExampleError             a SequenceExample where an Example is read
    │   ├── UnknownFieldError                a payload field its message type does not define
    │   ├── TruncatedRecordError             a record cut short (also in the length field)
    │   └── RecordTooLargeError              a length field or zstd frame over the limit
    ├── CompressedTFRecordError (ValueError) a GZIP/ZLIB TFRecord where random access is needed
    ├── ImageDecodeError (ValueError)        an image feature whose bytes do not decode
    ├── OptionError (ValueError)             an option given a value it does not take
    ├── InvalidIndexError (ValueError)       an index sidecar that does not match its shard
    ├── ManifestError (ValueError)           an unreadable or inconsistent recordkit.json
    ├── IncompleteDatasetError (ValueError)  a folder where a write of ours did not finish
    ├── ShardChangedError (OSError)          a shard that changed (shrank) after it was opened
    ├── SchemaError (ValueError)             a bad schema, or a sample that does not fit it
    ├── ShardNotFoundError (FileNotFoundError)  a dataset, shard or index that is not there
    ├── AccessDeniedError (PermissionError)  a remote that refused access (HTTP 401/403)
    ├── DatasetExistsError (FileExistsError) writing over a dataset without overwrite=True
    ├── DestinationBusyError (BlockingIOError)  a destination another writer holds
    ├── LoaderTimeoutError (TimeoutError)    a loader process that made no progress in time
    ├── MissingDependencyError (ImportError) an optional extra that is not installed
    ├── SourceError (ValueError)             converters: source data that cannot be converted
    ├── SourceNotFoundError (FileNotFoundError)  converters: a source that is not there
    ├── ConvertError (RuntimeError)          a conversion that could not finish
    │   └── PartitionsFailedError (ExceptionGroup)  partitions that failed, together; a
    │                                        note on each child names partition and items
    ├── DiskFullError (OSError, ENOSPC)      no room for a shard where it is written: the
    │   │                                    device or a quota (a conversion's partition)
    │   └── CacheFullError                   ... or a shard cache's budget, after evicting
    │                                        every shard that may be evicted
    ├── DownloadError (OSError)              a remote read that failed after its retries, or
    │                                        returned the wrong length, size or CRC
    ├── ProduceError (RuntimeError)          cache producer mode: a partition's writer
    │                                        failed, died or stopped responding
    └── OutgrewError (RuntimeError)          internal: a producer partition outgrew its
                                             reservation (redone larger; never reaches you)

Errors about bytes on disk carry ``path``, ``offset`` (byte offset of the record
start in the shard) and ``record`` (0-based record number in the shard) where
they are known, and put all three in the message as ``path:offset:record``.
"""

from __future__ import annotations

import errno as _errno
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = [
    "AccessDeniedError",
    "CacheFullError",
    "CompressedTFRecordError",
    "ConvertError",
    "CorruptRecordError",
    "DatasetExistsError",
    "DestinationBusyError",
    "DiskFullError",
    "DownloadError",
    "ImageDecodeError",
    "IncompleteDatasetError",
    "InvalidIndexError",
    "LoaderTimeoutError",
    "ManifestError",
    "MissingDependencyError",
    "OptionError",
    "OutgrewError",
    "PartitionsFailedError",
    "ProduceError",
    "RecordTooLargeError",
    "RecordkitError",
    "SchemaError",
    "SequenceExampleError",
    "ShardChangedError",
    "ShardNotFoundError",
    "SourceError",
    "SourceNotFoundError",
    "TruncatedRecordError",
    "UnknownFieldError",
]


class RecordkitError(Exception):
    """Base class of every error raised by recordkit."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only state survives crossing a process (multiprocessing, Dask and
        # Ray pickle exceptions): rebuilt without calling __init__ again.
        return (_restore, (type(self), self.args, self.__dict__.copy()))


_R = TypeVar("_R", bound=BaseException)


def _restore(cls: type[_R], args: tuple[Any, ...], state: dict[str, Any]) -> _R:
    err = cls.__new__(cls, *args)
    (OSError if issubclass(cls, OSError) else BaseException).__init__(err, *args)
    err.__dict__.update(state)
    return err


def _where(path: str | None, offset: int | None, record: int | None) -> str:
    parts = [str(path) if path is not None else "<buffer>"]
    parts.append(str(offset) if offset is not None else "?")
    parts.append(str(record) if record is not None else "?")
    return ":".join(parts)


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (where notes are not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]


_E = TypeVar("_E", bound="_LocatedError")


class _LocatedError(RecordkitError):
    """An error about a place in a file: ``path:offset:record: reason``.

    Its subclasses take ``path``, ``offset`` and ``record`` as these keywords too.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        record: int | None = None,
    ) -> None:
        self.reason = reason
        self.path = None if path is None else str(path)
        self.offset = offset
        self.record = record
        super().__init__(f"{_where(self.path, offset, record)}: {reason}")

    def located(self: _E, path: str | None, offset: int | None, record: int | None) -> _E:
        """Return a copy of this error with its location filled in (keeps the subclass)."""
        err = _restore(type(self), self.args, self.__dict__.copy())
        err.path = None if path is None else str(path)
        err.offset, err.record = offset, record
        Exception.__init__(err, f"{_where(err.path, offset, record)}: {self.reason}")
        err.__cause__ = self
        return err


class CorruptRecordError(_LocatedError, ValueError):
    """A record whose framing, CRC or payload is wrong.

    Attributes:
        path: the shard file.
        offset: byte offset of the record's first header byte.
        record: 0-based record number within the shard.
        expected_crc: the masked CRC stored in the file, when a CRC failed.
        actual_crc: the masked CRC computed over the bytes, when a CRC failed.
    """

    def __init__(
        self,
        reason: str,
        *,
        expected_crc: int | None = None,
        actual_crc: int | None = None,
        **where: Any,
    ) -> None:
        self.expected_crc = expected_crc
        self.actual_crc = actual_crc
        if expected_crc is not None and actual_crc is not None:
            reason = f"{reason} (stored {expected_crc:#010x}, computed {actual_crc:#010x})"
        super().__init__(reason, **where)


class SequenceExampleError(CorruptRecordError):
    """A ``tf.train.SequenceExample`` payload where a ``tf.train.Example`` is read.

    Its context parses as an Example's features; its feature lists would be
    dropped. recordkit refuses it rather than return a partial sample.
    """


class UnknownFieldError(CorruptRecordError):
    """A payload field that its message type does not define (an unknown number, or a
    known one with another wire type): protobuf skips it silently, recordkit refuses the
    record. The message names the field, its wire type and where it sits.

    Attributes:
        field_number: the field's number.
        wire_type: its wire type, by name (``"varint"``, ``"64-bit"``,
            ``"length-delimited"``, ``"group start"``, ``"group end"``, ``"32-bit"``).
        where: the message it sits in (``"Feature 'k'"``, ``"the Int64List of
            feature 'k'"``, ...).
        message: the message type read (``"tf.train.Example"`` or
            ``"tf.train.SequenceExample"``).
        at: the payload byte where its tag starts.
    """

    def __init__(
        self,
        reason: str,
        *,
        field_number: int = 0,
        wire_type: str = "",
        where: str = "",
        message: str = "",
        at: int | None = None,
        **location: Any,
    ) -> None:
        self.field_number = field_number
        self.wire_type = wire_type
        self.where = where
        self.message = message
        self.at = at
        super().__init__(reason, **location)


class TruncatedRecordError(CorruptRecordError):
    """A record that the end of the file cuts short (a partial header included)."""


class RecordTooLargeError(CorruptRecordError):
    """A length field or a compressed frame that claims more than the limit allows."""


class CompressedTFRecordError(_LocatedError, ValueError):
    """A GZIP- or ZLIB-compressed TFRecord file where a reader needs random access.

    Not corruption: the file is whole, but it is one compressed stream with no
    record offsets. The message gives the ``recordkit convert`` command that
    makes an indexed copy.

    Attributes:
        compression: ``"GZIP"`` or ``"ZLIB"``.
    """

    def __init__(self, reason: str, *, compression: str = "GZIP", **where: Any) -> None:
        self.compression = compression
        super().__init__(reason, **where)


class ImageDecodeError(_LocatedError, ValueError):
    """An image feature whose bytes do not decode (not an image, truncated, corrupt).

    The record itself is sound (its CRCs passed): the bytes stored in it are
    not an image the decoder reads. ``path:offset:record`` locate the record in
    its shard; the message also names the feature and the sample's source key
    (``path`` of an ``imagefolder`` conversion, ``__key__`` of a WebDataset)
    where the batch holds one.

    Attributes:
        feature: the image feature's name.
        key: the sample's source key, or ``None``.
    """

    def __init__(
        self, reason: str, *, feature: str | None = None, key: str | None = None, **where: Any
    ) -> None:
        self.feature = feature
        self.key = key
        super().__init__(reason, **where)


class InvalidIndexError(_LocatedError, ValueError):
    """An index sidecar that is malformed, stale, or does not match its shard."""


class ManifestError(_LocatedError, ValueError):
    """A manifest that cannot be read or disagrees with the files it lists."""


class IncompleteDatasetError(RecordkitError, ValueError):
    """A folder that bears the mark of a write of ours that did not finish.

    A :class:`~recordkit.Writer` that raised or was killed, or an interrupted
    ``recordkit convert``: shards published, no manifest. The message says how
    far it got and how to finish it; readers take ``partial=True`` to read
    what is there. A ``ValueError``: the data is not the whole dataset asked for.

    Attributes:
        path: the dataset directory.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class ShardChangedError(_LocatedError, OSError):
    """A shard whose file changed after it was opened (truncated, rewritten in place).

    An ``OSError``: the bytes were fine when indexed; another program changed the
    file under the reader (an rsync ``--inplace``, a rewrite, a network file system).
    """


class OptionError(RecordkitError, ValueError):
    """An option given a value it does not take (a converter's ``-o KEY=VALUE``, ...).

    The message names the option, the value given and what it takes; the CLI
    prints it as one line.
    """


class SchemaError(RecordkitError, ValueError):
    """A schema that is invalid, or a sample or record that does not fit it."""


class ShardNotFoundError(RecordkitError, FileNotFoundError):
    """A dataset directory, shard, or index that does not exist."""


class AccessDeniedError(RecordkitError, PermissionError):
    """A remote that refused access: HTTP 401 or 403, S3 ``AccessDenied`` and the like.

    Never retried, never taken for a missing file. The message names the URL
    and what the remote answered; check the credentials and the permissions.

    Attributes:
        url: what was asked for.
    """

    def __init__(self, reason: str, *, url: str | None = None) -> None:
        super().__init__(f"{url}: {reason}" if url else reason)
        self.reason = reason
        self.url = url


class DatasetExistsError(RecordkitError, FileExistsError):
    """A writer was pointed at a directory that already holds a dataset."""


class DestinationBusyError(RecordkitError, BlockingIOError):
    """A dataset directory another writer holds (``Writer``, ``recordkit convert``,
    ``recordkit write``): the message names the process, its host and since when.

    Attributes:
        path: the destination.
        holder: what the holder's lease says (``pid``, ``host``, ``since``, ``what``),
            or ``{}`` when it could not be read.
    """

    def __init__(self, message: str, *, path: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


class LoaderTimeoutError(RecordkitError, TimeoutError):
    """A loader process that handed nothing over for longer than its progress deadline.

    It was stopped (``SIGSTOP``), or is stuck (uninterruptible I/O on a network
    file system); the reader kills it before raising this.
    """


class MissingDependencyError(RecordkitError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class SourceError(RecordkitError, ValueError):
    """Source data that cannot be converted (names the item and, where known, the row)."""


class SourceNotFoundError(RecordkitError, FileNotFoundError):
    """The source URL does not exist, or holds nothing this converter can read."""


class ConvertError(RecordkitError, RuntimeError):
    """A conversion that could not finish; published partitions are kept for a rerun."""


if sys.version_info >= (3, 11):
    _Group = ExceptionGroup  # noqa: F821 (a builtin since 3.11)
else:  # pragma: no cover - Python 3.10

    class _Group(Exception):
        """A minimal ``ExceptionGroup`` for Python 3.10: ``message`` and ``exceptions``."""

        def __init__(self, message: str, exceptions: Sequence[BaseException]) -> None:
            super().__init__(message, tuple(exceptions))
            self.message = message
            self.exceptions = tuple(exceptions)

        def __str__(self) -> str:
            n = len(self.exceptions)
            return f"{self.message} ({n} sub-exception{'s' if n != 1 else ''})"


class PartitionsFailedError(_Group, ConvertError):
    """Partitions that failed, together: an ``ExceptionGroup`` of their errors.

    Each child carries a note (``exc.__notes__``) naming its partition and the
    source items it was converting. Partitions that succeeded are published and
    a rerun resumes after them.
    """


#: The ``errno`` values of no room: a full device, or a full quota.
NO_SPACE = frozenset({_errno.ENOSPC, _errno.EDQUOT})


class DiskFullError(RecordkitError, OSError):
    """No room for a shard where recordkit writes it: ``errno`` ``ENOSPC`` (or ``EDQUOT``).

    A conversion's partition on a full device or quota (inside a
    :class:`~recordkit.errors.PartitionsFailedError`: the other partitions are
    kept, free some space and rerun), or a shard cache's budget
    (:class:`~recordkit.errors.CacheFullError`, a subclass).

    Attributes:
        reason: the message without the path.
        path: the shard or directory concerned, when known.
    """

    def __init__(self, reason: str, *, path: str | None = None, errno: int = _errno.ENOSPC) -> None:
        super().__init__(errno, reason)
        self.reason = reason
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class CacheFullError(DiskFullError):
    """A shard cache cannot make room for a shard.

    Raised when a shard is larger than the whole budget, or when the budget or the
    disk itself is full (``ENOSPC``) and evicting unpinned shards did not free
    enough space. Shards that readers have pinned are never evicted to make room.

    Attributes:
        path: the shard that did not fit (relative to the cache root).
        needed: the bytes it needs.
    """

    def __init__(self, reason: str, *, path: str | None = None, needed: int | None = None):
        super().__init__(reason, path=path)
        self.needed = needed


class DownloadError(RecordkitError, OSError):
    """A shard or index could not be fetched intact from the remote.

    The message names the remote URL and, for a ranged read, the byte range.
    Nothing of a failed download is ever published into the cache.

    Attributes:
        url: the remote file.
        offset: the first byte of the failed read, when it was a ranged read.
    """

    def __init__(self, reason: str, *, url: str | None = None, offset: int | None = None):
        super().__init__(_errno.EIO, reason)
        self.reason = reason
        self.url = url
        self.offset = offset

    def __str__(self) -> str:
        where = self.url or "<remote>"
        if self.offset is not None:
            where = f"{where}@{self.offset}"
        return f"{where}: {self.reason}"


class ProduceError(RecordkitError, RuntimeError):
    """Producer mode: a partition could not be turned into a shard this time.

    The writer raised (a source error, after its retries for transient ones),
    its process died (killed, out of memory) or reported no progress for the
    cache's ``inactivity_timeout``. Nothing of it is published; the partition is
    tried again later, less and less often, while the others go ahead. The
    message names the partition, its shard and its first source items; the
    writer's traceback, when there is one, is in :attr:`details`.

    Attributes:
        path: the partition's shard (relative to the cache root).
        details: the writer's traceback text, or ``""``.
    """

    def __init__(self, reason: str, *, path: str | None = None, details: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path
        self.details = details

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class OutgrewError(RecordkitError, RuntimeError):
    """Internal to the cache's producer mode: a partition's output would pass its
    reservation. The writer process stops; the cache redoes the partition with a
    larger reservation. It never reaches callers.

    Attributes:
        cap: the reservation it would have passed.
        items_done: source items fully written before that.
        source_done: their source bytes.
    """

    def __init__(self, cap: int, items_done: int, source_done: int) -> None:
        super().__init__(f"output would pass the reservation of {cap} bytes")
        self.cap, self.items_done, self.source_done = cap, items_done, source_done
