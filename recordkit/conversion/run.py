"""``recordkit.conversion``: plan, skip what a previous run published, run the rest, merge.

:func:`convert` is four named stages, each safe to interrupt (``kill -9`` included):

1. **plan** (:func:`plan_conversion`): list the source and cut it into
   deterministic partitions (nothing written yet);
2. **resume check** (:func:`~recordkit.conversion.destination.prepare`): done,
   resume or fresh, from what is at the destination (see
   :mod:`~recordkit.conversion.destination`). Then the directory is marked as being
   written, what an interrupted run left half-done is removed, and ``plan.json``
   is written;
3. **run partitions** on an engine (:mod:`~recordkit.conversion.engines`: inline,
   local writer processes, Dask, Ray); each publishes its shards, then its
   done-marker (a partition without a marker is redone from scratch, producing
   the same names and bytes);
4. **publish the manifest**: the markers merged into ``recordkit.json``
   (written atomically, last), then the in-progress mark and the state
   directory removed.

Stages 2-4 are :func:`run_plan`, which :func:`recordkit.write` shares.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._keywords import accepts_options, given, refuse
from .._procs import check_not_loading_main
from .._version import __version__
from ..codec.schema import Schema
from ..codec.sequence import SequenceSchema
from ..errors import ConvertError, PartitionsFailedError, SchemaError, SourceError, add_note
from ..format.complete import mark_finished
from ..format.manifest import MANIFEST_NAME, PAYLOAD_KINDS, Manifest
from ..storage import source_url
from ..writer.lease import Lease
from .destination import (
    Destination,
    clean,
    incomplete_at,
    mark,
    prepare,
    published,
    published_from_manifest,
    write_plan,
)
from .engines import Engine, make_engine
from .identity import KEPT_LISTING, listing
from .partition import PartitionResult, PartitionTask
from .plan import ConvertOptions, Plan, make_plan
from .progress import NullProgress, Progress

__all__ = ["ConvertResult", "convert", "incomplete_at", "plan_conversion", "run_plan"]

log = logging.getLogger("recordkit.conversion")


@dataclass(frozen=True, slots=True)
class ConvertResult:
    """What a conversion did.

    Attributes:
        dst: the dataset written.
        manifest: its manifest.
        partitions: partitions in the plan.
        resumed: partitions a previous run had already published (skipped).
        items: source items (or inputs) converted in all.
        size: source bytes converted in all (0 when unknown: inputs).
        seconds: wall time of this run.
        unit: what the items are, in the summary (``"items"``, ``"inputs"``).
        skipped: source rows left out on purpose (a tabular converter's
            ``nulls="skip"``), in all partitions; also in the manifest's
            ``metadata["convert"]["skipped"]``.
    """

    dst: str
    manifest: Manifest
    partitions: int
    resumed: int
    items: int
    size: int
    seconds: float
    unit: str = "items"
    skipped: int = 0

    @property
    def records(self) -> int:
        """Records in the dataset."""
        return self.manifest.records

    def summary(self) -> str:
        """One line for humans (sizes in binary units, as every command's summary)."""
        from .._units import format_rate, format_size, plural

        resumed = f", {self.resumed} resumed" if self.resumed else ""
        unit = self.unit[:-1] if self.unit.endswith("s") else self.unit
        skipped = f" ({plural(self.skipped, 'source row')} skipped)" if self.skipped else ""
        shards = (
            f"{plural(len(self.manifest.shards), 'shard')} ({format_size(self.manifest.bytes)})"
        )
        took = f"{plural(self.partitions, 'partition')}{resumed}, {self.seconds:.1f} s"
        if not self.size:  # sizes unknown (a function's inputs): records per second
            per_s = self.records / self.seconds if self.seconds > 0 else 0.0
            return (
                f"wrote {plural(self.records, 'record')}{skipped} from {plural(self.items, unit)} "
                f"into {shards} at {self.dst}: {took}, {per_s:.0f} records/s"
            )
        rate = self.size / self.seconds if self.seconds > 0 else 0.0
        kind = " (tf.train.SequenceExample)" if self.manifest.sequence_example else ""
        return (
            f"converted {plural(self.items, unit)} ({format_size(self.size)}) into "
            f"{plural(self.records, 'record')}{kind}{skipped} in {shards} at {self.dst}: "
            f"{took}, {format_rate(rate)}"
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
    """List the source and plan the conversion; write nothing. Returns ``(source, plan)``.

    A source may say what its records are with ``payload_kind() -> (kind, why)``
    (after ``resolve_schema``): ``"example"`` (the default for sources without
    it) or ``"sequence_example"``, with a phrase saying how that was decided,
    which is logged. See ``recordkit.conversion.partition`` for what a
    SequenceExample source implements.
    """
    from . import sources

    cls = sources.get(format)
    source = cls(
        os.fspath(src),
        storage_options=storage_options,
        schema=schema,
        **dict(source_options or {}),
    )
    policy = (options or ConvertOptions()).retry_policy  # the one retry policy
    items = policy.call(source.list_items, what=f"listing {src}")
    resolved = source.resolve_schema(items)
    if not isinstance(resolved, Schema):
        raise SchemaError(f"{format}: resolve_schema returned {resolved!r}, not a Schema")
    metadata = source.metadata(items)
    payload = "example"
    kind = getattr(source, "payload_kind", None)
    if callable(kind):
        payload, why = kind()
        if payload not in PAYLOAD_KINDS:
            raise SchemaError(f"{format}: payload_kind returned {payload!r}, not {PAYLOAD_KINDS}")
        if payload != "example":
            log.info("the records are tf.train.SequenceExamples (%s): copied whole", why)
    plan = make_plan(
        format,
        items,
        resolved,
        metadata,
        options or ConvertOptions(),
        payload,
        source=source_url(src),
        version=getattr(source, "item_version", None),
        files=getattr(source, "versions", None),
    )
    return source, plan


def _tasks(plan: Plan, source: Any, dest: Destination, todo: list[int]) -> list[PartitionTask]:
    opts = plan.options
    return [
        PartitionTask(
            index=i,
            items=plan.partitions[i].items,
            source=source,
            schema=plan.schema.to_json(),
            dst=dest.url,
            storage_options=dest.storage_options,
            shard_prefix=plan.shard_prefix(i),
            marker=plan.marker_name(i),
            fingerprint=plan.partition_key(i),
            shard_size=opts.shard_bytes,
            max_records=opts.max_records,
            fsync=opts.fsync,
            retry=opts.retry_policy,
            payload=plan.payload,
        )
        for i in todo
    ]


@accepts_options
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
    break_lock: bool = False,
) -> ConvertResult:
    """Convert a dataset in another format into a recordkit dataset.

    ``recordkit.convert("imgs/", "s3://bucket/train", format="imagefolder")``.
    The source is listed and cut into deterministic partitions; writer
    subprocesses (fresh interpreters) each read their own partitions' samples and
    publish shards ``part-PPPPP-KKKKK.tfrecord`` atomically; the manifest is
    written last. A rerun after a crash resumes (see ``resume``) and ends
    byte-identical to an uninterrupted run.

    Args:
        src: the source: a local path or fsspec URL (``s3://``, ``gs://``,
            ``http(s)://``, ``memory://``, ``file://``).
        dst: the dataset directory: a local path or fsspec URL.
        format: the converter's name (``recordkit.converters.available()`` lists them).
        schema: the schema to write; ``None`` infers one from the source.
        workers: writer processes (local engine), LocalCluster workers (Dask) or
            the CPUs of a local Ray started for the run; default ``os.cpu_count()``;
            ``0`` runs everything in this process (as does any ``memory://`` URL,
            which other processes cannot see).
        shard_size: roll-over size of shards (``"256MiB"``).
        compress: ``"zstd"`` compresses every ``Tensor`` feature (per value).
        engine: ``"local"`` (writer processes on this machine), ``"dask"`` or ``"ray"``.
        scheduler: the cluster's address: a Dask scheduler's (``tcp://host:8786``;
            ``None`` starts a LocalCluster) or a Ray cluster's (``ray://head:10001``,
            ``auto``; ``None`` runs on the Ray this process is connected to, else
            at ``RAY_ADDRESS``, else on a local Ray started for the run).
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
        progress: a :class:`~recordkit.conversion.Progress` (default: none).
        inactivity_timeout: stop the writer processes and fail when none
            reports progress for this long (seconds; ``None``: wait forever).
        break_lock: take over a remote ``dst``'s lease whose holder this host
            cannot see (one writer per destination: ``docs/howto/concurrency.md``).

    Raises:
        DestinationBusyError: another writer (a conversion, a ``Writer``) holds ``dst``.
        SourceNotFoundError: ``src`` does not exist or holds nothing to convert.
        SchemaError: a bad schema, or data that does not fit it.
        DatasetExistsError: ``dst`` holds another dataset and not ``overwrite``.
        PartitionsFailedError: partitions failed (an ``ExceptionGroup``; a note
            on each names the partition and its items). The rest are published
            and a rerun resumes.
        DiskFullError: no space left where shards are written.
    """
    t0 = time.monotonic()
    check_not_loading_main("a conversion")
    if options is None:
        options = ConvertOptions(shard_size=shard_size, compress=compress)
    else:  # each setting one way: shard_size= and compress= are options' fields
        both = [k for k in ("shard_size", "compress") if k in given()]
        refuse(both, "options", "ConvertOptions", both)
    runner = make_engine(
        engine,
        workers=workers,
        scheduler=scheduler,
        inactivity_timeout=inactivity_timeout,
        urls=(os.fspath(src), os.fspath(dst)),
    )
    storage_options = dict(storage_options or {})
    dso = dict(storage_options if dst_storage_options is None else dst_storage_options)
    source, plan = plan_conversion(
        src,
        format=format,
        schema=schema,
        options=options,
        storage_options=storage_options,
        source_options=source_options,
    )
    return run_plan(
        source,
        plan,
        dst,
        storage_options=dso,
        engine=runner,
        resume=resume,
        overwrite=overwrite,
        progress=progress,
        what=f"converting {os.fspath(src)}",
        started=t0,
        break_lock=break_lock,
    )


def run_plan(
    source: Any,
    plan: Plan,
    dst: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    engine: Engine,
    resume: bool | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    writer: str = "convert",
    what: str = "converting",
    started: float | None = None,
    break_lock: bool = False,
) -> ConvertResult:
    """Stages 2-4 of a conversion (see the module doc) for a plan already made,
    holding the destination's lease (:mod:`recordkit.writer.lease`) throughout.

    Args:
        source: the source the plan was made from (pickled into each task).
        storage_options, resume, overwrite, progress, break_lock: as :func:`convert`
            takes them (``storage_options`` for ``dst``).
        writer: the in-progress marker's kind (``"convert"`` or ``"write"``).
        what: how errors name the run (``"converting imgs/"``).
        started: ``time.monotonic()`` when the run began (for the result's seconds).

    Raises:
        DestinationBusyError: another writer holds ``dst``.
    """
    t0 = time.monotonic() if started is None else started
    unit = str(getattr(source, "item_plural", "items"))
    log.info(
        "plan %s: %d items, %d partitions, schema %s",
        plan.fingerprint[:12],
        plan.items,
        len(plan.partitions),
        plan.schema,
    )
    lease = Lease(
        dst, storage_options, what=f"recordkit {writer} (plan {plan.fingerprint[:12]})",
        break_lock=break_lock,
    )  # fmt: skip
    with lease:  # one writer per destination: before anything there is looked at
        dest = Destination(os.fspath(dst), dict(storage_options or {}))
        try:
            state = prepare(dest, plan, resume, overwrite, writer)
            if state == "done":
                mark_finished(dest.target)  # a run killed between manifest and unmarking
                dest.remove_state()
                clean(dest, plan, published_from_manifest(dest, plan))
                manifest = Manifest.loads(dest.loc.read_bytes(MANIFEST_NAME))
                log.info("%s is already complete (same plan); nothing to do", dest.url)
                resumed = len(plan.partitions)
                skipped = int(manifest.metadata.get("convert", {}).get("skipped", 0))
            else:
                done = _begin(dest, plan, state, writer)
                results = _run_partitions(
                    plan, source, dest, engine, done, progress or NullProgress(), what
                )
                manifest = _publish(dest, plan, results)
                resumed, skipped = len(done), sum(r.skipped for r in results.values())
            n, seconds = len(plan.partitions), time.monotonic() - t0
            return ConvertResult(
                dest.url, manifest, n, resumed, plan.items, plan.size, seconds, unit, skipped
            )
        finally:
            dest.close()


def _begin(dest: Destination, plan: Plan, state: str, writer: str) -> dict[int, PartitionResult]:
    """Mark the destination, take stock of a previous run, clean up after it; the
    partitions it published."""
    mark(dest, plan, writer)  # before the first shard is touched
    done = published(dest, plan) if state == "resume" else {}
    clean(dest, plan, done)
    write_plan(dest, plan)  # what this run reads (a resumed run's source may have changed)
    if done:
        log.info("resuming: %d of %d partitions already published", len(done), len(plan.partitions))
    return done


def _run_partitions(
    plan: Plan,
    source: Any,
    dest: Destination,
    engine: Engine,
    done: dict[int, PartitionResult],
    progress: Progress,
    what: str,
) -> dict[int, PartitionResult]:
    """Run the partitions not ``done`` on ``engine``; every partition's result, or
    :class:`PartitionsFailedError` with each failure noted."""
    todo = [p.index for p in plan.partitions if p.index not in done]
    label = getattr(source, "item_label", "source item")
    results = dict(done)
    failures: list[BaseException] = []
    progress.start(
        plan.items,
        plan.size,
        sum(r.items for r in done.values()),
        sum(r.size for r in done.values()),
    )
    try:
        tasks = _tasks(plan, source, dest, todo)
        outcomes = engine.run(tasks, progress.update) if tasks else iter(())
        try:
            for task, outcome in outcomes:
                if isinstance(outcome, BaseException):
                    add_note(
                        outcome,
                        f"partition {task.index} ({task.shard_prefix}-*), {label}s: "
                        f"{plan.partitions[task.index].describe()}",
                    )
                    failures.append(outcome)
                else:
                    results[task.index] = outcome
        finally:
            close = getattr(outcomes, "close", None)
            if close is not None:  # an engine's generator: stop its processes now
                close()
    finally:
        progress.close()
    if failures:
        failures.sort(key=_partition_of)
        data = all(isinstance(e, (SourceError, SchemaError)) for e in failures)
        after = (
            "a rerun fails the same way until the data is fixed: fix the source and rerun "
            "(it resumes after them), or give a schema that fits (each error says which) "
            "with --overwrite"
            if data
            else "a rerun resumes after them"
        )
        raise PartitionsFailedError(
            f"{len(failures)} of {len(plan.partitions)} partitions failed {what} to "
            f"{dest.url}; {len(results)} are published, and {after}",
            failures,
        )
    return results


def _publish(dest: Destination, plan: Plan, results: dict[int, PartitionResult]) -> Manifest:
    """The last stage: the manifest (atomically), then the marks of a run in progress go."""
    skipped = sum(r.skipped for r in results.values())
    metadata = dict(plan.metadata)
    if skipped:  # the dataset holds fewer rows than the source, on purpose: say so
        metadata["convert"] = {**metadata.get("convert", {}), "skipped": skipped}
    manifest = Manifest(
        schema=_manifest_schema(plan, results),
        shards=tuple(s for i in sorted(results) for s in results[i].shards),
        metadata=metadata,
        created_by=f"recordkit {__version__}",
        payload=plan.payload,
    )
    # What a task's attempt left when its worker died and Dask or Ray ran it again.
    clean(dest, plan, results)
    dest.target.write_bytes(KEPT_LISTING, listing(plan))  # what it was made from
    dest.target.write_bytes(MANIFEST_NAME, manifest.dumps())
    mark_finished(dest.target)  # after the manifest: never a moment unmarked
    dest.remove_state()
    return manifest


def _manifest_schema(plan: Plan, results: Mapping[int, PartitionResult]) -> dict[str, Any]:
    """The plan's schema, or for SequenceExamples the one every partition's records make."""
    if plan.payload == "example":
        return plan.schema.to_json()
    found = []
    for i in sorted(results):
        schema = results[i].schema
        if schema is None:  # a marker of this plan always has one: never guess
            raise ConvertError(
                f"partition {i}'s done-marker lists no schema of its SequenceExamples; "
                "convert again with overwrite=True (--overwrite)"
            )
        found.append(SequenceSchema.from_json(schema))
    return SequenceSchema.merged(found).to_json()


def _partition_of(exc: BaseException) -> str:
    notes = getattr(exc, "__notes__", [])
    return next((n for n in notes if n.startswith("partition ")), "")
