"""The SPU simulator on real sockets: its SC session against a minimal in-test SC, and SPUs replicating offsets.

``FakeSc`` stands in for the SC's private port only to test the SPU side in isolation (registration,
reconnect with backoff, applying updates); it decides nothing. Replication runs between real
SimulatedSpu instances over their own fetch servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import structlog
from aiohttp import WSMsgType, web

from connection_manager import wire
from connection_manager.spu import checkpoint, fetch_wire, simulator
from connection_manager.spu.replica import Role
from connection_manager.spu.settings import SpuSettings
from connection_manager.spu.simulator import SimulatedSpu
from connection_manager.spu.state import Offsets
from controller import logs
from controller.cli import main as cli
from tests.builders import eventually

FAST = SpuSettings(
    append_interval=0.1,
    append_records=100,
    fetch_interval=0.02,
    fetch_max_records=100,
    replica_lag_time=1.0,
    reconnect_initial=0.05,
    reconnect_max=0.4,
    fetch_retry_initial=0.02,
    fetch_retry_max=0.2,
    checkpoint_interval=0.2,
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spu_info(spu_id: int, port: int) -> wire.SpuInfo:
    return wire.SpuInfo(
        id=spu_id,
        name=f"spu-{spu_id}",
        public_endpoint=wire.Endpoint(host="127.0.0.1", port=1),
        private_endpoint=wire.Endpoint(host="127.0.0.1", port=port),
    )


@dataclass
class Connection:
    spu_id: int
    registered_at: float
    register: wire.Register
    websocket: web.WebSocketResponse
    hosted: wire.Hosted | None = None
    frames: list[tuple[float, wire.Message]] = field(default_factory=list)
    incarnation: int = 0  # the number Accepted gave it (0: not accepted)

    def of_type(self, kind: type[wire.Message]) -> list[tuple[float, wire.Message]]:
        return [(at, frame) for at, frame in self.frames if isinstance(frame, kind)]


def replica(partition: str, leader: int | None, replicas: list[int], epoch: int = 1, isr: list[int] | None = None) -> wire.ReplicaInfo:
    return wire.ReplicaInfo(
        partition=partition, leader=leader, leader_epoch=epoch, partition_epoch=epoch,
        isr=replicas if isr is None else isr, replicas=replicas,
    )


class FakeSc:
    """Accepts the SPUs it knows (and the token, if set), sends each a Sync of its picture once it
    said what it holds, records what they send, and commits every proposal of a partition's
    leader at its epochs that names each SPU it adds under its live connection's incarnation (it
    checks nothing else: the real rules are the SC's)."""

    def __init__(self, spus: list[wire.SpuInfo], replicas: list[wire.ReplicaInfo], token: str | None = None) -> None:
        self.spus = {spu.id: spu for spu in spus}
        self.replicas = {info.partition: info for info in replicas}
        self.token = token
        self.epoch = 1
        self.incarnations = 0
        self.connections: list[Connection] = []
        self.drop_after_accept = 0  # the next N connections are closed right after Accepted, before any Sync
        # A standby SC: refuses every SPU (not-leader), naming this as the leader's private port.
        self.standby_of: str | None = None
        self.hold = 0.0  # seconds a standby waits before refusing (a real standby holds some registrations)
        self.offsets_interval = 0.2
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def live(self, spu_id: int) -> Connection | None:
        for connection in reversed(self.connections):
            if connection.spu_id == spu_id and not connection.websocket.closed:
                return connection
        return None

    def frames_of(self, spu_id: int, kind: type[wire.Message]) -> list[tuple[float, wire.Message]]:
        return [frame for c in self.connections if c.spu_id == spu_id for frame in c.of_type(kind)]

    def offsets_of(self, spu_id: int, partition: str = "t-0") -> list[wire.PartitionOffsets]:
        return [
            entry for _, frame in self.frames_of(spu_id, wire.Offsets)
            for entry in frame.partitions  # type: ignore[attr-defined]  # frames of type Offsets
            if entry["partition"] == partition
        ]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(wire.SPU_PATH, self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse()
        await websocket.prepare(request)
        loop = asyncio.get_running_loop()
        register = wire.parse_spu_message((await websocket.receive()).data)
        assert isinstance(register, wire.Register)
        connection = Connection(register.spu_id, loop.time(), register, websocket)
        self.connections.append(connection)
        if self.standby_of is not None:
            await asyncio.sleep(self.hold)
            refusal = wire.Rejected(code="not-leader", reason="this SC is a standby", leader=self.standby_of or None)
            await websocket.send_bytes(wire.encode(refusal))
            await websocket.close()
            return websocket
        if register.spu_id not in self.spus or register.token != self.token:
            code = "unknown-spu" if register.spu_id not in self.spus else "bad-token"
            await websocket.send_bytes(wire.encode(wire.Rejected(code=code, reason=f"SPU {register.spu_id} refused")))
            await websocket.close()
            return websocket
        self.incarnations += 1
        connection.incarnation = self.incarnations
        accepted = wire.Accepted(
            spu_id=register.spu_id, incarnation=self.incarnations, heartbeat_timeout=2.0, offsets_interval=self.offsets_interval
        )
        await websocket.send_bytes(wire.encode(accepted))
        if self.drop_after_accept:
            self.drop_after_accept -= 1
            await websocket.close()
            return websocket
        hosted = wire.parse_spu_message((await websocket.receive()).data)
        assert isinstance(hosted, wire.Hosted), hosted
        connection.hosted = hosted
        await websocket.send_bytes(wire.encode(self.sync_for(register.spu_id)))
        async for frame in websocket:
            if frame.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                message = wire.parse_spu_message(frame.data)
                connection.frames.append((loop.time(), message))
                if isinstance(message, wire.AlterIsr):
                    await self._commit(register.spu_id, message)
        return websocket

    async def _commit(self, spu_id: int, proposal: wire.AlterIsr) -> None:
        current = self.replicas[proposal.partition]
        if current.leader != spu_id or (current.leader_epoch, current.partition_epoch) != (proposal.leader_epoch, proposal.partition_epoch):
            return
        connection = self.live(spu_id)
        assert connection is not None
        named = {entry["spu"]: entry["incarnation"] for entry in proposal.incarnations}
        for added in set(proposal.isr) - set(current.isr):
            live = self.live(added)
            if live is None or named.get(added) != live.incarnation:
                refusal = wire.AlterIsrResult(
                    partition=proposal.partition, error="stale-incarnation", leader_epoch=current.leader_epoch,
                    partition_epoch=current.partition_epoch, isr=current.isr,
                )
                await connection.websocket.send_bytes(wire.encode(refusal))
                return
        committed = current.model_copy(update={"isr": list(proposal.isr), "partition_epoch": current.partition_epoch + 1})
        await connection.websocket.send_bytes(
            wire.encode(
                wire.AlterIsrResult(
                    partition=proposal.partition, leader_epoch=committed.leader_epoch,
                    partition_epoch=committed.partition_epoch, isr=committed.isr,
                )
            )
        )
        await self.update(replicas=[committed])

    def sync_for(self, spu_id: int) -> wire.Sync:
        hosted = [info for info in self.replicas.values() if spu_id in info.replicas]
        return wire.Sync(epoch=self.epoch, spus=list(self.spus.values()), replicas=hosted)

    async def update(self, spus: list[wire.SpuInfo] = [], replicas: list[wire.ReplicaInfo] = [], deleted_replicas: list[str] = []) -> None:  # noqa: B006
        """Change the picture and send each connected SPU what concerns it."""
        self.epoch += 1
        for spu in spus:
            self.spus[spu.id] = spu
        for name in deleted_replicas:
            self.replicas.pop(name, None)
        for info in replicas:
            self.replicas[info.partition] = info
        for spu_id in list(self.spus):
            connection = self.live(spu_id)
            if connection is None or connection.hosted is None:
                continue
            update = wire.Update(
                epoch=self.epoch,
                spus=spus,
                replicas=[info for info in replicas if spu_id in info.replicas],
                deleted_replicas=deleted_replicas,
            )
            await connection.websocket.send_bytes(wire.encode(update))


@pytest.fixture
async def make_sc() -> AsyncIterator[Callable[..., FakeSc]]:
    started: list[FakeSc] = []

    def make(spus: list[wire.SpuInfo], replicas: list[wire.ReplicaInfo], token: str | None = None) -> FakeSc:
        sc = FakeSc(spus, replicas, token)
        started.append(sc)
        return sc

    yield make
    for sc in started:
        await sc.close()


@pytest.fixture
async def running() -> AsyncIterator[Callable[[SimulatedSpu], SimulatedSpu]]:
    """Starts SPUs for a test and stops whatever is still running at its end."""
    spus: list[SimulatedSpu] = []

    def run(spu: SimulatedSpu) -> SimulatedSpu:
        spus.append(spu)
        return spu

    yield run
    for spu in spus:
        await spu.stop()


def offsets(spu: SimulatedSpu, partition: str = "t-0") -> tuple[Role, int, int]:
    status = spu.status(partition)
    assert status is not None
    return status.role, status.leo, status.hw


# ---------------------------------------------------------------------------- the SC session


async def test_an_spu_registers_says_what_it_holds_and_sends_offsets_only_as_they_change(make_sc, running) -> None:
    port = free_port()
    sc = make_sc([spu_info(0, port)], [replica("t-0", 0, [0])], token="secret")
    await sc.start()
    spu = running(SimulatedSpu(0, sc.address, token="secret", settings=FAST))
    await spu.start()

    await eventually(lambda: _assert(spu.connected and spu.listening == ("127.0.0.1", port)))
    assert sc.connections[0].register == wire.Register(spu_id=0, token="secret")
    assert sc.connections[0].hosted == wire.Hosted(partitions=[])  # a new process: it holds nothing
    await eventually(lambda: _assert(len(sc.offsets_of(0)) >= 6), timeout=5.0)
    [(_, leading)] = sc.frames_of(0, wire.Leading)
    assert leading == wire.Leading(partitions=[wire.Leadership(partition="t-0", leader_epoch=1)])
    # At most one Offsets frame per offsets interval (0.2 s). Timed where the fake SC read them, so
    # one frame read late (a stall of the loop) shortens one gap: the span over the frames after
    # the first may be short by one stall (up to 0.1 s here), and stalls do not add up.
    times = [at for at, _ in sc.frames_of(0, wire.Offsets)][1:]
    assert times[-1] - times[0] >= 0.2 * (len(times) - 1) - 0.1, times
    leos = [entry["leo"] for entry in sc.offsets_of(0)]
    assert leos == sorted(leos) and leos[-1] > leos[0]
    entry = sc.offsets_of(0)[-1]
    assert (entry["leader_epoch"], entry["hw"], entry["followers"]) == (1, entry["leo"], [])  # alone in its set
    # Heartbeats carry nothing about partitions; a quarter of the SC's heartbeat timeout apart.
    # (Timed as read, as above: the span may be short by one stall, here up to 0.2 s.)
    beats = [at for at, _ in sc.frames_of(0, wire.Heartbeat)]
    assert len(beats) >= 2 and beats[-1] - beats[0] >= 0.5 * (len(beats) - 1) - 0.2, beats


async def test_an_idle_spu_sends_heartbeats_and_no_offsets(make_sc, running) -> None:
    sc = make_sc([spu_info(0, free_port())], [replica("t-0", 0, [0]), replica("t-1", 0, [0])])
    await sc.start()
    spu = running(SimulatedSpu(0, sc.address, settings=SpuSettings(append_records=0, append_interval=0.05)))
    await spu.start()
    await eventually(lambda: _assert(len(sc.frames_of(0, wire.Heartbeat)) >= 1 and sc.frames_of(0, wire.Offsets)))
    # The first frame after the Sync said where the partitions are; nothing has changed since: idle
    # for a second, and until another heartbeat came (a busy machine may delay it past the second).
    await asyncio.sleep(1.0)
    await eventually(lambda: _assert(len(sc.frames_of(0, wire.Heartbeat)) >= 2))
    assert len(sc.frames_of(0, wire.Offsets)) == 1


async def test_a_dropped_spu_reconnects_with_growing_delays_then_from_the_initial_delay_after_a_sync(make_sc, running) -> None:
    """The delays are the ones the SPU chose and logged, not wall-clock gaps: on a loaded machine a
    connection may take longer than the delay before it, which says nothing about the backoff."""
    sc = make_sc([spu_info(0, free_port())], [])
    await sc.start()
    sc.drop_after_accept = 4
    with structlog.testing.capture_logs() as logged:
        spu = running(SimulatedSpu(0, sc.address, settings=FAST))
        await spu.start()
        await eventually(lambda: _assert(spu.connected and len(sc.connections) == 5))
        scheduled = [(entry["attempt"], entry["delay"]) for entry in logged if entry["event"] == "sc reconnect scheduled"]
        # Ceilings 0.05, 0.1, 0.2, 0.4 (capped); each delay is in [ceiling / 2, ceiling] (logged
        # to the millisecond).
        assert [attempt for attempt, _ in scheduled] == [1, 2, 3, 4], scheduled
        for (_, delay), ceiling in zip(scheduled, [0.05, 0.1, 0.2, 0.4]):
            assert ceiling / 2 - 0.0005 <= delay <= ceiling + 0.0005, scheduled
        # And the SPU did wait them: each reconnection came at least its delay after the one before.
        times = [connection.registered_at for connection in sc.connections]
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        assert all(gap >= delay - 0.001 for gap, (_, delay) in zip(gaps, scheduled)), (gaps, scheduled)
        assert spu.session.connections == 5

        # Synced, then dropped: the backoff starts again from the initial delay.
        await sc.live(0).websocket.close()
        await eventually(lambda: _assert(spu.connected and len(sc.connections) == 6))
    after_sync = [(entry["attempt"], entry["delay"]) for entry in logged if entry["event"] == "sc reconnect scheduled"][4:]
    assert len(after_sync) == 1 and after_sync[0][0] == 1 and after_sync[0][1] <= 0.05 + 0.0005, after_sync


async def test_a_refused_spu_keeps_retrying_and_joins_once_the_sc_knows_it(make_sc, running) -> None:
    port = free_port()
    sc = make_sc([], [])
    await sc.start()
    spu = running(SimulatedSpu(5, sc.address, settings=FAST))
    await spu.start()
    await eventually(lambda: _assert(len(sc.connections) >= 3))
    assert spu.session.last_rejection == wire.Rejected(code="unknown-spu", reason="SPU 5 refused")
    assert not spu.connected and spu.listening is None
    sc.spus[5] = spu_info(5, port)
    await eventually(lambda: _assert(spu.connected and spu.listening == ("127.0.0.1", port)), timeout=5.0)


async def test_an_spu_given_several_scs_finds_the_one_that_leads(make_sc, running) -> None:
    """SPU 0 is given a dead address and a standby: it goes on past the dead one at once, follows
    the leader the standby names (not in its list), and when that leader goes, back to its list,
    where the standby has become the leader meanwhile."""
    port = free_port()
    leader, standby = make_sc([spu_info(0, port)], []), make_sc([spu_info(0, port)], [])
    await leader.start()
    await standby.start()
    standby.standby_of = leader.address
    dead = f"127.0.0.1:{free_port()}"
    spu = running(SimulatedSpu(0, f"{dead},{standby.address}", settings=FAST))
    await spu.start()
    await eventually(lambda: _assert(spu.connected and leader.live(0) is not None))
    assert len(standby.connections) == 1 and spu.session.last_rejection is not None
    assert spu.session.last_rejection.leader == leader.address
    # The leader dies; the standby takes over.
    standby.standby_of = None
    await leader.close()
    await eventually(lambda: _assert(spu.connected and standby.live(0) is not None), timeout=5.0)


async def test_a_standby_naming_no_usable_leader_is_not_followed(make_sc, running) -> None:
    """A refusal naming no leader, or something that is not HOST:PORT: the SPU keeps to its list."""
    port = free_port()
    standby, leader = make_sc([spu_info(0, port)], []), make_sc([spu_info(0, port)], [])
    await standby.start()
    await leader.start()
    standby.standby_of = "not an address"
    spu = running(SimulatedSpu(0, [("127.0.0.1", standby.port), ("127.0.0.1", leader.port)], settings=FAST))
    await spu.start()
    await eventually(lambda: _assert(spu.connected and leader.live(0) is not None))
    assert spu.session.address == ("127.0.0.1", leader.port)
    standby.standby_of = ""  # names nobody
    live = leader.live(0)
    assert live is not None
    await live.websocket.close()
    await eventually(lambda: _assert(len(standby.connections) >= 2 and spu.connected and leader.live(0) is not None), timeout=5.0)


async def test_an_spu_refused_by_standbys_asks_again_without_backing_off(make_sc, running) -> None:
    """The leader is gone and its standby still names it (its claim has not expired): the SPU goes
    round the standby and the dead leader at a steady pace, not backing off towards seconds, so it
    joins the standby soon after that one leads."""
    port = free_port()
    standby = make_sc([spu_info(0, port)], [])
    await standby.start()
    standby.standby_of = f"127.0.0.1:{free_port()}"  # nothing listens there
    patient = SpuSettings(reconnect_initial=0.05, reconnect_max=5.0, leader_wait=0.05)
    with structlog.testing.capture_logs() as logged:
        spu = running(SimulatedSpu(0, standby.address, settings=patient))
        await spu.start()
        # Backing off (0.05, 0.1, 0.2 ... 5 s) would take over 16 s to make 10 attempts.
        await eventually(lambda: _assert(len(standby.connections) >= 10), timeout=10.0)
        standby.standby_of = None  # it leads now
        await eventually(lambda: _assert(spu.connected and standby.live(0) is not None))
    # The pace is the one the SPU chose: no delay it scheduled grew past the initial one (how soon
    # it joined in wall-clock time depends on how busy the machine is).
    delays = [entry["delay"] for entry in logged if entry["event"] == "sc reconnect scheduled"]
    assert all(delay <= patient.reconnect_initial + 0.0005 for delay in delays), delays


async def test_an_spu_tells_a_standby_which_leader_it_could_not_reach(make_sc, running) -> None:
    """The standby names a leader nobody answers at (it died; its claim has not expired): the SPU
    says so in its next Register, so that the standby may hold it until it leads itself; once the
    named leader answers, or the SPU is accepted, it says nothing of it any more."""
    port = free_port()
    standby = make_sc([spu_info(0, port)], [])
    await standby.start()
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    standby.standby_of = dead
    patient = SpuSettings(reconnect_initial=0.05, reconnect_max=5.0, leader_wait=0.05)
    spu = running(SimulatedSpu(0, standby.address, settings=patient))
    await spu.start()
    await eventually(lambda: _assert(len(standby.connections) >= 3), timeout=5.0)
    said = [connection.register.unreachable_leader for connection in standby.connections]
    assert said[0] is None  # nothing failed yet
    assert said[1:3] == [dead, dead]
    standby.standby_of = None  # it leads now
    await eventually(lambda: _assert(spu.connected and standby.live(0) is not None))
    live = standby.live(0)
    assert live is not None and live.register.unreachable_leader == dead
    assert spu.session._unreachable is None  # accepted: nothing to say any more


async def test_an_spu_held_by_a_standby_that_names_no_leader_asks_it_again_once_before_moving_on(make_sc, running) -> None:
    """A standby held the registration and its hold ended with no leader known (it was about to
    lead): the SPU asks it again at once rather than go to the next address (the dead leader);
    once in a row only, so a standby that never learns of a leader does not keep it from the others."""
    port = free_port()
    standby, other = make_sc([spu_info(0, port)], []), make_sc([spu_info(0, port)], [])
    await standby.start()
    await other.start()
    standby.standby_of = ""  # names nobody
    standby.hold = 0.1
    other.standby_of = ""
    patient = SpuSettings(reconnect_initial=0.05, reconnect_max=5.0, leader_wait=0.05)
    spu = running(SimulatedSpu(0, f"{standby.address},{other.address}", settings=patient))
    await spu.start()
    await eventually(lambda: _assert(len(other.connections) >= 2), timeout=5.0)
    order = sorted(
        [(c.registered_at, "standby") for c in standby.connections] + [(c.registered_at, "other") for c in other.connections]
    )
    # Held and told of no leader: the same standby once more, then the next address; the other
    # answers at once (not held), so the SPU moves on from it as before.
    assert [name for _, name in order[:4]] == ["standby", "standby", "other", "standby"]


async def test_an_spu_sends_offsets_at_the_interval_the_sc_last_gave(make_sc, running) -> None:
    """The interval comes with Accepted, and a new one in an Update (the SC's partitions grew)."""
    port = free_port()
    sc = make_sc([spu_info(0, port)], [replica("t-0", 0, [0])])
    sc.offsets_interval = 0.05
    await sc.start()
    spu = running(SimulatedSpu(0, sc.address, settings=FAST))
    await spu.start()
    await eventually(lambda: _assert(spu.connected and spu.session.offsets_interval == 0.05))
    await eventually(lambda: _assert(len(sc.offsets_of(0)) >= 2))  # appends keep changing t-0
    live = sc.live(0)
    assert live is not None
    await live.websocket.send_bytes(wire.encode(wire.Update(epoch=sc.epoch + 1, offsets_interval=30.0)))
    await eventually(lambda: _assert(spu.session.offsets_interval == 30.0))
    sent = len(sc.offsets_of(0))
    await asyncio.sleep(0.5)  # ten of the old intervals
    assert len(sc.offsets_of(0)) <= sent + 1  # at most the frame that was already on its way


def test_sc_addresses_are_read_as_a_list() -> None:
    assert simulator.parse_addresses("a:1, b:2") == [("a", 1), ("b", 2)]
    assert simulator.parse_addresses("[::1]:9004") == [("::1", 9004)]
    for bad, message in ((",", "names no SC"), ("a:1,b", "'b' is not HOST:PORT"), (",".join(["a:1"] * 17), "at most 16")):
        with pytest.raises(ValueError, match=message):
            simulator.parse_addresses(bad)


async def test_updates_switch_roles_at_once_move_the_endpoint_and_remove_replicas(make_sc, running) -> None:
    port, other_port = free_port(), free_port()
    sc = make_sc(
        [spu_info(0, port), spu_info(1, free_port())],
        [replica("t-0", 0, [0, 1]), replica("t-1", 1, [1, 0])],
    )
    await sc.start()
    spu = running(SimulatedSpu(0, sc.address, settings=FAST))
    await spu.start()
    await eventually(lambda: _assert(spu.listening == ("127.0.0.1", port)))
    assert (spu.status("t-0").role, spu.status("t-1").role) == (Role.LEADER, Role.FOLLOWER)

    await sc.update(
        spus=[spu_info(0, other_port)],
        replicas=[replica("t-0", 1, [0, 1], epoch=2), replica("t-1", None, [1, 0], epoch=2), replica("t-2", 0, [0])],
    )
    await eventually(lambda: _assert(spu.state.epoch == 2 and spu.listening == ("127.0.0.1", other_port)))
    roles = {name: (spu.status(name).role, spu.status(name).leader) for name in ("t-0", "t-1", "t-2")}
    assert roles == {"t-0": (Role.FOLLOWER, 1), "t-1": (Role.IDLE, None), "t-2": (Role.LEADER, 0)}
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)

    await sc.update(deleted_replicas=["t-0", "t-1"])
    await eventually(lambda: _assert(sorted(spu.state.replicas) == ["t-2"]))
    await eventually(lambda: _assert(len(sc.offsets_of(0, "t-2")) >= 2))
    last = sc.frames_of(0, wire.Offsets)[-1][1]
    assert [entry["partition"] for entry in last.partitions] == ["t-2"]


