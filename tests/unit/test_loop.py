"""The controller loop around a pure decision, on the memory store and a fast-forwarded clock:
a failed action is not decided again in a hot loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from controller import metrics
from controller.pipeline import dispatcher as dispatcher_module, loop as loop_module
from controller.reconcile import actions
from store import local, memory, models


def topic_of_size(name: str, partitions: int) -> models.Topic:
    replica_map = {index: [index % 3, (index + 1) % 3] for index in range(partitions)}
    return models.Topic.model_validate(
        {"name": name, "spec": {"partitions": partitions, "replicationFactor": 2}, "status": {"resolution": "Provisioned", "replicaMap": replica_map}}
    )


def controller_on(
    store: memory.MemoryStore, local_store: local.LocalStore, decide: loop_module.Decide = lambda snapshot, changes: [], resync_interval: float = 60.0
) -> tuple[dispatcher_module.ActionDispatcher, loop_module.ControllerLoop]:
    """A dispatcher writing to ``store`` and a controller loop of topics around ``decide``."""
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics)
    controller = loop_module.ControllerLoop(
        "test", decide, {"topics": local.Part.ALL}, local_store, dispatcher, instance_metrics, resync_interval=resync_interval
    )
    return dispatcher, controller


@pytest.mark.looptime
async def test_a_failed_action_is_decided_again_only_after_a_growing_backoff_or_a_change() -> None:
    """A controller that decides the same refused action whenever its key is free, woken every
    0.1 s by other changes: it decides it at 0, then once each backoff (0.5 s, doubling) has
    passed; an outside change to the object makes it decide at once."""
    store = memory.MemoryStore(max_request_bytes=64 * 1024)
    local_store = local.LocalStore()
    instance_metrics = metrics.Metrics()
    dispatcher = dispatcher_module.ActionDispatcher(dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics)
    too_large = actions.create(topic_of_size("huge", 10_000), "too large for any transaction")
    loop = asyncio.get_running_loop()
    start = loop.time()
    decided_at: list[float] = []
    outcomes: list[dispatcher_module.Outcome] = []
    dispatcher.on_result(lambda result: outcomes.append(result.outcome))

    def decide(snapshot: local.Snapshot, changes: Mapping[str, local.Changes]) -> list[actions.Action]:
        if controller.busy(too_large.key):
            return []
        decided_at.append(round(loop.time() - start, 1))
        return [too_large]

    controller = loop_module.ControllerLoop(
        "test", decide, {"topics": local.Part.ALL}, local_store, dispatcher, instance_metrics, resync_interval=3600.0
    )

    async def other_changes() -> None:
        while True:
            await asyncio.sleep(0.1)
            controller.kick()

    tasks = [asyncio.create_task(coroutine) for coroutine in (dispatcher.run(), controller.run(), other_changes())]
    try:
        await asyncio.sleep(8.0)
        assert decided_at == [0.0, 0.5, 1.5, 3.5, 7.5]
        assert outcomes == [dispatcher_module.Outcome.FAILED] * 5
        # Someone else writes the object: the failure is forgotten and it is decided at once.
        local_store["topics"].apply(topic_of_size("huge", 1), 5)
        await asyncio.sleep(0.3)
        assert decided_at == [0.0, 0.5, 1.5, 3.5, 7.5, 8.0]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


async def test_a_written_key_stays_busy_until_the_local_store_has_its_latest_write() -> None:
    """A key is busy from its write's answer until the local store reaches that write's revision;
    written again meanwhile, until the later one (not the first revision that comes up)."""
    store = memory.MemoryStore()
    local_store = local.LocalStore()
    _, controller = controller_on(store, local_store)
    first, second, other = (actions.create(topic_of_size(name, 1), "test") for name in ("a", "a", "b"))
    for action, revision in ((first, 10), (other, 12), (second, 15)):
        controller._submitted.add(action.key)
        controller._on_result(dispatcher_module.Result(action, dispatcher_module.Outcome.APPLIED, revision))

    def busy_after(revision: int) -> list[bool]:
        local_store["topics"].apply(topic_of_size("c", 1), revision)  # the store reaches the revision
        controller._forget_caught_up()
        return [controller.busy(first.key), controller.busy(other.key)]

    assert busy_after(9) == [True, True]
    assert busy_after(12) == [True, False]
    assert busy_after(14) == [True, False]
    assert busy_after(15) == [False, False]
    assert controller._expecting == []
    await store.close()


async def test_keys_written_at_revisions_the_store_lost_are_free_once_the_reader_relists() -> None:
    """etcd 3.5.1 killed just after acknowledging writes can come back without them and give their
    revisions to other writes (docs/limitations.md). When the Reader relists after that
    (HistoryLost), a key written at a revision past the listing is free at once: waiting for the
    store to reach that revision would keep it busy until unrelated writes get there, for good on
    an idle cluster."""
    store = memory.MemoryStore()
    local_store = local.LocalStore()
    _, controller = controller_on(store, local_store)
    kept, lost, other = (actions.create(topic_of_size(name, 1), "test") for name in ("a", "b", "c"))
    for action, revision in ((kept, 10), (lost, 20)):
        controller._submitted.add(action.key)
        controller._on_result(dispatcher_module.Result(action, dispatcher_module.Outcome.APPLIED, revision))
    local_store["topics"].apply(topic_of_size("a", 1), 10)
    controller._forget_caught_up()
    assert [controller.busy(kept.key), controller.busy(lost.key)] == [False, True]

    # The store came back at revision 15 without b's write; a write answered since is expected as usual.
    local_store["topics"].resync([(topic_of_size("a", 1), 10, 10)], 15)
    local_store.forked(15)
    controller._submitted.add(other.key)
    controller._on_result(dispatcher_module.Result(other, dispatcher_module.Outcome.APPLIED, 16))
    controller._forget_caught_up()
    assert [controller.busy(lost.key), controller.busy(other.key)] == [False, True]
    assert controller._expected == {other.key: 16}
    await store.close()


@pytest.mark.looptime
async def test_a_key_whose_write_never_comes_back_is_free_after_two_resync_passes() -> None:
    """A write etcd lost before the watch delivered it leaves no trace the Reader can see (its
    watch resumes after the last change it delivered, which etcd still has): the key is busy
    until the store reaches the write's revision. On an idle cluster nothing gets there, so an
    expectation still open at two resync passes in a row is dropped and the object decided again
    (a write decided from a store that is merely behind loses its compare, nothing worse)."""
    store = memory.MemoryStore()
    local_store = local.LocalStore()
    wanted = actions.create(topic_of_size("a", 1), "test")
    loop = asyncio.get_running_loop()
    start = loop.time()
    submitted_at: list[float] = []

    def decide(snapshot: local.Snapshot, changes: Mapping[str, local.Changes]) -> list[actions.Action]:
        if snapshot.entries("topics").get("a") is not None:
            return []
        if not controller.busy(wanted.key):
            submitted_at.append(round(loop.time() - start))
        return [wanted]

    dispatcher, controller = controller_on(store, local_store, decide, resync_interval=60.0)
    local_store["topics"].resync([], 1)
    local_store.meta.resync([], 1)
    task = asyncio.create_task(controller.run())
    dispatch = asyncio.create_task(dispatcher.run())
    try:
        # The create is applied, but its echo never reaches this local store (no Reader runs):
        # as if etcd lost the write before its watch delivered it.
        await asyncio.sleep(1)
        assert submitted_at == [0]
        await asyncio.sleep(125)
        # Resync passes at 60 and 120: open at both, so free at the second.
        assert submitted_at == [0, 120]
    finally:
        for running in (task, dispatch):
            running.cancel()
        await asyncio.gather(task, dispatch, return_exceptions=True)
        await store.close()


@pytest.mark.looptime
async def test_a_write_that_loses_its_compare_twice_to_the_same_value_backs_off() -> None:
    """The store holds a value the mirror does not show at the revision it has reached (a value this
    SC cannot read): a create decided from the mirror loses its compare to it again and again.
    After the same conflict twice the object backs off (0.5 s, doubling) instead of being decided
    again at once, in a hot loop."""
    store = memory.MemoryStore()
    written = await store.create("topics/a", models.encode(topic_of_size("a", 1)))
    local_store = local.LocalStore()
    local_store["topics"].resync([], written)  # at the revision, without the value
    local_store.meta.resync([], written)
    wanted = actions.create(topic_of_size("a", 1), "test")
    loop = asyncio.get_running_loop()
    start = loop.time()
    conflicts: list[float] = []
    hot = asyncio.Event()  # a hot loop never lets the clock move: it ends the wait instead

    def record(result: dispatcher_module.Result) -> None:
        if result.outcome is dispatcher_module.Outcome.CONFLICT:
            conflicts.append(round(loop.time() - start, 1))
            if len(conflicts) > 50:
                hot.set()

    def decide(snapshot: local.Snapshot, changes: Mapping[str, local.Changes]) -> list[actions.Action]:
        return [] if snapshot.entries("topics").get("a") is not None else [wanted]

    dispatcher, controller = controller_on(store, local_store, decide, resync_interval=3600.0)
    dispatcher.on_result(record)
    tasks = [asyncio.create_task(coroutine) for coroutine in (dispatcher.run(), controller.run())]
    waits = [asyncio.ensure_future(asyncio.sleep(8.0)), asyncio.ensure_future(hot.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        assert conflicts == [0.0, 0.0, 0.5, 1.5, 3.5, 7.5]
    finally:
        for task in (*tasks, *waits):
            task.cancel()
        await asyncio.gather(*tasks, *waits, return_exceptions=True)
        await store.close()


async def test_a_failed_write_is_decided_afresh_once_its_object_was_deleted_and_created_again_while_the_watch_was_down() -> None:
    """As when the watch brings the delete and the create: the object the write failed on is gone,
    and the new one is decided without waiting for the old one's backoff. A relist that finds the
    name under a new create revision says so; before, a relist said nothing of any one object."""
    store = memory.MemoryStore()
    local_store = local.LocalStore()
    local_store["topics"].apply(topic_of_size("a", 1), 1)
    _, controller = controller_on(store, local_store)
    controller.listeners = {"topics": local_store.tables["topics"].listener()}  # what run() starts with
    controller.run_pass()  # the first pass, full
    failing = actions.create(topic_of_size("a", 1), "test")
    controller._submitted.add(failing.key)
    controller._on_result(dispatcher_module.Result(failing, dispatcher_module.Outcome.FAILED, 0))
    assert controller.failed(failing.key) and controller.busy(failing.key)

    local_store["topics"].resync([(topic_of_size("a", 1), 5, 5)], 5)  # deleted and created again meanwhile
    controller.run_pass()
    assert not controller.failed(failing.key) and not controller.busy(failing.key)
    # A relist that finds the same object says nothing of it: a failure since stays.
    controller._submitted.add(failing.key)
    controller._on_result(dispatcher_module.Result(failing, dispatcher_module.Outcome.FAILED, 0))
    local_store["topics"].resync([(topic_of_size("a", 1), 5, 5)], 6)
    controller.run_pass()
    assert controller.failed(failing.key)
    await store.close()


async def test_the_refusal_of_a_write_about_one_object_is_kept_until_a_write_about_it_goes_through_or_it_changes() -> None:
    """What the topic controller says in a topic's reason: the store's last refusal of a write about
    that topic alone (its provisioning, some of its partitions); a provision of several topics is
    about none of them (any one may be the one refused). Forgotten once a write about the topic is
    applied, or someone else changes it."""
    store = memory.MemoryStore()
    local_store = local.LocalStore()
    a, b = topic_of_size("a", 1), topic_of_size("b", 1)
    local_store["topics"].apply(a, 1)
    local_store["topics"].apply(b, 2)
    _, controller = controller_on(store, local_store)
    controller.listeners = {"topics": local_store.tables["topics"].listener()}  # what run() starts with
    controller.run_pass()

    def answered(action: actions.Action, outcome: dispatcher_module.Outcome, detail: str = "") -> None:
        controller._submitted.add(action.key)
        controller._on_result(dispatcher_module.Result(action, outcome, 7 if outcome is dispatcher_module.Outcome.APPLIED else 0, detail))

    chain = "meta/placement-start-index"
    both = actions.provision(chain, b"{}", 0, [actions.TopicProvision(a, 1, (), "placed"), actions.TopicProvision(b, 2, (), "placed")])
    answered(both, dispatcher_module.Outcome.FAILED, "too large")
    assert controller.refusal("topics/a") == controller.refusal("topics/b") == ""
    answered(actions.provision(chain, b"{}", 0, [actions.TopicProvision(a, 1, (), "placed")]), dispatcher_module.Outcome.FAILED, "too large")
    answered(actions.create_partitions("b", [models.new_partition(b, 0, [0, 1])], "partition 0"), dispatcher_module.Outcome.FAILED, "too many operations")
    assert (controller.refusal("topics/a"), controller.refusal("topics/b")) == ("too large", "too many operations")

    answered(actions.update_status(a, a.status, 1, "said"), dispatcher_module.Outcome.APPLIED)
    assert controller.refusal("topics/a") == ""
    local_store["topics"].apply(topic_of_size("b", 2), 8)  # someone else's write
    controller.run_pass()
    assert controller.refusal("topics/b") == ""
    await store.close()
