"""The whole reconcile pipeline on a real store: Reader, controllers, dispatcher, KV updater.

Runs on the memory backend and on a real etcd; every result is read back from the KV store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from connection_manager import health as health_module
from controller import config, context as context_module, metrics
from controller.pipeline import pipeline
from controller.reconcile import topic as topic_controller
from store import kv, local, models
from tests import builders


class Cluster:
    def __init__(self, kv_store: kv.KVStore, resync_interval: float = 5.0) -> None:
        self.kv_store = kv_store
        loop = asyncio.get_running_loop()
        self.health = health_module.HealthView(started_at=loop.time())
        self.context = context_module.Context(
            settings=config.Settings(resync_interval=resync_interval, spu_offline_grace=60.0),
            kv_store=kv_store,
            local_store=local.LocalStore(),
            metrics=metrics.Metrics(),
        )
        self.pipeline = pipeline.Pipeline(self.context, self.health)

    async def add_spu(self, spu_id: int, rack: str | None = None, online: bool = True) -> None:
        spu = builders.spu(spu_id, resolution="Init", rack=rack)
        await self.kv_store.create(spu.key, models.encode(spu))
        if online:
            self.set_online(spu_id)

    def set_online(self, spu_id: int, online: bool = True) -> None:
        state = health_module.Health.ONLINE if online else health_module.Health.OFFLINE
        self.health.set(spu_id, state, asyncio.get_running_loop().time())

    async def create(self, obj: models.AnyObject) -> None:
        await self.kv_store.create(obj.key, models.encode(obj))

    async def read(self, kind: str, name: str) -> models.AnyObject | None:
        stored = await self.kv_store.get(models.object_key(kind, name))
        return None if stored is None else models.decode(kind, stored.value)

    async def stored(self, kind: str, name: str) -> models.AnyObject:
        """The object as stored, failing the test if it is absent."""
        obj = await self.read(kind, name)
        assert obj is not None, f"{kind}/{name} is not in the store"
        return obj

    async def read_all(self, kind: str) -> dict[str, models.AnyObject]:
        listed = await self.kv_store.list(f"{kind}/")
        return {(obj := models.decode(kind, item.value)).name: obj for item in listed.items}

    async def eventually(self, check: Callable[[], object], timeout: float = 10.0) -> None:
        """Poll the KV store (not the local store) until ``check`` passes."""
        await builders.eventually(check, timeout)


async def assert_mirror_is_the_store(cluster: Cluster) -> None:
    """Once quiet, the local store holds exactly what decoding the KV store gives (the objects the
    SC took back from its own writes included), and no echo of a write is left waiting."""

    async def check() -> None:
        assert cluster.pipeline.dispatcher.depth == 0
        assert cluster.context.local_store.revision >= await cluster.kv_store.revision()
        for kind in models.KINDS:
            mirrored = {entry.name: entry.obj for entry in cluster.context.local_store[kind]}
            assert mirrored == await cluster.read_all(kind), kind
            for name, obj in mirrored.items():
                assert models.encode(obj) == (await builders.present(cluster.kv_store, models.object_key(kind, name))).value
        assert len(cluster.pipeline.reader.echoes) == 0

    await cluster.eventually(check)


@pytest.fixture
async def cluster(kv_store: kv.KVStore) -> AsyncIterator[Cluster]:
    running = Cluster(kv_store)
    await running.pipeline.start(sync_timeout=10)
    yield running
    try:
        await assert_mirror_is_the_store(running)
    finally:
        await running.pipeline.stop()


def computed_topic(name: str, partitions: int, replication_factor: int, **spec: object) -> models.Topic:
    return models.Topic.model_validate(
        {"name": name, "spec": {"partitions": partitions, "replicationFactor": replication_factor, **spec}}
    )


async def provisioned(cluster: Cluster, name: str) -> models.Topic:
    async def check() -> None:
        topic = await cluster.read("topics", name)
        assert topic is not None and topic.status.resolution is models.TopicResolution.PROVISIONED, topic
        partitions = await cluster.read_all("partitions")
        mine = {p.index: p.spec.replicas for p in partitions.values() if isinstance(p, models.Partition) and p.topic == name}
        assert mine == topic.status.replica_map

    await cluster.eventually(check)
    topic = await cluster.read("topics", name)
    assert isinstance(topic, models.Topic)
    return topic


async def test_topic_is_provisioned_with_the_seed_assignment_and_its_partitions(cluster: Cluster) -> None:
    for spu_id in range(5):
        await cluster.add_spu(spu_id)
    await cluster.eventually(lambda: _all_online(cluster, 5))
    await cluster.create(computed_topic("orders", 16, 3))
    topic = await provisioned(cluster, "orders")
    # The seed's 5-SPU, 16-partition table.
    assert topic.status.replica_map[5] == [0, 2, 3]
    assert topic.status.replica_map[9] == [4, 1, 2]
    assert topic.status.replica_map[15] == [0, 1, 2]
    partition = await cluster.read("partitions", "orders-9")
    assert isinstance(partition, models.Partition)
    assert (partition.spec.leader, partition.spec.replicas) == (4, [4, 1, 2])
    assert partition.status.resolution is models.PartitionResolution.OFFLINE
    chain = await cluster.kv_store.get(topic_controller.CHAIN_KEY)
    assert chain is not None and json.loads(chain.value) == {"nextStartIndex": 16}


async def _all_online(cluster: Cluster, count: int) -> None:
    spus = await cluster.read_all("spus")
    assert len(spus) == count
    assert all(spu.status.resolution is models.SpuResolution.ONLINE for spu in spus.values()), spus


async def test_start_index_chains_across_topics(cluster: Cluster) -> None:
    for spu_id in range(5):
        await cluster.add_spu(spu_id)
    await cluster.eventually(lambda: _all_online(cluster, 5))
    await cluster.create(computed_topic("first", 9, 3))
    await provisioned(cluster, "first")
    await cluster.create(computed_topic("second", 2, 3))
    second = await provisioned(cluster, "second")
    # The seed's chaining example: a run that starts at index 9 gives partition 0 = [4, 1, 2].
    assert second.status.replica_map[0] == [4, 1, 2]


async def test_insufficient_spus_then_an_spu_comes_online(cluster: Cluster) -> None:
    await cluster.add_spu(0)
    await cluster.add_spu(1)
    await cluster.create(computed_topic("events", 2, 3))

    async def insufficient() -> None:
        topic = await cluster.read("topics", "events")
        assert topic is not None and topic.status.resolution is models.TopicResolution.INSUFFICIENT_RESOURCES
        assert "1 more" in topic.status.reason, topic.status.reason

    await cluster.eventually(insufficient)
    assert await cluster.read_all("partitions") == {}
    await cluster.add_spu(2, online=False)
    await asyncio.sleep(0.2)
    assert (await cluster.stored("topics", "events")).status.resolution is models.TopicResolution.INSUFFICIENT_RESOURCES
    cluster.set_online(2)
    topic = await provisioned(cluster, "events")
    assert topic.status.replica_map == {0: [0, 1, 2], 1: [1, 2, 0]}


async def test_invalid_manual_assignment_and_valid_manual_topic(cluster: Cluster) -> None:
    for spu_id in range(3):
        await cluster.add_spu(spu_id)
    await cluster.create(
        models.Topic.model_validate(
            {"name": "bad", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}, {"id": 2, "replicas": [1, 2]}]}}
        )
    )
    await cluster.create(
        models.Topic.model_validate(
            {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": [2, 0]}, {"id": 1, "replicas": [1, 2]}]}}
        )
    )

    async def invalid() -> None:
        topic = await cluster.read("topics", "bad")
        assert topic is not None and topic.status.resolution is models.TopicResolution.INVALID_CONFIG
        assert "2" in topic.status.reason

    await cluster.eventually(invalid)
    manual = await provisioned(cluster, "manual")
    assert manual.status.replica_map == {0: [2, 0], 1: [1, 2]}


async def test_add_partitions_keeps_existing_ones(cluster: Cluster) -> None:
    for spu_id in range(4):
        await cluster.add_spu(spu_id)
    await cluster.eventually(lambda: _all_online(cluster, 4))
    await cluster.create(computed_topic("grow", 3, 2))
    before = await provisioned(cluster, "grow")
    stored = await cluster.kv_store.get("topics/grow")
    assert stored is not None
    grown = before.model_copy(update={"spec": before.spec.model_copy(update={"partitions": 6})})
    await cluster.kv_store.update("topics/grow", models.encode(grown), stored.mod_revision)

    async def six() -> None:
        topic = await cluster.read("topics", "grow")
        assert topic is not None and len(topic.status.replica_map) == 6

    await cluster.eventually(six)
    after = await provisioned(cluster, "grow")
    assert {index: after.status.replica_map[index] for index in range(3)} == before.status.replica_map


async def test_deleting_a_topic_deletes_its_partitions(cluster: Cluster) -> None:
    for spu_id in range(3):
        await cluster.add_spu(spu_id)
    await cluster.eventually(lambda: _all_online(cluster, 3))
    await cluster.create(computed_topic("doomed", 4, 2))
    await cluster.create(computed_topic("kept", 2, 2))
    await provisioned(cluster, "doomed")
    await provisioned(cluster, "kept")
    await cluster.kv_store.delete("topics/doomed")

    async def gone() -> None:
        names = sorted(await cluster.read_all("partitions"))
        assert names == ["kept-0", "kept-1"]

    await cluster.eventually(gone)


class GatedStore(kv.ForwardingStore):
    """A real store whose transactions writing the gated key, once armed, wait until the test
    opens the gate: a write held in flight, to decide around it."""

    def __init__(self, inner: kv.KVStore, gated: str) -> None:
        super().__init__(inner)
        self.gated = gated
        self.armed = False
        self.held = asyncio.Event()
        self.opened = asyncio.Event()

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        if self.armed and any(operation.key == self.gated for operation in operations) and not self.opened.is_set():
            self.held.set()
            await self.opened.wait()
        return await self.inner.txn(compares, operations)

    async def close(self) -> None:
        pass  # the fixture closes the inner store


async def test_an_orphan_busy_when_its_topic_is_deleted_is_deleted_once_free(kv_store: kv.KVStore) -> None:
    """The topic is deleted while the partition controller's write to one of its partitions is
    in flight: the topic controller sets the partition aside, and deletes it as soon as that
    write is done, not at the next periodic resync (an hour here)."""
    gated = GatedStore(kv_store, models.object_key("partitions", "doomed-0"))
    cluster = Cluster(gated, resync_interval=3600.0)
    await cluster.pipeline.start(sync_timeout=10)
    try:
        for spu_id in range(3):
            await cluster.add_spu(spu_id)
        await cluster.eventually(lambda: _all_online(cluster, 3))
        await cluster.create(computed_topic("doomed", 1, 2))
        await cluster.create(computed_topic("kept", 1, 2))
        await provisioned(cluster, "doomed")
        await provisioned(cluster, "kept")
        doomed = await cluster.read("partitions", "doomed-0")
        assert doomed is not None
        gated.armed = True
        for spu_id in doomed.spec.replicas:  # every replica down: the partition controller writes
            cluster.set_online(spu_id, online=False)  # doomed-0's status alone (LeaderOffline)
        await asyncio.wait_for(gated.held.wait(), 10)
        await kv_store.delete("topics/doomed")
        topics = cluster.context.local_store["topics"]
        while "doomed" in topics.view:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the topic controller's pass on the deletion: doomed-0 is busy
        gated.opened.set()

        async def orphan_deleted() -> None:
            assert sorted(await cluster.read_all("partitions")) == ["kept-0"]

        await cluster.eventually(orphan_deleted)
    finally:
        gated.opened.set()
        await cluster.pipeline.stop()


async def test_an_invalid_spu_group_reserves_its_range_once_the_colliding_spu_is_gone(cluster: Cluster) -> None:
    """What the API's 422 tells the operator to do: no need to delete and create the group again."""
    await cluster.add_spu(31, online=False)  # collides with the group's range 30..31
    await cluster.create(models.SpuGroup.model_validate({"name": "late", "spec": {"replicas": 2, "minId": 30}}))

    async def resolution_is(expected: models.SpuGroupResolution) -> None:
        stored = await cluster.read("spu-groups", "late")
        assert stored is not None and stored.status.resolution is expected, stored

    await cluster.eventually(lambda: resolution_is(models.SpuGroupResolution.INVALID))
    await cluster.kv_store.delete("spus/spu-31")
    await cluster.eventually(lambda: resolution_is(models.SpuGroupResolution.RESERVED))

    async def created() -> None:
        assert sorted(await cluster.read_all("spus")) == ["late-0", "late-1"]

    await cluster.eventually(created)


