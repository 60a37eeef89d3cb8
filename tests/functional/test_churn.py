"""What a running SC keeps about SPUs and partitions that come and go: churn that leaves the
cluster as it was must leave the SC's memory as it was (counted, never timed)."""

from __future__ import annotations

import aiohttp

from controller import config, daemon
from store import kv, memory
from tests.fixtures import daemon as daemon_fixtures
from tests.fixtures.scripted_spu import ScriptedSpu

ROUNDS = 20


def memory_settings() -> config.Settings:
    return config.Settings(store=config.StoreKind.MEMORY, **daemon_fixtures.COMMON_SETTINGS)


async def test_the_health_view_forgets_spus_registered_connected_and_deleted() -> None:
    async with daemon_fixtures.running(memory_settings()) as sc, aiohttp.ClientSession() as session:
        pipeline = sc.daemon.pipeline
        assert pipeline is not None and sc.daemon.private_port is not None
        for round_number in range(ROUNDS):
            spu_id = 100 + round_number  # a new SPU each time; one registered at any moment
            await sc.register_spu(spu_id, online=False, ports=(9300 + 2 * round_number, 9301 + 2 * round_number))
            spu = ScriptedSpu(session, sc.daemon.private_port, spu_id)
            await spu.connect()
            await spu.close()
            status, body = await sc.call("DELETE", f"/v1/spus/spu-{spu_id}")
            assert status == 200, body

            async def forgotten() -> None:
                assert await sc.read("spus", f"spu-{spu_id}") is None
                assert spu_id not in pipeline.health.known()

            await sc.eventually(forgotten)
        assert pipeline.health.known() == []


async def test_the_daemon_s_memory_store_keeps_a_bounded_history() -> None:
    async with daemon_fixtures.running(memory_settings()) as sc:
        assert sc.daemon.context is not None
        store: kv.KVStore = sc.daemon.context.kv_store
        while isinstance(store, kv.ForwardingStore):
            store = store.inner
        assert isinstance(store, memory.MemoryStore) and store.history_limit == daemon.MEMORY_HISTORY_EVENTS
