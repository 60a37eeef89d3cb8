"""The partition controller's pass state (controller/pipeline/controllers.py), driven pass by pass
on a fast-forwarded loop clock: while elections it submitted are on their way, only leaderless
partitions are decided, for at most HOLD_SECONDS, and a kick ends the hold even if nothing else
happens; a partition whose write is in flight is left out of a pass and looked at once it is
free, without being decided twice meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from connection_manager import health as health_module
from connection_manager import lrs, wire
from connection_manager import server as cm_server
from controller import config, context as context_module, metrics
from controller.pipeline import controllers, dispatcher as dispatcher_module
from controller.reconcile import actions
from store import local, memory, models
from tests import builders
from tests.unit.test_election import SPUS, fresh, part
from tests.unit.test_spu_frames import about

ONLINE, OFFLINE = health_module.Health.ONLINE, health_module.Health.OFFLINE


def named(partition: models.Partition, name: str) -> models.Partition:
    return partition.model_copy(update={"name": name})


def with_uid(partition: models.Partition, uid: int) -> models.Partition:
    return partition.model_copy(update={"uid": uid})


def no_changes() -> dict[str, local.Changes[Any]]:
    nothing: local.Changes[Any] = local.Changes(full=False, updated=[], deleted=[], epoch=0)
    return {"partitions": nothing, "spus": nothing}


class Passes:
    """A partition controller over SPUs 0-2, by default with SPU 0 gone: it led led-0 and followed
    followed-0. ``busy`` holds the keys whose write is in flight, as the test says."""

    def __init__(
        self,
        partitions: tuple[models.Partition, ...] = (named(part(0, [0, 1, 2]), "led-0"), named(part(1, [1, 0, 2]), "followed-0")),
        states: tuple[health_module.Health, ...] = (OFFLINE, ONLINE, ONLINE),
        settings: config.Settings | None = None,
        pushing: bool = False,
    ) -> None:
        store = memory.MemoryStore()
        self.local_store = local.LocalStore()
        for revision, spu in enumerate(SPUS, start=1):
            self.local_store["spus"].apply(spu, revision)
        for revision, partition in enumerate(partitions, start=10):
            self.local_store["partitions"].apply(partition, revision)
        instance_metrics = metrics.Metrics()
        context = context_module.Context(
            settings=settings or config.Settings(), kv_store=store, local_store=self.local_store, metrics=instance_metrics
        )
        dispatcher = dispatcher_module.ActionDispatcher(dispatcher_module.KvUpdater(store, instance_metrics), instance_metrics)
        loop = asyncio.get_running_loop()
        health = health_module.HealthView(started_at=loop.time())
        for spu_id, state in enumerate(states):
            health.set(spu_id, state, loop.time(), incarnation=spu_id + 1)
        live = lrs.LiveReplicas()
        spus = controllers.SpuController(context, dispatcher, health, live)
        # With ``pushing``, a connection manager (not listening) whose pusher the test runs.
        self.connections = cm_server.ConnectionManager(self.local_store, health, live) if pushing else None
        self.controller = controllers.PartitionController(context, dispatcher, health, live, spus, self.connections)
        self.busy: set[str] = set()
        self.controller.loop.busy = lambda key: key in self.busy  # type: ignore[method-assign]  # the writes in flight, as the test says

    def decide(self) -> list[tuple[str, actions.Verb]]:
        """One pass with no change from the store: what it decides."""
        decided = self.controller.decide(self.local_store.snapshot(), no_changes())
        return [(action.name, action.verb) for action in decided]


@pytest.mark.looptime
async def test_in_sync_changes_wait_for_the_elections_in_flight_at_most_the_hold() -> None:
    passes = Passes()
    controller, busy, decide = passes.controller, passes.busy, passes.decide
    # The first pass (a full one) elects alone; the follower's in-sync change is postponed.
    assert decide() == [("led-0", actions.Verb.ELECT)]
    busy.add("partitions/led-0")  # its write is on its way
    controller.on_news({"led-0"})  # a report about it arrives meanwhile
    controller.loop._kick.clear()
    # While the election is in flight: not decided again, and the in-sync change waits.
    assert decide() == []
    assert not controller.loop._kick.is_set()  # nothing to do until the election is back
    await asyncio.sleep(controllers.HOLD_SECONDS)
    # The hold ends on its own: the loop is woken to do what waited.
    assert controller.loop._kick.is_set()
    assert decide() == [("followed-0", actions.Verb.UPDATE_STATUS)]
    # Once its write is back, the partition set aside is looked at again (here: elected again,
    # as this snapshot never saw the write).
    busy.clear()
    assert decide() == [("led-0", actions.Verb.ELECT)]


@pytest.mark.looptime
async def test_the_hold_ends_as_soon_as_the_elections_are_back() -> None:
    passes = Passes()
    busy, decide = passes.busy, passes.decide
    assert decide() == [("led-0", actions.Verb.ELECT)]
    busy.add("partitions/led-0")
    assert decide() == []
    busy.clear()  # the election is written and back
    assert decide() == [("followed-0", actions.Verb.UPDATE_STATUS)]


@pytest.mark.looptime
async def test_in_sync_changes_wait_until_the_elections_back_are_pushed_to_the_spus() -> None:
    """Back in the local store is not yet told: the pusher waits PUSH_LINGER for the rest of a burst.
    At 100,000 partitions on 50 SPUs the in-sync changes' first passes (50-85 ms each) ran in that
    wait, between the last elections' echo and their push: the new leaders heard of their
    leadership 100-160 ms later than they could (bench/failover.py, "last SPU told")."""
    passes = Passes(pushing=True)
    controller, busy, decide, connections = passes.controller, passes.busy, passes.decide, passes.connections
    assert connections is not None
    pusher = asyncio.create_task(connections._push_changes())
    try:
        await asyncio.sleep(0)  # the pusher starts from now
        [(name, verb)] = decide()
        assert (name, verb) == ("led-0", actions.Verb.ELECT)
        busy.add("partitions/led-0")
        assert decide() == []
        # The election is written and its echo is in the local store, not yet pushed.
        elected = named(part(1, [0, 1, 2], leader_epoch=2, isr=[1, 2]), "led-0")
        passes.local_store["partitions"].apply(elected, 30)
        busy.clear()
        controller.loop._kick.clear()
        assert decide() == []
        assert not controller.loop._kick.is_set()
        await asyncio.sleep(cm_server.PUSH_LINGER * 2)  # the pusher tells the SPUs
        assert connections.pushed_through(passes.local_store["partitions"].epoch)
        assert controller.loop._kick.is_set()  # and the loop is woken for what waited
        assert decide() == [("followed-0", actions.Verb.UPDATE_STATUS)]
    finally:
        pusher.cancel()
        await asyncio.gather(pusher, return_exceptions=True)


@pytest.mark.looptime
async def test_in_sync_changes_do_not_wait_for_a_pusher_that_is_not_running() -> None:
    passes = Passes(pushing=True)  # its pusher never started (no private port): nothing to wait for
    busy, decide = passes.busy, passes.decide
    assert decide() == [("led-0", actions.Verb.ELECT)]
    busy.add("partitions/led-0")
    assert decide() == []
    busy.clear()
    assert decide() == [("followed-0", actions.Verb.UPDATE_STATUS)]


@pytest.mark.looptime
async def test_a_pass_of_the_hold_looks_again_only_at_what_changed_since(monkeypatch: pytest.MonkeyPatch) -> None:
    """The followerships postponed behind a failover's elections were looked at again by every pass
    of the hold, which only decides leaderless partitions: at 100,000 partitions, 4,000-6,000 of
    them ten times, 8-13 ms each, in the very window in which the elections' echoes were pushed.
    What was found not leaderless stays so unless it changes (it is then among the pass's changes)
    or an SPU hosting it changes (then it is due again)."""
    followed = tuple(named(part(1, [1, 0, 2]), f"followed-{index}") for index in range(20))
    passes = Passes((named(part(0, [0, 1, 2]), "led-0"), *followed))
    controller, busy, decide = passes.controller, passes.busy, passes.decide
    looked: list[set[str] | None] = []
    decide_partitions = controllers.partition.decide

    def recording(snapshot: local.Snapshot, inputs: Any) -> Any:
        looked.append(None if inputs.names is None else set(inputs.names))
        return decide_partitions(snapshot, inputs)

    monkeypatch.setattr(controllers.partition, "decide", recording)
    assert decide() == [("led-0", actions.Verb.ELECT)]
    assert looked[-1] is None  # the first pass is a full one
    busy.add("partitions/led-0")
    assert decide() == []
    assert looked[-1] == set()
    controller.on_news({"followed-3"})  # its leader proposed something: looked at, not decided
    assert decide() == []
    assert looked[-1] == {"followed-3"}
    controller.on_health(1)  # SPU 1 changed: whatever it hosts is due again
    assert decide() == []
    assert looked[-1] == {f"followed-{index}" for index in range(20)}
    # The election is written and back: the hold ends, and every partition that waited is decided.
    passes.local_store["partitions"].apply(named(part(1, [0, 1, 2], leader_epoch=2, isr=[1, 2]), "led-0"), 30)
    busy.clear()
    decided = decide()
    assert sorted(decided) == sorted((f"followed-{index}", actions.Verb.UPDATE_STATUS) for index in range(20))
    assert looked[-1] is not None and looked[-1] >= {f"followed-{index}" for index in range(20)}


async def test_preferred_leaders_return_a_batch_per_pass_without_a_full_pass_in_between() -> None:
    """SPU 0 is back and preferred for three partitions, one move per pass: each pass moves one
    and keeps the others due, to be looked at once the moves come back (not at once, and not by
    a pass over every partition: at 100,000 partitions each batch of 100 cost a full pass)."""
    waiting = tuple(named(part(1, [0, 1, 2]), f"pref-{index}") for index in range(3))
    passes = Passes(waiting, (ONLINE, ONLINE, ONLINE), config.Settings(leader_rebalance_batch=1))
    controller, decide = passes.controller, passes.decide
    controller.loop._kick.clear()
    left = {"pref-0", "pref-1", "pref-2"}
    for revision in range(20, 23):
        [(moved, verb)] = decide()  # one of those still due (a pass takes them in no set order)
        assert verb is actions.Verb.ELECT and moved in left
        left.discard(moved)
        assert controller._due == left
        assert not controller.loop._kick.is_set()  # paced by the moves' writes coming back
        # The move is written and back: SPU 0 leads it (the next pass is not a full one, or the
        # test's snapshot, which never sees the others' writes, would move them all again).
        passes.local_store["partitions"].apply(named(part(0, [0, 1, 2], leader_epoch=2), moved), revision)


async def test_a_partition_set_aside_for_another_loops_write_is_looked_at_when_that_write_is_back() -> None:
    """A topic's partitions are created by the topic controller's write; their echo can reach the
    local store, and their leaders confirm, before that write's answer. A confirmation that comes
    then finds the partition's key still being written: it is set aside. When the write's answer
    comes, the loop must wake, or the partition stays Offline until the periodic resync (seen: all
    of a new topic's partitions Offline for 30 s with every leader confirmed)."""
    fresh = named(part(0, [0, 1, 2], resolution=models.PartitionResolution.OFFLINE, leader_epoch=0, partition_epoch=0), "fresh-0")
    passes = Passes((fresh,), (ONLINE, ONLINE, ONLINE))
    controller = passes.controller
    loop = controller.loop
    del loop.busy  # the loop's own bookkeeping, not the test's
    writing = {"partitions/fresh-0"}
    loop.dispatcher.writing = lambda key: key in writing  # type: ignore[method-assign]  # the topic controller's write in flight
    assert passes.decide() == []  # the first (full) pass
    controller.on_news({"fresh-0"})  # its leader confirmed
    loop._kick.clear()
    assert passes.decide() == []
    assert controller._set_aside == {"fresh-0"}
    # The topic controller's write is answered: not this loop's action, but what it waited for.
    writing.clear()
    created = actions.update_status(fresh, fresh.status, 10, "created by the topic controller")
    loop._on_result(dispatcher_module.Result(created, dispatcher_module.Outcome.APPLIED, 30))
    assert loop._kick.is_set()


async def test_a_partition_whose_epochs_are_spent_is_left_as_it_is_and_said_once() -> None:
    """A stored partition at the largest leader epoch (anyone may have written it) whose leader is
    gone: no election is written (it would hold an epoch no SC can read back), the other
    partitions are decided as usual, and the reason is logged once, not at every pass."""
    import structlog

    spent = named(part(0, [0, 1, 2], leader_epoch=models.MAX_EPOCH), "spent-0")
    passes = Passes(partitions=(spent, named(part(0, [0, 1, 2]), "led-0")))
    with structlog.testing.capture_logs() as logged:
        assert passes.decide() == [("led-0", actions.Verb.ELECT)]
        passes.controller.loop.resyncing = True  # a full pass again: the same is due
        assert passes.decide() == [("led-0", actions.Verb.ELECT)]
    refused = [entry for entry in logged if entry["event"] == "a partition change is due but cannot be written"]
    assert [(entry["partition"], entry["log_level"]) for entry in refused] == [("spent-0", "error")]
    assert f"its epochs would pass {models.MAX_EPOCH}" in refused[0]["reason"]


@pytest.mark.looptime
async def test_a_partition_deleted_and_created_again_is_not_decided_on_its_predecessors_confirmation() -> None:
    """The pass may see the change before the pusher (which waits PUSH_LINGER) forgets what the
    old partition's leader said: the new one, at the same leader and epoch, was written Online
    though its leader had never confirmed it (rule 5), and with the old one's HW."""
    old = named(part(0, [0, 1], leader_epoch=0, partition_epoch=1, hw=1000), "t-0")
    passes = Passes(partitions=(old,), states=(ONLINE, ONLINE, ONLINE), pushing=True)
    connections = passes.connections
    assert connections is not None
    connections.confirmed["t-0"] = (0, 0)
    connections.live.committed("t-0", 1000)
    table = passes.local_store["partitions"]
    listener = table.listener()
    listener.changes()
    table.delete("t-0", 40)
    table.apply(named(fresh([0, 1]), "t-0"), 41)  # as the topic controller creates it: Offline, epochs 0
    decided = passes.controller.decide(passes.local_store.snapshot(), {"partitions": listener.changes(), "spus": no_changes()["spus"]})
    assert decided == []  # waits for its leader's confirmation
    assert "t-0" not in connections.confirmed and connections.live.max_hw("t-0") == lrs.UNKNOWN_OFFSET


class Led:
    """t-0 (uid 1001) led by SPU 0 at leader epoch 0, SPU 0 connected and told it; listeners of the
    pusher (``pushed``, ``spus_pushed``) and of a pass (``seen``) that have read everything so far."""

    def __init__(self) -> None:
        old = with_uid(named(part(0, [0, 1, 2], leader_epoch=0, partition_epoch=1, hw=7), "t-0"), 1_001)
        self.passes = Passes(partitions=(old,), states=(ONLINE, ONLINE, ONLINE), pushing=True)
        connections = self.passes.connections
        assert connections is not None
        self.connections = connections
        connections.on_news = self.passes.controller.on_news
        registration = self.passes.local_store["spus"].view["spu-0"].create_revision
        self.session = cm_server.Session(0, "spu-0", 1, None, registration)  # type: ignore[arg-type]  # frames only go to its outbox
        self.session.ready = True
        connections.sessions[0] = self.session
        connections._send_sync(self.session)
        self.table = self.passes.local_store["partitions"]
        self.pushed, self.seen = self.table.listener(), self.table.listener()
        self.spus_pushed = self.passes.local_store["spus"].listener(local.Part.SPEC)
        for listener in (self.pushed, self.seen, self.spus_pushed):
            listener.changes()


@pytest.mark.looptime
async def test_a_leaders_frames_about_a_partition_deleted_and_created_again_decide_nothing_for_the_new_one() -> None:
    """The leader of t-0 (leader epoch 0, the epoch a partition created again starts at, on the
    same SPUs) confirms it, reports HW 1000 and proposes with HW 1000 about the old partition, in
    frames that come in after the SC re-created it: before the push told it (the partition
    controller's pass came first, and forgot the old one's), and after. The new partition is
    not confirmed by them (it stays Offline until its leader confirms it), nor is its HW raised,
    nor is anything committed: before, the pass after them wrote it Online at HW 1000, for good."""
    led = Led()
    passes, connections, session, table = led.passes, led.connections, led.session, led.table
    pushed, seen, spus_pushed = led.pushed, led.seen, led.spus_pushed
    told = session.hosted["t-0"].uid
    assert passes.decide() == []
    table.delete("t-0", 40)
    table.apply(with_uid(named(fresh([0, 1, 2]), "t-0"), 1_041), 41)
    assert passes.controller.decide(passes.local_store.snapshot(), {"partitions": seen.changes(), "spus": no_changes()["spus"]}) == []
    for frame in about("t-0", None) + about("t-0", told):
        connections._take_frame(session, wire.encode(frame))
    assert passes.decide() == []
    connections.push(spus_pushed.changes(), pushed.changes())
    assert session.hosted["t-0"].uid == 1_041
    for frame in about("t-0", told):
        connections._take_frame(session, wire.encode(frame))
    assert passes.decide() == []
    assert (connections.confirmed, connections.live.max_hw("t-0"), connections.proposals) == ({}, lrs.UNKNOWN_OFFSET, {})
    assert connections.stats.stale_entries == 9
    # Its leader's confirmation of the new one counts.
    connections._take_frame(session, wire.encode(about("t-0", 1_041, hw=0)[0]))
    [write] = passes.controller.decide(passes.local_store.snapshot(), no_changes())
    stored = models.decode("partitions", builders.written(write.writes[0]))
    assert isinstance(stored, models.Partition) and stored.status.resolution is models.PartitionResolution.ONLINE
    assert stored.status.leader is not None and stored.status.leader.hw == lrs.UNKNOWN_OFFSET, stored.status


@pytest.mark.looptime
async def test_a_confirmation_of_the_new_partition_that_came_before_the_pass_read_the_delete_stays() -> None:
    """The pusher told the SPU the partition created again, and its leader confirmed the new one,
    before the partition controller's pass read the delete (a busy loop: its passes can lag the
    pusher by more than a round trip). Before, the pass forgot every name it read deleted, the new
    partition's confirmation with it, and the leader confirms a leadership once: the partition
    stayed Offline until its leader reconnected. What the SC keeps is about the current partition
    (its uid) and stays; the old one's would still go."""
    led = Led()
    passes, connections, session, table = led.passes, led.connections, led.session, led.table
    pushed, seen, spus_pushed = led.pushed, led.seen, led.spus_pushed
    assert passes.decide() == []
    table.delete("t-0", 40)
    table.apply(with_uid(named(fresh([0, 1, 2]), "t-0"), 1_041), 41)
    connections.push(spus_pushed.changes(), pushed.changes())  # the pusher first
    connections._take_frame(session, wire.encode(about("t-0", 1_041, hw=0)[0]))  # the new one confirmed
    assert connections.confirmed == {"t-0": (0, 0)}
    [write] = passes.controller.decide(passes.local_store.snapshot(), {"partitions": seen.changes(), "spus": no_changes()["spus"]})
    assert connections.confirmed == {"t-0": (0, 0)}
    stored = models.decode("partitions", builders.written(write.writes[0]))
    assert isinstance(stored, models.Partition) and stored.status.resolution is models.PartitionResolution.ONLINE


@pytest.mark.looptime
async def test_an_spu_name_registered_again_under_another_id_concerns_the_partitions_of_both_ids() -> None:
    """The partitions of the id it gave up are looked at too (they lost a replica's SPU): the
    controller's name -> id record takes the delete first. Before, the delete was not seen, or the
    new id replaced the old before the delete was read."""
    passes = Passes()
    controller, table = passes.controller, passes.local_store["spus"]
    snapshot = passes.local_store.snapshot()
    controller._hosting.update(snapshot, passes.local_store["partitions"].listener().changes())
    listener = table.listener()
    controller._spu_ids = {entry.name: entry.obj.spec.id for entry in listener.changes().updated}
    table.delete("spu-0", 50)
    table.apply(builders.spu(4, name="spu-0"), 51)
    concerned = controller._of_spus(listener.changes(), passes.local_store.snapshot().entries("partitions"))
    assert concerned == {"led-0", "followed-0"}
    assert controller._spu_ids["spu-0"] == 4


@pytest.mark.looptime
async def test_a_partition_deleted_and_created_again_while_the_watch_was_down_is_not_decided_on_its_predecessors() -> None:
    """The same, learnt from a relist (the listing holds the name under a new create revision):
    the pass that reads the full set must forget the old partition's confirmation and offsets too.
    Before, the relist was taken for an update of the old partition."""
    old = named(part(0, [0, 1], leader_epoch=0, partition_epoch=1, hw=1000), "t-0")
    passes = Passes(partitions=(old,), states=(ONLINE, ONLINE, ONLINE), pushing=True)
    connections = passes.connections
    assert connections is not None
    connections.confirmed["t-0"] = (0, 0)
    connections.live.committed("t-0", 1000)
    table = passes.local_store["partitions"]
    listener = table.listener()
    listener.changes()
    created = table.get("t-0")
    assert created is not None
    again = created.create_revision + 10
    table.resync([(named(fresh([0, 1]), "t-0"), again, again)], again)  # deleted and created again meanwhile
    changes = listener.changes()
    assert changes.full
    decided = passes.controller.decide(passes.local_store.snapshot(), {"partitions": changes, "spus": no_changes()["spus"]})
    assert decided == []  # waits for its leader's confirmation
    assert "t-0" not in connections.confirmed and connections.live.max_hw("t-0") == lrs.UNKNOWN_OFFSET
