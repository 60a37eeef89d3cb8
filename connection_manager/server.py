"""The connection manager: the SC's private WebSocket server for SPUs (port 9004).

Accepts only registered SPUs (and the shared token when one is configured), keeps the health
view, takes in live-replica reports, and pushes each SPU the SPU endpoints and the replicas it
hosts: a full Sync on connect, then Update deltas as committed specs change. It never writes to
the KV store; the controllers turn what it learns into writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog
from aiohttp import WSMsgType, web

from connection_manager import health as health_module
from connection_manager import lrs, transport, wire
from store import local, models

log = structlog.get_logger(__name__)

REGISTER_TIMEOUT = 10.0  # seconds a new connection has to send its Register frame
SEND_QUEUE_LIMIT = 1_000
HEARTBEAT_SECOND_LOOK = 0.5  # seconds  # frames queued for one SPU before it is considered stuck


@dataclass
class Stats:
    """Counters the daemon's metrics read at scrape time."""

    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    frame_errors: dict[str, int] = field(default_factory=dict)
    lrs_frames: int = 0
    lrs_frames_skipped: int = 0  # superseded by a newer frame of the same SPU before being parsed
    heartbeat_timeouts: int = 0
    updates_sent: int = 0

    def count(self, table: dict[str, int], code: str) -> None:
        table[code] = table.get(code, 0) + 1


class Session:
    """One connected SPU: what it has been told, and its outgoing frames (sent in order)."""

    def __init__(self, spu_id: int, websocket: web.WebSocketResponse) -> None:
        self.spu_id = spu_id
        self.websocket = websocket
        self.hosted: dict[str, wire.ReplicaInfo] = {}
        self.told_spus: dict[int, wire.SpuInfo] = {}
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closing: tuple[str, str] | None = None

    def send(self, message: wire.Message) -> None:
        if self.outbox.qsize() >= SEND_QUEUE_LIMIT:
            self.close("too-slow", f"SPU {self.spu_id} is not reading its frames ({SEND_QUEUE_LIMIT} queued)")
            return
        self.outbox.put_nowait(wire.encode(message))

    def close(self, code: str, reason: str) -> None:
        if self.closing is None:
            self.closing = (code, reason)
            self.outbox.put_nowait(None)

    async def write_loop(self) -> None:
        while True:
            frame = await self.outbox.get()
            if frame is None:
                code, reason = self.closing or ("closed", "closed by the SC")
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self.websocket.send_bytes(wire.encode(wire.Rejected(code=code, reason=reason)))
                await self.websocket.close(message=reason[:120].encode())
                return
            await self.websocket.send_bytes(frame)


class _LatestFrame:
    """A one-frame mailbox: a new frame replaces one not yet taken."""

    def __init__(self) -> None:
        self._frame: bytes | str | None = None
        self._ready = asyncio.Event()

    def put(self, frame: bytes | str) -> bool:
        """Leave ``frame``; True when it replaced one that was never taken."""
        replaced = self._frame is not None
        self._frame = frame
        self._ready.set()
        return replaced

    async def take(self) -> bytes | str:
        await self._ready.wait()
        frame = self.take_nowait()
        assert frame is not None
        return frame

    def take_nowait(self) -> bytes | str | None:
        """The frame left and not taken yet, if any."""
        self._ready.clear()
        frame, self._frame = self._frame, None
        return frame


