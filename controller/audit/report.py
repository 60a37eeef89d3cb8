"""The audit report: report.json (the shape ../shared/API.md promises), Parquet tables, and report.md
with PNG charts. Formats what controller.audit.jobs collected; no Spark here.
"""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from controller.audit import options

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_TIME = pa.timestamp("us", tz="UTC")
# The cause of a leader change that no election of the SC explains: another program wrote the
# partition, or (UNKNOWN) a gap of the history covers it. report.json's leaderChanges keeps to the
# SC's causes, as API.md promises; these are listed apart, in externalLeaderChanges.
EXTERNAL = "external"
UNKNOWN = "unknown"
NOT_BY_SC = (EXTERNAL, UNKNOWN)
# Rows shown per table in report.md; every row is in the Parquet tables and report.json.
MARKDOWN_ROWS = 50
# Series drawn per chart (the busiest ones), so that a chart of a large cluster stays legible.
CHART_SERIES = 20

# Each table's columns; a column ending in _us holds epoch microseconds and is written as a UTC
# timestamp without the suffix.
TABLES: dict[str, list[tuple[str, pa.DataType]]] = {
    "leader_changes": [
        ("partition", pa.string()), ("topic", pa.string()), ("from_spu", pa.int32()), ("to_spu", pa.int32()),
        ("cause", pa.string()), ("at_us", _TIME), ("revision", pa.int64()),
    ],
    "leader_changes_by_spu": [("spu", pa.int32()), ("cause", pa.string()), ("gained", pa.int64()), ("lost", pa.int64())],
    "unavailability": [
        ("partition", pa.string()), ("topic", pa.string()), ("start_us", _TIME), ("end_us", _TIME), ("seconds", pa.float64()),
    ],
    "unavailability_by_topic": [
        ("topic", pa.string()), ("windows", pa.int64()), ("p50", pa.float64()), ("p99", pa.float64()),
        ("max", pa.float64()), ("total", pa.float64()),
    ],
    "provisioning": [("topic", pa.string()), ("created_us", _TIME), ("provisioned_us", _TIME), ("seconds", pa.float64())],
    "spu_intervals": [
        ("spu", pa.int32()), ("state", pa.string()), ("start_us", _TIME), ("end_us", _TIME), ("seconds", pa.float64()),
    ],
    "flapping_spus": [("spu", pa.int32()), ("offline_count", pa.int64()), ("max_in_window", pa.int64())],
    "balance_spus": [("spu", pa.int32()), ("rack", pa.string()), ("replicas", pa.int64()), ("leaders", pa.int64())],
    "balance_racks": [("rack", pa.string()), ("replicas", pa.int64()), ("leaders", pa.int64()), ("spus", pa.int64())],
    "rack_violations": [
        ("partition", pa.string()), ("topic", pa.string()), ("replicas", pa.list_(pa.int32())),
        ("racks", pa.list_(pa.string())), ("distinct_racks", pa.int64()), ("required_racks", pa.int32()),
    ],
    "spec_changes": [
        ("history", pa.string()), ("seq", pa.int64()), ("kind", pa.string()), ("name", pa.string()), ("op", pa.string()), ("at_us", _TIME),
        ("revision", pa.int64()), ("by", pa.string()), ("address", pa.string()),
    ],
    # history: the id of the history holding the record (an audit may cover several SCs' histories).
    "gaps": [
        ("history", pa.string()), ("seq", pa.int64()), ("at_us", _TIME), ("first_revision", pa.int64()), ("last_revision", pa.int64()),
        ("reason", pa.string()), ("dropped", pa.int64()),
    ],
    "leaders_over_time": [("bucket_us", _TIME), ("spu", pa.int32()), ("leaders", pa.int64())],
    "moves": [
        ("partition", pa.string()), ("topic", pa.string()), ("outcome", pa.string()), ("arrived", pa.list_(pa.int32())),
        ("left", pa.list_(pa.int32())), ("started_us", _TIME), ("at_us", _TIME), ("seconds", pa.float64()),
        ("records", pa.int64()),
    ],
    "moves_by_spu": [
        ("spu", pa.int32()), ("moves_in", pa.int64()), ("moves_out", pa.int64()), ("records_in", pa.int64()),
        ("records_out", pa.int64()),
    ],
    # A partition's uid written over in place (the SC never changes one): another partition to its SPUs.
    "identity_changes": [
        ("partition", pa.string()), ("revision", pa.int64()), ("at_us", _TIME), ("from_uid", pa.int64()), ("to_uid", pa.int64()),
    ],
    # Each SC's terms as its store's leader: a takeover (cause: what became of the claim before it)
    # or a step-down (cause: why the term ended), as the SC that recorded the history saw them.
    "sc_terms": [
        ("history", pa.string()), ("seq", pa.int64()), ("at_us", _TIME), ("event", pa.string()), ("sc", pa.string()), ("address", pa.string()),
        ("epoch", pa.int64()), ("cause", pa.string()), ("previous", pa.string()), ("previous_epoch", pa.int64()),
    ],
}