async def test_spu_group_reserves_creates_scales_and_deletes(cluster: Cluster) -> None:
    await cluster.add_spu(12, online=False)  # collides with the group's range 11..13
    group = models.SpuGroup.model_validate({"name": "main", "spec": {"replicas": 3, "minId": 11, "rack": "zone-a"}})
    await cluster.create(group)

    async def invalid() -> None:
        stored = await cluster.read("spu-groups", "main")
        assert stored is not None and stored.status.resolution is models.SpuGroupResolution.INVALID
        assert stored.status.reason == "id range 11..13 collides: SPU id 12 is already used by SPU spu-12"

    await cluster.eventually(invalid)
    assert sorted(await cluster.read_all("spus")) == ["spu-12"]

    stored = await builders.present(cluster.kv_store, "spu-groups/main")
    moved = group.model_copy(update={"spec": group.spec.model_copy(update={"min_id": 20})})
    await cluster.kv_store.update("spu-groups/main", models.encode(moved), stored.mod_revision)

    async def reserved() -> None:
        spus = await cluster.read_all("spus")
        assert sorted(spus) == ["main-0", "main-1", "main-2", "spu-12"]
        assert [spus[f"main-{i}"].spec.id for i in range(3)] == [20, 21, 22]
        assert all(spus[f"main-{i}"].spec.rack == "zone-a" for i in range(3))
        assert all(spus[f"main-{i}"].spec.spu_type is models.SpuType.MANAGED for i in range(3))
        assert (await cluster.stored("spu-groups", "main")).status.resolution is models.SpuGroupResolution.RESERVED

    await cluster.eventually(reserved)

    async def scale(replicas: int, expected: list[str]) -> None:
        current = await builders.present(cluster.kv_store, "spu-groups/main")
        obj = models.decode("spu-groups", current.value)
        await cluster.kv_store.update(
            "spu-groups/main",
            models.encode(obj.model_copy(update={"spec": obj.spec.model_copy(update={"replicas": replicas})})),
            current.mod_revision,
        )

        async def check() -> None:
            assert sorted(await cluster.read_all("spus")) == expected

        await cluster.eventually(check)

    await scale(5, ["main-0", "main-1", "main-2", "main-3", "main-4", "spu-12"])
    await scale(2, ["main-0", "main-1", "spu-12"])
    await cluster.kv_store.delete("spu-groups/main")

    async def deleted() -> None:
        assert sorted(await cluster.read_all("spus")) == ["spu-12"]

    await cluster.eventually(deleted)


