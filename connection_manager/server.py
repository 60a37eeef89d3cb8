"""The connection manager: the SC's private WebSocket server for SPUs (port 9004).

Accepts only registered SPUs (with the shared token when one is configured, else from loopback
only), never lets a newcomer without the token evict a healthy session, keeps the health view,
takes in live-replica reports, and pushes each SPU the SPU endpoints and the replicas it hosts: a
full Sync on connect, then Update deltas as committed specs change. It never writes to the KV
store; the controllers turn what it learns into writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from aiohttp import WSMsgType, web

from connection_manager import health as health_module
from connection_manager import lrs, ratelimit, tls, transport, wire
from store import local, models, spu_index
from store import supervisor as supervisor_module

log = structlog.get_logger(__name__)

REGISTER_TIMEOUT = 10.0  # seconds a new connection has to send its Register frame
SEND_QUEUE_LIMIT = 1_000  # frames queued for one SPU before it is considered stuck
HEARTBEAT_SECOND_LOOK = 0.5  # seconds
# A refused connection is logged once per (cause, peer address) in this many seconds; the
# repeats in between are counted (and the count logged with the next line), not logged each.
REFUSAL_LOG_INTERVAL = 60.0
# Distinct (cause, peer) pairs remembered for that; beyond it the oldest are forgotten (a
# forgotten pair is merely logged again), so refusals from many addresses cannot grow memory.
REFUSAL_LOG_KEYS = 1_024
# A frame error's message (ours, quoting a piece of the frame) is cut beyond this many characters.
FRAME_ERROR_CHARS = 160


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

    def __init__(self, spu_id: int, name: str, websocket: web.WebSocketResponse) -> None:
        self.spu_id = spu_id
        self.name = name  # the SPU object holding the id when it connected
        self.websocket = websocket
        self.hosted: dict[str, wire.ReplicaInfo] = {}
        self.told_spus: dict[int, wire.SpuInfo] = {}
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closing: tuple[str, str] | None = None
        self.last_frame_at = asyncio.get_running_loop().time()

    def healthy(self, now: float, heartbeat_timeout: float) -> bool:
        """Open, and heard from within the heartbeat timeout: the SPU behind it is alive."""
        return self.closing is None and not self.websocket.closed and now - self.last_frame_at <= heartbeat_timeout

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


class RefusalLog:
    """Says whether a refusal is worth a log line: the first of its (cause, peer) in an interval.

    A client retrying in a loop would otherwise write one warning per try; the counters in
    ``Stats`` still count every refusal."""

    def __init__(self, interval: float = REFUSAL_LOG_INTERVAL, max_keys: int = REFUSAL_LOG_KEYS) -> None:
        self.interval = interval
        self.max_keys = max_keys
        # (cause, peer) -> [loop time of the last line logged, repeats not logged since]
        self._seen: dict[tuple[str, str | None], list[float]] = {}

    def due(self, code: str, peer: str | None, now: float) -> int | None:
        """None to stay quiet; else log now, mentioning this many repeats left unlogged."""
        key = (code, peer)
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval:
            seen[1] += 1
            return None
        suppressed = 0 if seen is None else int(seen[1])
        self._seen.pop(key, None)
        if len(self._seen) >= self.max_keys:
            del self._seen[next(iter(self._seen))]  # the oldest line (dicts keep insertion order)
        self._seen[key] = [now, 0]
        return suppressed


def spu_identity(spu_id: int) -> str:
    """The name an SPU's client certificate carries (CN or DNS SAN) under mutual TLS."""
    return f"spu-{spu_id}"


