"""POST/GET/DELETE /v1/cluster/rebalance and POST /v1/spus/{name}/decommission on a real API server
(no controllers): what is stored (meta/rebalance, spec.decommission), the refusals with the value and
the limit, a stored value that is not a run, and the admin role for the writes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller import config
from controller.api import auth
from controller.placement import planner, rebalance
from controller.reconcile import moves
from store import history, models
from tests.builders import partition, topic
from tests.unit.api_server import ApiServer, server, spu  # noqa: F401 (server is a fixture)

ADMIN_TOKEN, READ_TOKEN = "a" * 24, "r" * 24


async def three_on_four(server: ApiServer) -> None:
    """SPUs 0..3 Online; topic t: 4 partitions at RF 2 on SPUs 0..2 only (SPU 3 is new)."""
    rows = {0: [0, 1], 1: [1, 2], 2: [2, 0], 3: [0, 1]}
    await server.put(
        *(spu(i) for i in range(4)),
        topic("t", 4, 2, "Provisioned", replica_map=rows),
        *(partition(f"t-{index}", replicas) for index, replicas in rows.items()),
    )


@contextlib.asynccontextmanager
async def with_credentials() -> AsyncIterator[ApiServer]:
    """A server that asks for credentials (alice: admin, bob: read), with ``three_on_four``."""
    server = ApiServer()
    server.context.authenticator = auth.Authenticator(
        auth.parse(f"alice admin {ADMIN_TOKEN}\nbob read {READ_TOKEN}\n", "tokens"), client_certificates=False
    )
    await server.start()
    try:
        await three_on_four(server)
        yield server
    finally:
        await server.stop()


async def stored_run(server: ApiServer) -> moves.Run:
    item = await server.kv_store.get(moves.KEY)
    assert item is not None
    return moves.decode(item.value)


@pytest.mark.parametrize(
    ("path", "raw", "status", "message"),
    [
        ("/v1/cluster/rebalance", b"{", 400, "the request body"),
        ("/v1/cluster/rebalance", b"[1]", 400, 'must be a JSON object {"maxMovesPerSpu": N}, got an array'),
        ("/v1/cluster/rebalance", b'{"maxMovesPerSpu": "3"}', 400, "maxMovesPerSpu: must be a whole number, got '3'"),
        ("/v1/cluster/rebalance", b'{"maxMovesPerSpu": true}', 400, "maxMovesPerSpu: must be a whole number, got True"),
        ("/v1/cluster/rebalance", b'{"maxMovesPerSpu": 0}', 422, "maxMovesPerSpu: must be from 1 to 10000, got 0"),
        ("/v1/cluster/rebalance", b'{"maxMovesPerSpu": 10001}', 422, "maxMovesPerSpu: must be from 1 to 10000, got 10001"),
        ("/v1/cluster/rebalance", b'{"maxMoves": 2}', 422, "maxMoves: unknown field"),
        ("/v1/cluster/rebalance?dryRun=maybe", b"", 400, "query parameter dryRun must be true or false, got 'maybe'"),
        ("/v1/spus/spu-3/decommission", b'{"maxMovesPerSpu": -1}', 422, "maxMovesPerSpu: must be from 1 to 10000, got -1"),
    ],
)
async def test_bad_input_is_refused_with_the_value_and_the_limit_and_nothing_is_stored(
    server: ApiServer, path: str, raw: bytes, status: int, message: str
) -> None:
    await three_on_four(server)
    got, body = await server.call("POST", path, raw=raw)
    assert got == status, body
    assert message in body["error"]["message"], body
    assert await server.kv_store.get(moves.KEY) is None


async def test_a_rebalance_is_planned_stored_refused_twice_and_cancelled(server: ApiServer) -> None:
    await three_on_four(server)
    status, dry = await server.call("POST", "/v1/cluster/rebalance?dryRun=true")
    assert status == 200, dry
    assert (dry["replicaMoves"], dry["lowerBound"]) == (2, 2)
    assert dry["after"]["replicasPerSpu"] == {"0": 2, "1": 2, "2": 2, "3": 2}
    assert await server.kv_store.get(moves.KEY) is None

    status, plan = await server.call("POST", "/v1/cluster/rebalance", {"maxMovesPerSpu": 3})
    assert status == 202, plan
    assert (plan["moves"], plan["state"], plan["maxMovesPerSpu"]) == (dry["moves"], "running", 3)
    run = await stored_run(server)
    assert (run.kind, run.state, run.max_moves_per_spu) == ("rebalance", "running", 3)
    assert [(move.partition, list(move.before), list(move.after)) for move in run.moves] == [
        (move["partition"], move["from"], move["to"]) for move in plan["moves"]
    ]
    await server.mirrored()
    status, progress = await server.call("GET", "/v1/cluster/rebalance")
    assert (status, progress) == (
        200,
        {"state": "running", "kind": "rebalance", "total": 2, "done": 0, "inFlight": [], "pending": 2, "skipped": []},
    )
    status, refused = await server.call("POST", "/v1/cluster/rebalance")
    assert (status, refused["error"]["code"]) == (409, "RebalanceRunning")
    status, refused = await server.call("POST", "/v1/spus/spu-3/decommission")
    assert (status, refused["error"]["code"]) == (409, "RebalanceRunning")

    status, cancelled = await server.call("DELETE", "/v1/cluster/rebalance")
    assert (status, cancelled) == (200, {"state": "cancelled", "kind": "rebalance", "total": 2})
    assert (await stored_run(server)).state == "cancelled"
    status, refused = await server.call("DELETE", "/v1/cluster/rebalance")
    assert (status, refused["error"]) == (
        409, {"code": "NotRunning", "message": "no rebalance is running (state cancelled): there is nothing to cancel"}
    )


async def test_progress_decodes_the_stored_run_once_while_it_is_unchanged(server: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding a run of 8,814 moves is 127 ms on the event loop, which any read credential could
    ask for on every request (the live page asks whenever the moving partitions change)."""
    decoded: list[int] = []
    real = moves.decode

    def counted(value: bytes) -> moves.Run:
        decoded.append(len(value))
        return real(value)

    monkeypatch.setattr(moves, "decode", counted)
    await three_on_four(server)
    assert (await server.call("POST", "/v1/cluster/rebalance"))[0] == 202
    await server.mirrored()
    decoded.clear()
    answers = [await server.call("GET", "/v1/cluster/rebalance") for _ in range(3)]
    assert all(answer == (200, answers[0][1]) for answer in answers) and answers[0][1]["state"] == "running"
    assert len(decoded) == 1
    status, _ = await server.call("DELETE", "/v1/cluster/rebalance")  # a new value: decoded again
    assert status == 200
    await server.mirrored()
    decoded.clear()
    status, progress = await server.call("GET", "/v1/cluster/rebalance")
    assert (status, progress["state"], len(decoded)) == (200, "cancelled", 1)


