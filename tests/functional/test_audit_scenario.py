"""The audit issue's scenario end to end: the daemon on a real etcd recording its history, simulator
SPUs as real processes (killed with SIGKILL, restarted, drained and stopped), a topic deleted; then
the history exported to Parquet and audited by the Spark jobs, whose figures are asserted exactly.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, report
from store import embedded_etcd, history, models
from tests.fixtures.daemon import Running, etcd_settings, running

pytestmark = [pytest.mark.etcd, pytest.mark.spark]

SPUS = (0, 1, 2, 3)
# Known placement (preferred leader first): SPU 0 leads orders-0 and orders-1, SPU 1 leads
# orders-2 and orders-3; solo-0 lives on SPU 0 alone, so it has no leader while SPU 0 is down.
ORDERS = {0: [0, 1, 2], 1: [0, 2, 3], 2: [1, 2, 3], 3: [1, 3, 0], 4: [2, 3, 1], 5: [3, 0, 2]}
SOLO = {0: [0]}
KILLED, DRAINED = 0, 1
LED_BY_KILLED = ["orders-0", "orders-1"]
LED_BY_DRAINED = ["orders-2", "orders-3"]
WAIT = 30.0  # generous: 4 SPU processes, the SC and etcd share 2 busy cores

ONLINE = models.PartitionResolution.ONLINE
LEADER_OFFLINE = models.PartitionResolution.LEADER_OFFLINE


class Spus:
    """The simulator SPUs, each a real `sc spu run` process talking to the SC's private port."""

    def __init__(self, sc_private: str, data_dir: Path) -> None:
        self.sc_private = sc_private
        self.data_dir = data_dir  # each keeps its log across a kill, as an SPU's disk would
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, spu_id: int) -> None:
        assert spu_id not in self.processes or self.processes[spu_id].poll() is not None
        self.processes[spu_id] = subprocess.Popen(
            [sys.executable, "-m", "controller.cli", "spu", "run", "--id", str(spu_id), "--sc-private", self.sc_private,
             "--data-dir", str(self.data_dir), "--log-format", "json", "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self, spu_id: int, how: signal.Signals = signal.SIGTERM) -> int:
        process = self.processes[spu_id]
        if process.poll() is None:
            process.send_signal(how)
        return process.wait(20)

    def stop_all(self) -> None:
        for spu_id in self.processes:
            self.stop(spu_id)


@pytest.fixture
def spus() -> Iterator[list[Spus]]:
    """Filled in by the test once the SC's private port is known; every process stopped on the way out."""
    holder: list[Spus] = []
    try:
        yield holder
    finally:
        for group in holder:
            group.stop_all()


async def register(sc: Running) -> None:
    ports = iter(embedded_etcd.free_ports(2 * len(SPUS)))
    for spu_id in SPUS:
        await sc.register_spu(spu_id, online=False, ports=(next(ports), next(ports)))


async def create_topic(sc: Running, name: str, assignment: dict[int, list[int]]) -> None:
    spec = {"replicaAssignment": [{"id": index, "replicas": replicas} for index, replicas in assignment.items()]}
    status, body = await sc.call("POST", "/v1/topics", {"name": name, "spec": spec})
    assert status == 201, body


async def spu_resolutions(sc: Running, expected: dict[int, models.SpuResolution]) -> None:
    found = {spu.spec.id: spu.status.resolution for spu in (await sc.read_all("spus")).values()}
    assert {spu_id: found.get(spu_id) for spu_id in expected} == expected, found


async def partitions(sc: Running) -> dict[str, models.Partition]:
    return await sc.read_all("partitions")


async def all_online_in_sync(sc: Running, expected_names: set[str], leaders_preferred: bool = True) -> None:
    """Every partition Online with each of its replicas in sync (and, if asked, led by its preferred leader)."""
    found = await partitions(sc)
    assert set(found) == expected_names, sorted(found)
    for partition in found.values():
        assert partition.status.resolution is ONLINE, partition
        assert partition.status.lrs == len(partition.spec.replicas) - 1, partition
        if leaders_preferred:
            assert partition.spec.leader == partition.spec.replicas[0], partition


def expected_names(*topics: tuple[str, dict[int, list[int]]]) -> set[str]:
    return {f"{topic}-{index}" for topic, assignment in topics for index in assignment}


async def test_kill_restart_drain_and_delete_give_exact_audit_figures(
    etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path, spark: Any, spus: list[Spus]
) -> None:
    history_dir = tmp_path / "history"
    settings = etcd_settings(etcd_server, history_dir=history_dir)
    both = expected_names(("orders", ORDERS), ("solo", SOLO))
    async with running(settings) as sc:
        await register(sc)
        group = Spus(f"127.0.0.1:{sc.daemon.private_port}", tmp_path / "spus")
        spus.append(group)
        for spu_id in SPUS:
            group.start(spu_id)
        await sc.eventually(lambda: spu_resolutions(sc, {spu_id: models.SpuResolution.ONLINE for spu_id in SPUS}), WAIT)
        await create_topic(sc, "orders", ORDERS)
        await create_topic(sc, "solo", SOLO)
        await sc.eventually(lambda: all_online_in_sync(sc, both), WAIT)

        # SPU 0 is killed: its two orders partitions move to an in-sync follower, solo-0 has no leader.
        assert group.stop(KILLED, signal.SIGKILL) == -signal.SIGKILL

        async def failed_over() -> None:
            found = await partitions(sc)
            for name in LED_BY_KILLED:
                assert found[name].spec.leader != KILLED and found[name].status.resolution is ONLINE, found[name]
            assert found["solo-0"].status.resolution is LEADER_OFFLINE, found["solo-0"]

        await sc.eventually(failed_over, WAIT)
        await sc.eventually(lambda: spu_resolutions(sc, {KILLED: models.SpuResolution.OFFLINE}), WAIT)
        moved_to = {name: (await partitions(sc))[name].spec.leader for name in LED_BY_KILLED}

        # SPU 0 comes back with its log: it catches up, its leaders propose it back into their
        # in-sync sets, and the preferred leaders return to it; solo-0 (its log intact) leads again.
        group.start(KILLED)
        await sc.eventually(lambda: all_online_in_sync(sc, both), WAIT)

        # SPU 1 is drained, then stopped: its two leaderships move first, nothing is left leaderless.
        status, body = await sc.call("POST", f"/v1/spus/spu-{DRAINED}/drain")
        assert (status, body["drained"], body["leading"]) == (200, True, []), body
        drained_to = {name: (await partitions(sc))[name].spec.leader for name in LED_BY_DRAINED}
        assert DRAINED not in drained_to.values(), drained_to
        assert group.stop(DRAINED) == 0
        await sc.eventually(lambda: spu_resolutions(sc, {DRAINED: models.SpuResolution.OFFLINE}), WAIT)

        # solo is deleted, with its partition.
        status, body = await sc.call("DELETE", "/v1/topics/solo")
        assert status in (200, 202, 204), body

        async def solo_gone() -> None:
            assert await sc.read("topics", "solo") is None
            assert set(await partitions(sc)) == expected_names(("orders", ORDERS))

        await sc.eventually(solo_gone, WAIT)
        final = await partitions(sc)
        assert sc.daemon.history is not None
        await sc.daemon.history.flush()
    # The SC is stopped before the SPUs, so that the history ends with SPUs 0, 2 and 3 Online.
    group.stop_all()
    assert [group.processes[spu_id].returncode for spu_id in (0, 2, 3)] == [0, 0, 0]

    rows = list(history.HistoryReader(history_dir).records())
    exported = export.export(history_dir, tmp_path / "export")
    assert exported.rows == len(rows)
    results = jobs.run(spark, tmp_path / "export")
    tables = results.tables
    document = report.to_json(results)

    # Leader changes: exactly the two of the kill, the two returns and the two of the drain, each
    # with the cause of the SC's election, and at the revision of that election's write.
    changes = [(row["partition"], row["from_spu"], row["to_spu"], row["cause"]) for row in tables["leader_changes"]]
    assert sorted(changes) == sorted(
        [(name, KILLED, moved_to[name], "spu-offline") for name in LED_BY_KILLED]
        + [(name, moved_to[name], KILLED, "preferred-leader") for name in LED_BY_KILLED]
        + [(name, DRAINED, drained_to[name], "drain") for name in LED_BY_DRAINED]
    )
    elections = sorted(
        (record["keys"], record["revision"], record["cause"])
        for record in rows
        if record["type"] == "action" and record["verb"] == "elect" and record["outcome"] == "applied"
    )
    assert sorted(([f"partitions/{row['partition']}"], row["revision"], row["cause"]) for row in tables["leader_changes"]) == elections
    assert collections.Counter(change["cause"] for change in document["leaderChanges"]) == {
        "spu-offline": 2, "preferred-leader": 2, "drain": 2,
    }
    assert document["externalLeaderChanges"] == []
    by_spu = {(row["spu"], row["cause"]): (row["gained"], row["lost"]) for row in tables["leader_changes_by_spu"]}
    assert by_spu[(KILLED, "spu-offline")] == (0, 2)
    assert by_spu[(KILLED, "preferred-leader")] == (2, 0)
    assert by_spu[(DRAINED, "drain")][1] == 2
    assert sum(gained for gained, _ in by_spu.values()) == sum(lost for _, lost in by_spu.values()) == 6

    # Unavailability: solo-0 alone had no leader, from SPU 0's kill to its return.
    lost = next(r for r in rows if _partition_record(r, "solo-0", "LeaderOffline"))
    back = next(r for r in rows if r["seq"] > lost["seq"] and _partition_record(r, "solo-0", "Online"))
    assert [(row["partition"], row["start_us"], row["end_us"]) for row in tables["unavailability"]] == [
        ("solo-0", lost["time"], back["time"])
    ]
    assert [(row["topic"], row["windows"]) for row in tables["unavailability_by_topic"]] == [("solo", 1)]
    window = (back["time"] - lost["time"]) / 1e6
    assert document["unavailabilityByTopic"] == [
        {"topic": "solo", "windows": 1, "p50": round(window, 6), "p99": round(window, 6), "max": round(window, 6)}
    ]

    # Provisioning: one latency per topic, from its create record to its Provisioned one.
    expected_provisioning = []
    for topic in ("orders", "solo"):
        created = next(r for r in rows if _topic_record(r, topic) and r["op"] == "create")
        provisioned = next(
            r for r in rows if _topic_record(r, topic) and (r["object"] or {}).get("status", {}).get("resolution") == "Provisioned"
        )
        expected_provisioning.append((topic, created["time"], provisioned["time"]))
    assert sorted((row["topic"], row["created_us"], row["provisioned_us"]) for row in tables["provisioning"]) == expected_provisioning

    # SPU intervals: SPU 0 Online, Offline (the kill), Online again; SPU 1 Online then Offline to the
    # end (stopped after its drain); SPUs 2 and 3 Online throughout. One offline interval each for 0 and 1.
    assert [(row["spu"], row["state"], row["end_us"] is None) for row in tables["spu_intervals"]] == [
        (0, "Online", False), (0, "Offline", False), (0, "Online", True),
        (1, "Online", False), (1, "Offline", True),
        (2, "Online", True),
        (3, "Online", True),
    ]
    assert tables["flapping_spus"] == []

    # Balance at the end: what etcd holds (orders only; SPU 1 still hosts its replicas, leads none).
    assert document["balance"]["replicasPerSpu"] == {"0": 4, "1": 4, "2": 5, "3": 5}
    leaders = collections.Counter(str(partition.spec.leader) for partition in final.values())
    assert document["balance"]["leadersPerSpu"] == {spu: leaders.get(spu, 0) for spu in ("0", "1", "2", "3")}
    assert document["balance"]["leadersPerSpu"]["1"] == 0

    # Spec changes: the users' creates and delete, the SC's partition creates, leader moves and delete.
    spec_changes = collections.Counter((row["kind"], row["op"], row["by"]) for row in tables["spec_changes"])
    assert spec_changes == {
        ("spus", "create", "anonymous@loopback"): 4,
        ("spus", "update", "anonymous@loopback"): 1,  # the drain of SPU 1, the operator's intent in its spec
        ("topics", "create", "anonymous@loopback"): 2,
        ("topics", "delete", "anonymous@loopback"): 1,
        ("partitions", "create", "sc"): 7,
        ("partitions", "update", "sc"): 6,
        ("partitions", "delete", "sc"): 1,
    }


def _partition_record(record: dict[str, Any], name: str, resolution: str) -> bool:
    return (
        record["type"] == "change" and record["kind"] == "partitions" and record["name"] == name
        and (record["object"] or {}).get("status", {}).get("resolution") == resolution
    )


def _topic_record(record: dict[str, Any], name: str) -> bool:
    return record["type"] == "change" and record["kind"] == "topics" and record["name"] == name
