"""One leader per store: `sc run` uses only the etcd it started, and runs as a hot standby where another SC
is active. Real `sc run` processes, each with its own data dir, on free ports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import etcd3aio
from etcd3aio.kv import KVService
import pytest

from controller import config
from store import active_sc, embedded_etcd, etcd, history, kv, models
from tests.fixtures import daemon as daemon_fixture
from tests.fixtures.sc_run import ScRun

pytestmark = pytest.mark.etcd


@pytest.fixture
def processes() -> Iterator[list[ScRun]]:
    started: list[ScRun] = []
    yield started
    for process in started:
        process.stop()


async def test_a_second_sc_run_on_the_same_etcd_ports_fails_within_seconds_naming_port_owner_and_flag(
    tmp_path: Path, processes: list[ScRun]
) -> None:
    etcd_ports = (client_port, _) = embedded_etcd.free_port_pair()
    first = ScRun(tmp_path / "first", etcd_ports)
    processes.append(first)
    first.start()
    await first.wait_healthy()
    etcd_pid = int((tmp_path / "first" / "etcd.lock").read_text().split("etcd pid ")[1])

    second = ScRun(tmp_path / "second", etcd_ports)
    processes.append(second)
    second.start()
    code, stderr = second.wait_exit(timeout=30)  # the test's patience: on the old code it never exited
    assert code == 1
    # At once: the busy port was seen before etcd was launched (no etcd log: no start to wait out),
    # which a wall-clock bound would only guess at on a busy machine.
    assert (tmp_path / "first" / embedded_etcd.LOG_FILE).exists()
    assert not (tmp_path / "second" / embedded_etcd.LOG_FILE).exists()
    assert stderr.strip().splitlines()[-1] == (
        f"error: the embedded etcd cannot start: its client port 127.0.0.1:{client_port} is already in use by "
        f"pid {etcd_pid} (etcd, data dir {tmp_path / 'first' / 'etcd'}); stop that process, or give this SC "
        f"another client port with --embedded-etcd-client-port (or SC_EMBEDDED_ETCD_CLIENT_PORT)"
    )
    await first.wait_healthy(timeout=5)


# ---------------------------------------------------------------------------- one active SC per store


@contextlib.asynccontextmanager
async def store_of(settings: config.Settings) -> AsyncIterator[kv.KVStore]:
    """The test's own client of the store a daemon with ``settings`` uses."""
    store = await etcd.EtcdStore.open(settings.etcd_endpoints, settings.key_prefix, daemon_fixture.REQUEST_TIMEOUT)
    try:
        yield store
    finally:
        await store.close()


def claim_of(identity: active_sc.Identity) -> bytes:
    return identity.encode()


INTRUDER = active_sc.Identity("intruder", "elsewhere", 4242, "10.0.0.9:9003", "2026-01-05T10:00:00+00:00")


async def claim_over(store: etcd.EtcdStore, identity: active_sc.Identity, claimed: kv.KeyValue) -> None:
    """Put ``identity``'s claim over ``claimed`` under a lease of its own (kept for a minute), as
    another SC's claim is held: a claim no lease holds is no SC's, and the first candidate deletes it.
    The store's API claims only absent keys; etcd's own transaction replaces it in one step."""
    lease = await store.grant_lease(60)
    client = etcd3aio.Etcd3Client(list(store.endpoints))
    await client.connect()
    try:
        assert client.kv is not None
        key = (store.prefix + active_sc.KEY).encode()
        response = await client.kv.txn(
            [KVService.txn_compare_value(key, claimed.value)], [KVService.txn_op_put(key, claim_of(identity), lease=lease.id)]
        )
        assert response.succeeded, "the claim changed before the test could replace it"
    finally:
        await client.close()


