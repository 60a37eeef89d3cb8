"""Every long-lived task of the SC survives an unexpected error: it is logged with its traceback,
counted in sc_task_restarts_total{task}, restarted from a clean state, and a task that keeps
failing turns /healthz 503 naming it. Failures are injected into real components on real stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from prometheus_client import parser

from connection_manager import health as health_module
from connection_manager import wire
from controller import config, context as context_module, metrics
from controller.api import routes as api
from controller.pipeline import pipeline
from controller.reconcile import topic as topic_controller
from store import active_sc, embedded_etcd, etcd, kv, local, models
from store import supervisor as supervisor_module
from tests import builders
from tests.fixtures import daemon as daemon_fixture, tcp_proxy
from tests.fixtures.scripted_spu import ScriptedSpu

INJECTED = "etcd at 127.0.0.1:2379 failed watch: INTERNAL: injected by the test"


class BrokenWatchStore(kv.ForwardingStore):
    """A real store whose watches fail, when told to, with an error the Reader does not expect
    (as a proxy answering INTERNAL or CANCELLED would): a running watch at its next event, a new
    watch at once."""

    def __init__(self, inner: kv.KVStore) -> None:
        super().__init__(inner)
        self.failures_left = 0  # fail this many times
        self.broken = False  # fail every time
        self.raised = 0
        # Transactions writing this key wait until ``opened`` is set (a write held in flight).
        self.gated: str | None = None
        self.held = asyncio.Event()
        self.opened = asyncio.Event()

    def _fail_if_told(self) -> None:
        if self.broken or self.failures_left > 0:
            self.failures_left = max(0, self.failures_left - 1)
            self.raised += 1
            raise kv.StoreError(INJECTED)

    async def watch(self, prefix: str, from_revision: int) -> AsyncGenerator[kv.WatchEvent, None]:
        self._fail_if_told()
        async with contextlib.aclosing(self.inner.watch(prefix, from_revision)) as events:
            async for event in events:
                self._fail_if_told()
                yield event

    async def txn(self, compares: Sequence[kv.Compare], operations: Sequence[kv.Operation]) -> int:
        if self.gated is not None and any(operation.key == self.gated for operation in operations):
            self.held.set()
            await self.opened.wait()
        return await self.inner.txn(compares, operations)

    async def close(self) -> None:
        pass  # the fixture closes the inner store


class Sc:
    """The pipeline and the public API on a real store, the store's watch breakable."""

    def __init__(self, kv_store: kv.KVStore, supervisor: supervisor_module.Supervisor | None = None) -> None:
        self.store = BrokenWatchStore(kv_store)
        loop = asyncio.get_running_loop()
        self.health = health_module.HealthView(started_at=loop.time())
        extra: dict[str, Any] = {} if supervisor is None else {"supervisor": supervisor}
        self.context = context_module.Context(
            settings=config.Settings(resync_interval=60.0, spu_offline_grace=60.0),
            kv_store=self.store,
            local_store=local.LocalStore(),
            metrics=metrics.Metrics(),
            **extra,
        )
        self.context.metrics.watch_tasks(self.context.supervisor)
        self.pipeline = pipeline.Pipeline(self.context, self.health)
        self.runner = web.AppRunner(api.build_app(self.context), access_log=None)
        self.session: aiohttp.ClientSession | None = None

    @property
    def supervisor(self) -> supervisor_module.Supervisor:
        return self.context.supervisor

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.session = aiohttp.ClientSession(f"http://127.0.0.1:{self.runner.addresses[0][1]}")
        await self.pipeline.start(sync_timeout=10)

    async def stop(self) -> None:
        await self.pipeline.stop()
        if self.session is not None:
            await self.session.close()
        await self.runner.cleanup()

    async def healthz(self) -> tuple[int, dict[str, str]]:
        assert self.session is not None
        async with self.session.get("/healthz") as response:
            return response.status, await response.json()

    async def scrape(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        assert self.session is not None
        async with self.session.get("/metrics") as response:
            text = await response.text()
        return {
            tuple(sorted(sample.labels.items())): sample.value
            for family in parser.text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        }

    async def add_spu(self, spu_id: int) -> None:
        spu = builders.spu(spu_id, resolution="Init")
        await self.store.inner.create(spu.key, models.encode(spu))
        self.health.set(spu_id, health_module.Health.ONLINE, asyncio.get_running_loop().time())

    async def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1) -> None:
        topic = models.Topic.model_validate(
            {"name": name, "spec": {"partitions": partitions, "replicationFactor": replication_factor}}
        )
        await self.store.inner.create(topic.key, models.encode(topic))

    async def eventually(self, check: Callable[[], Any], timeout: float = 10.0) -> None:
        await builders.eventually(check, timeout)

    def mirrored(self, kind: str, name: str) -> models.AnyObject | None:
        entry = self.context.local_store[kind].get(name)
        return None if entry is None else entry.obj

    async def provisioned(self, name: str) -> None:
        async def check() -> None:
            stored = await self.store.inner.get(models.object_key("topics", name))
            assert stored is not None
            topic = models.decode("topics", stored.value)
            assert topic.status.resolution is models.TopicResolution.PROVISIONED, topic
            listed = await self.store.inner.list("partitions/")
            assert sum(models.decode("partitions", item.value).topic == name for item in listed.items) == 1

        await self.eventually(check)


