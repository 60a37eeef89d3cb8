"""POST /v1/placement's worker process (controller/api/placement_worker.py), driven directly: the
answers are the in-process ones, errors keep their shape, and a child that dies or a request that
is cancelled costs that request only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import json
import os
import signal
from pathlib import Path

import pytest

from controller import placement
from controller.api import placement_answer, placement_worker

SPUS = [placement.SpuInfo(spu_id, f"r{spu_id % 2}") for spu_id in range(4)]


@pytest.fixture
async def worker() -> AsyncIterator[placement_worker.PlacementWorker]:
    started = placement_worker.PlacementWorker(
        {"chatty": "tests.placement_plugins:Chatty", "hangs": "tests.placement_plugins:Hangs"}, entry_points=False
    )
    yield started
    await started.close()


async def test_answers_are_those_computed_in_process(worker: placement_worker.PlacementWorker) -> None:
    body = json.dumps({"partitions": 7, "replicationFactor": 3, "startIndex": 2}).encode()
    assert await worker.answer(body, SPUS) == placement_answer.for_body(body, SPUS, {})
    # A plug-in loaded by the child; what it prints does not get into the answers' frames.
    chatty = json.dumps({"partitions": 2, "replicationFactor": 2, "strategy": "chatty"}).encode()
    assert json.loads(await worker.answer(chatty, SPUS))["replicaMap"] == [[3, 2], [3, 2]]
    assert worker.started == 1 and worker.pid not in (None, os.getpid())
    # The OOM killer's first choice, before the SC.
    assert Path(f"/proc/{worker.pid}/oom_score_adj").read_text().strip() == "1000"


@pytest.mark.parametrize(
    ("body", "spus", "status", "code", "message"),
    [
        (b"[1]", SPUS, 400, "MalformedRequest", "the request body must be a JSON object (a placement request"),
        (b"{", SPUS, 400, "MalformedRequest", "the request body is not valid JSON"),
        (b'{"partitions": 1}', SPUS, 422, "InvalidConfig", "request has no replicationFactor"),
        (b'{"partitions": 1, "replicationFactor": 5}', SPUS, 422, "InsufficientResources", "replication factor 5 needs 5"),
        (b'{"partitions": 1, "replicationFactor": 1}', None, 503, "NotSynced", "the SC is still loading its store"),
    ],
)
async def test_refusals_keep_their_status_code_and_message(
    worker: placement_worker.PlacementWorker, body: bytes, spus: list[placement.SpuInfo] | None, status: int, code: str, message: str
) -> None:
    with pytest.raises(placement_answer.Refused) as refused:
        await worker.answer(body, spus)
    assert (refused.value.status, refused.value.code) == (status, code)
    assert refused.value.message.startswith(message), refused.value.message
    # The child goes on after a refusal.
    assert json.loads(await worker.answer(b'{"partitions": 1, "replicationFactor": 1}', SPUS))["replicaMap"] == [[0]]
    assert worker.started == 1


# A request the child is still at when the test acts: its plug-in takes a minute.
SLOW = json.dumps({"partitions": 1, "replicationFactor": 1, "strategy": "hangs"}).encode()


async def test_a_child_that_dies_mid_request_fails_that_request_only(worker: placement_worker.PlacementWorker) -> None:
    await worker.answer(b'{"partitions": 1, "replicationFactor": 1}', SPUS)
    first = worker.pid
    assert first is not None
    request = asyncio.create_task(worker.answer(SLOW, SPUS))
    await asyncio.sleep(0.5)
    os.kill(first, signal.SIGKILL)  # as the kernel's OOM killer would
    with pytest.raises(placement_answer.Refused) as refused:
        await request
    assert (refused.value.status, refused.value.code) == (503, "PlacementWorkerGone")
    assert "(killed by signal 9)" in refused.value.message
    assert json.loads(await worker.answer(b'{"partitions": 1, "replicationFactor": 1}', SPUS))["replicaMap"] == [[0]]
    assert worker.started == 2 and worker.pid != first


async def test_a_cancelled_request_stops_the_child_and_the_next_gets_a_new_one(worker: placement_worker.PlacementWorker) -> None:
    request = asyncio.create_task(worker.answer(SLOW, SPUS))
    await asyncio.sleep(0.5)
    first = worker.pid
    assert first is not None
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert worker.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)  # killed and reaped, not left computing
    assert len(json.loads(await worker.answer(b'{"partitions": 2, "replicationFactor": 1}', SPUS))["replicaMap"]) == 2
    assert worker.started == 2


async def test_a_child_whose_plug_in_cannot_load_answers_503() -> None:
    broken = placement_worker.PlacementWorker({"broken": "tests.placement_plugins:BrokenAtStart"}, entry_points=False)
    try:
        with pytest.raises(placement_answer.Refused) as refused:
            await broken.answer(b'{"partitions": 1, "replicationFactor": 1}', SPUS)
        assert (refused.value.status, refused.value.code) == (503, "PlacementWorkerGone")
    finally:
        await broken.close()


async def test_a_child_that_cannot_be_started_answers_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_worker.sys, "executable", "/nonexistent/python")
    worker = placement_worker.PlacementWorker({}, entry_points=False)
    with pytest.raises(placement_answer.Refused) as refused:
        await worker.answer(b'{"partitions": 1, "replicationFactor": 1}', SPUS)
    assert (refused.value.status, refused.value.code) == (503, "PlacementWorkerGone")
    assert "could not be started" in refused.value.message
    monkeypatch.undo()
    assert json.loads(await worker.answer(b'{"partitions": 1, "replicationFactor": 1}', SPUS))["replicaMap"] == [[0]]
    await worker.close()


async def test_closing_stops_a_child_in_the_middle_of_a_request(worker: placement_worker.PlacementWorker) -> None:
    request = asyncio.create_task(worker.answer(SLOW, SPUS))
    while worker.pid is None:
        await asyncio.sleep(0.01)
    child = worker.pid
    await asyncio.sleep(0.2)
    await asyncio.wait_for(worker.close(), 10)  # not after the plug-in's minute
    with pytest.raises(placement_answer.Refused) as refused:
        await request
    assert (refused.value.status, refused.value.code) == (503, "PlacementWorkerGone")
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
