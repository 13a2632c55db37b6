"""``recordkit.verify`` and ``recordkit.build_index``: check everything, report every problem."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ._progress import NoTracker, Tracker
from ._units import format_size, plural
from .codec.limits import DecodeLimits
from .codec.schema import Schema
from .codec.sequence import SequenceSchema
from .errors import (
    CorruptRecordError,
    IncompleteDatasetError,
    InvalidIndexError,
    ManifestError,
    RecordkitError,
    ShardChangedError,
    ShardNotFoundError,
)
from .format import guard
from .format.complete import MARKER_NAME, check_complete
from .format.compressed import compressed_error, open_stream, sniff_compression
from .format.framing import read_record, read_stream
from .format.index import (
    index_path,
    load_index,
    max_index_bytes,
    open_map,
    scan_index,
    validate_index,
    write_index,
)
from .format.manifest import MANIFEST_NAME, ShardInfo, read_manifest
from .reader.finding import compressed_names, expand, find_shards, has_glob, what_it_is
from .storage import strip_file_scheme

__all__ = ["Problem", "VerifyReport", "build_index", "verify"]

#: What payloads are checked against: an Example schema, or (a manifest whose payload
#: is ``sequence_example``) a SequenceExample schema, each record decoded whole.
Decoder = Schema | SequenceSchema

_CRC_CHUNK = 64 << 20  # whole-file CRC in chunks so a huge shard is not one GIL-free call
_PROGRESS_EVERY = 1024  # records between progress counts inside a shard: cheap, and smooth

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a dataset.

    Attributes:
        path: the file concerned (shard, index or manifest).
        offset: byte offset in that file, when known.
        record: record number (index line number for index files), when known.
        message: what is wrong.
    """

    path: str
    offset: int | None
    record: int | None
    message: str

    def __str__(self) -> str:
        offset = "?" if self.offset is None else self.offset
        record = "?" if self.record is None else self.record
        return f"{self.path}:{offset}:{record}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What :func:`verify` checked and found.

    Attributes:
        root: the dataset directory.
        shards: shard files checked.
        records: records whose CRCs (and payloads, with a schema) were checked.
        bytes: bytes of shard data checked.
        problems: everything found wrong, in file order.
        notes: what is worth knowing but not wrong (a foreign shard without an
            index, a compressed TFRecord checked as a stream), in file order.
    """

    root: str
    shards: int = 0
    records: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"{self.root}: {self.summary()}"
        notes = [f"note: {n}" for n in self.notes]
        return "\n".join([head, *map(str, self.problems), *notes])

    def summary(self) -> str:
        """What was checked and the verdict, in one line: ``"2 shards, 600 records,
        1.4 MiB: OK"``."""
        verdict = "OK" if self.ok else f"FAILED: {plural(len(self.problems), 'problem')}"
        return (
            f"{plural(self.shards, 'shard')}, {plural(self.records, 'record')}, "
            f"{format_size(self.bytes)}: {verdict}"
        )


class _Step:
    """Counts one shard's progress; adds up to exactly the size its total assumed."""

    def __init__(self, progress: Tracker, size: int) -> None:
        self.progress, self.size = progress, size
        self.bytes = self.records = 0

    def to(self, offset: int, records: int) -> None:
        """The walk reached ``offset`` after ``records`` records."""
        more = min(offset, self.size) - self.bytes
        if more > 0 or records > self.records:
            self.progress.add(bytes=max(0, more), records=records - self.records)
            self.bytes += max(0, more)
            self.records = records

    def finish(self, records: int) -> None:
        """The shard is done (or given up) after ``records``: the rest, and the shard."""
        self.progress.add(bytes=self.size - self.bytes, records=records - self.records, shards=1)
        self.bytes, self.records = self.size, records


def _size(root: str, info: ShardInfo) -> int:
    """A shard's size for the progress total: the manifest's, else the file's."""
    return info.bytes if info.crc32c is not None else _file_size(os.path.join(root, info.path))


