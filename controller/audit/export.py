"""`sc audit export`: the metadata history as a Parquet dataset (pyarrow), partitioned by date and kind.

Incremental: the dataset remembers the last sequence number exported, and exporting again
appends only newer records. The schema is documented in docs/history-schema.md. No Spark here.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads

from store import history

STATE_FILE = "_export_state.json"  # Spark ignores files starting with '_'
HISTORY_KIND = "history"  # the kind partition of gap and sync records (they belong to no object kind)
DEFAULT_CHUNK_ROWS = 200_000

SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("revision", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("op", pa.string()),
        pa.field("source", pa.string()),
        pa.field("snapshot_revision", pa.int64()),
        pa.field("spec", pa.string()),
        pa.field("status", pa.string()),
        pa.field("resolution", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("spu_id", pa.int32()),
        pa.field("rack", pa.string()),
        pa.field("leader", pa.int32()),
        pa.field("replicas", pa.list_(pa.int32())),
        pa.field("status_leader", pa.int32()),
        pa.field("ignore_rack_assignment", pa.bool_()),
        pa.field("verb", pa.string()),
        pa.field("cause", pa.string()),
        pa.field("cause_revision", pa.int64()),
        pa.field("outcome", pa.string()),
        pa.field("keys", pa.list_(pa.string())),
        pa.field("detail", pa.string()),
        pa.field("first_revision", pa.int64()),
        pa.field("dropped", pa.int64()),
        pa.field("snapshot", pa.bool_()),
        pa.field("date", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
    ]
)
PARTITIONING = pads.partitioning(pa.schema([SCHEMA.field("date"), SCHEMA.field("kind")]), flavor="hive")


class ExportError(Exception):
    """The export cannot proceed; the message names the offending value and what to do."""


@dataclass(frozen=True, slots=True)
class ExportResult:
    rows: int
    first_seq: int | None
    last_seq: int  # the last sequence number considered (exported, or before --since)
    files: int
    seconds: float
    corrupt_segments: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "firstSeq": self.first_seq, "lastSeq": self.last_seq, "files": self.files,
            "seconds": round(self.seconds, 3), "corruptSegments": self.corrupt_segments,
        }


def parse_time(text: str) -> datetime.datetime:
    """An ISO 8601 time (``2026-03-01``, ``2026-03-01T10:02:00Z``, with an offset); naive means UTC."""
    try:
        value = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ExportError(f"time {text!r} is not ISO 8601: write it like 2026-03-01T10:02:00Z") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def micros(value: datetime.datetime) -> int:
    """Microseconds since the epoch, exactly (the history's time unit)."""
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


def export(
    history_dir: Path,
    out: Path,
    since: datetime.datetime | None = None,
    until: datetime.datetime | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> ExportResult:
    """Append to the dataset at ``out`` the records of ``history_dir`` it does not hold yet.

    Only records with ``since <= time < until`` are written; the export stops at the first record at
    or after ``until`` (a later export goes on from there), while records before ``since`` are
    passed over for good. Safe to re-run after a crash: files are named after their first sequence
    number and overwritten, and the state file is replaced only once the data is written.
    """
    started = time.monotonic()
    history_id = history.read_history_id(history_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = _read_state(out)
    if state and state["historyId"] != history_id:
        raise ExportError(
            f"{str(out)!r} holds an export of another history (id {state['historyId']}, this one is "
            f"{history_id}): export into an empty directory"
        )
    after_seq = state["lastSeq"] if state else 0
    since_us = micros(since) if since is not None else None
    until_us = micros(until) if until is not None else None
    reader = history.HistoryReader(history_dir)
    rows = files = 0
    first_seq: int | None = None
    last_seq = after_seq
    for chunk in _chunks(_selected(reader.records(after_seq), since_us, until_us), chunk_rows):
        records, chunk_last = chunk
        last_seq = chunk_last
        if not records:
            continue
        first_seq = first_seq if first_seq is not None else records[0]["seq"]
        files += _write_chunk(records, out)
        rows += len(records)
    _write_state(out, history_id, last_seq)
    problems = [f"{problem.segment}@{problem.offset}" for problem in reader.problems]
    return ExportResult(rows, first_seq, last_seq, files, time.monotonic() - started, problems)


def _selected(
    records: Iterable[dict[str, Any]], since_us: int | None, until_us: int | None
) -> Iterator[tuple[dict[str, Any] | None, int]]:
    """(record or None if before --since, its seq), stopping at the first record at/after --until."""
    for record in records:
        if until_us is not None and record["time"] >= until_us:
            return
        keep = since_us is None or record["time"] >= since_us
        yield (record if keep else None), record["seq"]


def _chunks(
    selected: Iterable[tuple[dict[str, Any] | None, int]], chunk_rows: int
) -> Iterator[tuple[list[dict[str, Any]], int]]:
    chunk: list[dict[str, Any]] = []
    last_seq = 0
    for record, seq in selected:
        last_seq = seq
        if record is not None:
            chunk.append(record)
            if len(chunk) >= chunk_rows:
                yield chunk, last_seq
                chunk = []
    if chunk or last_seq:
        yield chunk, last_seq


def to_columns(records: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The dataset's columns for ``records`` (the history's JSON records, in order)."""
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    dumps = json.dumps
    for record in records:
        record_type = record["type"]
        row: dict[str, Any] = dict.fromkeys(SCHEMA.names)
        row["seq"], row["type"], row["time"] = record["seq"], record_type, record["time"]
        row["date"] = datetime.datetime.fromtimestamp(record["time"] / 1_000_000, datetime.UTC).strftime("%Y-%m-%d")
        if record_type == history.CHANGE:
            kind = record["kind"]
            row.update(
                kind=kind, name=record["name"], op=record["op"], revision=record["revision"],
                source=record["source"], snapshot_revision=record.get("snapshot"),
            )
            obj = record["object"]
            if obj is not None:
                spec, status = obj.get("spec") or {}, obj.get("status") or {}
                row["spec"] = dumps(spec, separators=(",", ":"))
                row["status"] = dumps(status, separators=(",", ":"))
                row["resolution"] = status.get("resolution")
                row["reason"] = status.get("reason")
                if kind == "spus":
                    row["spu_id"], row["rack"] = spec.get("id"), spec.get("rack")
                elif kind == "partitions":
                    row["leader"], row["replicas"] = spec.get("leader"), spec.get("replicas")
                    status_leader = status.get("leader")
                    row["status_leader"] = status_leader.get("spu") if status_leader else None
                elif kind == "topics":
                    row["ignore_rack_assignment"] = bool(spec.get("ignoreRackAssignment", False))
        elif record_type == history.ACTION:
            row.update(
                kind=record["kind"], name=record["name"], verb=record["verb"], reason=record["reason"],
                cause=record["cause"] or None, cause_revision=record["causeRevision"], outcome=record["outcome"],
                revision=record["revision"], keys=record["keys"], detail=record["detail"] or None,
            )
        elif record_type == history.GAP:
            row.update(
                kind=HISTORY_KIND, first_revision=record["firstRevision"], revision=record["lastRevision"],
                reason=record["reason"], dropped=record["dropped"],
            )
        elif record_type == history.SYNC:
            row.update(kind=HISTORY_KIND, revision=record["revision"], snapshot=record["snapshot"])
        else:
            raise ExportError(f"history record {record['seq']} has an unknown type {record_type!r}")
        for name, value in row.items():
            columns[name].append(value)
    return columns


def _write_chunk(records: list[dict[str, Any]], out: Path) -> int:
    table = pa.Table.from_pydict(to_columns(records), schema=SCHEMA)
    written: list[str] = []
    pads.write_dataset(
        table,
        out,
        format="parquet",
        partitioning=PARTITIONING,
        basename_template=f"part-{records[0]['seq']:020d}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=lambda written_file: written.append(written_file.path),
    )
    return len(written)


def _read_state(out: Path) -> dict[str, Any] | None:
    path = out / STATE_FILE
    if not path.exists():
        if any(out.iterdir()):
            raise ExportError(f"{str(out)!r} is not empty and holds no {STATE_FILE}: export into an empty directory")
        return None
    try:
        state = json.loads(path.read_text())
        return {"historyId": str(state["historyId"]), "lastSeq": int(state["lastSeq"])}
    except (ValueError, KeyError, TypeError) as error:
        raise ExportError(f"{str(path)!r} is damaged ({error}): export into an empty directory") from None


def _write_state(out: Path, history_id: str, last_seq: int) -> None:
    path = out / STATE_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"historyId": history_id, "lastSeq": last_seq}) + "\n")
    os.replace(temporary, path)
