"""``recordkit convert``: the subcommand's parser and handler (``add_parser``, used by
``recordkit.cli``), and what ``recordkit write`` shares with it (:func:`add_run_options`,
:func:`run_keywords`, :func:`run`).

Only the standard library at module level (``recordkit --help`` stays instant);
the handler imports the conversion machinery when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..codec.schema_text import parse_schema
from ..conversion.engines import ENGINES
from .args import add_progress_options, count, key_values, positive, progress_mode

__all__ = ["add_converter_options", "add_parser", "add_run_options", "run", "run_keywords"]

_EXAMPLES = """\
examples:
  recordkit convert imgs/ data/train                # class folders of images: imagefolder
  recordkit convert imgs/ data/train --from imagefolder
  recordkit convert s3://bucket/rows/ data/rows --from jsonl --schema 'id:int64,text:bytes'
  recordkit convert arrays.npz s3://bucket/ds --from numpy --compress zstd --workers 8
  recordkit convert shards/ out/ --from webdataset --engine dask --scheduler tcp://h:8786
  recordkit convert s3://raw/rows/ s3://ds/rows --from parquet --engine ray --scheduler auto
  recordkit convert t.parquet data/t --from parquet -o drop=notes -o nulls=skip
  recordkit convert rows.csv data/rows --from csv -o columns=id,score -o 'fill={"score": 0}'

Tabular converters (parquet, csv, jsonl) take -o columns=a,b, -o drop=a,b,
-o 'fill={"col": VALUE}' and -o nulls=error|skip|fill (what a null in a column
without a fill value does: stop with an error, leave its row out, or become 0/empty).

A killed or failed conversion resumes when rerun with the same arguments.
"""


def _cmd_convert(args: argparse.Namespace) -> int:
    log = logging.getLogger("recordkit.conversion")
    if not args.quiet and log.getEffectiveLevel() > logging.INFO:
        with _said_plainly(log):
            return _convert(args)
    return _convert(args)


@contextlib.contextmanager
def _said_plainly(log: logging.Logger) -> Iterator[None]:
    """The plan and resumes are what ``convert`` is for: said as the command's own lines
    (as "--from jsonl, told from ..."), not as log records, while it runs."""
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter("recordkit convert: %(message)s"))
    level, propagate = log.level, log.propagate
    log.addHandler(said)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(said)
        log.setLevel(level)
        log.propagate = propagate


def _convert(args: argparse.Namespace) -> int:
    from ..conversion import convert
    from ..conversion.progress import choose_progress
    from .args import json_object

    progress = choose_progress(progress_mode(args), args.log_interval, "convert")
    storage_options = json_object("--storage-options", args.storage_options)
    dst_options = json_object("--dst-storage-options", args.dst_storage_options)
    fmt = args.from_
    if fmt is None:
        from ..conversion.infer import infer_format

        inferred = infer_format(args.src, storage_options)
        fmt = inferred.format
        if not args.quiet:
            print(f"recordkit convert: {inferred}", file=sys.stderr)
    return run(
        "convert",
        args.dst,
        dst_options or storage_options,
        lambda: convert(
            args.src,
            args.dst,
            format=fmt,
            schema=parse_schema(args.schema) if args.schema else None,
            storage_options=storage_options,
            dst_storage_options=dst_options,
            source_options=key_values(args.option)
            | ({"follow_symlinks": True} if args.follow_symlinks else {}),
            progress=progress,
            **run_keywords(args, partition_bytes=args.partition_size),
        ),
    )


def run_keywords(args: argparse.Namespace, **options: Any) -> dict[str, Any]:
    """The keywords of ``convert()`` and ``write()`` that :func:`add_run_options` gives
    (``options``: more fields of their ``ConvertOptions``)."""
    from ..conversion import ConvertOptions

    return {
        "workers": args.workers,
        "engine": args.engine,
        "scheduler": args.scheduler,
        "resume": True if args.resume else None,
        "overwrite": args.overwrite,
        "break_lock": args.break_lock,
        "options": ConvertOptions(
            shard_size=args.shard_size,
            max_records=args.max_records,
            compress=args.compress,
            fsync=not args.no_fsync,
            retries=args.retries,
            **options,
        ),
    }


def run(
    command: str, dst: str, storage_options: dict[str, Any] | None, job: Callable[[], Any]
) -> int:
    """Run ``job()`` (a conversion into ``dst``) for ``recordkit convert`` or ``write``;
    its exit status: 0 done (the summary on stderr), 1 partitions failed (each failure
    and its notes), 130 Ctrl-C (how far it got, and that a rerun resumes)."""
    from ..conversion.destination import incomplete_at
    from ..errors import PartitionsFailedError

    try:
        result = job()
    except KeyboardInterrupt:
        try:
            found = incomplete_at(dst, storage_options)
        except Exception:  # the summary must not turn into a traceback
            found = None
        if found is None:
            said = f"interrupted; nothing at {dst} is left half-written"
        else:
            said = f"interrupted: {found.progress} at {dst}; rerun the same command to resume"
        print(f"recordkit {command}: {said}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
    except PartitionsFailedError as group:
        print(f"recordkit {command}: error: {group.message}", file=sys.stderr)
        for exc in group.exceptions:
            print(f"  {type(exc).__name__}: {exc}", file=sys.stderr)
            for note in getattr(exc, "__notes__", []):
                print(f"    {note}", file=sys.stderr)
        return 1
    print(result.summary(), file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    """Add ``convert`` to the CLI's subparsers."""
    p = sub.add_parser(
        "convert",
        help="convert a dataset in another format into a recordkit dataset",
        description="Convert SRC (a local path or fsspec URL) into a recordkit dataset at DST, "
        "in writer subprocesses (or on a Dask or Ray cluster). A rerun resumes a killed or failed "
        "conversion and ends byte-identical to an uninterrupted one.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", help="source: a path or URL (s3://, gs://, http(s)://, memory://)")
    p.add_argument("dst", help="dataset directory: a path or URL")
    p.add_argument(
        "--from",
        dest="from_",
        default=None,
        metavar="FORMAT",
        help="source format: imagefolder, jsonl, csv, numpy, parquet, webdataset, tfrecord, "
        "mds, hf, arrayrecord, or one a plugin registers (default: told from SRC's files when "
        "only one format's are there: .parquet, .jsonl, .csv, .npy/.npz, .tfrecord, a .tar of "
        "samples, class folders of images, an MDS index.json, ...)",
    )
    add_converter_options(p)
    p.add_argument(
        "--workers",
        type=count,
        default=None,
        help="writer processes (default: CPU count; 0: inline)",
    )
    p.add_argument(
        "--partition-size",
        default=None,
        help="source bytes per partition, the unit of work and resume (default: shard size)",
    )
    add_run_options(p, "DST")
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="read symlinks in a local SRC that lead outside it (refused by default)",
    )
    p.add_argument("--storage-options", default=None, help="fsspec options as JSON (SRC and DST)")
    p.add_argument("--dst-storage-options", default=None, help="fsspec options for DST as JSON")
    p.set_defaults(func=_cmd_convert)