def is_loopback(peer: str | None) -> bool:
    """A peer address on this host (127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6)."""
    if peer is None:
        return False
    try:
        address = ipaddress.ip_address(peer.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


class ConnectionManager:
    def __init__(
        self,
        local_store: local.LocalStore,
        health: health_module.HealthView,
        live: lrs.LiveReplicas,
        *,
        token: str | None = None,
        allow_remote_without_token: bool = False,
        heartbeat_timeout: float = 10.0,
        max_frame_bytes: int = wire.MAX_FRAME_BYTES,
        on_live_change: Callable[[set[str]], None] = lambda names: None,
        supervisor: supervisor_module.Supervisor | None = None,
        listener: transport.Port | None = None,
        certificate_identity: bool = False,
    ) -> None:
        self.local_store = local_store
        self.health = health
        self.live = live
        self.token = token
        # Under mutual TLS each SPU's client certificate names it (CN or DNS SAN spu-<id>).
        self.certificate_identity = certificate_identity
        # Without a token or certificates, anyone who reaches the port could be any SPU: only this host may.
        self.allow_remote = token is not None or certificate_identity or allow_remote_without_token
        self.heartbeat_timeout = heartbeat_timeout
        self.max_frame_bytes = max_frame_bytes
        self.on_live_change = on_live_change
        # Connection limits and timeouts of the private port (None: the defaults).
        self.listener = listener if listener is not None else transport.Port(transport.PRIVATE)
        self.sessions: dict[int, Session] = {}
        self.stats = Stats()
        self.supervisor = supervisor if supervisor is not None else supervisor_module.Supervisor()
        self.refusals = RefusalLog()
        # Events any client can repeat at will, from any number of addresses: one line per kind.
        self.log = ratelimit.RateLimitedLog(log)
        self._runner: web.AppRunner | None = None
        self._pusher: asyncio.Task[None] | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_frame_bytes, middlewares=[transport.middleware])
        app.router.add_get(wire.SPU_PATH, self._handle)
        return app

    async def start(self, host: str, port: int, tls_context: transport.TlsContext | None = None) -> None:
        self._runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = transport.GuardedSite(self._runner, host, port, self.listener, tls=tls_context)
        await site.start()
        self.port = next(
            (int(address[1]) for address in self._runner.addresses if isinstance(address, tuple)), port
        )
        self._pusher = self.supervisor.spawn("cm-pusher", self._push_changes)
        log.info("connection manager listening", host=host, port=self.port)
        if self.certificate_identity:
            log.info("SPUs prove who they are with client certificates naming spu-<id>", port=self.port)
        elif self.token is None and not self.allow_remote:
            log.warning(
                "no SPU token is configured: the private port accepts SPUs from this host (loopback) only; "
                "to accept SPUs from other hosts, give every SPU a shared token (spu_token_file, "
                "`sc spu run --token-file`)",
                port=self.port,
            )
        elif self.token is None:
            log.warning(
                "no SPU token is configured and spu_allow_remote_without_token is set: anyone who reaches "
                "the private port can connect as any registered SPU; configure spu_token_file",
                port=self.port,
            )

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
        if not self.allow_remote and not is_loopback(peer):
            await self._refuse(
                websocket, peer, None, "remote-not-allowed",
                f"this SC has no SPU token configured, so it accepts SPUs from its own host only (not from {peer}); "
                "configure a shared token (spu_token_file) on the SC and give it to the SPUs (--token-file)",
            )
            return websocket
        register = await self._read_register(websocket, peer)
        if register is None:
            return websocket
        spu_id = register.spu_id
        refusal = self._identity_refusal(spu_id, tls.peercert_of(request.transport)) or self._refusal(register)
        if refusal is not None:
            await self._refuse(websocket, peer, spu_id, *refusal)
            return websocket
        registered = self._registered(spu_id)
        assert registered is not None  # _refusal refused an id no SPU holds, and nothing awaited since
        session = Session(spu_id, registered.name, websocket)
        previous = self.sessions.get(spu_id)
        now = asyncio.get_running_loop().time()
        self.sessions[spu_id] = session
        if previous is not None:
            previous.close("replaced", f"a new connection for SPU {spu_id} replaced this one")
            log.info("SPU connection replaced", spu=spu_id, peer=peer, previous_was_healthy=previous.healthy(now, self.heartbeat_timeout))
            self._restarted(spu_id, now)
        self.stats.accepted += 1
        writer = asyncio.create_task(session.write_loop(), name=f"cm-writer-{spu_id}")
        try:
            session.send(wire.Accepted(spu_id=spu_id, heartbeat_timeout=self.heartbeat_timeout))
            self._send_sync(session)
            self.health.set(spu_id, health_module.Health.ONLINE, now)
            log.info("SPU connected", spu=spu_id, name=session.name, peer=peer, replicas=len(session.hosted))
            await self._read_reports(session)
        finally:
            if self.sessions.get(spu_id) is session:
                del self.sessions[spu_id]
                if session.closing is None or session.closing[0] != "shutting-down":  # an SC stopping says nothing of its SPUs
                    self.health.set(spu_id, health_module.Health.OFFLINE, asyncio.get_running_loop().time())
                log.info("SPU disconnected", spu=spu_id, reason=session.closing)
            session.close(*(session.closing or ("closed", "connection closed")))
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError, RuntimeError):
                await asyncio.wait_for(writer, 2.0)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        return websocket

    def _restarted(self, spu_id: int, now: float) -> None:
        """A new connection took over from a previous one: the SPU restarted. What its previous
        incarnation reported as leader is dropped (the new one may have lost records, and its
        reports will say), and the SPU goes offline then online, so every listener looks again."""
        forgotten = self.live.forget_leader(spu_id)
        self.health.set(spu_id, health_module.Health.OFFLINE, now)
        self.health.set(spu_id, health_module.Health.ONLINE, now)
        if forgotten:
            self.on_live_change(forgotten)

    async def _refuse(
        self, websocket: web.WebSocketResponse, peer: str | None, spu_id: int | None, code: str, reason: str
    ) -> None:
        """Tell the client why and close; count every refusal, log a cause and peer once an interval."""
        self.stats.count(self.stats.rejected, code)
        suppressed = self.refusals.due(code, peer, asyncio.get_running_loop().time())
        if suppressed is not None:
            log.warning(
                "SPU connection rejected", spu=spu_id, peer=peer, code=code, reason=reason,
                repeats_not_logged=suppressed,
            )
        await _reject(websocket, code, reason)

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
            # The message may quote the client's bytes (a type tag, a field name) at any length.
            detail = ratelimit.clipped(str(error), FRAME_ERROR_CHARS)
            self.log.warning(f"spu:first-frame:{error.code}", "bad first frame from an SPU", peer=peer, code=error.code, error=detail)
            await _reject(websocket, error.code, detail)
            return None
        if not isinstance(parsed, wire.Register):
            await _reject(websocket, "expected-register", f"the first frame must be 'register', got {parsed.type!r}")
            return None
        return parsed

    def _registered(self, spu_id: int) -> models.Spu | None:
        """The SPU that holds ``spu_id``: of SPUs sharing it (written behind the SC's back), the
        one placement uses too (store/spu_index.py)."""
        entry = spu_index.holder(self.local_store["spus"].view, self.local_store.meta.values.get, spu_id)
        return None if entry is None else entry.obj  # type: ignore[return-value]

    def _holders(self) -> dict[int, local.Entry]:
        return spu_index.holders(self.local_store["spus"].view, self.local_store.meta.values.get)

    def _identity_refusal(self, spu_id: int, peercert: dict[str, object] | None) -> tuple[str, str] | None:
        """(code, reason) when mutual TLS is on and the client certificate does not name SPU ``spu_id``."""
        if not self.certificate_identity:
            return None
        common_name, dns_names = tls.peer_names(peercert)
        expected = spu_identity(spu_id)
        if expected == common_name or expected in dns_names:
            return None
        named = ", ".join(dict.fromkeys(name for name in (common_name, *dns_names) if name)) or "no name"
        return "wrong-identity", (
            f"the client certificate names {named}, not {expected}: SPU {spu_id} must present a certificate "
            f"whose CN or a DNS SAN is {expected}"
        )

    def _refusal(self, register: wire.Register) -> tuple[str, str] | None:
        """(code, reason) when the Register is refused.

        The token first: a client without it gets the same answer whether the id is registered
        or not, so it cannot map the registered ids. Then a healthy session of the same id is
        never evicted by a client that could not prove it is that SPU (without a token nobody
        can: the newcomer waits until the session goes silent or closes)."""
        spu_id = register.spu_id
        # Nothing about the id is looked up before this: not even the time it takes may differ.
        if self.token is not None and not hmac.compare_digest((register.token or "").encode(), self.token.encode()):
            return "unauthorized", f"SPU id {spu_id} presented a missing or wrong token"
        if self._registered(spu_id) is None:
            return "unregistered", (
                f"SPU id {spu_id} is not registered with this SC; register it first "
                "(`sc spu register` or an SPU group)"
            )
        current = self.sessions.get(spu_id)
        proven = self.token is not None or self.certificate_identity
        if not proven and current is not None and current.healthy(asyncio.get_running_loop().time(), self.heartbeat_timeout):
            return "already-connected", (
                f"SPU {spu_id} is connected and healthy on another connection; a new connection may take over "
                f"only once that one has been silent for {self.heartbeat_timeout:g} s (or with the SPU token, "
                "when one is configured)"
            )
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
            session.last_frame_at = asyncio.get_running_loop().time()
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
        spus = [_spu_info(entry.obj) for entry in self._holders().values()]  # type: ignore[arg-type]
        hosted = {}
        for entry in self.local_store["partitions"].view.values():
            partition: models.Partition = entry.obj  # type: ignore[assignment]
            if session.spu_id in partition.spec.replicas:
                hosted[partition.name] = _replica_info(partition)
        session.hosted = hosted
        session.told_spus = {info.id: info for info in spus}
        session.send(wire.Sync(epoch=self.local_store.revision, spus=spus, replicas=list(hosted.values())))

    async def _push_changes(self) -> None:
        """Until cancelled. Each call starts from now: what a crashed call had not pushed yet is
        in the Sync every connected SPU is sent here (at the first start, none is connected)."""
        spu_listener = self.local_store["spus"].listener(local.Part.SPEC)
        partition_listener = self.local_store["partitions"].listener(local.Part.ALL)
        # Everything current is in each session's Sync: start from now.
        spu_listener.changes()
        partition_listener.changes()
        for session in list(self.sessions.values()):
            if session.closing is None:
                self._send_sync(session)
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
        partitions = self.local_store["partitions"].view
        held = self._holders()
        for session in list(self.sessions.values()):
            if session.spu_id not in held:
                session.close("unregistered", f"SPU {session.spu_id} was unregistered")
                continue
            changed_spus, deleted_spus = _spu_delta(session, spu_changes, held)
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


def _spu_delta(
    session: Session, changes: local.Changes, held: dict[int, local.Entry]
) -> tuple[list[wire.SpuInfo], list[int]]:
    """What ``session`` was told of the ids ``changes`` touch and what their holders (``held``)
    are now: the ids of the SPUs changed, and the ids told under the name of an SPU changed or
    deleted (an SPU that moved off an id, or gave it up to another SPU sharing it)."""
    if changes.empty:
        return [], []
    if changes.full:
        ids = set(held) | set(session.told_spus)
    else:
        ids = {entry.obj.spec.id for entry in changes.updated}  # type: ignore[attr-defined]
        names = {entry.name for entry in changes.updated} | set(changes.deleted)
        ids.update(spu_id for spu_id, info in session.told_spus.items() if info.name in names)
    changed, deleted = [], []
    for spu_id in sorted(ids):
        holder = held.get(spu_id)
        if holder is None:
            if session.told_spus.pop(spu_id, None) is not None:
                deleted.append(spu_id)
            continue
        info = _spu_info(holder.obj)  # type: ignore[arg-type]
        if session.told_spus.get(spu_id) != info:
            session.told_spus[spu_id] = info
            changed.append(info)
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
