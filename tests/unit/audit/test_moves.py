"""Replica moves in the audit report: each move that ended (completed or reverted), the SPUs it
brought a replica and took one from, how long it took, and the counts per SPU."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, options, report
from store import models
from tests.unit.audit.synthetic import Writer, iso

pytestmark = pytest.mark.spark


def step(w: Writer, name: str, replicas: list[int], cause: str, reassignment: tuple[list[int], list[int]] | None, leader: int | None = None) -> int:
    """The partition controller's write of one move step (spec only; the status does not matter here)."""
    partition = w.get("partitions", name)
    move = None if reassignment is None else models.Reassignment(previous=reassignment[0], target=reassignment[1])
    spec = models.PartitionSpec(leader=partition.spec.leader if leader is None else leader, replicas=replicas, reassignment=move)
    return w.put(partition.model_copy(update={"spec": spec}), by_sc="move step", cause=cause, verb="update-spec")


async def write_story(directory: Path) -> None:
    w = Writer(directory)
    w.at(0)
    for spu_id in range(4):
        w.put(w.spu(spu_id, None, "Online"))
    w.topic("t", {"partitions": 2, "replicationFactor": 2})
    w.at(1).provision("t", {0: [0, 1], 1: [1, 2]})
    # t-0 moves from [0, 1] to [3, 1]: 3 arrives, 0 leaves, in 4 s.
    step(w.at(10), "t-0", [0, 1], "move-started", ([0, 1], [3, 1]))
    step(w.at(11), "t-0", [0, 1, 3], "move-adding", ([0, 1], [3, 1]))
    step(w.at(13), "t-0", [0, 1, 3], "reassignment", ([0, 1], [3, 1]), leader=3)
    step(w.at(15), "t-0", [3, 1], "move-completed", None)
    # t-1 starts moving to [1, 3], then is cancelled: back on [1, 2], nothing moved.
    step(w.at(20), "t-1", [1, 2], "move-started", ([1, 2], [1, 3]))
    step(w.at(21), "t-1", [1, 2, 3], "move-adding", ([1, 2], [1, 3]))
    step(w.at(22), "t-1", [1, 2, 3], "move-cancelled", ([1, 2], [1, 2]))
    step(w.at(23.5), "t-1", [1, 2], "move-reverted", None)
    await w.close()


@pytest.fixture(scope="module")
def results(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> options.Results:
    directory = tmp_path_factory.mktemp("moves")
    asyncio.run(write_story(directory / "history"))
    export.export(directory / "history", directory / "export")
    return jobs.run(spark, directory / "export")


def test_each_move_that_ended_says_what_it_moved_and_how_long_it_took(results: options.Results) -> None:
    assert [
        (row["partition"], row["outcome"], row["arrived"], row["left"], row["seconds"]) for row in results.tables["moves"]
    ] == [("t-0", "completed", [3], [0], 4.0), ("t-1", "reverted", [], [], 2.5)]
    assert results.tables["moves_by_spu"] == [{"spu": 0, "moves_in": 0, "moves_out": 1}, {"spu": 3, "moves_in": 1, "moves_out": 0}]


def test_report_json_lists_the_moves_and_the_moves_per_spu(results: options.Results) -> None:
    document = report.to_json(results)
    assert document["movesBySpu"] == [{"spu": 0, "movesIn": 0, "movesOut": 1}, {"spu": 3, "movesIn": 1, "movesOut": 0}]
    assert document["moves"][0] == {
        "partition": "t-0", "outcome": "completed", "arrived": [3], "left": [0], "started": iso(11), "at": iso(15), "seconds": 4.0,
    }
    # The move's leader change is the SC's, with its cause.
    assert [(change["partition"], change["from"], change["to"], change["cause"]) for change in document["leaderChanges"]] == [
        ("t-0", 0, 3, "reassignment")
    ]
