"""Pure controller decisions: given a snapshot, the exact list of actions ([] when nothing changes)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from connection_manager import health as health_module
from controller import placement
from controller.reconcile import actions, spu, spu_group, topic, topic_size
from store import kv, local, models, spu_index
from tests import builders, placement_plugins

ONLINE, OFFLINE, UNKNOWN = health_module.Health.ONLINE, health_module.Health.OFFLINE, health_module.Health.UNKNOWN


def snapshot_of(*objects: tuple[models.AnyObject, int], meta: dict[str, tuple[bytes, int]] | None = None) -> local.Snapshot:
    store = local.LocalStore()
    for obj, revision in objects:
        store[obj.kind].apply(obj, revision)
    for key, (value, revision) in (meta or {}).items():
        store.meta.apply(key, value, revision)
    return store.snapshot()


make_spu = builders.spu


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
    decided = spu.decide(snapshot, spu.Inputs(health, now=5.0, started_at=0.0, grace_period=30.0))
    assert [(a.name, a.verb.value, a.reason, json.loads(builders.written(a.writes[0]))["status"], a.writes[0].expected_revision) for a in decided] == [
        ("spu-1", "update-status", "SPU connected", {"resolution": "Online"}, 10),
        ("spu-2", "update-status", "SPU disconnected", {"resolution": "Offline"}, 11),
    ]
    # spu-3 was Online before the restart and never reconnected: Offline once the grace ends.
    later = spu.decide(snapshot, spu.Inputs(health, now=31.0, started_at=0.0, grace_period=30.0))
    assert [(a.name, a.reason) for a in later] == [
        ("spu-1", "SPU connected"),
        ("spu-2", "SPU disconnected"),
        ("spu-3", "SPU did not reconnect within 30 s of the SC starting"),
    ]


def test_spu_controller_is_quiet_when_everything_matches() -> None:
    snapshot = snapshot_of((make_spu(1, "Online"), 10), (make_spu(2, "Init"), 11))
    health = {1: health_module.HealthRecord(ONLINE, 0.0)}
    assert spu.decide(snapshot, spu.Inputs(health, now=100.0, started_at=0.0, grace_period=30.0)) == []


# ---------------------------------------------------------------------------- SPU-group controller


def test_spu_group_collision_makes_it_invalid_and_creates_nothing() -> None:
    snapshot = snapshot_of((builders.spu_group("main", 3, 11), 5), (make_spu(12, name="custom-12"), 6))
    decided = spu_group.decide(snapshot, spu_group.Inputs())
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
    assert [a.verb.value for a in spu_group.decide(snapshot_of((builders.spu_group("main", 2, 11), 5)), spu_group.Inputs())] == ["update-status"]
    decided = spu_group.decide(snapshot_of((builders.spu_group("main", 2, 11, "Reserved", rack="r1"), 5)), spu_group.Inputs())
    assert [(a.verb.value, a.name) for a in decided] == [("create", "main-0"), ("create", "main-1")]
    created = models.decode("spus", builders.written(decided[1].writes[0]))
    assert created.spec == models.SpuSpec(
        id=12,
        spu_type=models.SpuType.MANAGED,
        rack="r1",
        public_endpoint=models.Endpoint(host="127.0.0.1", port=10012),
        private_endpoint=models.Endpoint(host="127.0.0.1", port=30012),
    )
    assert decided[1].writes[0].expected_revision == 0


def test_spu_group_scale_down_and_delete() -> None:
    managed = [spu_group.desired_spus(builders.spu_group("main", 3, 11))[index] for index in range(3)]
    snapshot = snapshot_of((builders.spu_group("main", 1, 11, "Reserved"), 5), *((spu_obj, 6 + index) for index, spu_obj in enumerate(managed)))
    assert [(a.verb.value, a.name, a.reason) for a in spu_group.decide(snapshot, spu_group.Inputs())] == [
        ("delete", "main-1", "SPU group main scaled down to 1"),
        ("delete", "main-2", "SPU group main scaled down to 1"),
    ]
    orphaned = snapshot_of(*((spu_obj, 6 + index) for index, spu_obj in enumerate(managed)), (make_spu(50), 9))
    assert [(a.verb.value, a.name, a.writes[0].expected_revision) for a in spu_group.decide(orphaned, spu_group.Inputs())] == [
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
    decided = topic.decide(snapshot, topic.Inputs())
    assert [(a.name, json.loads(builders.written(a.writes[0]))["status"]["resolution"]) for a in decided] == [
        ("good", "Pending"),
        ("bad-policy", "InvalidConfig"),
    ]
    reason = json.loads(builders.written(decided[1].writes[0]))["status"]["reason"]
    assert "sideways" in reason


def test_pending_topic_is_provisioned_with_partitions_and_chain_in_one_action() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    pending = make_topic("t", {"resolution": "Pending"}, partitions=2, replicationFactor=2)
    chain = {topic.CHAIN_KEY: (b'{"nextStartIndex": 1}', 4)}
    decided = topic.decide(snapshot_of(*spus, (pending, 9), meta=chain), topic.Inputs())
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
    provisioned = models.decode("topics", builders.written(decided[0].writes[1]))
    follow_up = topic.decide(snapshot_of(*spus, (provisioned, 10), meta={topic.CHAIN_KEY: (b'{"nextStartIndex": 3}', 10)}), topic.Inputs())
    found = summary(follow_up)
    # Each partition gets an identity of its own, drawn at random: compared apart.
    uids = [value.pop("uid") for _, value, _ in found[0][3]]
    assert len(set(uids)) == 2 and all(1 <= uid < 2**63 for uid in uids), uids
    assert found == [
        (
            "create-partitions",
            "topics",
            "t",
            [
                ("partitions/t-0", {"name": "t-0", "spec": {"leader": 1, "replicas": [1, 2]}, "status": {"resolution": "Offline", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [], "replicas": [], "lrs": 0}}, 0),
                ("partitions/t-1", {"name": "t-1", "spec": {"leader": 2, "replicas": [2, 0]}, "status": {"resolution": "Offline", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [], "replicas": [], "lrs": 0}}, 0),
            ],
        ),
    ]
    assert follow_up[0].key == "topics/t/partitions/0" and follow_up[0].reason == "partitions 0..1 of topic t"


def test_insufficient_resources_names_how_many_spus_are_missing() -> None:
    pending = make_topic("t", {"resolution": "Pending"}, partitions=1, replicationFactor=3)
    snapshot = snapshot_of((make_spu(0), 1), (make_spu(1, "Offline"), 2), (pending, 9))
    decided = topic.decide(snapshot, topic.Inputs())
    status = json.loads(builders.written(decided[0].writes[0]))["status"]
    assert status["resolution"] == "InsufficientResources"
    assert "2 more" in status["reason"], status["reason"]
    # Same situation again: nothing to write.
    stuck = make_topic("t", status, partitions=1, replicationFactor=3)
    assert topic.decide(snapshot_of((make_spu(0), 1), (make_spu(1, "Offline"), 2), (stuck, 10)), topic.Inputs()) == []


def test_provisioned_topic_with_all_partitions_needs_nothing() -> None:
    provisioned = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0, 1]}}, partitions=1, replicationFactor=2)
    partition = models.Partition(name="t-0", spec=models.PartitionSpec(leader=1, replicas=[0, 1]))  # leader moved: fine
    snapshot = snapshot_of((make_spu(0), 1), (make_spu(1), 2), (provisioned, 3), (partition, 3))
    assert topic.decide(snapshot, topic.Inputs()) == []


def test_missing_partitions_are_created_and_orphans_deleted() -> None:
    provisioned = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0, 1], "1": [1, 0]}}, partitions=2, replicationFactor=2)
    orphan = models.Partition(name="old-0", spec=models.PartitionSpec(leader=0, replicas=[0]))
    stale = models.Partition(name="t-1", spec=models.PartitionSpec(leader=0, replicas=[0, 2]))
    snapshot = snapshot_of((make_spu(0), 1), (make_spu(1), 2), (orphan, 3), (stale, 4), (provisioned, 5))
    assert [(a.verb.value, a.name, a.reason) for a in topic.decide(snapshot, topic.Inputs())] == [
        ("delete", "old-0", "topic old was deleted"),
        ("delete", "t-1", "replicas [0, 2] differ from the topic's replica map [1, 0]"),
        ("create-partitions", "t", "partition 0 of topic t"),
    ]


def test_partitions_left_by_an_earlier_topic_of_the_same_name_are_deleted() -> None:
    recreated = make_topic("t", {"resolution": "Init"}, partitions=1, replicationFactor=1)
    leftover = models.Partition(name="t-0", spec=models.PartitionSpec(leader=0, replicas=[0]))
    decided = topic.decide(snapshot_of((make_spu(0), 1), (leftover, 2), (recreated, 5)), topic.Inputs())
    assert [(a.verb.value, a.name, a.reason) for a in decided] == [
        ("update-status", "t", "Pending: configuration is valid"),
        ("delete", "t-0", "topic t has no partition 0 in its replica map"),
    ]


def test_add_partitions_places_only_the_new_ones() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    grown = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [2, 0]}}, partitions=3, replicationFactor=2)
    partition = models.Partition(name="t-0", spec=models.PartitionSpec(leader=2, replicas=[2, 0]))
    decided = topic.decide(snapshot_of(*spus, (grown, 7), (partition, 7)), topic.Inputs())
    assert len(decided) == 1 and decided[0].verb is actions.Verb.PROVISION
    written = {write.key: json.loads(write.value) for write in decided[0].writes if write.value is not None}
    replica_map = written["topics/t"]["status"]["replicaMap"]
    assert replica_map["0"] == [2, 0]
    assert sorted(replica_map) == ["0", "1", "2"]
    assert [key for key in written if key.startswith("partitions/")] == []


def test_many_pending_topics_share_one_transaction_within_the_limit() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    pending = [(make_topic(f"t{index:03d}", {"resolution": "Pending"}, partitions=10, replicationFactor=2), 10 + index) for index in range(200)]
    decided = topic.decide(snapshot_of(*spus, *pending), topic.Inputs())
    assert len(decided) == 1
    writes = decided[0].writes
    assert len(writes) == kv.MAX_TXN_WRITES == 127
    # After the chain key, 126 topic statuses; the other topics wait for the next pass.
    assert decided[0].name == ",".join(f"t{index:03d}" for index in range(126))
    assert json.loads(builders.written(writes[0])) == {"nextStartIndex": 1260}


def test_a_topic_with_more_partitions_than_a_transaction_holds_creates_them_in_chunks() -> None:
    replica_map = {str(index): [index % 2] for index in range(300)}
    provisioned = make_topic("big", {"resolution": "Provisioned", "replicaMap": replica_map}, partitions=300, replicationFactor=1)
    existing = models.Partition(name="big-5", spec=models.PartitionSpec(leader=1, replicas=[1]))
    decided = topic.decide(snapshot_of((make_spu(0), 1), (make_spu(1), 2), (provisioned, 3), (existing, 4)), topic.Inputs())
    assert [(action.key, len(action.writes)) for action in decided] == [
        ("topics/big/partitions/0", 127), ("topics/big/partitions/128", 127), ("topics/big/partitions/255", 45),
    ]
    assert decided[0].reason == "partitions 0..4, 6..127 of topic big"
    assert decided[1].reason == "partitions 128..254 of topic big"
    created = [write.key for action in decided for write in action.writes]
    assert sorted(created) == sorted(f"partitions/big-{index}" for index in range(300) if index != 5)


def test_a_topic_whose_provisioning_the_store_refuses_says_so_then_is_placed_again() -> None:
    """The store refused the topic's provisioning (an etcd whose --max-request-bytes was lowered
    under the SC): the next pass says so in its reason, keeping it Pending, rather than placing
    it again; with that said, it is placed again (the provision overwrites the reason)."""
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    refusal = "etcd refused a request of 38416 bytes as too large"

    def refused(key: str) -> str:
        return refusal if key == "topics/t" else ""

    pending = make_topic("t", {"resolution": "Pending"}, partitions=2, replicationFactor=2)
    decided = topic.decide(snapshot_of(*spus, (pending, 9)), topic.Inputs(refused=refused))
    reason = f"the store refused to provision it (retried with a backoff): {refusal}"
    assert summary(decided) == [
        ("update-status", "topics", "t", [("topics/t", {**json.loads(models.encode(pending)), "status": {"resolution": "Pending", "replicaMap": {}, "reason": reason}}, 9)])
    ]
    said = models.decode("topics", builders.written(decided[0].writes[0]))
    again = topic.decide(snapshot_of(*spus, (said, 10)), topic.Inputs(refused=refused))
    assert [(action.verb.value, action.name) for action in again] == [("provision", "t")]
    assert json.loads(builders.written(again[0].writes[1]))["status"]["reason"] == ""


def test_a_provisioned_topic_whose_partitions_the_store_refuses_says_so_until_they_are_all_there() -> None:
    """The store refused some of a topic's partitions (an etcd whose --max-txn-ops was lowered
    under the SC), which wait out their backoff: the topic's reason names the partitions not there
    and the refusal. Refused no more, it stays while some are missing; once all are there, the
    reason is what placing the topic said (here: nothing), on an incremental pass too."""
    spus = [(make_spu(0), 1), (make_spu(1), 2)]
    provisioned = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0, 1], "1": [1, 0], "2": [0, 1]}}, partitions=3, replicationFactor=2)
    existing = models.new_partition(provisioned, 1, [1, 0])
    refusal = "etcd at etcd-0:2379 refused a transaction of 3 operations as too many"
    waiting = topic.Inputs(refused=lambda key: refusal if key == "topics/t" else "", busy=lambda key: key.startswith("partitions/"))
    decided = topic.decide(snapshot_of(*spus, (provisioned, 3), (existing, 4)), waiting)
    reason = f"the store refused to create partitions 0, 2 (retried with a backoff): {refusal}"
    assert [(action.verb.value, action.name, action.reason) for action in decided] == [("update-status", "t", f"Provisioned: {reason}")]
    said = models.decode("topics", builders.written(decided[0].writes[0]))
    assert said.status.model_dump() == {**provisioned.status.model_dump(), "reason": reason}

    nothing: local.Changes[Any] = local.Changes(full=False, updated=[], deleted=[], epoch=0)
    quiet = {"topics": nothing, "spus": nothing, "partitions": nothing}
    still_missing = snapshot_of(*spus, (said, 5), (existing, 4))
    assert topic.decide(still_missing, topic.Inputs(changes=quiet, busy=lambda key: key.startswith("partitions/"))) == []
    created = [(models.new_partition(provisioned, index, [0, 1]), 6 + index) for index in (0, 2)]
    decided = topic.decide(snapshot_of(*spus, (said, 5), (existing, 4), *created), topic.Inputs(changes=quiet))
    assert [(action.verb.value, action.name, action.reason) for action in decided] == [
        ("update-status", "t", "Provisioned: the store took its partitions")
    ]
    assert models.decode("topics", builders.written(decided[0].writes[0])).status == provisioned.status


def test_an_incremental_pass_validates_changed_topics_and_places_every_waiting_one() -> None:
    """Pending topics wait for the chain key, not for a change of their own: once it is free they
    are placed though no listener reports them. Init topics are validated when they change."""
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    waiting = [(make_topic(f"w{index}", {"resolution": "Pending"}, partitions=1, replicationFactor=1), 10 + index) for index in range(2)]
    new = (make_topic("new", partitions=1, replicationFactor=1), 20)
    snapshot = snapshot_of(*spus, *waiting, new)
    nothing: local.Changes[Any] = local.Changes(full=False, updated=[], deleted=[], epoch=0)
    changed_new = local.Changes(full=False, updated=[snapshot.entries("topics")["new"]], deleted=[], epoch=0)

    def changes(topics: local.Changes[Any]) -> dict[str, local.Changes[Any]]:
        return {"topics": topics, "spus": nothing, "partitions": nothing}

    chain_busy = topic.decide(snapshot, topic.Inputs(changes=changes(changed_new), busy=lambda key: key == topic.CHAIN_KEY, retry_unplaced=False))
    assert [(action.verb.value, action.name) for action in chain_busy] == [("update-status", "new")]
    chain_free = topic.decide(snapshot, topic.Inputs(changes=changes(nothing), busy=lambda key: False, retry_unplaced=False))
    assert [(action.verb.value, action.name) for action in chain_free] == [("provision", "w0,w1")]


# ---------------------------------------------------------------------------- existing partitions stay put


def racked_spus(*offline: int) -> list[tuple[models.AnyObject, int]]:
    """SPUs 0, 1, 2 in racks r1..r3 (online), and SPU 3 with no rack (online unless in ``offline``)."""
    spus: list[tuple[models.AnyObject, int]] = [(make_spu(spu_id, rack=f"r{spu_id + 1}"), spu_id + 1) for spu_id in range(3)]
    spus.append((make_spu(3, "Offline" if 3 in offline else "Online"), 4))
    return spus


ORDERS_MAP = {"0": [0, 1], "1": [1, 2], "2": [2, 0], "3": [0, 1]}
PARTIAL_RACKS = (
    "rack-aware placement needs a rack on every online SPU, but SPU 3 has none: give SPU 3 a rack "
    "(sc spu set-rack ID --rack R), or create the topic with ignoreRackAssignment: true "
    "(sc topic create --ignore-rack-assignment); the topic stays and is placed by itself once the SPUs allow it"
)


def orders(resolution: str, reason: str = "", partitions: int = 5) -> models.Topic:
    return make_topic(
        "orders", {"resolution": resolution, "replicaMap": ORDERS_MAP, "reason": reason}, partitions=partitions, replicationFactor=2
    )


def orders_partitions() -> list[tuple[models.AnyObject, int]]:
    return [
        (models.Partition(name=f"orders-{index}", spec=models.PartitionSpec(leader=replicas[0], replicas=replicas)), 20 + int(index))
        for index, replicas in ORDERS_MAP.items()
    ]


def test_adding_partitions_that_cannot_be_placed_keeps_the_existing_ones() -> None:
    """Partial racks when a partition is added: InvalidConfig with the map of the partitions that
    exist, and not one of them deleted."""
    decided = topic.decide(snapshot_of(*racked_spus(), (orders("Provisioned"), 40), *orders_partitions()), topic.Inputs())
    assert summary(decided) == [
        (
            "update-status",
            "topics",
            "orders",
            [
                (
                    "topics/orders",
                    {
                        "name": "orders",
                        "spec": {"partitions": 5, "replicationFactor": 2, "ignoreRackAssignment": False},
                        "status": {"resolution": "InvalidConfig", "replicaMap": ORDERS_MAP, "reason": PARTIAL_RACKS},
                    },
                    40,
                )
            ],
        )
    ]


def test_adding_partitions_without_enough_spus_keeps_the_existing_ones() -> None:
    """Two of the three racked SPUs offline when a partition is added: InsufficientResources with
    the map of the partitions that exist, none deleted, and the missing one of them created."""
    spus = [(make_spu(0, rack="r1"), 1), (make_spu(1, "Offline", rack="r2"), 2), (make_spu(2, "Offline", rack="r3"), 3)]
    decided = topic.decide(snapshot_of(*spus, (orders("Provisioned"), 40), *orders_partitions()[1:]), topic.Inputs())
    assert [(action.verb.value, action.name, action.write_keys) for action in decided] == [
        ("update-status", "orders", ("topics/orders",)),
        ("create-partitions", "orders", ("partitions/orders-0",)),
    ]
    status = json.loads(builders.written(decided[0].writes[0]))["status"]
    assert (status["resolution"], status["replicaMap"]) == ("InsufficientResources", ORDERS_MAP)


def test_an_invalid_topic_valid_again_keeps_its_replica_map() -> None:
    """The issue's scenario: the rack-less SPU goes offline, the topic is valid again. It goes
    Pending with its map (not emptied), and no partition is deleted."""
    snapshot = snapshot_of(*racked_spus(3), (orders("InvalidConfig", PARTIAL_RACKS), 41), *orders_partitions())
    assert summary(topic.decide(snapshot, topic.Inputs())) == [
        (
            "update-status",
            "topics",
            "orders",
            [
                (
                    "topics/orders",
                    {
                        "name": "orders",
                        "spec": {"partitions": 5, "replicationFactor": 2, "ignoreRackAssignment": False},
                        "status": {"resolution": "Pending", "replicaMap": ORDERS_MAP, "reason": ""},
                    },
                    41,
                )
            ],
        )
    ]
    # Pending with its map: only the new partition is placed, the others stay where they are.
    pending = snapshot_of(*racked_spus(3), (orders("Pending"), 42), *orders_partitions())
    decided = topic.decide(pending, topic.Inputs())
    assert [(action.verb.value, action.name) for action in decided] == [("provision", "orders")]
    written = models.decode("topics", builders.written(decided[0].writes[1]))
    assert {str(index): replicas for index, replicas in written.status.replica_map.items() if index < 4} == ORDERS_MAP
    assert sorted(written.status.replica_map) == [0, 1, 2, 3, 4]


def test_an_invalid_spec_keeps_the_map_of_the_partitions_that_exist() -> None:
    """A spec made invalid by hand (a bad policy) on a provisioned topic: InvalidConfig, its
    partitions untouched."""
    broken = make_topic(
        "orders",
        {"resolution": "InvalidConfig", "replicaMap": ORDERS_MAP, "reason": "old"},
        partitions=4,
        replicationFactor=2,
        placement={"strategy": "policies", "policies": "node=sideways"},
    )
    decided = topic.decide(snapshot_of(*racked_spus(3), (broken, 43), *orders_partitions()), topic.Inputs())
    assert [(action.verb.value, action.name) for action in decided] == [("update-status", "orders")]
    status = json.loads(builders.written(decided[0].writes[0]))["status"]
    assert (status["resolution"], status["replicaMap"]) == ("InvalidConfig", ORDERS_MAP)


def test_a_partition_deleted_behind_the_sc_is_created_again_by_an_incremental_pass() -> None:
    """Its deletion alone (no topic change) is enough: not only updated partitions count."""
    present = orders_partitions()[:1] + orders_partitions()[2:]
    snapshot = snapshot_of(*racked_spus(3), (orders("Provisioned", partitions=4), 40), *present)
    nothing: local.Changes[Any] = local.Changes(full=False, updated=[], deleted=[], epoch=0)
    deleted: local.Changes[Any] = local.Changes(full=False, updated=[], deleted=["orders-1"], epoch=0)
    decided = topic.decide(snapshot, topic.Inputs(changes={"topics": nothing, "spus": nothing, "partitions": deleted}, retry_unplaced=False))
    assert [(action.verb.value, action.name, action.reason, action.write_keys) for action in decided] == [
        ("create-partitions", "orders", "partition 1 of topic orders", ("partitions/orders-1",))
    ]


def test_missing_partitions_of_a_topic_that_cannot_grow_are_created_again() -> None:
    """InvalidConfig while adding partitions: the partitions of its map still exist, and one
    deleted behind the SC's back comes back where it was."""
    present = orders_partitions()[1:]
    snapshot = snapshot_of(*racked_spus(), (orders("InvalidConfig", PARTIAL_RACKS), 41), *present)
    assert [(action.verb.value, action.name, action.write_keys) for action in topic.decide(snapshot, topic.Inputs())] == [
        ("create-partitions", "orders", ("partitions/orders-0",))
    ]


