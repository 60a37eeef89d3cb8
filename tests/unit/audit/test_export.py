"""`sc audit export`: the history as a Parquet dataset partitioned by date and kind, incrementally."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from hypothesis import given, settings, strategies as st

from controller.audit import export
from controller.audit.export import RECORD_TYPES
from store import history, models
from tests import builders
from tests.unit.audit import synthetic
from tests.unit.audit.synthetic import T0


def read(out: Path) -> list[dict]:
    dataset = pads.dataset(out, format="parquet", partitioning="hive")
    return sorted(dataset.to_table().to_pylist(), key=lambda row: row["seq"])


async def small_history(directory: Path, day_two: bool = False) -> synthetic.Writer:
    writer = synthetic.Writer(directory)
    writer.at(0).put(writer.spu(1, "r1"))
    writer.at(1).spu_state(1, "Online")
    writer.at(2).topic("orders", {"partitions": 1, "replicationFactor": 1})
    writer.at(3).provision("orders", {0: [1]})
    writer.at(4).delete("topics", "orders")
    writer.recorder.record_gap(106, 109, "compacted")
    writer.recorder.record_sync(109, snapshot=True)
    if day_two:
        writer.at(86_400).topic("later", {"partitions": 1, "replicationFactor": 1})
    await writer.close()
    return writer


async def test_every_record_type_becomes_a_row_with_typed_columns(tmp_path: Path) -> None:
    await small_history(tmp_path / "history")
    result = export.export(tmp_path / "history", tmp_path / "out")
    assert (result.rows, result.first_seq, result.last_seq) == (10, 1, 10)
    rows = read(tmp_path / "out")
    assert [(row["seq"], row["type"], row["kind"], row["name"], row["op"] or row["verb"]) for row in rows] == [
        (1, "change", "spus", "spu-1", "create"),
        (2, "action", "spus", "spu-1", "update-status"),
        (3, "change", "spus", "spu-1", "update"),
        (4, "change", "topics", "orders", "create"),
        (5, "action", "topics", "orders", "provision"),
        (6, "change", "topics", "orders", "update"),
        (7, "change", "partitions", "orders-0", "create"),
        (8, "change", "topics", "orders", "delete"),
        (9, "gap", "history", None, None),
        (10, "sync", "history", None, None),
    ]
    spu = rows[2]
    assert (spu["spu_id"], spu["rack"], spu["resolution"], spu["revision"], spu["source"]) == (1, "r1", "Online", 102, "watch")
    assert json.loads(spu["status"]) == {"resolution": "Online"}
    assert spu["time"] == T0 + datetime.timedelta(seconds=1)
    assert spu["date"] == "2026-03-01"
    partition = rows[6]
    assert (partition["leader"], partition["replicas"], partition["status_leader"], partition["resolution"]) == (1, [1], None, "Offline")
    action = rows[4]
    assert (action["cause"], action["outcome"], action["revision"], action["keys"]) == (
        None, "applied", 104, ["topics/orders", "partitions/orders-0"],
    )
    assert (rows[7]["spec"], rows[7]["status"]) == (None, None)
    assert (rows[8]["first_revision"], rows[8]["revision"], rows[8]["reason"], rows[8]["dropped"]) == (106, 109, "compacted", 0)
    assert (rows[9]["revision"], rows[9]["snapshot"]) == (109, True)


async def test_the_dataset_is_partitioned_by_date_and_kind(tmp_path: Path) -> None:
    await small_history(tmp_path / "history", day_two=True)
    export.export(tmp_path / "history", tmp_path / "out")
    directories = sorted(str(path.parent.relative_to(tmp_path / "out")) for path in (tmp_path / "out").rglob("*.parquet"))
    assert directories == [
        "date=2026-03-01/kind=history",
        "date=2026-03-01/kind=partitions",
        "date=2026-03-01/kind=spus",
        "date=2026-03-01/kind=topics",
        "date=2026-03-02/kind=topics",
    ]


async def test_exporting_again_appends_only_what_is_new(tmp_path: Path) -> None:
    writer = await small_history(tmp_path / "history")
    first = export.export(tmp_path / "history", tmp_path / "out")
    nothing = export.export(tmp_path / "history", tmp_path / "out")
    assert (nothing.rows, nothing.last_seq) == (0, first.last_seq)

    more = history.Recorder.open(tmp_path / "history", clock=writer.clock)
    more.record_change("topics", "again", history.CREATE, 120, b'{"name":"again","spec":{},"status":{}}')
    await more.start()
    await more.close()
    second = export.export(tmp_path / "history", tmp_path / "out")
    assert (second.rows, second.first_seq, second.last_seq) == (1, 11, 11)
    assert [row["seq"] for row in read(tmp_path / "out")] == list(range(1, 12))


async def test_since_and_until_select_by_time_and_until_resumes_later(tmp_path: Path) -> None:
    await small_history(tmp_path / "history")
    after = T0 + datetime.timedelta(seconds=1)
    result = export.export(tmp_path / "history", tmp_path / "out", since=after, until=T0 + datetime.timedelta(seconds=3))
    assert [row["seq"] for row in read(tmp_path / "out")] == [2, 3, 4]
    assert result.last_seq == 4
    rest = export.export(tmp_path / "history", tmp_path / "out")
    assert (rest.first_seq, rest.last_seq) == (5, 10)
    assert [row["seq"] for row in read(tmp_path / "out")] == [2, 3, 4, 5, 6, 7, 8, 9, 10]


async def test_a_torn_last_record_is_skipped_and_the_export_still_works(tmp_path: Path) -> None:
    await small_history(tmp_path / "history")
    [segment] = history.segment_paths(tmp_path / "history")
    with open(segment, "r+b") as file:
        file.truncate(segment.stat().st_size - 10)
    result = export.export(tmp_path / "history", tmp_path / "out")
    assert (result.rows, result.last_seq, result.corrupt_segments) == (9, 9, [])


async def test_an_export_of_another_history_is_refused(tmp_path: Path) -> None:
    await small_history(tmp_path / "one")
    await small_history(tmp_path / "two")
    export.export(tmp_path / "one", tmp_path / "out")
    with pytest.raises(export.ExportError, match=r"holds an export of another history .*export into an empty directory"):
        export.export(tmp_path / "two", tmp_path / "out")


def test_a_non_empty_directory_without_export_state_is_refused(tmp_path: Path) -> None:
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / history.ID_FILE).write_text("abc\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(export.ExportError, match=r"is not empty and holds no _export_state.json"):
        export.export(tmp_path / "history", tmp_path / "out")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01", datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)),
        ("2026-03-01T10:02:00Z", datetime.datetime(2026, 3, 1, 10, 2, tzinfo=datetime.UTC)),
        ("2026-03-01T12:02:00+02:00", datetime.datetime(2026, 3, 1, 10, 2, tzinfo=datetime.UTC)),
    ],
)
def test_times_are_iso_8601_and_naive_means_utc(text: str, expected: datetime.datetime) -> None:
    assert export.parse_time(text) == expected


def test_a_malformed_time_is_named(text: str = "yesterday") -> None:
    with pytest.raises(export.ExportError, match=r"time 'yesterday' is not ISO 8601"):
        export.parse_time(text)


async def test_an_object_stored_in_another_layout_still_gives_its_spec_and_status(tmp_path: Path) -> None:
    recorder = history.Recorder.open(tmp_path / "history")
    value = b'{"status": {"resolution": "Online"}, "name": "spu-9", "spec": {"id": 9, "rack": "r,\\"status\\":"}}'
    recorder.record_change("spus", "spu-9", history.CREATE, 3, value)
    await recorder.start()
    await recorder.close()
    export.export(tmp_path / "history", tmp_path / "out")
    [row] = read(tmp_path / "out")
    assert (row["spec"], row["status"]) == ('{"id":9,"rack":"r,\\"status\\":"}', '{"resolution":"Online"}')
    assert (row["spu_id"], row["rack"], row["resolution"]) == (9, 'r,"status":', "Online")


async def test_a_partitions_uid_reaches_its_rows_and_none_is_null(tmp_path: Path) -> None:
    """The uid is beside the name, outside the spec and status kept as text: only its column keeps it."""
    writer = synthetic.Writer(tmp_path / "history")
    spec = {"leader": 1, "replicas": [1]}
    writer.at(0).put(models.Partition.model_validate({"name": "t-0", "uid": 2**62 + 7, "spec": spec}))
    writer.at(1).partition_state("t-0", "Online", 1)
    writer.at(2).put(models.Partition.model_validate({"name": "t-1", "spec": spec}))  # created before uids
    writer.at(3).delete("partitions", "t-0")
    writer.at(4).put(writer.spu(1, "r1"))
    await writer.close()
    result = export.export(tmp_path / "history", tmp_path / "out")
    assert (result.rows, result.malformed_records) == (6, 0)
    changes = [row for row in read(tmp_path / "out") if row["type"] == "change"]
    assert [(row["name"], row["op"], row["uid"]) for row in changes] == [
        ("t-0", "create", 2**62 + 7), ("t-0", "update", 2**62 + 7), ("t-1", "create", None), ("t-0", "delete", None),
        ("spu-1", "create", None),
    ]


# ---------------------------------------------------------------------------- every kind, and malformed records


async def every_kind_history(directory: Path) -> synthetic.Writer:
    """One object of every kind and shape: SPUs (custom, managed), an SPU group, a computed and a
    manual topic, partitions."""
    writer = synthetic.Writer(directory)
    writer.at(0).put(writer.spu(1, "r1"))
    group = models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 2, "minId": 10, "rack": "r2"}})
    writer.at(1).put(group)
    writer.at(2).put(group.model_copy(update={"status": models.SpuGroupStatus(resolution="Reserved")}), by_sc="ids free")
    managed = builders.spu(10, resolution="Init", rack="r2", name="g-0", spu_type="Managed")
    writer.at(3).put(managed, by_sc="group g", verb="create")
    writer.at(4).topic("computed", {"partitions": 1, "replicationFactor": 2, "ignoreRackAssignment": True})
    writer.at(5).provision("computed", {0: [1, 10]})
    writer.at(6).topic("manual", {"replicaAssignment": [{"id": 0, "replicas": [10, 1]}]})
    writer.at(7).provision("manual", {0: [10, 1]})
    writer.at(8).partition_state("manual-0", "Online", 10)
    writer.at(9).delete("spu-groups", "g")
    await writer.close()
    return writer


async def test_a_history_of_every_kind_exports_with_each_kinds_typed_columns(tmp_path: Path) -> None:
    """The reported crash: an SPU group's spec.replicas is a number, a partition's a list."""
    await every_kind_history(tmp_path / "history")
    result = export.export(tmp_path / "history", tmp_path / "out")
    assert (result.rows, result.malformed_records, result.malformed) == (17, 0, [])
    changes = [row for row in read(tmp_path / "out") if row["type"] == "change"]
    typed = ["kind", "name", "op", "resolution", "reason", "spu_id", "rack", "leader", "replicas", "status_leader", "ignore_rack_assignment"]
    assert [tuple(row[column] for column in typed) for row in changes] == [
        ("spus", "spu-1", "create", "Init", None, 1, "r1", None, None, None, None),
        ("spu-groups", "g", "create", "Init", "", None, None, None, None, None, None),
        ("spu-groups", "g", "update", "Reserved", "", None, None, None, None, None, None),
        ("spus", "g-0", "create", "Init", None, 10, "r2", None, None, None, None),
        ("topics", "computed", "create", "Init", "", None, None, None, None, None, True),
        ("topics", "computed", "update", "Provisioned", "", None, None, None, None, None, True),
        ("partitions", "computed-0", "create", "Offline", None, None, None, 1, [1, 10], None, None),
        ("topics", "manual", "create", "Init", "", None, None, None, None, None, False),
        ("topics", "manual", "update", "Provisioned", "", None, None, None, None, None, False),
        ("partitions", "manual-0", "create", "Offline", None, None, None, 10, [10, 1], None, None),
        ("partitions", "manual-0", "update", "Online", None, None, None, 10, [10, 1], 10, None),
        ("spu-groups", "g", "delete", None, None, None, None, None, None, None, None),
    ]
    group = json.loads(changes[2]["spec"])
    assert (group["replicas"], group["minId"], json.loads(changes[2]["status"])) == (2, 10, {"resolution": "Reserved", "reason": ""})
    assert json.loads(changes[7]["spec"])["replicaAssignment"] == [{"id": 0, "replicas": [10, 1]}]
    assert json.loads(changes[3]["spec"])["spuType"] == "Managed"


def write_raw(directory: Path, payloads: list[bytes]) -> None:
    """Append records exactly as given, framed like the recorder's (a hand-written history)."""
    log = history.SegmentLog(directory)
    log.open()
    log.append(payloads)
    log.close()


