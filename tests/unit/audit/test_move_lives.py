"""Replica moves over a history with holes: a move's writes are paired only with writes of the same
move, never with those of a move before it, of another life of the partition (deleted and created
again under its name: another uid), nor with a snapshot's copy of a write the history holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, options, report
from store import models
from tests.unit.audit.synthetic import Writer, caught_up, iso, move_step

pytestmark = pytest.mark.spark


def partition(name: str, uid: int | None, replicas: list[int]) -> models.Partition:
    return models.Partition.model_validate({"name": name, "uid": uid, "spec": {"leader": replicas[0], "replicas": replicas}})


async def write_story(directory: Path) -> None:
    w = Writer(directory)
    w.at(0)
    for spu_id in range(4):
        w.put(w.spu(spu_id, None, "Online"))
    w.put(partition("t-0", 11, [0, 1]), partition("t-1", 33, [1, 2]), partition("t-2", None, [2, 3]))
    w.put(partition("t-3", 99, [3, 0]), partition("t-4", 55, [0, 2]), partition("t-5", 66, [1, 3]))
    w.put(partition("t-6", None, [0, 3]), partition("t-7", None, [1, 2]))

    # t-0 and t-1 start moving, and are deleted and created again (another uid) before either ends.
    move_step(w.at(10), "t-0", [0, 1], "move-started", ([0, 1], [0, 2]))
    move_step(w.at(11), "t-0", [0, 1, 2], "move-adding", ([0, 1], [0, 2]))
    caught_up(w.at(12), "t-0", [0, 1, 2], hw=120)
    move_step(w.at(10), "t-1", [1, 2], "move-started", ([1, 2], [1, 3]))
    move_step(w.at(11), "t-1", [1, 2, 3], "move-adding", ([1, 2], [1, 3]))
    caught_up(w.at(12), "t-1", [1, 2, 3], hw=50)
    move_step(w.at(10), "t-6", [0, 3], "move-started", ([0, 3], [0, 1]))
    move_step(w.at(11), "t-6", [0, 3, 1], "move-adding", ([0, 3], [0, 1]))
    caught_up(w.at(12), "t-6", [0, 3, 1], hw=30)
    # t-2 (created before uids) and t-3 move across a snapshot after a gap.
    move_step(w.at(10), "t-2", [2, 3], "move-started", ([2, 3], [2, 0]))
    move_step(w.at(11), "t-2", [2, 3, 0], "move-adding", ([2, 3], [2, 0]))
    move_step(w.at(10), "t-3", [3, 0], "move-started", ([3, 0], [3, 1]))
    move_step(w.at(11), "t-3", [3, 0, 1], "move-adding", ([3, 0], [3, 1]))

    # t-7 is given a uid by hand while it moves: the same partition to its SPUs, the same move.
    move_step(w.at(10), "t-7", [1, 2], "move-started", ([1, 2], [1, 0]))
    move_step(w.at(11), "t-7", [1, 2, 0], "move-adding", ([1, 2], [1, 0]))
    w.at(12).put(w.get("partitions", "t-7").model_copy(update={"uid": 77}))
    caught_up(w.at(13), "t-7", [1, 2, 0], hw=15)
    move_step(w.at(14), "t-7", [1, 0], "move-completed", None)

    # t-4 moves twice; the history loses the start of the second move (its queue was full).
    move_step(w.at(13), "t-4", [0, 2], "move-started", ([0, 2], [0, 3]))
    move_step(w.at(14), "t-4", [0, 2, 3], "move-adding", ([0, 2], [0, 3]))
    caught_up(w.at(15), "t-4", [0, 2, 3], hw=90)
    move_step(w.at(16), "t-4", [0, 3], "move-completed", None)
    with w.at(17).lost():
        move_step(w, "t-4", [0, 3], "move-started", ([0, 3], [0, 1]))
        move_step(w, "t-4", [0, 3, 1], "move-adding", ([0, 3], [0, 1]))
        caught_up(w, "t-4", [0, 3, 1], hw=95)
        # t-5's only move: nothing of its start is left.
        move_step(w, "t-5", [1, 3], "move-started", ([1, 3], [1, 0]))
        move_step(w, "t-5", [1, 3, 0], "move-adding", ([1, 3], [1, 0]))
        caught_up(w, "t-5", [1, 3, 0], hw=9)
    move_step(w.at(18), "t-4", [0, 1], "move-completed", None)
    move_step(w.at(19), "t-5", [1, 0], "move-completed", None)

    # t-0's new life is recorded from its create, but the start of its move is lost; t-1's delete,
    # create and start are all lost: only its uid tells the new life.
    w.at(20).delete("partitions", "t-0")
    w.at(21).put(partition("t-0", 22, [1, 0]))
    with w.at(22).lost():
        move_step(w, "t-0", [1, 0], "move-started", ([1, 0], [1, 2]))
        move_step(w, "t-0", [1, 0, 2], "move-adding", ([1, 0], [1, 2]))
        caught_up(w, "t-0", [1, 0, 2], hw=5)
    with w.at(25).lost():
        w.delete("partitions", "t-1")
        w.put(partition("t-1", 44, [2, 0]))
        move_step(w, "t-1", [2, 0], "move-started", ([2, 0], [2, 3]))
        move_step(w, "t-1", [2, 0, 3], "move-adding", ([2, 0], [2, 3]))
        caught_up(w, "t-1", [2, 0, 3], hw=6)
    # t-6 has no uid (created before uids), as neither has its new life: its delete tells them apart.
    w.at(20).delete("partitions", "t-6")
    with w.at(22).lost():
        w.put(partition("t-6", None, [3, 2]))
        move_step(w, "t-6", [3, 2], "move-started", ([3, 2], [3, 1]))
        move_step(w, "t-6", [3, 2, 1], "move-adding", ([3, 2], [3, 1]))
        caught_up(w, "t-6", [3, 2, 1], hw=4)
    move_step(w.at(30), "t-0", [1, 2], "move-completed", None)
    move_step(w.at(31), "t-1", [2, 3], "move-completed", None)
    move_step(w.at(32), "t-6", [3, 1], "move-completed", None)

    # The SC away, etcd compacted: the snapshot lists every object at its last write, which the
    # history holds (partitions whose last write was a move step among them).
    w.at(35).relist()
    caught_up(w.at(40), "t-2", [2, 3, 0], hw=70)
    caught_up(w, "t-3", [3, 0, 1], hw=80)
    move_step(w.at(41), "t-2", [2, 0], "move-completed", None)
    move_step(w, "t-3", [3, 1], "move-completed", None)
    await w.close()


@pytest.fixture(scope="module")
def results(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> options.Results:
    directory = tmp_path_factory.mktemp("move-lives")
    asyncio.run(write_story(directory / "history"))
    export.export(directory / "history", directory / "export")
    return jobs.run(spark, directory / "export")


def moves_of(results: options.Results, *names: str) -> list[tuple[Any, ...]]:
    return [
        (row["partition"], row["outcome"], row["arrived"], row["left"], row["seconds"], row["records"])
        for row in results.tables["moves"]
        if row["partition"] in names
    ]


def test_a_snapshot_after_a_gap_repeats_no_move_step(results: options.Results) -> None:
    # The listed copy of a move step's write is not that step again: each move counts once, whole.
    assert moves_of(results, "t-2", "t-3") == [
        ("t-2", "completed", [0], [3], 30.0, 70),
        ("t-3", "completed", [1], [0], 30.0, 80),
    ]


def test_a_move_whose_start_the_history_lost_has_unknown_arrivals_and_records(results: options.Results, tmp_path: Path) -> None:
    # Not "nothing arrived, nothing copied": the history cannot say (nor when it started).
    assert moves_of(results, "t-5") == [("t-5", "completed", None, [3], None, None)]
    document = report.to_json(results)
    assert [move for move in document["moves"] if move["partition"] == "t-5"] == [
        {"partition": "t-5", "outcome": "completed", "arrived": None, "left": [3], "started": None, "at": iso(19),
         "seconds": None, "records": None},
    ]
    report.write(results, tmp_path)
    assert f"| {iso(19)} | t-5 | completed | – | 3 | – | – |" in (tmp_path / "report.md").read_text()


def test_a_move_whose_start_was_lost_takes_nothing_from_the_move_before(results: options.Results) -> None:
    assert moves_of(results, "t-4") == [
        ("t-4", "completed", [3], [2], 2.0, 90),
        ("t-4", "completed", None, [3], None, None),
    ]


def test_a_move_pairs_only_within_one_life_of_its_partition(results: options.Results) -> None:
    # No new life's move started, arrived or copied what the old life's move did; the end of t-1's
    # and of t-6's is the first write of its life the history holds: what left is unknown too.
    assert moves_of(results, "t-0", "t-1", "t-6") == [
        ("t-0", "completed", None, [0], None, None),
        ("t-1", "completed", None, None, None, None),
        ("t-6", "completed", None, None, None, None),
    ]
    # A uid given to a partition that had none begins no life, nor is it an identity change (t-1's
    # other uid, its delete and create lost, is one to that audit).
    assert moves_of(results, "t-7") == [("t-7", "completed", [0], [2], 3.0, 15)]
    assert [change["partition"] for change in results.tables["identity_changes"]] == ["t-1"]
