"""The Reader and metadata dispatcher: list then watch the cluster's keys into the local store.

One listing of the whole prefix at one revision, then one watch from the next revision, each
event dispatched to its kind's table. A single stream (not one per kind) keeps the local store a
consistent cut: a topic status and the partitions written in the same transaction appear
together, so controllers never judge one kind against a staler view of another. A compacted or
broken watch relists and resyncs (the fence makes listeners recompute). The only writer of the
local store; never writes to the KV store.
"""

from __future__ import annotations

import asyncio
import contextlib
import pydantic
import structlog

from controller import metrics as metrics_module
from store import kv, local, models

log = structlog.get_logger(__name__)

META_KIND = "meta"

class Reader:
    def __init__(
        self,
        kv_store: kv.KVStore,
        local_store: local.LocalStore,
        metrics: metrics_module.Metrics,
        retry_delay: float = 0.5,
    ) -> None:
        self.kv_store = kv_store
        self.local_store = local_store
        self.metrics = metrics
        self.retry_delay = retry_delay
        self.synced = asyncio.Event()

    async def run(self) -> None:
        """List, then watch, until cancelled or the store closes; relist after any break."""
        while True:
            try:
                listed = await self.kv_store.list("")
                self._resync(listed)
                self.synced.set()
                async with contextlib.aclosing(self.kv_store.watch("", listed.revision + 1)) as events:
                    async for event in events:
                        self._apply(event)
                return  # the watch ended without an error: the store is closing
            except kv.Compacted as compacted:
                log.warning("watch compacted, relisting", revision=compacted.revision)
            except kv.Unavailable as unavailable:
                self.metrics.etcd_errors.labels("watch").inc()
                log.warning("store unavailable, relisting after a pause", error=str(unavailable))
                await asyncio.sleep(self.retry_delay)

    def _resync(self, listed: kv.ListResult) -> None:
        by_kind: dict[str, list[tuple[models.ClusterObject, int, int]]] = {kind: [] for kind in models.KINDS}
        meta: list[tuple[str, bytes, int]] = []
        for item in listed.items:
            kind, _, _ = item.key.partition("/")
            if kind == META_KIND:
                meta.append((item.key, item.value, item.mod_revision))
            elif kind in by_kind:
                obj = self._decode(kind, item.key, item.value)
                if obj is not None:
                    by_kind[kind].append((obj, item.mod_revision, item.create_revision))
        for kind, objects in by_kind.items():
            self.local_store[kind].resync(objects, listed.revision)
            self.metrics.relists.labels(kind).inc()
        self.local_store.meta.resync(meta, listed.revision)
        log.info("relisted", objects={kind: len(objects) for kind, objects in by_kind.items()}, revision=listed.revision)

    def _apply(self, event: kv.WatchEvent) -> None:
        kind, _, name = event.key.partition("/")
        if kind == META_KIND:
            if event.type is kv.EventType.PUT and event.value is not None:
                self.local_store.meta.apply(event.key, event.value, event.revision)
            else:
                self.local_store.meta.delete(event.key, event.revision)
            return
        if kind not in models.KINDS:
            return  # a key of a newer SC version, or of somebody else: not ours to mirror
        table = self.local_store[kind]
        if event.type is kv.EventType.DELETE:
            table.delete(name, event.revision)
            return
        assert event.value is not None
        obj = self._decode(kind, event.key, event.value)
        if obj is None:
            return
        table.apply(obj, event.revision)

    def _decode(self, kind: str, key: str, value: bytes) -> models.ClusterObject | None:
        try:
            obj = models.decode(kind, value)
        except (pydantic.ValidationError, ValueError) as error:
            # Somebody wrote a malformed value straight into etcd: skip it, keep serving.
            self.metrics.malformed_objects.labels(kind).inc()
            detail = models.describe_validation_error(error) if isinstance(error, pydantic.ValidationError) else str(error)
            log.error("malformed object in the store, ignored", key=key, error=detail)
            return None
        if obj.key != key:
            self.metrics.malformed_objects.labels(kind).inc()
            log.error("object stored under another object's key, ignored", key=key, name=obj.name)
            return None
        return obj