# ---------------------------------------------------------------------------- replica maps with a gap


def provisioned_map(decided: list[actions.Action], name: str) -> dict[int, list[int]]:
    """The replica map the pass's provision writes for topic ``name``."""
    (provision,) = [action for action in decided if action.verb is actions.Verb.PROVISION]
    written = models.decode("topics", builders.written(next(write for write in provision.writes if write.key == f"topics/{name}")))
    return dict(written.status.replica_map)


def test_a_row_removed_from_the_map_behind_the_sc_is_placed_alone_and_no_partition_moves() -> None:
    """Row 1 of a 3-row map removed by hand, and its partition gone too: only row 1 is placed;
    partitions 0 and 2 keep their rows, and none of them is deleted (their records stay)."""
    gapped = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0], "2": [2]}}, partitions=3, replicationFactor=1)
    present = [(builders.partition("t-0", [0]), 10), (builders.partition("t-2", [2]), 12)]
    decided = topic.decide(snapshot_of(*three_spus(), (gapped, 5), *present), topic.Inputs())
    assert [(action.verb.value, action.name, action.reason) for action in decided] == [
        ("provision", "t", "t: placed partition 1 on 1 SPUs")
    ]
    replica_map = provisioned_map(decided, "t")
    assert (replica_map[0], replica_map[2], sorted(replica_map)) == ([0], [2], [0, 1, 2])
    # Once the map is seen, the next pass creates partition 1 alone and deletes nothing.
    filled = make_topic("t", {"resolution": "Provisioned", "replicaMap": replica_map}, partitions=3, replicationFactor=1)
    assert [(action.verb.value, action.name, action.write_keys) for action in topic.decide(snapshot_of(*three_spus(), (filled, 20), *present), topic.Inputs())] == [
        ("create-partitions", "t", ("partitions/t-1",))
    ]