async def test_a_stored_value_that_is_not_a_run_is_shown_as_a_problem_and_replaced_by_a_new_plan(server: ApiServer) -> None:
    await three_on_four(server)
    await server.kv_store.create(moves.KEY, b'{"kind": "rebalance", "state": "running"}')
    await server.mirrored()
    status, progress = await server.call("GET", "/v1/cluster/rebalance")
    assert status == 200 and progress["state"] == "idle"
    assert "maxMovesPerSpu None is not an integer" in progress["problem"]
    status, cancel = await server.call("DELETE", "/v1/cluster/rebalance")
    assert (status, cancel["error"]["code"]) == (409, "NotRunning")
    status, plan = await server.call("POST", "/v1/cluster/rebalance")
    assert status == 202, plan
    assert (await stored_run(server)).max_moves_per_spu == server.context.settings.rebalance_max_moves_per_spu


async def test_a_decommission_marks_the_spu_and_stores_a_plan_that_empties_it(server: ApiServer) -> None:
    await three_on_four(server)
    status, missing = await server.call("POST", "/v1/spus/spu-9/decommission")
    assert (status, missing["error"]["code"]) == (404, "NotFound")
    status, plan = await server.call("POST", "/v1/spus/spu-0/decommission", {"maxMovesPerSpu": 1})
    assert status == 202, plan
    assert (plan["spu"], plan["name"], plan["state"], plan["after"]["replicasPerSpu"]["0"]) == (0, "spu-0", "running", 0)
    assert sorted(move["partition"] for move in plan["moves"]) == ["t-0", "t-2", "t-3"]
    run = await stored_run(server)
    assert (run.kind, run.decommissioning, run.max_moves_per_spu) == ("decommission", (0,), 1)
    marked = await server.read("spus", "spu-0")
    assert isinstance(marked, models.Spu) and marked.spec.decommission
    assert json.loads(models.encode(marked))["spec"]["decommission"] is True


