"""Apache Beam's side of tests/engines/test_beam.py, run by the Beam venv's Python
(``bash scripts/beam_env.sh``): Beam stays out of the project's environment, and this
venv has neither TensorFlow nor torch.

    python beam_driver.py write PAYLOADS.json PREFIX [--suffix S] [--compression C] [--shards N]
    python beam_driver.py read PATTERN OUT.json

``write``: the serialized records in PAYLOADS.json (a list of hex strings) through
``beam.io.WriteToTFRecord(PREFIX, ...)`` (``C``: a ``CompressionTypes`` name).
``read``: ``beam.io.ReadFromTFRecord(PATTERN)``, each record parsed in the pipeline by
``recordkit.codec.decode_example`` (no TensorFlow), written to OUT.json as a list of
``{"payload": hex, "features": {name: [kind, values]}}`` (bytes values as hex, floats
as their float32 bits). A failure exits non-zero with Beam's message on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _features(payload: bytes) -> dict[str, Any]:
    from recordkit.codec import decode_example

    out: dict[str, Any] = {}
    for name, (kind, values) in decode_example(payload).items():
        if kind == "bytes":
            out[name] = [kind, [bytes(v).hex() for v in values]]
        elif kind == "float":
            out[name] = [kind, values.view("uint32").tolist()]
        elif kind == "int64":
            out[name] = [kind, values.tolist()]
        else:
            out[name] = [kind, []]
    return {"payload": payload.hex(), "features": out}


def _dump(path: str, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rows, f)


def write(args: argparse.Namespace) -> None:
    import apache_beam as beam
    from apache_beam.io.filesystem import CompressionTypes

    with open(args.payloads, encoding="utf-8") as f:
        payloads = [bytes.fromhex(h) for h in json.load(f)]
    options: dict[str, Any] = {"file_name_suffix": args.suffix, "num_shards": args.shards}
    if args.compression:
        options["compression_type"] = getattr(CompressionTypes, args.compression)
    with beam.Pipeline() as p:
        _ = p | beam.Create(payloads) | beam.io.WriteToTFRecord(args.prefix, **options)


def read(args: argparse.Namespace) -> None:
    import apache_beam as beam

    with beam.Pipeline() as p:
        _ = (
            p
            | beam.io.ReadFromTFRecord(args.pattern)
            | beam.Map(_features)
            | beam.combiners.ToList()
            | beam.Map(lambda rows: _dump(args.out, rows))
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="beam_driver")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("payloads")
    w.add_argument("prefix")
    w.add_argument("--suffix", default="")
    w.add_argument("--compression", default=None)
    w.add_argument("--shards", type=int, default=0)
    r = sub.add_parser("read")
    r.add_argument("pattern")
    r.add_argument("out")
    args = parser.parse_args(argv)
    {"write": write, "read": read}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
