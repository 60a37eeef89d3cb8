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
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.json as pajson

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
    reader = history.HistoryReader(history_dir)
    rows = files = 0
    first_seq: int | None = None
    last_seq = after_seq
    for payloads in _batches(reader.payloads(after_seq), chunk_rows):
        table = to_table(payloads)
        times = table.column("time").cast(pa.int64())
        if until is not None:
            beyond = pc.greater_equal(times, micros(until))
            if pc.any(beyond).as_py():
                cut = pc.index(beyond, True).as_py()
                table, times = table.slice(0, cut), times.slice(0, cut)
                payloads = []  # nothing after the cut is read
        if table.num_rows:
            last_seq = table.column("seq")[-1].as_py()
        if since is not None:
            table = table.filter(pc.greater_equal(times, micros(since)))
        if table.num_rows:
            first_seq = first_seq if first_seq is not None else table.column("seq")[0].as_py()
            files += _write_chunk(table, out)
            rows += table.num_rows
        if until is not None and not payloads:
            break
    _write_state(out, history_id, last_seq)
    problems = [f"{problem.segment}@{problem.offset}" for problem in reader.problems]
    return ExportResult(rows, first_seq, last_seq, files, time.monotonic() - started, problems)


def _batches(payloads: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for payload in payloads:
        batch.append(payload)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


# How the history's JSON records are read (C++ parsing; nested fields other than these are ignored).
_RECORD_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()), ("type", pa.string()), ("time", pa.int64()), ("kind", pa.string()),
        ("name", pa.string()), ("op", pa.string()), ("revision", pa.int64()), ("source", pa.string()),
        ("snapshotRevision", pa.int64()), ("verb", pa.string()), ("reason", pa.string()), ("cause", pa.string()),
        ("causeRevision", pa.int64()), ("outcome", pa.string()), ("keys", pa.list_(pa.string())),
        ("detail", pa.string()), ("firstRevision", pa.int64()), ("lastRevision", pa.int64()),
        ("dropped", pa.int64()), ("snapshot", pa.bool_()),
        (
            "object",
            pa.struct(
                [
                    (
                        "spec",
                        pa.struct(
                            [
                                ("id", pa.int32()), ("rack", pa.string()), ("leader", pa.int32()),
                                ("replicas", pa.list_(pa.int32())), ("ignoreRackAssignment", pa.bool_()),
                            ]
                        ),
                    ),
                    (
                        "status",
                        pa.struct([("resolution", pa.string()), ("reason", pa.string()), ("leader", pa.struct([("spu", pa.int32())]))]),
                    ),
                ]
            ),
        ),
    ]
)
_PARSE = pajson.ParseOptions(explicit_schema=_RECORD_SCHEMA, unexpected_field_behavior="ignore")


def to_table(payloads: list[bytes]) -> pa.Table:
    """The dataset's rows for ``payloads`` (the history's JSON records, in order)."""
    data = b"\n".join(payloads) + b"\n"
    block = max(1 << 20, 2 * max(len(payload) for payload in payloads))
    parsed = pajson.read_json(
        pa.BufferReader(data), read_options=pajson.ReadOptions(block_size=block), parse_options=_PARSE
    )
    column = parsed.column
    record_type = column("type")
    unknown = pc.invert(pc.is_in(record_type, pa.array([history.CHANGE, history.ACTION, history.GAP, history.SYNC])))
    if pc.any(unknown).as_py():
        bad = parsed.filter(unknown)
        raise ExportError(
            f"history record {bad.column('seq')[0].as_py()} has an unknown type {bad.column('type')[0].as_py()!r}"
        )
    is_change = pc.equal(record_type, history.CHANGE)
    is_gap = pc.equal(record_type, history.GAP)
    obj = column("object")
    spec, status = pc.struct_field(obj, "spec"), pc.struct_field(obj, "status")
    kinds = column("kind")

    def for_kind(kind: str, values: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.if_else(pc.equal(kinds, kind), values, pa.scalar(None, values.type))

    spec_texts, status_texts = zip(*map(_spec_and_status, payloads)) if payloads else ((), ())
    timestamps = column("time").cast(pa.timestamp("us", tz="UTC"))
    columns = {
        "seq": column("seq"),
        "type": record_type,
        "time": timestamps,
        "revision": pc.if_else(is_gap, column("lastRevision"), column("revision")),
        "name": column("name"),
        "op": pc.if_else(is_change, column("op"), pa.scalar(None, pa.string())),
        "source": column("source"),
        "snapshot_revision": column("snapshotRevision"),
        "spec": pa.array(spec_texts, pa.string()),
        "status": pa.array(status_texts, pa.string()),
        "resolution": pc.struct_field(status, "resolution"),
        "reason": pc.if_else(is_change, pc.struct_field(status, "reason"), column("reason")),
        "spu_id": for_kind("spus", pc.struct_field(spec, "id")),
        "rack": for_kind("spus", pc.struct_field(spec, "rack")),
        "leader": for_kind("partitions", pc.struct_field(spec, "leader")),
        "replicas": for_kind("partitions", pc.struct_field(spec, "replicas")),
        "status_leader": for_kind("partitions", pc.struct_field(pc.struct_field(status, "leader"), "spu")),
        "ignore_rack_assignment": pc.if_else(
            pc.and_(pc.equal(kinds, "topics"), pc.is_valid(spec)),
            pc.fill_null(pc.struct_field(spec, "ignoreRackAssignment"), False),
            pa.scalar(None, pa.bool_()),
        ),
        "verb": column("verb"),
        "cause": _empty_as_null(column("cause")),
        "cause_revision": column("causeRevision"),
        "outcome": column("outcome"),
        "keys": column("keys"),
        "detail": _empty_as_null(column("detail")),
        "first_revision": column("firstRevision"),
        "dropped": column("dropped"),
        "snapshot": column("snapshot"),
        "date": pc.strftime(timestamps, format="%Y-%m-%d"),
        "kind": pc.fill_null(kinds, HISTORY_KIND),
    }
    return pa.table(columns).cast(SCHEMA)


def _empty_as_null(values: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)


def _spec_and_status(payload: bytes) -> tuple[str | None, str | None]:
    """A change record's spec and status as JSON text, cut from the stored object without parsing it
    when it has the SC's own layout ({"name":..,"spec":{..},"status":{..}}), else re-encoded."""
    start = payload.find(b',"object":{')
    if start < 0:
        return None, None  # not a change, or a delete
    obj = payload[start + 10 : -1]
    spec_at = obj.find(b'"spec":')
    status_at = obj.rfind(b',"status":')
    if obj.startswith(b'{"name":"') and 0 < spec_at < status_at and obj.endswith(b"}"):
        return obj[spec_at + 7 : status_at].decode(), obj[status_at + 10 : -1].decode()
    parsed = json.loads(obj)  # written by another program in another layout
    return (
        json.dumps(parsed.get("spec"), separators=(",", ":")),
        json.dumps(parsed.get("status"), separators=(",", ":")),
    )


def _write_chunk(table: pa.Table, out: Path) -> int:
    written: list[str] = []
    pads.write_dataset(
        table,
        out,
        format="parquet",
        partitioning=PARTITIONING,
        basename_template=f"part-{table.column('seq')[0].as_py():020d}-{{i}}.parquet",
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
