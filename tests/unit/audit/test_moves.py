"""Replica moves in the audit report: each move that ended (completed or reverted), the SPUs it
brought a replica and took one from, how long it took, the records each arriving replica copied,
and the counts per SPU."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, options, report
from tests.unit.audit.synthetic import Writer, caught_up, iso, move_step

pytestmark = pytest.mark.spark


async def write_story(directory: Path) -> None:
    w = Writer(directory)
    w.at(0)
    for spu_id in range(4):
        w.put(w.spu(spu_id, None, "Online"))
    w.topic("t", {"partitions": 3, "replicationFactor": 2})
    w.at(1).provision("t", {0: [0, 1], 1: [1, 2], 2: [2, 3]})
    # t-0 moves from [0, 1] to [3, 1]: 3 arrives, 0 leaves, in 4 s; SPU 3 joined the in-sync set
    # with the 120 records committed then (those written later are replication, not the move's).
    move_step(w.at(10), "t-0", [0, 1], "move-started", ([0, 1], [3, 1]), hw=30)
    move_step(w.at(11), "t-0", [0, 1, 3], "move-adding", ([0, 1], [3, 1]), hw=40)
    caught_up(w.at(12), "t-0", [0, 1, 3], hw=120)
    move_step(w.at(13), "t-0", [0, 1, 3], "reassignment", ([0, 1], [3, 1]), leader=3, hw=150)
    move_step(w.at(15), "t-0", [3, 1], "move-completed", None, hw=170)
    # t-1 starts moving to [1, 3], then is cancelled: back on [1, 2], nothing moved.
    move_step(w.at(20), "t-1", [1, 2], "move-started", ([1, 2], [1, 3]))
    move_step(w.at(21), "t-1", [1, 2, 3], "move-adding", ([1, 2], [1, 3]), hw=10)
    caught_up(w.at(21.5), "t-1", [1, 2, 3], hw=12)
    move_step(w.at(22), "t-1", [1, 2, 3], "move-cancelled", ([1, 2], [1, 2]))
    move_step(w.at(23.5), "t-1", [1, 2], "move-reverted", None)
    # t-2 moves twice. First [2, 3] to [0, 1]: both arrive (7 records each), both leave...
    move_step(w.at(30), "t-2", [2, 3], "move-started", ([2, 3], [0, 1]))
    move_step(w.at(31), "t-2", [2, 3, 0, 1], "move-adding", ([2, 3], [0, 1]), hw=5)
    caught_up(w.at(32), "t-2", [2, 3, 0, 1], hw=7)
    move_step(w.at(33), "t-2", [2, 3, 0, 1], "reassignment", ([2, 3], [0, 1]), leader=0)
    move_step(w.at(34), "t-2", [0, 1], "move-completed", None, hw=9)
    # ... then to [0, 2], whose catching up the history does not hold (a gap): records unknown,
    # never the previous move's.
    move_step(w.at(40), "t-2", [0, 1], "move-started", ([0, 1], [0, 2]))
    move_step(w.at(41), "t-2", [0, 1, 2], "move-adding", ([0, 1], [0, 2]), hw=11)
    move_step(w.at(43), "t-2", [0, 2], "move-completed", None, hw=20)
    # A move that only reorders t-0's replicas (a decommission's leader balance): no replica
    # arrives or leaves, nothing is copied, nothing of t-0's earlier move is carried over.
    move_step(w.at(50), "t-0", [3, 1], "move-started", ([3, 1], [1, 3]))
    move_step(w.at(50.5), "t-0", [1, 3], "move-completed", None, hw=200)
    await w.close()


@pytest.fixture(scope="module")
def results(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> options.Results:
    directory = tmp_path_factory.mktemp("moves")
    asyncio.run(write_story(directory / "history"))
    export.export(directory / "history", directory / "export")
    return jobs.run(spark, directory / "export")


def test_each_move_that_ended_says_what_it_moved_and_how_long_it_took(results: options.Results) -> None:
    assert [
        (row["partition"], row["outcome"], row["arrived"], row["left"], row["seconds"], row["records"])
        for row in results.tables["moves"]
    ] == [
        ("t-0", "completed", [3], [0], 4.0, 120),
        ("t-1", "reverted", [], [], 2.5, 0),
        ("t-2", "completed", [0, 1], [2, 3], 3.0, 7),
        ("t-2", "completed", [2], [1], 2.0, None),
        ("t-0", "completed", [], [], 0.5, 0),
    ]
    assert results.tables["moves_by_spu"] == [
        {"spu": 0, "moves_in": 1, "moves_out": 1, "records_in": 7, "records_out": 120},
        {"spu": 1, "moves_in": 1, "moves_out": 1, "records_in": 7, "records_out": 0},
        {"spu": 2, "moves_in": 1, "moves_out": 1, "records_in": 0, "records_out": 7},
        {"spu": 3, "moves_in": 1, "moves_out": 1, "records_in": 120, "records_out": 7},
    ]


def test_report_json_lists_the_moves_and_the_moves_per_spu(results: options.Results) -> None:
    document = report.to_json(results)
    assert document["movesBySpu"][0] == {"spu": 0, "movesIn": 1, "movesOut": 1, "recordsIn": 7, "recordsOut": 120}
    assert document["moves"][0] == {
        "partition": "t-0", "outcome": "completed", "arrived": [3], "left": [0], "started": iso(11), "at": iso(15),
        "seconds": 4.0, "records": 120,
    }
    assert document["moves"][3]["records"] is None
    # The moves' leader changes are the SC's, with their cause.
    assert [(change["partition"], change["from"], change["to"], change["cause"]) for change in document["leaderChanges"]] == [
        ("t-0", 0, 3, "reassignment"), ("t-2", 2, 0, "reassignment"),
    ]


def test_report_markdown_shows_the_records_moved(results: options.Results, tmp_path: Path) -> None:
    report.write(results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## Replica moves"):]
    section = section[: section.index("\n## ", 1)]
    assert "| spu | moves_in | moves_out | records_in | records_out |" in section, section
    assert "| 0 | 1 | 1 | 7 | 120 |" in section, section
    assert "| at | partition | outcome | arrived | left | seconds | records |" in section, section
    rows = [line for line in section.splitlines() if "| t-0 |" in line or "| t-2 |" in line]
    assert [line.rsplit("|", 2)[1].strip() for line in rows] == ["120", "7", "–", "0"], rows