def test_a_row_removed_from_the_map_whose_partition_exists_is_rebuilt_from_it() -> None:
    """Row 1 removed by hand, partition t-1 still there: the row is written back as the partition
    is (nothing is placed), and t-1 is not deleted, not even while the chain key is busy."""
    gapped = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0], "2": [2]}}, partitions=3, replicationFactor=1)
    present = [(builders.partition(f"t-{index}", [index]), 10 + index) for index in range(3)]
    snapshot = snapshot_of(*three_spus(), (gapped, 5), *present)
    decided = topic.decide(snapshot, topic.Inputs())
    assert [(action.verb.value, action.name, action.reason) for action in decided] == [
        ("provision", "t", "t: replica map row 1 rebuilt from the partition that exists")
    ]
    assert provisioned_map(decided, "t") == {0: [0], 1: [1], 2: [2]}
    assert topic.decide(snapshot, topic.Inputs(busy=lambda key: key == topic.CHAIN_KEY)) == []


def test_a_partition_left_by_an_earlier_topic_of_the_same_name_is_not_taken_for_a_missing_row() -> None:
    """Created before the topic, it is not the topic's: the row is placed, not rebuilt from it."""
    recreated = make_topic("t", {"resolution": "Pending"}, partitions=1, replicationFactor=1)
    leftover = builders.partition("t-0", [2])
    decided = topic.decide(snapshot_of(*three_spus(), (leftover, 4), (recreated, 5)), topic.Inputs())
    assert provisioned_map(decided, "t") == {0: [0]}


