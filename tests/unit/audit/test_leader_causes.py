"""Every leader change gets a cause: the SC's election that wrote it (applied, or whose answer was
lost but which committed), "unknown" inside a gap of the history, else "external"; report.json keeps
API.md's four causes in leaderChanges and lists the others apart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, options, report
from store import history, models
from tests.unit.audit.synthetic import Writer, iso

pytestmark = pytest.mark.spark


def moved(w: Writer, name: str, leader: int) -> models.Partition:
    partition = w.get("partitions", name)
    return partition.model_copy(update={"spec": partition.spec.model_copy(update={"leader": leader})})


async def write_story(directory: Path) -> None:
    w = Writer(directory)
    w.at(0)
    for spu_id in range(3):
        w.put(w.spu(spu_id, None, "Online"))
    w.topic("t", {"partitions": 6, "replicationFactor": 3})
    provisioned = w.at(1).provision("t", {index: [index % 3, (index + 1) % 3, (index + 2) % 3] for index in range(6)})

    # t-0: an election applied at its revision.
    w.at(10).elect("t-0", 1, "spu-offline")

    # t-1: an election whose answer was lost (etcd unavailable) but which committed: its retry then
    # conflicted with the revision it had written itself.
    before = provisioned  # t-1's revision when the SC decided
    w.at(20).recorder.record_action(
        "partitions", "t-1", "elect", "leader SPU 1 went offline", "spu-offline", before, "unavailable", 0, ["partitions/t-1"]
    )
    written = w.put(moved(w, "t-1", 2))
    w.recorder.record_action(
        "partitions", "t-1", "elect", "leader SPU 1 went offline", "spu-offline", before, "conflict", written, ["partitions/t-1"]
    )

    # t-2: an election in doubt decided from an older revision of the partition: the change after
    # the newer revision cannot be its write (its compare would have failed).
    w.at(30).partition_state("t-2", "Online", 2)
    stale = w.revision - 1
    w.recorder.record_action(
        "partitions", "t-2", "elect", "leader SPU 2 is being drained", "drain", stale, "unavailable", 0, ["partitions/t-2"]
    )
    w.put(moved(w, "t-2", 0))

    # t-3: a user's write, straight into etcd.
    w.at(40).put(moved(w, "t-3", 1))

    # t-4: the SC's election whose records were dropped (queue full): a gap covers its revision.
    w.at(50).put(moved(w, "t-4", 2))
    w.recorder.record_gap(w.revision, w.revision, "queue-full", dropped=2)

    # t-5: the SC was away and etcd compacted: the snapshot after the gap shows another leader.
    w.revision += 5
    w.recorder.record_gap(w.revision - 4, w.revision, "compacted")
    for key, obj in sorted(w.objects.items()):
        if key == "partitions/t-5":
            obj = moved(w, "t-5", 0)
            w.objects[key] = obj
        w.recorder.record_change(obj.kind, obj.name, history.CREATE, w.revision - 1 if key == "partitions/t-5" else 100,
                                 models.encode(obj), source=history.LIST, snapshot=w.revision)
    w.recorder.record_sync(w.revision, snapshot=True)
    await w.close()


@pytest.fixture(scope="module")
def results(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> options.Results:
    directory = tmp_path_factory.mktemp("causes")
    asyncio.run(write_story(directory / "history"))
    export.export(directory / "history", directory / "export")
    return jobs.run(spark, directory / "export")


def test_every_leader_change_has_a_cause(results: options.Results) -> None:
    assert [
        (row["partition"], row["from_spu"], row["to_spu"], row["cause"]) for row in results.tables["leader_changes"]
    ] == [
        ("t-0", 0, 1, "spu-offline"),  # applied
        ("t-1", 1, 2, "spu-offline"),  # in doubt, decided from the revision it replaced
        ("t-2", 2, 0, "external"),  # in doubt, but decided from an older revision
        ("t-3", 0, 1, "external"),  # nobody's action
        ("t-4", 1, 2, "unknown"),  # a queue-full gap covers it
        ("t-5", 2, 0, "unknown"),  # seen in the snapshot after a compacted gap
    ]


def test_report_json_keeps_the_four_causes_of_api_md_and_lists_the_others_apart(results: options.Results) -> None:
    document = report.to_json(results)
    assert [(change["partition"], change["cause"]) for change in document["leaderChanges"]] == [
        ("t-0", "spu-offline"), ("t-1", "spu-offline"),
    ]
    assert {change["cause"] for change in document["leaderChanges"]} <= set(jobs.CAUSES)
    assert document["externalLeaderChanges"] == [
        {"partition": "t-2", "from": 2, "to": 0, "cause": "external", "at": iso(30)},
        {"partition": "t-3", "from": 0, "to": 1, "cause": "external", "at": iso(40)},
        {"partition": "t-4", "from": 1, "to": 2, "cause": "unknown", "at": iso(50)},
        {"partition": "t-5", "from": 2, "to": 0, "cause": "unknown", "at": iso(50)},
    ]
    assert [(row["spu"], row["cause"], row["gained"], row["lost"]) for row in results.tables["leader_changes_by_spu"]
            if row["cause"] in report.NOT_BY_SC] == [
        (0, "external", 1, 1), (0, "unknown", 1, 0), (1, "external", 1, 0), (1, "unknown", 0, 1),
        (2, "external", 0, 1), (2, "unknown", 1, 1),
    ]
