"""Run one fuzz target in this process, as the child of ``test_fuzz.py``.

    python -m tests.fuzz.harness TARGET --examples N --workdir DIR [--seed S]
        [--timeout SECONDS] [--memory MiB]

The child is where the risky things happen: it caps its own address space
(``RLIMIT_AS``: what it uses after its imports plus ``--memory``), arms a hard
per-example deadline (``faulthandler.dump_traceback_later(exit=True)``: a hang
in C code ends the process with every thread's traceback) and writes each
example to ``DIR/current.txt`` before running it, so a signal or a hang is
reported with the input that caused it. Hypothesis runs the examples; a
failing property prints the shrunk example and exits 1. On success it prints
one JSON line of statistics (outcomes per reader) and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import importlib
import json
import os
import resource
import sys
import tempfile
import time
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

TARGETS = {
    "payloads": "tests.fuzz.targets:payloads",
    "manifests": "tests.fuzz.targets:manifests",
    "indexes": "tests.fuzz.targets:indexes",
    "cache_state": "tests.fuzz.cache_target:cache_state",
    "tf_payloads": "tests.fuzz.targets:tf_payloads",
    # the harness's own test: each misbehaves on examples >= 50
    "selftest_crash": "tests.fuzz.selftest:crash",
    "selftest_hang": "tests.fuzz.selftest:hang",
    "selftest_memory": "tests.fuzz.selftest:memory",
    "selftest_wrong_type": "tests.fuzz.selftest:wrong_type",
}


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("target", choices=sorted(TARGETS))
    p.add_argument("--examples", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--memory", type=int, default=1024, help="MiB above the imports")
    args = p.parse_args(argv)

    module, name = TARGETS[args.target].split(":")
    target = getattr(importlib.import_module(module), name)
    stats: collections.Counter[str] = collections.Counter()
    current = os.path.join(args.workdir, "current.txt")
    scratch = tempfile.mkdtemp(dir=args.workdir)
    target.setup(scratch)  # templates, imports: before the cap is measured

    limit = _vm_bytes() + (args.memory << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    faulthandler.enable()

    def run(example: Any) -> None:
        with open(current, "w") as f:
            f.write(repr(example)[:100_000])
        faulthandler.dump_traceback_later(args.timeout, exit=True)
        try:
            for word in target.check(example, scratch):
                stats[word] += 1
        finally:
            faulthandler.cancel_dump_traceback_later()

    test = settings(
        max_examples=args.examples,
        database=None,
        deadline=None,
        derandomize=args.seed is None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        print_blob=True,
    )(given(target.strategy())(run))
    if args.seed is not None:
        test = seed(args.seed)(test)
    start = time.monotonic()
    test()
    stats["examples"] = args.examples
    stats["seconds"] = round(time.monotonic() - start)
    print(json.dumps(dict(sorted(stats.items()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
