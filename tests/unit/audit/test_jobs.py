"""The Spark audit jobs on a synthetic history (tests/unit/audit/synthetic.py), exact figures.

One export and one run of every job, shared by the tests of this module (Spark is slow to plan).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from controller.audit import export, jobs, options, report
from controller.demo import demo
from store import history
from tests.unit.audit import synthetic
from tests.unit.audit.synthetic import T0, iso

pytestmark = pytest.mark.spark


def at(seconds: float) -> int:
    """Epoch microseconds of T0 + ``seconds``."""
    return export.micros(T0) + int(seconds * 1_000_000)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, export.ExportResult]:
    directory = tmp_path_factory.mktemp("story")
    asyncio.run(synthetic.write_cluster_story(directory / "history"))
    return directory, export.export(directory / "history", directory / "export")


@pytest.fixture(scope="module")
def story(exported: tuple[Path, export.ExportResult]) -> Path:
    return exported[0]


def test_the_story_holds_every_kind_and_its_malformed_records_are_skipped(
    spark: Any, exported: tuple[Path, export.ExportResult]
) -> None:
    directory, result = exported
    assert [(record.seq, record.reason) for record in result.malformed] == [
        (87, 'has object.spec.leader = "2": expected a whole number from -2147483648 to 2147483647'),
        (88, "is not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    ]
    assert (result.rows, result.malformed_records, result.last_seq) == (86, 2, 88)
    kinds = jobs.load(spark, directory / "export").filter("type = 'change'").groupBy("kind").count().orderBy("kind").collect()
    assert [tuple(row) for row in kinds] == [("partitions", 18), ("spu-groups", 2), ("spus", 18), ("topics", 12)]


def test_the_dataset_is_read_with_the_schema_of_the_export_not_one_inferred(spark: Any, story: Path) -> None:
    frame = jobs.load(spark, story / "export")
    types = dict(frame.dtypes)
    assert (types["date"], types["kind"], types["time"], types["replicas"], types["spu_id"]) == (
        "string", "string", "timestamp", "array<int>", "int"
    )
    assert [field.name for field in frame.schema] == export.SCHEMA.names


def test_a_tiny_historys_settings_are_not_overridden_by_the_local_default(spark: Any) -> None:
    """The session's own local default (two shuffle partitions per core) yields to settings given
    to it: the demo's and these tests' one shuffle partition, no adaptive execution or broadcasts."""
    again = jobs.session("local[2]", settings=demo.TINY_HISTORY_SETTINGS)
    assert again is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "1"
    assert spark.conf.get("spark.sql.adaptive.enabled") == "false"
    assert spark.conf.get("spark.sql.autoBroadcastJoinThreshold") == "-1"


@pytest.fixture(scope="module")
def results(spark: Any, story: Path) -> options.Results:
    return jobs.run(spark, story / "export")


@pytest.fixture(scope="module")
def report_dir(results: options.Results, story: Path) -> Path:
    report.write(results, story / "report")
    return story / "report"


def test_leader_changes_per_partition_carry_the_cause_of_the_action_that_moved_the_leader(results: options.Results) -> None:
    assert [
        (row["partition"], row["from_spu"], row["to_spu"], row["cause"], row["at_us"])
        for row in results.tables["leader_changes"]
    ] == [
        ("orders-0", 0, 2, "spu-offline", at(20.5)),
        ("orders-0", 2, 0, "preferred-leader", at(26)),
        ("orders-1", 2, 3, "drain", at(70)),
        ("orders-1", 3, 2, "unclean", at(80)),
        ("orders-1", 2, 3, "external", at(85)),  # written by a user: no action of the SC explains it
    ]


def test_leader_changes_per_spu(results: options.Results) -> None:
    assert [tuple(row.values()) for row in results.tables["leader_changes_by_spu"]] == [
        (0, "preferred-leader", 1, 0),
        (0, "spu-offline", 0, 1),
        (2, "drain", 0, 1),
        (2, "external", 0, 1),
        (2, "preferred-leader", 0, 1),
        (2, "spu-offline", 1, 0),
        (2, "unclean", 1, 0),
        (3, "drain", 1, 0),
        (3, "external", 1, 0),
        (3, "unclean", 0, 1),
    ]


def test_unavailability_windows_and_their_percentiles_per_topic(results: options.Results) -> None:
    assert [tuple(row.values()) for row in results.tables["unavailability"]] == [
        ("events-0", "events", at(30), at(45.5), 15.5),
        ("events-0", "events", at(60.5), at(62), 1.5),
        ("events-0", "events", at(100), None, 20.0),  # still open: counted up to the end of the history
    ]
    [events] = results.tables["unavailability_by_topic"]
    assert events == {"topic": "events", "windows": 3, "p50": 15.5, "p99": pytest.approx(19.91), "max": 20.0, "total": 37.0}


def test_provisioning_latency_from_creation_to_provisioned(results: options.Results) -> None:
    assert [tuple(row.values()) for row in results.tables["provisioning"]] == [
        ("orders", at(5), at(7), 2.0),
        ("events", at(10), at(12.5), 2.5),
        ("manual", at(50), at(51), 1.0),
        ("tmp", at(105), None, None),
        ("late", at(120), None, None),
    ]


def test_spu_intervals_and_flapping_spus(results: options.Results) -> None:
    assert [(row["spu"], row["state"], row["start_us"], row["end_us"]) for row in results.tables["spu_intervals"]] == [
        (0, "Online", at(1), at(20)),
        (0, "Offline", at(20), at(25)),
        (0, "Online", at(25), None),
        (1, "Online", at(1), None),
        (2, "Online", at(1), None),
        (3, "Online", at(1), at(30)),
        (3, "Offline", at(30), at(45)),
        (3, "Online", at(45), at(60)),
        (3, "Offline", at(60), at(61.5)),
        (3, "Online", at(61.5), at(99.5)),
        (3, "Offline", at(99.5), None),
    ]
    assert results.tables["flapping_spus"] == [{"spu": 3, "offline_count": 3, "max_in_window": 3}]


def test_placement_balance_at_the_end_of_the_history(results: options.Results) -> None:
    assert results.balance_at_us == at(120)
    assert [tuple(row.values()) for row in results.tables["balance_spus"]] == [
        (0, "r1", 2, 2), (1, "r1", 1, 0), (2, "r2", 2, 0), (3, "r3", 2, 2), (4, "r3", 0, 0), (10, None, 0, 0),
    ]
    assert [tuple(row.values()) for row in results.tables["balance_racks"]] == [
        ("r1", 3, 2, 2), ("r2", 2, 0, 1), ("r3", 2, 2, 2),
    ]
    assert results.tables["rack_violations"] == [
        {"partition": "manual-0", "topic": "manual", "replicas": [0, 1], "racks": ["r1", "r1"], "distinct_racks": 1, "required_racks": 2}
    ]


def test_placement_balance_at_a_chosen_time(spark: Any, story: Path) -> None:
    frame = jobs.load_histories(spark, [story / "export"])
    spus, racks, violations = jobs.balance(frame, frame.filter("type = 'change'"), at(22))
    assert [tuple(row) for row in spus.orderBy("spu").collect()] == [
        (0, "r1", 1, 0), (1, "r1", 0, 0), (2, "r2", 2, 2), (3, "r3", 2, 1),
    ]
    assert violations.count() == 0


def test_spec_changes_say_who_made_them_and_leave_out_status_writes(results: options.Results) -> None:
    assert [(row["kind"], row["name"], row["op"], row["at_us"], row["by"]) for row in results.tables["spec_changes"]] == [
        ("spus", "spu-0", "create", at(0), "user"),
        ("spus", "spu-1", "create", at(0), "user"),
        ("spus", "spu-2", "create", at(0), "user"),
        ("spus", "spu-3", "create", at(0), "user"),
        ("topics", "orders", "create", at(5), "user"),
        ("partitions", "orders-0", "create", at(7), "sc"),
        ("partitions", "orders-1", "create", at(7), "sc"),
        ("topics", "events", "create", at(10), "user"),
        ("partitions", "events-0", "create", at(12.5), "sc"),
        ("partitions", "orders-0", "update", at(20.5), "sc"),
        ("partitions", "orders-0", "update", at(26), "sc"),
        ("topics", "manual", "create", at(50), "user"),
        ("partitions", "manual-0", "create", at(51), "sc"),
        ("partitions", "orders-1", "update", at(70), "sc"),
        ("partitions", "orders-1", "update", at(80), "sc"),
        ("partitions", "orders-1", "update", at(85), "user"),
        ("spus", "spu-4", "create", at(90), "user"),
        ("spus", "spu-4", "update", at(95), "user"),
        ("topics", "tmp", "create", at(105), "user"),
        ("topics", "tmp", "delete", at(110), "alice"),
        ("spu-groups", "g", "create", at(115), "user"),
        ("spus", "g-0", "create", at(115.5), "sc"),
        ("topics", "late", "create", at(120), "user"),
    ]


def test_report_json_has_exactly_the_shape_of_the_api(report_dir: Path, story: Path) -> None:
    document = json.loads((report_dir / "report.json").read_text())
    history_id = history.read_history_id(story / "history")
    assert list(document)[:6] == ["leaderChanges", "unavailability", "provisioning", "spuIntervals", "balance", "specChanges"]
    assert document["leaderChanges"][0] == {"partition": "orders-0", "from": 0, "to": 2, "cause": "spu-offline", "at": iso(20.5)}
    # The user's write is no decision of the SC: not among leaderChanges (API.md's four causes).
    assert [change["cause"] for change in document["leaderChanges"]] == ["spu-offline", "preferred-leader", "drain", "unclean"]
    assert document["externalLeaderChanges"] == [
        {"partition": "orders-1", "from": 2, "to": 3, "cause": "external", "at": iso(85)}
    ]
    assert document["unavailability"] == [
        {"partition": "events-0", "start": iso(30), "end": iso(45.5), "seconds": 15.5},
        {"partition": "events-0", "start": iso(60.5), "end": iso(62), "seconds": 1.5},
        {"partition": "events-0", "start": iso(100), "end": None, "seconds": 20.0},
    ]
    assert document["provisioning"][1] == {"topic": "events", "created": iso(10), "provisioned": iso(12.5), "seconds": 2.5}
    assert document["provisioning"][3] == {"topic": "tmp", "created": iso(105), "provisioned": None, "seconds": None}
    assert document["spuIntervals"][:2] == [
        {"spu": 0, "state": "Online", "start": iso(1), "end": iso(20)},
        {"spu": 0, "state": "Offline", "start": iso(20), "end": iso(25)},
    ]
    assert document["balance"] == {
        "at": iso(120),
        "replicasPerSpu": {"0": 2, "1": 1, "2": 2, "3": 2, "4": 0, "10": 0},
        "leadersPerSpu": {"0": 2, "1": 0, "2": 0, "3": 2, "4": 0, "10": 0},
        "replicasPerRack": {"r1": 3, "r2": 2, "r3": 2},
        "rackViolations": [{"partition": "manual-0", "replicas": [0, 1], "racks": ["r1", "r1"]}],
    }
    assert document["specChanges"][-4:] == [
        {"kind": "topics", "name": "tmp", "op": "delete", "at": iso(110), "by": "alice"},
        {"kind": "spu-groups", "name": "g", "op": "create", "at": iso(115), "by": "user"},
        {"kind": "spus", "name": "g-0", "op": "create", "at": iso(115.5), "by": "sc"},
        {"kind": "topics", "name": "late", "op": "create", "at": iso(120), "by": "user"},
    ]
    assert document["unavailabilityByTopic"] == [{"topic": "events", "windows": 3, "p50": 15.5, "p99": 19.91, "max": 20.0}]
    assert document["flappingSpus"] == [{"spu": 3, "offlineCount": 3, "maxInWindow": 3}]
    assert document["scTerms"] == [
        {"event": "takeover", "sc": "sc-a", "address": "10.0.0.1:9003", "epoch": 99, "cause": "unclaimed", "previous": None, "previousEpoch": 0, "at": iso(0), "history": history_id},
        {"event": "step-down", "sc": "sc-a", "address": None, "epoch": 99, "cause": "fenced", "previous": None, "previousEpoch": None, "at": iso(64), "history": history_id},
        {"event": "takeover", "sc": "sc-a", "address": "10.0.0.1:9003", "epoch": 150, "cause": "lease-expired", "previous": "sc-b", "previousEpoch": 140, "at": iso(66), "history": history_id},
    ]
    assert document["takeovers"] == 2
    assert document["history"] == {"records": 86, "from": iso(0), "to": iso(120), "histories": [history_id]}


def test_the_human_report_and_its_charts(report_dir: Path) -> None:
    charts = sorted(path.name for path in (report_dir / "charts").iterdir())
    assert charts == ["availability.png", "leaders_per_spu.png", "replicas_per_rack.png", "replicas_per_spu.png"]
    for chart in charts:
        assert (report_dir / "charts" / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (report_dir / "report.md").read_text()
    assert "![Unavailability windows per topic](charts/availability.png)" in markdown
    assert "| 2026-03-01T10:00:20.500000Z | orders-0 | 0 | 2 | spu-offline |" in markdown
    assert "| events | 3 | 15.500 | 19.910 | 20.000 | 37.000 |" in markdown
    assert "2 takeover(s) by the SC that recorded this history." in markdown
    assert "| 2026-03-01T10:01:06.000000Z | takeover | sc-a | 10.0.0.1:9003 | 150 | lease-expired | sc-b | 140 |" in markdown


def test_the_tables_are_parquet_with_timestamps(report_dir: Path) -> None:
    leader_changes = pq.read_table(report_dir / "tables" / "leader_changes.parquet")
    assert leader_changes.column_names == ["partition", "topic", "from_spu", "to_spu", "cause", "at", "revision"]
    assert str(leader_changes.schema.field("at").type) == "timestamp[us, tz=UTC]"
    assert leader_changes.num_rows == 5
    assert sorted(path.stem for path in (report_dir / "tables").iterdir()) == sorted(report.TABLES)