async def test_a_second_sc_on_a_store_with_a_leader_runs_as_its_hot_standby(
    etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path
) -> None:
    """It starts (no refusal), serves reads from its mirror, answers writes with a redirect to the
    leader, lists itself as a standby; once the leader stops, it leads, saying the leader resigned."""
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=2)
    recorded = settings.model_copy(update={"history_dir": tmp_path / "history"})
    async with daemon_fixture.running(settings) as first, daemon_fixture.running(recorded) as second:
        assert first.daemon.active is not None and first.daemon.active.identity is not None
        assert second.daemon.active is not None and second.daemon.active.identity is not None
        leader, standby = first.daemon.active.identity, second.daemon.active.identity
        assert leader.address == f"127.0.0.1:{first.daemon.public_port}" and leader.pid == os.getpid()
        assert leader.private == f"127.0.0.1:{first.daemon.private_port}"
        assert await second.call("GET", "/healthz") == (200, {"status": "ok"})
        status, body = await first.call("POST", "/v1/topics?timeout=0", {"name": "orders", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert status == 202, body

        async def mirrored() -> None:
            assert (await second.call("GET", "/v1/topics/orders"))[0] == 200

        await second.eventually(mirrored)
        async with second.session.post(
            "/v1/topics?timeout=0", json={"name": "refused", "spec": {"partitions": 1, "replicationFactor": 1}},
            allow_redirects=False,
        ) as response:  # fmt: skip
            assert response.status == 307
            assert response.headers["Location"] == f"http://{leader.address}/v1/topics?timeout=0"
        status, cluster = await second.call("GET", "/v1/cluster")
        assert status == 200
        assert cluster["self"] == {"id": standby.id, "role": "standby", "address": standby.address}
        assert cluster["leader"]["id"] == leader.id and cluster["standbys"] == [{"id": standby.id, "address": standby.address}]
        assert await first.kv_store.get("topics/refused") is None
        await first.daemon.stop()
        active = second.daemon.active

        async def took_over() -> None:
            assert active.state is active_sc.State.ACTIVE
            assert (await second.call("GET", "/v1/cluster"))[1]["self"]["role"] == "leader"

        await second.eventually(took_over)
        assert active.takeover is not None and (active.takeover.cause, active.takeover.previous) == ("resigned", leader)
        status, body = await second.call("POST", "/v1/topics?timeout=0", {"name": "after", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert status == 202, body
        metrics = await second.call_text("GET", "/metrics")
        assert 'sc_takeovers_total{cause="resigned"} 1.0' in metrics and "sc_leader 1.0" in metrics
    # Its history has the takeover, with its cause and the leader before it.
    terms = [record for record in history.HistoryReader(tmp_path / "history").records() if record["type"] == "takeover"]
    assert [(record["name"], record["cause"], record["detail"], record["causeRevision"], record["revision"]) for record in terms] == [
        (standby.id, "resigned", leader.id, first.daemon.active.epoch, active.epoch)
    ]
    # Stopped, each gave its candidacy and claim up: nobody waits for them to expire.
    async with store_of(settings) as store:
        assert await store.get(active_sc.KEY) is None
        assert (await store.list(active_sc.CANDIDATES)).items == []


async def test_a_claim_left_by_a_crashed_sc_delays_the_next_start_by_its_ttl_at_most(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=6)
    async with store_of(settings) as store:
        crashed = await store.grant_lease(2)  # never kept alive: its SC is gone
        await store.claim(active_sc.KEY, claim_of(INTRUDER), crashed.id)
        async with daemon_fixture.running(settings) as sc:
            stored = await store.get(active_sc.KEY)
            assert sc.daemon.active is not None and sc.daemon.active.identity is not None
            assert stored is not None and stored.value == sc.daemon.active.identity.encode()


async def test_an_sc_whose_claim_was_deleted_claims_it_again_and_writes_again(
    etcd_server: embedded_etcd.EmbeddedEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="store.active_sc")
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=2)
    async with daemon_fixture.running(settings) as sc:
        first = await sc.kv_store.get(active_sc.KEY)
        assert first is not None
        await sc.kv_store.delete(active_sc.KEY)

        async def claimed_again() -> None:
            again = await sc.kv_store.get(active_sc.KEY)
            assert again is not None and again.value == first.value and again.create_revision > first.create_revision
            assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})
            assert (await sc.call("GET", "/v1/cluster"))[1]["self"]["role"] == "leader"

        await sc.eventually(claimed_again)
        status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "orders", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert status == 202, body
        # The second term's controllers write, through a store bound to that term.
        assert sc.daemon.active is not None and sc.daemon.pipeline is not None and sc.daemon.active.term == 2
        term_store = sc.daemon.pipeline.dispatcher.updater.kv_store
        assert isinstance(term_store, active_sc.GuardedStore) and term_store.term == 2

        async def decided() -> None:
            topic = await sc.read("topics", "orders")
            assert isinstance(topic, models.Topic) and topic.status.resolution is not models.TopicResolution.INIT

        await sc.eventually(decided)
        key = f"{settings.key_prefix}meta/active-sc"
        messages = [record.getMessage() for record in caplog.records]
        assert messages[0].startswith(f"this SC is now the active SC of its store ({key}, epoch {first.create_revision}, ")
        assert messages[1] == (
            f"this SC lost its claim on {key} ({key} was deleted): it steps down to a standby and joins the queue again"
        )
        # Alone in the queue, it is first again; its own claim was the one deleted.
        assert messages[2].endswith("takeover cause unclaimed, previous leader none") and len(messages) == 3


async def test_an_sc_whose_claim_another_sc_took_steps_down_and_stays_up_as_a_standby(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=2)
    async with daemon_fixture.running(settings) as sc:
        active = sc.daemon.active
        assert active is not None and sc.daemon.context is not None
        await sc.register_spu(0)
        claimed = await sc.kv_store.get(active_sc.KEY)
        assert claimed is not None
        # Another SC's claim replaces it (under that SC's lease, which the test keeps alive).
        assert isinstance(sc.kv_store, etcd.EtcdStore)
        await claim_over(sc.kv_store, INTRUDER, claimed)

        async def stepped_down() -> None:
            assert active.state is active_sc.State.STANDBY and active.step_down_cause == "claim-replaced"
            assert sc.daemon.pipeline is not None and not sc.daemon.pipeline.leading

        await sc.eventually(stepped_down)
        assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})
        async with sc.session.post(
            "/v1/topics", json={"name": "refused", "spec": {"partitions": 1, "replicationFactor": 1}}, allow_redirects=False
        ) as response:
            assert (response.status, response.headers["Location"]) == (307, "http://10.0.0.9:9003/v1/topics")
        # A topic written behind its back is seen in its mirror and left alone: no controller runs.
        topic = models.Topic.model_validate({"name": "behind", "spec": {"partitions": 1, "replicationFactor": 1}})
        await sc.kv_store.create(topic.key, models.encode(topic))

        async def mirrored() -> None:
            assert (await sc.call("GET", "/v1/topics/behind"))[0] == 200

        await sc.eventually(mirrored)
        stored = await sc.read("topics", "behind")
        assert stored is not None and stored.status.resolution is models.TopicResolution.INIT
        assert await sc.kv_store.get("topics/refused") is None


