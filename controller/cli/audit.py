"""`sc audit export|report`: argument parsing and exit codes only.

Imports nothing heavy at load time (`sc run` loads this module): pyarrow only in `export`, and
pyspark only in `report`, each inside its handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from controller.audit import options


def register(audit: argparse.ArgumentParser) -> None:
    verbs = audit.add_subparsers(dest="audit_command", metavar="VERB", required=True)

    export = verbs.add_parser(
        "export",
        help="the history as Parquet, partitioned by date and kind (appends what is new)",
        description="Export the SC's metadata history to a Parquet dataset (schema: docs/history-schema.md). "
        "Exporting again into the same --out appends only the records it does not hold yet.",
    )
    export.add_argument("--history-dir", type=Path, default=Path("./sc-data/history"), help="the SC's history (default ./sc-data/history)")
    export.add_argument("--out", type=Path, required=True, help="the dataset directory (created if absent)")
    export.add_argument("--since", help="only records at or after this ISO 8601 time (older ones are passed over for good)")
    export.add_argument("--until", help="stop at the first record at or after this ISO 8601 time (a later export goes on from there)")
    export.set_defaults(handler=handle_export)

    report = verbs.add_parser(
        "report",
        help="run the Spark audit jobs over an exported history",
        description="Leader changes, unavailability, provisioning latency, SPU intervals, placement balance and "
        "spec changes: report.json, report.md with PNG charts, and Parquet tables under --out.",
    )
    options.add_report_arguments(report)
    report.set_defaults(handler=handle_report)


def handle_export(args: argparse.Namespace) -> int:
    from controller.audit import export
    from store import history

    try:
        since = export.parse_time(args.since) if args.since else None
        until = export.parse_time(args.until) if args.until else None
        result = export.export(args.history_dir, args.out, since, until)
    except (export.ExportError, history.HistoryError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json()))
    for record in result.malformed:
        print(f"warning: history record {record.seq} skipped: it {record.reason}", file=sys.stderr)
    unlisted = result.malformed_records - len(result.malformed)
    if unlisted:
        print(f"warning: {unlisted} more malformed history records skipped", file=sys.stderr)
    return 0


def handle_report(args: argparse.Namespace) -> int:
    from controller.audit import jobs  # pyspark: only here

    return jobs.report_command(args, default_master="local[*]")
