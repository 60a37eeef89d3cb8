"""The ring of the SC's latest decisions and its watchers: what a new watcher gets first, the
decisions of one turn of the loop told in one batch, the ring's bound, and a watcher that falls
behind dropped without holding anything."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from controller.api import decisions as decisions_module


def decide(decisions: decisions_module.Decisions, name: str, revision: int, verb: str = "elect", cause: str = "spu-offline") -> None:
    decisions.record("partitions", name, verb, f"reason of {name}", cause, "applied", revision)


def decoded(lines: list[bytes]) -> list[tuple[str, int, Any]]:
    events = [json.loads(line) for line in lines]
    return [(event["type"], event["revision"], event["object"] and event["object"]["name"]) for event in events]


async def test_a_watcher_gets_the_ring_then_sync_then_each_decision_of_a_turn_in_one_batch() -> None:
    decisions = decisions_module.Decisions(clock=lambda: 1700000000.25)
    decide(decisions, "orders-0", 7)
    decide(decisions, "orders-1", 8)
    subscriber = await decisions.subscribe(1 << 20, lambda reason: None)
    assert [decoded(lines) for lines in subscriber.snapshot_batches()] == [
        [("ADDED", 7, "orders-0"), ("ADDED", 8, "orders-1")],
        [("SYNC", 8, None)],
    ]
    decide(decisions, "orders-2", 9)
    decide(decisions, "orders-3", 0, verb="update-status", cause="")
    batches = await asyncio.wait_for(subscriber.next(), 5)
    assert [decoded(batch.lines) for batch in batches] == [[("ADDED", 9, "orders-2"), ("ADDED", 0, "orders-3")]]
    assert json.loads(batches[0].lines[0])["object"] == {
        "time": 1700000000.25, "kind": "partitions", "name": "orders-2", "verb": "elect", "cause": "spu-offline",
        "reason": "reason of orders-2", "outcome": "applied", "revision": 9, "detail": "",
    }
    subscriber.close()
    assert decisions.subscribers == set()


async def test_the_ring_keeps_the_latest_decisions_only() -> None:
    decisions = decisions_module.Decisions(capacity=3)
    for index in range(5):
        decide(decisions, f"orders-{index}", index + 1)
    subscriber = await decisions.subscribe(1 << 20, lambda reason: None)
    assert [decoded(lines) for lines in subscriber.snapshot_batches()] == [
        [("ADDED", 3, "orders-2"), ("ADDED", 4, "orders-3"), ("ADDED", 5, "orders-4")],
        [("SYNC", 5, None)],
    ]


async def test_decisions_not_told_yet_are_in_a_new_watchers_ring_and_not_told_it_again() -> None:
    decisions = decisions_module.Decisions()
    first = await decisions.subscribe(1 << 20, lambda reason: None)
    decide(decisions, "orders-0", 3)  # its batch goes out at the loop's next turn
    second = await decisions.subscribe(1 << 20, lambda reason: None)
    assert [decoded(lines) for lines in second.snapshot_batches()] == [[("ADDED", 3, "orders-0")], [("SYNC", 3, None)]]
    assert [decoded(batch.lines) for batch in await asyncio.wait_for(first.next(), 5)] == [[("ADDED", 3, "orders-0")]]
    decide(decisions, "orders-1", 4)
    assert [decoded(batch.lines) for batch in await asyncio.wait_for(second.next(), 5)] == [[("ADDED", 4, "orders-1")]]


async def test_a_watcher_more_than_its_buffer_behind_is_dropped_and_forgotten() -> None:
    decisions = decisions_module.Decisions()
    drops: list[str] = []
    slow = await decisions.subscribe(2000, drops.append)
    for index in range(20):  # each line is about 200 bytes
        decide(decisions, f"orders-{index}", index + 1)
        await asyncio.sleep(0)
    assert drops == ["overflow"]
    assert slow.dropped == "overflow" and decisions.subscribers == set()
    assert await asyncio.wait_for(slow.next(), 5) == []
