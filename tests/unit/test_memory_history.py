"""The memory store's watch history is bounded, as etcd's is by its auto-compaction: a long
`sc run --store memory` kept every event of every write (+67 per round of a topic created and
deleted, for 9 live keys)."""

from __future__ import annotations

import pytest

from store import kv, memory


async def test_past_its_limit_the_older_half_of_the_history_is_compacted_and_watchers_told() -> None:
    store = memory.MemoryStore(history_limit=10)
    try:
        for number in range(100):
            await store.txn([], [kv.Put("a", b"%d" % number), kv.Put("b", b"%d" % number)])  # two events a revision
            assert len(store._history) <= 10
        now = await store.revision()
        with pytest.raises(kv.Compacted):
            async for _ in store.watch("", 1):
                pass
        # A watcher within the kept history gets every event from where it asked.
        events = []
        async for event in store.watch("", now - 1):
            events.append((event.key, event.revision))
            if len(events) == 4:
                break
        assert events == [("a", now - 1), ("b", now - 1), ("a", now), ("b", now)]
    finally:
        await store.close()


def test_a_limit_below_two_events_is_refused() -> None:
    with pytest.raises(ValueError, match="history_limit must be at least 2 events, got 1"):
        memory.MemoryStore(history_limit=1)