async def test_the_fetch_server_refuses_a_malformed_frame_and_closes(make_sc, running) -> None:
    port = free_port()
    sc = make_sc([spu_info(0, port)], [])
    await sc.start()
    spu = running(SimulatedSpu(0, sc.address, settings=FAST))
    await spu.start()
    await eventually(lambda: _assert(spu.listening is not None))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(len(b"{oops").to_bytes(4, "big") + b"{oops")
    header = await reader.readexactly(4)
    answer = fetch_wire.parse_response(await reader.readexactly(fetch_wire.body_length(header)))
    assert isinstance(answer, fetch_wire.FetchError) and answer.code == "malformed"
    assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()


# ---------------------------------------------------------------------------- replication between SPUs


async def test_three_spus_replicate_a_partition_and_a_killed_leader_stops_its_followers(make_sc, running) -> None:
    ports = [free_port() for _ in range(3)]
    sc = make_sc([spu_info(i, ports[i]) for i in range(3)], [replica("t-0", 0, [0, 1, 2])])
    await sc.start()
    # Catching up runs at 20 records / 20 ms, against 100 appended / 200 ms: a visible second or so.
    settings = SpuSettings(
        append_interval=0.2, append_records=100, fetch_interval=0.02, fetch_max_records=20, replica_lag_time=1.0,
        reconnect_initial=0.05, reconnect_max=0.4, fetch_retry_initial=0.02, fetch_retry_max=0.2, tick_interval=0.05,
    )
    leader, first, second = (running(SimulatedSpu(i, sc.address, settings=settings)) for i in range(3))
    for spu in (leader, first, second):
        await spu.start()

    # Followers catch up between bursts: at some moment all three hold the same records.
    await eventually(lambda: _assert(offsets(leader)[1] >= 300 and offsets(leader)[1] == offsets(first)[1] == offsets(second)[1]))
    status = leader_status(leader)
    assert status.isr == (0, 1, 2) and status.hw <= min(status.leo, *status.followers.values())
    assert offsets(first)[1] >= status.hw and offsets(second)[1] >= status.hw
    assert [follower["spu"] for follower in sc.offsets_of(0)[-1]["followers"]] == [1, 2]

    # A follower stops: the leader commits nothing it misses until the SC commits a set without it.
    await second.stop()
    stopped_at = offsets(second)[1]
    await eventually(lambda: _assert(leader_status(leader).isr == (0, 1)), timeout=5.0)
    assert [proposal.isr for _, proposal in sc.frames_of(0, wire.AlterIsr)] == [[0, 1]]
    committed_without = leader_status(leader).hw
    assert committed_without >= stopped_at  # nothing lost, and it moves on without SPU 2

    # Restarted without its records, it catches up and the leader proposes it back in.
    second = running(SimulatedSpu(2, sc.address, settings=settings))
    await second.start()
    await eventually(lambda: _assert(leader_status(leader).isr == (0, 1, 2)), timeout=10.0)
    assert [proposal.isr for _, proposal in sc.frames_of(0, wire.AlterIsr)] == [[0, 1], [0, 1, 2]]
    # Named under the incarnation of its new process's connection: the leader saw that one catch up.
    back = sc.live(2)
    assert back is not None
    _, last = sc.frames_of(0, wire.AlterIsr)[-1]
    assert isinstance(last, wire.AlterIsr) and last.incarnations == [{"spu": 2, "incarnation": back.incarnation}]
    assert offsets(second)[1] >= leader_status(leader).hw - 100

    # The leader dies: its followers stop advancing (once they have read what was already sent,
    # which on a busy machine may take a while: they are watched until they stand still).
    await leader.stop()

    async def standing_still() -> tuple[tuple[Role, int, int], tuple[Role, int, int]]:
        before = (offsets(first), offsets(second))
        await asyncio.sleep(4 * settings.append_interval)
        assert (offsets(first), offsets(second)) == before
        return before

    frozen = await eventually(standing_still)
    assert frozen[0][0] is Role.FOLLOWER