def test_a_map_of_the_right_length_with_a_gap_is_filled_and_a_row_past_the_count_is_not_created() -> None:
    """Rows {0, 5} for 2 partitions: row 1 is placed (the topic is short of it), row 5 stays in
    the map but is no partition, and the log line says so."""
    gapped = make_topic("t", {"resolution": "Provisioned", "replicaMap": {"0": [0], "5": [1]}}, partitions=2, replicationFactor=1)
    decided = topic.decide(snapshot_of(*three_spus(), (gapped, 5), (builders.partition("t-0", [0]), 10)), topic.Inputs())
    assert [(action.verb.value, action.name, action.reason) for action in decided] == [
        (
            "provision",
            "t",
            "t: placed partition 1 on 1 SPUs; replica map row 5 is past the topic's 2 partitions: not created",
        )
    ]
    replica_map = provisioned_map(decided, "t")
    assert (replica_map[0], replica_map[5], sorted(replica_map)) == ([0], [1], [0, 1, 5])
    filled = make_topic("t", {"resolution": "Provisioned", "replicaMap": replica_map}, partitions=2, replicationFactor=1)
    follow_up = topic.decide(snapshot_of(*three_spus(), (filled, 20), (builders.partition("t-0", [0]), 10)), topic.Inputs())
    assert [(action.verb.value, action.name, action.write_keys) for action in follow_up] == [
        ("create-partitions", "t", ("partitions/t-1",))
    ]


