"""The request-size check every store transaction goes through (twice: the active-SC guard and
the backend), against the exact field-by-field count it replaced as the first step, in the same run.

A transaction as the topic controller writes a topic's partitions: 120 compares and 120 puts of
300-byte values. Pure CPU (no store is started).

    .venv/bin/python bench/request_size.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from store import kv  # noqa: E402 (after the path set-up above)


def per_call(function: object, repeat: int) -> float:
    assert callable(function)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeat):
            function()
        best = min(best, (time.perf_counter() - started) / repeat)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    size = kv.RequestSize("/sc/", kv.DEFAULT_MAX_REQUEST_BYTES)
    keys = [f"partitions/topic-{topic}-{index}" for topic in range(12) for index in range(10)]
    compares = [kv.Compare(key, 0) for key in keys]
    operations: list[kv.Operation] = [kv.Put(key, b"v" * 300) for key in keys]
    check = per_call(lambda: size.check(compares, operations), args.repeat)
    exact = per_call(lambda: size.txn_bytes(compares, operations), args.repeat)
    print(f"{'check of 120 compares + 120 puts (us)':48} {check * 1e6:8.1f}")
    print(f"{'exact count alone, the baseline (us)':48} {exact * 1e6:8.1f}")
    print(f"{'check / exact count':48} {check / exact:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