def _file_size(path: str) -> int:
    """The file's size for a progress total (0 if there is none)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _shard_list(root: str) -> tuple[list[ShardInfo], Decoder | None, list[Problem]]:
    manifest_path = os.path.join(root, MANIFEST_NAME)
    if not os.path.lexists(manifest_path):  # a broken link there is a problem, not "none"
        # A folder of compressed TFRecords only (Beam's *.tfrecord.gz, Ray's GZIP .tar)
        # is verified as streams, as the readers name it.
        names = find_shards(root) or compressed_names(root)
        return [ShardInfo(p, 0, 0) for p in names], None, []
    try:
        manifest = read_manifest(root)
    except (ManifestError, ShardNotFoundError) as exc:
        found = [ShardInfo(p, 0, 0) for p in find_shards(root)]
        reason = exc.reason if isinstance(exc, ManifestError) else f"{exc} (a dangling link)"
        return found, None, [Problem(manifest_path, None, None, reason)]
    problems = []
    schema: Decoder | None
    try:
        if manifest.sequence_example:
            schema = SequenceSchema.from_json(manifest.schema)
        else:
            schema = Schema.from_json(manifest.schema)
    except RecordkitError as exc:
        schema = None
        problems.append(Problem(manifest_path, None, None, f"bad schema: {exc}"))
    return list(manifest.shards), schema, problems


def _nothing_here(root: str) -> str:
    """Why a folder without a manifest or shards verified nothing, and what it holds."""
    others = sorted(e.name for e in os.scandir(root) if e.is_file() and not e.name.startswith("."))
    what = "no manifest and no TFRecord shards (*.tfrecord, *.tfrecords, *.tfrecord-*)"
    below = sorted(
        e.name
        for e in os.scandir(root)
        if e.is_dir() and os.path.exists(os.path.join(e.path, MANIFEST_NAME))
    )
    if below:
        return f"nothing to verify: {what}; the datasets are one level down: " + ", ".join(
            os.path.join(root, b) for b in below[:5]
        )
    if not others:
        return f"nothing to verify: {what}; the folder is empty"
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (
        f"nothing to verify: {what}; skipped {len(others)} other file(s): {shown} "
        f"(TFRecords named otherwise: verify one by its path)"
    )


def verify(
    path: str | os.PathLike[str],
    *,
    schema: Schema | None = None,
    decode: bool = True,
    partial: bool = False,
    limits: DecodeLimits | None = None,
    progress: Tracker | None = None,
) -> VerifyReport:
    """Check a dataset (or one shard) completely and report every problem found.

    Checks the manifest (parse, schema, every listed shard present with the right
    size, record count and whole-file CRC32C), every index (present, well-formed,
    matching its shard), every record's length and payload CRC, and with
    ``decode`` that every payload decodes with the schema. After a bad record it
    resumes at the next record the index knows of, so one bad bit does not hide
    the rest of the shard. A dataset whose manifest says its payloads are
    SequenceExamples has each record decoded whole and checked to hold no
    context feature, feature list or kind that the manifest's schema lacks.
    A directory where a write of ours did not finish
    (the in-progress marker, no manifest) is a problem, named first, unless
    ``partial`` (then only its published shards are checked, with a WARNING).
    Never raises for bad data; raises
    :class:`~recordkit.errors.ShardNotFoundError` only if ``path`` does not exist.

    A record whose zstd values would decompress to more than ``limits`` (default:
    :class:`~recordkit.codec.DecodeLimits`'s, derived from the schema) is a
    problem, found from the frame header before anything is allocated.

    ``progress`` receives the totals (bytes, shards, records when the manifest
    lists them) and counts as the check goes, every 1024 records and per shard:
    any object with ``start(*, bytes, records, shards, items, done)``,
    ``add(*, bytes, records, shards, items)`` and ``close()`` (the CLI's bar or
    log lines). Each shard checked is logged at INFO on ``recordkit.verify``.
    """
    if limits is not None and not isinstance(limits, DecodeLimits):
        raise TypeError(f"limits must be a DecodeLimits or None, got {limits!r}")
    limits = limits or DecodeLimits()
    path = os.path.abspath(strip_file_scheme(path))
    problems: list[Problem] = []
    decoder: Decoder | None = schema
    if has_glob(path):  # the files a glob names (engines' shard names)
        root, names = expand(path)
        infos = [ShardInfo(n, 0, 0) for n in names]
    elif os.path.isdir(path):
        root = path
        infos, manifest_schema, problems = _shard_list(root)
        decoder = schema or manifest_schema
        try:
            check_complete(root, partial)
        except IncompleteDatasetError as exc:
            problems.insert(0, Problem(os.path.join(root, MARKER_NAME), None, None, str(exc)))
    elif os.path.isfile(path):
        root = os.path.dirname(path)
        infos = [ShardInfo(os.path.basename(path), 0, 0)]
    else:
        raise ShardNotFoundError(f"no such dataset: {path}")
    if os.path.isfile(path):
        looks = what_it_is(path)
        if looks is not None:  # no frame to check: say what it is instead of "corrupt"
            problem = Problem(path, 0, None, f"not a TFRecord file: it looks like {looks}")
            return VerifyReport(root=path, problems=[problem])
    if not infos and os.path.isdir(path) and not os.path.lexists(os.path.join(root, MANIFEST_NAME)):
        problems.append(Problem(root, None, None, _nothing_here(root)))
    report = VerifyReport(root=path, problems=problems)
    progress = progress or NoTracker()
    sizes = [_size(root, info) for info in infos]
    listed = bool(infos) and all(info.crc32c is not None for info in infos)
    progress.start(
        bytes=sum(sizes),
        shards=len(infos),
        records=sum(info.records for info in infos) if listed else None,
        done={"records": 0},
    )
    try:
        for info, size in zip(infos, sizes, strict=True):
            step = _Step(progress, size)
            before = (len(report.problems), report.records)
            try:
                report.problems.extend(
                    _verify_shard(root, info, decoder if decode else None, report, limits, step)
                )
            finally:
                step.finish(report.records - before[1])
            found = len(report.problems) - before[0]
            log.info(
                "checked %s: %s, %s: %s",
                info.path,
                plural(report.records - before[1], "record"),
                format_size(size),
                "OK" if not found else plural(found, "problem"),
            )
    finally:
        progress.close()
    return report


def _verify_shard(
    root: str,
    info: ShardInfo,
    schema: Decoder | None,
    report: VerifyReport,
    limits: DecodeLimits,
    step: _Step,
) -> Iterator[Problem]:
    path = os.path.join(root, info.path)
    try:
        buf = open_map(path)
    except ShardNotFoundError:
        yield Problem(path, None, None, "shard listed in the manifest is missing")
        return
    except CorruptRecordError as exc:  # a directory, FIFO or device where the shard should be
        yield Problem(path, None, None, exc.reason)
        return
    try:
        report.shards += 1
        report.bytes += len(buf)
        yield from _verify_map(path, info, buf, schema, report, limits, step)
    except ShardChangedError as exc:  # another program changed it: nothing after is sound
        yield Problem(path, exc.offset, exc.record, exc.reason)
    finally:
        if isinstance(buf, mmap.mmap):
            with contextlib.suppress(BufferError):
                buf.close()


def _verify_map(
    path: str,
    info: ShardInfo,
    buf: bytes | mmap.mmap,
    schema: Decoder | None,
    report: VerifyReport,
    limits: DecodeLimits,
    step: _Step,
) -> Iterator[Problem]:
    listed = info.crc32c is not None  # listed by a manifest, not found by scanning
    kind = sniff_compression(buf[:12])
    if kind is not None and not listed:
        yield from _verify_stream(path, buf, kind, schema, report)
        return
    if listed and len(buf) != info.bytes:
        yield Problem(path, None, None, f"size {len(buf)} != manifest {info.bytes}")
    if listed and _file_crc(buf, path) != info.crc32c:
        yield Problem(path, None, None, "whole-file CRC32C differs from the manifest")
    entries, index_problems = _check_index(path, buf)
    if not listed and entries is None and index_problems and not os.path.lexists(index_path(path)):
        # A foreign shard need not have an index: note it, check it by a walk.
        report.notes.append(
            Problem(
                index_path(path),
                None,
                None,
                "no index beside this shard (readers build one in memory or the per-user "
                "cache; `recordkit index` writes it here)",
            )
        )
        index_problems = []
    yield from index_problems
    count = 0
    for problem_or_count in _walk(path, buf, entries, schema, limits, step):
        if isinstance(problem_or_count, Problem):
            yield problem_or_count
        else:
            count = problem_or_count
    report.records += count
    if listed and entries is not None and len(entries) != info.records:
        yield Problem(path, None, None, f"{len(entries)} records != manifest {info.records}")


def _verify_stream(
    path: str, buf: bytes | mmap.mmap, kind: str, schema: Decoder | None, report: VerifyReport
) -> Iterator[Problem]:
    """Check a GZIP/ZLIB TFRecord as a stream: every CRC (offsets in the uncompressed stream)."""
    report.notes.append(Problem(path, 0, None, compressed_error(path, kind).reason))
    offset, record = 0, 0
    with open(path, "rb") as raw:
        stream = open_stream(raw, kind)
        try:
            for payload in read_stream(stream, path=path):
                if schema is not None:
                    try:
                        schema.decode(payload)
                    except CorruptRecordError as exc:
                        raise exc.located(path, offset, record) from exc
                offset += len(payload) + 16
                record += 1
        except CorruptRecordError as exc:
            yield Problem(path, exc.offset, exc.record, f"{exc.reason} ({kind} stream)")
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            yield Problem(path, None, record, f"{kind} stream unreadable: {exc}")
    report.records += record


def _file_crc(buf: bytes | mmap.mmap, path: str) -> int:
    crc, view = 0, memoryview(buf)
    try:
        for start in range(0, len(view), _CRC_CHUNK):
            guard.check_size(buf, None, path, offset=start)
            chunk = view[start : start + _CRC_CHUNK]
            crc = guard.crc32c(chunk, crc, path=path, offset=start)
            chunk.release()
    finally:
        view.release()
    return crc


def _check_index(path: str, buf: bytes | mmap.mmap) -> tuple[np.ndarray | None, list[Problem]]:
    """Load the index; return entries usable for resync (or None) and problems found."""
    idx = index_path(path)
    try:
        entries = load_index(idx, max_bytes=max_index_bytes(len(buf)))
    except ShardNotFoundError:
        return None, [Problem(idx, None, None, "index missing (recordkit index can rebuild it)")]
    except InvalidIndexError as exc:
        return None, [Problem(idx, None, exc.record, exc.reason)]
    try:
        validate_index(entries, buf, path=path, index_file=idx)
    except InvalidIndexError as exc:
        problem = Problem(idx, exc.offset, exc.record, exc.reason)
        # An index that tiles the file exactly but disagrees with one length field is
        # still a good map for resyncing past a corrupt header; keep using it.
        sizes = entries[:, 1]
        tiles = len(entries) and int(sizes.sum()) == len(buf) and entries[0, 0] == 0
        return (entries if tiles else None), [problem]
    return entries, []


def _walk(
    path: str,
    buf: bytes | mmap.mmap,
    entries: np.ndarray | None,
    schema: Decoder | None,
    limits: DecodeLimits,
    step: _Step,
) -> Iterator[Problem | int]:
    """Check every record; yield problems, then the number of records walked."""
    n = len(entries) if entries is not None else None
    offset, record, end = 0, 0, len(buf)
    while (offset < end) if n is None else (record < n):
        if record % _PROGRESS_EVERY == 0 and record:
            step.to(offset, record)
        if n is not None:
            offset = int(entries[record, 0])  # type: ignore[index]
        try:
            payload = read_record(buf, offset, path=path, record=record)
            # The framing is sound: a payload that does not decode still tells where
            # the next record starts, index or not.
            next_offset = offset + len(payload) + 16
            if schema is not None:
                data = guard.read(
                    payload, 0, len(payload), path=path, offset=offset, record=record, check=False
                )
                try:
                    schema.decode(data, limits=limits)
                except CorruptRecordError as exc:
                    yield Problem(path, offset, record, exc.reason)
            del payload
        except CorruptRecordError as exc:
            yield Problem(path, offset, record, exc.reason)
            if n is None:
                break  # without an index there is no trustworthy next offset
            next_offset = -1
        record += 1
        offset = next_offset
    yield record


def build_index(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    verify: bool = True,
    progress: Tracker | None = None,
) -> list[str]:
    """Write a DALI/``tfrecord``-compatible ``.idx`` beside a shard, or each shard of a directory.

    Args:
        path: a shard, a dataset directory (its manifest's shards, else every shard
            found), or a list of either.
        verify: check every payload CRC too (length CRCs are always checked).
        progress: receives the totals (bytes, shards) and counts per shard, as
            :func:`verify`'s does.

    Returns the index files written. Raises :class:`~recordkit.errors.CorruptRecordError`
    (naming file, offset and record) if a shard cannot be indexed.
    """
    targets = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    files = [f for target in targets for f in _index_targets(target)]
    sizes = [_file_size(f) for f in files]
    progress = progress or NoTracker()
    progress.start(bytes=sum(sizes), shards=len(files), done={"records": 0})
    written = []
    try:
        for f, size in zip(files, sizes, strict=True):
            entries = scan_index(f, verify=verify)
            write_index(index_path(f), entries)
            written.append(index_path(f))
            progress.add(bytes=size, records=len(entries), shards=1)
            log.info("indexed %s: %s, %s", f, plural(len(entries), "record"), format_size(size))
    finally:
        progress.close()
    return written


def _index_targets(target: str | os.PathLike[str]) -> list[str]:
    """The shard files one ``build_index`` argument names."""
    path = os.path.abspath(strip_file_scheme(target))
    if os.path.isdir(path):
        try:
            shards = [s.path for s in read_manifest(path).shards]
        except ShardNotFoundError:
            shards = find_shards(path)
        return [os.path.join(path, s) for s in shards]
    if os.path.isfile(path):
        return [path]
    raise ShardNotFoundError(f"no such file or directory: {path}")
