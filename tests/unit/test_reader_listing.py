"""The Reader does not keep the store's listing once its mirror holds it: at 100,000 partitions
the listing (every key and value) is 30 MB, which stayed referenced for as long as the watch ran."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref

from controller import metrics
from controller.pipeline import reader as reader_module
from store import kv, local, memory, models
from tests import builders


class Items(list[kv.KeyValue]):
    """A listing's items that a weak reference can follow (a plain list cannot)."""


class Listed(memory.MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.listings: list[weakref.ref[Items]] = []

    async def list(self, prefix: str) -> kv.ListResult:
        listed = await super().list(prefix)
        items = Items(listed.items)
        self.listings.append(weakref.ref(items))
        return kv.ListResult(items, listed.revision)


async def test_the_listing_is_not_kept_while_the_watch_runs() -> None:
    store = Listed()
    await store.create("topics/orders", models.encode(builders.topic("orders")))
    local_store = local.LocalStore()
    reader = reader_module.Reader(store, local_store, metrics.Metrics())
    task = asyncio.create_task(reader.run())
    try:
        await asyncio.wait_for(reader.synced.wait(), 10)
        assert "orders" in local_store["topics"].view
        gc.collect()
        assert [listing() for listing in store.listings] == [None]
        # The watch runs on: a write after the listing still reaches the mirror.
        await store.create("topics/payments", models.encode(builders.topic("payments")))
        async with asyncio.timeout(10):
            while "payments" not in local_store["topics"].view:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()
