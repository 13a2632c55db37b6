"""The ``recordkit`` command line.

Only the standard library is imported at module level, so ``recordkit --help``
is instant and works from a minimal install; each subcommand imports what it
needs inside its handler. Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from .args import Parser, add_progress_options, count, positive, progress_mode

_OPTIONAL_PACKAGES = (
    "numpy",
    "crc32c",
    "zstandard",
    "fsspec",
    "torch",
    "tensorflow",
    "tensorflow-cpu",
    "s3fs",
    "gcsfs",
    "dask",
    "distributed",
    "ray",
    "tqdm",
)

_PARTIAL_HELP = (
    "read a folder where a Writer or a conversion did not finish (its published shards) "
    "instead of refusing it"
)


def _meter(args: argparse.Namespace, desc: str) -> Any:
    """The progress display of a command: bar, log lines, plain line, or none (``-q``)."""
    from .._progress import Meter

    return Meter(desc, mode=progress_mode(args), interval=args.log_interval)


def _cmd_index(args: argparse.Namespace) -> int:
    from .. import build_index
    from .._units import format_size, plural

    meter = _meter(args, "index")
    written = build_index(args.paths, verify=not args.no_verify, progress=meter)
    for w in written:
        print(w)
    done = meter.counts()
    print(
        f"wrote {plural(len(written), 'index file')} for {plural(done['records'], 'record')} "
        f"({format_size(done['bytes'])} of shards)",
        file=sys.stderr,
    )
    return 0


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in _OPTIONAL_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _cmd_info(args: argparse.Namespace) -> int:
    import json

    from .. import Dataset, __version__
    from .._units import format_size

    with Dataset(args.dataset, partial=args.partial) as ds:
        schema = ds.schema
        sequences = ds.sequence_schema  # a dataset of SequenceExamples has this instead
        shown = sequences if schema is None else schema
        assert shown is not None  # only raw reading has neither
        shards = ds.shards
        total_bytes = sum(s.bytes for s in shards)
        if args.json:
            doc: dict[str, Any] = {
                "root": ds.root,
                "complete": ds.manifest is not None,
                "records": len(ds),
                "bytes": total_bytes,
                "shards": [
                    {"path": s.path, "records": s.records, "bytes": s.bytes} for s in shards
                ],
                "payload": ds.manifest.payload if ds.manifest else "example",
                "schema": shown.to_json(),
                "metadata": ds.metadata,
                "versions": {"recordkit": __version__, **_versions()},
            }
            print(json.dumps(doc, indent=1))
            return 0
        kind = "recordkit dataset" if ds.manifest is not None else "TFRecords without manifest"
        if ds.manifest is None and args.partial:
            kind = "read with --partial: no manifest"
        print(f"{ds.root}  ({kind})")
        print(f"  records  {len(ds)}")
        print(f"  bytes    {total_bytes} ({format_size(total_bytes)})")
        print(f"  shards   {len(shards)}")
        for s in shards[: args.max_shards]:
            print(f"    {s.path}  {s.records} records  {format_size(s.bytes)}")
        if len(shards) > args.max_shards:
            print(f"    ... {len(shards) - args.max_shards} more")
        if sequences is not None:
            print("  schema   tf.train.SequenceExample (records read whole)")
            for line in sequences.describe():
                print(f"    {line}")
        else:
            assert schema is not None
            print("  schema")
            for name, ftype in schema.features.items():
                print(f"    {name}: {ftype!r}")
        if ds.metadata:
            print(f"  metadata {json.dumps(ds.metadata)[:200]}")
    print("versions")
    print(f"  recordkit {__version__}")
    for name, version in _versions().items():
        print(f"  {name} {version}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .. import DecodeLimits, verify
    from .._units import parse_size

    most = args.max_decode_bytes
    limits = DecodeLimits(record_bytes=None if most is None else parse_size(most))
    report = verify(
        args.dataset,
        decode=not args.no_decode,
        partial=args.partial,
        limits=limits,
        progress=_meter(args, "verify"),
    )
    for problem in report.problems:
        print(problem)
    for note in [] if args.quiet else report.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"verified {report.summary()}", file=sys.stderr)
    return 0 if report.ok else 1


def _show(value: Any, width: int) -> str:
    import numpy as np

    if isinstance(value, bytes):
        shown = repr(value[:width])
        return f"bytes[{len(value)}] {shown}{'...' if len(value) > width else ''}"
    if isinstance(value, list):
        return (
            "["
            + ", ".join(_show(v, width) for v in value[:8])
            + (", ...]" if len(value) > 8 else "]")
        )
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return repr(value.item())
        body = np.array2string(value.ravel()[:16], separator=", ", threshold=16)
        return f"{value.dtype}{list(value.shape)} {body}{' ...' if value.size > 16 else ''}"
    return repr(value)


def _cmd_head(args: argparse.Namespace) -> int:
    from itertools import islice

    from .. import Dataset

    with Dataset(
        args.dataset, partial=args.partial, raw=args.raw, sequence_example=args.sequence_example
    ) as ds:
        for i, sample in enumerate(islice(ds, args.n)):
            print(f"[{i}]")
            if ds.sequence_example:  # one line per feature: context/..., feature_lists/...
                sample = {f"{part}/{k}": v for part in sample for k, v in sample[part].items()}
            for name, value in sample.items():
                print(f"  {name}: {_show(value, args.width)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to generate the CLI reference)."""
    from .._version import __version__

    parser = Parser(
        prog="recordkit",
        description="Indexed, TFRecord-compatible datasets for PyTorch and TensorFlow.",
    )
    parser.add_argument("--version", action="version", version=f"recordkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "index",
        help="write DALI/tfrecord-compatible .idx files",
        description="Scan TFRecord files and write a '{offset} {framed_size}' index beside "
        "each (FILE.idx), as NVIDIA DALI's tfrecord2idx and the tfrecord package expect.",
    )
    p.add_argument(
        "paths", nargs="+", metavar="FILE|DIR", help="shard files or dataset directories"
    )
    p.add_argument(
        "--no-verify", action="store_true", help="skip payload CRCs (headers are always checked)"
    )
    add_progress_options(p)
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser(
        "info",
        help="summarise a dataset",
        description="Show shards, records, bytes, schema and library versions.",
    )
    p.add_argument("dataset", help="dataset directory, folder of .tfrecord files, or one file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--max-shards", type=count, default=10, help="shards to list (default 10)")
    p.add_argument("--partial", action="store_true", help=_PARTIAL_HELP)
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "verify",
        help="check every CRC, index entry and the manifest",
        description="Check a dataset completely. Prints FILE:OFFSET:RECORD: PROBLEM for each "
        "problem and exits 1 if there is any.",
    )
    p.add_argument("dataset", help="dataset directory, folder of .tfrecord files, or one file")
    p.add_argument(
        "--no-decode", action="store_true", help="check framing and CRCs only, not payloads"
    )
    p.add_argument("--partial", action="store_true", help=_PARTIAL_HELP)
    p.add_argument(
        "--max-decode-bytes",
        metavar="SIZE",
        help="the bytes one record's zstd values may decompress to, e.g. 1GiB (default: "
        "from the schema, 256 MiB more with a variable-shape zstd tensor); a record over "
        "it is a problem, found before allocating",
    )
    add_progress_options(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser(
        "head",
        help="print the first decoded samples",
        description="Decode and print the first N samples.",
    )
    p.add_argument("dataset", help="dataset directory, folder of .tfrecord files, or one file")
    p.add_argument("-n", type=count, default=5, help="number of samples (default 5)")
    p.add_argument("--width", type=positive, default=32, help="bytes shown per value (default 32)")
    p.add_argument("--partial", action="store_true", help=_PARTIAL_HELP)
    p.add_argument(
        "--raw",
        action="store_true",
        help="each record's features as it holds them, no schema (records that differ)",
    )
    p.add_argument(
        "--sequence-example",
        action="store_true",
        help="the records are tf.train.SequenceExamples: show context and feature lists",
    )
    p.set_defaults(func=_cmd_head)

    from .convert import add_parser as add_convert  # stdlib-only module

    add_convert(sub)

    from .write import add_parser as add_write  # stdlib-only module

    add_write(sub)

    from .cache import add_parser as add_cache

    add_cache(sub)
    for depth, each in _walk(parser):
        _add_verbosity(each, depth)
    return parser


def _walk(parser: argparse.ArgumentParser) -> list[tuple[int, argparse.ArgumentParser]]:
    """The parser and every subcommand's, each with its depth (``cache fill``: 2)."""
    found = [(0, parser)]
    for depth, each in found:
        for action in each._actions:  # argparse has no public way to list subcommands
            if isinstance(action, argparse._SubParsersAction):
                found += [(depth + 1, sub) for sub in action.choices.values()]
    return found


def _add_verbosity(parser: argparse.ArgumentParser, depth: int) -> None:
    """``-v``/``-q`` on every level, so they work before or after the subcommand.

    Each level counts into its own attribute (a subcommand's namespace overwrites
    its parent's values of the same name); :func:`main` adds them up.
    """
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        dest=f"verbose_{depth}",
        default=argparse.SUPPRESS,
        help="more output: INFO log lines (what each step did; -vv: DEBUG) and the "
        "traceback of an error",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="count",
        dest=f"quiet_{depth}",
        default=argparse.SUPPRESS,
        help="no progress display and no notes: errors, warnings and the final summary only",
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


def verbosity(args: argparse.Namespace) -> tuple[int, int]:
    """``(verbose, quiet)``: the ``-v`` and ``-q`` given at every level of the command."""
    flags = vars(args)
    verbose = sum(v for k, v in flags.items() if k.startswith("verbose_"))
    return verbose, sum(v for k, v in flags.items() if k.startswith("quiet_"))


@contextlib.contextmanager
def _bars_and_logs() -> Iterator[None]:
    """On a terminal with tqdm, log records are written above a progress bar, not through it."""
    if not sys.stderr.isatty():
        yield
        return
    try:
        from tqdm.contrib.logging import logging_redirect_tqdm
    except ImportError:
        yield
        return
    with logging_redirect_tqdm():
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status.

    0: done; 1: done, and it found problems (``verify``) or partitions failed
    (``convert``); 2: a usage mistake or an error, said in one line on stderr
    (``-v`` adds the traceback); 130: interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose, args.quiet = verbosity(args)
    if args.verbose and args.quiet:
        parser.error("-v and -q contradict each other: give one")
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not args.quiet:  # progress lines (not on a terminal) are what the default shows
        logging.getLogger("recordkit.progress").setLevel(min(level, logging.INFO))
    from ..errors import RecordkitError

    command = " ".join(
        part for part in (args.command, getattr(args, "cache_command", None)) if part
    )
    try:
        with _bars_and_logs():
            return int(args.func(args))
    except BrokenPipeError:  # `recordkit head ... | head` closes the pipe early
        return 0
    except (RecordkitError, ValueError, OSError) as exc:
        # A bad path, value or option, or data that cannot be read: a sentence,
        # not a traceback (with -v, the traceback too, for a bug report).
        if args.verbose:
            traceback.print_exc()
        print(f"recordkit {command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"recordkit {command}: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


if __name__ == "__main__":
    sys.exit(main())
