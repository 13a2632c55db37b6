"""``recordkit.write``: a conversion whose source is a function (:class:`FunctionSource`):
each input is an item, ``fn(input)`` returns or yields its samples, and the partitions
run exactly as ``recordkit convert``'s do (see :func:`write`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import numbers
import os
import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._keywords import accepts_options, given, refuse
from .._procs import can_load_main, check_not_loading_main
from ..codec.schema import Schema
from ..errors import SchemaError
from .engines import LocalEngine, make_engine
from .plan import ConvertOptions, make_plan
from .progress import Progress
from .run import ConvertResult, run_plan

__all__ = ["FunctionSource", "Input", "write"]

# With ``inputs_per_partition=None`` the inputs are cut into about this many
# partitions: enough to keep 64 writers busy and balanced, few enough that a small
# dataset does not come out as hundreds of tiny shards (each partition writes at
# least one). It depends on the inputs only, so the output never depends on workers.
_PARTITIONS = 64
# ... and no partition holds more inputs than this (a killed run loses little).
_MOST_INPUTS = 65536
_KEY_CHARS = 120
_RESERVED = ("convert", "write")


@dataclass(frozen=True, slots=True)
class Input:
    """One input of :func:`write`, as a conversion item.

    Attributes:
        key: the input, readable (in error notes): the string itself, else JSON.
        size: 0 (unknown; progress counts inputs instead of bytes).
        ref: ``(the input as JSON,)``: what the plan's fingerprint covers.
        value: the input as given: what the function receives.
    """

    key: str
    size: int
    ref: tuple[Any, ...]
    value: Any


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON (paths as strings), or a ``TypeError`` naming ``where``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise TypeError(f"{where} is {number}; inputs must be finite numbers")
        return number
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    raise TypeError(
        f"{where} is a {type(value).__name__}; inputs must be JSON values (str, int, "
        "float, bool, None, lists and str-keyed dicts of them) or paths, so that the "
        "plan can record them and a rerun recognise them"
    )


def inputs_as_items(inputs: Iterable[Any]) -> list[Input]:
    """The inputs as conversion items, in order (each checked: see :func:`_plain`)."""
    items = []
    for n, value in enumerate(inputs):
        plain = _plain(value, f"input {n}")
        key = plain if isinstance(plain, str) else json.dumps(plain, sort_keys=True)
        if len(key) > _KEY_CHARS:
            key = key[: _KEY_CHARS - 3] + "..."
        items.append(Input(key, 0, (plain,), value))
    return items


# -- the function ---------------------------------------------------------------------------


def _unwrap(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _name(fn: Any) -> str:
    target = _unwrap(fn)
    kind = target if hasattr(target, "__qualname__") else type(target)
    return f"{getattr(kind, '__module__', '?')}:{getattr(kind, '__qualname__', repr(kind))}"


def import_function(spec: str) -> Callable[[Any], Any]:
    """The function ``"package.module:function"`` names (``ValueError``/``ImportError``)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r}: expected module:function (e.g. mypackage.samples:make)")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImportError(f"{spec!r}: module {module!r} has no {attr!r}") from None
    if not callable(target):
        raise TypeError(f"{spec!r} is a {type(target).__name__}, not a function")
    return target  # type: ignore[no-any-return]


def _check_callable(fn: Any) -> None:
    """Refuse what a writer process could never import, whichever the engine (so a call
    that works with ``workers=0`` works with any)."""
    if not callable(fn):
        raise TypeError(f"fn must be a function or 'module:function', got {type(fn).__name__}")
    target = _unwrap(fn)
    qualname = str(getattr(target, "__qualname__", type(target).__qualname__))
    fix = (
        "writer processes import the function by name: define it with `def` at the top "
        "level of a module (or of your script), or pass 'module:function'"
    )
    if "<lambda>" in qualname:
        raise TypeError(f"fn is a lambda ({_name(fn)}); {fix}")
    if "<locals>" in qualname:
        outer = qualname.split(".<locals>")[0]
        raise TypeError(f"fn {qualname.rsplit('.', 1)[-1]!r} is defined inside {outer}(); {fix}")


