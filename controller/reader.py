"""Readers and the metadata dispatcher: list then watch each kind, apply events to the local store.

The only writer of the local store. A compacted or broken watch relists and resyncs (the local
store's fence makes listeners recompute). Never writes to the KV store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pydantic
import structlog

from controller import metrics as metrics_module
from store import kv, local, models

log = structlog.get_logger(__name__)

META_PREFIX = "meta/"

# Called with every change the Reader applies: (kind, name, event type, revision, object or None).
ChangeHook = Callable[[str, str, kv.EventType, int, models.ClusterObject | None], None]


class Reader:
    """Mirrors every kind (and the meta keys) from the KV store into the local store."""

    def __init__(
        self,
        kv_store: kv.KVStore,
        local_store: local.LocalStore,
        metrics: metrics_module.Metrics,
        on_change: ChangeHook | None = None,
        retry_delay: float = 0.5,
    ) -> None:
        self.kv_store = kv_store
        self.local_store = local_store
        self.metrics = metrics
        self.on_change = on_change
        self.retry_delay = retry_delay
        self.synced = asyncio.Event()

    async def run(self) -> None:
        """Run one reader per kind until cancelled."""
        async with asyncio.TaskGroup() as group:
            for kind in models.KINDS:
                group.create_task(self._mirror(kind), name=f"reader-{kind}")
            group.create_task(self._mirror_meta(), name="reader-meta")

    async def _mirror(self, kind: str) -> None:
        table = self.local_store[kind]
        await self._list_then_watch(
            f"{kind}/",
            lambda items, revision: table.resync(self._decode_all(kind, items), revision),
            lambda event: self._apply(kind, table, event),
        )

    async def _mirror_meta(self) -> None:
        meta = self.local_store.meta
        await self._list_then_watch(
            META_PREFIX,
            lambda items, revision: meta.resync(((item.key, item.value, item.mod_revision) for item in items), revision),
            lambda event: meta.apply(event.key, event.value, event.revision)
            if event.type is kv.EventType.PUT and event.value is not None
            else meta.delete(event.key, event.revision),
        )

    async def _list_then_watch(
        self,
        prefix: str,
        resync: Callable[[list[kv.KeyValue], int], None],
        apply: Callable[[kv.WatchEvent], None],
    ) -> None:
        while True:
            try:
                listed = await self.kv_store.list(prefix)
                resync(listed.items, listed.revision)
                if self.local_store.synced:
                    self.synced.set()
                self.metrics.relists.labels(prefix.rstrip("/")).inc()
                log.debug("relisted", prefix=prefix, objects=len(listed.items), revision=listed.revision)
                async with contextlib.aclosing(self.kv_store.watch(prefix, listed.revision + 1)) as events:
                    async for event in events:
                        apply(event)
                # A watch that ends without an error means the store is closing.
                return
            except kv.Compacted as compacted:
                log.warning("watch compacted, relisting", prefix=prefix, revision=compacted.revision)
            except kv.Unavailable as unavailable:
                self.metrics.etcd_errors.labels("watch").inc()
                log.warning("store unavailable, relisting after a pause", prefix=prefix, error=str(unavailable))
                await asyncio.sleep(self.retry_delay)

    def _decode_all(self, kind: str, items: list[kv.KeyValue]) -> list[tuple[models.ClusterObject, int, int]]:
        decoded = []
        for item in items:
            obj = self._decode(kind, item.key, item.value)
            if obj is not None:
                decoded.append((obj, item.mod_revision, item.create_revision))
        return decoded

    def _decode(self, kind: str, key: str, value: bytes) -> models.ClusterObject | None:
        try:
            obj = models.decode(kind, value)
        except pydantic.ValidationError as error:
            # Somebody wrote a malformed value straight into etcd: skip it, keep serving.
            self.metrics.malformed_objects.labels(kind).inc()
            log.error("malformed object in the store, ignored", key=key, error=models.describe_validation_error(error))
            return None
        if obj.key != key:
            self.metrics.malformed_objects.labels(kind).inc()
            log.error("object stored under another object's key, ignored", key=key, name=obj.name)
            return None
        return obj

    def _apply(self, kind: str, table: local.KindStore, event: kv.WatchEvent) -> None:
        name = event.key[len(kind) + 1 :]
        if event.type is kv.EventType.DELETE:
            if table.delete(name, event.revision) and self.on_change is not None:
                self.on_change(kind, name, event.type, event.revision, None)
            return
        assert event.value is not None
        obj = self._decode(kind, event.key, event.value)
        if obj is None:
            return
        if table.apply(obj, event.revision) is not None and self.on_change is not None:
            self.on_change(kind, name, event.type, event.revision, obj)