def test_a_manual_topic_s_map_with_a_gap_is_filled_from_its_assignment_and_keeps_its_rows() -> None:
    """Rows {0, 2} of a 3-partition manual topic, row 0 moved from the assignment's [0] to [1]:
    row 1 comes from the assignment, row 0 stays where its partition is."""
    assignment = [{"id": index, "replicas": [index]} for index in range(3)]
    gapped = make_topic("m", {"resolution": "Provisioned", "replicaMap": {"0": [1], "2": [2]}}, replicaAssignment=assignment)
    present = [(builders.partition("m-0", [1]), 10), (builders.partition("m-2", [2]), 12)]
    decided = topic.decide(snapshot_of(*three_spus(), (gapped, 5), *present), topic.Inputs())
    assert [(action.verb.value, action.name, action.reason) for action in decided] == [
        ("provision", "m", "m: placed partition 1 on 1 SPUs")
    ]
    assert provisioned_map(decided, "m") == {0: [1], 1: [1], 2: [2]}


# ---------------------------------------------------------------------------- topics too large to store

HUGE_REASON = (
    "topic 'huge' with 100000 partitions at replication factor 3 would take at least 1589050 bytes in the store, "
    "above the 1571092 bytes one topic may take (etcd's request limit, etcd_max_request_bytes, is 1572864 bytes): "
    "at replication factor 3 at most 98877 partitions fit with 1-digit SPU ids; use fewer partitions or a lower "
    "replication factor"
)


def no_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    def placed(request: placement.PlacementRequest) -> placement.PlacementResult:
        raise AssertionError(f"placement ran for {request.partitions} partitions")

    monkeypatch.setattr(placement, "compute", placed)


def three_spus() -> list[tuple[models.AnyObject, int]]:
    return [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]


def test_a_stored_topic_too_large_for_the_store_is_invalid_without_being_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written straight to the store (the API refuses it): InvalidConfig at once, never Pending,
    and not even placed (at least its size with the narrowest SPU ids is too much)."""
    no_placement(monkeypatch)
    huge = make_topic("huge", partitions=100_000, replicationFactor=3)
    assert summary(topic.decide(snapshot_of(*three_spus(), (huge, 7)), topic.Inputs())) == [
        (
            "update-status",
            "topics",
            "huge",
            [
                (
                    "topics/huge",
                    {
                        "name": "huge",
                        "spec": {"partitions": 100_000, "replicationFactor": 3, "ignoreRackAssignment": False},
                        "status": {"resolution": "InvalidConfig", "replicaMap": {}, "reason": HUGE_REASON},
                    },
                    7,
                )
            ],
        )
    ]


def test_a_topic_too_large_is_never_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """InvalidConfig for its size: a full pass with every unplaced topic retried decides nothing."""
    no_placement(monkeypatch)
    huge = make_topic("huge", {"resolution": "InvalidConfig", "reason": HUGE_REASON}, partitions=100_000, replicationFactor=3)
    assert topic.decide(snapshot_of(*three_spus(), (huge, 8)), topic.Inputs(retry_unplaced=True)) == []


def test_a_pending_topic_too_large_is_invalid_without_being_placed(monkeypatch: pytest.MonkeyPatch) -> None:
    no_placement(monkeypatch)
    huge = make_topic("huge", {"resolution": "Pending"}, partitions=100_000, replicationFactor=3)
    decided = topic.decide(snapshot_of(*three_spus(), (huge, 9)), topic.Inputs())
    assert [(action.verb.value, json.loads(builders.written(action.writes[0]))["status"]) for action in decided] == [
        ("update-status", {"resolution": "InvalidConfig", "replicaMap": {}, "reason": HUGE_REASON})
    ]


def test_growing_a_topic_past_what_fits_keeps_its_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Added partitions past the size limit (written by hand): InvalidConfig with the map of the
    four partitions that exist, which stay."""
    no_placement(monkeypatch)
    existing = {"0": [0, 1, 2], "1": [1, 2, 0], "2": [2, 0, 1], "3": [0, 1, 2]}
    grown = make_topic("huge", {"resolution": "Provisioned", "replicaMap": existing}, partitions=100_000, replicationFactor=3)
    partitions = [
        (models.Partition(name=f"huge-{index}", spec=models.PartitionSpec(leader=replicas[0], replicas=replicas)), 10 + int(index))
        for index, replicas in existing.items()
    ]
    decided = topic.decide(snapshot_of(*three_spus(), (grown, 20), *partitions), topic.Inputs())
    assert [(action.verb.value, json.loads(builders.written(action.writes[0]))["status"]) for action in decided] == [
        ("update-status", {"resolution": "InvalidConfig", "replicaMap": existing, "reason": HUGE_REASON})
    ]


