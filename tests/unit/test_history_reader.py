"""The Reader records what it sees, and after a restart replays into the history what changed meanwhile.

Runs on the memory backend and on a real etcd (the ``kv_store`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controller import metrics
from controller.pipeline import reader as reader_module
from store import history, kv, local, models
from tests import builders

def topic(name: str, resolution: str = "Init") -> bytes:
    return models.encode(builders.topic(name, resolution=resolution))


class RunningReader:
    """A Reader with a recorder over ``directory``, run until ``stop()``."""

    def __init__(self, kv_store: kv.KVStore, directory: Path) -> None:
        self.kv_store = kv_store
        self.directory = directory

    async def start(self) -> None:
        self.recorder = history.Recorder.open(self.directory)
        await self.recorder.start()
        self.local_store = local.LocalStore()
        self.reader = reader_module.Reader(self.kv_store, self.local_store, metrics.Metrics(), history=self.recorder)
        self.task = asyncio.create_task(self.reader.run())
        await asyncio.wait_for(self.reader.synced.wait(), 10)

    async def until_recorded(self, revision: int) -> None:
        """Wait until the history holds every change up to ``revision``."""
        async with asyncio.timeout(10):
            while (self.recorder.resume_revision or 0) < revision:
                await asyncio.sleep(0.01)
        await self.recorder.flush()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.recorder.close()


@pytest.fixture
async def running(kv_store: kv.KVStore, tmp_path: Path) -> AsyncIterator[RunningReader]:
    runner = RunningReader(kv_store, tmp_path)
    yield runner
    if not runner.recorder._closed:
        await runner.stop()


def changes(directory: Path) -> list[tuple[Any, ...]]:
    """(type, source, op, kind, name, revision, resolution) of every change, gap and sync record."""
    rows: list[tuple[Any, ...]] = []
    for record in history.HistoryReader(directory).records():
        if record["type"] == history.CHANGE:
            status = (record["object"] or {}).get("status", {})
            rows.append(
                ("change", record["source"], record["op"], record["kind"], record["name"], record["revision"], status.get("resolution"))
            )
        elif record["type"] == history.GAP:
            rows.append(("gap", record["reason"], record["firstRevision"], record["lastRevision"]))
        elif record["type"] == history.SYNC:
            rows.append(("sync", record["revision"], record["snapshot"]))
    return rows


async def test_watch_events_carry_the_keys_create_revision(kv_store: kv.KVStore) -> None:
    created = await kv_store.create("topics/a", topic("a"))
    updated = await kv_store.update("topics/a", topic("a", "Pending"), created)
    deleted = await kv_store.delete("topics/a")
    async with contextlib.aclosing(kv_store.watch("topics/", created)) as events:
        seen = [(event.type, event.revision, event.create_revision) async for event, _ in zip_n(events, 3)]
    assert seen == [(kv.EventType.PUT, created, created), (kv.EventType.PUT, updated, created), (kv.EventType.DELETE, deleted, 0)]


async def zip_n(events: AsyncIterator[kv.WatchEvent], count: int) -> AsyncIterator[tuple[kv.WatchEvent, int]]:
    for index in range(count):
        yield await anext(events), index


async def test_a_fresh_history_starts_with_a_snapshot_then_records_every_change(
    kv_store: kv.KVStore, running: RunningReader
) -> None:
    before = await kv_store.create("topics/a", topic("a", "Provisioned"))
    spu = builders.spu(1)
    spu_revision = await kv_store.create(spu.key, models.encode(spu))
    await kv_store.create("meta/placement-start-index", b"3")  # not an object: never recorded
    listed = await kv_store.revision()
    await running.start()
    created = await kv_store.create("topics/b", topic("b"))
    updated = await kv_store.update("topics/b", topic("b", "Pending"), created)
    deleted = await kv_store.delete("topics/a")
    await running.until_recorded(deleted)
    await running.stop()
    assert changes(running.directory) == [
        ("change", "list", "create", "spus", "spu-1", spu_revision, "Online"),
        ("change", "list", "create", "topics", "a", before, "Provisioned"),
        ("sync", listed, True),
        ("change", "watch", "create", "topics", "b", created, "Init"),
        ("change", "watch", "update", "topics", "b", updated, "Pending"),
        ("change", "watch", "delete", "topics", "a", deleted, None),
    ]


async def test_after_a_restart_what_changed_meanwhile_is_replayed_into_the_history_only(
    kv_store: kv.KVStore, running: RunningReader
) -> None:
    await running.start()
    first = await kv_store.create("topics/a", topic("a"))
    await running.until_recorded(first)
    await running.stop()

    # While the SC is down: a create, two updates, a delete, and a malformed value.
    created = await kv_store.create("topics/b", topic("b"))
    pending = await kv_store.update("topics/a", topic("a", "Pending"), first)
    provisioned = await kv_store.update("topics/a", topic("a", "Provisioned"), pending)
    await kv_store.create("topics/bad", b"{not json")
    deleted = await kv_store.delete("topics/b")

    await running.start()
    assert sorted(running.local_store["topics"].view) == ["a"]
    mirrored = running.local_store["topics"].get("a")
    assert mirrored is not None and mirrored.obj.status.resolution is models.TopicResolution.PROVISIONED
    live = await kv_store.update("topics/a", topic("a", "Deleting"), provisioned)
    await running.until_recorded(live)
    await running.stop()
    assert changes(running.directory)[2:] == [
        ("change", "replay", "create", "topics", "b", created, "Init"),
        ("change", "replay", "update", "topics", "a", pending, "Pending"),
        ("change", "replay", "update", "topics", "a", provisioned, "Provisioned"),
        ("change", "replay", "delete", "topics", "b", deleted, None),
        ("change", "watch", "update", "topics", "a", live, "Deleting"),
    ]


async def test_a_compacted_resume_point_gives_a_gap_record_and_a_snapshot(
    kv_store: kv.KVStore, running: RunningReader
) -> None:
    await running.start()
    first = await kv_store.create("topics/a", topic("a"))
    kept = await kv_store.create("topics/k", topic("k"))
    await running.until_recorded(kept)
    await running.stop()

    created = await kv_store.create("topics/b", topic("b"))
    updated = await kv_store.update("topics/a", topic("a", "Pending"), first)
    await kv_store.delete("topics/k")
    listed = await kv_store.revision()
    await kv_store.compact(listed)

    await running.start()
    await running.until_recorded(listed)
    await running.stop()
    assert changes(running.directory)[3:] == [
        ("gap", "compacted", kept + 1, listed),
        ("change", "list", "update", "topics", "a", updated, "Pending"),
        ("change", "list", "create", "topics", "b", created, "Init"),
        ("sync", listed, True),
    ]


async def test_without_a_history_the_reader_records_nothing_and_watches_from_the_listing(kv_store: kv.KVStore) -> None:
    local_store = local.LocalStore()
    reader = reader_module.Reader(kv_store, local_store, metrics.Metrics())
    task = asyncio.create_task(reader.run())
    try:
        await asyncio.wait_for(reader.synced.wait(), 10)
        await kv_store.create("topics/a", topic("a"))
        async with asyncio.timeout(10):
            while local_store["topics"].get("a") is None:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_store_behind_the_history_gives_a_gap_record_and_a_snapshot(tmp_path: Path) -> None:
    from store import memory

    first_store = memory.MemoryStore()
    for name in ("a", "b", "c"):
        await first_store.create(f"topics/{name}", topic(name))
    runner = RunningReader(first_store, tmp_path)
    await runner.start()
    await runner.until_recorded(4)
    await runner.stop()
    await first_store.close()

    restored = memory.MemoryStore()  # e.g. etcd restored from an older backup: revision 2
    created = await restored.create("topics/z", topic("z"))
    runner = RunningReader(restored, tmp_path)
    await runner.start()
    await runner.until_recorded(created)
    assert runner.recorder.resume_revision == created
    await runner.stop()
    await restored.close()
    assert changes(tmp_path)[4:] == [
        ("gap", "store-behind-history", created + 1, 4),
        ("change", "list", "create", "topics", "z", created, "Init"),
        ("sync", created, True),
    ]


class LosingStore:
    """A memory store that, once told, behaves as an etcd that came back without its last writes:
    the watch running then raises HistoryLost (as the etcd backend's does when it resumes), and
    from then on every call goes to ``restored``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._lost: asyncio.Future[kv.HistoryLost] = asyncio.get_running_loop().create_future()

    def lose(self, restored: Any, delivered: int, answered: bool = False) -> None:
        self.inner = restored
        self._lost.set_result(kv.HistoryLost(delivered, restored._revision, answered=answered))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[kv.WatchEvent]:
        events = self.inner.watch(prefix, from_revision)
        lost = self._lost
        following: asyncio.Future[kv.WatchEvent] | None = None
        try:
            while True:
                following = asyncio.ensure_future(anext(events))
                await asyncio.wait((following, lost), return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    self._lost = asyncio.get_running_loop().create_future()  # raised once
                    raise lost.result()
                yield following.result()
        finally:
            if following is not None and not following.done():
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following
            await events.aclose()


async def test_a_store_that_lost_recorded_writes_gives_a_relist_a_gap_and_a_snapshot(tmp_path: Path) -> None:
    """The etcd backend raises HistoryLost when etcd no longer has the last change its watch
    delivered (etcd 3.5.1 killed just after acknowledging writes): the reader relists, and the
    history marks what it recorded of the lost writes as a gap before the snapshot."""
    from store import memory

    before = memory.MemoryStore()
    for name in ("a", "b", "c"):
        await before.create(f"topics/{name}", topic(name))  # revisions 2, 3, 4
    store = LosingStore(before)
    runner = RunningReader(store, tmp_path)  # type: ignore[arg-type]  # the KVStore calls pass through
    await runner.start()
    await runner.until_recorded(4)

    restored = memory.MemoryStore()  # came back with a only, and took writes since
    await restored.create("topics/a", topic("a"))
    reused = [await restored.create(f"topics/{name}", topic(name)) for name in ("z", "w", "v")]  # 3, 4, 5
    store.lose(restored, delivered=4)
    async with asyncio.timeout(10):
        while runner.local_store["topics"].get("z") is None:
            await asyncio.sleep(0.01)
    assert runner.local_store["topics"].get("b") is None and runner.local_store["topics"].get("c") is None
    # The controllers stop waiting for the echoes of writes answered after that listing.
    assert (runner.local_store.forks, runner.local_store.forked_at) == (1, reused[-1])
    after = await restored.create("topics/y", topic("y"))
    await runner.until_recorded(after)
    await runner.stop()
    assert changes(tmp_path)[4:] == [
        # From the change the watch delivered that the store no longer had (b at 3 is not known lost).
        ("gap", "store-behind-history", 4, reused[-1]),
        ("change", "list", "create", "topics", "a", 2, "Init"),
        *(("change", "list", "create", "topics", name, revision, "Init") for name, revision in sorted(zip("zwv", reused))),
        ("sync", reused[-1], True),
        ("change", "watch", "create", "topics", "y", after, "Init"),
    ]


async def test_a_store_that_lost_only_writes_the_watch_had_not_delivered_is_relisted_without_a_gap(tmp_path: Path) -> None:
    """etcd answered writes at revisions it no longer reaches, but still has every change the watch
    delivered (HistoryLost with ``answered``): the reader relists so that the controllers stop
    waiting for those writes, and the history, which holds nothing of them, goes on without a gap."""
    from store import memory

    store = LosingStore(memory.MemoryStore())
    for name in ("a", "b"):
        await store.create(f"topics/{name}", topic(name))  # revisions 2, 3
    runner = RunningReader(store, tmp_path)  # type: ignore[arg-type]  # the KVStore calls pass through
    await runner.start()
    await runner.until_recorded(3)
    store.lose(store.inner, delivered=9, answered=True)  # it had answered up to 9
    async with asyncio.timeout(10):
        while runner.local_store.forks == 0:
            await asyncio.sleep(0.01)
    assert runner.local_store.forked_at == 3
    after = await store.create("topics/c", topic("c"))
    await runner.until_recorded(after)
    await runner.stop()
    assert [row[:3] for row in changes(tmp_path)] == [
        ("change", "list", "create"), ("change", "list", "create"), ("sync", 3, True), ("change", "watch", "create")
    ]


async def test_the_reader_marks_what_it_cannot_read_as_unreadable_not_deleted(tmp_path: Path) -> None:
    """A malformed value is absent from the mirror but listed as unreadable, from a relist and from
    the watch alike, until a readable value or a delete of it comes; the controllers then keep
    what it owns (a topic's partitions, a group's SPUs) instead of deleting them as orphans."""
    from store import memory

    store = memory.MemoryStore()
    await store.create("topics/a", topic("a"))
    await store.create("topics/b", b"{not json")
    runner = RunningReader(store, tmp_path)
    await runner.start()
    table = runner.local_store["topics"]
    assert (set(table.view), table.unreadable) == ({"a"}, {"b"})
    written = await store.create("topics/c", topic("c")[:-1])  # cut short: not JSON
    async with asyncio.timeout(10):
        while "c" not in table.unreadable:
            await asyncio.sleep(0.01)
    assert table.revision == written
    fixed = await store.update("topics/c", topic("c"), written)
    deleted = await store.delete("topics/b")
    await runner.until_recorded(max(fixed, deleted))
    async with asyncio.timeout(10):
        while table.unreadable or "c" not in table.view:
            await asyncio.sleep(0.01)
    # Readable now, it is the same object, created when its key was: an SPU whose record was
    # unreadable for a while is not registered again (which would take its in-sync places).
    entry = table.get("c")
    assert entry is not None and (entry.create_revision, entry.mod_revision) == (written, fixed)
    await runner.stop()