class FunctionSource:
    """A function as a conversion source: one item per input, ``fn(input)``'s samples
    as its records. Pickled into writer processes (the function by name).

    Args:
        fn: a function (or other picklable callable) taking one input and returning
            a sample (a mapping), ``None``, or an iterable of samples; or
            ``"module:function"``.
    """

    name = "write"
    #: what an item is called in error notes and summaries.
    item_label = "input"
    item_plural = "inputs"

    def __init__(self, fn: Callable[[Any], Any] | str) -> None:
        if isinstance(fn, str):
            import_function(fn)  # fails now, here, if it cannot be imported
            self.function = fn
            self.fn: Callable[[Any], Any] | None = None
        else:
            _check_callable(fn)
            self.function = _name(fn)
            self.fn = fn
        self._resolved: Callable[[Any], Any] | None = self.fn

    def __repr__(self) -> str:
        return f"FunctionSource({self.function!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"function": self.function, "fn": self.fn}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.function, self.fn = state["function"], state["fn"]
        self._resolved = self.fn

    def check_importable(self) -> None:
        """Raise ``TypeError`` if writer processes on this machine cannot get the function."""
        if self.fn is None:
            return
        try:
            pickle.dumps(self.fn)
        except Exception as exc:
            raise TypeError(
                f"writer processes cannot import {self.function} ({exc}); define it at the "
                "top level of an importable module or of your script, or pass workers=0"
            ) from exc
        target = _unwrap(self.fn)
        module = getattr(target, "__module__", None) or type(target).__module__
        if module == "__main__" and not can_load_main():
            raise TypeError(
                f"{self.function} is defined in an interactive session (or `python -c`/`-m`), "
                "whose __main__ writer processes cannot import: move it into a module, or "
                "pass workers=0"
            )

    def _function(self) -> Callable[[Any], Any]:
        if self._resolved is None:
            self._resolved = import_function(self.function)
        return self._resolved

    def records(self, item: Any, schema: Schema) -> Iterator[bytes]:
        """Call the function on ``item``'s input (an ``Input``); encode each sample
        it gives."""
        produced = self._function()(item.value)
        if produced is None:
            return
        if isinstance(produced, Mapping):
            produced = (produced,)
        elif isinstance(produced, (str, bytes, bytearray)) or not isinstance(produced, Iterable):
            raise SchemaError(
                f"{self.function} returned a {type(produced).__name__}; it must return a "
                "sample (a mapping of feature name to value), None, or samples (yield them)"
            )
        for row, sample in enumerate(produced):
            if not isinstance(sample, Mapping):
                raise SchemaError(
                    f"sample {row}: {self.function} gave a {type(sample).__name__}, not a "
                    "mapping of feature name to value"
                )
            try:
                yield schema.encode(sample)
            except SchemaError as exc:
                raise SchemaError(f"sample {row}: {exc}") from exc


# -- the front door -------------------------------------------------------------------------


def _options(
    options: ConvertOptions | None,
    shard_size: int | str,
    compress: str | None,
    inputs: int,
    per_partition: int | None,
) -> ConvertOptions:
    if options is None:
        options = ConvertOptions(shard_size=shard_size, compress=compress)
    elif both := [k for k in ("shard_size", "compress") if k in given()]:
        refuse(both, "options", "ConvertOptions", both)  # each setting one way
    elif options.partition_bytes is not None:
        raise ValueError("options.partition_bytes: inputs have no size; use inputs_per_partition")
    elif options.partition_items != ConvertOptions().partition_items:
        raise ValueError("give inputs_per_partition=, not options.partition_items")
    if per_partition is None:
        per_partition = min(_MOST_INPUTS, max(1, math.ceil(inputs / _PARTITIONS)))
    elif per_partition <= 0:
        raise ValueError(f"inputs_per_partition must be positive, got {per_partition}")
    return dataclasses.replace(options, partition_items=per_partition)