def change_payload(seq: int, kind: str, name: str, value: bytes, time_us: int = export.micros(T0)) -> bytes:
    return history.encode(
        {"seq": seq, "type": "change", "kind": kind, "name": name, "op": "update", "revision": 200 + seq, "source": "watch", "time": time_us},
        value,
    )


PARTITION = b'{"name":"t-0","spec":{"leader":1,"replicas":%s},"status":{"resolution":"Online"}}'
PARTITION_WITH_UID = b'{"name":"t-0","spec":{"leader":1,"replicas":[1]},"status":{"resolution":"Online"},"uid":%s}'
MALFORMED = [
    (b'{"seq":2,"type":"change", oops', "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 27 (char 26)"),
    (b"null", "is not a JSON object (got null)"),
    (b"[2, 3]", "is not a JSON object (got an array)"),
    (b'{"seq":5,"type":"gap","time":1}{"seq":5,"type":"gap","time":1}', "is not valid JSON: Extra data: line 1 column 32 (char 31)"),
    (b'{"seq":6,"type":"bogus","time":1}', "has type 'bogus': expected change, action, request, gap, sync, takeover or step-down"),
    (b'{"seq":7,"type":"change","kind":"brokers","name":"b","time":1}', "has kind 'brokers': expected spus, spu-groups, topics or partitions"),
    (b'{"seq":99,"type":"sync","revision":3,"time":1}', "has seq 99, but it is record 8 of the history"),
    (b'{"seq":9,"type":"sync","revision":3}', "has no time"),
    (b'{"seq":10,"type":"sync","revision":"3","time":1}', "has revision = \"3\": expected a whole number from -9223372036854775808 to 9223372036854775807"),
    (change_payload(11, "partitions", "t-0", PARTITION % b'"0,1"'), 'has object.spec.replicas = "0,1": expected a list of whole numbers from -2147483648 to 2147483647'),
    (change_payload(12, "partitions", "t-0", PARTITION % b"[1, 99999999999]"), "has object.spec.replicas[1] = 99999999999: expected a whole number from -2147483648 to 2147483647"),
    (change_payload(13, "spus", "s", b'{"name":"s","spec":{"id":' + b"7" * 5000 + b'},"status":{}}'), "holds a number of 5000 digits at object.spec.id (777777777777...): no value here has more than 4300 digits"),
    (change_payload(14, "spu-groups", "g", b'{"name":"g","spec":5,"status":{}}'), "has object.spec = 5: expected an object"),
    (change_payload(15, "topics", "t", b'{"name":"t","spec":{},"status":{"resolution":["Init"]}}'), 'has object.status.resolution = ["Init"]: expected a string'),
    (change_payload(16, "spus", "s", b'{"name":"s","spec":{"id":1},"status":{}}', time_us=2**62), "has time 4611686018427387904: expected microseconds since 1970 from year 1 to year 9999"),
    (b'{"seq":17,"type":"change","kind":"spus","name":"s",\n"time":1,"object":7}', "has object = 7: expected an object or null"),
    (change_payload(18, "partitions", "t-0", PARTITION_WITH_UID % b'"7"'), 'has object.uid = "7": expected a whole number from -9223372036854775808 to 9223372036854775807'),
    (change_payload(19, "partitions", "t-0", PARTITION_WITH_UID % b"9223372036854775808"), "has object.uid = 9223372036854775808: expected a whole number from -9223372036854775808 to 9223372036854775807"),
]


