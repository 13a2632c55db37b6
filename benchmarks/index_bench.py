"""Loading one shard's index, the ways a reader can: what issue 14's choices rest on.

For one shard of ``--records`` tiny records (written with ``recordkit.Writer``, its
``.idx`` beside it, in the page cache), each way is timed ``--repeat`` times in this
process (process CPU seconds, the median), with the bytes a record it keeps:

- ``numpy whole``: the previous reader path: ``load_index`` (NumPy ``parse_index``)
  then ``validate_index`` (every length field read): two int64 columns kept.
- ``text, lines counted``: ``load_index_file`` with the per-user cache off: the
  text mapped, its lines counted, its first and last blocks of 32 lines parsed
  (``recordkit/native/index.c``), then 16 spread length fields; the other blocks
  are parsed (and the other length fields checked per run) as records are read.
  What the first process to map a shard pays at load.
- ``text, parsed whole in C``: ``parse_bounds`` (one pass, every check that needs
  only the file size) then 16 spread length fields: what a load paid before
  blocks were parsed as needed (and what the background thread pays, later).
- ``binary copy from the per-user cache``: ``load_index_file`` with it on and
  warm (``index_cache.cached_bounds``: the header, the copy mapped, 16 length
  fields). What every later load pays: other processes, later runs, a shard the
  map budget unmapped.
- ``text, parsed in C + every length field``: then ``check_all`` (what
  ``ensure_index`` and ``recordkit verify`` pay).
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
    from recordkit.reader.index import ShardIndex, load_index_file, parse_bounds
    from recordkit.reader.index import store as index_cache
    from recordkit.reader.index.text import _c as native_parse

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RECORDKIT_INDEX_CACHE"] = os.path.join(tmp, "index-cache")
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
        print(
            f"# one shard: {n} records, {size} bytes, .idx {len(text)} bytes "
            f"({len(text) / n:.1f} B/record); C parser built: {native_parse is not None}"
        )

        def numpy_whole() -> None:
            validate_index(load_index(idx), buf, path=shard)

        def c_parse() -> None:
            load_index_file(idx, buf, path=shard, cache=False)

        def c_parse_whole() -> None:
            ShardIndex(parse_bounds(read_index_text(idx), size), source=idx).spot_check(buf)

        def binary_copy() -> None:
            index = load_index_file(idx, buf, path=shard)
            assert index.records == n

        def c_parse_all() -> None:
            ShardIndex(parse_bounds(read_index_text(idx), size), source=idx).check_all(buf)

        def text_read() -> None:
            read_index_text(idx)

        load_index_file(idx, buf, path=shard)  # the binary copy, as a first reader leaves it
        index_cache.wait_stored()  # (written on a background thread)
        rows = [
            ("NumPy parse, every length field (the previous readers)", numpy_whole, 16),
            ("text, lines counted, 16 length fields (a first load)", c_parse, 4),
            ("text, parsed whole in C, 16 length fields", c_parse_whole, 4),
            ("binary copy from the per-user cache, 16 length fields", binary_copy, 4),
            ("text, parsed in C, every length field (ensure_index)", c_parse_all, 4),
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