@contextlib.asynccontextmanager
async def running(kv_store: kv.KVStore, supervisor: supervisor_module.Supervisor | None = None) -> AsyncIterator[Sc]:
    sc = Sc(kv_store, supervisor)
    try:
        await sc.start()
        yield sc
    finally:
        await sc.stop()


def failures_logged(caplog: pytest.LogCaptureFixture, task: str) -> list[str]:
    """The supervisor's log lines about ``task``, each with its traceback attached."""
    found = []
    for record in caplog.records:
        if record.name == "store.supervisor" and record.getMessage().startswith(f"task {task} failed"):
            assert record.exc_info is not None, record.getMessage()
            found.append(record.getMessage())
    return found


# ---------------------------------------------------------------------------- the Reader


async def test_the_reader_comes_back_after_an_unexpected_watch_error_and_the_mirror_moves_again(
    kv_store: kv.KVStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="store.supervisor")
    async with running(kv_store) as sc:
        sc.store.failures_left = 1
        await sc.add_spu(0)  # the Reader's watch breaks at this event
        # Written after the failure: it must reach the local store all the same.
        await sc.eventually(lambda: _assert(sc.store.raised == 1))
        await sc.add_spu(1)
        await sc.eventually(lambda: _assert(sc.mirrored("spus", "spu-1") is not None), timeout=10)
        assert sc.mirrored("spus", "spu-0") is not None
        assert sc.supervisor.restarts["reader"] == 1
        assert failures_logged(caplog, "reader") == [
            f"task reader failed (StoreError: {INJECTED}); restarting it in 0.1 s (failure 1 in a row, restart 1)"
        ]
        assert (await sc.scrape("sc_task_restarts_total"))[(("task", "reader"),)] == 1.0
        assert await sc.healthz() == (200, {"status": "ok"})


def _assert(condition: bool) -> None:
    assert condition


async def test_a_reader_failing_again_and_again_turns_healthz_503_naming_it_until_it_recovers(
    kv_store: kv.KVStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="store.supervisor")
    supervisor = supervisor_module.Supervisor(initial_backoff=0.05, max_backoff=0.2, healthy_after=1.0, failing_after=3)
    async with running(kv_store, supervisor) as sc:
        sc.store.broken = True
        await sc.add_spu(0)

        async def failing() -> None:
            assert await sc.healthz() == (
                503, {"status": "failing", "reason": f"task reader keeps failing: StoreError: {INJECTED}"}
            )

        await sc.eventually(failing)
        assert (await sc.scrape("sc_task_failing"))[(("task", "reader"),)] == 1.0
        sc.store.broken = False
        await sc.add_spu(1)
        await sc.eventually(lambda: _assert(sc.mirrored("spus", "spu-1") is not None))

        async def healthy() -> None:
            assert await sc.healthz() == (200, {"status": "ok"})

        await sc.eventually(healthy)
        scraped = await sc.scrape("sc_task_failing")
        assert scraped[(("task", "reader"),)] == 0.0
        restarts = sc.supervisor.restarts["reader"]
        assert restarts >= 3 and restarts == sc.store.raised == len(failures_logged(caplog, "reader"))
        assert (await sc.scrape("sc_task_restarts_total"))[(("task", "reader"),)] == restarts


# ---------------------------------------------------------------------------- the controller loops


