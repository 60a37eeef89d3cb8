"""An SPU's pings to its SC judge the SC, not the SPU's own event loop.

A CI run saw all three simulator SPUs of one process give up their SC connections at the same
instant ("No PONG received after 2.5 seconds") while the SC answered /healthz within 0.4 s. aiohttp's
client heartbeat gives up when its timer fires before the answer is read, even if the answer came in
time and only this process's loop was held. The SC here is a real `sc run` in its own process, so
it answers while the test holds the SPU's loop right after each ping.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import http_websocket

from connection_manager.spu.settings import SpuSettings
from connection_manager.spu.simulator import SimulatedSpu
from store import embedded_etcd
from tests.builders import eventually
from tests.fixtures import sc_run

PING_INTERVAL = 2.0
PING_TIMEOUT = 1.0  # the answer window of the first test: room for an SC slowed by a busy CI machine
HOLD = 1.5  # seconds the SPU's loop is held after each ping: past that window
SC_HEARTBEAT_TIMEOUT = 4.0  # the SC's: by default an SPU waits as long for the SC's answer


@pytest.fixture
async def sc(tmp_path: Path) -> AsyncIterator[sc_run.ScRun]:
    server = sc_run.ScRun(tmp_path / "sc", None, "--store", "memory", "--spu-heartbeat-timeout", str(SC_HEARTBEAT_TIMEOUT))
    server.start(logs_to_file=True)
    try:
        await server.wait_healthy()
        fetch_port = embedded_etcd.free_ports(1)[0]
        spec = {
            "id": 0,
            "publicEndpoint": {"host": "127.0.0.1", "port": fetch_port},
            "privateEndpoint": {"host": "127.0.0.1", "port": fetch_port},
        }
        async with aiohttp.ClientSession() as session, session.post(f"{server.url}/v1/spus", json={"name": "spu-0", "spec": spec}) as answer:
            assert answer.status == 201, await answer.text()
        yield server
    finally:
        server.stop()


def holding_after_pings(held: list[float]) -> Callable[..., Awaitable[None]]:
    """WebSocketWriter.send_frame that holds the event loop for HOLD seconds after each ping it
    sends (the SC's pong then waits in the socket), recording when."""
    send_frame = http_websocket.WebSocketWriter.send_frame

    async def send_then_hold(self: Any, message: bytes, opcode: int, compress: int | None = None) -> None:
        await send_frame(self, message, opcode, compress)
        if opcode == aiohttp.WSMsgType.PING:
            held.append(time.monotonic())
            time.sleep(HOLD)  # the loop itself, as a long step or a starved process would

    return send_then_hold


async def test_a_pong_read_late_because_the_spus_own_loop_was_held_keeps_the_connection(sc: sc_run.ScRun) -> None:
    settings = SpuSettings(sc_ping_interval=PING_INTERVAL, sc_ping_timeout=PING_TIMEOUT)
    spu = SimulatedSpu(0, ("127.0.0.1", sc.private_port), settings=settings)
    held: list[float] = []
    await spu.start()
    try:
        await eventually(lambda: _assert(spu.session.connected), timeout=10.0)
        with mock.patch.object(http_websocket.WebSocketWriter, "send_frame", holding_after_pings(held)):
            deadline = time.monotonic() + 4 * (PING_INTERVAL + HOLD)
            while len(held) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(PING_TIMEOUT)  # past the last ping's window
        assert len(held) >= 3, held
        assert spu.session.connections == 1 and spu.session.connected
    finally:
        await spu.stop()


async def test_an_sc_paused_for_less_than_its_heartbeat_timeout_keeps_its_spus(sc: sc_run.ScRun) -> None:
    """The SC waits for an SPU's frames for its heartbeat timeout; the SPU waits as long for the
    SC's answer. Before, it gave up after half its ping interval (2.5 s by default, against the
    SC's 10 s): an SC held that long (a long step, a starved process) saw its SPUs leave and come
    back as new incarnations, each a restart with its leaderships elected away and back."""
    assert sc.process is not None
    spu = SimulatedSpu(0, ("127.0.0.1", sc.private_port), settings=SpuSettings(sc_ping_interval=1.0))
    await spu.start()
    try:
        await eventually(lambda: _assert(spu.session.connected), timeout=10.0)
        sc.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(SC_HEARTBEAT_TIMEOUT - 1.5)
        finally:
            sc.process.send_signal(signal.SIGCONT)
        await asyncio.sleep(2.0)  # pings answered again; the SC read the SPU's frames queued meanwhile
        assert spu.session.connections == 1 and spu.session.connected
    finally:
        await spu.stop()


async def test_an_sc_that_stops_answering_pings_is_left_within_the_window(sc: sc_run.ScRun) -> None:
    """SIGSTOP of the SC: its connection stays open (no FIN, no RST), and only the pings notice."""
    assert sc.process is not None
    spu = SimulatedSpu(0, ("127.0.0.1", sc.private_port), settings=SpuSettings(sc_ping_interval=PING_INTERVAL))
    await spu.start()
    try:
        await eventually(lambda: _assert(spu.session.connected), timeout=10.0)
        sc.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            await eventually(lambda: _assert(not spu.session.connected), timeout=10.0)
            # A ping at most an interval later, and the SC's heartbeat timeout for its answer (with looks).
            assert time.monotonic() - started < PING_INTERVAL + SC_HEARTBEAT_TIMEOUT + 1.0
        finally:
            sc.process.send_signal(signal.SIGCONT)
        await eventually(lambda: _assert(spu.session.connected and spu.session.connections == 2), timeout=15.0)
    finally:
        await spu.stop()


def _assert(condition: bool) -> None:
    assert condition
