"""The reconcile pipeline: Reader -> local store -> controllers -> action dispatcher -> KV updater.

Owns the tasks and their order: controllers start only once every kind is synced, and a
stop drains the action queue (bounded) before the Reader and the store go away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping

import structlog

from connection_manager import health as health_module
from connection_manager import lrs, reports, wire
from connection_manager import server as cm_server
from controller import context as context_module
from controller import dispatcher as dispatcher_module
from controller import loop as loop_module
from controller import reader as reader_module
from controller import actions, partition, partition_state, spu, spu_group, spu_ids, topic
from store import kv, local, models

log = structlog.get_logger(__name__)

SPEC, STATUS, ALL = local.Part.SPEC, local.Part.STATUS, local.Part.ALL
DRAINED = models.SpuDrain.DRAINED


class Pipeline:
    def __init__(
        self,
        context: context_module.Context,
        health: health_module.HealthView,
        connections: cm_server.ConnectionManager | None = None,
    ) -> None:
        self.context = context
        self.health = health
        self.connections = connections
        self.live = connections.live if connections is not None else lrs.LiveReplicas()
        settings = context.settings
        # The SC's own writes, for the Reader to take back without decoding them.
        echoes = local.Echoes()
        self.reader = reader_module.Reader(
            context.kv_store, context.local_store, context.metrics, history=context.history, echoes=echoes
        )
        self.dispatcher = dispatcher_module.ActionDispatcher(
            dispatcher_module.KvUpdater(context.kv_store, context.metrics, echoes), context.metrics
        )
        if context.history is not None:
            self.dispatcher.on_result(self._record_action)
        self.loops = [
            # Partition statuses too: the echo of a status write may be what frees a partition
            # this loop set aside (an orphan to delete whose write lost to a status update).
            self._loop("topic", self._decide_topics, {"topics": ALL, "spus": ALL, "partitions": ALL}),
            self._loop("spu-group", spu_group.decide, {"spu-groups": SPEC, "spus": SPEC}),
            self._loop("spu", self._decide_spus, {"spus": ALL}),
            self._loop("partition", self._decide_partitions, {"partitions": ALL, "spus": ALL}),
        ]
        self._topic_loop, self._spu_loop, self._partition_loop = self.loops[0], self.loops[-2], self.loops[-1]
        # InvalidConfig / InsufficientResources topics are re-run once SPUs change, until a pass
        # has had the placement chain free to try them.
        self._retry_unplaced = True
        # What one request to the store may hold: sizes topics and provision transactions.
        self._request_size = kv.request_size(context.kv_store)
        # Partitions the partition controller must look at next: None means all of them.
        self._partitions_due: set[str] | None = None
        self._hosting = partition.HostingIndex()
        self._spu_ids: dict[str, int] = {}  # SPU name -> id, to find a deleted SPU's partitions
        self._shadowed_spus: list[tuple[int, str, str]] = []
        health.subscribe(self._on_health)
        if connections is not None:
            connections.on_news = self._on_news
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_tasks: list[asyncio.Task[None]] = []

    def _loop(self, name: str, decide: loop_module.Decide, listens_to: Mapping[str, local.Part]) -> loop_module.ControllerLoop:
        return loop_module.ControllerLoop(
            name,
            decide,
            listens_to,
            self.context.local_store,
            self.dispatcher,
            self.context.metrics,
            self.context.settings.resync_interval,
        )

    def _record_action(self, result: dispatcher_module.Result) -> None:
        """Every action's outcome goes to the history (revision: the commit's when applied)."""
        action = result.action
        assert self.context.history is not None
        self.context.history.record_action(
            action.kind, action.name, action.verb.value, action.reason, action.cause, action.cause_revision,
            result.outcome.value, result.revision, action.write_keys, result.detail,
        )

    def _decide_spus(self, snapshot: local.Snapshot, changes: Mapping[str, local.Changes]) -> list:
        shadowed = spu_ids.shadowed(snapshot.entries("spus"), snapshot.meta)
        if shadowed != self._shadowed_spus:
            # Only writes behind the SC's back make SPUs share an id: say so once per change.
            self._shadowed_spus = shadowed
            if shadowed:
                log.error("SPUs share an id", problem=spu_ids.describe_shadowed(shadowed))
        now = asyncio.get_running_loop().time()
        grace = self.context.settings.spu_offline_grace
        return spu.decide(snapshot, self.health.snapshot(), now, self.health.started_at, grace, self.cluster_view())

    def _decide_topics(self, snapshot: local.Snapshot, changes: Mapping[str, local.Changes]) -> list:
        loop = self._topic_loop
        full = loop.resyncing
        if full or any(change.full for change in changes.values()) or not changes["spus"].empty:
            self._retry_unplaced = True
        chain_free = not loop.busy(topic.CHAIN_KEY)
        decided = topic.decide(
            snapshot, None if full else changes, loop.busy, self._retry_unplaced, self._request_size, loop.failed,
            placers=self.context.placers,
        )
        if chain_free and not any(action.verb is actions.Verb.PROVISION for action in decided):
            self._retry_unplaced = False  # every unplaced topic was tried with the current SPUs
        return decided

    def _on_health(self, spu_id: int, state: health_module.Health) -> None:
        self._spu_loop.kick()
        if self._partitions_due is not None and self._hosting.built:
            # Only the partitions with a replica on it can be concerned.
            self._partitions_due |= self._hosting.of((spu_id,))
            self._partition_loop.kick()
        else:
            self._kick_all_partitions()

    def _kick_all_partitions(self) -> None:
        self._partitions_due = None
        self._partition_loop.kick()

    def cluster_view(self) -> partition.ClusterView:
        """What the partition decisions read beyond the store, from the SPUs' current connections."""
        settings = self.context.settings
        connections = self.connections
        if connections is None:
            return partition.ClusterView(
                self.health.snapshot(), {}, settings.unclean_leader_election, settings.leader_rebalance_batch
            )
        return partition.ClusterView(
            health=self.health.snapshot(),
            live=self.live.view,
            unclean_election=settings.unclean_leader_election,
            rebalance_batch=settings.leader_rebalance_batch,
            incarnations=connections.incarnations,
            proposals=connections.proposals,
            confirmed=connections.confirmed,
            max_hw=self.live.max_hws,
        )

    def _on_news(self, names: set[str]) -> None:
        """Confirmations or proposals about ``names`` arrived: look at those partitions."""
        if self._partitions_due is not None:
            self._partitions_due |= names
        self._partition_loop.kick()

    def _decide_partitions(self, snapshot: local.Snapshot, changes: Mapping[str, local.Changes]) -> list:
        """Incremental: only partitions that changed, were reported on, or have a replica on an SPU
        that changed (health, registration, drain); a relist or a periodic resync looks at every one."""
        partition_changes, spu_changes = changes["partitions"], changes["spus"]
        self._hosting.update(snapshot, partition_changes)
        if spu_changes.full:
            self._spu_ids = {entry.name: entry.obj.spec.id for entry in snapshot.entries("spus").values()}  # type: ignore[attr-defined]
        due = self._partitions_due
        if due is None or partition_changes.full or spu_changes.full or self._partition_loop.resyncing:
            names = None
        else:
            names = due | {entry.name for entry in partition_changes.updated} | self._of_spus(spu_changes)
        self._partitions_due = set()
        settings = self.context.settings
        decided = partition.decide(snapshot, names, self.cluster_view())
        if self.connections is not None:
            for proposal, answer, state in decided.answers:
                self.connections.answer(proposal, _alter_isr_result(proposal, answer, state))
        if decided.postponed:
            self._partitions_due = None if self._partitions_due is None else self._partitions_due | decided.postponed
            self._partition_loop.kick()
        if self._drain_news(snapshot, partition_changes):
            # A drained SPU's status follows the partitions it leads: what moved, what cannot.
            self._spu_loop.kick()
        preferred = sum(action.cause == partition.CAUSE_PREFERRED for action in decided.actions)
        if settings.leader_rebalance_batch and preferred >= settings.leader_rebalance_batch:
            # More may be due: look at all of them again once these writes come back.
            self._partitions_due = None
        return decided.actions

    def _of_spus(self, spu_changes: local.Changes) -> set[str]:
        """The partitions hosted by the SPUs in ``spu_changes`` (registered, unregistered, drained,
        recorded online or offline), by the ids they have and had."""
        if spu_changes.empty:
            return set()
        ids = set()
        for entry in spu_changes.updated:
            spu_id = entry.obj.spec.id  # type: ignore[attr-defined]
            self._spu_ids[entry.name] = spu_id
            ids.add(spu_id)
        for name in spu_changes.deleted:
            if name in self._spu_ids:
                ids.add(self._spu_ids.pop(name))
        return self._hosting.of(ids)

    @staticmethod
    def _drain_news(snapshot: local.Snapshot, partition_changes: local.Changes) -> bool:
        """Whether a drained SPU's status may need another look: one is still Draining (what
        blocks it follows every partition), or a Drained one leads a partition that changed."""
        draining = partition.draining_spus(snapshot)
        if not draining:
            return False
        spus = snapshot.entries("spus").values()
        if any(entry.obj.spec.drain and entry.obj.status.drain is not DRAINED for entry in spus):  # type: ignore[attr-defined]
            return True
        updated = partition_changes.updated if not partition_changes.full else snapshot.entries("partitions").values()
        return any(entry.obj.spec.leader in draining for entry in updated)  # type: ignore[attr-defined]

    async def start(self, sync_timeout: float | None = None) -> None:
        """Start reading; return once every kind is synced and the controllers run."""
        spawn = self.context.supervisor.spawn
        # A crashed Reader lists again (and so resyncs every listener); the dispatcher keeps its
        # queue and the writes in flight (see ActionDispatcher.run).
        self._tasks.append(spawn("reader", self.reader.run))
        self._tasks.append(spawn("action-dispatcher", self.dispatcher.run))
        synced = asyncio.ensure_future(self.reader.synced.wait())
        done, _ = await asyncio.wait([synced, self._tasks[0]], timeout=sync_timeout, return_when=asyncio.FIRST_COMPLETED)
        if synced not in done:
            synced.cancel()
            if self._tasks[0] in done:
                self._tasks[0].result()  # the reader ended (the store closed): raise if it failed
            raise TimeoutError(f"the local store did not sync within {sync_timeout} s")
        for controller in self.loops:
            self._loop_tasks.append(spawn(f"controller-{controller.name}", functools.partial(self._run_controller, controller)))
        grace = self.context.settings.spu_offline_grace
        self._tasks.append(spawn("spu-grace", functools.partial(self._grace_kick, grace)))
        self.context.synced.set()
        log.info("pipeline started", objects={kind: len(table) for kind, table in self.context.local_store.tables.items()})

    async def _run_controller(self, controller: loop_module.ControllerLoop) -> None:
        """One run of a controller loop; after a crash the next one starts from a full pass, its
        incremental state forgotten."""
        if controller is self._partition_loop:
            self._partitions_due = None
        elif controller is self._topic_loop:
            self._retry_unplaced = True
        await controller.run()

    async def _grace_kick(self, grace: float) -> None:
        # SPUs recorded Online that never reconnect turn Offline when the grace period ends.
        await asyncio.sleep(max(0.0, self.health.started_at + grace - asyncio.get_running_loop().time()))
        self._spu_loop.kick()

    async def stop(self, drain_timeout: float = 10.0) -> None:
        for task in self._loop_tasks:
            task.cancel()
        await asyncio.gather(*self._loop_tasks, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.dispatcher.drained(), drain_timeout)
        if self.dispatcher.depth:
            log.warning("stopping with actions still queued", queued=self.dispatcher.depth)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._loop_tasks.clear()


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
