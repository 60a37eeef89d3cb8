"""One controller per kind: its loop, and what that kind carries from one pass to the next.

Each builds its kind's inputs from the live state (health, reports, the loop clock, the settings)
and calls the pure ``controller.reconcile`` decision; none decides anything itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from connection_manager import health as health_module
from connection_manager import lrs, reports, wire
from controller.pipeline import dispatcher as dispatcher_module
from controller.pipeline import loop as loop_module
from controller.reconcile import actions, moves, partition, partition_state, spu, spu_group, spu_ids, topic
from store import kv, local, models

if TYPE_CHECKING:  # the context is only read: the pipeline never builds the API's parts it holds
    from connection_manager import server as cm_server
    from controller import config
    from controller import context as context_module

log = structlog.get_logger(__name__)

SPEC, ALL = local.Part.SPEC, local.Part.ALL
DRAINED = models.SpuDrain.DRAINED
DECOMMISSIONED = models.SpuDecommission.DONE


def cluster_view(
    settings: config.Settings,
    health: health_module.HealthView,
    live: lrs.LiveReplicas,
    connections: cm_server.ConnectionManager | None,
) -> partition.ClusterView:
    """What the partition decisions read beyond the store, from the SPUs' current connections."""
    if connections is None:
        return partition.ClusterView(
            health.snapshot(), {}, settings.unclean_leader_election, settings.leader_rebalance_batch
        )
    return partition.ClusterView(
        health=health.snapshot(),
        live=live.view,
        unclean_election=settings.unclean_leader_election,
        rebalance_batch=settings.leader_rebalance_batch,
        incarnations=connections.incarnations,
        proposals=connections.proposals,
        confirmed=connections.confirmed,
        max_hw=live.max_hws,
    )


def _loop(
    context: context_module.Context,
    dispatcher: dispatcher_module.ActionDispatcher,
    name: str,
    decide: loop_module.Decide,
    listens_to: Mapping[str, local.Part],
) -> loop_module.ControllerLoop:
    return loop_module.ControllerLoop(
        name,
        decide,
        listens_to,
        context.local_store,
        dispatcher,
        context.metrics,
        context.settings.resync_interval,
    )


class TopicController:
    """Topics: validation, placement and their partitions; carries whether unplaced topics are due
    another try."""

    def __init__(self, context: context_module.Context, dispatcher: dispatcher_module.ActionDispatcher) -> None:
        self._placers = context.placers
        # What one request to the store may hold: sizes topics and provision transactions.
        self._request_size = kv.request_size(context.kv_store)
        # InvalidConfig / InsufficientResources topics are re-run once SPUs change, until a pass
        # has had the placement chain free to try them.
        self._retry_unplaced = True
        # Partition statuses too: the echo of a status write may be what frees a partition
        # this loop set aside (an orphan to delete whose write lost to a status update).
        self.loop = _loop(context, dispatcher, "topic", self.decide, {"topics": ALL, "spus": ALL, "partitions": ALL})

    async def run(self) -> None:
        """One run of the loop; after a crash the next one starts from a full pass."""
        self._retry_unplaced = True
        await self.loop.run()

    def decide(self, snapshot: local.Snapshot, changes: local.ChangesByKind) -> list[actions.Action]:
        loop = self.loop
        full = loop.resyncing
        if full or any(change.full for change in changes.values()) or not changes["spus"].empty:
            self._retry_unplaced = True
        chain_free = not loop.busy(topic.CHAIN_KEY)
        inputs = topic.Inputs(
            changes=None if full else changes,
            busy=loop.busy,
            retry_unplaced=self._retry_unplaced,
            request_size=self._request_size,
            alone=loop.failed,
            refused=loop.refusal,
            placers=self._placers,
            faults=loop.faults,
        )
        decided = topic.decide(snapshot, inputs)
        if chain_free and not any(action.verb is actions.Verb.PROVISION for action in decided):
            self._retry_unplaced = False  # every unplaced topic was tried with the current SPUs
        return decided


class SpuGroupController:
    """SPU groups and their managed SPUs; nothing carried between passes."""

    def __init__(self, context: context_module.Context, dispatcher: dispatcher_module.ActionDispatcher) -> None:
        self.loop = _loop(context, dispatcher, "spu-group", self.decide, {"spu-groups": SPEC, "spus": SPEC})

    async def run(self) -> None:
        await self.loop.run()

    def decide(self, snapshot: local.Snapshot, changes: local.ChangesByKind) -> list[actions.Action]:
        return spu_group.decide(snapshot, spu_group.Inputs(faults=self.loop.faults))