async def test_a_controller_whose_decision_raises_comes_back_with_a_full_pass(
    kv_store: kv.KVStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic that made the decision raise was already taken from the listeners: only a full
    first pass after the restart sees it again."""
    caplog.set_level(logging.ERROR, logger="store.supervisor")
    async with running(kv_store) as sc:
        await sc.add_spu(0)
        real_decide = topic_controller.decide
        calls: list[int] = []

        def decide_raising_once(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("injected fault in the topic controller")
            return real_decide(*args, **kwargs)

        await sc.eventually(lambda: _assert(sc.pipeline.topics.loop.passes >= 1))
        monkeypatch.setattr(topic_controller, "decide", decide_raising_once)
        await sc.create_topic("orders")
        await sc.provisioned("orders")
        await sc.create_topic("later")
        await sc.provisioned("later")
        assert sc.supervisor.restarts["controller-topic"] == 1
        assert failures_logged(caplog, "controller-topic") == [
            "task controller-topic failed (RuntimeError: injected fault in the topic controller); "
            "restarting it in 0.1 s (failure 1 in a row, restart 1)"
        ]
        assert {task: count for task, count in sc.supervisor.restarts.items() if count} == {"controller-topic": 1}


async def test_a_topic_whose_decision_raises_stops_only_itself(kv_store: kv.KVStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug that one object's values trigger used to stop its controller for every object: the
    task raised, came back with a full pass, met the same object and raised again, for good. Now
    that object is left as it is (logged with its name, counted), and the others go on."""
    async with running(kv_store) as sc:
        await sc.add_spu(0)
        real_validate = topic_controller.validate

        def validate(topic: models.Topic, *args: Any, **kwargs: Any) -> Any:
            if topic.name == "poison":
                raise RuntimeError("injected fault for topic poison")
            return real_validate(topic, *args, **kwargs)

        monkeypatch.setattr(topic_controller, "validate", validate)
        with structlog.testing.capture_logs() as logged:
            await sc.create_topic("poison")
            await sc.create_topic("orders")
            await sc.provisioned("orders")
            await sc.create_topic("later")
            await sc.provisioned("later")
        poison = sc.mirrored("topics", "poison")
        assert isinstance(poison, models.Topic) and poison.status.resolution is models.TopicResolution.INIT
        assert not any(sc.supervisor.restarts.values())
        faults = await sc.scrape("sc_reconcile_faults_total")
        assert faults[(("controller", "topic"), ("kind", "topics"))] >= 1
        said = [entry for entry in logged if entry["event"].startswith("a decision raised")]
        assert [(entry["controller"], entry["kind"], entry["name"], entry["error"]) for entry in said] == [
            ("topic", "topics", "poison", "RuntimeError: injected fault for topic poison")
        ]
        # Fixed (an SC upgraded, here the fault taken away): the topic is decided again when the
        # SPUs change, as an invalid one would be.
        monkeypatch.setattr(topic_controller, "validate", real_validate)
        await sc.add_spu(1)
        await sc.provisioned("poison")


# ---------------------------------------------------------------------------- the action dispatcher


async def test_a_crashed_dispatcher_keeps_its_queue_and_the_write_in_flight(
    kv_store: kv.KVStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its loop dies (a bug, injected) while a provision is being written: that write completes and
    is reported, and the actions decided meanwhile are written by the restarted loop."""
    caplog.set_level(logging.ERROR, logger="store.supervisor")
    async with running(kv_store) as sc:
        await sc.add_spu(0)
        dispatcher = sc.pipeline.dispatcher
        sc.store.gated = "topics/orders"
        await sc.create_topic("orders")
        await sc.store.held.wait()
        real_delay = dispatcher._next_retry_delay
        crashes: list[int] = []

        def delay_raising_once(now: float) -> float | None:
            if not crashes:
                crashes.append(1)
                raise RuntimeError("injected fault in the dispatcher")
            return real_delay(now)

        monkeypatch.setattr(dispatcher, "_next_retry_delay", delay_raising_once)
        await sc.create_topic("during")  # wakes the dispatcher, whose loop then raises
        await sc.eventually(lambda: _assert(sc.supervisor.restarts["action-dispatcher"] == 1))
        sc.store.opened.set()
        await sc.provisioned("orders")
        await sc.provisioned("during")
        await sc.create_topic("after")
        await sc.provisioned("after")
        await sc.eventually(lambda: _assert(dispatcher.depth == 0 and not dispatcher.busy("topics/orders")))
        assert failures_logged(caplog, "action-dispatcher") == [
            "task action-dispatcher failed (RuntimeError: injected fault in the dispatcher); "
            "restarting it in 0.1 s (failure 1 in a row, restart 1)"
        ]


# ---------------------------------------------------------------------------- the connection manager


async def test_the_spu_pusher_comes_back_and_tells_every_spu_what_it_missed(
    settings: config.Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change being pushed when the pusher crashed was taken from its listeners: the restarted
    pusher sends each connected SPU a full Sync, then Updates again."""
    caplog.set_level(logging.ERROR, logger="store.supervisor")
    async with daemon_fixture.running(settings) as sc, aiohttp.ClientSession() as client:
        connections = sc.daemon.connections
        assert connections is not None and sc.daemon.private_port is not None
        await sc.register_spu(0, online=False)
        spu = ScriptedSpu(client, sc.daemon.private_port, 0)
        assert isinstance(await spu.connect(), wire.Accepted)
        try:
            await spu.wait_for(lambda: any(isinstance(message, wire.Sync) for message in spu.received))
            real_push = connections.push
            pushes: list[int] = []

            def push_raising_once(*args: Any) -> None:
                pushes.append(1)
                if len(pushes) == 1:
                    raise RuntimeError("injected fault in the pusher")
                real_push(*args)

            monkeypatch.setattr(connections, "push", push_raising_once)
            status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "orders", "spec": {"partitions": 1, "replicationFactor": 1}})
            assert status in (201, 202), body
            await spu.wait_for(lambda: "orders-0" in spu.replicas, timeout=10)
            syncs = [message for message in spu.received if isinstance(message, wire.Sync)]
            assert len(syncs) == 2 and "orders-0" in {info.partition for info in syncs[1].replicas}
            status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "later", "spec": {"partitions": 1, "replicationFactor": 1}})
            assert status in (201, 202), body
            await spu.wait_for(lambda: "later-0" in spu.replicas, timeout=10)
            assert isinstance(spu.received[-1], wire.Update)
            assert sc.daemon.context is not None and sc.daemon.context.supervisor.restarts["cm-pusher"] == 1
            assert failures_logged(caplog, "cm-pusher") == [
                "task cm-pusher failed (RuntimeError: injected fault in the pusher); "
                "restarting it in 0.1 s (failure 1 in a row, restart 1)"
            ]
        finally:
            await spu.close()