async def test_a_new_leader_truncates_a_follower_that_was_ahead_and_logs_resume_from_the_data_dir(make_sc, running, tmp_path: Path) -> None:
    # SPU 0 led epoch 1 to offset 500; SPU 1 had 50 of those records when it was elected at epoch 2.
    checkpoint.save(checkpoint.path_for(tmp_path, 0), checkpoint.encode({"t-0": Offsets(500, 450, ((1, 0),))}))
    checkpoint.save(checkpoint.path_for(tmp_path, 1), checkpoint.encode({"t-0": Offsets(50, 50, ((1, 0),))}))
    sc = make_sc([spu_info(0, free_port()), spu_info(1, free_port())], [replica("t-0", 1, [1, 0], epoch=2)])
    await sc.start()
    quiet = SpuSettings(append_interval=60.0, fetch_interval=0.02, checkpoint_interval=0.1)  # no append during the test
    old, new = (running(SimulatedSpu(i, sc.address, settings=quiet, data_dir=tmp_path)) for i in (0, 1))
    await new.start()
    await old.start()
    # Its records of epoch 1 past 50 are not in the new leader's log: it truncates there (KIP-101).
    await eventually(lambda: _assert(offsets(old) == (Role.FOLLOWER, 50, 50) and offsets(new) == (Role.LEADER, 50, 50)))
    assert sc.connections[-1].hosted == wire.Hosted(partitions=[wire.HostedReplica(partition="t-0", leo=500, leader_epoch=None)])
    await eventually(lambda: _assert(checkpoint.load(checkpoint.path_for(tmp_path, 0)) == {"t-0": Offsets(50, 50, ((1, 0),))}))

    # A restart resumes the saved log; a stopped SimulatedSpu itself is not restarted.
    await new.stop()
    with pytest.raises(RuntimeError, match=r"^SPU 1 was already started: create a new SimulatedSpu to run it again$"):
        await new.start()
    await sc.update(replicas=[replica("t-0", None, [1, 0], epoch=3)])
    restarted = running(SimulatedSpu(1, sc.address, settings=quiet, data_dir=tmp_path))
    await restarted.start()
    await eventually(lambda: _assert(offsets(restarted) == (Role.IDLE, 50, 50)))