class SpuController:
    """SPU statuses from the health view; carries the SPUs last seen sharing an id (said once)."""

    def __init__(
        self,
        context: context_module.Context,
        dispatcher: dispatcher_module.ActionDispatcher,
        health: health_module.HealthView,
        live: lrs.LiveReplicas,
        connections: cm_server.ConnectionManager | None = None,
    ) -> None:
        self._settings = context.settings
        self._health = health
        self._live = live
        self._connections = connections
        self._grace = context.settings.spu_offline_grace
        self._shadowed: list[tuple[int, str, str]] = []
        self.loop = _loop(context, dispatcher, "spu", self.decide, {"spus": ALL})

    async def run(self) -> None:
        await self.loop.run()

    def decide(self, snapshot: local.Snapshot, changes: local.ChangesByKind) -> list[actions.Action]:
        shadowed = spu_ids.shadowed(snapshot.entries("spus"), snapshot.meta)
        if shadowed != self._shadowed:
            # Only writes behind the SC's back make SPUs share an id: say so once per change.
            self._shadowed = shadowed
            if shadowed:
                log.error("SPUs share an id", problem=spu_ids.describe_shadowed(shadowed))
        inputs = spu.Inputs(
            health=self._health.snapshot(),
            now=asyncio.get_running_loop().time(),
            started_at=self._health.started_at,
            grace_period=self._grace,
            view=cluster_view(self._settings, self._health, self._live, self._connections),
            faults=self.loop.faults,
        )
        return spu.decide(snapshot, inputs)

    async def end_grace(self) -> None:
        """SPUs recorded Online that never reconnect turn Offline when the grace period ends."""
        await asyncio.sleep(max(0.0, self._health.started_at + self._grace - asyncio.get_running_loop().time()))
        self.loop.kick()


class RebalanceController:
    """The stored rebalance run (meta/rebalance): starts its moves, cancels them, marks it done; carries
    only the run as last decoded (a restarted SC continues from the stored run and the partitions'
    reassignments)."""

    def __init__(self, context: context_module.Context, dispatcher: dispatcher_module.ActionDispatcher) -> None:
        # Partition specs only: a move's progress is its partition's replicas and reassignment.
        self.loop = _loop(context, dispatcher, "rebalance", self.decide, {"partitions": SPEC})
        self._meta = context.local_store.meta
        self._known: moves.Stored | None = None

    async def run(self) -> None:
        """One run of the loop, woken by changes of the stored run too while it lasts (each term of
        the SC has its own controllers: a finished one's loop is woken no more)."""
        stop_waking = self._meta.on_change(moves.KEY, self.loop.kick)
        try:
            await self.loop.run()
        finally:
            stop_waking()

    def decide(self, snapshot: local.Snapshot, changes: local.ChangesByKind) -> list[actions.Action]:
        self._known = moves.stored(snapshot, self._known)
        return moves.decide(snapshot, moves.Inputs(busy=self.loop.busy, known=self._known, faults=self.loop.faults))


_PARTITIONS = "partitions/"
# The longest the in-sync changes wait for the elections in flight (their writes may be slow).
HOLD_SECONDS = 1.0
# While this SC may not write (its claim unconfirmed), the proposals decided are looked at again
# this often: answered once it may write again, dropped with their connections if it steps down.
ANSWERS_HELD_RETRY_SECONDS = 0.2
# Partitions whose due change cannot be written, remembered so that each is logged once per reason
# (forgotten all at once past this many: each is then logged once more).
_REFUSED_REMEMBERED = 10_000


