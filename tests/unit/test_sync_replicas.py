"""What an SPU's Sync lists when it connects: the partitions it is a replica of, found through an
index the connection manager keeps per table epoch (SPUs connecting together after a takeover
each cost their own replicas, not a pass over every partition), each told as the committed state
says."""

from __future__ import annotations

import random

from connection_manager import health, lrs, reports, server, wire
from store import local, models
from tests.builders import partition

SPUS = range(6)


def manager(store: local.LocalStore) -> server.ConnectionManager:
    return server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas())


def scanned(store: local.LocalStore, spu_id: int) -> list[str]:
    return [entry.name for entry in store["partitions"].view.values() if spu_id in entry.obj.spec.replicas]


async def test_the_replicas_of_an_spu_follow_every_change_of_the_partitions() -> None:
    rng = random.Random(5)
    store = local.LocalStore()
    cm = manager(store)
    names = [f"t-{index}" for index in range(30)]
    revision = 0
    for _ in range(200):
        for _ in range(rng.randint(1, 4)):
            name = rng.choice(names)
            revision += 1
            if rng.random() < 0.15:
                store["partitions"].delete(name, revision)
            else:
                replicas = rng.sample(list(SPUS), rng.randint(1, 3))
                store["partitions"].apply(partition(name, replicas, resolution=rng.choice(["Online", "Offline"])), revision)
        for spu_id in SPUS:
            assert [entry.name for entry in cm.replicas_of(spu_id)] == scanned(store, spu_id)
    assert cm.replicas_of(99) == []


async def test_spus_connecting_at_one_table_epoch_share_one_index() -> None:
    store = local.LocalStore()
    for index in range(12):
        store["partitions"].apply(partition(f"t-{index}", [index % 3, (index + 1) % 3]), index + 1)
    cm = manager(store)
    cm.replicas_of(0)
    built = cm._replicas_by_spu
    assert built is not None
    cm.replicas_of(1)
    cm.replicas_of(2)
    assert cm._replicas_by_spu is built  # no pass over the table for the others
    store["partitions"].apply(partition("t-0", [2]), 100)
    assert [entry.name for entry in cm.replicas_of(0)] == scanned(store, 0)
    assert cm._replicas_by_spu is not built


def test_a_replica_is_told_as_committed() -> None:
    online = models.Partition.model_validate(
        {
            "name": "orders-3",
            "uid": 77,
            "spec": {"leader": 2, "replicas": [2, 0, 1]},
            "status": {"resolution": "Online", "leaderEpoch": 4, "partitionEpoch": 7, "isr": [2, 1]},
        }
    )
    fresh = partition("orders-4", [1, 2], uid=77)  # partition epoch 0: every replica is in sync
    leaderless = partition("orders-5", [0, 1], resolution="LeaderOffline", uid=77)
    incarnation = reports.Incarnation(0, 1)
    stored = {obj.name: local.Entry(obj, 9, 1, 1, create_revision=5) for obj in (online, fresh, leaderless)}
    for told in stored.values():
        built = server._replica_info(told, incarnation)
        validated = wire.ReplicaInfo.model_validate(built.model_dump())
        assert built == validated
        assert wire.encode(built) == wire.encode(validated)
        assert built.uid == 77  # which partition of the name: its uid, not its key's create revision
    assert server._replica_info(stored["orders-3"], incarnation).isr == [2, 1]
    assert server._replica_info(stored["orders-4"], incarnation).isr == [1, 2]
    assert server._replica_info(stored["orders-5"], incarnation).leader is None
    restarted = reports.Incarnation(2, 5, {}, {"orders-3": 7})
    assert server._replica_info(stored["orders-3"], restarted).leader is None  # withheld from a restarted process
