"""``recordkit cache fill | status | gc``: the subcommands' parsers and handlers.

Only the standard library at module level; handlers import the cache when they run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from .args import add_progress_options, count, json_object, positive, progress_mode
from .convert import add_converter_options

__all__ = ["add_parser"]

log = logging.getLogger("recordkit.cache")

_EXAMPLES = """\
examples:
  recordkit cache fill s3://bucket/train /scratch/cache --max-bytes 50GiB
  recordkit cache fill s3://bucket/raw-jsonl /scratch/cache --max-bytes 50GiB --format jsonl
  recordkit cache status /scratch/cache
  recordkit cache gc /scratch/cache --max-bytes 20GiB

fill stops when every shard is present, or when the budget is full of shards that
no reader has used yet; training processes using the same directory keep it going.
A shard whose download fails (after its read retries) is tried again after a
cooldown, up to 4 times. Exit status: 0 when the dataset or the budget was filled
(failed downloads that were retried included), 1 when shards are missing that could
not be fetched or had no room (a full disk), 2 when the remote could not be listed or
an option is wrong.
With --format (producer mode) REMOTE holds raw samples that writer processes convert
into shards, one per partition, as `recordkit convert --from FORMAT` would.
"""


class _Events:
    """CacheEvents shown by the one progress meter: bytes fetched, shards, the cache's size.

    Called from fill worker threads: each method only counts (the meter draws on its
    own thread); the per-shard lines are INFO, shown with -v.
    """

    def __init__(self, meter: Any) -> None:
        self.meter = meter

    def downloaded(self, nbytes: int) -> None:
        self.meter.add(bytes=nbytes)

    def published(self, shard: Any, used: int) -> None:
        from .._units import format_size

        self.meter.add(shards=1)
        self.meter.note = f"cache {format_size(used)}"
        log.info(
            "cached %s (%s; cache now %s)", shard.path, format_size(shard.bytes), format_size(used)
        )

    def evicted(self, path: str) -> None:
        log.info("evicted %s", path)


def _producer_options(args: argparse.Namespace) -> Any:
    """ShardCache's ``ProducerOptions`` from the command line (``None`` without --format)."""
    given = [
        flag
        for flag, value in (
            ("--schema", args.schema),
            ("--shard-size", args.shard_size),
            ("--partition-items", args.partition_items),
            ("--compress", args.compress),
            ("--option", args.option),
            ("--retries", args.retries),
        )
        if value
    ]
    if args.format is None:
        if given:
            raise ValueError(f"{', '.join(given)} need(s) --format (producer mode)")
        return None
    from ..codec.schema_text import parse_schema
    from ..conversion import ConvertOptions
    from .args import key_values

    options = ConvertOptions(
        shard_size=args.shard_size or "256MiB",
        partition_items=args.partition_items or 65536,
        compress=args.compress,
        retries=3 if args.retries is None else args.retries,
    )
    from ..cache import ProducerOptions

    return ProducerOptions(
        format=args.format,
        schema=parse_schema(args.schema) if args.schema else None,
        source_options=key_values(args.option),
        convert_options=options,
    )


def _retry_policy(args: argparse.Namespace) -> Any:
    """The retry policy the deadline flags ask for (``None``: the default)."""
    connect, read = args.connect_timeout, args.read_timeout
    if connect is None and read is None:
        return None
    if args.format is not None:
        raise ValueError(
            "--connect-timeout/--read-timeout: shard mode only; in producer mode the "
            "sources' reads take their deadlines from --storage-options"
        )
    from ..retry import RetryPolicy

    default = RetryPolicy()
    return RetryPolicy(
        connect_timeout=default.connect_timeout if connect is None else (connect or None),
        read_timeout=default.read_timeout if read is None else (read or None),
    )


def _cmd_fill(args: argparse.Namespace) -> int:
    from ..cache import ShardCache

    try:
        producer = _producer_options(args)
        workers = args.workers if args.workers is not None else (2 if producer else 4)
        cache = ShardCache(
            args.remote,
            args.local,
            max_bytes=args.max_bytes,
            fill_workers=workers,
            policy=args.policy,
            storage_options=json_object("--storage-options", args.storage_options),
            retry=_retry_policy(args),
            producer=producer,
        )
    except ValueError as exc:  # a bad option value, an unknown converter
        print(f"recordkit cache fill: error: {exc}", file=sys.stderr)
        return 2
    from .._progress import Meter
    from .._units import format_size, plural
    from ..errors import DiskFullError

    # Producer mode counts source bytes read, of which the budget holds an unknown share.
    total = None if producer else min(sum(s.bytes for s in cache.catalog()), cache.max_bytes)
    meter = Meter("cache fill", mode=progress_mode(args), interval=args.log_interval)
    cache.events = _Events(meter)
    meter.start(bytes=total, done={"shards": 0})
    try:
        present = cache.fill()
    except DiskFullError as exc:  # shards are missing: the device or the budget is full
        print(f"recordkit cache fill: error: {exc}", file=sys.stderr)
        return 1
    finally:
        meter.close()
    status = cache.status()
    what = "converted and cached" if producer else "cached"
    word = "partition" if producer else "shard"
    listed = status.remote_shards
    count = plural(present, word) if listed is None else f"{present} of {plural(listed, word)}"
    budget = format_size(cache.max_bytes if status.max_bytes is None else status.max_bytes)
    print(
        f"{count} {what} in {status.root}: {format_size(status.used)} of {budget} used",
        file=sys.stderr,
    )
    if cache.failed and not cache.budget_full:
        for rel, err in sorted(cache.failed.items()):
            print(f"recordkit cache fill: error: {rel}: {err}", file=sys.stderr)
        print(
            f"recordkit cache fill: error: {plural(len(cache.failed), 'shard')} could not be "
            "fetched after their retries; run the command again to retry them",
            file=sys.stderr,
        )
        return 1
    if cache.errors:
        n = len(cache.errors)
        print(
            f"recordkit cache fill: {plural(n, 'failed download')} {'was' if n == 1 else 'were'} "
            f"retried ({'the budget is full' if cache.budget_full else 'every shard is cached'})",
            file=sys.stderr,
        )
    return 0


