"""The memory store's leases end on the loop clock (fast-forwarded by looptime): exactly when due."""

from __future__ import annotations

import asyncio

import pytest

from store import kv, memory


@pytest.mark.looptime(start=0)
async def test_a_lease_ends_ttl_seconds_after_it_was_last_kept_alive() -> None:
    store = memory.MemoryStore()
    try:
        lease = await store.grant_lease(5)
        await store.claim("meta/active-sc", b"holder", lease.id)
        for _ in range(4):
            await asyncio.sleep(4.9)
            assert await store.keep_alive(lease.id) == 5
        await asyncio.sleep(4.9)  # 24.5 s after the grant, 4.9 s after the last keep-alive
        assert (await store.get("meta/active-sc")) is not None
        await asyncio.sleep(0.2)
        assert await store.get("meta/active-sc") is None
        with pytest.raises(kv.LeaseExpired):
            await store.keep_alive(lease.id)
    finally:
        await store.close()

