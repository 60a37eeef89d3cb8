"""Pure controller decisions: given a snapshot, the exact list of actions ([] when nothing changes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from connection_manager import health as health_module
from controller import actions, spu, spu_group, topic
from store import local, models
from tests import objects

ONLINE, OFFLINE, UNKNOWN = health_module.Health.ONLINE, health_module.Health.OFFLINE, health_module.Health.UNKNOWN


def snapshot_of(*objects: tuple[models.ClusterObject, int], meta: dict[str, tuple[bytes, int]] | None = None) -> local.Snapshot:
    store = local.LocalStore()
    for obj, revision in objects:
        store[obj.kind].apply(obj, revision)
    for key, (value, revision) in (meta or {}).items():
        store.meta.apply(key, value, revision)
    return store.snapshot()


make_spu = objects.spu


def make_topic(name: str, status: dict[str, Any] | None = None, **spec: Any) -> models.Topic:
    return models.Topic.model_validate({"name": name, "spec": spec, "status": status or {"resolution": "Init"}})


def summary(decided: list[actions.Action]) -> list[tuple[str, str, str, list[tuple[str, Any, int | None]]]]:
    """(verb, kind, name, [(key, decoded value, expected revision)]) per action."""
    return [
        (
            action.verb.value,
            action.kind,
            action.name,
            [(write.key, None if write.value is None else json.loads(write.value), write.expected_revision) for write in action.writes],
        )
        for action in decided
    ]


# ---------------------------------------------------------------------------- SPU controller


def test_spu_follows_health_and_grace_period() -> None:
    snapshot = snapshot_of((make_spu(1, "Init"), 10), (make_spu(2, "Online"), 11), (make_spu(3, "Online"), 12), (make_spu(4, "Offline"), 13))
    health = {1: health_module.HealthRecord(ONLINE, 0.0), 2: health_module.HealthRecord(OFFLINE, 0.0)}
    decided = spu.decide(snapshot, health, now=5.0, started_at=0.0, grace_period=30.0)
    assert [(a.name, a.verb.value, a.reason, json.loads(a.writes[0].value)["status"], a.writes[0].expected_revision) for a in decided] == [
        ("spu-1", "update-status", "SPU connected", {"resolution": "Online"}, 10),
        ("spu-2", "update-status", "SPU disconnected", {"resolution": "Offline"}, 11),
    ]
    # spu-3 was Online before the restart and never reconnected: Offline once the grace ends.
    later = spu.decide(snapshot, health, now=31.0, started_at=0.0, grace_period=30.0)
    assert [(a.name, a.reason) for a in later] == [
        ("spu-1", "SPU connected"),
        ("spu-2", "SPU disconnected"),
        ("spu-3", "SPU did not reconnect within 30 s of the SC starting"),
    ]


def test_spu_controller_is_quiet_when_everything_matches() -> None:
    snapshot = snapshot_of((make_spu(1, "Online"), 10), (make_spu(2, "Init"), 11))
    health = {1: health_module.HealthRecord(ONLINE, 0.0)}
    assert spu.decide(snapshot, health, now=100.0, started_at=0.0, grace_period=30.0) == []


# ---------------------------------------------------------------------------- SPU-group controller


def group(replicas: int, min_id: int, resolution: str = "Init", reason: str = "", rack: str | None = None) -> models.SpuGroup:
    return models.SpuGroup.model_validate(
        {"name": "main", "spec": {"replicas": replicas, "minId": min_id, "rack": rack}, "status": {"resolution": resolution, "reason": reason}}
    )


def test_spu_group_collision_makes_it_invalid_and_creates_nothing() -> None:
    snapshot = snapshot_of((group(3, 11), 5), (make_spu(12, name="custom-12"), 6))
    decided = spu_group.decide(snapshot)
    assert summary(decided) == [
        (
            "update-status",
            "spu-groups",
            "main",
            [
                (
                    "spu-groups/main",
                    {
                        "name": "main",
                        "spec": {"replicas": 3, "minId": 11, "storage": {"logDir": "/tmp/fluvio", "size": "1Gi"}, "host": "127.0.0.1", "publicPortBase": 10000, "privatePortBase": 30000},
                        "status": {"resolution": "Invalid", "reason": "id range 11..13 collides: SPU id 12 is already used by SPU custom-12"},
                    },
                    5,
                )
            ],
        )
    ]


def test_spu_group_reserved_creates_its_spus() -> None:
    assert [a.verb.value for a in spu_group.decide(snapshot_of((group(2, 11), 5)))] == ["update-status"]
    decided = spu_group.decide(snapshot_of((group(2, 11, "Reserved", rack="r1"), 5)))
    assert [(a.verb.value, a.name) for a in decided] == [("create", "main-0"), ("create", "main-1")]
    created = models.decode("spus", decided[1].writes[0].value)  # type: ignore[arg-type]
    assert created.spec == models.SpuSpec(  # type: ignore[attr-defined]
        id=12,
        spu_type=models.SpuType.MANAGED,
        rack="r1",
        public_endpoint=models.Endpoint(host="127.0.0.1", port=10012),
        private_endpoint=models.Endpoint(host="127.0.0.1", port=30012),
    )
    assert decided[1].writes[0].expected_revision == 0


def test_spu_group_scale_down_and_delete() -> None:
    managed = [spu_group.desired_spus(group(3, 11))[index] for index in range(3)]
    snapshot = snapshot_of((group(1, 11, "Reserved"), 5), *((spu_obj, 6 + index) for index, spu_obj in enumerate(managed)))
    assert [(a.verb.value, a.name, a.reason) for a in spu_group.decide(snapshot)] == [
        ("delete", "main-1", "SPU group main scaled down to 1"),
        ("delete", "main-2", "SPU group main scaled down to 1"),
    ]
    orphaned = snapshot_of(*((spu_obj, 6 + index) for index, spu_obj in enumerate(managed)), (make_spu(50), 9))
    assert [(a.verb.value, a.name, a.writes[0].expected_revision) for a in spu_group.decide(orphaned)] == [
        ("delete", "main-0", 6),
        ("delete", "main-1", 7),
        ("delete", "main-2", 8),
    ]


# ---------------------------------------------------------------------------- topic controller


def test_new_topic_is_validated_to_pending_or_invalid() -> None:
    snapshot = snapshot_of(
        (make_spu(0), 1),
        (make_topic("good", partitions=1, replicationFactor=1), 5),
        (make_topic("bad-policy", partitions=1, replicationFactor=1, placement={"strategy": "policies", "policies": "node=sideways"}), 6),
    )
    decided = topic.decide(snapshot)
    assert [(a.name, json.loads(a.writes[0].value)["status"]["resolution"]) for a in decided] == [  # type: ignore[arg-type]
        ("good", "Pending"),
        ("bad-policy", "InvalidConfig"),
    ]
    reason = json.loads(decided[1].writes[0].value)["status"]["reason"]  # type: ignore[arg-type]
    assert "sideways" in reason


def test_a_stored_topic_whose_preferred_spu_is_no_id_is_invalid_not_a_crash() -> None:
    """Written straight into the store: '²' is a digit to isdigit(), not to int()."""
    placement_spec = {"strategy": "policies", "policies": "preferred_nodes=²"}
    snapshot = snapshot_of((make_spu(0), 1), (make_topic("odd", partitions=1, replicationFactor=1, placement=placement_spec), 5))
    [decided] = topic.decide(snapshot)
    status = json.loads(decided.writes[0].value)["status"]  # type: ignore[arg-type]
    assert (status["resolution"], status["reason"]) == (
        "InvalidConfig", "placement policy preferred_nodes=²: '²' is not an SPU id"
    )


def test_pending_topic_is_provisioned_with_partitions_and_chain_in_one_action() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    pending = make_topic("t", {"resolution": "Pending"}, partitions=2, replicationFactor=2)
    chain = {topic.CHAIN_KEY: (b'{"nextStartIndex": 1}', 4)}
    decided = topic.decide(snapshot_of(*spus, (pending, 9), meta=chain))
    assert summary(decided) == [
        (
            "provision",
            "topics",
            "t",
            [
                ("meta/placement-start-index", {"nextStartIndex": 3}, 4),
                (
                    "topics/t",
                    {
                        "name": "t",
                        "spec": {"partitions": 2, "replicationFactor": 2, "ignoreRackAssignment": False},
                        "status": {"resolution": "Provisioned", "replicaMap": {"0": [1, 2], "1": [2, 0]}, "reason": ""},
                    },
                    9,
                ),
            ],
        )
    ]
    assert decided[0].key == topic.CHAIN_KEY
    # Once the status is seen, the next pass creates the partitions (create-if-absent).
    provisioned = models.decode("topics", decided[0].writes[1].value)  # type: ignore[arg-type]
    follow_up = topic.decide(snapshot_of(*spus, (provisioned, 10), meta={topic.CHAIN_KEY: (b'{"nextStartIndex": 3}', 10)}))
    assert summary(follow_up) == [
        (
            "create-partitions",
            "topics",
            "t",
            [
                ("partitions/t-0", {"name": "t-0", "spec": {"leader": 1, "replicas": [1, 2]}, "status": {"resolution": "Offline", "replicas": [], "lrs": 0}}, 0),
                ("partitions/t-1", {"name": "t-1", "spec": {"leader": 2, "replicas": [2, 0]}, "status": {"resolution": "Offline", "replicas": [], "lrs": 0}}, 0),
            ],
        ),
    ]
    assert follow_up[0].key == "topics/t/partitions/0" and follow_up[0].reason == "partitions 0..1 of topic t"


def test_insufficient_resources_names_how_many_spus_are_missing() -> None:
    pending = make_topic("t", {"resolution": "Pending"}, partitions=1, replicationFactor=3)
    snapshot = snapshot_of((make_spu(0), 1), (make_spu(1, "Offline"), 2), (pending, 9))
    decided = topic.decide(snapshot)
    status = json.loads(decided[0].writes[0].value)["status"]  # type: ignore[arg-type]
    assert status["resolution"] == "InsufficientResources"
    assert "2 more" in status["reason"], status["reason"]
    # Same situation again: nothing to write.
    stuck = make_topic("t", status, partitions=1, replicationFactor=3)
    assert topic.decide(snapshot_of((make_spu(0), 1), (make_spu(1, "Offline"), 2), (stuck, 10))) == []


def test_provisioned_topic_with_all_partitions_needs_nothing() -> None:
    provisioned = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0, 1]}}, partitions=1, replicationFactor=2)
    partition = models.Partition(name="t-0", spec=models.PartitionSpec(leader=1, replicas=[0, 1]))  # leader moved: fine
    snapshot = snapshot_of((make_spu(0), 1), (make_spu(1), 2), (provisioned, 3), (partition, 3))
    assert topic.decide(snapshot) == []


def test_missing_partitions_are_created_and_orphans_deleted() -> None:
    provisioned = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0, 1], "1": [1, 0]}}, partitions=2, replicationFactor=2)
    orphan = models.Partition(name="old-0", spec=models.PartitionSpec(leader=0, replicas=[0]))
    stale = models.Partition(name="t-1", spec=models.PartitionSpec(leader=0, replicas=[0, 2]))
    snapshot = snapshot_of((make_spu(0), 1), (make_spu(1), 2), (orphan, 3), (stale, 4), (provisioned, 5))
    assert [(a.verb.value, a.name, a.reason) for a in topic.decide(snapshot)] == [
        ("delete", "old-0", "topic old was deleted"),
        ("delete", "t-1", "replicas [0, 2] differ from the topic's replica map [1, 0]"),
        ("create-partitions", "t", "partition 0 of topic t"),
    ]


def test_partitions_left_by_an_earlier_topic_of_the_same_name_are_deleted() -> None:
    recreated = make_topic("t", {"resolution": "Init"}, partitions=1, replicationFactor=1)
    leftover = models.Partition(name="t-0", spec=models.PartitionSpec(leader=0, replicas=[0]))
    decided = topic.decide(snapshot_of((make_spu(0), 1), (leftover, 2), (recreated, 5)))
    assert [(a.verb.value, a.name, a.reason) for a in decided] == [
        ("update-status", "t", "Pending: configuration is valid"),
        ("delete", "t-0", "topic t has no partition 0 in its replica map"),
    ]


def test_add_partitions_places_only_the_new_ones() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    grown = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [2, 0]}}, partitions=3, replicationFactor=2)
    partition = models.Partition(name="t-0", spec=models.PartitionSpec(leader=2, replicas=[2, 0]))
    decided = topic.decide(snapshot_of(*spus, (grown, 7), (partition, 7)))
    assert len(decided) == 1 and decided[0].verb is actions.Verb.PROVISION
    written = {write.key: json.loads(write.value) for write in decided[0].writes if write.value is not None}
    replica_map = written["topics/t"]["status"]["replicaMap"]
    assert replica_map["0"] == [2, 0]
    assert sorted(replica_map) == ["0", "1", "2"]
    assert [key for key in written if key.startswith("partitions/")] == []


def test_many_pending_topics_share_one_transaction_within_the_limit() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    pending = [(make_topic(f"t{index:03d}", {"resolution": "Pending"}, partitions=10, replicationFactor=2), 10 + index) for index in range(200)]
    decided = topic.decide(snapshot_of(*spus, *pending))
    assert len(decided) == 1
    writes = decided[0].writes
    assert len(writes) == 128
    # After the chain key, 127 topic statuses; the other topics wait for the next pass.
    assert decided[0].name == ",".join(f"t{index:03d}" for index in range(127))
    assert json.loads(writes[0].value) == {"nextStartIndex": 1270}  # type: ignore[arg-type]


def test_a_topic_with_more_partitions_than_a_transaction_holds_creates_them_in_chunks() -> None:
    replica_map = {str(index): [index % 2] for index in range(300)}
    provisioned = make_topic("big", {"resolution": "Provisioned", "replicaMap": replica_map}, partitions=300, replicationFactor=1)
    existing = models.Partition(name="big-5", spec=models.PartitionSpec(leader=1, replicas=[1]))
    decided = topic.decide(snapshot_of((make_spu(0), 1), (make_spu(1), 2), (provisioned, 3), (existing, 4)))
    assert [(action.key, len(action.writes)) for action in decided] == [
        ("topics/big/partitions/0", 128), ("topics/big/partitions/129", 128), ("topics/big/partitions/257", 43),
    ]
    assert decided[0].reason == "partitions 0..4, 6..128 of topic big"
    assert decided[1].reason == "partitions 129..256 of topic big"
    created = [write.key for action in decided for write in action.writes]
    assert sorted(created) == sorted(f"partitions/big-{index}" for index in range(300) if index != 5)


def test_an_incremental_pass_validates_changed_topics_and_places_every_waiting_one() -> None:
    """Pending topics wait for the chain key, not for a change of their own: once it is free they
    are placed though no listener reports them. Init topics are validated when they change."""
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    waiting = [(make_topic(f"w{index}", {"resolution": "Pending"}, partitions=1, replicationFactor=1), 10 + index) for index in range(2)]
    new = (make_topic("new", partitions=1, replicationFactor=1), 20)
    snapshot = snapshot_of(*spus, *waiting, new)
    nothing = local.Changes(full=False, updated=[], deleted=[], epoch=0)
    changed_new = local.Changes(full=False, updated=[snapshot.entries("topics")["new"]], deleted=[], epoch=0)

    def changes(topics: local.Changes) -> dict[str, local.Changes]:
        return {"topics": topics, "spus": nothing, "partitions": nothing}

    chain_busy = topic.decide(snapshot, changes(changed_new), lambda key: key == topic.CHAIN_KEY, retry_unplaced=False)
    assert [(action.verb.value, action.name) for action in chain_busy] == [("update-status", "new")]
    chain_free = topic.decide(snapshot, changes(nothing), lambda key: False, retry_unplaced=False)
    assert [(action.verb.value, action.name) for action in chain_free] == [("provision", "w0,w1")]


@pytest.mark.parametrize(
    "stored",
    [b'{"nextStartIndex": 1e400}', b'{"nextStartIndex": NaN}', b'{"nextStartIndex": ' + b"9" * 5000 + b"}", b"[]", b"\xff"],
)
def test_a_hand_edited_chain_that_is_no_number_restarts_at_0(stored: bytes) -> None:
    assert topic.read_chain(snapshot_of(meta={topic.CHAIN_KEY: (stored, 7)})) == topic.Chain(0, 7)
