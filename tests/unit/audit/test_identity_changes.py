"""A partition's lives are told apart, and an edit of its identity is seen: an update whose uid
differs from the last uid of the same life of the partition (the SC never changes one: a hand
edit, which makes the partition another one to its SPUs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, options, report
from store import history, models
from tests.unit.audit.synthetic import T0, Writer, iso

pytestmark = pytest.mark.spark

SPEC = {"leader": 1, "replicas": [1, 2]}


def at(seconds: float) -> int:
    """Epoch microseconds of T0 + ``seconds``."""
    return export.micros(T0) + int(seconds * 1_000_000)


def with_uid(w: Writer, name: str, uid: int | None) -> models.Partition:
    return w.get("partitions", name).model_copy(update={"uid": uid})


async def write_story(directory: Path) -> dict[str, int]:
    """The revisions of the writes that edit an identity, by what they do."""
    w = Writer(directory)
    w.at(0)
    for spu_id in (1, 2):
        w.put(w.spu(spu_id, None, "Online"))
    w.put(models.Partition.model_validate({"name": "t-0", "uid": 11, "spec": SPEC}))
    w.put(models.Partition.model_validate({"name": "t-1", "spec": SPEC}))  # created before partitions had a uid
    w.at(5).partition_state("t-0", "Online", 1)  # the SC's write keeps the uid
    edits = {"written over": w.at(10).put(with_uid(w, "t-0", 22))}

    # Deleted and created again, with another leader: another life, neither an identity edit nor a leader change.
    w.at(20).delete("partitions", "t-0")
    w.at(21).put(models.Partition.model_validate({"name": "t-0", "uid": 33, "spec": {"leader": 2, "replicas": [2, 1]}}))

    # Given a uid it had not, then removed: no SPU drops a log (and records exported before the uid
    # column read as having none). Another uid after that: the SPUs still hold the removed one.
    w.at(30).put(with_uid(w, "t-1", 44))
    w.at(35).put(with_uid(w, "t-1", None))
    edits["given again"] = w.at(40).put(with_uid(w, "t-1", 66))

    # Deleted, then written back with another uid, its create lost (a queue-full gap): the update
    # after the delete starts no identity change.
    w.at(45).put(models.Partition.model_validate({"name": "t-2", "uid": 77, "spec": SPEC}))
    w.delete("partitions", "t-2")
    w.revision += 2
    w.recorder.record_gap(w.revision - 1, w.revision - 1, "queue-full", dropped=1)
    back = models.Partition.model_validate({"name": "t-2", "uid": 88, "spec": SPEC})
    w.objects[back.key] = back
    w.recorder.record_change(back.kind, back.name, history.UPDATE, w.revision, models.encode(back))

    # The SC was away and etcd compacted: the snapshot after the gap lists t-0 with another uid,
    # which a delete and a create in the gap would give as well: a create, not counted.
    w.revision += 5
    w.recorder.record_gap(w.revision - 4, w.revision, "compacted")
    for key, obj in sorted(w.objects.items()):
        if key == "partitions/t-0":
            obj = with_uid(w, "t-0", 55)
            w.objects[key] = obj
        w.recorder.record_change(obj.kind, obj.name, history.CREATE, w.revision - 1 if key == "partitions/t-0" else 100,
                                 models.encode(obj), source=history.LIST, snapshot=w.revision)
    w.recorder.record_sync(w.revision, snapshot=True)
    await w.close()
    return edits


@pytest.fixture(scope="module")
def story(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[options.Results, dict[str, int]]:
    directory = tmp_path_factory.mktemp("identity")
    edits = asyncio.run(write_story(directory / "history"))
    export.export(directory / "history", directory / "export")
    return jobs.run(spark, directory / "export"), edits


def test_a_uid_changed_in_place_is_an_identity_change_and_a_new_life_is_not(story: tuple[options.Results, dict[str, int]]) -> None:
    results, edits = story
    assert [
        (row["partition"], row["revision"], row["at_us"], row["from_uid"], row["to_uid"]) for row in results.tables["identity_changes"]
    ] == [
        ("t-0", edits["written over"], at(10), 11, 22),
        ("t-1", edits["given again"], at(40), 44, 66),
    ]
    document = report.to_json(results)
    assert document["identityChanges"] == [
        {"partition": "t-0", "revision": edits["written over"], "at": iso(10), "from": 11, "to": 22},
        {"partition": "t-1", "revision": edits["given again"], "at": iso(40), "from": 44, "to": 66},
    ]


def test_a_partition_created_again_with_another_leader_is_no_leader_change(story: tuple[options.Results, dict[str, int]]) -> None:
    results, _ = story
    assert results.tables["leader_changes"] == []


def test_the_human_report_lists_identity_changes(story: tuple[options.Results, dict[str, int]], tmp_path: Path) -> None:
    results, edits = story
    report.write(results, tmp_path)
    markdown = (tmp_path / "report.md").read_text()
    assert "## Partition identity edits (a uid changed in place)" in markdown
    assert f"| {iso(10)} | t-0 | 11 | 22 | {edits['written over']} |" in markdown