# ---------------------------------------------------------------------------- the daemon


async def test_every_long_lived_task_of_the_daemon_is_supervised_and_exported(
    settings: config.Settings, tmp_path: Path
) -> None:
    async with daemon_fixture.running(settings.model_copy(update={"history_dir": tmp_path / "history"})) as sc:
        assert sc.daemon.context is not None
        supervisor = sc.daemon.context.supervisor
        expected = [
            "action-dispatcher", "active-sc-lease", "api-group-settlements", "api-topic-settlements", "cm-pusher",
            "controller-partition", "controller-rebalance", "controller-spu", "controller-spu-group", "controller-topic",
            "fluvio-admin-waits", "history-writer", "reader", "sc-role", "spu-grace",
        ]
        assert supervisor.tasks == expected
        async with sc.session.get("/metrics") as response:
            text = await response.text()
        restarts = {
            sample.labels["task"]: sample.value
            for family in parser.text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "sc_task_restarts_total"
        }
        assert restarts == dict.fromkeys(expected, 0.0)


# ---------------------------------------------------------------------------- a store that is not ours any more


@pytest.mark.etcd
async def test_a_store_answering_for_another_cluster_turns_healthz_503_naming_both_clusters(
    etcd_server: embedded_etcd.EmbeddedEtcd, durable_etcd_server: embedded_etcd.EmbeddedEtcd
) -> None:
    """The SC's etcd endpoint starts answering for another cluster (pointed elsewhere, a member
    replaced by a fresh cluster): the store stops for good (store/etcd.py), and /healthz must say
    so, with both cluster ids, for as long as it lasts, so that an operator or a probe sees it."""
    async with tcp_proxy.TcpProxy(etcd_server.host, etcd_server.client_port) as proxy:
        settings = config.Settings(
            store=config.StoreKind.ETCD, etcd_endpoints=[proxy.endpoint], key_prefix=f"/sc-test/{uuid.uuid4().hex}/",
            **daemon_fixture.COMMON_SETTINGS,
        )  # fmt: skip
        async with daemon_fixture.running(settings) as sc:
            assert (await sc.call("GET", "/healthz")) == (200, {"status": "ok"})
            store = sc.daemon.context.kv_store  # type: ignore[union-attr]  # the daemon runs: its context is set
            while isinstance(store, active_sc.GuardedStore):
                store = store.inner
            assert isinstance(store, etcd.EtcdStore)
            first = store.cluster_id
            proxy.target_port = durable_etcd_server.client_port
            proxy.sever()

            async with await etcd.EtcdStore.open(durable_etcd_server.endpoints, "/sc-test/", 2.0) as other:
                found = other.cluster_id
            stopped = {
                "status": "store-stopped",
                "reason": f"etcd at {proxy.endpoint} now answers for cluster {found:x}, not {first:x} where this SC's "
                "state is: the SC stops using the store; point it back at its own cluster, or restart it to start "
                "afresh on this one",
            }

            async def unhealthy() -> None:
                assert (await sc.call("GET", "/healthz")) == (503, stopped)

            await sc.eventually(unhealthy)
            # For good: even once the endpoint answers for the first cluster again.
            proxy.target_port = etcd_server.client_port
            proxy.sever()
            await asyncio.sleep(0.5)
            await unhealthy()