def test_a_topic_placed_on_wide_spu_ids_is_sized_exactly_once_placed() -> None:
    """With 1-digit and 9-digit SPU ids the narrow bound lets it through; once placed, its real
    size is too large: InvalidConfig, nothing provisioned."""
    spus = [(make_spu(1), 1), (make_spu(123_456_789), 2)]
    wide = make_topic("wide", {"resolution": "Pending"}, partitions=90_000, replicationFactor=2)
    decided = topic.decide(snapshot_of(*spus, (wide, 9)), topic.Inputs())
    assert [action.verb.value for action in decided] == ["update-status"]
    status = json.loads(builders.written(decided[0].writes[0]))["status"]
    assert (status["resolution"], status["replicaMap"]) == ("InvalidConfig", {})
    largest = topic_size.max_topic_bytes(topic.DEFAULT_REQUEST_SIZE, "wide", topic.CHAIN_KEY)
    fitting = topic_size.largest_count(wide, 2, 9, largest)
    size = int(status["reason"].removeprefix("topic 'wide' with 90000 partitions at replication factor 2 would take ").split(" ")[0])
    # Half the ids have 9 digits: more than the narrow bound, which let it through.
    assert topic_size.provisioned_bytes(wide, 90_000, 2, 1) <= largest < size
    assert status["reason"] == (
        f"topic 'wide' with 90000 partitions at replication factor 2 would take {size} bytes in the store, above the "
        f"{largest} bytes one topic may take (etcd's request limit, etcd_max_request_bytes, is 1572864 bytes): at "
        f"replication factor 2 at most {fitting} partitions fit with 9-digit SPU ids; use fewer partitions or a lower "
        "replication factor"
    )


def test_a_provision_transaction_is_filled_by_bytes() -> None:
    """Ten pending topics of about 60 KB under a 256 KiB request limit: the first provision holds
    those that fit together (with the chain key); the others wait for the next pass."""
    request_size = kv.RequestSize(kv.DEFAULT_PREFIX, 256 * 1024)
    pending = [(make_topic(f"t{index}", {"resolution": "Pending"}, partitions=5000, replicationFactor=2), 10 + index) for index in range(10)]
    decided = topic.decide(snapshot_of(*three_spus(), *pending), topic.Inputs(request_size=request_size))
    assert [(action.verb.value, action.name) for action in decided] == [("provision", "t0,t1,t2,t3")]
    writes = decided[0].writes
    compares = [kv.Compare(write.key, write.expected_revision) for write in writes if write.expected_revision is not None]
    request_size.check(compares, [kv.Put(write.key, write.value) for write in writes if write.value is not None])


def test_a_topic_whose_provision_failed_is_provisioned_alone() -> None:
    """After a provision failed (the loop remembers its topics), each of its topics goes in a
    transaction of its own, so the one at fault cannot take the others down again."""
    pending = [(make_topic(f"t{index}", {"resolution": "Pending"}, partitions=1, replicationFactor=1), 10 + index) for index in range(3)]
    snapshot = snapshot_of(*three_spus(), *pending)
    assert [action.name for action in topic.decide(snapshot, topic.Inputs(alone=lambda key: key == "topics/t1"))] == ["t0,t2"]
    assert [action.name for action in topic.decide(snapshot, topic.Inputs(alone=lambda key: key == "topics/t0"))] == ["t0"]
    assert [action.name for action in topic.decide(snapshot, topic.Inputs(alone=lambda key: key != "topics/t2"))] == ["t0"]


def drained_spu(spu_id: int, resolution: str = "Online", **status: Any) -> models.Spu:
    plain = make_spu(spu_id, resolution)
    return models.Spu.model_validate(
        {**plain.to_json_dict(), "spec": {**plain.spec.to_json_dict(), "drain": True}, "status": {"resolution": resolution, **status}}
    )


def led(name: str, leader: int, replicas: list[int], resolution: str = "Online") -> models.Partition:
    in_sync = [{"spu": spu_id, "hw": 10, "leo": 10} for spu_id in replicas if spu_id != leader]
    return models.Partition.model_validate(
        {
            "name": name,
            "spec": {"leader": leader, "replicas": replicas},
            "status": {"resolution": resolution, "leader": {"spu": leader, "hw": 10, "leo": 10}, "replicas": in_sync},
        }
    )


def test_a_drained_spu_status_says_draining_with_what_cannot_move_then_drained() -> None:
    health = {spu_id: health_module.HealthRecord(ONLINE, 0.0) for spu_id in range(3)}

    def statuses(*objs: models.AnyObject) -> list[tuple[str, dict[str, Any], str]]:
        decided = spu.decide(snapshot_of(*((obj, 10 + index) for index, obj in enumerate(objs))), spu.Inputs(health, 5.0, 0.0, 30.0))
        return [(a.name, json.loads(builders.written(a.writes[0]))["status"], a.reason) for a in decided]

    others = (make_spu(1), make_spu(2))
    # Leading a partition that can move: Draining, nothing in the way.
    assert statuses(drained_spu(0), *others, led("orders-0", 0, [0, 1])) == [
        ("spu-0", {"resolution": "Online", "drain": "Draining"}, "SPU 0 is draining: 1 leadership(s) to move")
    ]
    # One that cannot: the reason names it and why.
    assert statuses(drained_spu(0), *others, led("orders-0", 0, [0, 1]), led("solo-0", 0, [0])) == [
        (
            "spu-0",
            {"resolution": "Online", "drain": "Draining", "reason": "1 of the 2 partition(s) it leads cannot move: solo-0 (it has no other replica)"},
            "SPU 0 is draining; 1 of the 2 partition(s) it leads cannot move: solo-0 (it has no other replica)",
        )
    ]
    # Leading nothing (a LeaderOffline partition has no leader): Drained, the reason gone.
    stuck = {"drain": "Draining", "reason": "1 of the 2 partition(s) it leads cannot move: solo-0 (it has no other replica)"}
    assert statuses(drained_spu(0, **stuck), *others, led("orders-0", 1, [0, 1]), led("solo-0", 0, [0], "LeaderOffline")) == [
        ("spu-0", {"resolution": "Online", "drain": "Drained"}, "SPU 0 is drained: it leads no partition")
    ]
    # Nothing to write when the status already says so; an undrained SPU's drain status goes.
    assert statuses(drained_spu(0, drain="Drained"), *others) == []
    assert statuses(make_spu(0).model_copy(update={"status": models.SpuStatus(resolution=models.SpuResolution.ONLINE, drain=models.SpuDrain.DRAINED)}), *others) == [
        ("spu-0", {"resolution": "Online"}, "SPU 0 is no longer draining")
    ]
    # A resolution change and a drain change in one write, both reasons given.
    assert statuses(drained_spu(0, "Init"), *others) == [
        ("spu-0", {"resolution": "Online", "drain": "Drained"}, "SPU connected; SPU 0 is drained: it leads no partition")
    ]