async def test_the_writes_need_the_admin_role_and_a_dry_run_only_read() -> None:
    async with with_credentials() as server:
        assert server.session is not None

        async def call(method: str, path: str, token: str) -> int:
            assert server.session is not None
            async with server.session.request(method, path, headers={"Authorization": f"Bearer {token}"}) as response:
                return response.status

        assert await call("POST", "/v1/cluster/rebalance?dryRun=true", READ_TOKEN) == 200
        assert await call("GET", "/v1/cluster/rebalance", READ_TOKEN) == 200
        assert await call("POST", "/v1/cluster/rebalance", READ_TOKEN) == 403
        assert await call("DELETE", "/v1/cluster/rebalance", READ_TOKEN) == 403
        assert await call("POST", "/v1/spus/spu-0/decommission", READ_TOKEN) == 403
        assert await server.kv_store.get(moves.KEY) is None
        assert await call("POST", "/v1/cluster/rebalance", ADMIN_TOKEN) == 202


async def test_plans_take_a_slot_of_the_gate_and_are_computed_in_its_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan is seconds of CPU on a large cluster (30,000 partitions: 16 s), and a read credential
    may ask for dry runs: beyond the gate's slots and queue they are 429, not queued without end."""
    threads: list[str] = []
    real = planner.plan

    def recorded(request: rebalance.RebalanceRequest) -> rebalance.RebalancePlan:
        threads.append(threading.current_thread().name)
        return real(request)

    monkeypatch.setattr(planner, "plan", recorded)
    server = ApiServer(settings=config.Settings(max_expensive_requests=1, max_expensive_queue=0))
    await server.start()
    try:
        await three_on_four(server)
        async with server.context.gate.slot("placement"):
            for path in (
                "/v1/cluster/rebalance?dryRun=true",
                "/v1/cluster/rebalance",
                "/v1/spus/spu-3/decommission?dryRun=true",
                "/v1/spus/spu-3/decommission",
            ):
                status, body = await server.call("POST", path)
                assert (status, body["error"]["code"]) == (429, "TooManyRequests"), path
        assert (threads, server.context.gate.refused) == ([], {"rebalance": 4})
        assert await server.kv_store.get(moves.KEY) is None
        spu_3 = await server.read("spus", "spu-3")
        assert isinstance(spu_3, models.Spu) and not spu_3.spec.decommission
        assert (await server.call("POST", "/v1/cluster/rebalance?dryRun=true"))[0] == 200
        assert (await server.call("POST", "/v1/spus/spu-3/decommission?dryRun=true"))[0] == 200
        assert len(threads) == 2 and all(name.startswith("sc-expensive") for name in threads), threads
        assert (server.context.gate.running, server.context.gate.admitted["rebalance"]) == (0, 2)
    finally:
        await server.stop()


