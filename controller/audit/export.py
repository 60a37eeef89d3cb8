"""`sc audit export`: the metadata history as a Parquet dataset (pyarrow), partitioned by date and kind.

Incremental: the dataset remembers the last sequence number exported, and exporting again
appends only newer records. The schema is documented in docs/history-schema.md. No Spark here.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.json as pajson

from controller.api import json_input
from store import history, models

STATE_FILE = "_export_state.json"  # Spark ignores files starting with '_'
HISTORY_KIND = "history"  # the kind partition of the records that belong to no object kind (gap, sync, SC terms)
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
        pa.field("uid", pa.int64()),
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
        # Request records: who asked for the write at ``revision`` (a principal), and from where.
        pa.field("by", pa.string()),
        pa.field("address", pa.string()),
        pa.field("date", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
    ]
)
PARTITIONING = pads.partitioning(pa.schema([SCHEMA.field("date"), SCHEMA.field("kind")]), flavor="hive")


class ExportError(Exception):
    """The export cannot proceed; the message names the offending value and what to do."""


@dataclass(frozen=True, slots=True, order=True)
class MalformedRecord:
    seq: int
    reason: str  # e.g. "is not valid JSON: ..." (reads after "history record <seq>")


@dataclass(frozen=True, slots=True)
class ExportResult:
    rows: int
    first_seq: int | None
    last_seq: int  # the last sequence number considered (exported, or before --since)
    files: int
    seconds: float
    corrupt_segments: list[str]
    malformed_records: int = 0  # records skipped because they cannot be exported
    malformed: list[MalformedRecord] = field(default_factory=list)  # the first MALFORMED_LISTED of them

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "firstSeq": self.first_seq, "lastSeq": self.last_seq, "files": self.files,
            "seconds": round(self.seconds, 3), "corruptSegments": self.corrupt_segments,
            "malformedRecords": self.malformed_records,
            "malformed": [{"seq": record.seq, "reason": record.reason} for record in self.malformed],
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
    rows = files = malformed_records = 0
    malformed: list[MalformedRecord] = []
    first_seq: int | None = None
    last_seq = after_seq
    for records in _batches(reader.numbered_payloads(after_seq), chunk_rows):
        table, skipped = to_table(records)
        considered = records[-1][0]
        times = table.column("time").cast(pa.int64())
        stop = False
        if until is not None:
            beyond = pc.greater_equal(times, micros(until))
            if pc.any(beyond).as_py():
                # Nothing from the first record at or after `until` on is read.
                considered = pc.min(pc.filter(table.column("seq"), beyond)).as_py() - 1
                before = pc.less_equal(table.column("seq"), considered)
                table, times = table.filter(before), times.filter(before)
                skipped = [record for record in skipped if record.seq <= considered]
                stop = True
        last_seq = considered
        malformed_records += len(skipped)
        malformed += skipped[: MALFORMED_LISTED - len(malformed)]
        if since is not None:
            table = table.filter(pc.greater_equal(times, micros(since)))
        if table.num_rows:
            first_seq = first_seq if first_seq is not None else pc.min(table.column("seq")).as_py()
            files += _write_chunk(table, out)
            rows += table.num_rows
        if stop:
            break
    _write_state(out, history_id, last_seq)
    problems = [f"{problem.segment}@{problem.offset}" for problem in reader.problems]
    return ExportResult(
        rows, first_seq, last_seq, files, time.monotonic() - started, problems, malformed_records, malformed
    )


def _batches(records: Iterable[tuple[int, bytes]], size: int) -> Iterator[list[tuple[int, bytes]]]:
    batch: list[tuple[int, bytes]] = []
    for record in records:
        batch.append(record)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


# ---------------------------------------------------------------------------- records to rows
#
# The fast path parses a batch of records in C++ (pyarrow.json), one batch per kind, each kind with
# its own schema: one schema for every kind cannot be, since the same path holds a number in one kind
# and a list in another (an SPU group's spec.replicas, a partition's). The spec and status are cut
# from the stored object as text and parsed again, per kind, for the typed columns: a cut that is
# not exactly the object's spec and status is never valid JSON, so the parse proves the cut.
# A batch that fails is split in two until the failing record is alone; it is then read by
# Python's json (``_slow_row``), which exports any layout and says what is wrong with a record it
# cannot export: malformed records are counted and skipped, never fatal.

RECORD_TYPES = (history.CHANGE, history.ACTION, history.REQUEST, history.GAP, history.SYNC, history.TAKEOVER, history.STEP_DOWN)
# The record types of no object kind: the history's own (gap, sync) and the SC's terms as leader.
_HISTORY_RECORD_TYPES = (history.GAP, history.SYNC, history.TAKEOVER, history.STEP_DOWN)
# The record types that belong to an object (and carry its kind).
_OBJECT_RECORD_TYPES = (history.CHANGE, history.ACTION, history.REQUEST)
OBJECT_KINDS = tuple(models.KINDS)
# Malformed records listed one by one in the result (all of them are counted).
MALFORMED_LISTED = 100

_INT32, _INT64, _STRING, _BOOL = pa.int32(), pa.int64(), pa.string(), pa.bool_()
# Every field of a record the dataset keeps, as the recorder writes it (the object aside).
_RECORD_FIELDS = pa.schema(
    [
        ("seq", _INT64), ("type", _STRING), ("time", _INT64), ("kind", _STRING), ("name", _STRING), ("op", _STRING),
        ("revision", _INT64), ("source", _STRING), ("snapshotRevision", _INT64), ("verb", _STRING),
        ("reason", _STRING), ("cause", _STRING), ("causeRevision", _INT64), ("outcome", _STRING),
        ("keys", pa.list_(_STRING)), ("detail", _STRING), ("firstRevision", _INT64), ("lastRevision", _INT64),
        ("dropped", _INT64), ("snapshot", _BOOL), ("by", _STRING), ("address", _STRING),
    ]
)
# What the typed columns take from each kind's spec and status (the models' camelCase fields; a
# test checks each is a field of its model). The rest stays in the spec and status JSON text.
OBJECT_FIELDS: dict[str, tuple[pa.Schema, pa.Schema]] = {
    "spus": (pa.schema([("id", _INT32), ("rack", _STRING)]), pa.schema([("resolution", _STRING)])),
    "spu-groups": (pa.schema([]), pa.schema([("resolution", _STRING), ("reason", _STRING)])),
    "topics": (pa.schema([("ignoreRackAssignment", _BOOL)]), pa.schema([("resolution", _STRING), ("reason", _STRING)])),
    "partitions": (
        pa.schema([("leader", _INT32), ("replicas", pa.list_(_INT32))]),
        pa.schema([("resolution", _STRING), ("leader", pa.struct([("spu", _INT32)]))]),
    ),
}
# What they take from the object itself, beside its name: a partition's identity (``Partition.uid``),
# which is in neither its spec nor its status.
OBJECT_OWN_FIELDS: dict[str, pa.Schema] = {
    "spus": pa.schema([]), "spu-groups": pa.schema([]), "topics": pa.schema([]), "partitions": pa.schema([("uid", _INT64)]),
}
_TIME_RANGE = (micros(datetime.datetime(1, 1, 1, tzinfo=datetime.UTC)), micros(datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.UTC)))
# The head of a change record exactly as the recorder writes it (store/history.py's encode): the
# object is then the last field, at the top level of the record.
_JSON_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_CHANGE_HEAD = re.compile(
    rb'\{"seq":-?\d+,"type":"change","kind":' + _JSON_STRING + rb',"name":' + _JSON_STRING + rb',"op":' + _JSON_STRING
    + rb',"revision":-?\d+,"source":' + _JSON_STRING + rb',"time":-?\d+,(?:"snapshotRevision":-?\d+,)?"object":'
)
# The SC's layout of an object (models.encode): its name, its spec, its status, in this order, then
# a partition's uid (absent from partitions created before uids).
_OBJECT_HEAD = re.compile(rb'\{"name":' + _JSON_STRING + rb',"spec":')
_UID_TAIL = re.compile(rb',"uid":(-?(?:0|[1-9][0-9]*))\}\Z')  # a JSON integer: no leading zeros, as json reads them
_KIND_HINT = re.compile(rb'"kind":"([a-z-]*)"')


class Malformed(ValueError):
    """A record the export cannot take; the message reads after "history record N"."""


def to_table(records: list[tuple[int, bytes]]) -> tuple[pa.Table, list[MalformedRecord]]:
    """The dataset's rows for ``records``, each its sequence number and JSON payload (in order within
    each kind), and the records left out because they are malformed (by sequence number)."""
    batches: dict[str | None, list[tuple[int, bytes]]] = {}
    alone: list[tuple[int, bytes]] = []
    for seq, payload in records:
        # Only single-line objects reach the C++ parser: it takes a line of two objects for two
        # records, and a line that is only `null` crashes it (pyarrow 26).
        if payload[:1] == b"{" and payload[-1:] == b"}" and b"\n" not in payload and b"\r" not in payload:
            # The kind is a hint (the recorder writes it before the object), checked once parsed.
            hint = _KIND_HINT.search(payload, 0, 96)
            kind = hint[1].decode() if hint else None
            if kind is None or kind in OBJECT_KINDS:
                batches.setdefault(kind, []).append((seq, payload))
                continue
        alone.append((seq, payload))
    tables: list[pa.Table] = []
    for kind, batch in batches.items():
        _fast(kind, batch, tables, alone)
    malformed = []
    for seq, payload in alone:
        try:
            tables.append(_slow_row(seq, payload))
        except Malformed as error:
            malformed.append(MalformedRecord(seq, str(error)))
    table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    # Each kind's rows are in order, unless some were read one by one (rare: sorting costs a copy).
    return (table.sort_by("seq") if alone else table), sorted(malformed)


def _fast(kind: str | None, batch: list[tuple[int, bytes]], tables: list[pa.Table], alone: list[tuple[int, bytes]]) -> None:
    """``batch`` parsed in C++, halved until what fails is a single record, which goes to ``alone``."""
    try:
        tables.append(_kind_table(kind, batch))
    except (ValueError, pa.ArrowException):
        if len(batch) == 1:
            alone.extend(batch)
            return
        middle = len(batch) // 2
        _fast(kind, batch[:middle], tables, alone)
        _fast(kind, batch[middle:], tables, alone)


def _kind_table(kind: str | None, batch: list[tuple[int, bytes]]) -> pa.Table:
    """The rows of records of one ``kind`` (None: the history's own records); raises if any record does
    not fit the fast path (the caller then looks at the records one by one)."""
    lines: list[bytes] = []
    # Each change record's spec and status as text (None: not a change, or a delete), and its
    # object's own fields beside them (the uid) as a JSON object.
    specs: list[bytes | None] = []
    statuses: list[bytes | None] = []
    owns: list[bytes | None] = []
    headed: list[bool] = []
    for _, payload in batch:
        head = _CHANGE_HEAD.match(payload) if kind is not None else None
        if head is None:
            lines.append(payload)
            specs.append(None)
            statuses.append(None)
            owns.append(None)
        else:
            # The object is parsed as its spec, its status and its own fields below, not twice.
            lines.append(payload[: head.end()] + b"null}")
            spec, status, own = _cut(payload[head.end() : -1])
            specs.append(spec)
            statuses.append(status)
            owns.append(own)
        headed.append(head is not None)
    parsed = _parse_lines(lines, _RECORD_FIELDS)
    column = parsed.column
    record_type, kinds, times = column("type"), column("kind"), column("time")
    types = _OBJECT_RECORD_TYPES if kind is not None else _HISTORY_RECORD_TYPES
    checks = [
        pc.equal(column("seq"), pa.array([seq for seq, _ in batch], _INT64)),
        pc.is_in(record_type, pa.array(types)),
        pc.equal(kinds, kind) if kind is not None else pc.is_null(kinds),
        pc.and_(pc.greater_equal(times, _TIME_RANGE[0]), pc.less_equal(times, _TIME_RANGE[1])),
        # Every change record, and only they, in the recorder's layout.
        pc.equal(pc.equal(record_type, history.CHANGE), pa.array(headed)),
    ]
    for check in checks:
        if not pc.all(pc.fill_null(check, False)).as_py():
            raise Malformed("a record does not fit the fast path")
    typed: dict[str, pa.ChunkedArray] = {}
    if kind is not None:
        for part, texts, schema in zip(("spec", "status"), (specs, statuses), OBJECT_FIELDS[kind]):
            # Every row has a line, so that the columns line up with the records: `{}` gives nulls.
            values = _parse_lines([text or b"{}" for text in texts], schema)
            for field in schema:
                typed[f"{part}.{field.name}"] = values.column(field.name)
        values = _parse_lines([text or b"{}" for text in owns], OBJECT_OWN_FIELDS[kind])
        for field in OBJECT_OWN_FIELDS[kind]:
            typed[field.name] = values.column(field.name)
    # Cast from bytes: the UTF-8 is checked in C++.
    spec_texts = pa.array(specs, pa.binary()).cast(_STRING)
    status_texts = pa.array(statuses, pa.binary()).cast(_STRING)
    return _assemble(kind, parsed, spec_texts, status_texts, typed)


def _parse_lines(lines: list[bytes], schema: pa.Schema) -> pa.Table:
    """One row per line (each a JSON object on one line), with ``schema``'s fields and no others."""
    if not lines:
        return schema.empty_table()
    data = b"\n".join(lines) + b"\n"
    block = max(1 << 20, 2 * max(map(len, lines)))
    parsed = pajson.read_json(
        pa.BufferReader(data),
        read_options=pajson.ReadOptions(block_size=block),
        parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    if parsed.num_rows != len(lines):  # a line of two objects
        raise Malformed(f"{parsed.num_rows} rows from {len(lines)} lines")
    return parsed


def _cut(obj: bytes) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The spec and status, as text, of an object in the SC's layout (``{"name":..,"spec":{..},
    "status":{..}}``, then ``"uid":<integer>`` if it has one), and its uid as ``{"uid":<integer>}``
    (None without one); (None, None, None) for a delete. Raises for any other layout (read by
    ``_slow_row`` then). A wrong cut is never two JSON objects: the parse of the spec and the status
    proves it."""
    if obj == b"null":
        return None, None, None
    head = _OBJECT_HEAD.match(obj)
    status_at = obj.rfind(b',"status":')
    if head is None or status_at < head.end() or obj[-1:] != b"}":
        raise Malformed("not the SC's layout")
    # The object is then exactly {"name":..,"spec":<spec>,"status":<status>[,"uid":<integer>]}:
    # valid iff both are.
    uid = _UID_TAIL.search(obj, status_at)
    end = uid.start() if uid else -1
    spec, status = obj[head.end() : status_at], obj[status_at + 10 : end]
    if not (spec[:1] == status[:1] == b"{" and spec[-1:] == status[-1:] == b"}"):
        raise Malformed("not the SC's layout")
    return spec, status, (b'{"uid":' + uid[1] + b"}" if uid else None)


def _assemble(
    kind: str | None, parsed: pa.Table, spec_texts: pa.Array, status_texts: pa.Array, typed: dict[str, pa.ChunkedArray]
) -> pa.Table:
    column = parsed.column
    rows = parsed.num_rows
    record_type = column("type")
    is_change = pc.equal(record_type, history.CHANGE)
    is_gap = pc.equal(record_type, history.GAP)
    timestamps = column("time").cast(pa.timestamp("us", tz="UTC"))

    def field(name: str, data_type: pa.DataType) -> pa.Array | pa.ChunkedArray:
        """A typed column of this kind's objects (null for every row of a kind without it)."""
        return typed[name] if name in typed else pa.nulls(rows, data_type)

    columns = {
        "seq": column("seq"),
        "type": record_type,
        "time": timestamps,
        "revision": pc.if_else(is_gap, column("lastRevision"), column("revision")),
        "name": column("name"),
        "op": pc.if_else(is_change, column("op"), pa.scalar(None, _STRING)),
        "source": column("source"),
        "snapshot_revision": column("snapshotRevision"),
        "spec": spec_texts,
        "status": status_texts,
        "resolution": field("status.resolution", _STRING),
        "reason": pc.if_else(is_change, field("status.reason", _STRING), column("reason")),
        "spu_id": field("spec.id", _INT32),
        "rack": field("spec.rack", _STRING),
        "uid": field("uid", _INT64),
        "leader": field("spec.leader", _INT32),
        "replicas": field("spec.replicas", pa.list_(_INT32)),
        "status_leader": pc.struct_field(field("status.leader", pa.struct([("spu", _INT32)])), "spu"),
        "ignore_rack_assignment": (
            pc.if_else(pc.is_valid(spec_texts), pc.fill_null(typed["spec.ignoreRackAssignment"], False), pa.scalar(None, _BOOL))
            if kind == "topics"
            else pa.nulls(rows, _BOOL)
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
        "by": column("by"),
        "address": column("address"),
        "date": pc.strftime(timestamps, format="%Y-%m-%d"),
        "kind": pa.array([kind or HISTORY_KIND] * rows, _STRING),
    }
    return pa.table(columns).cast(SCHEMA)


def _empty_as_null(values: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)


def _slow_row(seq: int, payload: bytes) -> pa.Table:
    """The row of one record read by Python's json, in any layout; Malformed says what is wrong."""
    try:
        # Numbers of any length Python converts: the fast path takes them too, where the typed
        # columns do not read them.
        record = json_input.loads(payload, max_digits=None)
    except json_input.JsonInputError as error:
        raise Malformed(str(error)) from None
    if not isinstance(record, dict):
        raise Malformed(f"is not a JSON object (got {_json_type(record)})")
    for column in _RECORD_FIELDS:
        _check(record.get(column.name), column.type, column.name)
    record_type, kind, record_time = record.get("type"), record.get("kind"), record.get("time")
    if record.get("seq") != seq:
        raise Malformed(f"has seq {record.get('seq')}, but it is record {seq} of the history")
    if record_type not in RECORD_TYPES:
        raise Malformed(f"has type {record_type!r}: expected {', '.join(RECORD_TYPES[:-1])} or {RECORD_TYPES[-1]}")
    if record_type in _OBJECT_RECORD_TYPES and kind not in OBJECT_KINDS:
        expected = f"{', '.join(OBJECT_KINDS[:-1])} or {OBJECT_KINDS[-1]}"
        raise Malformed(f"has kind {kind!r}: expected {expected}" if kind is not None else f"has no kind: expected {expected}")
    if record_type in _HISTORY_RECORD_TYPES and kind is not None:
        raise Malformed(f"has kind {kind!r}: a {record_type} record has none")
    if record_time is None:
        raise Malformed("has no time")
    if not _TIME_RANGE[0] <= record_time <= _TIME_RANGE[1]:
        raise Malformed(f"has time {record_time}: expected microseconds since 1970 from year 1 to year 9999")
    spec = status = None
    obj = record.get("object")
    if record_type == history.CHANGE and obj is not None:
        if not isinstance(obj, dict):
            raise Malformed(f"has object = {_shown(obj)}: expected an object or null")
        spec, status = obj.get("spec"), obj.get("status")
        for part, value, schema in zip(("spec", "status"), (spec, status), OBJECT_FIELDS[kind]):  # type: ignore[index]  # kind is one of OBJECT_KINDS: checked above
            _check(value, pa.struct(list(schema)), f"object.{part}")
        for own_field in OBJECT_OWN_FIELDS[kind]:  # type: ignore[index]  # as above
            _check(obj.get(own_field.name), own_field.type, f"object.{own_field.name}")
    spec_schema, status_schema = OBJECT_FIELDS[kind] if kind in OBJECT_KINDS else (pa.schema([]), pa.schema([]))
    own_schema = OBJECT_OWN_FIELDS[kind] if kind in OBJECT_KINDS else pa.schema([])
    own = obj if record_type == history.CHANGE else None  # checked above: an object, or null for a delete

    def typed(part: dict[str, Any] | None, schema: pa.Schema, name: str) -> Any:
        return part.get(name) if part is not None and name in schema.names else None

    when = _EPOCH + datetime.timedelta(microseconds=record_time)
    row = {
        "seq": seq,
        "type": record_type,
        "time": record_time,
        "revision": record.get("lastRevision" if record_type == history.GAP else "revision"),
        "name": record.get("name"),
        "op": record.get("op") if record_type == history.CHANGE else None,
        "source": record.get("source"),
        "snapshot_revision": record.get("snapshotRevision"),
        "spec": None if spec is None else json.dumps(spec, separators=(",", ":"), ensure_ascii=False),
        "status": None if status is None else json.dumps(status, separators=(",", ":"), ensure_ascii=False),
        "resolution": typed(status, status_schema, "resolution"),
        "reason": typed(status, status_schema, "reason") if record_type == history.CHANGE else record.get("reason"),
        "spu_id": typed(spec, spec_schema, "id"),
        "rack": typed(spec, spec_schema, "rack"),
        "uid": typed(own, own_schema, "uid"),
        "leader": typed(spec, spec_schema, "leader"),
        "replicas": typed(spec, spec_schema, "replicas"),
        "status_leader": (typed(status, status_schema, "leader") or {}).get("spu"),
        "ignore_rack_assignment": bool(spec.get("ignoreRackAssignment")) if kind == "topics" and spec is not None else None,
        "verb": record.get("verb"),
        "cause": record.get("cause") or None,
        "cause_revision": record.get("causeRevision"),
        "outcome": record.get("outcome"),
        "keys": record.get("keys"),
        "detail": record.get("detail") or None,
        "first_revision": record.get("firstRevision"),
        "dropped": record.get("dropped"),
        "snapshot": record.get("snapshot"),
        "by": record.get("by"),
        "address": record.get("address"),
        "date": f"{when.year:04d}-{when.month:02d}-{when.day:02d}",
        "kind": kind or HISTORY_KIND,
    }
    try:
        return pa.Table.from_pylist([row], schema=SCHEMA)
    except (ValueError, pa.ArrowException) as error:  # e.g. a string with a lone surrogate
        raise Malformed(f"cannot be stored in Parquet: {error}") from None


def _check(value: Any, data_type: pa.DataType, path: str) -> None:
    """Raise Malformed unless ``value`` (a JSON value) fits ``data_type`` (null always does)."""
    if value is None:
        return
    if pa.types.is_struct(data_type):
        if not isinstance(value, dict):
            raise Malformed(f"has {path} = {_shown(value)}: expected an object")
        for field in data_type:
            _check(value.get(field.name), field.type, f"{path}.{field.name}")
        return
    if pa.types.is_list(data_type):
        if not isinstance(value, list):
            raise Malformed(f"has {path} = {_shown(value)}: expected a list of {_expected(data_type.value_type, plural=True)}")
        for index, item in enumerate(value):
            _check(item, data_type.value_type, f"{path}[{index}]")
        return
    if pa.types.is_integer(data_type):
        bound = 2 ** (data_type.bit_width - 1)
        fits = type(value) is int and -bound <= value < bound
    elif pa.types.is_boolean(data_type):
        fits = type(value) is bool
    else:
        fits = isinstance(value, str)
    if not fits:
        raise Malformed(f"has {path} = {_shown(value)}: expected {_expected(data_type)}")


def _expected(data_type: pa.DataType, plural: bool = False) -> str:
    if pa.types.is_integer(data_type):
        bound = 2 ** (data_type.bit_width - 1)
        return f"{'whole numbers' if plural else 'a whole number'} from {-bound} to {bound - 1}"
    if pa.types.is_boolean(data_type):
        return "true or false"
    if pa.types.is_struct(data_type):
        return "objects" if plural else "an object"
    return "strings" if plural else "a string"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "true or false", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _write_chunk(table: pa.Table, out: Path) -> int:
    written: list[str] = []
    pads.write_dataset(
        table,
        out,
        format="parquet",
        partitioning=PARTITIONING,
        basename_template=f"part-{pc.min(table.column('seq')).as_py():020d}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        file_visitor=lambda written_file: written.append(written_file.path),
    )
    return len(written)


def dataset_history_id(out: Path) -> str:
    """The id of the history exported into the dataset at ``out`` (its state file's)."""
    state = _read_state(out) if out.is_dir() else None
    if state is None:
        raise ExportError(f"{str(out)!r} holds no {STATE_FILE}: it is not a dataset `sc audit export --out` wrote")
    return str(state["historyId"])


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
