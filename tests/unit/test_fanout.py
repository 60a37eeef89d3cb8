"""The watch feeds on a local store the test writes: the events of every kind of change, encoded once
and shared, the snapshot a late subscriber gets, overflow drops, and feeds that end with their last
subscriber."""

from __future__ import annotations

import asyncio
import json
from collections import Counter as Tally
from typing import Any

import pytest

from controller.api import fanout
from store import local, models
from tests.builders import partition, topic


class Written:
    def __init__(self) -> None:
        self.store = local.LocalStore()
        for table in self.store.tables.values():
            table.resync([], 0)
        self.revision = 0
        self.encodings: Tally[str] = Tally()
        self.feeds = fanout.Feeds(self.store, self.encodings)
        self.drops: list[str] = []

    def apply(self, *objs: models.AnyObject) -> None:
        for obj in objs:
            self.revision += 1
            self.store[obj.kind].apply(obj, self.revision)

    def delete(self, kind: str, name: str) -> None:
        self.revision += 1
        self.store[kind].delete(name, self.revision)

    async def subscribe(self, kind: str = "topics", topic: str | None = None, buffer_bytes: int = 1 << 20) -> fanout.Subscriber:
        keep = None if topic is None else (lambda obj: obj.topic == topic)
        return await self.feeds.subscribe(kind, topic, keep, buffer_bytes, self.drops.append)


def events(lines: list[bytes]) -> list[tuple[str, int, Any]]:
    decoded = [json.loads(line) for line in lines]
    return [(event["type"], event["revision"], event["object"] and event["object"]["name"]) for event in decoded]


async def received(subscriber: fanout.Subscriber) -> list[tuple[str, int, Any]]:
    batches = await asyncio.wait_for(subscriber.next(), 5)
    return events([line for batch in batches for line in batch.lines])


@pytest.fixture
async def written() -> Any:
    state = Written()
    yield state
    await state.feeds.close()


async def test_a_subscriber_gets_the_state_then_every_change(written: Written) -> None:
    written.apply(topic("a"), topic("b"))
    subscriber = await written.subscribe()
    assert events([line for batch in subscriber.snapshot_batches() for line in batch]) == [
        ("ADDED", 1, "a"),
        ("ADDED", 2, "b"),
        ("SYNC", 2, None),
    ]
    written.apply(topic("a", reason="changed"), topic("c"))
    written.apply(topic("b"))  # the same object again: nothing to tell
    written.delete("topics", "b")
    assert await received(subscriber) == [("MODIFIED", 3, "a"), ("ADDED", 4, "c"), ("DELETED", 6, "b")]
    written.store["topics"].resync([(topic("c"), 10, 4)], 10)  # a relist that lost "a"
    assert await received(subscriber) == [("DELETED", 10, "a")]
    subscriber.close()


async def test_every_subscriber_shares_the_same_batches_and_each_change_is_encoded_once(written: Written) -> None:
    written.apply(topic("a"))
    subscribers = [await written.subscribe() for _ in range(30)]
    assert written.encodings == {"topics": 1}
    written.apply(topic("a", reason="x"), topic("b"))
    batches = [await asyncio.wait_for(subscriber.next(), 5) for subscriber in subscribers]
    assert all(got[0] is batches[0][0] for got in batches)  # the same object, not a copy
    assert batches[0][0].chunk is batches[0][0].chunk  # joined once
    assert written.encodings == {"topics": 3}
    for subscriber in subscribers:
        subscriber.close()


async def test_a_late_subscriber_starts_from_the_latest_state_in_last_change_order(written: Written) -> None:
    first = await written.subscribe()
    written.apply(topic("a"), topic("b"), topic("a", reason="again"))
    await received(first)
    late = await written.subscribe()
    assert events([line for batch in late.snapshot_batches() for line in batch]) == [
        ("ADDED", 2, "b"),
        ("ADDED", 3, "a"),
        ("SYNC", 3, None),
    ]
    assert written.encodings == {"topics": 2}  # "a" twice before the feed looked: its latest state only


async def test_a_filtered_feed_tells_only_its_topic(written: Written) -> None:
    written.apply(partition("a-0"), partition("b-0"))
    subscriber = await written.subscribe("partitions", "b")
    assert events(next(subscriber.snapshot_batches())) == [("ADDED", 2, "b-0")]
    written.apply(partition("a-1"), partition("b-1"))
    assert await received(subscriber) == [("ADDED", 4, "b-1")]


async def test_a_subscriber_past_its_buffer_is_dropped_and_the_others_keep_everything(written: Written) -> None:
    slow = await written.subscribe(buffer_bytes=50_000)
    fast = await written.subscribe(buffer_bytes=50_000)
    got: list[tuple[str, int, Any]] = []
    for version in range(10):
        written.apply(topic("a", reason="x" * 10_000 + str(version)))
        got += await received(fast)
    assert [event[1] for event in got] == list(range(1, 11))
    assert (slow.dropped, written.drops) == ("overflow", ["overflow"])
    assert await slow.next() == []
    assert slow not in slow.feed.subscribers
    fast.close()


async def test_a_feed_ends_with_its_last_subscriber_and_a_new_one_starts_after(written: Written) -> None:
    table = written.store["topics"]
    written.apply(topic("a"))
    one, two = await written.subscribe(), await written.subscribe()
    assert len(table._listeners) == 1 and len(written.feeds) == 1
    one.close()
    assert len(table._listeners) == 1
    two.close()
    await asyncio.sleep(0)
    assert (len(table._listeners), len(written.feeds)) == (0, 0)
    again = await written.subscribe()
    assert events([line for batch in again.snapshot_batches() for line in batch]) == [("ADDED", 1, "a"), ("SYNC", 1, None)]
    assert written.encodings == {"topics": 2}  # a new feed encodes its state again


async def test_a_feed_that_fails_drops_its_subscribers(written: Written, monkeypatch: pytest.MonkeyPatch) -> None:
    subscriber = await written.subscribe()

    def broken(obj: models.AnyObject) -> bytes:
        raise RuntimeError("a bug")

    monkeypatch.setattr(models, "encode", broken)
    written.apply(topic("a"))
    assert await asyncio.wait_for(subscriber.next(), 5) == []
    assert subscriber.dropped == "error"


async def test_an_object_deleted_and_created_again_between_two_batches_is_deleted_then_added(written: Written) -> None:
    """Even with the very same content: the object created again is a new one. Before, the
    watchers were told nothing (the re-creation hid the delete)."""
    written.apply(topic("a"), topic("b"))
    subscriber = await written.subscribe()
    subscriber.snapshot_batches()
    written.delete("topics", "a")
    written.apply(topic("a"))
    written.apply(topic("b", reason="changed"))
    # The old one's end at the new one's creation (it was gone by then), then the new one.
    assert await received(subscriber) == [("DELETED", 4, "a"), ("ADDED", 4, "a"), ("MODIFIED", 5, "b")]
    subscriber.close()


async def test_an_object_deleted_and_created_again_while_the_watch_was_down_is_deleted_then_added(written: Written) -> None:
    """The same, learnt from a relist: the listing holds "a" under a new create revision. Before,
    the watchers were told nothing (the relist was taken for an update of the same content)."""
    written.apply(topic("a"), topic("b"))
    subscriber = await written.subscribe()
    subscriber.snapshot_batches()
    written.store["topics"].resync([(topic("a"), 7, 7), (topic("b"), 2, 2)], 8)
    assert await received(subscriber) == [("DELETED", 7, "a"), ("ADDED", 7, "a")]
    subscriber.close()