async def test_malformed_records_are_counted_named_and_skipped_and_the_rest_is_exported(tmp_path: Path) -> None:
    writer = synthetic.Writer(tmp_path / "history")
    writer.at(0).put(writer.spu(1, "r1"))
    await writer.close()
    good_partition = change_payload(20, "partitions", "t-0", PARTITION % b"[1, 2]")
    with_uid = change_payload(21, "partitions", "t-0", PARTITION_WITH_UID % b"9223372036854775807")
    write_raw(tmp_path / "history", [payload for payload, _ in MALFORMED] + [good_partition, with_uid])
    result = export.export(tmp_path / "history", tmp_path / "out")
    assert [(record.seq, record.reason) for record in result.malformed] == [
        (seq, reason) for seq, (_, reason) in enumerate(MALFORMED, start=2)
    ]
    assert (result.rows, result.malformed_records, result.first_seq, result.last_seq) == (3, 18, 1, 21)
    rows = read(tmp_path / "out")
    assert [(row["seq"], row["name"], row["replicas"], row["uid"]) for row in rows] == [
        (1, "spu-1", None, None), (20, "t-0", [1, 2], None), (21, "t-0", [1], 2**63 - 1),
    ]
    assert result.to_json()["malformedRecords"] == 18
    assert result.to_json()["malformed"][0] == {"seq": 2, "reason": MALFORMED[0][1]}
    # Exporting again reads none of them again: they were passed over for good.
    again = export.export(tmp_path / "history", tmp_path / "out")
    assert (again.rows, again.malformed_records, again.last_seq) == (0, 0, 21)


