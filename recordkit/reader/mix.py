"""Several datasets read as one: concatenation, record ranges, and weighted mixing.

A list of datasets is opened as one :class:`~recordkit.reader.shards.ShardSet`
(:func:`open_sources`): the sources' shards one after the other, in the order
given, under their common parent directory. The epoch plan, its split over
ranks and DataLoader workers, and resuming work on it unchanged: a list is a
**concatenation**, every record of every dataset once per epoch, the shuffle
mixing across all of them.

What an epoch is made of otherwise travels in :class:`Mix`, a field of
:class:`~recordkit.reader.plan.PlanOptions`:

- **record ranges** (``records=``): each source's selected ``[lo, hi)``; the plan
  sees only those records, before it shuffles (the same records every epoch).
- **weights** (``weights=``, ``epoch_records=``), as ``docs/howto/mixing.md`` says:
  an epoch of ``L`` records of which source ``s`` gives ``n_s`` (largest remainder).
  A source of ``N_s`` records gives ``q = n_s // N_s`` whole passes, each a fresh
  permutation keyed by the seed, the epoch and the pass, and ``r = n_s % N_s`` more
  from a *rotation*: a keyed permutation of the source read round and round across
  epochs, epoch ``e`` taking its positions ``e*r .. e*r + r - 1`` (mod ``N_s``).

Where the sources' records go in the epoch: position ``P`` (before the shuffle)
belongs to a source by a smooth apportionment, so any stretch of positions holds
each source's share to within a record per source: ``F_0(P) = floor(P n_0 / L)``
records of source 0 among the first ``P``, and each later source takes its share
of what the earlier ones left (``F_s(P) = floor(R_s(P) n_s / M_s)`` with ``R_s``
the positions left and ``M_s = n_s + .. + n_last``). Each ``F_s`` grows by 0 or 1
per position and ends at ``n_s``, so the ``k``-th record of source ``s`` is at the
position where ``F_s`` reaches ``k + 1``. With ``shuffle`` the positions are
permuted within blocks of :data:`MIX_BLOCK` (a keyed permutation per block), so
every block keeps its proportions and a batch mixes the sources. Everything is
computed per position, O(sources) each: no per-record table, at any size.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from ..codec.schema import Schema
from ..errors import SchemaError
from ..format.manifest import ShardInfo
from .order import Permutation, mix64
from .plan_options import Mix, PlanOptions
from .select import parse_records
from .shards import ShardSet, open_shards

__all__ = [
    "MIX_BLOCK",
    "CombinedShards",
    "Mix",  # documented here (docs/reference/lowlevel.md)
    "Mixer",
    "SourcePlan",
    "check_schemas",
    "make_mix",
    "open_sources",
    "refuse_cache",
    "sources",
]


class SourcePlan(Protocol):
    """One pass over one source, as :class:`Mixer` reads it (an ``EpochPlan``)."""

    def order(self, g: np.ndarray) -> np.ndarray: ...


#: positions whose order the shuffle permutes together (each keeps its proportions)
MIX_BLOCK = 4096
_PLANS_KEPT = 16


def sources(path_or_paths: Any) -> tuple[list[str], str]:
    """``(paths, label)`` of ``RecordDataset``'s / ``recordkit.tf.dataset``'s first argument.

    Raises:
        TypeError: not a path or a list (tuple) of paths.
        ValueError: an empty list.
    """
    if isinstance(path_or_paths, (str, os.PathLike)):
        path = os.fspath(path_or_paths)
        return [path], path
    if not isinstance(path_or_paths, (list, tuple)):
        raise TypeError(
            f"expected a dataset path or a list of them, got {type(path_or_paths).__name__}"
        )
    paths = []
    for p in path_or_paths:
        if not isinstance(p, (str, os.PathLike)):
            raise TypeError(f"a list of datasets holds paths, got {p!r}")
        paths.append(os.fspath(p))
    if not paths:
        raise ValueError("an empty list of datasets")
    return paths, paths[0] if len(paths) == 1 else "[" + ", ".join(paths) + "]"


# -- several datasets as one shard set ------------------------------------------------------


class CombinedShards(ShardSet):
    """The shards of several datasets, one after the other (see :func:`open_sources`).

    Attributes:
        bounds: source ``s`` is shards ``bounds[s] .. bounds[s + 1] - 1``.
        names: each source's path, for messages.
    """

    def __init__(self, parts: Sequence[ShardSet], names: Sequence[str], schema: Schema) -> None:
        roots = [os.path.abspath(p.root) for p in parts]
        root = os.path.commonpath(roots)
        infos: list[ShardInfo] = []
        listed: list[bool] = []
        bounds = [0]
        for part, proot in zip(parts, roots):
            for info in part.infos:
                rel = os.path.relpath(os.path.join(proot, info.path), root)
                infos.append(ShardInfo(rel.replace(os.sep, "/"), info.records, info.bytes))
                listed.append(part.manifest is not None)
            bounds.append(len(infos))
        self.bounds = tuple(bounds)
        self.names = tuple(names)
        self._listed_flags = listed
        super().__init__(root, None, infos, schema)
        for part, lo in zip(parts, bounds):  # each dataset's generation, at its shards
            self.pins += [
                dataclasses.replace(p, first=p.first + lo, stop=p.stop + lo) for p in part.pins
            ]

    def _listed(self, i: int) -> bool:
        return self._listed_flags[i]


def _differs(a: Schema, b: Schema, names: Sequence[str] | None) -> tuple[str, str, str] | None:
    """The first feature (of ``names``, else of either) that ``a`` and ``b`` disagree on."""
    for name in names if names is not None else [*a.names, *(n for n in b.names if n not in a)]:
        ta = repr(a[name]) if name in a else "absent"
        tb = repr(b[name]) if name in b else "absent"
        if ta != tb:
            return name, ta, tb
    return None


def check_schemas(
    parts: Sequence[ShardSet], names: Sequence[str], columns: Sequence[str] | None
) -> None:
    """Every source's schema agrees with the first one's on the features read.

    Raises:
        SchemaError: naming the feature, both datasets and both types.
    """
    first = parts[0].schema
    for part, name in zip(parts[1:], names[1:]):
        diff = _differs(first, part.schema, columns)
        if diff is not None:
            feature, ta, tb = diff
            raise SchemaError(
                f"datasets read as one disagree on feature {feature!r}: {ta} in {names[0]}, "
                f"{tb} in {name}; read the same features of each (columns=) or give one "
                "schema= that fits both"
            )


def open_sources(
    paths: Sequence[str],
    schema: Schema | None = None,
    *,
    columns: Sequence[str] | None = None,
    partial: bool = False,
    split: str | None = None,
) -> ShardSet:
    """One dataset's shard set (``recordkit.reader.shards.open_shards``), or
    several datasets' as one :class:`CombinedShards`, their schemas checked.

    Each source is opened as it would be alone (a manifest's schema, or one
    inferred from a foreign folder's first records; ``schema`` overrides both).

    Raises:
        SchemaError: two sources disagree on a feature read (see :func:`check_schemas`).
        ValueError: ``split=``, a tensorflow-datasets folder, or SequenceExamples in a list.
    """
    if len(paths) == 1:
        return open_shards(paths[0], schema, partial=partial, split=split)
    if split is not None:
        raise ValueError(
            f"split={split!r} is for one tensorflow-datasets folder, not a list of datasets"
        )
    parts = [open_shards(p, schema, partial=partial) for p in paths]
    for part, path in zip(parts, paths):
        if part.view is not None:
            raise ValueError(
                f"{path} is a tensorflow-datasets folder: a list of datasets reads recordkit "
                "datasets and TFRecord folders; read it alone, or give schema= to read its "
                "records as stored"
            )
        if part.manifest is not None and part.manifest.sequence_example:
            raise ValueError(
                f"{path}: its records are SequenceExamples, which a list of datasets does "
                "not read yet; read it alone"
            )
    check_schemas(parts, paths, columns)
    combined = CombinedShards(parts, paths, schema or parts[0].schema)
    for part in parts:
        part.close()
    return combined


# -- what an epoch is made of ---------------------------------------------------------------


def _quotas(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` by largest remainder (exact)."""
    w = [Fraction(x) for x in weights]
    whole = sum(w)
    exact = [total * x / whole for x in w]
    out = [math.floor(q) for q in exact]
    left = total - sum(out)
    by_rest = sorted(range(len(w)), key=lambda s: (-(exact[s] - out[s]), s))
    for s in by_rest[:left]:
        out[s] += 1
    return out


def make_mix(
    shards: ShardSet,
    *,
    records: slice | str | Sequence[slice | str | None] | None = None,
    weights: Sequence[float] | None = None,
    epoch_records: int | None = None,
) -> Mix | None:
    """The :class:`Mix` of these options over ``shards`` (``None``: every record once).

    ``records`` is one range for one dataset; for a list of datasets, a list with
    one range (or ``None``) per dataset.

    Raises:
        ValueError: weights or ranges that do not fit the datasets (named).
    """
    bounds = getattr(shards, "bounds", (0, len(shards)))
    names = getattr(shards, "names", (shards.root,))
    n = len(bounds) - 1
    if n > 1 and records is not None and not isinstance(records, (list, tuple)):
        raise ValueError(
            f"records={records!r} with a list of {n} datasets: give one range per dataset "
            "(a list, None for all of one), e.g. records=['[:10%]', None]"
        )
    if isinstance(records, (list, tuple)):
        if len(records) != n:
            raise ValueError(f"records= holds {len(records)} ranges for {n} datasets")
        per = list(records)
    else:
        per = [records] * n  # one dataset's range, or None for every dataset
    totals = [int(shards.counts[bounds[s] : bounds[s + 1]].sum()) for s in range(n)]
    ranges = tuple(parse_records(r, t) for r, t in zip(per, totals))
    sizes = [hi - lo for lo, hi in ranges]
    if epoch_records is not None:
        if isinstance(epoch_records, bool) or not isinstance(epoch_records, int):
            raise TypeError(f"epoch_records must be an int, got {epoch_records!r}")
        if epoch_records < 1:
            raise ValueError(f"epoch_records must be >= 1, got {epoch_records}")
        if weights is None:
            weights = [float(x) for x in sizes]  # the sources' natural proportions
    if weights is not None:
        w = [float(x) for x in weights]
        if len(w) != n:
            raise ValueError(f"{len(w)} weights for {n} datasets")
        bad = [x for x in w if not (math.isfinite(x) and x >= 0)]
        if bad or not sum(w) > 0:
            raise ValueError(f"weights must be finite, >= 0 and not all 0, got {list(weights)}")
        for s, x in enumerate(w):
            if x > 0 and not sizes[s]:
                raise ValueError(f"{names[s]} has no records (selected) to give its weight {x}")
        total = epoch_records if epoch_records is not None else sum(sizes)
        if total < 1:
            raise ValueError("the datasets have no records (selected) to mix")
        return Mix(tuple(bounds), ranges, tuple(w), total)
    if all(r == (0, t) for r, t in zip(ranges, totals)):
        return None  # every record once: the plan needs nothing more
    return Mix(tuple(bounds), ranges)


# -- weighted epochs --------------------------------------------------------------------------


def _muldiv(a: np.ndarray, b: int, m: int) -> np.ndarray:
    """``a * b // m`` elementwise, exactly (``0 <= a, b <= m``)."""
    if m < (1 << 32):
        out: np.ndarray = (a.astype(np.uint64) * np.uint64(b) // np.uint64(m)).astype(np.int64)
        return out
    exact = [int(x) * b // m for x in a.tolist()]  # past 2**32 positions: Python's ints
    return np.asarray(exact, dtype=np.int64)


class Mixer:
    """The weighted order of one epoch (see the module docs): position -> record.

    Args:
        mix: the weighted :class:`Mix`.
        counts: records the plan reads per shard (after ranges).
        options: the plan's options (shuffle, seed, block_records, window_blocks).
        block: the plan's block of records (for the sources' own block shuffles).
        make_plan: ``(counts, options) -> EpochPlan`` of one pass over one source.
    """

    def __init__(
        self,
        mix: Mix,
        counts: np.ndarray,
        options: PlanOptions,
        epoch: int,
        block: int,
        make_plan: Callable[[np.ndarray, PlanOptions], SourcePlan],
    ) -> None:
        assert mix.weights is not None and mix.epoch_records is not None
        self.options = options
        self.epoch = epoch
        self.block = block
        self._make_plan = make_plan
        self._counts = [counts[a:b] for a, b in zip(mix.bounds, mix.bounds[1:])]
        self.sizes = [int(c.sum()) for c in self._counts]
        self.total = mix.epoch_records
        self.quotas = _quotas(self.total, mix.weights)
        self.starts = np.concatenate(([0], np.cumsum(self.sizes))).astype(np.int64)
        # M_s: what sources s.. take together
        self._rest = [sum(self.quotas[s:]) for s in range(len(self.quotas))]
        self._key = mix64(options.seed, epoch, 0x6D6978)
        self._plans: dict[tuple[int, ...], SourcePlan] = {}

    # position -> (source, k-th record of its share this epoch)
    def assign(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For pre-shuffle positions ``p``: each one's source and its index in that
        source's share of the epoch (``k`` in ``[0, n_s)``)."""
        src = np.full(len(p), len(self.quotas) - 1, dtype=np.int64)
        k = np.empty(len(p), dtype=np.int64)
        left = np.arange(len(p))
        rest = p.astype(np.int64)  # R_s(p) of the positions not yet assigned
        for s, (n, m) in enumerate(zip(self.quotas[:-1], self._rest[:-1])):
            if not len(left):
                break
            f = _muldiv(rest, n, m)
            mine = _muldiv(rest + 1, n, m) > f
            src[left[mine]] = s
            k[left[mine]] = f[mine]
            left, rest = left[~mine], (rest - f)[~mine]
        k[left] = rest  # the last source takes what the others left
        return src, k

    def _positions(self, g: np.ndarray) -> np.ndarray:
        """Epoch positions -> pre-shuffle positions (a keyed permutation per mix block)."""
        if not self.options.shuffle:
            return g
        out = np.empty_like(g)
        blocks = g // MIX_BLOCK
        for b in np.unique(blocks).tolist():
            at = blocks == b
            first = b * MIX_BLOCK
            size = min(MIX_BLOCK, self.total - first)
            out[at] = first + Permutation(size, mix64(self._key, 1, b))(g[at] - first)
        return out

    def _plan(self, s: int, key: tuple[int, ...]) -> SourcePlan:
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            options = self.options.part(mix64(self.options.seed, *key), self.block)
            plan = self._plans[key] = self._make_plan(self._counts[s], options)
        return plan

    def order(self, g: np.ndarray) -> np.ndarray:
        """The records (in the selected records' concatenation) at epoch positions ``g``."""
        src, k = self.assign(self._positions(np.asarray(g, dtype=np.int64)))
        out = np.empty_like(k)
        for s in np.unique(src).tolist():
            at = src == s
            out[at] = self.starts[s] + self._source_order(s, k[at])
        return out

    def _source_order(self, s: int, k: np.ndarray) -> np.ndarray:
        """The ``k``-th records of source ``s``'s share this epoch (its own numbers)."""
        size, n = self.sizes[s], self.quotas[s]
        passes, r = divmod(n, size)
        j = np.empty_like(k)
        in_pass = k < passes * size
        # whole passes: a fresh permutation each (keyed by epoch and pass)
        p, within = np.divmod(k[in_pass], size)
        j[in_pass] = within
        # the rest: the rotation, read on from where the last epoch stopped
        base = self.epoch * r
        j[~in_pass] = (base % size + (k[~in_pass] - passes * size)) % size
        if not self.options.shuffle:
            return j  # dataset order: passes from the start, the rotation read on
        out = np.empty_like(j)
        pass_ids = np.full(len(k), -1, dtype=np.int64)
        pass_ids[in_pass] = p
        for i in np.unique(pass_ids).tolist():
            at = pass_ids == i
            key = (s, 1, self.epoch, i) if i >= 0 else (s, 2, base // size)
            out[at] = self._plan(s, key).order(j[at])
        return out


def refuse_cache(
    label: str, paths: Sequence[str], records: Any, weights: Any, epoch_records: Any
) -> None:
    """A shard cache reads one remote dataset, every record: refuse what it cannot do.

    Raises:
        ValueError: a list of datasets, ``records=``, ``weights=`` or ``epoch_records=``.
    """
    given = [
        name
        for name, value in (
            ("a list of datasets", len(paths) > 1 or None),
            ("records=", records),
            ("weights=", weights),
            ("epoch_records=", epoch_records),
        )
        if value is not None
    ]
    if given:
        raise ValueError(
            f"{label}: {', '.join(given)} with a shard cache: a cache reads one remote dataset "
            "whole; fill local copies (recordkit cache fill) and mix those"
        )
