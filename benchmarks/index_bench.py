"""Loading one shard's index, the ways a reader could: what issue 14's choice rests on.

For one shard of ``--records`` tiny records (written with ``recordkit.Writer``, its
``.idx`` beside it, in the page cache), each way is timed ``--repeat`` times in this
process (process CPU seconds, the median), with the bytes a record it keeps:

- ``numpy whole``: the previous reader path: ``load_index`` (NumPy ``parse_index``)
  then ``validate_index`` (every length field read): two int64 columns kept.
- ``C parse``: ``parse_bounds`` (``recordkit/_index.c``: one pass, every check that
  needs only the file size) then 16 spread length fields: ``uint32`` boundaries kept;
  the rest of the length fields are checked per run as records are read.
- ``C parse + every length field``: the same, then ``check_all`` (what
  ``ensure_index`` and ``recordkit verify`` pay).
- ``binary read``: ``np.fromfile`` of the boundaries already in binary form (what a
  binary index in a per-user cache would cost to load; it is not written by
  recordkit: this measures the option).
- ``text read only``: reading the ``.idx`` bytes, the floor of any text path.

Usage::

    python benchmarks/index_bench.py [--records 250000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def _cpu() -> float:
    return time.process_time()


def _time(fn, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = _cpu()
        fn()
        runs.append(_cpu() - t0)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    import recordkit as rk
    from recordkit.format.index import (
        index_path,
        load_index,
        open_map,
        read_index_text,
        validate_index,
    )
    from recordkit.format.shard_index import ShardIndex, parse_bounds
    from recordkit.format.shard_index import _c as native_parse

    with tempfile.TemporaryDirectory() as tmp:
        schema = rk.Schema(label=rk.Int64(), data=rk.Bytes())
        with rk.Writer(tmp, schema, max_records=args.records, fsync=False) as w:
            for i in range(args.records):
                w.write({"label": i, "data": i.to_bytes(8, "little") * 2})
        shard = os.path.join(tmp, w.manifest.shards[0].path)
        idx = index_path(shard)
        buf = open_map(shard)
        size = len(buf)
        text = read_index_text(idx)
        n = args.records
        binary = os.path.join(tmp, "bounds.bin")
        parse_bounds(text, size).tofile(binary)
        print(
            f"# one shard: {n} records, {size} bytes, .idx {len(text)} bytes "
            f"({len(text) / n:.1f} B/record); C parser built: {native_parse is not None}"
        )

        def numpy_whole() -> None:
            validate_index(load_index(idx), buf, path=shard)

        def c_parse() -> None:
            ShardIndex(parse_bounds(read_index_text(idx), size), source=idx).spot_check(buf)

        def c_parse_all() -> None:
            ShardIndex(parse_bounds(read_index_text(idx), size), source=idx).check_all(buf)

        def binary_read() -> None:
            np.fromfile(binary, dtype=np.uint32)

        def text_read() -> None:
            read_index_text(idx)

        rows = [
            ("numpy whole (previous readers)", numpy_whole, 16),
            ("C parse, 16 length fields (readers now)", c_parse, 4),
            ("C parse + every length field", c_parse_all, 4),
            ("binary read (the option not taken)", binary_read, 4),
            ("text read only", text_read, 0),
        ]
        print("\n| way | ms a shard | ns a record | bytes a record kept |")
        print("|---|---|---|---|")
        for name, fn, kept in rows:
            t = _time(fn, args.repeat)
            print(f"| {name} | {t * 1e3:.2f} | {t * 1e9 / n:.1f} | {kept} |")
        if isinstance(buf, bytes):
            return
        buf.close()


if __name__ == "__main__":
    sys.exit(main())
