"""The reconcile pipeline: Reader -> local store -> controllers -> action dispatcher -> KV updater.

Owns the tasks and their order: controllers start only once every kind is synced, and a
stop drains the action queue (bounded) before the Reader and the store go away. Each kind's
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
from store import local

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
        echoes = local.Echoes()
        self.reader = reader_module.Reader(
            context.kv_store, context.local_store, context.metrics, history=context.history, echoes=echoes
        )
        self.dispatcher = dispatcher_module.ActionDispatcher(
            dispatcher_module.KvUpdater(context.kv_store, context.metrics, echoes), context.metrics
        )
        if context.history is not None:
            self.dispatcher.on_result(self._record_action)
        self.dispatcher.on_result(self._tell_decisions)
        self.topics = controllers.TopicController(context, self.dispatcher)
        self.spu_groups = controllers.SpuGroupController(context, self.dispatcher)
        self.spus = controllers.SpuController(context, self.dispatcher, health, self.live, connections)
        self.partitions = controllers.PartitionController(
            context, self.dispatcher, health, self.live, self.spus, connections
        )
        self.rebalance = controllers.RebalanceController(context, self.dispatcher)
        self.controllers = (self.topics, self.spu_groups, self.spus, self.partitions, self.rebalance)
        health.subscribe(self._on_health)
        if connections is not None:
            connections.on_news = self.partitions.on_news
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_tasks: list[asyncio.Task[None]] = []

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
        for controller in self.controllers:
            self._loop_tasks.append(spawn(f"controller-{controller.loop.name}", controller.run))
        self._tasks.append(spawn("spu-grace", self.spus.end_grace))
        self.context.synced.set()
        log.info("pipeline started", objects={kind: len(table) for kind, table in self.context.local_store.tables.items()})

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
