"""``recordkit.convert``: plan, skip what a previous run published, run the rest, merge.

The order of events, and why each is safe to interrupt (``kill -9`` included):

1. list the source and make the plan (nothing written yet);
2. look at the destination: a manifest from the same plan means done; a state
   directory (``.recordkit-convert/plan.json``) from the same plan means resume;
   anything else of ours there is an error unless ``overwrite``;
3. mark the directory as being written (``.recordkit-writing.json``, which
   readers refuse without ``partial=True``), remove temp files and the shards
   of unfinished partitions, write ``plan.json``;
4. run the unfinished partitions; each publishes its shards, then its
   done-marker (a partition without a marker is redone from scratch, producing
   the same names and bytes);
5. merge the markers into ``recordkit.json`` (written atomically, last), then
   remove the in-progress mark and the state directory.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..codec.schema import Schema
from ..errors import DatasetExistsError, ManifestError, SchemaError
from ..format.complete import Incomplete, find_incomplete, mark_finished, mark_started
from ..format.manifest import MANIFEST_NAME, Manifest, ShardInfo
from ..storage import Location, is_remote, is_temp_name, open_target, strip_file_scheme
from ._errors import ConvertError, PartitionsFailedError, add_note
from .partition import STATE_DIR, PartitionResult, PartitionTask
from .plan import ConvertOptions, Plan, make_plan
from .progress import NullProgress, Progress

__all__ = ["ConvertResult", "convert", "incomplete_at", "plan_conversion"]

log = logging.getLogger("recordkit.convert")

_PLAN_NAME = "plan.json"
_ENGINES = ("local", "dask")


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What a conversion did.

    Attributes:
        dst: the dataset written.
        manifest: its manifest.
        partitions: partitions in the plan.
        resumed: partitions a previous run had already published (skipped).
        items: source items converted in all.
        size: source bytes converted in all.
        seconds: wall time of this run.
    """

    dst: str
    manifest: Manifest
    partitions: int
    resumed: int
    items: int
    size: int
    seconds: float

    @property
    def records(self) -> int:
        """Records in the dataset."""
        return self.manifest.records

    def summary(self) -> str:
        """One line for humans."""
        from .._units import format_size

        rate = self.size / self.seconds if self.seconds > 0 else 0.0
        resumed = f", {self.resumed} resumed" if self.resumed else ""
        return (
            f"converted {self.items} items ({format_size(self.size)}) into {self.records} "
            f"records in {len(self.manifest.shards)} shards ({format_size(self.manifest.bytes)}) "
            f"at {self.dst}: {self.partitions} partitions{resumed}, {self.seconds:.1f} s, "
            f"{format_size(int(rate))}/s"
        )


def plan_conversion(
    src: str | os.PathLike[str],
    *,
    format: str,
    schema: Schema | None = None,
    options: ConvertOptions | None = None,
    storage_options: dict[str, Any] | None = None,
    source_options: Mapping[str, Any] | None = None,
) -> tuple[Any, Plan]:
    """List the source and plan the conversion; write nothing. Returns ``(source, plan)``."""
    import converters

    cls = converters.get(format)
    source = cls(
        os.fspath(src),
        storage_options=storage_options,
        schema=schema,
        **dict(source_options or {}),
    )
    policy = (options or ConvertOptions()).retry_policy
    items = policy.call(source.list_items, what=f"listing {src}")
    resolved = source.resolve_schema(items)
    if not isinstance(resolved, Schema):
        raise SchemaError(f"{format}: resolve_schema returned {resolved!r}, not a Schema")
    metadata = source.metadata(items)
    return source, make_plan(format, items, resolved, metadata, options or ConvertOptions())


def _read(loc: Location, name: str) -> bytes | None:
    try:
        return loc.read_bytes(name)
    except FileNotFoundError:
        return None


class _Destination:
    """The dataset directory and its state directory, as the parent process sees them."""

    def __init__(self, dst: str, storage_options: dict[str, Any]) -> None:
        self.url = dst
        self.storage_options = storage_options
        self.target = open_target(dst, storage_options)
        self.loc = Location(dst, storage_options)
        self.state_url = f"{dst.rstrip('/')}/{STATE_DIR}"
        self.state_loc = Location(self.state_url, storage_options)

    @staticmethod
    def _listdir(target: Any) -> list[str]:
        fs = getattr(target, "fs", None)
        if fs is not None:  # other processes wrote here: drop fsspec's listing cache
            fs.invalidate_cache()
        return list(target.listdir())

    def names(self) -> list[str]:
        """Names directly in the dataset directory (temp files included)."""
        return self._listdir(self.target)

    def state_names(self) -> list[str]:
        """Names in the state directory."""
        state = open_target(self.state_url, self.storage_options)
        try:
            return self._listdir(state)
        finally:
            state.close()

    def remove_state(self) -> None:
        state = open_target(self.state_url, self.storage_options)
        for name in self.state_names():
            state.remove(name)
        state.close()
        if not is_remote(self.url):
            try:
                os.rmdir(strip_file_scheme(self.state_url))
            except OSError:
                log.debug("could not remove %s", self.state_url, exc_info=True)

    def close(self) -> None:
        self.target.close()


