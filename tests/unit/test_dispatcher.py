"""Action dispatcher on the memory store: batching, replacement, conflicts, no stalls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import structlog.testing

from controller import actions, dispatcher as dispatcher_module, metrics
from store import kv, local, memory, models

Outcome = dispatcher_module.Outcome


def partition(name: str, leader: int = 0) -> models.Partition:
    return models.Partition(name=name, spec=models.PartitionSpec(leader=leader, replicas=[0, 1]))


@pytest.fixture
async def running() -> AsyncIterator[tuple[memory.MemoryStore, dispatcher_module.ActionDispatcher, list[dispatcher_module.Result]]]:
    store = memory.MemoryStore()
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics)
    results: list[dispatcher_module.Result] = []
    dispatcher.on_result(results.append)
    task = asyncio.create_task(dispatcher.run())
    yield store, dispatcher, results
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await store.close()


async def test_more_actions_than_batches_in_flight_are_all_applied(running) -> None:  # type: ignore[no-untyped-def]
    store, dispatcher, results = running
    for index in range(3000):
        dispatcher.submit(actions.create(partition(f"t-{index}"), "test"))
    await asyncio.wait_for(dispatcher.drained(), 10)
    assert len((await store.list("partitions/")).items) == 3000
    assert [result.outcome for result in results] == [Outcome.APPLIED] * 3000
    # Batched: far fewer revisions than actions, each transaction within etcd's 128 operations.
    assert await store.revision() <= 1 + 3000 // 128 + 8


async def test_a_newer_action_replaces_the_queued_one(running) -> None:  # type: ignore[no-untyped-def]
    store, dispatcher, results = running
    dispatcher.submit(actions.create(partition("t-0", leader=0), "first decision"))
    dispatcher.submit(actions.create(partition("t-0", leader=1), "newer decision"))
    await asyncio.wait_for(dispatcher.drained(), 5)
    stored = await store.get("partitions/t-0")
    assert stored is not None and models.decode("partitions", stored.value).spec.leader == 1  # type: ignore[attr-defined]
    assert [(result.action.reason, result.outcome) for result in results] == [("newer decision", Outcome.APPLIED)]


async def test_conflict_goes_back_to_the_controller_and_the_rest_of_the_batch_is_applied(running) -> None:  # type: ignore[no-untyped-def]
    store, dispatcher, results = running
    taken = await store.create("partitions/t-0", models.encode(partition("t-0")))
    dispatcher.submit(actions.create(partition("t-0", leader=1), "loses"))
    dispatcher.submit(actions.create(partition("t-1"), "wins"))
    await asyncio.wait_for(dispatcher.drained(), 5)
    outcomes = {result.action.reason: (result.outcome, result.revision) for result in results}
    assert outcomes["loses"] == (Outcome.CONFLICT, taken)
    assert outcomes["wins"][0] is Outcome.APPLIED
    assert await store.get("partitions/t-1") is not None


async def test_the_updater_leaves_an_echo_for_each_object_written_and_forgets_a_failed_write() -> None:
    store = memory.MemoryStore()
    echoes = local.Echoes()
    updater = dispatcher_module.KvUpdater(store, metrics.Metrics(), echoes)
    written = partition("t-0")
    await updater.apply([actions.create(written, "test")])
    assert echoes.take("partitions/t-0", models.encode(written)) is written
    with pytest.raises(kv.Conflict):
        await updater.apply([actions.create(written, "again"), actions.create(partition("t-1"), "test")])
    assert len(echoes) == 0  # not applied: their events (if any) are decoded
    await store.close()


async def test_a_result_hook_that_raises_stalls_nothing(running) -> None:  # type: ignore[no-untyped-def]
    """A broken hook (a bug in a controller's or the history's bookkeeping) used to leave its
    batch's slot taken: after eight, the dispatcher wrote nothing more. Each failure is logged;
    the other hooks still hear every result."""
    store, dispatcher, results = running

    def broken(result: dispatcher_module.Result) -> None:
        raise RuntimeError(f"injected fault for {result.action.key}")

    dispatcher.on_result(broken)
    with structlog.testing.capture_logs() as logged:
        for index in range(dispatcher.max_batches_in_flight + 4):
            dispatcher.submit(actions.create(partition(f"t-{index}"), "test"))
            await asyncio.wait_for(dispatcher.drained(), 5)
    assert len((await store.list("partitions/")).items) == 12
    assert [result.outcome for result in results] == [Outcome.APPLIED] * 12
    failures = [entry for entry in logged if entry["event"] == "action result hook failed"]
    assert [(entry["key"], entry["log_level"], entry["exc_info"]) for entry in failures] == [
        (f"partitions/t-{index}", "error", True) for index in range(12)
    ]
