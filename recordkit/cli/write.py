"""``recordkit write``: the subcommand's parser and handler (:func:`recordkit.write`).

Only the standard library at module level (``recordkit --help`` stays instant);
the handler imports the conversion machinery when it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from .args import progress_mode
from .convert import add_run_options

__all__ = ["add_parser", "read_inputs"]

_EXAMPLES = """\
examples:
  recordkit write mypackage.samples:make urls.txt data/train --schema 'image:bytes,label:int64'
  recordkit write make_samples:make range:100000 s3://bucket/ds --schema @schema.json --workers 8
  recordkit write mymod:make ids.jsonl out/ --schema 'x:float32[16]' --engine dask
  recordkit write mymod:make ids.jsonl s3://b/ds --schema 'x:float32[16]' --engine ray

FUNCTION is module:function, imported from the current directory or the Python path;
it is called on each input and returns (or yields) samples: mappings of feature name
to value. INPUTS is a file with one input per line (each line a string), a .jsonl
file (one JSON value per line), a .json file (a list), range:N or range:START:STOP
(the integers), or - (lines from stdin). A killed or failed run resumes when rerun
with the same arguments.
"""


def read_inputs(spec: str) -> list[Any]:
    """The inputs ``INPUTS`` names (see the examples above)."""
    if spec == "-":
        return [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
    if spec.startswith("range:") and not os.path.exists(spec):
        try:
            bounds = [int(x) for x in spec[len("range:") :].split(":")]
        except ValueError:
            bounds = []
        if len(bounds) not in (1, 2):
            raise SystemExit(f"recordkit write: {spec!r}: expected range:N or range:START:STOP")
        return list(range(*bounds))
    try:
        with open(spec, encoding="utf-8") as f:
            if spec.endswith(".json"):
                data = json.load(f)
                if not isinstance(data, list):
                    raise SystemExit(
                        f"recordkit write: {spec} holds a JSON {type(data).__name__}, not a list"
                    )
                return data
            if spec.endswith(".jsonl"):
                return [json.loads(line) for line in f if line.strip()]
            return [line.rstrip("\r\n") for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        raise SystemExit(f"recordkit write: cannot read the inputs {spec}: {exc}") from None


def _cmd_write(args: argparse.Namespace) -> int:
    from ..codec.schema_text import parse_schema
    from ..conversion import write
    from ..conversion.function import import_function
    from ..conversion.progress import choose_progress
    from .convert import run, run_keywords

    log = logging.getLogger("recordkit.conversion")
    if not args.quiet and log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)  # the plan and resumes are what this command is for
    if os.getcwd() not in sys.path:  # `module:function` from here, as `python -m` finds it
        sys.path.insert(0, os.getcwd())
    try:
        import_function(args.function)
    except (ImportError, TypeError, ValueError) as exc:
        print(f"recordkit write: error: {exc}", file=sys.stderr)
        return 2
    inputs = read_inputs(args.inputs)
    storage_options = json.loads(args.storage_options) if args.storage_options else None
    try:
        return run(
            "write",
            args.out,
            storage_options,
            lambda: write(
                args.function,
                inputs,
                args.out,
                schema=parse_schema(args.schema),
                inputs_per_partition=args.inputs_per_partition,
                storage_options=storage_options,
                progress=choose_progress(progress_mode(args), args.log_interval, "write", "input"),
                **run_keywords(args),
            ),
        )
    except (TypeError, ValueError) as exc:  # an input or the function, refused up front
        print(f"recordkit write: error: {exc}", file=sys.stderr)
        return 2


def add_parser(sub: Any) -> None:
    """Add ``write`` to the CLI's subparsers."""
    p = sub.add_parser(
        "write",
        help="write the samples a Python function makes from each input, in parallel",
        description="Call FUNCTION on each of INPUTS in writer subprocesses (or on a Dask "
        "or Ray cluster) and write the samples it returns or yields into one dataset at OUT. The "
        "output depends on the inputs, schema and options only; a rerun resumes a killed "
        "or failed run and ends byte-identical to an uninterrupted one.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("function", metavar="FUNCTION", help="module:function")
    p.add_argument("inputs", metavar="INPUTS", help="file of inputs, range:N, or - for stdin")
    p.add_argument("out", metavar="OUT", help="dataset directory: a path or URL")
    p.add_argument("--schema", required=True, help="JSON, @file.json, or 'name:type[shape],...'")
    p.add_argument(
        "--workers", type=int, default=None, help="writer processes (default: CPU count; 0: inline)"
    )
    p.add_argument(
        "--inputs-per-partition",
        type=int,
        default=None,
        help="inputs per partition, the unit of work and resume (default: about 64 partitions)",
    )
    p.add_argument("--storage-options", default=None, help="fsspec options for OUT as JSON")
    add_run_options(p, "OUT")
    p.set_defaults(func=_cmd_write)
