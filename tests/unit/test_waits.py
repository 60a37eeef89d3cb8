"""admin_ops.Waits: the one wait-for-verdict helper of the HTTP API and the Fluvio admin."""

from __future__ import annotations

import asyncio

import pytest

from controller.api import admin_ops
from controller.reconcile import topic as topic_controller
from store import local, models
from tests import builders
from tests.builders import partition, topic


async def test_a_change_of_a_related_table_wakes_the_waiter_of_the_object_it_names() -> None:
    store = local.LocalStore()
    store["topics"].apply(topic("orders"), 1)
    waits = admin_ops.Waits(store["topics"], (store["partitions"], lambda name: name.rpartition("-")[0]))
    runner = asyncio.ensure_future(waits.run())
    try:
        verdict = asyncio.ensure_future(waits.wait("orders", lambda: store["partitions"].get("orders-0"), 30.0))
        await asyncio.sleep(0)
        assert not verdict.done()
        store["partitions"].apply(partition("other-0"), 2)  # another topic's partition: no verdict yet
        await asyncio.sleep(0.01)
        assert not verdict.done()
        store["partitions"].apply(partition("orders-0"), 3)
        entry = await asyncio.wait_for(verdict, 5.0)
        assert entry is not None and entry.name == "orders-0"
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_wait_settled_says_deleted_once_the_store_has_seen_the_write_and_lost_the_object() -> None:
    store = local.LocalStore()
    written = topic("orders")
    store["topics"].apply(written, 5)
    waits = admin_ops.Waits(store["topics"])
    runner = asyncio.ensure_future(waits.run())
    try:
        settled = asyncio.ensure_future(admin_ops.wait_settled(waits, written, 5, admin_ops.topic_settled(5), 30_000))
        await asyncio.sleep(0)
        store["topics"].delete("orders", 6)
        assert await asyncio.wait_for(settled, 5.0) == (None, False)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_wait_settled_answers_the_object_as_it_is_when_the_time_runs_out() -> None:
    store = local.LocalStore()
    written = topic("orders")
    store["topics"].apply(written.model_copy(update={"status": models.TopicStatus(resolution=models.TopicResolution.PENDING)}), 6)
    waits = admin_ops.Waits(store["topics"])
    current, settled = await admin_ops.wait_settled(waits, written, 5, admin_ops.topic_settled(5), 10)
    assert isinstance(current, models.Topic)
    assert (current.status.resolution, settled) == (models.TopicResolution.PENDING, False)
    # Not mirrored yet when the time ran out: the object as written.
    assert await admin_ops.wait_settled(waits, topic("late"), 9, admin_ops.topic_settled(9), 10) == (topic("late"), False)


async def test_a_waiting_drain_looks_again_only_when_partitions_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain waiting for its SPU's leaderships to move looked at every partition every 50 ms
    (100,000 of them, for as long as the drain's timeout) though nothing had changed. It looks
    again after a change of the partitions only, and ends when they moved, at its deadline, or
    once nothing moved for ``stall`` seconds."""
    store = local.LocalStore()
    for revision, name in enumerate(("a-0", "a-1"), start=1):
        store["partitions"].apply(partition(name, [0, 1], resolution="Online"), revision)
    looks: list[list[str]] = []
    led_by = admin_ops.partition.led_by

    def counted(snapshot: local.Snapshot, spu: int) -> list[str]:
        looks.append(led_by(snapshot, spu))
        return looks[-1]

    monkeypatch.setattr(admin_ops.partition, "led_by", counted)
    waiting = asyncio.ensure_future(admin_ops.wait_led_away(store, 0, frozenset(), timeout=30.0, stall=30.0))
    await asyncio.sleep(0.5)  # nothing changes: ten looks at the old pace
    store["spus"].apply(builders.spu(1), 3)  # another table changes
    await asyncio.sleep(0.2)
    assert looks == [["a-0", "a-1"]] and not waiting.done()
    store["partitions"].apply(partition("a-0", [0, 1], leader=1, resolution="Online"), 4)
    await asyncio.sleep(0.3)
    assert looks == [["a-0", "a-1"], ["a-1"]] and not waiting.done()
    store["partitions"].apply(partition("a-1", [0, 1], leader=1, resolution="Online"), 5)
    assert await asyncio.wait_for(waiting, 5.0) == []
    assert looks[-1] == []


async def test_a_waiting_drain_ends_at_its_deadline_or_when_nothing_moved_for_a_while() -> None:
    store = local.LocalStore()
    store["partitions"].apply(partition("a-0", [0, 1], resolution="Online"), 1)
    assert await admin_ops.wait_led_away(store, 0, frozenset(), timeout=0.0, stall=30.0) == ["a-0"]
    assert await asyncio.wait_for(admin_ops.wait_led_away(store, 0, frozenset(), timeout=30.0, stall=0.2), 5.0) == ["a-0"]
    # What could not move from the start does not keep it waiting.
    assert await asyncio.wait_for(admin_ops.wait_led_away(store, 0, frozenset({"a-0"}), timeout=30.0, stall=30.0), 5.0) == ["a-0"]
    assert store["partitions"]._listeners == set()


def test_a_provisioned_topic_whose_map_has_a_gap_is_not_settled_until_the_gap_is_filled() -> None:
    """A create's (or add-partitions') wait ended on any Provisioned map as long as the count asked
    for: a map of that length with a gap (written behind the SC's back, or a write racing one) was
    taken for every partition placed, though the topic controller still had a row to fill."""
    settled = admin_ops.topic_settled(5)
    provisioned = models.TopicResolution.PROVISIONED

    def entry(replica_map: dict[int, list[int]]) -> local.Entry[models.AnyObject]:
        status = models.TopicStatus(resolution=provisioned, replica_map=replica_map)
        return local.Entry(topic("orders", partitions=2).model_copy(update={"status": status}), 6, 1, 1)

    assert not settled(entry({0: [0], 5: [1]}))  # two rows, but row 1 is missing
    assert not settled(entry({0: [0]}))
    assert settled(entry({0: [0], 1: [1]}))
    assert settled(entry({0: [0], 1: [1], 5: [2]}))  # a row past the count is never made: not waited for


def test_a_pending_topic_the_store_refuses_is_settled_with_its_reason() -> None:
    """A topic whose provisioning etcd refuses (a limit lowered) says so in its reason: a verdict
    until an operator acts, as InsufficientResources is. The create waited its whole timeout
    (30 s by default) before answering 202, so the reason reached the client half a minute late."""
    settled = admin_ops.topic_settled(5)

    def entry(reason: str) -> local.Entry[models.AnyObject]:
        status = models.TopicStatus(resolution=models.TopicResolution.PENDING, reason=reason)
        return local.Entry(topic("orders").model_copy(update={"status": status}), 6, 1, 1)

    assert settled(entry(topic_controller.REFUSED_PROVISION + "etcd takes at most 128 operations in a transaction"))
    assert not settled(entry(""))  # placed at the next pass: not a verdict