async def test_only_the_first_malformed_records_are_listed_all_are_counted(tmp_path: Path) -> None:
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / history.ID_FILE).write_text("abc\n")
    write_raw(tmp_path / "history", [b"null"] * (export.MALFORMED_LISTED + 5))
    result = export.export(tmp_path / "history", tmp_path / "out", chunk_rows=7)
    assert (result.rows, result.malformed_records, len(result.malformed)) == (0, export.MALFORMED_LISTED + 5, export.MALFORMED_LISTED)
    assert result.malformed[-1].seq == export.MALFORMED_LISTED


# ---------------------------------------------------------------------------- the fast path and the slow path agree

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
INT32 = st.integers(-(2**31), 2**31 - 1)
RESOLUTION = st.none() | st.sampled_from(["Init", "Online", "Offline", "Reserved", "Provisioned", "LeaderOffline"])
# Each kind's objects: the fields the typed columns read, with values of the right type, and others.
SPECS = {
    "spus": st.fixed_dictionaries({}, optional={"id": INT32, "rack": st.none() | st.text(max_size=4), "publicEndpoint": JSON}),
    "spu-groups": st.fixed_dictionaries({}, optional={"replicas": JSON, "minId": JSON, "storage": JSON}),
    "topics": st.fixed_dictionaries(
        {}, optional={"partitions": JSON, "ignoreRackAssignment": st.none() | st.booleans(), "replicaAssignment": JSON}
    ),
    "partitions": st.fixed_dictionaries({}, optional={"leader": INT32, "replicas": st.none() | st.lists(INT32, max_size=4)}),
}
STATUSES = {
    "spus": st.fixed_dictionaries({}, optional={"resolution": RESOLUTION}),
    "spu-groups": st.fixed_dictionaries({}, optional={"resolution": RESOLUTION, "reason": st.text(max_size=8)}),
    "topics": st.fixed_dictionaries({}, optional={"resolution": RESOLUTION, "reason": st.text(max_size=8), "replicaMap": JSON}),
    "partitions": st.fixed_dictionaries(
        {}, optional={"resolution": RESOLUTION, "leader": st.none() | st.fixed_dictionaries({"spu": INT32, "hw": JSON}), "lrs": JSON}
    ),
}
TIME = st.integers(export.micros(T0), export.micros(T0) + 10**12)