async def test_spu_resolution_follows_health(cluster: Cluster) -> None:
    await cluster.add_spu(7, online=False)
    await asyncio.sleep(0.1)
    assert (await cluster.stored("spus", "spu-7")).status.resolution is models.SpuResolution.INIT
    cluster.set_online(7)

    async def online() -> None:
        assert (await cluster.stored("spus", "spu-7")).status.resolution is models.SpuResolution.ONLINE

    await cluster.eventually(online)
    cluster.set_online(7, online=False)

    async def offline() -> None:
        assert (await cluster.stored("spus", "spu-7")).status.resolution is models.SpuResolution.OFFLINE

    await cluster.eventually(offline)


async def test_crash_between_status_and_partitions_converges(kv_store: kv.KVStore) -> None:
    """A topic left Provisioned with missing partitions, plus an orphan: a restart fixes both."""
    for spu_id in range(3):
        spu = builders.spu(spu_id)
        await kv_store.create(spu.key, models.encode(spu))
    half_done = models.Topic.model_validate(
        {
            "name": "half",
            "spec": {"partitions": 3, "replicationFactor": 2},
            "status": {"resolution": "Provisioned", "replicaMap": {"0": [0, 1], "1": [1, 2], "2": [2, 0]}},
        }
    )
    await kv_store.create(half_done.key, models.encode(half_done))
    first = models.Partition(name="half-0", spec=models.PartitionSpec(leader=0, replicas=[0, 1]))
    orphan = models.Partition(name="gone-0", spec=models.PartitionSpec(leader=0, replicas=[0, 1]))
    first_revision = await kv_store.create(first.key, models.encode(first))
    await kv_store.create(orphan.key, models.encode(orphan))

    restarted = Cluster(kv_store)
    await restarted.pipeline.start(sync_timeout=10)
    try:
        await provisioned(restarted, "half")

        async def no_orphan() -> None:
            assert sorted(await restarted.read_all("partitions")) == ["half-0", "half-1", "half-2"]

        await restarted.eventually(no_orphan)
        # The partition that existed was kept as it was, not deleted and created again.
        kept = await kv_store.get("partitions/half-0")
        assert kept is not None and (kept.create_revision, kept.mod_revision) == (first_revision, first_revision)
    finally:
        await restarted.pipeline.stop()


