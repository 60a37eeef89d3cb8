"""The connection manager's pusher sends what a burst changes together: one push for the changes
that reach the local store within PUSH_LINGER of the first, not one per store apply (1,000 topics
created at once made ~1,500 Updates per SPU process, whose confirmations then came back one by one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from connection_manager import health, lrs, server
from store import local, models
from tests import builders
from tests.builders import partition


@contextlib.asynccontextmanager
async def pushing(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[local.LocalStore, list[list[str]]]]:
    """A connection manager's pusher running over a fresh local store, and the partitions each of
    its pushes was given, in order (push itself is tested elsewhere)."""
    store = local.LocalStore()
    cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas())
    pushed: list[list[str]] = []

    def record(spu_changes: local.Changes[models.Spu], partition_changes: local.Changes[models.Partition]) -> None:
        pushed.append(sorted(entry.name for entry in partition_changes.updated))

    monkeypatch.setattr(cm, "push", record)
    pusher = asyncio.create_task(cm._push_changes())
    try:
        await asyncio.sleep(0)  # its listeners start from now
        yield store, pushed
    finally:
        pusher.cancel()
        await asyncio.gather(pusher, return_exceptions=True)


@pytest.mark.looptime(start=0)
async def test_the_changes_of_a_burst_go_in_one_push_and_later_ones_in_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    async with pushing(monkeypatch) as (store, pushed):
        for index in range(20):  # one apply at a time, spread over half the linger
            store["partitions"].apply(partition(f"burst-{index}", [0, 1]), index + 1)
            await asyncio.sleep(server.PUSH_LINGER / 40)
        await asyncio.sleep(server.PUSH_LINGER * 2)
        assert pushed == [sorted(f"burst-{index}" for index in range(20))]

        store["partitions"].apply(partition("later-0", [1, 2]), 100)
        await asyncio.sleep(server.PUSH_LINGER * 2)
        assert pushed[1:] == [["later-0"]]


@pytest.mark.looptime(start=0)
async def test_a_push_waits_no_longer_than_the_linger_under_a_steady_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    # A change every tenth of the linger for ten lingers: the changes are not held until the
    # stream stops, each push goes out one linger after the first change it carries.
    async with pushing(monkeypatch) as (store, pushed):
        for index in range(100):
            store["partitions"].apply(partition(f"stream-{index}", [0, 1]), index + 1)
            await asyncio.sleep(server.PUSH_LINGER / 10)
        await asyncio.sleep(server.PUSH_LINGER * 2)
        assert 8 <= len(pushed) <= 11
        assert sorted(name for names in pushed for name in names) == sorted(f"stream-{index}" for index in range(100))


def test_partitions_deleted_beyond_the_tombstones_kept_are_forgotten_by_a_full_push() -> None:
    """More partitions deleted between two pushes than the mirror keeps tombstones for make the
    pusher's changes full, which list nothing deleted. Their confirmations and offsets were then
    kept for good (7,918 of each after one topic of 11,000 partitions was deleted)."""
    store = local.LocalStore(tombstone_limit=5)
    cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas())
    spus, partitions = store["spus"].listener(local.Part.SPEC), store["partitions"].listener(local.Part.ALL)
    names = [f"burst-{index}" for index in range(12)]
    for revision, name in enumerate([*names, "kept-0"], start=1):
        store["partitions"].apply(partition(name, [0, 1]), revision)
        cm.confirmed[name] = (0, 0)
        cm.live.committed(name, 7)
    cm.push(spus.changes(), partitions.changes())
    for revision, name in enumerate(names, start=100):
        store["partitions"].delete(name, revision)
    changes = partitions.changes()
    assert changes.full and not changes.deleted  # the path under test
    cm.push(spus.changes(), changes)
    assert set(cm.confirmed) == {"kept-0"} and set(cm.live.max_hws) == {"kept-0"}
    spus.close()
    partitions.close()


def test_the_health_of_an_spu_no_longer_registered_is_forgotten() -> None:
    """Every SPU and partition pass copies the health view: an id registered, connected and
    deleted again and again (an SPU group's ranges, churned registrations) added a record each."""
    store = local.LocalStore()
    view = health.HealthView(0.0)
    cm = server.ConnectionManager(store, view, lrs.LiveReplicas())
    spus, partitions = store["spus"].listener(local.Part.SPEC), store["partitions"].listener(local.Part.ALL)
    for revision, spu_id in enumerate((0, 5), start=1):
        store["spus"].apply(builders.spu(spu_id), revision)
        view.set(spu_id, health.Health.OFFLINE, 1.0)  # connected once, gone since
    cm.push(spus.changes(), partitions.changes())
    assert sorted(view.known()) == [0, 5]
    store["spus"].delete(builders.spu(5).name, 10)
    cm.push(spus.changes(), partitions.changes())
    assert view.known() == [0] and view.get(5) is health.Health.UNKNOWN
    spus.close()
    partitions.close()