async def test_sc_run_whose_store_another_sc_took_over_stays_up_as_a_standby(tmp_path: Path, processes: list[ScRun]) -> None:
    etcd_ports = embedded_etcd.free_port_pair()
    sc = ScRun(tmp_path / "sc", etcd_ports)
    processes.append(sc)
    sc.start(SC_ACTIVE_SC_LEASE_TTL="2")
    await sc.wait_healthy()
    store = await etcd.EtcdStore.open([f"127.0.0.1:{etcd_ports[0]}"], kv.DEFAULT_PREFIX, 2.0)
    try:
        claimed = await store.get(active_sc.KEY)
        assert claimed is not None
        await claim_over(store, INTRUDER, claimed)
        async with aiohttp.ClientSession() as session:

            async def standby() -> bool:
                async with session.get(f"{sc.url}/v1/cluster") as response:
                    answer = await response.json()
                return bool(answer["self"]["role"] == "standby" and answer["leader"]["id"] == "intruder")

            deadline = asyncio.get_running_loop().time() + 30
            while not await standby():
                assert asyncio.get_running_loop().time() < deadline, sc.log_path.read_text()[-3000:]
                await asyncio.sleep(0.1)
    finally:
        await store.close()
    assert sc.process is not None and sc.process.poll() is None
    await sc.wait_healthy()