@pytest.mark.parametrize("intent", ["drain", "decommission"])
def test_spu_group_keeps_the_operator_s_drain_and_decommission_of_its_spus(intent: str) -> None:
    """spec.drain and spec.decommission are the operator's: the group controller neither clears
    them nor rewrites for them (a decommission it cleared put new topics' replicas on the SPU)."""
    [first] = spu_group.desired_spus(builders.spu_group("main", 1, 11))
    marked = first.model_copy(update={"spec": first.spec.model_copy(update={intent: True})})
    assert spu_group.decide(snapshot_of((builders.spu_group("main", 1, 11, "Reserved"), 5), (marked, 6)), spu_group.Inputs()) == []
    # A change the group does make keeps it.
    [action] = spu_group.decide(snapshot_of((builders.spu_group("main", 1, 11, "Reserved", rack="r2"), 5), (marked, 6)), spu_group.Inputs())
    assert json.loads(builders.written(action.writes[0]))["spec"]["rack"] == "r2"
    assert json.loads(builders.written(action.writes[0]))["spec"][intent] is True


def statuses(decided: list[actions.Action]) -> list[tuple[str, str, str]]:
    """(topic, resolution, reason) of each status written."""
    written = [(action.name, json.loads(builders.written(action.writes[-1]))["status"]) for action in decided]
    return [(name, status["resolution"], status["reason"]) for name, status in written]


def test_a_topic_names_a_configured_plugin_and_anything_else_is_invalid_config() -> None:
    spus = [(make_spu(spu_id), spu_id + 1) for spu_id in range(3)]
    placers = {"highest-first": placement_plugins.HighestFirst()}
    pending = make_topic("top", {"resolution": "Pending"}, partitions=2, replicationFactor=2, placement={"strategy": "highest-first"})
    [provision] = topic.decide(snapshot_of(*spus, (pending, 9)), topic.Inputs(placers=placers))
    assert json.loads(builders.written(provision.writes[1]))["status"] == {
        "resolution": "Provisioned", "replicaMap": {"0": [2, 1], "1": [2, 1]}, "reason": ""
    }
    # Without it configured (a restart without the flag), the same topic waits for the operator.
    unconfigured = topic.decide(snapshot_of(*spus, (make_topic("top", partitions=2, replicationFactor=2, placement={"strategy": "highest-first"}), 9)), topic.Inputs())
    module = make_topic("doom", partitions=2, replicationFactor=2, placement={"strategy": "os:abort"})
    named_module = topic.decide(snapshot_of(*spus, (module, 10)), topic.Inputs(placers=placers))
    assert statuses(unconfigured + named_module) == [
        (
            "top",
            "InvalidConfig",
            "placement strategy 'highest-first' is neither built in (computed, kafka, least-loaded, multi-level, "
            "policies, manual) nor a placement plug-in configured on this SC (configured: none); plug-ins are "
            "configured by the operator (sc run --placement-plugin NAME=module:Class); the topic is placed once "
            "the SC runs with that plug-in configured and working, or delete it and create it again with another "
            "strategy",
        ),
        (
            "doom",
            "InvalidConfig",
            "placement strategy 'os:abort' names a module: a topic names a built-in strategy (computed, kafka, "
            "least-loaded, multi-level, policies, manual) or a placement plug-in configured on this SC, by its name "
            "(configured: highest-first); the SC imports only the plug-ins its operator configures (sc run "
            "--placement-plugin NAME=module:Class); delete the topic and create it again with a valid spec",
        ),
    ]
    # An InvalidConfig topic is validated again on every full pass: configured now, it goes Pending.
    invalid = make_topic("top", {"resolution": "InvalidConfig", "reason": statuses(unconfigured)[0][2]}, partitions=2, replicationFactor=2, placement={"strategy": "highest-first"})
    assert statuses(topic.decide(snapshot_of(*spus, (invalid, 11)), topic.Inputs(placers=placers))) == [("top", "Pending", "")]
    assert topic.decide(snapshot_of(*spus, (invalid, 11)), topic.Inputs()) == []  # still unconfigured: the same reason, no write


def test_a_stored_manual_topic_with_ids_out_of_order_is_invalid_config() -> None:
    """Written straight into the store (the API refuses it): the controller refuses it too, never re-sorts."""
    stored = make_topic("manual", replicaAssignment=[{"id": 1, "replicas": [0]}, {"id": 0, "replicas": [1]}])
    decided = topic.decide(snapshot_of((make_spu(0), 1), (make_spu(1), 2), (stored, 5)), topic.Inputs())
    assert statuses(decided) == [
        (
            "manual",
            "InvalidConfig",
            "invalid replica assignment: assigned partition ids must be in sequence and without gaps: 1, 0 are out "
            "of order (ids given: 1, 0); delete the topic and create it again with a valid spec",
        )
    ]


def test_a_placement_with_rack_violations_says_which_partitions() -> None:
    """The seed's rack-aware walk on uneven racks may put two replicas of a partition in one rack
    while another rack has room: the topic is placed, and its reason says so."""
    racks = ["r1", "r1", "r1", "r2", "r3"]
    spus = [(make_spu(spu_id, rack=rack), spu_id + 1) for spu_id, rack in enumerate(racks)]
    pending = make_topic("t", {"resolution": "Pending"}, partitions=6, replicationFactor=3)
    ignoring = make_topic("plain", {"resolution": "Pending"}, partitions=6, replicationFactor=3, ignoreRackAssignment=True)
    [provision] = topic.decide(snapshot_of(*spus, (pending, 10), (ignoring, 11)), topic.Inputs())
    written = {write.key: json.loads(builders.written(write))["status"] for write in provision.writes[1:]}
    assert written["topics/t"] == {
        "resolution": "Provisioned",
        "replicaMap": {"0": [0, 3, 4], "1": [3, 4, 1], "2": [4, 1, 2], "3": [1, 2, 0], "4": [2, 0, 3], "5": [0, 3, 4]},
        "reason": "placed with rack violations: partitions 2, 3, 4 have more than one replica in a rack although "
        "another rack has none of their replicas (online SPUs per rack: r1 3, r2 1, r3 1; racks of equal size "
        "avoid this)",
    }
    # Racks ignored on purpose: nothing to report.
    assert written["topics/plain"]["reason"] == ""
    # Even racks (the usual case): no reason either.
    even = [(make_spu(spu_id, rack=f"r{spu_id % 3}"), spu_id + 1) for spu_id in range(6)]
    [provision] = topic.decide(snapshot_of(*even, (pending, 10)), topic.Inputs())
    assert json.loads(builders.written(provision.writes[1]))["status"]["reason"] == ""