async def test_a_decommission_dry_run_writes_nothing_and_needs_only_read() -> None:
    async with with_credentials() as server:
        assert server.session is not None
        headers = {"Authorization": f"Bearer {READ_TOKEN}"}
        async with server.session.post("/v1/spus/spu-0/decommission?dryRun=true", headers=headers) as response:
            assert response.status == 200
            plan = await response.json()
        assert (plan["spu"], plan["after"]["replicasPerSpu"]["0"], "state" in plan) == (0, 0, False)
        # dryRun takes true or false only: what the credentials check takes for a dry run ("", "1") is
        # refused as malformed, anything else needs admin; either way the read role writes nothing.
        for value, status in (("", 400), ("1", 400), ("yes", 403)):
            async with server.session.post(f"/v1/spus/spu-0/decommission?dryRun={value}", headers=headers) as response:
                assert response.status == status, value
        assert await server.kv_store.get(moves.KEY) is None
        spu_0 = await server.read("spus", "spu-0")
        assert isinstance(spu_0, models.Spu) and not spu_0.spec.decommission


async def test_each_planned_move_and_the_cancel_are_in_the_history(server: ApiServer, tmp_path: Path) -> None:
    recorder = history.Recorder.open(tmp_path)
    await recorder.start()
    server.context.history = recorder
    await three_on_four(server)
    status, plan = await server.call("POST", "/v1/cluster/rebalance")
    assert status == 202, plan
    status, _ = await server.call("DELETE", "/v1/cluster/rebalance")
    assert status == 200
    await recorder.close()
    recorded = [
        (record["kind"], record["name"], record["verb"], record["cause"], record["reason"])
        for record in history.HistoryReader(tmp_path).records()
        if record["type"] == "action"
    ]
    assert recorded == [
        ("partitions", "t-0", "plan", "move-planned", "rebalance planned: [0, 1] -> [3, 1]"),
        ("partitions", "t-3", "plan", "move-planned", "rebalance planned: [0, 1] -> [0, 3]"),
        ("meta", "rebalance", "cancel", "rebalance-run", "rebalance of 2 moves cancelled: moves in flight go back"),
    ]


async def test_replicas_on_an_spu_deleted_with_them_move_off_it_when_an_operator_plans(server: ApiServer) -> None:
    """SPU 2 died and was unregistered while t-1 and t-2 still had replicas on it (allowed, with a
    warning: they stay assigned to its id). Every plan was refused then, a rebalance and any SPU's
    decommission alike ("partition t-1 has a replica on SPU 2, which is not in spus"): the cluster
    could not be rebalanced nor shrunk until an SPU took id 2 again. A plan takes those replicas
    off the id now, as off a decommissioned SPU that is down."""
    rows = {0: [0, 1], 1: [1, 2], 2: [2, 0], 3: [0, 1]}
    await server.put(
        *(spu(i) for i in (0, 1, 3)),
        topic("t", 4, 2, "Provisioned", replica_map=rows),
        *(partition(f"t-{index}", replicas) for index, replicas in rows.items()),
    )
    for path in ("/v1/cluster/rebalance?dryRun=true", "/v1/spus/spu-3/decommission?dryRun=true"):
        status, plan = await server.call("POST", path)
        assert status == 200, plan
        assert plan["after"]["replicasPerSpu"].get("2", 0) == 0, plan
        assert {move["partition"] for move in plan["moves"] if 2 in move["from"]} == {"t-1", "t-2"}, plan
        assert all(2 not in move["to"] for move in plan["moves"]), plan
    status, plan = await server.call("POST", "/v1/cluster/rebalance")
    assert status == 202, plan
    run = await stored_run(server)
    assert (run.kind, run.decommissioning) == ("rebalance", ())
    assert {move.partition: move.after for move in run.moves if 2 in move.before}.keys() == {"t-1", "t-2"}
    # While an SPU record cannot be read, id 2 may be that SPU's: the plan is refused, naming both.
    await server.kv_store.create(models.object_key("spus", "spu-9"), b'{"spec": "unreadable"}')
    for _ in range(1000):
        if server.context.local_store.snapshot().unreadable("spus"):
            break
        await asyncio.sleep(0.002)
    assert server.context.local_store.snapshot().unreadable("spus") == {"spu-9"}
    status, refused = await server.call("POST", "/v1/spus/spu-3/decommission?dryRun=true")
    assert (status, refused["error"]["code"]) == (422, "CannotPlan"), refused
    message = refused["error"]["message"]
    assert "SPU id(s) [2], which no SPU this SC can read holds" in message and "['spu-9']" in message, message
