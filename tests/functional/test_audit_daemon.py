"""The history of a real daemon on a real etcd, exported and audited by the Spark jobs.

SPU health is driven through the daemon's health view (as the connection manager does when an
SPU connects or goes away); with no SPU reporting offsets, a lost leader is replaced by an election
(unclean ones are enabled here), and a partition with no other replica goes LeaderOffline until its
SPU is back.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from connection_manager import health as health_module
from controller import config
from controller.audit import export, jobs, report
from store import embedded_etcd, etcd, history, models
from tests.fixtures.daemon import COMMON_SETTINGS, Running, etcd_settings, running

pytestmark = [pytest.mark.etcd]


def settings_for(server: embedded_etcd.EmbeddedEtcd, history_dir: Path) -> config.Settings:
    return etcd_settings(server, history_dir=history_dir, spu_offline_grace=3600.0, unclean_leader_election=True)


def set_health(sc: Running, spu_id: int, online: bool) -> None:
    assert sc.daemon.pipeline is not None
    state = health_module.Health.ONLINE if online else health_module.Health.OFFLINE
    sc.daemon.pipeline.health.set(spu_id, state, asyncio.get_running_loop().time())


async def wait_for(sc: Running, kind: str, name: str, check: Any) -> Any:
    found: list[Any] = []

    async def matches() -> None:
        obj = await sc.read(kind, name)
        assert obj is not None and check(obj), obj
        found[:] = [obj]

    await sc.eventually(matches)
    return found[0]


def records(history_dir: Path) -> list[dict[str, Any]]:
    return list(history.HistoryReader(history_dir).records())


def micros_of(record: dict[str, Any]) -> int:
    return record["time"]


def change(rows: list[dict[str, Any]], kind: str, name: str, predicate: Any = lambda record: True) -> dict[str, Any]:
    """The first change record of ``kind``/``name`` that satisfies ``predicate``."""
    return next(
        record for record in rows
        if record["type"] == "change" and record["kind"] == kind and record["name"] == name and predicate(record)
    )


async def test_a_cluster_story_recorded_by_the_daemon_audited_on_spark(
    etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path, spark: Any
) -> None:
    history_dir = tmp_path / "history"
    async with running(settings_for(etcd_server, history_dir)) as sc:
        for spu_id, rack in ((0, "r1"), (1, "r1"), (2, "r2"), (3, "r2")):
            await sc.register_spu(spu_id, rack)
        for name, partitions, factor in (("orders", 4, 2), ("solo", 1, 1)):
            status, body = await sc.call(
                "POST", "/v1/topics", {"name": name, "spec": {"partitions": partitions, "replicationFactor": factor}}
            )
            assert status in (200, 201) and body["status"]["resolution"] == "Provisioned", body
        for name in ("orders-0", "orders-1", "orders-2", "orders-3"):
            await wait_for(sc, "partitions", name, lambda p: True)
        solo = await wait_for(sc, "partitions", "solo-0", lambda p: True)
        victim = solo.spec.leader
        before = await sc.read_all("partitions")
        led_by_victim = sorted(name for name, p in before.items() if p.spec.leader == victim and name != "solo-0")

        # The victim SPU goes away: its partitions elsewhere move (unclean: no offsets known),
        # solo-0 (its only replica) has no leader until the SPU is back.
        set_health(sc, victim, online=False)
        await wait_for(sc, "partitions", "solo-0", lambda p: p.status.resolution is models.PartitionResolution.LEADER_OFFLINE)
        for name in led_by_victim:
            await wait_for(sc, "partitions", name, lambda p: p.spec.leader != victim)
        set_health(sc, victim, online=True)
        await wait_for(sc, "partitions", "solo-0", lambda p: p.status.resolution is models.PartitionResolution.ONLINE)
        status, body = await sc.call("DELETE", "/v1/topics/solo")
        assert status in (200, 202, 204), body
        await sc.eventually(lambda: _absent(sc, "partitions", "solo-0"))
        after = await sc.read_all("partitions")
        spus = await sc.read_all("spus")
        assert sc.daemon.history is not None
        await sc.daemon.history.flush()

    rows = records(history_dir)
    exported = export.export(history_dir, tmp_path / "export")
    assert exported.rows == len(rows)
    results = jobs.run(spark, tmp_path / "export")
    tables = results.tables

    # Leader changes: exactly the victim's partitions (other than solo-0), each with the cause of
    # the election action that moved it (as the partition controller recorded it).
    elections = {
        record["keys"][0]: record["cause"]
        for record in rows
        if record["type"] == "action" and record["verb"] == "elect" and record["outcome"] == "applied"
    }
    assert sorted(elections) == [f"partitions/{name}" for name in led_by_victim]
    assert set(elections.values()) <= {"spu-offline", "unclean"}
    moved = [(row["partition"], row["from_spu"], row["to_spu"], row["cause"]) for row in tables["leader_changes"]]
    assert sorted(moved) == [
        (name, victim, after[name].spec.leader, elections[f"partitions/{name}"]) for name in led_by_victim
    ]
    assert led_by_victim, "the placement gave the victim no leadership to lose: the scenario tests nothing"

    # solo-0 was unavailable from its LeaderOffline record to its Online one.
    lost = change(rows, "partitions", "solo-0", lambda r: (r["object"] or {}).get("status", {}).get("resolution") == "LeaderOffline")
    back = change(rows, "partitions", "solo-0", lambda r: r["seq"] > lost["seq"] and r["object"]["status"]["resolution"] == "Online")
    assert [(row["partition"], row["start_us"], row["end_us"]) for row in tables["unavailability"]] == [
        ("solo-0", micros_of(lost), micros_of(back))
    ]
    assert tables["unavailability"][0]["seconds"] == (micros_of(back) - micros_of(lost)) / 1e6

    # Provisioning: from each topic's create record to its Provisioned one.
    expected_provisioning = []
    for topic in ("orders", "solo"):
        created = change(rows, "topics", topic, lambda r: r["op"] == "create")
        provisioned = change(rows, "topics", topic, lambda r: (r["object"] or {}).get("status", {}).get("resolution") == "Provisioned")
        expected_provisioning.append((topic, micros_of(created), micros_of(provisioned)))
    assert [(row["topic"], row["created_us"], row["provisioned_us"]) for row in tables["provisioning"]] == sorted(
        expected_provisioning, key=lambda row: row[1]
    )

    # SPU intervals: the victim was Online, Offline, Online; the others Online throughout.
    states = [(row["spu"], row["state"], row["end_us"] is None) for row in tables["spu_intervals"]]
    expected_states = []
    for spu_id in range(4):
        if spu_id == victim:
            expected_states += [(spu_id, "Online", False), (spu_id, "Offline", False), (spu_id, "Online", True)]
        else:
            expected_states.append((spu_id, "Online", True))
    assert states == expected_states

    # Balance at the end: what the store holds.
    replicas = {spu_id: 0 for spu_id in range(4)}
    leaders = {spu_id: 0 for spu_id in range(4)}
    for partition in after.values():
        leaders[partition.spec.leader] += 1
        for spu_id in partition.spec.replicas:
            replicas[spu_id] += 1
    balance = report.to_json(results)["balance"]
    assert balance["replicasPerSpu"] == {str(spu_id): count for spu_id, count in replicas.items()}
    assert balance["leadersPerSpu"] == {str(spu_id): count for spu_id, count in leaders.items()}
    racks = {spu.spec.id: spu.spec.rack for spu in spus.values()}
    assert balance["replicasPerRack"] == {
        rack: sum(count for spu_id, count in replicas.items() if racks[spu_id] == rack) for rack in ("r1", "r2")
    }
    assert balance["rackViolations"] == []

    # Spec changes: users created the SPUs and topics and deleted solo; the SC created the
    # partitions, moved leaders and deleted solo's partition.
    spec_changes = [(row["kind"], row["name"], row["op"], row["by"]) for row in tables["spec_changes"]]
    # No credential is configured: the API's writes are anonymous, from this host.
    assert spec_changes[:4] == [("spus", f"spu-{spu_id}", "create", "anonymous@loopback") for spu_id in range(4)]
    assert ("topics", "solo", "delete", "anonymous@loopback") in spec_changes
    assert {row["address"] for row in tables["spec_changes"] if row["by"] == "anonymous@loopback"} == {"127.0.0.1"}
    assert ("partitions", "solo-0", "delete", "sc") in spec_changes
    assert sorted(row for row in spec_changes if row[0] == "partitions" and row[2] == "update") == [
        ("partitions", name, "update", "sc") for name in led_by_victim
    ]
    assert sorted(row[1] for row in spec_changes if row[0] == "partitions" and row[2] == "create") == sorted(
        [f"orders-{index}" for index in range(4)] + ["solo-0"]
    )


async def _absent(sc: Running, kind: str, name: str) -> None:
    assert await sc.read(kind, name) is None


async def test_changes_made_while_the_sc_was_down_are_replayed_into_the_history(
    etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path
) -> None:
    history_dir = tmp_path / "history"
    settings = settings_for(etcd_server, history_dir)
    async with running(settings) as sc:
        await sc.register_spu(0)
        status, body = await sc.call("POST", "/v1/topics", {"name": "kept", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert status in (200, 201), body

    # The SC is down: a topic created, an SPU registered, a topic deleted, straight into etcd.
    own = await etcd.EtcdStore.open(settings.etcd_endpoints, settings.key_prefix, 2.0)
    try:
        topic = models.Topic.model_validate({"name": "while-down", "spec": {"partitions": 1, "replicationFactor": 1}})
        created = await own.create(topic.key, models.encode(topic))
        spu = models.Spu.model_validate(
            {"name": "spu-7", "spec": {"id": 7, "publicEndpoint": {"host": "h", "port": 1}, "privateEndpoint": {"host": "h", "port": 2}}}
        )
        registered = await own.create(spu.key, models.encode(spu))
        deleted = await own.delete("topics/kept")
    finally:
        await own.close()

    async with running(settings) as sc:
        await wait_for(sc, "topics", "while-down", lambda t: t.status.resolution is models.TopicResolution.PROVISIONED)
        assert sc.daemon.history is not None
        await sc.daemon.history.flush()

    replayed = [
        (record["kind"], record["name"], record["op"], record["revision"])
        for record in records(history_dir)
        if record["type"] == "change" and record["source"] == "replay"
    ]
    assert replayed == [
        ("topics", "while-down", "create", created),
        ("spus", "spu-7", "create", registered),
        ("topics", "kept", "delete", deleted),
    ]


async def test_a_torn_last_record_is_cut_on_restart_and_its_change_is_replayed(
    etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path
) -> None:
    history_dir = tmp_path / "history"
    settings = settings_for(etcd_server, history_dir)
    async with running(settings) as sc:
        await sc.register_spu(0)
        assert sc.daemon.history is not None
        await sc.daemon.history.flush()
    rows = records(history_dir)
    last_change = [record for record in rows if record["type"] == "change"][-1]
    # The daemon's last record is its change (the SPU going Online), or an action after it:
    # keep everything before that change and tear the change in the middle.
    segment = history.segment_paths(history_dir)[-1]
    payloads = history.scan_segment(segment).payloads
    first_seq = int(segment.stem)
    offset = sum(len(history.frame(payload)) for payload in payloads[: last_change["seq"] - first_seq])
    with open(segment, "r+b") as file:
        file.truncate(offset + 20)

    async with running(settings) as sc:
        assert sc.daemon.history is not None
        assert sc.daemon.history.stats.truncated_bytes == 20
        status, body = await sc.call("POST", "/v1/topics", {"name": "after", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert status in (200, 201), body
        await sc.daemon.history.flush()

    rows = records(history_dir)
    assert [record["seq"] for record in rows] == list(range(1, len(rows) + 1))
    again = change(rows, last_change["kind"], last_change["name"], lambda r: r["seq"] >= last_change["seq"])
    assert (again["source"], again["revision"], again["op"]) == ("replay", last_change["revision"], last_change["op"])
    # Recorded at once in the torn record's place, unless the API's write (its request record, written
    # at commit, not when the watch brings the change back) came first.
    between = [record["type"] for record in rows if last_change["seq"] <= record["seq"] < again["seq"]]
    assert set(between) <= {history.REQUEST}, between
    result = export.export(history_dir, tmp_path / "export")
    assert result.rows == len(rows)
    dataset = pads.dataset(tmp_path / "export", format="parquet", partitioning="hive").to_table()
    assert sorted(dataset.column("seq").to_pylist()) == list(range(1, len(rows) + 1))


def test_sc_audit_export_prints_what_it_exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from controller.cli import main as cli

    missing = cli.main(["audit", "export", "--history-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
    assert missing == 1
    assert "is not a history directory" in capsys.readouterr().err

    recorder = history.Recorder.open(tmp_path / "history")
    recorder.record_sync(5, snapshot=True)
    asyncio.run(_close(recorder))
    assert cli.main(["audit", "export", "--history-dir", str(tmp_path / "history"), "--out", str(tmp_path / "out")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["rows"], printed["firstSeq"], printed["lastSeq"]) == (1, 1, 1)
    assert cli.main(["audit", "export", "--history-dir", str(tmp_path / "history"), "--out", str(tmp_path / "out"), "--since", "soon"]) == 1
    assert "time 'soon' is not ISO 8601" in capsys.readouterr().err


async def _close(recorder: history.Recorder) -> None:
    await recorder.start()
    await recorder.close()


def test_sc_audit_report_runs_the_jobs_in_the_shared_session(tmp_path: Path, spark: Any) -> None:
    from controller.cli import main as cli

    recorder = history.Recorder.open(tmp_path / "history")
    recorder.record_change("topics", "t", history.CREATE, 5, models.encode(models.Topic.model_validate({"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}})))
    asyncio.run(_close(recorder))
    export.export(tmp_path / "history", tmp_path / "export")
    code = cli.main(["audit", "report", "--history", str(tmp_path / "export"), "--out", str(tmp_path / "report"), "--at", "2100-01-01"])
    assert code == 0
    document = json.loads((tmp_path / "report" / "report.json").read_text())
    assert document["provisioning"][0]["topic"] == "t" and document["provisioning"][0]["provisioned"] is None
    assert document["balance"]["at"] == "2100-01-01T00:00:00.000000Z"
    assert not spark.sparkContext._jsc.sc().isStopped()  # the CLI stops only a session it started


async def test_the_history_of_an_sc_that_created_an_spu_group_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reported crash: an SPU group's spec.replicas is a number where a partition's is a list."""
    from controller.cli import main as cli

    history_dir = tmp_path / "history"
    settings = config.Settings(store=config.StoreKind.MEMORY, history_dir=history_dir, **COMMON_SETTINGS)
    async with running(settings) as sc:
        assert await asyncio.to_thread(cli.main, ["spu-group", "create", "g", "--replicas", "1", "--sc", sc.url]) == 0
        await wait_for(sc, "spus", "g-0", lambda spu: True)
        assert sc.daemon.history is not None
        await sc.daemon.history.flush()
    capsys.readouterr()

    out = tmp_path / "export"
    assert await asyncio.to_thread(cli.main, ["audit", "export", "--history-dir", str(history_dir), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    rows = records(history_dir)
    assert (printed["rows"], printed["malformedRecords"]) == (len(rows), 0)
    dataset = pads.dataset(out, format="parquet", partitioning="hive").to_table().to_pylist()
    groups = [row for row in dataset if row["type"] == "change" and row["kind"] == "spu-groups"]
    assert groups and all(json.loads(row["spec"])["replicas"] == 1 for row in groups)
    assert groups[-1]["resolution"] == "Reserved"
    [managed] = {row["spu_id"] for row in dataset if row["type"] == "change" and row["name"] == "g-0"}
    assert managed == 0
