"""Where a conversion writes, and what a rerun finds there (the resume check).

A conversion's destination holds, besides its shards, a state directory
(``.recordkit-convert/``) with ``plan.json`` (the plan's fingerprint) and one
done-marker per published partition, and the in-progress marker
(``.recordkit-writing.json``) from before the first shard until after the
manifest. :func:`prepare` decides from what is there whether the run is done,
resumes or starts fresh; :func:`published` reads the done-markers back;
:func:`clean` removes what an interrupted run left half-done.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..errors import DatasetExistsError, ManifestError
from ..format.complete import Incomplete, find_incomplete, mark_started
from ..format.manifest import MANIFEST_NAME, Manifest, ShardInfo
from ..storage import Location, is_remote, is_temp_name, open_target, strip_file_scheme
from .identity import KEPT_LISTING, STATE_LISTING, difference, listing, load_listing
from .partition import STATE_DIR, PartitionResult
from .plan import Plan

__all__ = [
    "PLAN_NAME",
    "Destination",
    "clean",
    "incomplete_at",
    "mark",
    "prepare",
    "published",
    "published_from_manifest",
    "write_plan",
]

log = logging.getLogger("recordkit.conversion")

PLAN_NAME = "plan.json"


def _read(loc: Location, name: str) -> bytes | None:
    try:
        return loc.read_bytes(name)
    except FileNotFoundError:
        return None


class Destination:
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

    def state(self) -> contextlib.closing[Any]:
        """The state directory as a target, closed when the ``with`` block ends."""
        return contextlib.closing(open_target(self.state_url, self.storage_options))

    def state_names(self) -> list[str]:
        """Names in the state directory."""
        with self.state() as state:
            return self._listdir(state)

    def remove_state(self) -> None:
        with self.state() as state:
            for name in self.state_names():
                state.remove(name)
        if not is_remote(self.url):
            try:
                os.rmdir(strip_file_scheme(self.state_url))
            except OSError:
                log.debug("could not remove %s", self.state_url, exc_info=True)

    def close(self) -> None:
        self.target.close()


def mark(dest: Destination, plan: Plan, writer: str = "convert") -> None:
    """Mark ``dest`` as a conversion (``writer``) in progress, with what counts its progress."""
    suffix = plan.marker_name(0)[len(plan.shard_prefix(0)) :]  # ".done.json"
    mark_started(
        dest.target,
        writer,
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
        with contextlib.closing(open_target(loc.join(rel) if rel else dst, storage_options)) as t:
            return Destination._listdir(t)

    return find_incomplete(dst, read=lambda rel: _read(loc, rel), listdir=listdir)


def prepare(
    dest: Destination, plan: Plan, resume: bool | None, overwrite: bool, writer: str = "convert"
) -> str:
    """Decide what to do with what is at ``dest``: ``"done"`` (a manifest of the same
    plan), ``"resume"`` (a state directory, ``plan.json``, of the same plan) or
    ``"fresh"``; anything else of ours there is a ``DatasetExistsError`` unless ``overwrite``.
    """
    prefix = f"{plan.options.prefix}-"
    names = dest.names()
    ours = [n for n in names if n == MANIFEST_NAME or n.startswith(prefix)]
    state_plan = _read(dest.state_loc, PLAN_NAME) if PLAN_NAME in dest.state_names() else None
    if overwrite:
        mark(dest, plan, writer)  # before the old manifest goes: never a moment unmarked
        for name in sorted(ours, key=lambda n: n != MANIFEST_NAME):
            dest.target.remove(name)
        if KEPT_LISTING in names:
            dest.target.remove(KEPT_LISTING)
        dest.remove_state()
        return "fresh"
    if MANIFEST_NAME in names:
        data = _read(dest.loc, MANIFEST_NAME) or b""
        try:
            manifest = Manifest.loads(data, path=dest.loc.join(MANIFEST_NAME))
            convert = manifest.metadata.get("convert", {})
            same = convert.get("plan") == plan.fingerprint
            made = convert.get("plan") is not None
        except (ManifestError, AttributeError):
            same = made = False
        if same and resume is not False:
            return "done"
        if same or not made:
            why = ""
        else:  # a conversion of another source (or with other options): say which
            kept = _read(dest.loc, KEPT_LISTING) if KEPT_LISTING in names else None
            why = f" from a different source or options: {difference(load_listing(kept), plan)}"
        raise DatasetExistsError(
            f"{dest.url} already holds a dataset{why}; pass overwrite=True (--overwrite) "
            "to replace it"
        )
    if state_plan is not None:
        try:
            doc = json.loads(state_plan)
            previous, frame = doc.get("fingerprint"), doc.get("frame")
        except (ValueError, AttributeError):
            previous = frame = None
        state_listing = _read(dest.state_loc, STATE_LISTING)
        if previous != plan.fingerprint and frame == plan.frame and frame:
            # The same source, schema and options; some items differ now: the published
            # partitions whose items are unchanged are kept (published() checks each),
            # the others written again from what the source holds now.
            log.warning(
                "%s: the source changed since the partial conversion there began (%s): "
                "its partitions of changed items are written again",
                dest.url,
                difference(load_listing(state_listing), plan),
            )
        elif previous != plan.fingerprint:
            raise DatasetExistsError(
                f"{dest.url} holds a partial conversion with a different plan (other source "
                f"files, schema or options): {difference(load_listing(state_listing), plan)}; "
                "resuming it would mix the two: pass overwrite=True (--overwrite) to start over"
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


def published(dest: Destination, plan: Plan) -> dict[int, PartitionResult]:
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
        if result is not None and result.index == part.index:
            if fingerprint == plan.partition_key(part.index):
                found[part.index] = result
            else:
                log.info("partition %d's items changed since it was written: redo", part.index)
        else:
            log.warning("ignoring a bad done-marker %s; redoing that partition", name)
    return found


def clean(dest: Destination, plan: Plan, done: Mapping[int, PartitionResult]) -> None:
    """Remove temp files, and the shards of partitions that did not finish."""
    keep = {s.path for r in done.values() for s in r.shards}
    keep |= {p + ".idx" for p in keep}
    prefix = f"{plan.options.prefix}-"
    for name in dest.names():
        if is_temp_name(name) or (name.startswith(prefix) and name not in keep):
            dest.target.remove(name)
    with dest.state() as state:
        for name in dest.state_names():
            if is_temp_name(name):
                state.remove(name)


def write_plan(dest: Destination, plan: Plan) -> None:
    """The state directory says what this run reads: the plan (``plan.json``) and,
    first, its listing (a ``plan.json`` is never without what it was made from)."""
    doc = {
        "fingerprint": plan.fingerprint,
        "frame": plan.frame,
        "format": plan.format,
        "source": plan.source,
    }
    with dest.state() as state:
        state.write_bytes(STATE_LISTING, listing(plan))
        state.write_bytes(PLAN_NAME, (json.dumps(doc) + "\n").encode())


def published_from_manifest(dest: Destination, plan: Plan) -> dict[int, PartitionResult]:
    """The complete dataset's shards, as if each partition had a marker (for cleaning)."""
    manifest = Manifest.loads(dest.loc.read_bytes(MANIFEST_NAME))
    shards: tuple[ShardInfo, ...] = manifest.shards
    return {0: PartitionResult(0, shards, 0, 0)}
