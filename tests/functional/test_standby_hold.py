"""A standby SC holds an SPU's registration, instead of refusing it at once, while no SC it could
name leads or while the leader it would name is the one the SPU says it cannot reach: when it
leads meanwhile it accepts the SPU at once (a takeover: SPUs join the new leader as it claims).
A connection manager on 127.0.0.1 with no etcd; its role is the test's to change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from connection_manager import health, lrs, server, wire
from controller import metrics
from store import local
from tests.builders import spu

NO_LEADER = ("this SC is a standby and no other SC leads the store right now", None)
DEAD = "127.0.0.1:9"
# Seconds: a hold the tests that end it themselves set, far beyond their own waits.
LONG_HOLD = 30.0


class Role:
    def __init__(self) -> None:
        self.refusal: tuple[str, str | None] | None = NO_LEADER

    def __call__(self) -> tuple[str, str | None] | None:
        return self.refusal


@pytest.fixture
async def standby() -> AsyncIterator[tuple[server.ConnectionManager, Role]]:
    store = local.LocalStore()
    store["spus"].apply(spu(0), 1)
    cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas())
    role = Role()
    cm.standby_refusal = role
    await cm.start("127.0.0.1", 0)
    try:
        yield cm, role
    finally:
        await cm.stop()


async def register(client: aiohttp.ClientSession, cm: server.ConnectionManager, unreachable: str | None = None) -> asyncio.Task[tuple[float, object]]:
    """Register SPU 0; a task giving (seconds until the answer, the answer)."""
    websocket = await client.ws_connect(f"ws://127.0.0.1:{cm.port}{wire.SPU_PATH}")
    await websocket.send_bytes(wire.encode(wire.Register(spu_id=0, unreachable_leader=unreachable)))
    loop = asyncio.get_running_loop()
    asked_at = loop.time()

    async def answer() -> tuple[float, object]:
        frame = await websocket.receive(timeout=5)
        return loop.time() - asked_at, wire.parse_sc_message(frame.data)

    return asyncio.create_task(answer())


async def test_a_standby_with_no_leader_to_name_holds_the_spu_and_takes_it_once_it_leads(standby, monkeypatch: pytest.MonkeyPatch) -> None:
    cm, role = standby
    # A hold far longer than the test's own waits: on a busy machine the 0.3 s below may take more
    # than the real hold (1 s), which would end it and refuse the SPU before the SC leads.
    monkeypatch.setattr(server, "STANDBY_HOLD", LONG_HOLD)
    async with aiohttp.ClientSession() as client:
        answer = await register(client, cm)
        await asyncio.sleep(0.3)
        assert not answer.done()  # held, not refused
        role.refusal = None  # this SC leads now
        cm.role_changed()
        waited, message = await asyncio.wait_for(answer, 10)
        assert isinstance(message, wire.Accepted), message
        assert 0.3 <= waited < LONG_HOLD  # accepted as it led, not when the hold ended
        assert cm.stats.held == 1 and not cm.stats.rejected
    exported = metrics.Metrics()
    exported.watch_connections(cm)
    assert exported.registry.get_sample_value("sc_spu_registrations_held_total") == 1.0


async def test_a_standby_naming_the_leader_the_spu_cannot_reach_holds_it(standby, monkeypatch: pytest.MonkeyPatch) -> None:
    cm, role = standby
    monkeypatch.setattr(server, "STANDBY_HOLD", LONG_HOLD)  # as above: longer than any wait of the test's
    role.refusal = ("this SC is a standby: the leader is elsewhere", DEAD)
    async with aiohttp.ClientSession() as client:
        # An SPU that did not say the leader is unreachable is sent there at once: not held.
        waited, message = await asyncio.wait_for(await register(client, cm), 10)
        assert isinstance(message, wire.Rejected) and message.leader == DEAD
        assert cm.stats.held == 0 and waited < LONG_HOLD
        # One that did is held; another SC leading meanwhile is named as soon as it is known.
        answer = await register(client, cm, unreachable=DEAD)
        await asyncio.sleep(0.3)
        assert not answer.done()
        role.refusal = ("this SC is a standby: the leader is elsewhere", "127.0.0.1:10")
        waited, message = await asyncio.wait_for(answer, 10)
        assert isinstance(message, wire.Rejected) and message.leader == "127.0.0.1:10"
        assert waited < LONG_HOLD  # named as it was known, not when the hold ended
    assert cm.stats.held == 1


async def test_a_held_registration_is_refused_when_the_hold_ends(standby, monkeypatch: pytest.MonkeyPatch) -> None:
    cm, role = standby
    monkeypatch.setattr(server, "STANDBY_HOLD", 0.3)
    role.refusal = ("this SC is a standby: the leader is elsewhere", DEAD)
    async with aiohttp.ClientSession() as client:
        waited, message = await asyncio.wait_for(await register(client, cm, unreachable=DEAD), 10)
    assert isinstance(message, wire.Rejected) and message.code == server.NOT_LEADER and message.leader == DEAD
    # Held for the whole hold, then refused (the test's 10 s wait is only its patience: how much
    # later than the hold the answer came depends on how busy the machine is).
    assert cm.stats.held == 1 and waited >= 0.3


def test_a_register_says_an_unreachable_leader_only_when_there_is_one() -> None:
    """An SC that predates the field still reads the frames of an SPU that has nothing to say."""
    assert b"unreachableLeader" not in wire.encode(wire.Register(spu_id=3))
    said = wire.encode(wire.Register(spu_id=3, unreachable_leader="sc-a:9004"))
    assert b'"unreachableLeader":"sc-a:9004"' in said
    parsed = wire.parse_spu_message(said)
    assert isinstance(parsed, wire.Register) and parsed.unreachable_leader == "sc-a:9004"


@pytest.mark.parametrize("presented", [None, "wrong-token-of-32-characters-xxx"])
async def test_a_standby_checks_the_spu_token_before_it_names_the_leader_or_holds(presented: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the token a client learns nothing from a standby: not where the leader's private port
    is, and it cannot keep the standby holding its connection (docs/operations.md: the token is
    checked before anything else)."""
    store = local.LocalStore()
    store["spus"].apply(spu(0), 1)
    cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas(), tokens=("the-right-token-of-32-characters",))
    role = Role()
    role.refusal = ("this SC is a standby: the leader is elsewhere", DEAD)
    cm.standby_refusal = role
    monkeypatch.setattr(server, "STANDBY_HOLD", LONG_HOLD)  # a hold would outlast the wait below
    await cm.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as client:
            for unreachable in (None, DEAD):
                websocket = await client.ws_connect(f"ws://127.0.0.1:{cm.port}{wire.SPU_PATH}")
                await websocket.send_bytes(wire.encode(wire.Register(spu_id=0, token=presented, unreachable_leader=unreachable)))
                frame = await websocket.receive(timeout=10)
                message = wire.parse_sc_message(frame.data)
                assert isinstance(message, wire.Rejected) and message.code == "unauthorized", message
                assert message.leader is None and DEAD not in message.reason
                await websocket.close()
        assert cm.stats.held == 0
    finally:
        await cm.stop()
