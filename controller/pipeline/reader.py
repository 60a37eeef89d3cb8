"""The Reader and metadata dispatcher: list then watch the cluster's keys into the local store.

One listing of the whole prefix at one revision, then one watch from the next revision, each
event dispatched to its kind's table. A single stream (not one per kind) keeps the local store a
consistent cut: a topic status and the partitions written in the same transaction appear
together, so controllers never judge one kind against a staler view of another. A compacted or
broken watch relists and resyncs (the fence makes listeners recompute). The only writer of the
local store; never writes to the KV store. With a history recorder, every change seen is recorded,
and a (re)start first replays, into the history only, what changed since its last record.
"""

from __future__ import annotations

import asyncio
import contextlib
import pydantic
import structlog

from connection_manager import transport
from controller import metrics as metrics_module
from store import history as history_module
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
        history: history_module.Recorder | None = None,
        echoes: local.Echoes | None = None,
    ) -> None:
        self.kv_store = kv_store
        self.local_store = local_store
        self.metrics = metrics
        self.retry_delay = retry_delay
        self.history = history
        self.synced = asyncio.Event()
        self.interner = models.Interner()
        # What the SC wrote itself: its echo is taken as written instead of decoded again.
        self.echoes = echoes if echoes is not None else local.Echoes()

    async def run(self) -> None:
        """List, then watch, until cancelled or the store closes; relist after any break.

        The watch starts at the history's resume point when that is older than the listing: events
        up to the listed revision are only recorded (the listing already holds their result).
        """
        compacted, lost, forked = False, None, False
        while True:
            listing = True
            try:
                with self.metrics.etcd_request("list"):
                    listed = await self.kv_store.list("")
                listing = False
                objects = self._resync(listed)
                if forked:
                    self.local_store.forked(listed.revision)
                start = (
                    listed.revision + 1 if self.history is None else self._history_start(listed, objects, compacted, lost)
                )
                compacted, lost, forked = False, None, False
                # The listing (every key and value of the store: 30 MB at 100,000 partitions) is
                # not kept while the watch runs, and the allocator gives back what it freed.
                listed_revision = listed.revision
                del listed, objects
                transport.give_memory_back()
                self.synced.set()
                async with contextlib.aclosing(self.kv_store.watch("", start)) as events:
                    async for event in events:
                        if event.revision > listed_revision:
                            self._apply(event)
                        else:
                            self._record(event, history_module.REPLAY)
                return  # the watch ended without an error: the store is closing
            except kv.Compacted as error:
                compacted = True
                log.warning("watch compacted, relisting", revision=error.revision)
            except kv.HistoryLost as error:
                forked = True
                if not error.answered:  # else every change delivered is still there: the history holds
                    lost = error if lost is None or error.delivered < lost.delivered else lost
                log.error("the store lost writes it had acknowledged: relisting", error=str(error))
            except kv.Unavailable as unavailable:
                if not listing:  # a failed listing is counted by etcd_request
                    self.metrics.etcd_errors.labels("watch").inc()
                log.warning("store unavailable, relisting after a pause", error=str(unavailable))
                await asyncio.sleep(self.retry_delay)

    def _resync(self, listed: kv.ListResult) -> list[kv.KeyValue]:
        """Replace the mirror with ``listed``; returns the items that are valid objects."""
        by_kind: dict[str, list[tuple[models.AnyObject, int, int]]] = {kind: [] for kind in models.KINDS}
        unreadable: dict[str, list[str]] = {kind: [] for kind in models.KINDS}
        meta: list[tuple[str, bytes, int]] = []
        valid: list[kv.KeyValue] = []
        for item in listed.items:
            kind, _, name = item.key.partition("/")
            if kind == META_KIND:
                meta.append((item.key, item.value, item.mod_revision))
            elif kind in by_kind:
                obj = self._decode(kind, item.key, item.value)
                if obj is not None:
                    by_kind[kind].append((obj, item.mod_revision, item.create_revision))
                    valid.append(item)
                else:
                    unreadable[kind].append(name)
        for kind, objects in by_kind.items():
            self.local_store[kind].resync(objects, listed.revision, unreadable[kind])
            self.metrics.relists.labels(kind).inc()
        self.local_store.meta.resync(meta, listed.revision)
        log.info("relisted", objects={kind: len(objects) for kind, objects in by_kind.items()}, revision=listed.revision)
        return valid

    def _history_start(
        self, listed: kv.ListResult, objects: list[kv.KeyValue], compacted: bool, lost: kv.HistoryLost | None = None
    ) -> int:
        """Where the watch starts so that the history misses nothing: just after its last record
        when the store still has what followed; else a gap record and a snapshot of the listing.
        ``lost``: the store lost a change the watch delivered, and may have given its revision (and
        those of earlier lost changes: the store does not say where its history forked) to others."""
        assert self.history is not None
        resume = self.history.resume_revision
        if resume is not None and not compacted and lost is None and resume <= listed.revision:
            return resume + 1
        if resume is not None and compacted:
            log.warning("history gap: the store compacted what followed the last record", after=resume, listed=listed.revision)
            self.history.record_gap(resume + 1, listed.revision, "compacted")
        elif resume is not None:
            # Restored from a backup, or another etcd: records after its revision came from before.
            # Writes lost: records from the first change known lost on may be of other changes.
            log.warning("history gap: the store is behind the history", history=resume, listed=listed.revision)
            first = listed.revision + 1 if lost is None else min(lost.delivered, listed.revision + 1)
            last = max(resume, listed.revision)
            if first <= last:
                self.history.record_gap(first, last, history_module.STORE_BEHIND_HISTORY)
        # What the listing holds that was created after the last record is new; after a store went
        # back, revisions say nothing of what the history saw: every object starts afresh.
        since = resume if resume is not None and compacted else 0
        for item in objects:
            kind, _, name = item.key.partition("/")
            op = history_module.CREATE if item.create_revision > since else history_module.UPDATE
            self.history.record_change(
                kind, name, op, item.mod_revision, item.value, history_module.LIST, snapshot=listed.revision
            )
        self.history.record_sync(listed.revision, snapshot=True)
        return listed.revision + 1
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
        else:
            assert event.value is not None
            obj = self.echoes.take(event.key, event.value) if self.echoes else None
            if obj is not None:
                obj = self.interner.intern(obj)
            else:
                obj = self._decode(kind, event.key, event.value)
                if obj is None:
                    table.mark_unreadable(name, event.revision)
                    return
            table.apply(obj, event.revision, event.create_revision)
        if self.history is not None:
            self.history.record_change(kind, name, _operation(event), event.revision, event.value)

    def _record(self, event: kv.WatchEvent, source: str) -> None:
        """Record a change the mirror already reflects (a replay up to the listed revision)."""
        assert self.history is not None
        kind, _, name = event.key.partition("/")
        if kind not in models.KINDS:
            return
        if event.value is not None and self._decode(kind, event.key, event.value) is None:
            return
        self.history.record_change(kind, name, _operation(event), event.revision, event.value, source)

    def _decode(self, kind: str, key: str, value: bytes) -> models.AnyObject | None:
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
        return self.interner.intern(obj)


def _operation(event: kv.WatchEvent) -> str:
    if event.type is kv.EventType.DELETE:
        return history_module.DELETE
    return history_module.CREATE if event.create_revision == event.revision else history_module.UPDATE
