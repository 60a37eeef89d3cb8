"""Action dispatcher on the memory store: batching, replacement, conflicts, no stalls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping, Sequence
from typing import Any

import pytest

from controller import metrics
from controller.pipeline import dispatcher as dispatcher_module
from controller.reconcile import actions
from store import kv, local, memory, models
from tests.builders import partition
import structlog.testing

Outcome = dispatcher_module.Outcome


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


async def test_more_actions_than_batches_in_flight_are_all_applied(running) -> None:
    store, dispatcher, results = running
    for index in range(3000):
        dispatcher.submit(actions.create(partition(f"t-{index}", [0, 1]), "test"))
    await asyncio.wait_for(dispatcher.drained(), 10)
    assert len((await store.list("partitions/")).items) == 3000
    assert [result.outcome for result in results] == [Outcome.APPLIED] * 3000
    # Batched: far fewer revisions than actions, each transaction within etcd's 128 operations.
    assert await store.revision() <= 1 + 3000 // 128 + 8


async def test_a_newer_action_replaces_the_queued_one(running) -> None:
    store, dispatcher, results = running
    dispatcher.submit(actions.create(partition("t-0", [0, 1], leader=0), "first decision"))
    dispatcher.submit(actions.create(partition("t-0", [0, 1], leader=1), "newer decision"))
    await asyncio.wait_for(dispatcher.drained(), 5)
    stored = await store.get("partitions/t-0")
    assert stored is not None and models.decode("partitions", stored.value).spec.leader == 1
    assert [(result.action.reason, result.outcome) for result in results] == [("newer decision", Outcome.APPLIED)]


async def test_conflict_goes_back_to_the_controller_and_the_rest_of_the_batch_is_applied(running) -> None:
    store, dispatcher, results = running
    taken = await store.create("partitions/t-0", models.encode(partition("t-0", [0, 1])))
    dispatcher.submit(actions.create(partition("t-0", [0, 1], leader=1), "loses"))
    dispatcher.submit(actions.create(partition("t-1", [0, 1]), "wins"))
    await asyncio.wait_for(dispatcher.drained(), 5)
    outcomes = {result.action.reason: (result.outcome, result.revision) for result in results}
    assert outcomes["loses"] == (Outcome.CONFLICT, taken)
    assert outcomes["wins"][0] is Outcome.APPLIED
    assert await store.get("partitions/t-1") is not None


async def test_the_updater_leaves_an_echo_for_each_object_written_and_forgets_a_failed_write() -> None:
    store = memory.MemoryStore()
    echoes = local.Echoes()
    updater = dispatcher_module.KvUpdater(store, metrics.Metrics(), echoes)
    written = partition("t-0", [0, 1])
    await updater.apply([actions.create(written, "test")])
    assert echoes.take("partitions/t-0", models.encode(written)) is written
    with pytest.raises(kv.Conflict):
        await updater.apply([actions.create(written, "again"), actions.create(partition("t-1", [0, 1]), "test")])
    assert len(echoes) == 0  # not applied: their events (if any) are decoded
    await store.close()


def topic_of_size(name: str, partitions: int) -> models.Topic:
    """A provisioned topic whose replica map makes it about 11 bytes a partition."""
    replica_map = {index: [index % 3, (index + 1) % 3] for index in range(partitions)}
    return models.Topic.model_validate(
        {
            "name": name,
            "spec": {"partitions": partitions, "replicationFactor": 2},
            "status": {"resolution": "Provisioned", "replicaMap": replica_map},
        }
    )


class RecordingStore(memory.MemoryStore):
    """A memory store that records the size of every transaction it is asked for."""

    def __init__(self, max_request_bytes: int) -> None:
        super().__init__(max_request_bytes=max_request_bytes)
        self.sizes: list[int] = []

    async def txn(self, compares, operations):
        self.sizes.append(kv.request_size(self).txn_bytes(compares, operations))
        return await super().txn(compares, operations)


async def dispatch_all(store: kv.KVStore, submitted: Sequence[actions.Action]) -> list[dispatcher_module.Result]:
    """Submit ``submitted`` to a dispatcher on ``store``, run it until nothing is left; its results."""
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics)
    results: list[dispatcher_module.Result] = []
    dispatcher.on_result(results.append)
    for action in submitted:
        dispatcher.submit(action)
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.wait_for(dispatcher.drained(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return results


async def test_batches_are_cut_by_bytes_as_well_as_by_count() -> None:
    """Ten actions of about 20 KB under a 64 KiB limit: each fits, no three together do. Every
    transaction sent is within the limit (none refused and retried alone), all are applied."""
    store = RecordingStore(max_request_bytes=64 * 1024)
    results = await dispatch_all(store, [actions.create(topic_of_size(f"t{index}", 2000), "test") for index in range(10)])
    size = kv.request_size(store)
    assert [result.outcome for result in results] == [Outcome.APPLIED] * 10
    assert all(sent <= size.budget for sent in store.sizes), (store.sizes, size.budget)
    assert len(store.sizes) == 5  # two actions a transaction
    assert len((await store.list("topics/")).items) == 10
    await store.close()


async def test_every_stale_action_of_a_batch_goes_back_to_its_controller_in_one_round() -> None:
    """Forty creates of keys that already exist, in one batch with ten that do not: one failed
    transaction sends all forty back (CONFLICT) and the next applies the ten. It used to take a
    round per stale key: a transaction of up to 127 operations each time, k rounds for k keys."""
    store = RecordingStore(max_request_bytes=kv.DEFAULT_MAX_REQUEST_BYTES)
    for index in range(40):
        await store.create(f"partitions/t-{index}", models.encode(partition(f"t-{index}", [0, 1])))
    store.sizes.clear()
    results = await dispatch_all(store, [actions.create(partition(f"t-{index}", [1, 0]), "test") for index in range(50)])
    outcomes = {result.action.key: result.outcome for result in results}
    assert [outcomes[f"partitions/t-{index}"] for index in range(50)] == [Outcome.CONFLICT] * 40 + [Outcome.APPLIED] * 10
    assert len(store.sizes) == 2, store.sizes
    await store.close()


@pytest.mark.looptime
async def test_a_failed_action_backs_off_its_key_and_holds_no_other() -> None:
    """An action the store refuses for good (too large alone) is FAILED; submitted again at once,
    as a controller would, it is tried only once its key's backoff has passed (doubling, capped),
    while another key's action is applied at once."""
    store = memory.MemoryStore(max_request_bytes=64 * 1024)
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(
        dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics, initial_backoff=0.1, max_backoff=0.4
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    huge = actions.create(topic_of_size("huge", 10_000), "too large for any transaction")
    seen: list[tuple[str, Outcome, float]] = []
    details: list[str] = []
    finished = asyncio.Event()

    def record(result: dispatcher_module.Result) -> None:
        seen.append((result.action.name, result.outcome, round(loop.time() - start, 2)))  # to the timer resolution
        details.append(result.detail)
        if result.action is huge and len(details) < 5:
            dispatcher.submit(huge)
        if len(seen) == 5:
            finished.set()

    dispatcher.on_result(record)
    dispatcher.submit(huge)
    dispatcher.submit(actions.create(partition("t-0", [0, 1]), "another key"))
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.wait_for(finished.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert seen == [
        ("huge", Outcome.FAILED, 0.0),
        ("t-0", Outcome.APPLIED, 0.0),
        ("huge", Outcome.FAILED, 0.1),
        ("huge", Outcome.FAILED, 0.3),
        ("huge", Outcome.FAILED, 0.7),
    ]
    assert details[0].startswith("a request of ") and "is too large" in details[0], details[0]
    await store.close()


async def test_a_result_hook_that_raises_stalls_nothing(running) -> None:
    """A broken hook (a bug in a controller's or the history's bookkeeping) used to leave its
    batch's slot taken: once every slot was, the dispatcher wrote nothing more. Each failure is logged;
    the other hooks still hear every result."""
    store, dispatcher, results = running

    def broken(result: dispatcher_module.Result) -> None:
        raise RuntimeError(f"injected fault for {result.action.key}")

    dispatcher.on_result(broken)
    count = dispatcher.max_batches_in_flight + 4
    with structlog.testing.capture_logs() as logged:
        for index in range(count):
            dispatcher.submit(actions.create(partition(f"t-{index}", [0, 1]), "test"))
            await asyncio.wait_for(dispatcher.drained(), 5)
    assert len((await store.list("partitions/")).items) == count
    assert [result.outcome for result in results] == [Outcome.APPLIED] * count
    failures = [entry for entry in logged if entry["event"] == "action result hook failed"]
    assert [(entry["key"], entry["log_level"], entry["exc_info"]) for entry in failures] == [
        (f"partitions/t-{index}", "error", True) for index in range(count)
    ]


class FaultyUpdater(dispatcher_module.KvUpdater):
    """Raises a bug's exception (not a store error) for any batch holding the action named "bad-0"."""

    async def apply(self, batch):
        if any(action.name == "bad-0" for action in batch):
            raise RuntimeError("injected fault")
        return await super().apply(batch)


async def drained_logging(dispatcher: dispatcher_module.ActionDispatcher) -> list[MutableMapping[str, Any]]:
    """Run ``dispatcher`` until its queue is drained; what it logged meanwhile."""
    task = asyncio.create_task(dispatcher.run())
    try:
        with structlog.testing.capture_logs() as logged:
            await asyncio.wait_for(dispatcher.drained(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return logged


async def test_an_unexpected_error_fails_its_action_alone_and_says_so() -> None:
    """An exception other than a store error out of a write used to drop its whole batch without a
    result (no controller heard of it, nothing was retried, nothing logged but an unretrieved task
    error). The batch is split as for a store refusal: the others are applied, the culprit FAILED
    with the error, logged with its traceback."""
    store = memory.MemoryStore()
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(FaultyUpdater(store, instance_metrics), instance_metrics)
    results: list[dispatcher_module.Result] = []
    dispatcher.on_result(results.append)
    for name in ("t-0", "bad-0", "t-1"):
        dispatcher.submit(actions.create(partition(name), "test"))
    logged = await drained_logging(dispatcher)
    outcomes = sorted((result.action.name, result.outcome, result.detail) for result in results)
    assert outcomes == [
        ("bad-0", Outcome.FAILED, "RuntimeError: injected fault"),
        ("t-0", Outcome.APPLIED, ""),
        ("t-1", Outcome.APPLIED, ""),
    ]
    assert sorted(item.key for item in (await store.list("partitions/")).items) == ["partitions/t-0", "partitions/t-1"]
    failures = [(entry["key"], entry["log_level"], entry.get("exc_info")) for entry in logged if entry["event"] == "action failed"]
    assert failures == [("partitions/bad-0", "error", True)]
    await store.close()


async def test_a_failed_action_queued_under_another_key_names_its_object_in_the_log() -> None:
    """A topic's provisioning is queued under the placement chain's key: its "action failed" line
    named only that key (``meta/...``), so an operator could not tell which topic etcd refused."""
    store = memory.MemoryStore()
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(FaultyUpdater(store, instance_metrics), instance_metrics)
    write = actions.Write("partitions/bad-0", models.encode(partition("bad-0")), 0)
    dispatcher.submit(actions.Action("partitions", "bad-0", actions.Verb.CREATE, "test", (write,), queue_key="meta/chain"))
    logged = await drained_logging(dispatcher)
    failures = [(entry["key"], entry.get("object")) for entry in logged if entry["event"] == "action failed"]
    assert failures == [("meta/chain", "partitions/bad-0")]
    await store.close()


class _Refusing(memory.MemoryStore):
    """Every write refused as unavailable, as a deposed SC's guard refuses them."""

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        raise kv.Unavailable("this SC may not write: it is a standby")


@pytest.mark.parametrize("turns", range(6))
async def test_a_cancel_ends_the_dispatcher_even_as_it_is_woken(turns: int) -> None:
    """A term's end cancels the dispatcher while its queue waits out a backoff (the writes of a
    deposed SC are refused). On Python 3.11, ``asyncio.wait_for`` dropped a cancel that came in
    the turn its wait completed: the dispatcher went on and the step-down never finished, so the
    SC held the claim without leading. Cancelled 0 to 5 loop turns after a wake-up: it must stop."""
    store = _Refusing()
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics)
    task = asyncio.create_task(dispatcher.run())
    try:
        dispatcher.submit(actions.create(partition("t-0", [0, 1]), "test"))
        await asyncio.sleep(0.02)  # refused, queued again with a backoff: the dispatcher waits with a timeout
        dispatcher.submit(actions.create(partition("t-1", [0, 1]), "test"))  # wakes it
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=1.0)
        assert done, f"the dispatcher went on after it was cancelled {turns} loop turns after a wake-up"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()
