"""Least-loaded placement at high replication factors: rows per leaf rack against the heap.

The rack-aware least-loaded picks have two equivalent implementations (controller/placement/
least_loaded.py): a heap of every SPU, popping the entries the rules refuse, and sorted rows per
leaf rack (`_LeafRows`). `_by_rows` chooses between them by the racks and the replication factor.
Each case is timed with both forced, best of --repeat, in the same run, with the one chosen
marked; the replica maps must be identical. A last case without racks (one implementation)
gives the time of a replication factor equal to the SPU count.

    .venv/bin/python bench/placement_rows.py [--repeat K]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controller import placement  # noqa: E402 (after the path set-up above)
from controller.placement import least_loaded  # noqa: E402

CASES = [
    # SPUs, racks (0: none), partitions, replication factor
    (128, 8, 2_000, 128),
    (128, 8, 2_000, 32),
    (128, 8, 2_000, 16),
    (128, 8, 2_000, 8),
    (100, 10, 10_000, 20),
    (100, 10, 10_000, 10),
    (30, 3, 5_000, 6),
    (12, 3, 10_000, 12),
    (12, 3, 20_000, 3),
    (1_000, 50, 20_000, 3),
    (128, 0, 2_000, 128),
]


def timed(request: placement.PlacementRequest, repeat: int) -> tuple[float, list[list[int]]]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        result = placement.compute(request)
        best = min(best, time.perf_counter() - started)
    assert result is not None
    return best, result.replica_map


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timings per figure; the best is kept")
    args = parser.parse_args(argv)
    chooser = least_loaded._by_rows
    print(f"{'SPUs':>6s} {'racks':>5s} {'partitions':>10s} {'RF':>4s} {'heap':>9s} {'rows':>9s} {'rows/heap':>9s}  chosen")
    try:
        for spus_count, racks, partitions, replication_factor in CASES:
            spus = [
                placement.SpuInfo(id=spu_id, rack=f"rack-{spu_id % racks}" if racks else None)
                for spu_id in range(spus_count)
            ]
            request = placement.PlacementRequest(
                spus=spus, partitions=partitions, replication_factor=replication_factor, strategy="least-loaded"
            )
            if not racks:
                seconds, _ = timed(request, args.repeat)
                print(f"{spus_count:>6,} {'-':>5s} {partitions:>10,} {replication_factor:>4} {seconds * 1000:>7.0f}ms {'-':>9s} {'-':>9s}  (no racks: one way)")
                continue
            least_loaded._by_rows = lambda leaves, replication_factor: False
            heap_seconds, heap_map = timed(request, args.repeat)
            least_loaded._by_rows = lambda leaves, replication_factor: True
            rows_seconds, rows_map = timed(request, args.repeat)
            least_loaded._by_rows = chooser
            assert heap_map == rows_map, "the two implementations disagree"
            chosen = "rows" if chooser(racks, replication_factor) else "heap"
            print(
                f"{spus_count:>6,} {racks:>5} {partitions:>10,} {replication_factor:>4} {heap_seconds * 1000:>7.0f}ms"
                f" {rows_seconds * 1000:>7.0f}ms {rows_seconds / heap_seconds:>9.2f}  {chosen}"
            )
    finally:
        least_loaded._by_rows = chooser
    return 0


if __name__ == "__main__":
    sys.exit(main())