@st.composite
def recorded(draw: st.DrawFn, seq: int) -> bytes:
    """A record as the recorder writes it: a change with an object in the SC's layout, an action, a request, a gap or a sync."""
    record_type = draw(st.sampled_from(RECORD_TYPES))
    kind = draw(st.sampled_from(list(models.KINDS)))
    time = draw(TIME)
    if record_type == history.CHANGE:
        fields = {
            "seq": seq, "type": record_type, "kind": kind, "name": draw(st.text(max_size=8)), "op": draw(st.sampled_from(["create", "update", "delete"])),
            "revision": draw(st.integers(0, 2**63 - 1)), "source": draw(st.sampled_from(["watch", "replay", "list"])), "time": time,
        }
        if draw(st.booleans()):
            fields["snapshotRevision"] = draw(st.integers(0, 2**63 - 1))
        obj = None
        if fields["op"] != "delete":
            obj = {"name": fields["name"], "spec": draw(SPECS[kind]), "status": draw(STATUSES[kind])}
            if kind == "partitions" and draw(st.booleans()):
                obj["uid"] = draw(st.integers(1, 2**63 - 1))  # last, where models.encode writes it
        return history.encode(fields, None if obj is None else json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())
    if record_type == history.ACTION:
        fields = {
            "seq": seq, "type": record_type, "kind": kind, "name": draw(st.text(max_size=8)), "verb": draw(st.text(max_size=6)),
            "reason": draw(st.text(max_size=8)), "cause": draw(st.sampled_from(["", "drain"])), "causeRevision": draw(st.integers(0, 99)),
            "outcome": "applied", "revision": draw(st.integers(0, 99)), "keys": draw(st.lists(st.text(max_size=5), max_size=3)),
            "detail": draw(st.sampled_from(["", "lost"])), "time": time,
        }
    elif record_type == history.REQUEST:
        fields = {
            "seq": seq, "type": record_type, "kind": kind, "name": draw(st.text(max_size=8)), "revision": draw(st.integers(0, 99)),
            "by": draw(st.text(max_size=8)), "address": draw(st.none() | st.sampled_from(["127.0.0.1", "::1"])), "time": time,
        }
    elif record_type == history.GAP:
        fields = {"seq": seq, "type": record_type, "firstRevision": 3, "lastRevision": 9, "reason": "compacted", "dropped": 2, "time": time}
    else:
        fields = {"seq": seq, "type": record_type, "revision": 9, "snapshot": draw(st.booleans()), "time": time}
    return history.encode(fields, None)


