"""`sc audit export`: the history as a Parquet dataset partitioned by date and kind, incrementally."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from controller.audit import export
from store import history
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
