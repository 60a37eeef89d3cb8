"""One audit over the histories of two SCs of one store (`sc audit report --history A --history B`).

The story: SC a leads; SC b starts later as a standby (its history opens with a listing); a dies
and b takes over and elects; a comes back as a standby and replays what it missed. Each history
alone misexplains the leader changes or misses a term; merged, every change counts once and every
election has its cause.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from controller.audit import export, jobs, options, report
from store import history, models
from tests.unit.audit.synthetic import T0, Clock, iso

pytestmark = pytest.mark.spark


class Sc:
    """One SC's recorder, at its own clock (a standby sees a change a little after the leader)."""

    def __init__(self, directory: Path) -> None:
        self.clock = Clock()
        self.recorder = history.Recorder.open(directory, clock=self.clock)
        self.directory = directory

    def at(self, seconds: float) -> history.Recorder:
        self.clock.now = T0.timestamp() + seconds
        return self.recorder


class Store:
    """The store both SCs watch: ``Writer``'s object helpers, one revision per write; each write
    is recorded as a change by every SC watching, at its own time, and as an action by the leader."""

    def __init__(self, directory: Path) -> None:
        self.objects: dict[str, tuple[models.AnyObject, int]] = {}  # key: the object, its last revision
        self.revision = 100
        self.a, self.b = Sc(directory / "a"), Sc(directory / "b")
        self.watching: dict[Sc, float] = {}  # SC: its delay after the write
        self.missed: list[tuple[str, str, str, int, bytes | None]] = []  # what a standby stopped missed

    def write(self, seconds: float, obj: models.AnyObject, leader: Sc | None, reason: str = "", cause: str = "") -> int:
        self.revision += 1
        op = history.UPDATE if obj.key in self.objects else history.CREATE
        self.objects[obj.key] = (obj, self.revision)
        if leader is not None:
            leader.at(seconds).record_action(
                obj.kind, obj.name, "update-spec", reason, cause, self.revision - 1, "applied", self.revision, [obj.key]
            )
        for sc, delay in self.watching.items():
            sc.at(seconds + delay).record_change(obj.kind, obj.name, op, self.revision, models.encode(obj))
        self.missed.append((obj.kind, obj.name, op, self.revision, models.encode(obj)))
        return self.revision

    def listing(self, sc: Sc, seconds: float) -> None:
        """``sc`` starts: its new history opens with every object, then a sync."""
        for obj, revision in self.objects.values():
            sc.at(seconds).record_change(
                obj.kind, obj.name, history.CREATE, revision, models.encode(obj), source=history.LIST, snapshot=self.revision
            )
        sc.at(seconds).record_sync(self.revision, snapshot=True)


def spu(spu_id: int, resolution: str) -> models.Spu:
    return models.Spu.model_validate(
        {
            "name": f"spu-{spu_id}",
            "spec": {
                "id": spu_id, "rack": f"r{spu_id}", "publicEndpoint": {"host": "127.0.0.1", "port": 9005},
                "privateEndpoint": {"host": "127.0.0.1", "port": 9006},
            },
            "status": {"resolution": resolution},
        }
    )


def partition(leader: int) -> models.Partition:
    return models.Partition.model_validate(
        {
            "name": "orders-0",
            "spec": {"leader": leader, "replicas": [0, 1, 2]},
            "status": {"resolution": "Online", "leader": {"spu": leader, "hw": 0, "leo": 0}},
        }
    )


async def write_story(directory: Path) -> Store:
    store = Store(directory)
    a, b = store.a, store.b
    store.watching = {a: 0.0}
    a.at(0).record_takeover("sc-a", "10.0.0.1:9003", 101, "unclaimed", None, 0)
    for spu_id in range(3):
        store.write(1, spu(spu_id, "Online"), a, "SPU online")
    revision = store.write(2, models.Topic.model_validate({"name": "orders", "spec": {"partitions": 1, "replicationFactor": 3}}), None)
    a.at(2).record_request("topics", "orders", revision, "alice", "10.0.0.7")
    provisioned = models.Topic.model_validate(
        {"name": "orders", "spec": {"partitions": 1, "replicationFactor": 3}, "status": {"resolution": "Provisioned"}}
    )
    store.write(3, provisioned, a, "provisioned")
    store.write(3, partition(0), a, "provisioned")
    # b starts, a standby: a listing, then it watches too, 0.1 s behind a.
    store.listing(b, 5)
    store.watching = {a: 0.0, b: 0.1}
    store.write(10, spu(2, "Offline"), a, "SPU 2 offline")
    # a dies; b takes over and elects.
    store.watching = {b: 0.0}
    store.missed = []
    b.at(22).record_takeover("sc-b", "10.0.0.2:9003", 150, "lease-expired", "sc-a", 101)
    store.write(23, spu(0, "Offline"), b, "SPU 0 offline")
    store.write(23.5, partition(1), b, "elected 1", "spu-offline")
    # a restarts as a standby and replays what it missed, at 30.
    for kind, name, op, revision, value in store.missed:
        a.at(30).record_change(kind, name, op, revision, value, source=history.REPLAY)
    a.at(30).record_sync(store.revision)
    store.watching = {b: 0.0, a: 0.2}
    store.write(40, spu(0, "Online"), b, "SPU 0 online")
    store.write(41, partition(0), b, "elected 0", "preferred-leader")
    for sc in (a, b):
        await sc.recorder.start()
        await sc.recorder.close()
    return store


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("two-scs")
    asyncio.run(write_story(directory))
    export.export(directory / "a", directory / "export-a")
    export.export(directory / "b", directory / "export-b")
    return directory / "export-a", directory / "export-b"