def plain(rows: list[dict]) -> list[dict]:
    """Rows with their spec and status parsed (the slow path re-encodes them: same JSON, other text)."""
    return [{**row, "spec": json.loads(row["spec"] or "null"), "status": json.loads(row["status"] or "null")} for row in rows]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_fast_path_gives_the_rows_python_gives(data: st.DataObject) -> None:
    records = [(seq, data.draw(recorded(seq))) for seq in range(1, data.draw(st.integers(1, 12)) + 1)]
    with mock.patch.object(export, "_slow_row", side_effect=AssertionError("the recorder's layout took the slow path")):
        table, malformed = export.to_table(records)
    assert malformed == []
    slow = [export._slow_row(seq, payload).to_pylist()[0] for seq, payload in records]
    assert plain(table.sort_by("seq").to_pylist()) == plain(slow)


PAYLOADS = (
    st.binary(max_size=40)
    | JSON.map(lambda value: json.dumps(value).encode())
    | st.builds(
        lambda fields, obj: json.dumps({**fields, "object": obj}).encode(),
        st.dictionaries(st.sampled_from(["seq", "type", "kind", "name", "time", "revision", "keys", "op"]), JSON | st.sampled_from(["change", "spus", "partitions"]), max_size=6),
        JSON | st.fixed_dictionaries({"spec": JSON, "status": JSON}),
    )
)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_payload_gives_a_row_or_a_named_malformed_record_never_an_error(data: st.DataObject) -> None:
    records = []
    for seq in range(1, data.draw(st.integers(1, 8)) + 1):
        good = data.draw(recorded(seq))
        records.append((seq, data.draw(st.sampled_from([good, good[: len(good) // 2], good.replace(b"{", b"[", 1)]) | PAYLOADS)))
    table, malformed = export.to_table(records)
    assert sorted(table.column("seq").to_pylist() + [record.seq for record in malformed]) == [seq for seq, _ in records]
    assert all(record.reason for record in malformed)


JSON_TYPES = {"int32": "integer", "int64": "integer", "string": "string", "bool": "boolean", "list<item: int32>": "array"}


@pytest.mark.parametrize("kind", list(models.KINDS))
def test_the_typed_columns_read_fields_each_model_has_with_that_json_type(kind: str) -> None:
    """The dataset keeps every field as JSON text; the typed columns must still name real fields."""
    schema = models.KINDS[kind].model_json_schema(by_alias=True)
    models_and_fields = [
        (schema["$defs"][schema["properties"][part]["$ref"].rsplit("/", 1)[1]], fields, part)
        for part, fields in zip(("spec", "status"), export.OBJECT_FIELDS[kind], strict=True)
    ]
    # The object's own fields, beside its name (a partition's uid).
    models_and_fields.append((schema, export.OBJECT_OWN_FIELDS[kind], "object"))
    for model, fields, part in models_and_fields:
        for field in fields:
            declared = model["properties"][field.name]
            options = [
                schema["$defs"][option["$ref"].rsplit("/", 1)[1]] if "$ref" in option else option
                for option in declared.get("anyOf", [declared])
            ]
            types = {option["type"] for option in options} - {"null"}
            expected = "object" if pa.types.is_struct(field.type) else JSON_TYPES[str(field.type)]
            assert types == {expected}, (kind, part, field.name, declared)


def test_a_spec_and_status_nested_below_the_top_of_an_unbalanced_object_are_not_taken_for_its_own() -> None:
    """The cut must not find a nested spec and status: this object is not even valid JSON."""
    value = b'{"name":"t-0","x":{"spec":{"leader":1,"replicas":[1]},"status":{"resolution":"Online"}}'
    table, malformed = export.to_table([(1, change_payload(1, "partitions", "t-0", value))])
    assert (table.num_rows, [record.seq for record in malformed]) == (0, [1])
    assert malformed[0].reason.startswith("is not valid JSON: ")