class PartitionController:
    """Partition statuses, leaders and in-sync sets, and the answers to leaders' proposals; carries
    which partitions are due a look (incremental) and which partitions each SPU hosts."""

    def __init__(
        self,
        context: context_module.Context,
        dispatcher: dispatcher_module.ActionDispatcher,
        health: health_module.HealthView,
        live: lrs.LiveReplicas,
        spus: SpuController,
        connections: cm_server.ConnectionManager | None = None,
    ) -> None:
        self._settings = context.settings
        self._active = context.active
        self._health = health
        self._live = live
        self._spus = spus
        self._connections = connections
        # Partitions to look at next: None means all of them.
        self._due: set[str] | None = None
        # Off for the pass after one that decided only leaderless partitions (see partition.decide).
        self._urgent_first = True
        self._refused: dict[str, str] = {}  # partition -> why its due change cannot be written, as logged
        # Partitions whose election this controller submitted, until each is written and back in
        # the local store: meanwhile only leaderless partitions are decided (see _hold), so the
        # SPUs hear of their new leaders before the in-sync changes take the event loop.
        self._electing: set[str] = set()
        # Once they are all back: the partitions table's epoch then, until the SPUs are told of it
        # (the pusher waits PUSH_LINGER for the rest of a burst; the in-sync changes wait for it).
        self._back_at: int | None = None
        # Partitions a pass of the hold (or the split before it) found with a leader that can lead:
        # decided once the hold ends, looked at meanwhile only if they or their SPUs change.
        self._held: set[str] = set()
        self._holding_since: float | None = None
        self._hold_ends: asyncio.TimerHandle | None = None  # wakes the loop when a hold times out
        self._answers_held: asyncio.TimerHandle | None = None  # wakes the loop to answer held proposals
        # Partitions left out of a pass because a write to them was in flight: looked at again
        # once it is back (or failed), without deciding them twice meanwhile.
        self._set_aside: set[str] = set()
        self._hosting = partition.HostingIndex()
        self._spu_ids: dict[str, int] = {}  # SPU name -> id, to find a deleted SPU's partitions
        self.loop = _loop(context, dispatcher, "partition", self.decide, {"partitions": ALL, "spus": ALL})
        if connections is not None:
            connections.on_pushed = self._on_pushed

    def _on_pushed(self) -> None:
        if self._back_at is not None:
            self.loop.kick()  # a hold waiting for this push may end

    async def run(self) -> None:
        """One run of the loop; after a crash the next one starts from a full pass."""
        self._due = None
        await self.loop.run()

    def kick_all(self) -> None:
        """Look at every partition."""
        self._due = None
        self.loop.kick()

    def on_health(self, spu_id: int) -> None:
        """An SPU's health changed: only the partitions with a replica on it can be concerned."""
        if self._due is not None and self._hosting.built:
            self._due |= self._hosting.of((spu_id,))
            self.loop.kick()
        else:
            self.kick_all()

    def on_news(self, names: set[str]) -> None:
        """Confirmations or proposals about ``names`` arrived: look at those partitions."""
        if self._due is not None:
            self._due |= names
        self.loop.kick()

    def decide(self, snapshot: local.Snapshot, changes: local.ChangesByKind) -> list[actions.Action]:
        """Incremental: only partitions that changed, were reported on, or have a replica on an SPU
        that changed (health, registration, drain); a relist or a periodic resync looks at every one.
        Proposals decided are answered on the spot (on 9004, not through the store)."""
        partition_changes, spu_changes = changes["partitions"], changes["spus"]
        if self._connections is not None:
            # The pusher forgets them too, but this pass may come first: a partition deleted and
            # created again must not be decided on its predecessor's confirmation or offsets (nor
            # lose its own, which may have come already: the pusher may have come first).
            partitions = snapshot.entries("partitions")
            for name in partition_changes.deleted:
                self._connections.forget_deleted(name, partitions)
            if partition_changes.full:
                # A relist names nothing deleted but keys created again: a partition of another uid is another one too.
                self._connections.forget_recreated(snapshot.entries("partitions"))
        self._hosting.update(snapshot, partition_changes)
        if spu_changes.full:
            self._spu_ids = {entry.name: entry.obj.spec.id for entry in snapshot.entries("spus").values()}
        due = self._due
        busy = self.loop.busy
        full = due is None or partition_changes.full or spu_changes.full or self.loop.resyncing
        hold = self._hold(full, snapshot.epochs["partitions"])
        if full or due is None:  # (a due of None makes the pass full: said again for mypy)
            names = None
            self._set_aside = set()
            self._held = set()
        else:
            names = due | {entry.name for entry in partition_changes.updated} | self._of_spus(spu_changes, snapshot.entries("partitions"))
            names |= self._set_aside
            if not hold:
                names |= self._held
                self._held = set()
            in_flight = {name for name in names if busy(_PARTITIONS + name)}
            names -= in_flight
            self._set_aside = in_flight
        # A key may be busy with another loop's write (the topic controller's create, whose echo
        # and the leaders' confirmations can come before its answer): its answer wakes this loop.
        self.loop.waiting_for = {_PARTITIONS + name for name in self._set_aside}
        self._due = set()
        settings = self._settings
        view = cluster_view(settings, self._health, self._live, self._connections)
        decided = partition.decide(
            snapshot,
            partition.Inputs(view, names, urgent_first=self._urgent_first or hold, hold_others=hold, faults=self.loop.faults),
        )
        self._urgent_first = not decided.split or hold
        self._electing.update(action.name for action in decided.actions if action.verb is actions.Verb.ELECT)
        if self._connections is not None and decided.answers:
            self._answer(decided.answers)
        for name, why in decided.refused.items():
            if self._refused.get(name) != why:  # once per partition and reason, not every pass
                if len(self._refused) >= _REFUSED_REMEMBERED:
                    self._refused.clear()
                self._refused[name] = why
                log.error("a partition change is due but cannot be written", partition=name, reason=why)
        if decided.postponed:
            # Those found with a leader that can lead: the hold's passes need not look at them again.
            self._held |= decided.not_urgent
            if self._due is not None:
                self._due |= decided.postponed - decided.not_urgent
            if not hold:
                self.loop.kick()  # else the elections' writes coming back are the next pass's cue
        if _drain_news(snapshot, partition_changes) or _decommission_news(snapshot, partition_changes):
            # A drained SPU's status follows the partitions it leads: what moved, what cannot; a
            # decommissioned one's, whether any partition still lists it.
            self._spus.loop.kick()
        if decided.preferred_waiting and self._due is not None:
            # Looked at again once these moves' writes come back (their echo wakes the loop).
            self._due |= decided.preferred_waiting
        return decided.actions

    def _answer(self, answers: list[tuple[reports.Proposal, partition_state.Answer, partition_state.State]]) -> None:
        """Send the answers of a pass, unless this SC may not write now: its claim may have ended
        unseen (paused or cut off past its lease), and the answers come from its mirror, which
        then lags the store another SC writes. Their proposals stay pending and are decided again
        shortly: answered once the claim is renewed, dropped with the SPUs' connections when this
        SC learns it lost it and steps down."""
        assert self._connections is not None
        if self._active is not None and self._active.problem() is not None:
            if self._due is not None:
                self._due |= {proposal.partition for proposal, _, _ in answers}
            if self._answers_held is None:
                self._answers_held = asyncio.get_running_loop().call_later(ANSWERS_HELD_RETRY_SECONDS, self._answer_held)
            return
        for proposal, answer, state in answers:
            self._connections.answer(proposal, _alter_isr_result(proposal, answer, state))

    def _answer_held(self) -> None:
        self._answers_held = None
        self.loop.kick()

    def _hold(self, full: bool, epoch: int) -> bool:
        """Whether this pass decides only leaderless partitions: while elections it submitted are
        not all back in the local store (each batch of them that comes back is pushed to the SPUs
        at once), then until the push of the last of them (``epoch``: the partitions table's now),
        for at most HOLD_SECONDS in all; never in a full pass."""
        if self._electing:
            busy = self.loop.busy
            self._electing = {name for name in self._electing if busy(_PARTITIONS + name)}
            if not self._electing:
                self._back_at = epoch
        if self._back_at is not None and (self._connections is None or self._connections.pushed_through(self._back_at)):
            self._back_at = None
        if full or (not self._electing and self._back_at is None):
            self._holding_since = None
            self._back_at = None
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._holding_since is None:
            self._holding_since = now
            # What waits is done at the latest then, even if nothing else wakes the loop.
            if self._hold_ends is not None:
                self._hold_ends.cancel()
            self._hold_ends = loop.call_at(now + HOLD_SECONDS, self.loop.kick)
        return now - self._holding_since < HOLD_SECONDS

    def _of_spus(self, spu_changes: local.Changes[models.Spu], partitions: Mapping[str, local.Entry[models.Partition]]) -> set[str]:
        """The partitions hosted by the SPUs in ``spu_changes`` (registered, unregistered, drained,
        recorded online or offline), by the ids they have and had."""
        if spu_changes.empty:
            return set()
        ids = set()
        # Deletions first: a name also updated was registered again, maybe under another id.
        for name in spu_changes.deleted:
            if name in self._spu_ids:
                ids.add(self._spu_ids.pop(name))
        for entry in spu_changes.updated:
            spu_id = entry.obj.spec.id
            self._spu_ids[entry.name] = spu_id
            ids.add(spu_id)
        return self._hosting.of(ids, partitions)