@accepts_options
def write(
    fn: Callable[[Any], Any] | str,
    inputs: Iterable[Any],
    out: str | os.PathLike[str],
    *,
    schema: Schema,
    workers: int | None = None,
    shard_size: int | str = "256MiB",
    compress: str | None = None,
    inputs_per_partition: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    engine: str = "local",
    scheduler: str | None = None,
    resume: bool | None = None,
    overwrite: bool = False,
    break_lock: bool = False,
    storage_options: dict[str, Any] | None = None,
    options: ConvertOptions | None = None,
    progress: Progress | None = None,
    inactivity_timeout: float | None = 900.0,
) -> ConvertResult:
    """Write the samples ``fn`` makes from each input into one dataset, in parallel.

    ``rk.write(make_samples, urls, "data/train", schema=schema, workers=8)``: writer
    processes call ``fn(input)`` for every input and write the samples it returns
    or yields into shards ``part-PPPPP-KKKKK.tfrecord`` of one dataset with one
    manifest. The inputs are cut into partitions (``inputs_per_partition`` each,
    in order), the unit of parallel work and of resume: the shard names and bytes
    depend on the inputs, the schema and the options, never on ``workers`` or the
    engine. A rerun with the same arguments after a crash or ``kill -9``
    publishes only what is missing and ends byte-identical; while unfinished the
    directory is refused by readers (``partial=True`` reads what is there).

    What ``fn`` may be: a function defined with ``def`` at the top level of an
    importable module or of the script you run (put the call under
    ``if __name__ == "__main__":``: writer processes load the script, without
    running that block, to find the function), a ``functools.partial`` of one,
    an instance of a top-level class with ``__call__``, or the string
    ``"package.module:function"``. Lambdas and functions defined inside other
    functions are refused (``TypeError``), whatever the engine; so is a function
    from an interactive session, unless ``workers=0``, ``engine="dask"`` or
    ``engine="ray"`` (they ship it by value). Each call may return a
    sample (a mapping of feature name to value), ``None``, or an iterable of
    samples (a generator: ``yield`` them).

    Args:
        fn: the function, or ``"module:function"``.
        inputs: what ``fn`` is called on, in order: JSON values (str, int, float,
            bool, None, lists and str-keyed dicts of them) or paths. The plan
            records them, so a rerun recognises its own partial output.
        out: the dataset directory: a local path or fsspec URL.
        schema: the :class:`~recordkit.Schema` every sample must fit.
        workers, shard_size, compress: as :func:`~recordkit.conversion.convert` takes
            them; ``workers=0`` calls ``fn`` in this process.
        inputs_per_partition: inputs per partition; ``None`` cuts the inputs into
            about 64 partitions (at most 65,536 inputs each). Each partition writes
            at least one shard, and a killed run redoes the partitions it had not
            published.
        metadata: JSON-ready metadata for the manifest (``"write"`` and
            ``"convert"`` are taken: they record the function and the plan).
        storage_options: fsspec options for ``out``.
        engine, scheduler, resume, overwrite, break_lock, options, inactivity_timeout:
            as :func:`~recordkit.conversion.convert` takes them (``out`` is its ``dst``).
        progress: a :class:`~recordkit.conversion.Progress`; it counts inputs.

    Returns:
        A :class:`~recordkit.conversion.ConvertResult` (``.manifest``, ``.records``,
        ``.summary()``).

    Raises:
        TypeError: ``fn`` cannot be called in a writer process (see above), or an
            input is not a JSON value or a path.
        DatasetExistsError: ``out`` holds another dataset (or a partial run of
            other inputs) and not ``overwrite``.
        ~recordkit.errors.PartitionsFailedError: partitions failed (an ``ExceptionGroup`` of what
            ``fn`` raised, each with notes naming the input and the partition).
            The rest are published and a rerun resumes after them.
        ~recordkit.errors.ConvertError: the writer processes stopped making progress.
    """
    t0 = time.monotonic()
    check_not_loading_main("recordkit.write")
    if not isinstance(schema, Schema):
        raise SchemaError(f"schema must be a recordkit.Schema, got {type(schema).__name__}")
    source = FunctionSource(fn)
    items = inputs_as_items(inputs)
    if not items:
        raise ValueError("inputs is empty: nothing to write")
    options = _options(options, shard_size, compress, len(items), inputs_per_partition)
    extra = dict(metadata or {})
    taken = sorted(set(extra) & set(_RESERVED))
    if taken:
        raise ValueError(f"metadata keys {taken} are recordkit's own; name yours otherwise")
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-ready: {exc}") from exc
    out = os.fspath(out)
    runner = make_engine(
        engine,
        workers=workers,
        scheduler=scheduler,
        inactivity_timeout=inactivity_timeout,
        urls=(out,),
    )
    if isinstance(runner, LocalEngine):
        source.check_importable()
    plan = make_plan(
        "write", items, schema, {**extra, "write": {"function": source.function}}, options
    )
    return run_plan(
        source,
        plan,
        out,
        storage_options=storage_options,
        engine=runner,
        resume=resume,
        overwrite=overwrite,
        progress=progress,
        writer="write",
        break_lock=break_lock,
        what=f"writing the samples of {source.function}",
        started=t0,
    )