async def test_idle_restart_writes_nothing(kv_store: kv.KVStore) -> None:
    first = Cluster(kv_store)
    await first.pipeline.start(sync_timeout=10)
    for spu_id in range(3):
        await first.add_spu(spu_id)
    await first.eventually(lambda: _all_online(first, 3))
    await first.create(computed_topic("steady", 4, 2))
    await provisioned(first, "steady")
    await first.pipeline.stop()

    before = await kv_store.revision()
    second = Cluster(kv_store)
    for spu_id in range(3):
        second.set_online(spu_id)  # they reconnect at once
    await second.pipeline.start(sync_timeout=10)
    await asyncio.sleep(0.5)
    await second.pipeline.stop()
    assert await kv_store.revision() == before


@pytest.mark.looptime
@pytest.mark.parametrize(
    "value",
    [
        b"written by hand",
        # A partition whose identity is none the SC gives: 0, a string, past 63 bits.
        b'{"name":"t-0","uid":0,"spec":{"leader":0,"replicas":[0,1]}}',
        b'{"name":"t-0","uid":"7","spec":{"leader":0,"replicas":[0,1]}}',
        b'{"name":"t-0","uid":9223372036854775808,"spec":{"leader":0,"replicas":[0,1]}}',
    ],
)
async def test_a_value_the_sc_cannot_read_is_not_written_against(memory_store: kv.KVStore, value: bytes) -> None:
    """A partition key holds a value written by hand that the SC cannot decode: the mirror lists it
    as unreadable, so the topic controller neither creates the partition over it (a create that
    would lose its compare again and again) nor deletes it. (A write that loses its compare twice
    to the same value backs off: tests/unit/test_loop.py.)"""
    for spu_id in range(3):
        spu = builders.spu(spu_id)
        await memory_store.create(spu.key, models.encode(spu))
    stored = models.Topic.model_validate(
        {"name": "t", "spec": {"partitions": 1, "replicationFactor": 2}, "status": {"resolution": "Provisioned", "replicaMap": {"0": [0, 1]}}}
    )
    await memory_store.create(stored.key, models.encode(stored))
    await memory_store.create("partitions/t-0", value)
    cluster = Cluster(memory_store, resync_interval=3600.0)
    written: list[str] = []
    cluster.pipeline.dispatcher.on_result(lambda result: written.extend(result.action.write_keys))
    await cluster.pipeline.start(sync_timeout=10)
    try:
        await asyncio.sleep(2.0)
        assert "partitions/t-0" not in written
        assert cluster.context.local_store["partitions"].unreadable == {"t-0"}
        assert (await memory_store.get("partitions/t-0")).value == value  # type: ignore[union-attr]  # the test wrote it
    finally:
        await cluster.pipeline.stop()
