"""Pure controller decisions: given a snapshot, the exact list of actions ([] when nothing changes)."""

from __future__ import annotations

import json
from typing import Any

from connection_manager import health as health_module
from controller import actions, spu, spu_group, spu_ids, topic
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


def named_group(name: str, replicas: int, min_id: int, resolution: str = "Init") -> models.SpuGroup:
    return group(replicas, min_id, resolution).model_copy(update={"name": name})


def test_overlapping_spu_groups_created_together_leave_the_later_one_invalid() -> None:
    """Both groups were Init in one pass: each was checked against SPUs only, both became Reserved,
    and both created SPUs for ids 13 and 14."""
    snapshot = snapshot_of((named_group("second", 3, 13), 7), (named_group("first", 4, 11), 6))
    assert [(a.name, json.loads(a.writes[0].value)["status"]) for a in spu_group.decide(snapshot)] == [  # type: ignore[arg-type]
        ("first", {"resolution": "Reserved", "reason": ""}),
        (
            "second",
            {
                "resolution": "Invalid",
                "reason": "id range 13..15 collides: ids 13..14 are in the id range of SPU group first, created earlier",
            },
        ),
    ]
    # The earlier group keeps its range however the later one changes, and one shared id is named alone.
    reserved = snapshot_of((named_group("second", 3, 14, "Reserved"), 7), (named_group("first", 4, 11, "Reserved"), 6))
    assert [(a.name, json.loads(a.writes[0].value)["status"]["reason"]) for a in spu_group.decide(reserved) if a.verb is actions.Verb.UPDATE_STATUS] == [  # type: ignore[arg-type]
        ("second", "id range 14..16 collides: id 14 is in the id range of SPU group first, created earlier"),
    ]


def test_a_managed_spu_takes_its_id_index_key_in_its_own_create() -> None:
    stale = (spu_ids.encode_holder("deleted-by-hand"), 3)
    decided = spu_group.decide(snapshot_of((group(2, 11, "Reserved"), 5), meta={"meta/spu-ids/12": stale}))
    assert [(a.verb.value, a.name, [(w.key, w.value, w.expected_revision) for w in a.writes[1:]]) for a in decided] == [
        ("create", "main-0", [("meta/spu-ids/11", b'{"spu": "main-0"}', 0)]),
        ("create", "main-1", [("meta/spu-ids/12", b'{"spu": "main-1"}', 3)]),  # a stale key is taken at its revision
    ]


def test_a_managed_spu_whose_id_another_spu_of_its_group_holds_waits_for_it_to_move() -> None:
    """The group's minId changed behind the SC's back (5 -> 6): main-0 must wait for main-1 to give
    id 6 up; main-1 moves to 7, giving 6 back in the same transaction."""
    old = spu_group.desired_spus(group(2, 5))
    index = {f"meta/spu-ids/{spu_obj.spec.id}": (spu_ids.encode_holder(spu_obj.name), 20 + i) for i, spu_obj in enumerate(old)}
    snapshot = snapshot_of((group(2, 6, "Reserved"), 5), (old[0], 10), (old[1], 11), meta=index)
    decided = spu_group.decide(snapshot)
    assert [(a.verb.value, a.name, [(w.key, w.value, w.expected_revision) for w in a.writes]) for a in decided] == [
        (
            "update-spec",
            "main-1",
            [
                ("spus/main-1", decided[0].writes[0].value, 11),
                ("meta/spu-ids/7", b'{"spu": "main-1"}', 0),
                ("meta/spu-ids/6", None, 21),
            ],
        ),
    ]
    assert models.decode("spus", decided[0].writes[0].value).spec.id == 7  # type: ignore[arg-type, attr-defined]


def test_deleted_managed_spus_give_their_id_back_in_the_same_transaction() -> None:
    managed = spu_group.desired_spus(group(2, 11))
    index = {"meta/spu-ids/11": (spu_ids.encode_holder("main-0"), 30), "meta/spu-ids/12": (spu_ids.encode_holder("custom"), 31)}
    decided = spu_group.decide(snapshot_of((managed[0], 6), (managed[1], 7), meta=index))
    assert [(a.verb.value, a.name, [(w.key, w.value, w.expected_revision) for w in a.writes]) for a in decided] == [
        ("delete", "main-0", [("spus/main-0", None, 6), ("meta/spu-ids/11", None, 30)]),
        ("delete", "main-1", [("spus/main-1", None, 7)]),  # the key names someone else: left alone
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