def add_converter_options(p: Any) -> None:
    """``--schema`` and ``-o``/``--option``, the same for ``convert`` and ``cache fill``."""
    p.add_argument(
        "--schema",
        help="JSON, @file.json, or 'name:type[shape],...' (default: inferred from the source)",
    )
    p.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a converter option (value parsed as JSON when it is JSON); see each format's "
        "options in docs/convert.md",
    )


def add_run_options(p: argparse.ArgumentParser, dst: str) -> None:
    """The options ``convert`` and ``write`` share (:func:`run_keywords` reads them):
    the shards, where partitions run, what is at ``dst`` already, retries, progress."""
    p.add_argument("--shard-size", default="256MiB", help="shard roll-over size (default 256MiB)")
    p.add_argument(
        "--max-records", type=positive, default=None, help="also roll over after N records"
    )
    p.add_argument("--compress", choices=["zstd"], default=None, help="zstd-compress tensors")
    p.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="local",
        help="where partitions run: writer processes here (default), Dask or Ray",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="the cluster: a Dask scheduler (tcp://host:8786) or a Ray cluster "
        "(ray://head:10001, auto); default: a local one started for the run (Ray: "
        "$RAY_ADDRESS when set)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"resume a partial run (also the default when {dst} holds one of the same plan)",
    )
    p.add_argument("--overwrite", action="store_true", help=f"replace what is at {dst}")
    p.add_argument(
        "--break-lock",
        action="store_true",
        help=f"take over a remote {dst}'s lease whose holder is gone (one writer at a time)",
    )
    p.add_argument("--retries", type=count, default=3, help="retries on transient remote errors")
    p.add_argument("--no-fsync", action="store_true", help="do not fsync shards (scratch data)")
    add_progress_options(p)
