"""The whole daemon (pipeline, controllers, public API) driven through its HTTP API and CLI.

Runs on the memory store and on a real etcd; every result is read back from the KV store
(on etcd through a client of its own), not only from the API's answers.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from connection_manager import health as health_module
from controller import cli, config, daemon as daemon_module
from store import embedded_etcd, etcd, kv, models

REQUEST_TIMEOUT = 2.0


class Running:
    def __init__(self, daemon: daemon_module.Daemon, kv_store: kv.KVStore, session: aiohttp.ClientSession) -> None:
        self.daemon = daemon
        self.kv_store = kv_store  # the test's own view of the store
        self.session = session

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.daemon.public_port}"

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, path, json=body) as response:
            return response.status, await response.json()

    async def register_spu(self, spu_id: int, rack: str | None = None, online: bool = True) -> None:
        spec: dict[str, Any] = {
            "id": spu_id,
            "publicEndpoint": {"host": "127.0.0.1", "port": 9005},
            "privateEndpoint": {"host": "127.0.0.1", "port": 9006},
        }
        if rack is not None:
            spec["rack"] = rack
        status, body = await self.call("POST", "/v1/spus", {"name": f"spu-{spu_id}", "spec": spec})
        assert status == 201, body
        if online:
            pipeline = self.daemon.pipeline
            assert pipeline is not None
            pipeline.health.set(spu_id, health_module.Health.ONLINE, asyncio.get_running_loop().time())

            async def is_online() -> None:
                spu = await self.read("spus", f"spu-{spu_id}")
                assert spu is not None and spu.status.resolution is models.SpuResolution.ONLINE  # type: ignore[attr-defined]

            await self.eventually(is_online)

    async def read(self, kind: str, name: str) -> models.ClusterObject | None:
        stored = await self.kv_store.get(models.object_key(kind, name))
        return None if stored is None else models.decode(kind, stored.value)

    async def read_all(self, kind: str) -> dict[str, Any]:
        listed = await self.kv_store.list(f"{kind}/")
        return {(obj := models.decode(kind, item.value)).name: obj for item in listed.items}

    async def partitions_of(self, topic: str) -> dict[int, list[int]]:
        return {p.index: p.spec.replicas for p in (await self.read_all("partitions")).values() if p.topic == topic}

    async def eventually(self, check: Callable[[], Any], timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await check()
                return
            except AssertionError:
                if loop.time() > deadline:
                    raise
            await asyncio.sleep(0.02)


@pytest.fixture(params=["memory", pytest.param("etcd", marks=pytest.mark.etcd)])
def settings(request: pytest.FixtureRequest) -> config.Settings:
    common: dict[str, Any] = {"bind_host": "127.0.0.1", "public_port": 0, "resync_interval": 5.0}
    if request.param == "memory":
        return config.Settings(store=config.StoreKind.MEMORY, **common)
    server: embedded_etcd.EmbeddedEtcd = request.getfixturevalue("etcd_server")
    if not server.running:
        server.start()
    return config.Settings(
        store=config.StoreKind.ETCD,
        etcd_endpoints=server.endpoints,
        key_prefix=f"/sc-test/{uuid.uuid4().hex}/",
        **common,
    )


@pytest.fixture
async def sc(settings: config.Settings) -> AsyncIterator[Running]:
    daemon = daemon_module.Daemon(settings)
    await daemon.start()
    assert daemon.context is not None
    own_store: kv.KVStore | None = None
    if settings.store is config.StoreKind.ETCD:
        own_store = await etcd.EtcdStore.open(settings.etcd_endpoints, settings.key_prefix, REQUEST_TIMEOUT)
    session = aiohttp.ClientSession(f"http://127.0.0.1:{daemon.public_port}")
    try:
        yield Running(daemon, own_store or daemon.context.kv_store, session)
    finally:
        await session.close()
        if own_store is not None:
            await own_store.close()
        await daemon.stop()


def cli_lines(out: str) -> list[str]:
    """The CLI's output without the daemon's log lines (the daemon logs to the same stdout here)."""
    return [line for line in out.splitlines() if not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line)]


def topic_body(name: str, partitions: int, replication_factor: int, **spec: Any) -> dict[str, Any]:
    return {"name": name, "spec": {"partitions": partitions, "replicationFactor": replication_factor, **spec}}


async def test_healthz_is_ok_once_started(sc: Running) -> None:
    assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})


async def test_computed_topic_gets_the_seed_assignment_and_its_partitions(sc: Running) -> None:
    for spu_id in range(5):
        await sc.register_spu(spu_id)
    status, body = await sc.call("POST", "/v1/topics", topic_body("orders", 16, 3))
    assert (status, body["status"]["resolution"]) == (201, "Provisioned")
    stored = await sc.read("topics", "orders")
    assert stored is not None and stored.to_json_dict() == body
    replica_map = stored.status.replica_map  # type: ignore[attr-defined]
    # The seed's 5-SPU, 16-partition table.
    assert (replica_map[0], replica_map[5], replica_map[9], replica_map[15]) == ([0, 1, 2], [0, 2, 3], [4, 1, 2], [0, 1, 2])

    async def partitions_created() -> None:
        assert await sc.partitions_of("orders") == replica_map

    await sc.eventually(partitions_created)


async def test_rack_aware_topic_spreads_every_partition_over_racks(sc: Running) -> None:
    for spu_id, rack in enumerate(["r1", "r1", "r2", "r2", "r3", "r3"]):
        await sc.register_spu(spu_id, rack)
    predicted_status, predicted = await sc.call("POST", "/v1/topics?dryRun=true", topic_body("spread", 6, 3))
    assert predicted_status == 200
    status, body = await sc.call("POST", "/v1/topics", topic_body("spread", 6, 3))
    assert status == 201
    stored = await sc.read("topics", "spread")
    assert stored is not None
    replica_map = stored.status.replica_map  # type: ignore[attr-defined]
    assert [replica_map[index] for index in range(6)] == predicted["replicaMap"]
    rack_of = {spu_id: f"r{spu_id // 2 + 1}" for spu_id in range(6)}
    for replicas in replica_map.values():
        assert len({rack_of[spu_id] for spu_id in replicas}) == 3, replica_map


async def test_manual_topic_gets_exactly_its_assignment(sc: Running) -> None:
    for spu_id in range(3):
        await sc.register_spu(spu_id)
    assignment = [{"id": 0, "replicas": [2, 0]}, {"id": 1, "replicas": [1, 2]}]
    status, body = await sc.call("POST", "/v1/topics", {"name": "manual", "spec": {"replicaAssignment": assignment}})
    assert (status, body["status"]["replicaMap"]) == (201, {"0": [2, 0], "1": [1, 2]})

    async def partitions_created() -> None:
        assert await sc.partitions_of("manual") == {0: [2, 0], 1: [1, 2]}

    await sc.eventually(partitions_created)


@pytest.mark.parametrize(
    "placement_spec",
    [{"strategy": "policies", "policies": "node=balanced;preferred_nodes=3"}, {"strategy": "kafka"}],
)
async def test_strategies_place_what_the_dry_run_predicted(sc: Running, placement_spec: dict[str, Any]) -> None:
    for spu_id in range(4):
        await sc.register_spu(spu_id)
    await sc.call("POST", "/v1/topics", topic_body("first", 3, 2))  # moves the start-index chain
    body = topic_body("second", 8, 2, placement=placement_spec)
    status, predicted = await sc.call("POST", "/v1/topics?dryRun=true", body)
    assert status == 200
    status, created = await sc.call("POST", "/v1/topics", body)
    assert status == 201, created
    stored = await sc.read("topics", "second")
    assert stored is not None and stored.spec.placement.model_dump(exclude_none=True) == placement_spec  # type: ignore[attr-defined]
    replica_map = stored.status.replica_map  # type: ignore[attr-defined]
    assert [replica_map[index] for index in range(8)] == predicted["replicaMap"]


async def test_invalid_configs(sc: Running) -> None:
    await sc.register_spu(0, "r1")
    await sc.register_spu(1)  # no rack: a partial rack layout
    # Checked before writing: nothing is stored.
    manual = {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 9]}]}}
    status, body = await sc.call("POST", "/v1/topics", manual)
    assert (status, body["error"]["code"]) == (422, "InvalidConfig")
    assert "9" in body["error"]["message"]
    assert await sc.read("topics", "manual") is None
    # Found by placement: the controller's verdict is kept in the store.
    status, body = await sc.call("POST", "/v1/topics", topic_body("racks", 2, 2))
    assert (status, body["error"]["code"]) == (422, "InvalidConfig")
    stored = await sc.read("topics", "racks")
    assert stored is not None and body["object"] == stored.to_json_dict()
    assert stored.status.resolution is models.TopicResolution.INVALID_CONFIG  # type: ignore[attr-defined]
    assert "SPU 1 has none" in stored.status.reason  # type: ignore[attr-defined]
    assert await sc.partitions_of("racks") == {}


async def test_insufficient_spus_then_an_spu_is_added(sc: Running) -> None:
    await sc.register_spu(0)
    await sc.register_spu(1)
    status, body = await sc.call("POST", "/v1/topics", topic_body("wide", 4, 3))
    assert (status, body["status"]["resolution"]) == (202, "InsufficientResources")
    stored = await sc.read("topics", "wide")
    assert stored is not None and stored.status.resolution is models.TopicResolution.INSUFFICIENT_RESOURCES  # type: ignore[attr-defined]
    assert "1 more needed" in stored.status.reason  # type: ignore[attr-defined]
    await sc.register_spu(2)

    async def provisioned() -> None:
        topic = await sc.read("topics", "wide")
        assert topic is not None and topic.status.resolution is models.TopicResolution.PROVISIONED  # type: ignore[attr-defined]
        assert await sc.partitions_of("wide") == topic.status.replica_map  # type: ignore[attr-defined]
        assert len(topic.status.replica_map) == 4  # type: ignore[attr-defined]

    await sc.eventually(provisioned)


async def test_add_partitions_keeps_the_existing_ones(sc: Running) -> None:
    for spu_id in range(3):
        await sc.register_spu(spu_id)
    status, body = await sc.call("POST", "/v1/topics", topic_body("orders", 3, 2))
    assert status == 201
    before = body["status"]["replicaMap"]
    status, body = await sc.call("POST", "/v1/topics/orders/partitions", {"count": 2})
    assert (status, body["spec"]["partitions"]) == (200, 5)
    stored = await sc.read("topics", "orders")
    assert stored is not None and stored.to_json_dict() == body
    replica_map = stored.status.replica_map  # type: ignore[attr-defined]
    assert {str(index): replica_map[index] for index in range(3)} == before
    assert len(replica_map) == 5

    async def partitions_created() -> None:
        assert await sc.partitions_of("orders") == replica_map

    await sc.eventually(partitions_created)


async def test_delete_topic_takes_its_partitions(sc: Running) -> None:
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    assert (await sc.call("POST", "/v1/topics", topic_body("gone", 4, 2)))[0] == 201
    assert (await sc.call("POST", "/v1/topics", topic_body("kept", 2, 2)))[0] == 201
    status, body = await sc.call("DELETE", "/v1/topics/gone")
    assert (status, body["deleted"]["name"], body["warnings"]) == (200, "gone", [])

    async def only_kept_remains() -> None:
        assert await sc.read("topics", "gone") is None
        assert sorted(await sc.read_all("partitions")) == ["kept-0", "kept-1"]

    await sc.eventually(only_kept_remains)


async def test_spu_group_with_a_colliding_range_is_invalid_and_creates_nothing(sc: Running) -> None:
    await sc.register_spu(101, online=False)
    status, body = await sc.call("POST", "/v1/spu-groups", {"name": "g", "spec": {"replicas": 3, "minId": 100}})
    assert (status, body["error"]["code"]) == (422, "SpuGroupInvalid")
    stored = await sc.read("spu-groups", "g")
    assert stored is not None and stored.status.resolution is models.SpuGroupResolution.INVALID  # type: ignore[attr-defined]
    assert "SPU id 101 is already used by SPU spu-101" in stored.status.reason  # type: ignore[attr-defined]
    assert sorted(await sc.read_all("spus")) == ["spu-101"]


async def test_spu_group_scales_up_and_down_and_goes_with_its_spus(sc: Running) -> None:
    status, body = await sc.call("POST", "/v1/spu-groups", {"name": "g", "spec": {"replicas": 2, "minId": 200, "rack": "r9"}})
    assert (status, body["status"]["resolution"]) == (201, "Reserved")

    def has_spus(count: int) -> Callable[[], Any]:
        async def check() -> None:
            spus = await sc.read_all("spus")
            assert {name: spu.spec.id for name, spu in spus.items()} == {f"g-{i}": 200 + i for i in range(count)}
            assert all(spu.spec.spu_type is models.SpuType.MANAGED and spu.spec.rack == "r9" for spu in spus.values())

        return check

    await sc.eventually(has_spus(2))
    assert (await sc.call("POST", "/v1/spu-groups/g/scale", {"replicas": 4}))[0] == 202
    await sc.eventually(has_spus(4))
    assert (await sc.call("POST", "/v1/spu-groups/g/scale", {"replicas": 1}))[0] == 202
    await sc.eventually(has_spus(1))  # the highest ids go first
    assert (await sc.call("DELETE", "/v1/spus/g-0"))[0] == 409  # the group owns it
    assert (await sc.call("DELETE", "/v1/spu-groups/g"))[0] == 200
    await sc.eventually(has_spus(0))
    assert await sc.read("spu-groups", "g") is None


async def test_the_cli_against_the_daemon(sc: Running, capsys: pytest.CaptureFixture[str]) -> None:
    for spu_id in range(2):
        await sc.register_spu(spu_id)
    argv = ["topic", "create", "events", "-p", "2", "-r", "2", "--sc", sc.url]
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, argv) == 0
    out, err = capsys.readouterr()
    assert (cli_lines(out), err) == (
        ["NAME    RESOLUTION   PARTITIONS  REPLICATION  REASON", "events  Provisioned  2           2            -"],
        "",
    )
    stored = await sc.read("topics", "events")
    assert stored is not None and stored.status.resolution is models.TopicResolution.PROVISIONED  # type: ignore[attr-defined]

    async def partitions_created() -> None:
        assert await sc.partitions_of("events") == stored.status.replica_map  # type: ignore[attr-defined]

    await sc.eventually(partitions_created)
    assert await asyncio.to_thread(cli.main, ["partition", "list", "-o", "json", "--sc", sc.url]) == 0
    listed = json.loads("\n".join(cli_lines(capsys.readouterr().out)))
    assert [(p["name"], p["spec"]["replicas"]) for p in listed] == [
        ("events-0", stored.status.replica_map[0]),  # type: ignore[attr-defined]
        ("events-1", stored.status.replica_map[1]),  # type: ignore[attr-defined]
    ]
