"""The expensive-work gate and the watcher registry: slots, the queue in arrival order, refusals with
what to do, slots handed on when a waiter leaves, the worker thread, and the watcher limits."""

from __future__ import annotations

import asyncio
import threading

import pytest

from controller.api import admission


async def test_the_gate_runs_its_limit_queues_the_next_and_refuses_the_rest() -> None:
    gate = admission.Gate(limit=2, queue=1, wait=60)
    first, second = gate.slot("list"), gate.slot("list")
    await first.__aenter__()
    await second.__aenter__()
    assert (gate.running, gate.waiting) == (2, 0)
    queued = asyncio.create_task(_hold(gate, "placement"))
    await asyncio.sleep(0)
    assert (gate.running, gate.waiting) == (2, 1)
    with pytest.raises(admission.Busy) as refused:
        async with gate.slot("list"):
            pass
    assert refused.value.retry_after == 60
    assert refused.value.message == (
        "the SC is busy: 2 expensive requests (lists, placements, dry runs) are running and 1 are waiting, the most "
        "it takes (max_expensive_requests=2, max_expensive_queue=1); retry in 60 s, or list in pages with ?limit="
    )
    await first.__aexit__(None, None, None)  # the slot goes to the waiter, not back to the pool
    assert await asyncio.wait_for(queued, 1) == (2, 0)
    await second.__aexit__(None, None, None)
    assert (gate.running, gate.waiting) == (0, 0)
    assert (gate.admitted, gate.refused) == ({"list": 2, "placement": 1}, {"list": 1})


async def _hold(gate: admission.Gate, purpose: str) -> tuple[int, int]:
    async with gate.slot(purpose):
        return gate.running, gate.waiting


async def test_waiters_get_slots_in_arrival_order() -> None:
    gate = admission.Gate(limit=1, queue=10, wait=60)
    order: list[int] = []
    release = asyncio.Event()

    async def take(number: int) -> None:
        async with gate.slot("list"):
            order.append(number)
            await release.wait()

    holder = asyncio.create_task(take(0))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(take(number)) for number in range(1, 6)]
    await asyncio.sleep(0)
    assert gate.waiting == 5
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, *waiters), 1)
    assert order == [0, 1, 2, 3, 4, 5]
    assert (gate.running, gate.waiting) == (0, 0)


async def test_a_waiter_past_the_deadline_is_refused_and_leaves_the_queue() -> None:
    gate = admission.Gate(limit=1, queue=5, wait=0.01)
    async with gate.slot("list"):
        with pytest.raises(admission.Busy) as refused:
            async with gate.slot("fluvio-list"):
                pass
        assert gate.waiting == 0
    assert refused.value.message == (
        "the SC is busy: this request waited 0.01 s for one of the 1 slots for expensive requests "
        "(max_expensive_requests) and got none; retry in 1 s, or list in pages with ?limit="
    )
    assert (gate.running, gate.refused) == (0, {"fluvio-list": 1})


async def test_a_cancelled_waiter_hands_on_a_slot_it_was_given() -> None:
    gate = admission.Gate(limit=1, queue=5, wait=60)
    holder = gate.slot("list")
    await holder.__aenter__()
    waiter = asyncio.create_task(_hold(gate, "list"))
    later = asyncio.create_task(_hold(gate, "list"))
    await asyncio.sleep(0)
    await holder.__aexit__(None, None, None)  # the slot is set on the first waiter's future...
    waiter.cancel()  # ...which is cancelled before it runs: the slot must reach the next one
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await asyncio.wait_for(later, 1) == (1, 0)
    assert (gate.running, gate.waiting) == (0, 0)


async def test_offloaded_work_runs_in_the_worker_thread() -> None:
    gate = admission.Gate(limit=1, queue=0, wait=1)
    try:
        name = await gate.offload(lambda: threading.current_thread().name)
        assert name.startswith("sc-expensive") and name != threading.current_thread().name
        with pytest.raises(ZeroDivisionError):
            await gate.offload(divmod, 1, 0)
    finally:
        gate.close()


def test_watchers_are_limited_in_all_and_per_address() -> None:
    watchers = admission.Watchers(limit=3, per_address=2)
    first = watchers.admit("http", "topics", "10.0.0.1")
    watchers.admit("websocket", "partitions", "10.0.0.1")
    with pytest.raises(admission.Busy) as per_address:
        watchers.admit("fluvio", "topics", "10.0.0.1")
    assert per_address.value.message == (
        "the SC already serves 2 watch streams to 10.0.0.1, the limit for one address "
        "(max_watchers_per_address=2); close some or retry in 5 s"
    )
    watchers.admit("fluvio", "topics", "10.0.0.2")
    with pytest.raises(admission.Busy) as in_all:
        watchers.admit("http", "topics", "10.0.0.3")
    assert in_all.value.message == "the SC already serves 3 watch streams, its limit (max_watchers=3); retry in 5 s"
    assert watchers.refused == {"fluvio": 1, "http": 1}
    first.dropped("overflow")
    first.release()
    first.release()  # idempotent
    assert watchers.open == {("http", "topics"): 0, ("websocket", "partitions"): 1, ("fluvio", "topics"): 1}
    assert watchers.dropped == {("http", "overflow"): 1}
    watchers.admit("http", "topics", "10.0.0.1")
    assert watchers.total == 3