def _open_local(local: str, max_bytes: str | None) -> Any:
    from ..cache import ShardCache
    from ..cache.directory import CacheDir

    catalog = CacheDir(local).load_catalog() or {}
    budget = max_bytes or catalog.get("max_bytes") or 1
    return ShardCache(None, local, max_bytes=budget, fill_workers=0)


def _cmd_status(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from .._units import format_size

    status = _open_local(args.local, None).status()
    if args.json:
        print(json.dumps(asdict(status), indent=1))
        return 0
    print(f"{status.root}  (cache of {status.remote})")
    if status.mode == "producer":
        print(f"  mode         producer (converting {status.format} samples into shards)")
    else:
        print(f"  mode         {status.mode} (copies of the remote's shards)")
    print(f"  used         {status.used} bytes ({format_size(status.used)})")
    print(f"  bookkeeping  {status.bookkeeping} bytes of it (the cache's own files)")
    if status.max_bytes:
        print(f"  budget       {status.max_bytes} bytes ({format_size(status.max_bytes)})")
    print(f"  shards       {status.complete} of {status.remote_shards}")
    print(f"  downloading  {status.downloading}")
    print(f"  pinned       {status.pinned}")
    print(f"  orphans      {status.orphans}")
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    cache = _open_local(args.local, args.max_bytes)
    removed = cache.gc()
    if args.max_bytes is not None:
        removed += cache.shrink(cache.max_bytes)
    for rel in removed:
        print(rel)
    status = cache.status()
    from .._units import format_size, plural

    print(
        f"removed {plural(len(removed), 'file')}; {plural(status.complete, 'shard')}, "
        f"{format_size(status.used)} left",
        file=sys.stderr,
    )
    return 0


def add_parser(sub: Any) -> None:
    """Add ``cache`` and its subcommands to the ``recordkit`` parser."""
    p = sub.add_parser(
        "cache",
        help="a local, size-limited cache of a remote dataset",
        description="Fill, inspect and clean a local shard cache of a remote dataset "
        "(see docs/cache.md).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    f = csub.add_parser(
        "fill",
        help="download shards until the cache is complete or full",
        description="Download shards of REMOTE into LOCAL (verified, published atomically), "
        "never using more than --max-bytes.",
    )
    f.add_argument(
        "remote",
        help="the dataset (or, with --format, the raw samples): s3://..., https://..., "
        "gs://..., or a path",
    )
    f.add_argument("local", help="the local cache directory")
    f.add_argument("--max-bytes", required=True, help="the disk budget, e.g. 50GiB")
    f.add_argument(
        "--workers",
        type=count,
        default=None,
        help="concurrent downloads (default 4), or with --format writer processes (default 2)",
    )
    f.add_argument(
        "--policy", choices=("consumed-lru", "lru"), default="consumed-lru", help="eviction"
    )
    f.add_argument("--storage-options", help="fsspec options as a JSON object")
    f.add_argument(
        "--connect-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a connection to the remote may take to open (default 10; 0: the "
        "client's default)",
    )
    f.add_argument(
        "--read-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a remote request may go without receiving a byte before it is retried "
        "(default 30; 0: no limit)",
    )
    prod = f.add_argument_group(
        "producer mode",
        "REMOTE holds raw samples; writer processes convert each partition into one shard",
    )
    prod.add_argument(
        "--format",
        "--from",
        dest="format",
        metavar="FORMAT",
        help="the source format (as recordkit convert --from): imagefolder, jsonl, csv, numpy, "
        "parquet, webdataset, tfrecord, or one a plugin registers",
    )
    add_converter_options(prod)
    prod.add_argument(
        "--shard-size",
        help="source bytes per partition, each converted into one shard (default 256MiB)",
    )
    prod.add_argument(
        "--partition-items",
        type=positive,
        help="at most N source items per partition (default 65536)",
    )
    prod.add_argument("--compress", choices=["zstd"], default=None, help="zstd-compress tensors")
    prod.add_argument(
        "--retries", type=count, default=None, help="retries on transient source errors (default 3)"
    )
    add_progress_options(f)
    f.set_defaults(func=_cmd_fill)

    s = csub.add_parser(
        "status",
        help="what the cache holds",
        description="Show the cache's size, budget, shards, downloads in progress and pins.",
    )
    s.add_argument("local", help="the local cache directory")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_cmd_status)

    g = csub.add_parser(
        "gc",
        help="remove leftovers of killed processes",
        description="Remove temp files, stale reservations and pins of dead processes, and "
        "shards the remote no longer lists; with --max-bytes also evict unpinned shards "
        "(least recently used first) until the cache fits.",
    )
    g.add_argument("local", help="the local cache directory")
    g.add_argument("--max-bytes", help="evict until the cache is at most this big")
    g.set_defaults(func=_cmd_gc)
