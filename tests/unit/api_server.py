"""A real public API on 127.0.0.1 (free port) over a MemoryStore mirrored by a real Reader, no controllers.

Shared by the API and admin CLI tests; tests play the controllers by writing statuses to the KV store.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from connection_manager import transport
from controller import config, context as context_module, metrics
from controller.api import routes as api
from controller.pipeline import reader as reader_module
from store import kv, local, memory, models
from tests import builders


def spu(spu_id: int, name: str | None = None, rack: str | None = None, resolution: str = "Online", spu_type: str = "Custom") -> models.Spu:
    return builders.spu(spu_id, resolution=resolution, rack=rack, name=name, spu_type=spu_type, host="10.0.0.1")


@pytest.fixture
async def server() -> AsyncIterator[ApiServer]:
    """A started server, synced; tests import this fixture from here."""
    running = ApiServer()
    await running.start()
    yield running
    await running.stop()


class ApiServer:
    def __init__(self, kv_store: kv.KVStore | None = None, settings: config.Settings | None = None) -> None:
        self.kv_store = kv_store or memory.MemoryStore()
        self.context = context_module.Context(
            settings=settings or config.Settings(), kv_store=self.kv_store, local_store=local.LocalStore(), metrics=metrics.Metrics()
        )
        self.context.metrics.watch_local_store(self.context.local_store)
        self.app = api.build_app(self.context)
        self.runner = web.AppRunner(self.app, access_log=None)
        self.reader = reader_module.Reader(self.kv_store, self.context.local_store, self.context.metrics)
        self._reader_task: asyncio.Task[None] | None = None
        self.session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self, sync: bool = True) -> None:
        await self.runner.setup()
        # As the daemon serves it: through the public port's guard (limits, timeouts, short errors).
        site = transport.GuardedSite(self.runner, "127.0.0.1", 0, transport.Port(transport.PUBLIC))
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.session = aiohttp.ClientSession(self.url)
        if sync:
            await self.sync()

    async def sync(self) -> None:
        self._reader_task = asyncio.create_task(self.reader.run(), name="test-reader")
        await asyncio.wait_for(self.reader.synced.wait(), 5)
        self.context.synced.set()

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.runner.cleanup()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        await self.kv_store.close()

    # ------------------------------------------------------------------ HTTP

    async def call(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None
    ) -> tuple[int, Any]:
        assert self.session is not None
        data = io.BytesIO(raw) if raw is not None else (None if body is None else json.dumps(body).encode())
        async with self.session.request(method, path, data=data) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text

    # ------------------------------------------------------------------ playing the controllers

    async def put(self, *objects: models.AnyObject) -> None:
        """Write objects straight to the KV store (as a controller would) and wait for the mirror."""
        for obj in objects:
            stored = await self.kv_store.get(obj.key)
            if stored is None:
                await self.kv_store.create(obj.key, models.encode(obj))
            else:
                await self.kv_store.update(obj.key, models.encode(obj), stored.mod_revision)
        await self.mirrored()

    async def read(self, kind: str, name: str) -> models.AnyObject | None:
        stored = await self.kv_store.get(models.object_key(kind, name))
        return None if stored is None else models.decode(kind, stored.value)

    async def mirrored(self) -> None:
        """Until the local store holds exactly what the KV store holds, at the same revisions."""
        for _ in range(1000):
            if await self._caught_up():
                return
            await asyncio.sleep(0.002)
        raise AssertionError("the local store did not catch up with the KV store")

    async def _caught_up(self) -> bool:
        for kind, table in self.context.local_store.tables.items():
            listed = await self.kv_store.list(f"{kind}/")
            if {item.key.split("/", 1)[1]: item.mod_revision for item in listed.items} != {
                entry.name: entry.mod_revision for entry in table
            }:
                return False
        return True

    def decide_later(self, kind: str, name: str, status: dict[str, Any], after: models.AnyObject | None = None) -> asyncio.Task[None]:
        """A stand-in controller: once ``name`` shows up (changed from ``after``), write ``status``."""

        async def decide() -> None:
            listener = self.context.local_store[kind].listener()
            try:
                async with asyncio.timeout(5):  # fail the test rather than hang it
                    entry = await wait_for_it(listener)
            finally:
                listener.close()
            decided = entry.obj.model_copy(update={"status": type(entry.obj.status).model_validate(status)})
            await self.kv_store.update(entry.obj.key, models.encode(decided), entry.mod_revision)

        async def wait_for_it(listener: local.Listener) -> local.Entry:
            while True:
                await listener.wait()
                listener.changes()
                entry = self.context.local_store[kind].get(name)
                if entry is not None and (after is None or entry.obj != after):
                    return entry

        return asyncio.create_task(decide(), name=f"decide-{kind}-{name}")
