"""The Spark report on a tiny history (the demo's size), with the demo's Spark settings
(demo.TINY_HISTORY_SETTINGS) and, as the baseline in the same run, with the settings it had before
one shuffle partition, no adaptive execution and no broadcast joins were added to them.

Each variant runs in a process of its own (JVM options apply only to the session that starts the
JVM), alternating: the session start, the first report (cold JVM), the next reports (warm), and the
Spark jobs each report ran.

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python bench/audit_tiny.py [--records 600] [--reports 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import audit as audit_bench  # noqa: E402
from controller.audit import export  # noqa: E402
from controller.demo import demo  # noqa: E402

# What TINY_HISTORY_SETTINGS held before: no generated code, no optimising JIT; the session's own
# default of two shuffle partitions per core.
BEFORE = {
    key: demo.TINY_HISTORY_SETTINGS[key]
    for key in ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode", "spark.driver.extraJavaOptions")
}
VARIANTS = {"before": BEFORE, "tiny": demo.TINY_HISTORY_SETTINGS}


def child(variant: str, dataset: Path, reports: int) -> None:
    """One variant in this process: prints one JSON line of its figures."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from controller.audit import jobs

    started = time.perf_counter()
    spark = jobs.session("local[2]", app_name=f"sc-audit-tiny-{variant}", settings=VARIANTS[variant])
    session_seconds = time.perf_counter() - started
    tracker = spark.sparkContext.statusTracker()
    seconds: list[float] = []
    spark_jobs: list[int] = []
    try:
        for _ in range(reports):
            before = len(tracker.getJobIdsForGroup(None))
            started = time.perf_counter()
            jobs.run(spark, dataset)
            seconds.append(time.perf_counter() - started)
            spark_jobs.append(len(tracker.getJobIdsForGroup(None)) - before)
    finally:
        spark.stop()
    print(json.dumps({"session": session_seconds, "reports": seconds, "jobs": spark_jobs}))


class Figures:
    """One variant's session: its start, each report's seconds and Spark jobs."""

    def __init__(self, printed: str) -> None:
        document = json.loads(printed)
        self.session = float(document["session"])
        self.reports = [float(seconds) for seconds in document["reports"]]
        self.jobs = [int(count) for count in document["jobs"]]


def run_child(variant: str, dataset: Path, reports: int) -> Figures:
    done = subprocess.run(
        [sys.executable, __file__, "--child", variant, "--dataset", str(dataset), "--reports", str(reports)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {variant} run failed:\n{done.stderr[-4000:]}")
    return Figures(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=600, help="synthetic history size (the demo's: a few hundred)")
    parser.add_argument("--reports", type=int, default=3, help="reports per session: the first cold, the others warm")
    parser.add_argument("--rounds", type=int, default=2, help="sessions per variant, alternating")
    parser.add_argument("--child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.dataset, args.reports)
        return
    work = Path(tempfile.mkdtemp(prefix="sc-audit-tiny-"))
    asyncio.run(audit_bench.synthetic_history(work / "history", args.records))
    exported = export.export(work / "history", work / "export")
    print(f"work dir {work}; {os.cpu_count()} cores; {exported.rows} records exported")
    seen: dict[str, list[Figures]] = {variant: [] for variant in VARIANTS}
    for round_number in range(args.rounds):
        for variant in VARIANTS if round_number % 2 == 0 else reversed(VARIANTS):
            figures = run_child(variant, work / "export", args.reports)
            seen[variant].append(figures)
            reports = ", ".join(f"{seconds:.1f}" for seconds in figures.reports)
            print(f"  {variant:6s} session {figures.session:.1f} s; reports {reports} s; Spark jobs per report {figures.jobs}")
    cold = {variant: statistics.median(run.reports[0] for run in runs) for variant, runs in seen.items()}
    print(f"first report (cold): tiny {cold['tiny']:.1f} s, before {cold['before']:.1f} s; ratio {cold['tiny'] / cold['before']:.2f}x")
    if args.reports > 1:
        warm = {variant: statistics.median(seconds for run in runs for seconds in run.reports[1:]) for variant, runs in seen.items()}
        print(f"next reports (warm): tiny {warm['tiny']:.1f} s, before {warm['before']:.1f} s; ratio {warm['tiny'] / warm['before']:.2f}x")

if __name__ == "__main__":
    main()