def iso(micros: int | None) -> str | None:
    """ISO 8601 UTC with microseconds, e.g. 2026-03-01T10:02:00.250000Z (None stays None)."""
    if micros is None:
        return None
    return (_EPOCH + datetime.timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def to_json(results: options.Results) -> dict[str, Any]:
    """report.json: the keys API.md lists, exactly, then extra keys (API.md: extend freely)."""
    tables = results.tables
    balance_spus = tables["balance_spus"]
    leader_changes = [
        {"partition": row["partition"], "from": row["from_spu"], "to": row["to_spu"], "cause": row["cause"], "at": iso(row["at_us"])}
        for row in tables["leader_changes"]
    ]
    return {
        "leaderChanges": [change for change in leader_changes if change["cause"] not in NOT_BY_SC],
        "unavailability": [
            {"partition": row["partition"], "start": iso(row["start_us"]), "end": iso(row["end_us"]), "seconds": _seconds(row["seconds"])}
            for row in tables["unavailability"]
        ],
        "provisioning": [
            {
                "topic": row["topic"], "created": iso(row["created_us"]), "provisioned": iso(row["provisioned_us"]),
                "seconds": _seconds(row["seconds"]),
            }
            for row in tables["provisioning"]
        ],
        "spuIntervals": [
            {"spu": row["spu"], "state": row["state"], "start": iso(row["start_us"]), "end": iso(row["end_us"])}
            for row in tables["spu_intervals"]
        ],
        "balance": {
            "at": iso(results.balance_at_us),
            "replicasPerSpu": {str(row["spu"]): row["replicas"] for row in balance_spus},
            "leadersPerSpu": {str(row["spu"]): row["leaders"] for row in balance_spus},
            "replicasPerRack": {row["rack"]: row["replicas"] for row in tables["balance_racks"]},
            "rackViolations": [
                {"partition": row["partition"], "replicas": row["replicas"], "racks": row["racks"]}
                for row in tables["rack_violations"]
            ],
        },
        "specChanges": [
            {"kind": row["kind"], "name": row["name"], "op": row["op"], "at": iso(row["at_us"]), "by": row["by"]}
            for row in tables["spec_changes"]
        ],
        # Extensions.
        "unavailabilityByTopic": [
            {
                "topic": row["topic"], "windows": row["windows"], "p50": _seconds(row["p50"]), "p99": _seconds(row["p99"]),
                "max": _seconds(row["max"]),
            }
            for row in tables["unavailability_by_topic"]
        ],
        "externalLeaderChanges": [change for change in leader_changes if change["cause"] in NOT_BY_SC],
        "leaderChangesBySpu": [
            {"spu": row["spu"], "cause": row["cause"], "gained": row["gained"], "lost": row["lost"]}
            for row in tables["leader_changes_by_spu"]
        ],
        "moves": [
            {
                "partition": row["partition"], "outcome": row["outcome"], "arrived": row["arrived"], "left": row["left"],
                "started": iso(row["started_us"]), "at": iso(row["at_us"]), "seconds": _seconds(row["seconds"]),
                "records": row["records"],
            }
            for row in tables["moves"]
        ],
        "movesBySpu": [
            {
                "spu": row["spu"], "movesIn": row["moves_in"], "movesOut": row["moves_out"], "recordsIn": row["records_in"],
                "recordsOut": row["records_out"],
            }
            for row in tables["moves_by_spu"]
        ],
        "identityChanges": [
            {"partition": row["partition"], "revision": row["revision"], "at": iso(row["at_us"]), "from": row["from_uid"], "to": row["to_uid"]}
            for row in tables["identity_changes"]
        ],
        "flappingSpus": [
            {"spu": row["spu"], "offlineCount": row["offline_count"], "maxInWindow": row["max_in_window"]}
            for row in tables["flapping_spus"]
        ],
        "gaps": [
            {
                "at": iso(row["at_us"]), "firstRevision": row["first_revision"], "lastRevision": row["last_revision"],
                "reason": row["reason"], "dropped": row["dropped"], "history": row["history"],
            }
            for row in tables["gaps"]
        ],
        "scTerms": [
            {
                "event": row["event"], "sc": row["sc"], "address": row["address"], "epoch": row["epoch"],
                "cause": row["cause"], "previous": row["previous"], "previousEpoch": row["previous_epoch"],
                "at": iso(row["at_us"]), "history": row["history"],
            }
            for row in tables["sc_terms"]
        ],
        "takeovers": sum(1 for row in tables["sc_terms"] if row["event"] == "takeover"),
        "history": {
            "records": results.history["records"], "from": iso(results.history["first_us"]),
            "to": iso(results.history["last_us"]), "histories": results.history.get("histories", []),
        },
    }


def table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    """One result table as Arrow, with its documented column names and types."""
    columns = TABLES[name]
    arrays, fields = [], []
    for column, data_type in columns:
        arrays.append(pa.array([row[column] for row in rows], type=data_type))
        fields.append(pa.field(column.removesuffix("_us"), data_type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write(results: options.Results, out: Path) -> list[Path]:
    """report.json, tables/<name>.parquet, charts/*.png and report.md under ``out``; the paths written."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "charts").mkdir(parents=True, exist_ok=True)
    written = []
    report_json = out / "report.json"
    report_json.write_text(json.dumps(to_json(results), indent=2) + "\n")
    written.append(report_json)
    for name, rows in results.tables.items():
        path = out / "tables" / f"{name}.parquet"
        pq.write_table(table(name, rows), path)
        written.append(path)
    charts = _charts(results, out / "charts")
    written += charts
    markdown = out / "report.md"
    markdown.write_text(to_markdown(results, [path.name for path in charts]))
    written.append(markdown)
    return written


# ---------------------------------------------------------------------------- the human report


def _histories(ids: list[str]) -> str:
    """The end of the report's first line: which histories it covers, when more than one."""
    if len(ids) < 2:
        return "."
    return f", merged from {len(ids)} SCs' histories ({', '.join(ids)}): a change more than one recorded counts once."


def to_markdown(results: options.Results, charts: list[str]) -> str:
    tables, summary = results.tables, results.history
    lines = [
        "# SC metadata audit",
        "",
        f"History: {summary['records']} records from {iso(summary['first_us'])} to {iso(summary['last_us'])}"
        + _histories(summary.get("histories", [])),
        "Every table is also in `tables/<name>.parquet`; `report.json` holds the same figures for scripts.",
        "",
    ]
    several = len(summary.get("histories", [])) > 1
    if tables["gaps"]:
        lines += ["**The history has gaps**: figures that span them may be incomplete.", ""]
        columns = ["at_us", "first_revision", "last_revision", "reason", "dropped"]
        lines += _markdown_table(tables["gaps"], columns + ["history"] if several else columns)

    takeovers = [row for row in tables["sc_terms"] if row["event"] == "takeover"]
    recorded = "the SCs whose histories this report covers" if several else "the SC that recorded this history"
    lines += ["## SC leadership", "", f"{len(takeovers)} takeover(s) by {recorded}.", ""]
    columns = ["at_us", "event", "sc", "address", "epoch", "cause", "previous", "previous_epoch"]
    lines += _markdown_table(tables["sc_terms"], columns + ["history"] if several else columns)

    lines += ["## Leader changes", ""]
    lines += _markdown_table(tables["leader_changes"], ["at_us", "partition", "from_spu", "to_spu", "cause"])
    lines += ["Per SPU:", ""]
    lines += _markdown_table(tables["leader_changes_by_spu"], ["spu", "cause", "gained", "lost"])
    lines += _image(charts, "leaders_per_spu.png", "Leaders per SPU over time")

    lines += ["## Partition unavailability (no leader, LeaderOffline)", ""]
    lines += _markdown_table(tables["unavailability_by_topic"], ["topic", "windows", "p50", "p99", "max", "total"])
    lines += _markdown_table(tables["unavailability"], ["partition", "start_us", "end_us", "seconds"])
    lines += _image(charts, "availability.png", "Unavailability windows per topic")

    lines += ["## Topic provisioning latency (created to Provisioned)", ""]
    lines += _markdown_table(tables["provisioning"], ["topic", "created_us", "provisioned_us", "seconds"])

    lines += ["## SPU online and offline intervals", ""]
    lines += ["Flapping SPUs:", ""]
    lines += _markdown_table(tables["flapping_spus"], ["spu", "offline_count", "max_in_window"])
    lines += _markdown_table(tables["spu_intervals"], ["spu", "state", "start_us", "end_us", "seconds"])

    lines += [f"## Placement balance at {iso(results.balance_at_us)}", ""]
    lines += _markdown_table(tables["balance_spus"], ["spu", "rack", "replicas", "leaders"])
    lines += _markdown_table(tables["balance_racks"], ["rack", "spus", "replicas", "leaders"])
    lines += _image(charts, "replicas_per_rack.png", "Replicas per rack")
    lines += _image(charts, "replicas_per_spu.png", "Replicas and leaders per SPU")
    lines += ["Rack violations (replicas sharing a rack although enough racks existed):", ""]
    lines += _markdown_table(tables["rack_violations"], ["partition", "replicas", "racks", "distinct_racks", "required_racks"])

    lines += ["## Replica moves (rebalance, decommission)", ""]
    lines += ["Per SPU (completed moves):", ""]
    lines += _markdown_table(tables["moves_by_spu"], ["spu", "moves_in", "moves_out", "records_in", "records_out"])
    lines += ["Each move (records: what each arriving replica copied; – unknown):", ""]
    lines += _markdown_table(tables["moves"], ["at_us", "partition", "outcome", "arrived", "left", "seconds", "records"])

    lines += ["## Partition identity edits (a uid changed in place)", ""]
    lines += ["Each is another partition to its SPUs, which drop their logs of it (the SC never changes a uid):", ""]
    lines += _markdown_table(tables["identity_changes"], ["at_us", "partition", "from_uid", "to_uid", "revision"])

    lines += ["## Spec changes", ""]
    lines += _markdown_table(tables["spec_changes"], ["at_us", "kind", "name", "op", "by", "revision"])
    return "\n".join(lines) + "\n"


def _markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    if not rows:
        return ["None.", ""]
    header = [column.removesuffix("_us") for column in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns)]
    for row in rows[:MARKDOWN_ROWS]:
        lines.append("| " + " | ".join(_cell(column, row[column]) for column in columns) + " |")
    if len(rows) > MARKDOWN_ROWS:
        lines.append(f"\n{len(rows) - MARKDOWN_ROWS} more rows in the Parquet table.")
    return lines + [""]


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "–" if not column.startswith("end") else "(open)"
    if column.endswith("_us"):
        return iso(value) or ""
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ", ".join("–" if item is None else str(item) for item in value)
    return str(value)


def _image(charts: list[str], name: str, title: str) -> list[str]:
    return [f"![{title}](charts/{name})", ""] if name in charts else []


# ---------------------------------------------------------------------------- charts


def _charts(results: options.Results, directory: Path) -> list[Path]:
    """PNG charts of what has data: availability per topic, leaders per SPU over time, replicas per
    rack and per SPU."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import dates as mdates
    from matplotlib import pyplot as plt

    tables = results.tables
    written: list[Path] = []

    def save(figure: Any, name: str) -> None:
        path = directory / name
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)

    def when(micros: int) -> datetime.datetime:
        return _EPOCH + datetime.timedelta(microseconds=micros)

    windows = tables["unavailability"]
    if windows:
        totals: dict[str, float] = defaultdict(float)
        for row in windows:
            totals[row["topic"]] += row["seconds"]
        topics = sorted(totals, key=lambda topic: (-totals[topic], topic))[:CHART_SERIES]
        last = results.history["last_us"]
        figure, axes = plt.subplots(figsize=(10, 1.5 + 0.4 * len(topics)))
        for position, topic_name in enumerate(topics):
            spans = [
                (mdates.date2num(when(row["start_us"])), (row["end_us"] or last) / 86_400e6 - row["start_us"] / 86_400e6)
                for row in windows
                if row["topic"] == topic_name
            ]
            axes.broken_barh(spans, (position - 0.4, 0.8), color="tab:red")
        axes.set_yticks(range(len(topics)), topics)
        axes.xaxis_date()
        axes.set_title("Partition unavailability per topic (red: some partition had no serving leader)")
        save(figure, "availability.png")

    timeline = tables["leaders_over_time"]
    if timeline:
        series: dict[int, list[tuple[datetime.datetime, int]]] = defaultdict(list)
        for row in timeline:
            series[row["spu"]].append((when(row["bucket_us"]), row["leaders"]))
        busiest = sorted(series, key=lambda spu: (-max(count for _, count in series[spu]), spu))[:CHART_SERIES]
        figure, axes = plt.subplots(figsize=(10, 5))
        end = when(results.history["last_us"])
        for spu in sorted(busiest):
            points = series[spu] + [(end, series[spu][-1][1])]  # the last count holds to the end
            axes.step([point[0] for point in points], [point[1] for point in points], where="post", label=f"SPU {spu}")  # type: ignore[arg-type]  # matplotlib converts datetimes; its stubs name arrays only
        axes.set_ylabel("partitions led")
        axes.set_title("Leaders per SPU over time")
        axes.legend(fontsize="small", ncol=2)
        save(figure, "leaders_per_spu.png")

    racks = tables["balance_racks"]
    if racks:
        figure, axes = plt.subplots(figsize=(max(4, 0.6 * len(racks) + 2), 4))
        axes.bar([row["rack"] for row in racks], [row["replicas"] for row in racks], color="tab:blue")
        axes.set_ylabel("replicas")
        axes.set_title(f"Replicas per rack at {iso(results.balance_at_us)}")
        save(figure, "replicas_per_rack.png")

    spus = tables["balance_spus"]
    if spus:
        labels = [str(row["spu"]) for row in spus]
        figure, axes = plt.subplots(figsize=(max(4, 0.35 * len(spus) + 2), 4))
        positions = range(len(spus))
        axes.bar([p - 0.2 for p in positions], [row["replicas"] for row in spus], width=0.4, label="replicas")
        axes.bar([p + 0.2 for p in positions], [row["leaders"] for row in spus], width=0.4, label="leaders")
        axes.set_xticks(list(positions), labels)
        axes.set_xlabel("SPU")
        axes.legend()
        axes.set_title(f"Replicas and leaders per SPU at {iso(results.balance_at_us)}")
        save(figure, "replicas_per_spu.png")
    return written