@pytest.fixture(scope="module")
def merged(spark: Any, exports: tuple[Path, Path]) -> options.Results:
    return jobs.run(spark, list(exports))


def at(seconds: float) -> int:
    return export.micros(T0) + int(seconds * 1_000_000)


def test_alone_neither_history_explains_every_leader_change(spark: Any, exports: tuple[Path, Path]) -> None:
    """Each history has both leader changes (a replayed them), but the elections are in b's only,
    and b's lacks a's term: a report on either alone calls the elections "external" or misses a term."""
    for path, elections, terms in ((exports[0], 0, ["sc-a"]), (exports[1], 2, ["sc-b"])):
        frame = jobs.load_histories(spark, [path])
        assert frame.filter("type = 'action' and cause != ''").count() == elections
        assert [row["name"] for row in frame.filter("type = 'takeover'").collect()] == terms


def test_merged_every_election_has_its_cause_and_the_time_it_was_first_seen(merged: options.Results) -> None:
    assert [(row["from_spu"], row["to_spu"], row["cause"], row["at_us"]) for row in merged.tables["leader_changes"]] == [
        (0, 1, "spu-offline", at(23.5)), (1, 0, "preferred-leader", at(41)),
    ]
    assert [(row["sc"], row["event"], row["epoch"], row["at_us"]) for row in merged.tables["sc_terms"]] == [
        ("sc-a", "takeover", 101, at(0)), ("sc-b", "takeover", 150, at(22)),
    ]


def test_merged_a_change_both_histories_hold_counts_once(merged: options.Results, exports: tuple[Path, Path]) -> None:
    ids = sorted(export.dataset_history_id(path) for path in exports)
    assert merged.history["histories"] == ids
    # 11 changes, 10 actions, 1 request, 2 takeovers, 2 syncs (b's listing's and a's replay's):
    # b's listing and the changes both watched are not counted twice.
    assert merged.history["records"] == 26
    assert [(row["kind"], row["name"], row["op"], row["by"]) for row in merged.tables["spec_changes"]] == [
        ("spus", "spu-0", "create", "sc"), ("spus", "spu-1", "create", "sc"), ("spus", "spu-2", "create", "sc"),
        ("topics", "orders", "create", "alice"), ("partitions", "orders-0", "create", "sc"),
        ("partitions", "orders-0", "update", "sc"), ("partitions", "orders-0", "update", "sc"),
    ]
    # One life per object: b's listing is not a new one (the topic's provisioning is one row).
    assert [(row["topic"], row["seconds"]) for row in merged.tables["provisioning"]] == [("orders", 1.0)]
    assert [(row["spu"], row["state"], row["start_us"], row["end_us"]) for row in merged.tables["spu_intervals"]] == [
        (0, "Online", at(1), at(23)), (0, "Offline", at(23), at(40)), (0, "Online", at(40), None),
        (1, "Online", at(1), None),
        (2, "Online", at(1), at(10)), (2, "Offline", at(10), None),
    ]
    assert [(row["spu"], row["replicas"], row["leaders"]) for row in merged.tables["balance_spus"]] == [
        (0, 1, 1), (1, 1, 0), (2, 1, 0),
    ]


def test_the_report_says_which_histories_it_merged(merged: options.Results, exports: tuple[Path, Path], tmp_path: Path) -> None:
    report.write(merged, tmp_path)
    document = json.loads((tmp_path / "report.json").read_text())
    a, b = (export.dataset_history_id(path) for path in exports)
    assert document["history"]["histories"] == sorted([a, b])
    assert [term["history"] for term in document["scTerms"]] == [a, b]
    markdown = (tmp_path / "report.md").read_text()
    assert "merged from 2 SCs' histories" in markdown
    assert "2 takeover(s) by the SCs whose histories this report covers." in markdown
    assert f"| {iso(22)} | takeover | sc-b | 10.0.0.2:9003 | 150 | lease-expired | sc-a | 101 |" in markdown


def test_a_history_given_twice_is_refused(spark: Any, exports: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="are exports of the same history"):
        jobs.load_histories(spark, [exports[0], exports[1], exports[0]])


def test_histories_of_two_stores_are_refused(spark: Any, exports: tuple[Path, Path], tmp_path: Path) -> None:
    other = asyncio.run(_other_store(tmp_path))
    with pytest.raises(ValueError, match=r"recorded different objects as spus/spu-0 at revision 101: they are not histories of one store"):
        jobs.run(spark, [exports[0], other])


async def _other_store(directory: Path) -> Path:
    sc = Sc(directory / "other")
    sc.at(0).record_change("spus", "spu-0", history.CREATE, 101, models.encode(spu(0, "Init")))
    await sc.recorder.start()
    await sc.recorder.close()
    export.export(directory / "other", directory / "export-other")
    return directory / "export-other"


def test_a_history_whose_store_went_behind_it_is_audited_alone(spark: Any, exports: tuple[Path, Path], tmp_path: Path) -> None:
    sc = Sc(tmp_path / "restored")
    sc.at(0).record_gap(90, 300, history.STORE_BEHIND_HISTORY)

    async def close() -> None:
        await sc.recorder.start()
        await sc.recorder.close()

    asyncio.run(close())
    export.export(tmp_path / "restored", tmp_path / "export-restored")
    with pytest.raises(ValueError, match="has a store-behind-history gap: .* report on it alone"):
        jobs.run(spark, [exports[0], tmp_path / "export-restored"])
