"""The reconcile pipeline: Reader -> local store -> controllers -> action dispatcher -> KV updater.

Owns the tasks and their order: controllers start only once every kind is synced, and a
stop drains the action queue (bounded) before the Reader and the store go away. The Reader runs
as long as the SC; the controllers and the dispatcher only while this SC leads its store (a term:
lead() builds them afresh on the warm mirror, step_down() drops them and their queue). Each kind's
controller (controllers.py) holds that kind's state; this module only wires them.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import structlog

from connection_manager import health as health_module
from connection_manager import lrs
from connection_manager import server as cm_server
from controller.pipeline import controllers
from controller.pipeline import dispatcher as dispatcher_module
from controller.pipeline import reader as reader_module
from store import active_sc, local

if TYPE_CHECKING:  # the context is only read: the pipeline never builds the API's parts it holds
    from controller import context as context_module

log = structlog.get_logger(__name__)


class Pipeline:
    """Wires the Reader, the dispatcher and one controller per kind, and runs them; decides nothing."""

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
        # The SC's own writes, for the Reader to take back without decoding them.
        self.echoes = local.Echoes()
        self.reader = reader_module.Reader(
            context.kv_store, context.local_store, context.metrics, history=context.history, echoes=self.echoes
        )
        self._build_term()
        # The parts built above have not run yet: the first term uses them.
        self._built_unused = True
        health.subscribe(self._on_health)
        self._reader_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_tasks: list[asyncio.Task[None]] = []

    def _build_term(self) -> None:
        """The dispatcher and the controllers of one term, with nothing queued or remembered: what a
        previous term decided or held back is not this one's to write."""
        context = self.context
        self.dispatcher = dispatcher_module.ActionDispatcher(
            dispatcher_module.KvUpdater(context.kv_store, context.metrics, self.echoes), context.metrics
        )
        if context.history is not None:
            self.dispatcher.on_result(self._record_action)
        self.dispatcher.on_result(self._tell_decisions)
        self.topics = controllers.TopicController(context, self.dispatcher)
        self.spu_groups = controllers.SpuGroupController(context, self.dispatcher)
        self.spus = controllers.SpuController(context, self.dispatcher, self.health, self.live, self.connections)
        self.partitions = controllers.PartitionController(
            context, self.dispatcher, self.health, self.live, self.spus, self.connections
        )
        self.rebalance = controllers.RebalanceController(context, self.dispatcher)
        self.controllers = (self.topics, self.spu_groups, self.spus, self.partitions, self.rebalance)
        if self.connections is not None:
            self.connections.on_news = self.partitions.on_news

    def _record_action(self, result: dispatcher_module.Result) -> None:
        """Every action's outcome goes to the history (revision: the commit's when applied)."""
        action = result.action
        assert self.context.history is not None
        self.context.history.record_action(
            action.kind, action.name, action.verb.value, action.reason, action.cause, action.cause_revision,
            result.outcome.value, result.revision, action.write_keys, result.detail,
        )

    def _tell_decisions(self, result: dispatcher_module.Result) -> None:
        """What was decided, for the live page: applied and refused actions (a conflict or an unavailable
        store is retried, and the retry's outcome is the one told)."""
        if result.outcome not in (dispatcher_module.Outcome.APPLIED, dispatcher_module.Outcome.FAILED):
            return
        action = result.action
        self.context.decisions.record(
            action.kind, action.name, action.verb.value, action.reason, action.cause, result.outcome.value, result.revision, result.detail
        )

    def _on_health(self, spu_id: int, state: health_module.Health) -> None:
        self.spus.loop.kick()
        self.partitions.on_health(spu_id)

    async def start(self, sync_timeout: float | None = None) -> None:
        """Start reading; return once every kind is synced and the controllers run."""
        await self.start_reader(sync_timeout)
        self.lead()
        log.info("pipeline started", objects={kind: len(table) for kind, table in self.context.local_store.tables.items()})

    async def start_reader(self, sync_timeout: float | None = None) -> None:
        """Start the Reader; return once every kind is synced (a standby runs only this)."""
        # A crashed Reader lists again (and so resyncs every listener).
        reader = self._reader_task = self.context.supervisor.spawn("reader", self.reader.run)
        synced = asyncio.ensure_future(self.reader.synced.wait())
        done, _ = await asyncio.wait([synced, reader], timeout=sync_timeout, return_when=asyncio.FIRST_COMPLETED)
        if synced not in done:
            synced.cancel()
            if reader in done:
                reader.result()  # the reader ended (the store closed): raise if it failed
            raise TimeoutError(f"the local store did not sync within {sync_timeout} s")
        self.context.synced.set()

    @property
    def leading(self) -> bool:
        """Whether a term runs (the controllers and the dispatcher)."""
        return bool(self._tasks)

    def lead(self, term: int | None = None) -> None:
        """Start a term on the mirror as it is: fresh controllers (each begins with a full pass)
        and a fresh dispatcher. The health view starts over, so the SPUs get their grace period
        to connect to this SC before any is judged offline. ``term``: the claim's term (an SC that
        shares its store); the dispatcher's writes are refused once it ended."""
        if self._tasks:
            return
        if not self._built_unused:
            self._build_term()
        self._built_unused = False
        guarded = self.context.kv_store
        if term is not None and isinstance(guarded, active_sc.GuardedStore):
            self.dispatcher.updater.kv_store = guarded.for_term(term)
        self.health.restart(asyncio.get_running_loop().time())
        spawn = self.context.supervisor.spawn
        # A crashed dispatcher keeps its queue and the writes in flight (see ActionDispatcher.run).
        self._tasks.append(spawn("action-dispatcher", self.dispatcher.run))
        for controller in self.controllers:
            self._loop_tasks.append(spawn(f"controller-{controller.loop.name}", controller.run))
        self._tasks.append(spawn("spu-grace", self.spus.end_grace))

    async def step_down(self, drain_timeout: float = 0.0) -> None:
        """End the term: the controllers first (nothing new is decided), then the dispatcher, given
        ``drain_timeout`` to write what is queued (0: dropped; a deposed SC's writes would be
        refused anyway). The Reader goes on."""
        for task in self._loop_tasks:
            task.cancel()
        await asyncio.gather(*self._loop_tasks, return_exceptions=True)
        if drain_timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_timeout):
                    await self.dispatcher.drained()
        if self.dispatcher.depth:
            log.warning("the term ends with actions still queued: dropped", queued=self.dispatcher.depth)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._loop_tasks.clear()

    async def stop(self, drain_timeout: float = 10.0) -> None:
        await self.step_down(drain_timeout)
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
            self._reader_task = None