class ConnectionManager:
    def __init__(
        self,
        local_store: local.LocalStore,
        health: health_module.HealthView,
        live: lrs.LiveReplicas,
        *,
        token: str | None = None,
        heartbeat_timeout: float = 10.0,
        max_frame_bytes: int = wire.MAX_FRAME_BYTES,
        on_live_change: Callable[[set[str]], None] = lambda names: None,
        listener: transport.Port | None = None,
    ) -> None:
        self.local_store = local_store
        self.health = health
        self.live = live
        self.token = token
        self.heartbeat_timeout = heartbeat_timeout
        self.max_frame_bytes = max_frame_bytes
        self.on_live_change = on_live_change
        # Connection limits and timeouts of the private port (None: the defaults).
        self.listener = listener if listener is not None else transport.Port(transport.PRIVATE)
        self.sessions: dict[int, Session] = {}
        # SPUs being drained: no partition may choose them as leader until they reconnect.
        self.draining: set[int] = set()
        self.stats = Stats()
        self._runner: web.AppRunner | None = None
        self._pusher: asyncio.Task[None] | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_frame_bytes, middlewares=[transport.middleware])
        app.router.add_get(wire.SPU_PATH, self._handle)
        return app

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = transport.GuardedSite(self._runner, host, port, self.listener)
        await site.start()
        self.port = next(
            (int(address[1]) for address in self._runner.addresses if isinstance(address, tuple)), port
        )
        self._pusher = asyncio.create_task(self._push_changes(), name="cm-pusher")
        log.info("connection manager listening", host=host, port=self.port)

    async def stop(self) -> None:
        if self._pusher is not None:
            self._pusher.cancel()
            await asyncio.gather(self._pusher, return_exceptions=True)
            self._pusher = None
        for session in list(self.sessions.values()):
            session.close("shutting-down", "the SC is shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ one connection

    async def _handle(self, request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse(max_msg_size=self.max_frame_bytes, autoping=True)
        await websocket.prepare(request)
        peer = request.remote
        register = await self._read_register(websocket, peer)
        if register is None:
            return websocket
        spu = self._registered(register.spu_id)
        refusal = self._refusal(register, spu)
        if refusal is not None:
            code, reason = refusal
            self.stats.count(self.stats.rejected, code)
            log.warning("SPU connection rejected", spu=register.spu_id, peer=peer, code=code, reason=reason)
            await _reject(websocket, code, reason)
            return websocket
        session = Session(register.spu_id, websocket)
        previous = self.sessions.get(register.spu_id)
        if previous is not None:
            previous.close("replaced", f"a new connection for SPU {register.spu_id} replaced this one")
            log.info("SPU connection replaced", spu=register.spu_id, peer=peer)
        self.sessions[register.spu_id] = session
        self.draining.discard(register.spu_id)
        self.stats.accepted += 1
        writer = asyncio.create_task(session.write_loop(), name=f"cm-writer-{register.spu_id}")
        try:
            session.send(wire.Accepted(spu_id=register.spu_id, heartbeat_timeout=self.heartbeat_timeout))
            self._send_sync(session)
            self.health.set(register.spu_id, health_module.Health.ONLINE, asyncio.get_running_loop().time())
            log.info("SPU connected", spu=register.spu_id, peer=peer, replicas=len(session.hosted))
            await self._read_reports(session)
        finally:
            if self.sessions.get(register.spu_id) is session:
                del self.sessions[register.spu_id]
                if session.closing is None or session.closing[0] != "shutting-down":  # an SC stopping says nothing of its SPUs
                    self.health.set(register.spu_id, health_module.Health.OFFLINE, asyncio.get_running_loop().time())
                log.info("SPU disconnected", spu=register.spu_id, reason=session.closing)
            session.close(*(session.closing or ("closed", "connection closed")))
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError, RuntimeError):
                await asyncio.wait_for(writer, 2.0)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        return websocket

    async def _read_register(self, websocket: web.WebSocketResponse, peer: str | None) -> wire.Register | None:
        try:
            message = await websocket.receive(timeout=REGISTER_TIMEOUT)
        except asyncio.TimeoutError:
            await _reject(websocket, "register-timeout", f"no Register frame within {REGISTER_TIMEOUT:g} s")
            return None
        if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            await websocket.close()
            return None
        try:
            parsed = wire.parse_spu_message(message.data, self.max_frame_bytes)
        except wire.FrameError as error:
            self.stats.count(self.stats.frame_errors, error.code)
            log.warning("bad first frame from an SPU", peer=peer, code=error.code, error=str(error))
            await _reject(websocket, error.code, str(error))
            return None
        if not isinstance(parsed, wire.Register):
            await _reject(websocket, "expected-register", f"the first frame must be 'register', got {parsed.type!r}")
            return None
        return parsed

    def _registered(self, spu_id: int) -> models.Spu | None:
        for entry in self.local_store["spus"].view.values():
            if entry.obj.spec.id == spu_id:  # type: ignore[attr-defined]
                return entry.obj  # type: ignore[return-value]
        return None

    def _refusal(self, register: wire.Register, spu: models.Spu | None) -> tuple[str, str] | None:
        if spu is None:
            return "unregistered", (
                f"SPU id {register.spu_id} is not registered with this SC; register it first "
                "(`sc spu register` or an SPU group)"
            )
        if self.token is not None and not hmac.compare_digest((register.token or "").encode(), self.token.encode()):
            return "unauthorized", f"SPU id {register.spu_id} presented a missing or wrong token"
        return None

    async def _read_reports(self, session: Session) -> None:
        """Receive frames as fast as they come; a second task parses the newest one.

        Receiving is cheap, parsing and merging a report of thousands of partitions is not. An
        LRS frame is a complete snapshot, so when this SPU's frames come faster than the SC takes
        them in (an SC busy elsewhere, or a backlog in the socket buffers) only the newest one
        is worth parsing: the ones it replaces are counted as skipped, and every frame still
        counts as a heartbeat. So intake never falls behind its SPUs, and stale reports are
        never applied after fresher ones."""
        inbox = _LatestFrame()
        taker = asyncio.create_task(self._take_frames(session, inbox), name=f"cm-lrs-{session.spu_id}")
        taker.add_done_callback(lambda task: self._taker_done(session, task))
        try:
            await self._receive_frames(session, inbox)
        finally:
            taker.cancel()
            await asyncio.gather(taker, return_exceptions=True)
            # The SPU's newest report, received but not taken in yet when its connection ended
            # (an SPU often reports right before it stops): take it before the disconnect is
            # acted on, since an election judges the followers by these offsets. Not after a
            # failure taking frames in, nor from a connection another one has replaced.
            last = inbox.take_nowait()
            failed = not taker.cancelled() and taker.exception() is not None
            if last is not None and not failed and self.sessions.get(session.spu_id) is session:
                try:
                    self._take_frame(session, last)
                except Exception as error:  # a bug here must not skip the disconnect's cleanup
                    log.error("SPU frame handling failed", spu=session.spu_id, error=repr(error))

    async def _receive_frames(self, session: Session, inbox: _LatestFrame) -> None:
        websocket = session.websocket
        while session.closing is None:
            try:
                try:
                    message = await websocket.receive(timeout=self.heartbeat_timeout)
                except asyncio.TimeoutError:
                    # The timer may have fired only because this loop was busy while the SPU's
                    # frames sat in the socket buffer: a short second look tells the two apart.
                    message = await websocket.receive(timeout=HEARTBEAT_SECOND_LOOK)
            except asyncio.TimeoutError:
                self.stats.heartbeat_timeouts += 1
                session.close(
                    "heartbeat-timeout", f"no frame from SPU {session.spu_id} for {self.heartbeat_timeout:g} s"
                )
                log.warning("SPU heartbeat timeout", spu=session.spu_id, timeout=self.heartbeat_timeout)
                return
            if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return
            if message.type is WSMsgType.ERROR:
                session.closing = ("protocol-error", str(websocket.exception()))
                log.warning("SPU connection error", spu=session.spu_id, error=str(websocket.exception()))
                return
            if inbox.put(message.data):
                self.stats.lrs_frames_skipped += 1

    def _taker_done(self, session: Session, task: asyncio.Task[None]) -> None:
        """A bug while taking a frame in must not leave the SPU connected but unheard: drop it
        (it reconnects and gets a fresh Sync)."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("SPU frame handling failed", spu=session.spu_id, error=repr(error))
        session.close("internal-error", f"the SC failed to take a frame of SPU {session.spu_id} in: {error!r}")

    async def _take_frames(self, session: Session, inbox: _LatestFrame) -> None:
        while True:
            self._take_frame(session, await inbox.take())
            # One frame at a time per SPU, then let everybody else run: fifty SPUs reporting
            # never starve the controllers, the API or the heartbeats.
            await asyncio.sleep(0)

    def _take_frame(self, session: Session, frame: bytes | str) -> None:
        try:
            parsed = wire.parse_spu_message(frame, self.max_frame_bytes)
            if isinstance(parsed, wire.Register):
                raise wire.FrameError("already-registered", f"SPU {session.spu_id} is already registered")
            self._take_reports(session, parsed)
        except wire.FrameError as error:
            self.stats.count(self.stats.frame_errors, error.code)
            log.warning("frame refused", spu=session.spu_id, code=error.code, error=str(error))
            session.send(wire.Error(code=error.code, message=str(error)))

    def _take_reports(self, session: Session, message: wire.LiveReplicas) -> None:
        """Check the whole frame first, so a bad entry changes nothing at all."""
        self.stats.lrs_frames += 1
        accepted = []
        spu_id, hosted_by_name = session.spu_id, session.hosted
        for report in message.leaders:
            hosted = hosted_by_name.get(report["partition"])
            if hosted is None:
                raise wire.FrameError(
                    "not-hosted", f"SPU {spu_id} reported partition {report['partition']!r}, which it does not host"
                )
            followers = report.get("followers")
            if followers:
                replicas = hosted.replicas
                for follower in followers:
                    if follower["spu"] not in replicas or follower["spu"] == spu_id:
                        strangers = [f["spu"] for f in followers if f["spu"] not in replicas] or [spu_id]
                        raise wire.FrameError(
                            "not-a-replica",
                            f"SPU {spu_id} reported followers {strangers} for partition "
                            f"{report['partition']!r}, whose replicas are {replicas}",
                        )
            if hosted.leader == spu_id:
                accepted.append(report)
            # A report for a partition it no longer leads is a race with a leader change: ignored.
        now = asyncio.get_running_loop().time()
        merge = self.live.merge
        changed = {report["partition"] for report in accepted if merge(spu_id, report, now)}
        if changed:
            self.on_live_change(changed)

    # ------------------------------------------------------------------ pushing specs

    def _send_sync(self, session: Session) -> None:
        spus = [_spu_info(entry.obj) for entry in self.local_store["spus"].view.values()]  # type: ignore[arg-type]
        hosted = {}
        for entry in self.local_store["partitions"].view.values():
            partition: models.Partition = entry.obj  # type: ignore[assignment]
            if session.spu_id in partition.spec.replicas:
                hosted[partition.name] = _replica_info(partition)
        session.hosted = hosted
        session.told_spus = {info.id: info for info in spus}
        session.send(wire.Sync(epoch=self.local_store.revision, spus=spus, replicas=list(hosted.values())))

    async def _push_changes(self) -> None:
        spu_listener = self.local_store["spus"].listener(local.Part.SPEC)
        partition_listener = self.local_store["partitions"].listener(local.Part.ALL)
        # Everything current is in each session's Sync: start from now.
        spu_listener.changes()
        partition_listener.changes()
        try:
            while True:
                waiters = [asyncio.ensure_future(spu_listener.wait()), asyncio.ensure_future(partition_listener.wait())]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                    await asyncio.gather(*waiters, return_exceptions=True)
                self.push(spu_listener.changes(), partition_listener.changes())
        finally:
            spu_listener.close()
            partition_listener.close()

    def push(self, spu_changes: local.Changes, partition_changes: local.Changes) -> None:
        """Tell each connected SPU what changed for it (one Update per SPU, only if non-empty)."""
        epoch = self.local_store.revision
        spus = self.local_store["spus"].view
        partitions = self.local_store["partitions"].view
        registered_ids = {entry.obj.spec.id for entry in spus.values()}  # type: ignore[attr-defined]
        for session in list(self.sessions.values()):
            if session.spu_id not in registered_ids:
                session.close("unregistered", f"SPU {session.spu_id} was unregistered")
                continue
            changed_spus, deleted_spus = _spu_delta(session, spu_changes, spus.values())
            changed, deleted = _replica_delta(session, partition_changes, partitions)
            if changed_spus or deleted_spus or changed or deleted:
                self.stats.updates_sent += 1
                session.send(
                    wire.Update(
                        epoch=epoch,
                        spus=changed_spus,
                        deleted_spus=deleted_spus,
                        replicas=changed,
                        deleted_replicas=deleted,
                    )
                )
        for name in partition_changes.deleted:
            self.live.forget(name)

    def drain(self, spu_id: int) -> None:
        self.draining.add(spu_id)


def _spu_delta(
    session: Session, changes: local.Changes, current: Iterable[local.Entry]
) -> tuple[list[wire.SpuInfo], list[int]]:
    if changes.empty:
        return [], []
    entries = current if changes.full else changes.updated
    changed = []
    for entry in entries:
        info = _spu_info(entry.obj)  # type: ignore[arg-type]
        if session.told_spus.get(info.id) != info:
            session.told_spus[info.id] = info
            changed.append(info)
    live_ids = {entry.obj.spec.id for entry in current}  # type: ignore[attr-defined]
    deleted = sorted(spu_id for spu_id in session.told_spus if spu_id not in live_ids)
    for spu_id in deleted:
        del session.told_spus[spu_id]
    return changed, deleted


def _replica_delta(
    session: Session, changes: local.Changes, partitions: dict[str, local.Entry] | object
) -> tuple[list[wire.ReplicaInfo], list[str]]:
    if changes.empty:
        return [], []
    view: dict[str, local.Entry] = partitions  # type: ignore[assignment]
    entries = view.values() if changes.full else changes.updated
    changed, deleted = [], []
    for entry in entries:
        partition: models.Partition = entry.obj  # type: ignore[assignment]
        told = session.hosted.get(partition.name)
        if session.spu_id in partition.spec.replicas:
            info = _replica_info(partition)
            if told != info:
                session.hosted[partition.name] = info
                changed.append(info)
        elif told is not None:
            del session.hosted[partition.name]
            deleted.append(partition.name)
    gone = changes.deleted if not changes.full else [name for name in session.hosted if name not in view]
    for name in gone:
        if session.hosted.pop(name, None) is not None:
            deleted.append(name)
    return changed, deleted


def _spu_info(spu: models.Spu) -> wire.SpuInfo:
    spec = spu.spec
    return wire.SpuInfo(
        id=spec.id,
        name=spu.name,
        rack=spec.rack,
        public_endpoint=wire.Endpoint(host=spec.public_endpoint.host, port=spec.public_endpoint.port),
        private_endpoint=wire.Endpoint(host=spec.private_endpoint.host, port=spec.private_endpoint.port),
    )


def _replica_info(partition: models.Partition) -> wire.ReplicaInfo:
    leaderless = partition.status.resolution is models.PartitionResolution.LEADER_OFFLINE
    return wire.ReplicaInfo(
        partition=partition.name,
        leader=None if leaderless else partition.spec.leader,
        replicas=list(partition.spec.replicas),
    )


async def _reject(websocket: web.WebSocketResponse, code: str, reason: str) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await websocket.send_bytes(wire.encode(wire.Rejected(code=code, reason=reason)))
    await websocket.close(message=reason[:120].encode())