def _mark(dest: _Destination, plan: Plan) -> None:
    """Mark ``dest`` as a conversion in progress, with what counts its progress."""
    suffix = plan.marker_name(0)[len(plan.shard_prefix(0)) :]  # ".done.json"
    mark_started(
        dest.target,
        "convert",
        partitions=len(plan.partitions),
        state_dir=STATE_DIR,
        done_suffix=suffix,
    )


def incomplete_at(
    dst: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> Incomplete | None:
    """How far an unfinished conversion (or Writer) at ``dst`` got; ``None`` if none is there."""
    dst = os.fspath(dst)
    if not is_remote(dst):
        return find_incomplete(strip_file_scheme(dst))
    loc = Location(dst, storage_options)

    def listdir(rel: str) -> list[str]:
        target = open_target(loc.join(rel) if rel else dst, storage_options)
        try:
            return _Destination._listdir(target)
        finally:
            target.close()

    return find_incomplete(dst, read=lambda rel: _read(loc, rel), listdir=listdir)


def _prepare(dest: _Destination, plan: Plan, resume: bool | None, overwrite: bool) -> str:
    """Decide what to do with what is at ``dest``: ``"done"``, ``"resume"`` or ``"fresh"``."""
    prefix = f"{plan.options.prefix}-"
    names = dest.names()
    ours = [n for n in names if n == MANIFEST_NAME or n.startswith(prefix)]
    state_plan = _read(dest.state_loc, _PLAN_NAME) if _PLAN_NAME in dest.state_names() else None
    if overwrite:
        _mark(dest, plan)  # before the old manifest goes: never a moment unmarked
        for name in sorted(ours, key=lambda n: n != MANIFEST_NAME):
            dest.target.remove(name)
        dest.remove_state()
        return "fresh"
    if MANIFEST_NAME in names:
        data = _read(dest.loc, MANIFEST_NAME) or b""
        try:
            manifest = Manifest.loads(data, path=dest.loc.join(MANIFEST_NAME))
            same = manifest.metadata.get("convert", {}).get("plan") == plan.fingerprint
        except (ManifestError, AttributeError):
            same = False
        if same and resume is not False:
            return "done"
        raise DatasetExistsError(
            f"{dest.url} already holds a dataset"
            + ("" if same else " from a different source or options")
            + "; pass overwrite=True (--overwrite) to replace it"
        )
    if state_plan is not None:
        try:
            previous = json.loads(state_plan).get("fingerprint")
        except (ValueError, AttributeError):
            previous = None
        if previous != plan.fingerprint:
            raise DatasetExistsError(
                f"{dest.url} holds a partial conversion with a different plan (other source "
                "files, schema or options); pass overwrite=True (--overwrite) to start over"
            )
        if resume is False:
            raise DatasetExistsError(
                f"{dest.url} holds a partial conversion; resume it (the default) or pass "
                "overwrite=True (--overwrite) to start over"
            )
        return "resume"
    if [n for n in ours if not is_temp_name(n)]:
        raise DatasetExistsError(
            f"{dest.url} already holds shards named {prefix}*; pass overwrite=True to replace them"
        )
    return "fresh"


def _published(dest: _Destination, plan: Plan) -> dict[int, PartitionResult]:
    """Done-markers from an earlier run of this plan (bad or foreign ones are dropped)."""
    found: dict[int, PartitionResult] = {}
    names = set(dest.state_names())
    for part in plan.partitions:
        name = plan.marker_name(part.index)
        if name not in names:
            continue
        data = _read(dest.state_loc, name)
        result: PartitionResult | None
        try:
            fingerprint, result = PartitionResult.from_marker(data or b"")
        except ValueError:
            fingerprint, result = "", None
        if fingerprint == plan.fingerprint and result is not None and result.index == part.index:
            found[part.index] = result
        else:
            log.warning("ignoring a bad done-marker %s; redoing that partition", name)
    return found


def _clean(dest: _Destination, plan: Plan, done: Mapping[int, PartitionResult]) -> None:
    """Remove temp files, and the shards of partitions that did not finish."""
    keep = {s.path for r in done.values() for s in r.shards}
    keep |= {p + ".idx" for p in keep}
    prefix = f"{plan.options.prefix}-"
    for name in dest.names():
        if is_temp_name(name) or (name.startswith(prefix) and name not in keep):
            dest.target.remove(name)
    state = open_target(dest.state_url, dest.storage_options)
    try:
        for name in dest.state_names():
            if is_temp_name(name):
                state.remove(name)
    finally:
        state.close()


def _tasks(plan: Plan, source: Any, dst: str, so: dict[str, Any], todo: list[int]) -> list[Any]:
    opts = plan.options
    return [
        PartitionTask(
            index=i,
            items=plan.partitions[i].items,
            source=source,
            schema=plan.schema.to_json(),
            dst=dst,
            storage_options=so,
            shard_prefix=plan.shard_prefix(i),
            marker=plan.marker_name(i),
            fingerprint=plan.fingerprint,
            shard_size=opts.shard_bytes,
            max_records=opts.max_records,
            fsync=opts.fsync,
            retry=opts.retry_policy,
        )
        for i in todo
    ]


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str,
    schema: Schema | None = None,
    workers: int | None = None,
    shard_size: int | str = "256MiB",
    compress: str | None = None,
    engine: str = "local",
    scheduler: str | None = None,
    resume: bool | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    dst_storage_options: dict[str, Any] | None = None,
    source_options: Mapping[str, Any] | None = None,
    options: ConvertOptions | None = None,
    progress: Progress | None = None,
    inactivity_timeout: float | None = 900.0,
) -> ConvertResult:
    """Convert a dataset in another format into a recordkit dataset.

    ``recordkit.convert("imgs/", "s3://bucket/train", format="imagefolder")``.
    The source is listed and cut into deterministic partitions; writer
    subprocesses (``spawn``) each read their own partitions' samples and
    publish shards ``part-PPPPP-KKKKK.tfrecord`` atomically; the manifest is
    written last. A rerun after a crash resumes (see ``resume``) and ends
    byte-identical to an uninterrupted run.

    Args:
        src: the source: a local path or fsspec URL (``s3://``, ``gs://``,
            ``http(s)://``, ``memory://``, ``file://``).
        dst: the dataset directory: a local path or fsspec URL.
        format: the converter (``converters.available()``): ``imagefolder``,
            ``jsonl``, ``csv``, ``numpy``, ``parquet``, ``webdataset``, ``tfrecord``.
        schema: the schema to write; ``None`` infers one from the source.
        workers: writer processes (local engine) or LocalCluster workers (Dask);
            default ``os.cpu_count()``; ``0`` runs everything in this process (as
            does any ``memory://`` URL, which other processes cannot see).
        shard_size: roll-over size of shards (``"256MiB"``).
        compress: ``"zstd"`` compresses every ``Tensor`` feature (per value).
        engine: ``"local"`` (a process pool) or ``"dask"``.
        scheduler: the Dask scheduler address; ``None`` starts a LocalCluster.
        resume: ``None`` resumes a partial run of the same plan found at ``dst``;
            ``True`` says so explicitly; ``False`` refuses to touch one.
        overwrite: replace whatever dataset or partial run is at ``dst``.
        storage_options: fsspec options for ``src`` (and ``dst`` unless
            ``dst_storage_options`` is given). Environment variables such as
            ``AWS_ENDPOINT_URL`` work as usual.
        dst_storage_options: fsspec options for ``dst``.
        source_options: converter options (see each converter's docstring).
        options: all output options at once (:class:`ConvertOptions`); then
            ``shard_size`` and ``compress`` must be left at their defaults.
        progress: a :class:`~recordkit.convert.Progress` (default: none).
        inactivity_timeout: stop the writer processes and fail when none
            reports progress for this long (seconds; ``None``: wait forever).

    Raises:
        SourceNotFoundError: ``src`` does not exist or holds nothing to convert.
        SchemaError: a bad schema, or data that does not fit it.
        DatasetExistsError: ``dst`` holds another dataset and not ``overwrite``.
        PartitionsFailedError: partitions failed (an ``ExceptionGroup``; a note
            on each names the partition and its items). The rest are published
            and a rerun resumes.
        DiskFullError: no space left where shards are written.
    """
    t0 = time.monotonic()
    if engine not in _ENGINES:
        raise ValueError(f"engine must be one of {_ENGINES}, got {engine!r}")
    if options is None:
        options = ConvertOptions(shard_size=shard_size, compress=compress)
    elif shard_size != "256MiB" or compress is not None:
        raise ValueError("pass shard_size and compress inside options=, not both ways")
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    in_memory = [u for u in (os.fspath(src), os.fspath(dst)) if u.startswith("memory://")]
    if in_memory and engine == "dask":
        raise ValueError(f"{in_memory[0]} lives in this process; Dask workers cannot see it")
    if in_memory and workers:
        log.info("%s lives in this process: converting in it (workers=0)", in_memory[0])
        workers = 0
    storage_options = dict(storage_options or {})
    dso = dict(storage_options if dst_storage_options is None else dst_storage_options)
    dst = os.fspath(dst)
    progress = progress or NullProgress()

    source, plan = plan_conversion(
        src,
        format=format,
        schema=schema,
        options=options,
        storage_options=storage_options,
        source_options=source_options,
    )
    log.info(
        "plan %s: %d items, %d partitions, schema %s",
        plan.fingerprint[:12],
        plan.items,
        len(plan.partitions),
        plan.schema,
    )
    dest = _Destination(dst, dso)
    try:
        state = _prepare(dest, plan, resume, overwrite)
        if state == "done":
            mark_finished(dest.target)  # a run killed between manifest and unmarking
            dest.remove_state()
            _clean(dest, plan, _published_from_manifest(dest, plan))
            manifest = Manifest.loads(dest.loc.read_bytes(MANIFEST_NAME))
            log.info("%s is already complete (same plan); nothing to do", dst)
            return ConvertResult(
                dst,
                manifest,
                len(plan.partitions),
                len(plan.partitions),
                plan.items,
                plan.size,
                time.monotonic() - t0,
            )
        _mark(dest, plan)  # before the first shard is touched
        done = _published(dest, plan) if state == "resume" else {}
        _clean(dest, plan, done)
        if state == "fresh":
            doc = {"fingerprint": plan.fingerprint, "format": plan.format}
            state_target = open_target(dest.state_url, dso)
            try:
                state_target.write_bytes(_PLAN_NAME, (json.dumps(doc) + "\n").encode())
            finally:
                state_target.close()
        todo = [p.index for p in plan.partitions if p.index not in done]
        if done:
            log.info(
                "resuming: %d of %d partitions already published", len(done), len(plan.partitions)
            )
        results = dict(done)
        failures: list[BaseException] = []
        progress.start(
            plan.items,
            plan.size,
            sum(r.items for r in done.values()),
            sum(r.size for r in done.values()),
        )
        try:
            tasks = _tasks(plan, source, dst, dso, todo)
            if not tasks:
                outcomes: Any = iter(())
            elif engine == "dask":
                from .engines import run_dask

                outcomes = run_dask(
                    tasks, progress.update, scheduler=scheduler, workers=max(1, workers)
                )
            elif workers == 0:
                from .engines import run_inline

                outcomes = run_inline(tasks, progress.update)
            else:
                from .engines import run_local

                outcomes = run_local(
                    tasks,
                    progress.update,
                    workers=min(workers, len(tasks)),
                    inactivity_timeout=inactivity_timeout,
                )
            seen: set[int] = set()
            for task, outcome in outcomes:
                if isinstance(outcome, BaseException):
                    if id(outcome) in seen or isinstance(outcome, BrokenProcessPool):
                        # One exception object for many futures (a dead pool): one per partition.
                        cause = outcome
                        outcome = ConvertError(
                            f"partition {task.index}: a writer process died ({cause}); "
                            "out of memory, or killed?"
                        )
                        outcome.__cause__ = cause
                    seen.add(id(outcome))
                    add_note(
                        outcome,
                        f"partition {task.index} ({task.shard_prefix}-*), source items: "
                        f"{plan.partitions[task.index].describe()}",
                    )
                    failures.append(outcome)
                else:
                    results[task.index] = outcome
        finally:
            progress.close()
        if failures:
            failures.sort(key=_partition_of)
            raise PartitionsFailedError(
                f"{len(failures)} of {len(plan.partitions)} partitions failed converting "
                f"{src} to {dst}; {len(results)} are published and a rerun resumes after them",
                failures,
            )
        manifest = Manifest(
            schema=plan.schema.to_json(),
            shards=tuple(s for i in sorted(results) for s in results[i].shards),
            metadata=dict(plan.metadata),
            created_by=f"recordkit {__version__}",
        )
        dest.target.write_bytes(MANIFEST_NAME, manifest.dumps())
        mark_finished(dest.target)  # after the manifest: never a moment unmarked
        dest.remove_state()
        return ConvertResult(
            dst,
            manifest,
            len(plan.partitions),
            len(done),
            plan.items,
            plan.size,
            time.monotonic() - t0,
        )
    finally:
        dest.close()


def _partition_of(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    return next((n for n in notes if n.startswith("partition ")), "")


def _published_from_manifest(dest: _Destination, plan: Plan) -> dict[int, PartitionResult]:
    """The complete dataset's shards, as if each partition had a marker (for cleaning)."""
    manifest = Manifest.loads(dest.loc.read_bytes(MANIFEST_NAME))
    shards: tuple[ShardInfo, ...] = manifest.shards
    return {0: PartitionResult(0, shards, 0, 0)}