def test_overlapping_spu_groups_created_together_leave_the_later_one_invalid() -> None:
    """Both groups were Init in one pass: each was checked against SPUs only, both became Reserved,
    and both created SPUs for ids 13 and 14."""
    snapshot = snapshot_of((builders.spu_group("second", 3, 13), 7), (builders.spu_group("first", 4, 11), 6))
    assert [(a.name, json.loads(builders.written(a.writes[0]))["status"]) for a in spu_group.decide(snapshot, spu_group.Inputs())] == [
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
    reserved = snapshot_of((builders.spu_group("second", 3, 14, "Reserved"), 7), (builders.spu_group("first", 4, 11, "Reserved"), 6))
    assert [(a.name, json.loads(builders.written(a.writes[0]))["status"]["reason"]) for a in spu_group.decide(reserved, spu_group.Inputs()) if a.verb is actions.Verb.UPDATE_STATUS] == [
        ("second", "id range 14..16 collides: id 14 is in the id range of SPU group first, created earlier"),
    ]


def test_a_managed_spu_takes_its_id_index_key_in_its_own_create() -> None:
    stale = (spu_index.encode_holder("deleted-by-hand"), 3)
    decided = spu_group.decide(snapshot_of((builders.spu_group("main", 2, 11, "Reserved"), 5), meta={"meta/spu-ids/12": stale}), spu_group.Inputs())
    assert [(a.verb.value, a.name, [(w.key, w.value, w.expected_revision) for w in a.writes[1:]]) for a in decided] == [
        ("create", "main-0", [("meta/spu-ids/11", b'{"spu": "main-0"}', 0)]),
        ("create", "main-1", [("meta/spu-ids/12", b'{"spu": "main-1"}', 3)]),  # a stale key is taken at its revision
    ]


def test_a_managed_spu_whose_id_another_spu_of_its_group_holds_waits_for_it_to_move() -> None:
    """The group's minId changed behind the SC's back (5 -> 6): main-0 must wait for main-1 to give
    id 6 up; main-1 moves to 7, giving 6 back in the same transaction."""
    old = spu_group.desired_spus(builders.spu_group("main", 2, 5))
    index = {f"meta/spu-ids/{spu_obj.spec.id}": (spu_index.encode_holder(spu_obj.name), 20 + i) for i, spu_obj in enumerate(old)}
    snapshot = snapshot_of((builders.spu_group("main", 2, 6, "Reserved"), 5), (old[0], 10), (old[1], 11), meta=index)
    decided = spu_group.decide(snapshot, spu_group.Inputs())
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
    assert models.decode("spus", builders.written(decided[0].writes[0])).spec.id == 7


def test_deleted_managed_spus_give_their_id_back_in_the_same_transaction() -> None:
    managed = spu_group.desired_spus(builders.spu_group("main", 2, 11))
    index = {"meta/spu-ids/11": (spu_index.encode_holder("main-0"), 30), "meta/spu-ids/12": (spu_index.encode_holder("custom"), 31)}
    decided = spu_group.decide(snapshot_of((managed[0], 6), (managed[1], 7), meta=index), spu_group.Inputs())
    assert [(a.verb.value, a.name, [(w.key, w.value, w.expected_revision) for w in a.writes]) for a in decided] == [
        ("delete", "main-0", [("spus/main-0", None, 6), ("meta/spu-ids/11", None, 30)]),
        ("delete", "main-1", [("spus/main-1", None, 7)]),  # the key names someone else: left alone
    ]


def test_a_stored_topic_whose_preferred_spu_is_no_id_is_invalid_not_a_crash() -> None:
    """Written straight into the store: '²' is a digit to isdigit(), not to int()."""
    placement_spec = {"strategy": "policies", "policies": "preferred_nodes=²"}
    snapshot = snapshot_of((make_spu(0), 1), (make_topic("odd", partitions=1, replicationFactor=1, placement=placement_spec), 5))
    [decided] = topic.decide(snapshot, topic.Inputs())
    status = json.loads(builders.written(decided.writes[0]))["status"]
    assert (status["resolution"], status["reason"]) == (
        "InvalidConfig",
        "placement policy preferred_nodes=²: '²' is not an SPU id; delete the topic and create it again with a valid spec",
    )


@pytest.mark.parametrize(
    "stored",
    [
        b'{"nextStartIndex": 1e400}', b'{"nextStartIndex": NaN}', b'{"nextStartIndex": ' + b"9" * 5000 + b"}", b"[]", b"\xff",
        b"[" * 100_000 + b"]" * 100_000,  # nested deeper than the JSON parser recurses
    ],
)
def test_a_hand_edited_chain_that_is_no_number_restarts_at_0(stored: bytes) -> None:
    assert topic.read_chain(snapshot_of(meta={topic.CHAIN_KEY: (stored, 7)})) == topic.Chain(0, 7)


# ---------------------------------------------------------------------------- unreadable owners


def unreadable(snapshot_store: local.LocalStore, kind: str, name: str) -> None:
    """``kind/name`` is in the store but this SC cannot read it (the Reader found it malformed)."""
    snapshot_store[kind].mark_unreadable(name, 99)


def test_the_partitions_of_a_topic_the_sc_cannot_read_are_kept() -> None:
    """A topic whose stored value does not decode (written by hand, or by a newer SC whose fields
    this one does not know) is absent from the mirror after a relist, but it is not deleted: its
    partitions are not orphans, and one that does not decode either is not created again."""
    store = local.LocalStore()
    store["spus"].apply(make_spu(0), 1)
    store["partitions"].apply(models.Partition(name="t-0", spec=models.PartitionSpec(leader=0, replicas=[0])), 2)
    store["partitions"].apply(models.Partition(name="gone-0", spec=models.PartitionSpec(leader=0, replicas=[0])), 3)
    provisioned = make_topic("u", {"resolution": "Provisioned", "replicaMap": {"0": [0], "1": [0]}}, partitions=2, replicationFactor=1)
    store["topics"].apply(provisioned, 4)
    unreadable(store, "topics", "t")
    unreadable(store, "partitions", "u-1")
    assert [(a.verb.value, a.name, a.reason) for a in topic.decide(store.snapshot(), topic.Inputs())] == [
        ("delete", "gone-0", "topic gone was deleted"),
        ("create-partitions", "u", "partition 0 of topic u"),
    ]


def test_the_spus_of_a_group_the_sc_cannot_read_are_kept() -> None:
    store = local.LocalStore()
    for index, spu_obj in enumerate(spu_group.desired_spus(builders.spu_group("main", 2, 11))):
        store["spus"].apply(spu_obj, 6 + index)
    unreadable(store, "spu-groups", "main")
    assert spu_group.decide(store.snapshot(), spu_group.Inputs()) == []


def test_a_group_does_not_create_an_spu_over_a_value_the_sc_cannot_read() -> None:
    """The group's SPU main-1 is in the store in a value this SC cannot read: creating it would lose
    its compare to that value in every pass; main-0 is created as usual."""
    store = local.LocalStore()
    store["spu-groups"].apply(builders.spu_group("main", 2, 11, "Reserved"), 5)
    unreadable(store, "spus", "main-1")
    assert [(a.verb.value, a.name) for a in spu_group.decide(store.snapshot(), spu_group.Inputs())] == [("create", "main-0")]