def _drain_news(snapshot: local.Snapshot, partition_changes: local.Changes[models.Partition]) -> bool:
    """Whether a drained SPU's status may need another look: one is still Draining (what blocks
    it follows every partition), or a Drained one leads a partition that changed."""
    draining = partition.draining_spus(snapshot)
    if not draining:
        return False
    spus = snapshot.entries("spus").values()
    if any(entry.obj.spec.drain and entry.obj.status.drain is not DRAINED for entry in spus):
        return True
    updated = partition_changes.updated if not partition_changes.full else snapshot.entries("partitions").values()
    return any(entry.obj.spec.leader in draining for entry in updated)


def _decommission_news(snapshot: local.Snapshot, partition_changes: local.Changes[models.Partition]) -> bool:
    """Whether a decommissioned SPU's status may need another look: partitions changed while one is
    not Done yet (a Done one takes no replica: plans and placement keep it empty)."""
    if partition_changes.empty:
        return False
    return any(
        entry.obj.spec.decommission and entry.obj.status.decommission is not DECOMMISSIONED
        for entry in snapshot.entries("spus").values()
    )


def _alter_isr_result(
    proposal: reports.Proposal, answer: partition_state.Answer, state: partition_state.State
) -> wire.AlterIsrResult:
    """The answer to a leader's proposal, with the committed state it adopts either way."""
    return wire.AlterIsrResult(
        partition=proposal.partition,
        error=answer.error,
        message=answer.message,
        leader_epoch=state.leader_epoch,
        partition_epoch=state.partition_epoch,
        isr=list(state.isr),
    )
