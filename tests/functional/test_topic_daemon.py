"""Topic lifecycle hardening on the whole daemon: existing partitions never move behind the user's
back, and a topic too large to store blocks no other topic.

Runs on the memory store and on a real etcd; results are read back from the KV store.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from connection_manager import health as health_module
from controller import config, placement
from controller.pipeline import dispatcher
from controller.reconcile import topic as topic_controller, topic_size
from store import kv, models
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
        partition = models.decode("partitions", item.value)
        if partition.topic == topic:
            found[partition.index] = (partition.spec.replicas, item.create_revision)
    return found


async def resolution_of(sc: Running, name: str) -> models.TopicResolution:
    topic = await sc.read("topics", name)
    assert topic is not None
    return topic.status.resolution


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
    assert topic is not None and topic.status.resolution is models.TopicResolution.INVALID_CONFIG
    assert topic.status.replica_map == replica_map

    pipeline = sc.daemon.pipeline
    assert pipeline is not None
    pipeline.health.set(3, health_module.Health.OFFLINE, asyncio.get_running_loop().time())

    async def grown() -> None:
        topic = await sc.read("topics", "orders")
        assert topic is not None and topic.status.resolution is models.TopicResolution.PROVISIONED
        assert len(await stored_partitions(sc, "orders")) == 5

    await sc.eventually(grown)
    after = await stored_partitions(sc, "orders")
    assert {index: after[index] for index in range(4)} == before  # same replicas, same create revisions
    topic = await sc.read("topics", "orders")
    assert topic is not None and topic.status.replica_map == {index: replicas for index, (replicas, _) in after.items()}


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


def huge_reason(sc: Running, bound: str, size: int, digits: int = 1) -> str:
    """The reason given for topic 'huge' (100,000 partitions, RF 3), with this daemon's key prefix."""
    assert sc.daemon.context is not None
    # What the SC writes through (its fence takes a little of every request), not the test's own store.
    largest = topic_size.max_topic_bytes(kv.request_size(sc.daemon.context.kv_store), "huge", topic_controller.CHAIN_KEY)
    huge = models.Topic.model_validate({"name": "huge", "spec": {"partitions": 100_000, "replicationFactor": 3}})
    fitting = topic_size.largest_count(huge, 3, digits, largest)
    return (
        f"topic 'huge' with 100000 partitions at replication factor 3 would take {bound}{size} bytes in the store, "
        f"above the {largest} bytes one topic may take (etcd's request limit, etcd_max_request_bytes, is 1572864 bytes): "
        f"at replication factor 3 at most {fitting} partitions fit with {digits}-digit SPU ids; use fewer partitions "
        "or a lower replication factor"
    )


async def test_a_topic_too_large_to_store_blocks_no_other_topic(quiet_sc: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's scenario: 100,000 partitions at replication factor 3 written straight to the
    store (the API refuses it), next to a small topic created through the API. The small one is
    Provisioned; the big one is InvalidConfig with the limits in its reason, after one status
    write and no placement at all, however often the controller runs afterwards."""
    sc = quiet_sc
    placed: list[int] = []
    compute = placement.compute

    def counted(request: placement.PlacementRequest, placers: placement.Placers) -> placement.PlacementResult:
        placed.append(request.partitions)
        return compute(request, placers)

    monkeypatch.setattr(placement, "compute", counted)
    pipeline = sc.daemon.pipeline
    assert pipeline is not None
    results: list[dispatcher.Result] = []
    pipeline.dispatcher.on_result(results.append)
    for spu_id in range(3):
        await sc.register_spu(spu_id)
    huge = models.Topic.model_validate({"name": "huge", "spec": {"partitions": 100_000, "replicationFactor": 3}})
    await sc.kv_store.create(huge.key, models.encode(huge))
    status, body = await sc.call("POST", "/v1/topics?timeout=20000", {"name": "small", "spec": {"partitions": 2, "replicationFactor": 2}})
    assert (status, body["status"]["resolution"]) == (201, "Provisioned"), body

    async def huge_invalid() -> None:
        stored = await sc.read("topics", "huge")
        assert stored is not None and stored.status.resolution is models.TopicResolution.INVALID_CONFIG
        assert stored.status.reason == huge_reason(sc, "at least ", 1_589_050)

    await sc.eventually(huge_invalid)
    # The controller runs again and again (SPUs come and go, a topic is created): the big topic
    # is never decided again.
    passes = pipeline.topics.loop.passes
    for spu_id in range(3, 6):
        await sc.register_spu(spu_id)
    status, body = await sc.call("POST", "/v1/topics", {"name": "later", "spec": {"partitions": 3, "replicationFactor": 3}})
    assert status == 201, body
    pipeline.health.set(5, health_module.Health.OFFLINE, asyncio.get_running_loop().time())

    async def settled() -> None:
        spu = await sc.read("spus", "spu-5")
        assert spu is not None and spu.status.resolution is models.SpuResolution.OFFLINE
        assert pipeline.dispatcher.depth == 0

    await sc.eventually(settled)
    assert pipeline.topics.loop.passes > passes + 3
    assert 100_000 not in placed
    huge_results = [(result.action.verb.value, result.outcome.value) for result in results if "huge" in result.action.name.split(",")]
    assert huge_results == [("update-status", "applied")]
    assert [result for result in results if result.outcome is not dispatcher.Outcome.APPLIED] == []
    await sc.eventually(huge_invalid)  # unchanged


async def test_the_api_refuses_a_topic_too_large_to_store(sc: Running) -> None:
    """At create and at add-partitions: 422 naming the limit and the partitions that fit (with the
    widest registered SPU id); nothing is written. The SPUs stay offline: nothing gets placed."""
    for spu_id in range(3):
        await sc.register_spu(spu_id, online=False)
    status, body = await sc.call("POST", "/v1/topics", {"name": "huge", "spec": {"partitions": 100_000, "replicationFactor": 3}})
    assert (status, body) == (422, {"error": {"code": "TopicTooLarge", "message": huge_reason(sc, "up to ", 1_589_050)}})
    assert await sc.read("topics", "huge") is None

    status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "huge", "spec": {"partitions": 4, "replicationFactor": 3}})
    assert status == 202, body
    status, body = await sc.call("POST", "/v1/topics/huge/partitions", {"count": 99_996})
    assert (status, body) == (422, {"error": {"code": "TopicTooLarge", "message": huge_reason(sc, "up to ", 1_589_050)}})
    stored = await sc.read("topics", "huge")
    assert isinstance(stored, models.Topic) and stored.spec.partitions == 4
    assert sc.daemon.context is not None
    # What the SC writes through (its fence takes a little of every request), not the test's own store.
    largest = topic_size.max_topic_bytes(kv.request_size(sc.daemon.context.kv_store), "huge", topic_controller.CHAIN_KEY)
    fitting = topic_size.largest_count(stored, 3, 1, largest)
    status, body = await sc.call("POST", "/v1/topics/huge/partitions?timeout=0", {"count": fitting - 4})
    assert (status, body["spec"]["partitions"]) == (202, fitting), body
