"""The recordkit error tree.

Every error is a :class:`RecordkitError` *and* a builtin exception, so callers
that only know the standard library can still catch it sensibly::

    RecordkitError (Exception)
    ├── CorruptRecordError (ValueError)      bad framing, CRC mismatch, bad payload
    │   ├── SequenceExampleError             a SequenceExample where an Example is read
    │   ├── TruncatedRecordError             a record cut short (also in the length field)
    │   └── RecordTooLargeError              a length field or zstd frame over the limit
    ├── CompressedTFRecordError (ValueError) a GZIP/ZLIB TFRecord where random access is needed
    ├── InvalidIndexError (ValueError)       an index sidecar that does not match its shard
    ├── ManifestError (ValueError)           an unreadable or inconsistent recordkit.json
    ├── IncompleteDatasetError (ValueError)  a folder where a write of ours did not finish
    ├── ShardChangedError (OSError)          a shard that changed (shrank) after it was opened
    ├── SchemaError (ValueError)             a bad schema, or a sample that does not fit it
    ├── ShardNotFoundError (FileNotFoundError)  a dataset, shard or index that is not there
    ├── AccessDeniedError (PermissionError)  a remote that refused access (HTTP 401/403)
    ├── DatasetExistsError (FileExistsError) writing over a dataset without overwrite=True
    ├── LoaderTimeoutError (TimeoutError)    a loader process that made no progress in time
    └── MissingDependencyError (ImportError) an optional extra that is not installed

Errors about bytes on disk carry ``path``, ``offset`` (byte offset of the record
start in the shard) and ``record`` (0-based record number in the shard) where
they are known, and put all three in the message as ``path:offset:record``.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = [
    "AccessDeniedError",
    "CompressedTFRecordError",
    "CorruptRecordError",
    "DatasetExistsError",
    "IncompleteDatasetError",
    "InvalidIndexError",
    "LoaderTimeoutError",
    "ManifestError",
    "MissingDependencyError",
    "RecordTooLargeError",
    "RecordkitError",
    "SchemaError",
    "SequenceExampleError",
    "ShardChangedError",
    "ShardNotFoundError",
    "TruncatedRecordError",
]


class RecordkitError(Exception):
    """Base class of every error raised by recordkit."""


def _where(path: str | None, offset: int | None, record: int | None) -> str:
    parts = [str(path) if path is not None else "<buffer>"]
    parts.append(str(offset) if offset is not None else "?")
    parts.append(str(record) if record is not None else "?")
    return ":".join(parts)


_E = TypeVar("_E", bound="_LocatedError")


class _LocatedError(RecordkitError):
    """An error about a place in a file: ``path:offset:record: reason``."""

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
        err: _E = _rebuild(type(self), self.reason, self.__dict__.copy())
        err.path = None if path is None else str(path)
        err.offset, err.record = offset, record
        Exception.__init__(err, f"{_where(err.path, offset, record)}: {self.reason}")
        err.__cause__ = self
        return err

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep keyword-only state when an error crosses a process boundary
        # (multiprocessing and Dask pickle exceptions; our data never is).
        return (_rebuild, (type(self), self.reason, self.__dict__.copy()))


def _rebuild(cls: type[_E], reason: str, state: dict[str, Any]) -> _E:
    err = cls.__new__(cls)
    err.__dict__.update(state)
    Exception.__init__(err, f"{_where(err.path, err.offset, err.record)}: {reason}")
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
        path: str | None = None,
        offset: int | None = None,
        record: int | None = None,
        expected_crc: int | None = None,
        actual_crc: int | None = None,
    ) -> None:
        self.expected_crc = expected_crc
        self.actual_crc = actual_crc
        if expected_crc is not None and actual_crc is not None:
            reason = f"{reason} (stored {expected_crc:#010x}, computed {actual_crc:#010x})"
        super().__init__(reason, path=path, offset=offset, record=record)


class SequenceExampleError(CorruptRecordError):
    """A ``tf.train.SequenceExample`` payload where a ``tf.train.Example`` is read.

    Its context parses as an Example's features; its feature lists would be
    dropped. recordkit refuses it rather than return a partial sample.
    """


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

    def __init__(
        self,
        reason: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        record: int | None = None,
        compression: str = "GZIP",
    ) -> None:
        self.compression = compression
        super().__init__(reason, path=path, offset=offset, record=record)


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

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_incomplete, (str(self), self.path))


def _rebuild_incomplete(message: str, path: str | None) -> IncompleteDatasetError:
    return IncompleteDatasetError(message, path=path)


class ShardChangedError(_LocatedError, OSError):
    """A shard whose file changed after it was opened (truncated, rewritten in place).

    An ``OSError``: the bytes were fine when indexed; another program changed the
    file under the reader (an rsync ``--inplace``, a rewrite, a network file system).
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

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_access, (self.reason, self.url))


def _rebuild_access(reason: str, url: str | None) -> AccessDeniedError:
    return AccessDeniedError(reason, url=url)


class DatasetExistsError(RecordkitError, FileExistsError):
    """A writer was pointed at a directory that already holds a dataset."""


class LoaderTimeoutError(RecordkitError, TimeoutError):
    """A loader process that handed nothing over for longer than its progress deadline.

    It was stopped (``SIGSTOP``), or is stuck (uninterruptible I/O on a network
    file system); the reader kills it before raising this.
    """


class MissingDependencyError(RecordkitError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""