async def test_every_change_is_journaled_before_the_spu_goes_on_and_a_clean_stop_folds_it(make_sc, running, tmp_path: Path) -> None:
    sc = make_sc([spu_info(0, free_port())], [replica("t-0", 0, [0])])
    await sc.start()
    never_periodically = SpuSettings(append_interval=0.05, append_records=10, checkpoint_interval=3600.0)
    spu = running(SimulatedSpu(0, sc.address, settings=never_periodically, data_dir=tmp_path))
    await spu.start()
    await eventually(lambda: _assert(offsets(spu)[1] >= 50))
    # Not folded yet: the journal holds every append already, as a killed process would leave it.
    assert checkpoint.load(checkpoint.path_for(tmp_path, 0))["t-0"].leo == offsets(spu)[1]
    await spu.stop()
    assert checkpoint.load(checkpoint.path_for(tmp_path, 0)) == {"t-0": Offsets(offsets(spu)[1], offsets(spu)[2], ((1, 0),))}
    assert checkpoint.journal_path(checkpoint.path_for(tmp_path, 0)).read_bytes() == b""


def leader_status(spu: SimulatedSpu):
    status = spu.status("t-0")
    assert status is not None
    return status


# ---------------------------------------------------------------------------- sc spu run


async def test_sc_spu_run_starts_k_spus_and_exits_cleanly_on_sigterm(make_sc, tmp_path: Path) -> None:
    sc = make_sc([spu_info(3, free_port()), spu_info(4, free_port())], [replica("t-0", 3, [3, 4])], token="s3cret")
    await sc.start()
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "controller.cli", "spu", "run", "--first-id", "3", "--count", "2",
        "--sc-private", sc.address, "--token-file", str(token_file), "--data-dir", str(tmp_path / "data"),
        "--append-interval", "0.1", "--log-format", "json", "--record", str(tmp_path / "record.jsonl"),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        await eventually(lambda: _assert(_follower_in_sync(sc.offsets_of(3), 4)), timeout=20.0)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 10.0)
    assert process.returncode == 0, stderr.decode()
    assert stderr.decode().count('"event": "spu stopped"') == 2
    saved = checkpoint.load(checkpoint.path_for(tmp_path / "data", 3))
    assert saved["t-0"].leo >= 100
    # The record: SPU 3 took the leadership at epoch 1, and acknowledged offsets as they were committed.
    lines = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert [(line["spu"], line["event"], line["partition"], line["epoch"]) for line in lines if line["event"] == "lead"] == [
        (3, "lead", "t-0", 1)
    ]
    acked = [line["offset"] for line in lines if line["event"] == "ack"]
    assert acked == sorted(acked) and acked[-1] <= saved["t-0"].hw


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--id", "1", "--count", "2"], "--count 2 runs several SPUs: give --first-id N instead of --id"),
        (["--first-id", "1", "--count", "0"], "--count must be at least 1"),
        (["--count", "2"], "one of the arguments --id --first-id is required"),
        (["--id", "1", "--sc-private", "nowhere"], "argument --sc-private: 'nowhere' is not HOST:PORT (for example 127.0.0.1:9004)"),
        (["--id", "1", "--token-file", "{tmp}/absent"], "error: cannot read the token file '{tmp}/absent': No such file or directory"),
        (["--id", "1", "--append-interval", "0"], "error: append_interval must be a positive number of seconds, got 0.0"),
        (["--id", "1", "--append-interval", "inf"], "error: append_interval must be a positive number of seconds, got inf"),
        (["--id", "2147483648"], "argument --id: 2147483648 is above 2147483647, the largest value here"),
        (["--id", "9" * 5000], "argument --id: 99999999999999999999... (5000 characters) is above 2147483647, the largest value here"),
        (["--first-id", "2147483647", "--count", "2"], "SPU ids 2147483647 to 2147483648: the largest SPU id is 2147483647"),
        (["--first-id", "0", "--count", "10001"], "--count 10001: at most 10000 SPUs run in one process"),
        (["--id", "1", "--sc-private", "h:²"], "argument --sc-private: 'h:²' is not HOST:PORT (for example 127.0.0.1:9004)"),
        (["--id", "1", "--sc-private", "h:" + "9" * 5000], "argument --sc-private: 'h:999999999999999999... (5002 characters)' is not HOST:PORT (for example 127.0.0.1:9004)"),
        (["--id", "1", "--sc-private", "a:1,b"], "argument --sc-private: 'b' is not HOST:PORT (for example 127.0.0.1:9004)"),
        (["--id", "1", "--sc-private", ",".join(["a:1"] * 17)], "argument --sc-private: 17 SC addresses given, at most 16"),
    ],
)
def test_sc_spu_run_refuses_bad_flags_with_the_reason(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def must_not_start(spus: list[SimulatedSpu]) -> None:
        raise AssertionError(f"the flags were accepted: SPUs {[spu.spu_id for spu in spus]}")

    monkeypatch.setattr(simulator, "run_until_signalled", must_not_start)
    try:
        code = cli.main(["spu", "run", *(flag.replace("{tmp}", str(tmp_path)) for flag in flags)])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    assert (code, capsys.readouterr().err.splitlines()[-1].endswith(message.replace("{tmp}", str(tmp_path)))) == (2, True)


def test_sc_spu_run_presents_the_first_token_of_a_token_file_that_lists_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SC's token file in a rotation (the new token, then the old one) given to an SPU as it
    is: the SPU presents the new one."""
    token_file = tmp_path / "spu-token"
    token_file.write_text("# rotated on 2026-11-29\nnew-token-0123456789\nold-token-0123456789\n")
    presented: list[str | None] = []

    async def record(spus: list[SimulatedSpu]) -> None:
        presented.extend(spu.token for spu in spus)

    monkeypatch.setattr(simulator, "run_until_signalled", record)
    # In-process, `sc spu run` would configure logging for the tests after this one too.
    monkeypatch.setattr(logs, "configure", lambda *_args, **_kwargs: None)
    assert cli.main(["spu", "run", "--first-id", "1", "--count", "2", "--token-file", str(token_file)]) == 0
    assert presented == ["new-token-0123456789", "new-token-0123456789"]


def _follower_in_sync(entries: list[wire.PartitionOffsets], follower: int) -> bool:
    return any(f["spu"] == follower and f["leo"] >= entry["hw"] > 0 for entry in entries for f in entry.get("followers", ()))


def _assert(condition: object) -> None:
    assert condition
