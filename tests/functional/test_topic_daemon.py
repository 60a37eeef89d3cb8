"""Topic lifecycle hardening on the whole daemon: existing partitions never move behind the user's
back, and a topic too large to store blocks no other topic.

Runs on the memory store and on a real etcd; results are read back from the KV store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from connection_manager import health as health_module
from controller import config
from store import models
from tests.fixtures.daemon import Running, running


@pytest.fixture
async def quiet_sc(settings: config.Settings) -> AsyncIterator[Running]:
    """A daemon whose periodic resync never comes during a test: only the incremental passes act."""
    async with running(settings.model_copy(update={"resync_interval": 3600.0})) as handle:
        yield handle


async def stored_partitions(sc: Running, topic: str) -> dict[int, tuple[list[int], int]]:
    """Per partition of ``topic``: (its replicas, its create revision)."""
    listed = await sc.kv_store.list("partitions/")
    found = {}
    for item in listed.items:
        partition: models.Partition = models.decode("partitions", item.value)  # type: ignore[assignment]
        if partition.topic == topic:
            found[partition.index] = (partition.spec.replicas, item.create_revision)
    return found


async def resolution_of(sc: Running, name: str) -> models.TopicResolution:
    topic = await sc.read("topics", name)
    assert topic is not None
    return topic.status.resolution  # type: ignore[attr-defined, no-any-return]


async def test_a_topic_that_cannot_grow_keeps_its_partitions_and_grows_once_it_can(quiet_sc: Running) -> None:
    """The issue's scenario: a rack-less SPU online makes adding a partition InvalidConfig; once it
    is offline the topic grows. The four partitions that existed are never deleted nor moved."""
    sc = quiet_sc
    for spu_id in range(3):
        await sc.register_spu(spu_id, rack=f"r{spu_id + 1}")
    status, body = await sc.call("POST", "/v1/topics", {"name": "orders", "spec": {"partitions": 4, "replicationFactor": 2}})
    assert status == 201, body

    async def four_partitions() -> None:
        assert len(await stored_partitions(sc, "orders")) == 4

    await sc.eventually(four_partitions)
    before = await stored_partitions(sc, "orders")
    replica_map = {index: replicas for index, (replicas, _) in before.items()}

    await sc.register_spu(3)  # no rack, online
    status, body = await sc.call("POST", "/v1/topics/orders/partitions", {"count": 1})
    assert status == 422, body
    topic = await sc.read("topics", "orders")
    assert topic is not None and topic.status.resolution is models.TopicResolution.INVALID_CONFIG  # type: ignore[attr-defined]
    assert topic.status.replica_map == replica_map  # type: ignore[attr-defined]

    pipeline = sc.daemon.pipeline
    assert pipeline is not None
    pipeline.health.set(3, health_module.Health.OFFLINE, asyncio.get_running_loop().time())

    async def grown() -> None:
        topic = await sc.read("topics", "orders")
        assert topic is not None and topic.status.resolution is models.TopicResolution.PROVISIONED  # type: ignore[attr-defined]
        assert len(await stored_partitions(sc, "orders")) == 5

    await sc.eventually(grown)
    after = await stored_partitions(sc, "orders")
    assert {index: after[index] for index in range(4)} == before  # same replicas, same create revisions
    topic = await sc.read("topics", "orders")
    assert topic is not None and topic.status.replica_map == {index: replicas for index, (replicas, _) in after.items()}  # type: ignore[attr-defined]


async def test_a_partition_deleted_behind_the_sc_comes_back_without_a_resync(quiet_sc: Running) -> None:
    sc = quiet_sc
    for spu_id in range(3):
        await sc.register_spu(spu_id)
    status, body = await sc.call("POST", "/v1/topics", {"name": "events", "spec": {"partitions": 3, "replicationFactor": 2}})
    assert status == 201, body

    async def three_partitions() -> None:
        assert len(await stored_partitions(sc, "events")) == 3

    await sc.eventually(three_partitions)
    before = await stored_partitions(sc, "events")
    await sc.kv_store.delete("partitions/events-1")

    async def back() -> None:
        now = await stored_partitions(sc, "events")
        assert sorted(now) == [0, 1, 2]
        assert now[1][0] == before[1][0]  # where it was

    await sc.eventually(back)  # 10 s: the resync is an hour away
