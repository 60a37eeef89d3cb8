"""What the audit report takes and gives: its options and arguments, and the results the Spark
jobs collect for the report to format. No pyspark or pyarrow here: `sc` parses the report's
arguments, and the report reads the results, without loading Spark.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The longest --flap-window, in seconds (some 31 years).
MAX_FLAP_WINDOW = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Options:
    at: datetime.datetime | None = None  # balance at this time (default: the end of the history)
    flap_count: int = 3  # an SPU that goes offline this many times ...
    flap_window: float = 600.0  # ... within this many seconds is flapping

    def __post_init__(self) -> None:
        if self.flap_count < 2:
            raise ValueError(f"--flap-count {self.flap_count} is too small: an SPU flaps when it goes offline at least twice")
        # Bounded: Spark takes the window in microseconds as a 64-bit number.
        if not 0 < self.flap_window <= MAX_FLAP_WINDOW:
            raise ValueError(
                f"--flap-window {self.flap_window:g} must be a number of seconds above 0 and at most {MAX_FLAP_WINDOW}"
            )


@dataclass(slots=True)
class Results:
    """What the jobs found, collected on the driver: rows as dicts, times as epoch microseconds."""

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)  # records, first/last time, gaps
    balance_at_us: int = 0


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The report's arguments: `sc audit report`'s, and the spark-submit entry point's (controller/audit/jobs.py)."""
    parser.add_argument(
        "--history",
        type=Path,
        required=True,
        action="append",
        help="the exported history (sc audit export --out DIR); again for each SC of the store, to audit their histories as one",
    )
    parser.add_argument("--out", type=Path, required=True, help="where the report goes (created if absent)")
    parser.add_argument("--master", help="Spark master: local[*] (the default here), spark://host:7077, ...")
    parser.add_argument("--at", help="placement balance at this ISO 8601 time (default: the end of the history)")
    parser.add_argument("--flap-count", type=int, default=3, help="offline transitions that make an SPU flapping (default 3)")
    parser.add_argument("--flap-window", type=float, default=600.0, help="... within this many seconds (default 600)")
