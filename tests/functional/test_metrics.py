"""/metrics of a daemon on a real etcd through a real failover: simulator SPUs stopped, elections by
cause, partitions left without a leader, SPUs by resolution, etcd requests by operation."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from prometheus_client import parser

from connection_manager.spu import simulator
from store import active_sc, embedded_etcd, models
from tests import builders
from tests.fixtures.daemon import Running, etcd_settings, running

pytestmark = pytest.mark.etcd


@pytest.fixture
async def sc(etcd_server: embedded_etcd.EmbeddedEtcd) -> AsyncIterator[Running]:
    settings = etcd_settings(etcd_server, spu_heartbeat_timeout=2.0, spu_offline_grace=5.0)
    async with running(settings) as handle:
        for spu_id, ports in enumerate(zip(*[iter(embedded_etcd.free_ports(4))] * 2)):
            await handle.register_spu(spu_id, online=False, ports=ports)
        yield handle


async def scrape(sc: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with sc.session.get("/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return scraped.get((name, tuple(sorted(labels.items()))))


async def partition_is(sc: Running, leader: int, resolution: models.PartitionResolution) -> None:
    found = await sc.read("partitions", "pair-0")
    assert found is not None and found.spec.leader == leader and found.status.resolution is resolution, found


async def test_metrics_show_the_election_by_cause_and_the_partition_left_without_a_leader(sc: Running) -> None:
    address = f"127.0.0.1:{sc.daemon.private_port}"
    spus = {spu_id: simulator.SimulatedSpu(spu_id, address) for spu_id in (0, 1)}
    for spu in spus.values():
        await spu.start()
    try:
        body = {"name": "pair", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}}

        async def both_online() -> None:
            scraped = await scrape(sc)
            assert sample(scraped, "sc_objects", kind="spus", resolution="Online") == 2.0

        await sc.eventually(both_online, timeout=30)
        status, answer = await sc.call("POST", "/v1/topics", body)
        assert status == 201, answer
        await sc.eventually(lambda: partition_is(sc, 0, models.PartitionResolution.ONLINE), timeout=20)
        scraped = await scrape(sc)
        assert sample(scraped, "sc_leader_elections_total", cause="spu-offline") == 0.0
        assert sample(scraped, "sc_partitions_without_leader") == 0.0

        await spus[0].stop()  # the leader: SPU 1 takes over, an election caused by an SPU going offline
        await sc.eventually(lambda: partition_is(sc, 1, models.PartitionResolution.ONLINE), timeout=15)

        async def elected() -> None:
            scraped = await scrape(sc)
            assert sample(scraped, "sc_leader_elections_total", cause="spu-offline") == 1.0
            assert sample(scraped, "sc_leader_elections_total", cause="preferred-leader") == 0.0
            assert sample(scraped, "sc_partitions_without_leader") == 0.0
            assert sample(scraped, "sc_objects", kind="spus", resolution="Offline") == 1.0
            assert sample(scraped, "sc_actions_total", kind="partitions", verb="elect", outcome="applied") == 1.0

        await sc.eventually(elected, timeout=10)

        await spus[1].stop()  # the last replica: nobody may lead
        await sc.eventually(lambda: partition_is(sc, 1, models.PartitionResolution.LEADER_OFFLINE), timeout=15)

        async def leaderless() -> None:
            scraped = await scrape(sc)
            assert sample(scraped, "sc_partitions_without_leader") == 1.0
            assert sample(scraped, "sc_objects", kind="partitions", resolution="LeaderOffline") == 1.0
            assert sample(scraped, "sc_objects", kind="spus", resolution="Offline") == 2.0
            assert sample(scraped, "sc_objects", kind="spus", resolution="Online") == 0.0
            assert sample(scraped, "sc_leader_elections_total", cause="spu-offline") == 1.0

        await sc.eventually(leaderless, timeout=10)
        scraped = await scrape(sc)
        # Every write went through a timed etcd transaction, and the Reader listed (at least once).
        assert (sample(scraped, "sc_etcd_request_seconds_count", operation="txn") or 0.0) >= 4.0
        assert (sample(scraped, "sc_etcd_request_seconds_count", operation="list") or 0.0) >= 1.0
        assert sample(scraped, "sc_etcd_errors_total", operation="txn") == 0.0
    finally:
        for spu in spus.values():
            await spu.stop()


async def test_a_deposed_sc_is_fenced_by_the_store_and_says_so_in_its_metrics(sc: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SC's claim is replaced by another SC's behind its back, and it does not hear of it (its
    keep-alives are not getting through: a pause, a partition). The next write it is asked for is
    refused by etcd itself, changes nothing, and is counted; the SC knows it is no longer leader."""
    active = sc.daemon.active
    assert active is not None
    scraped = await scrape(sc)
    assert [sample(scraped, name) for name in ("sc_leader", "sc_fenced_writes_total", "sc_claim_losses_total")] == [1.0, 0.0, 0.0]

    async def unheard() -> None:
        """A keep-alive that does not get through, and so tells this SC nothing."""

    monkeypatch.setattr(active, "_renew", unheard)
    claim = await builders.present(sc.kv_store, active_sc.KEY)
    await sc.kv_store.delete(active_sc.KEY, claim.mod_revision)
    other = active_sc.Identity("other", "elsewhere", 4242, "10.9.9.9:9003", "2026-11-27T00:00:00+00:00")
    await sc.kv_store.create(active_sc.KEY, other.encode())
    before = await sc.kv_store.revision()
    assert active.leading  # as far as it knows
    status, body = await sc.call("POST", "/v1/topics", {"name": "late", "spec": {"partitions": 1, "replicationFactor": 1}})
    assert status == 503 and "is not its own any more" in body["error"]["message"], body
    assert await sc.kv_store.revision() == before
    assert await sc.kv_store.get("topics/late") is None
    scraped = await scrape(sc)
    assert [sample(scraped, name) for name in ("sc_leader", "sc_fenced_writes_total", "sc_claim_losses_total")] == [0.0, 1.0, 1.0]
