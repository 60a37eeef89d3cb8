"""The connection manager: the SC's private WebSocket server for SPUs (port 9004, protocol v2).

Accepts only registered SPUs (with the shared token when one is configured, else from loopback
only), never lets a newcomer without the token evict a healthy session, numbers every accepted
connection (its incarnation), keeps the health view, takes in what SPUs report (what a process
holds, leadership confirmations, in-sync proposals, live offsets) and pushes each SPU the SPU
endpoints and the replicas it hosts with their committed state: a full Sync once the SPU said what
it holds, then Update deltas as committed objects change. It never writes to the KV store; the
controllers turn what it learns into writes, and it sends their answers. docs/replication.md
describes the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import math
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from aiohttp import WSMsgType, web

from connection_manager import health as health_module
from connection_manager import lrs, ratelimit, reports, tls, transport, wire
from store import local, models, spu_index
from store import supervisor as supervisor_module

log = structlog.get_logger(__name__)

REGISTER_TIMEOUT = 10.0  # seconds a new connection has to send its Register frame, then its Hosted frame
# The largest first frame (Register: an id, the token, a leader's address) read. It comes before
# the client proved anything, so it is refused unparsed beyond this: a 4 MB one (the frame limit)
# of 350,000 extra fields took 1 to 2.5 s of the event loop and 400 MB to be refused.
REGISTER_MAX_BYTES = 64 * 1024
DEFAULT_OFFSETS_INTERVAL = 1.0  # seconds: an SPU sends at most one Offsets frame this often
DEFAULT_OFFSETS_ENTRIES_PER_SECOND = 20_000  # all SPUs together, at most (the interval grows to keep it)
MAX_OFFSETS_INTERVAL = 60.0  # seconds: the longest interval the partition count makes
OFFSETS_JITTER = 0.9  # an Offsets frame this share of the interval after the previous one is on time
# Seconds of Offsets frames taken at once beyond that pace. Frames an SPU sent on time queue in its
# socket while the SC's loop is busy, and arrive together: taken for a flood, they were paced, and
# the SC stopped reading until each next one's time, so a ping behind them waited an interval per
# frame (an SPU then waited 2.5 s for its pong, the heartbeat timeout now: after a stall of a
# second or two it could give up).
# A flood is still read at the pace after this much.
OFFSETS_BURST_SECONDS = 3.0
# Seconds the pusher waits after the first change it wakes for, so that the changes a burst makes
# together (a thousand topics created, a failover's elections coming back 256 at a time) go to each
# SPU in one Update rather than one per store apply. With none, 1,000 topics created by 32 clients
# at once took 22-25 s to be Online on 100 live SPUs (the SPUs' process read ~1,500 Updates and
# confirmed each); with 20 ms, 5.9-7.5 s (docs/replication.md). It adds at most that to a failover.
PUSH_LINGER = 0.02
# Bytes per second an SPU's frames may come in at, its `hosted` frame included, beyond a burst of
# two of the largest: reading the SPU stops until it is back within (its frames wait in its own
# socket). The SC spends 0.7-0.8 s of its loop on a 4 MB frame, valid or not: one SPU sending them
# back to back kept it busy with little else (`offsets` frames, paced by their count, could be 4 MB
# each too). An SPU sends a few MB at most at once (its `hosted` and `leading` frames after a
# connection, a leader's proposals after a follower's return), and its offsets under the
# cluster's entries budget; one flooding costs the SC ~20% of its core.
FRAME_BYTES_PER_SECOND = 1024 * 1024
# Bytes queued for one SPU before it is considered stuck (it does not read). In bytes, not frames:
# a count of frames bounds not the memory of a few large ones (a Sync of thousands of replicas).
# Its connection is then aborted if it does not take the close either (transport.CLOSE_SECONDS).
SEND_QUEUE_BYTES = 32 * 1024 * 1024
# Counted for every queued frame beside its length: the bytes object and its place in the queue.
FRAME_OVERHEAD_BYTES = 100
HEARTBEAT_SECOND_LOOK = 0.5  # seconds
# Incarnation numbers start at a random base in [1, 2**52] in every SC process and count up: an
# SC restarted, or a standby taking over, does not give an SPU's new process the number its
# previous one had under another SC (a leader's proposal naming that one would pass for the new
# one, KIP-903). Two processes' numbers meet only if their bases fall within the connections they
# number of each other: under 2 * 10**6 / 2**52 (about 4.4e-10) for a million connections each.
# Below 2**53 for 2**52 connections: exact in any JSON reader's numbers, far below the wire's 2**63 - 1.
INCARNATION_BASE_RANGE = 2**52


def incarnation_base() -> int:
    """The number before this process's first incarnation: random, so processes do not collide."""
    return secrets.randbelow(INCARNATION_BASE_RANGE)


# The code of a refusal (and of a closed session) because this SC is not the leader of its store.
NOT_LEADER = "not-leader"
# A standby holds an SPU's registration up to this long, instead of refusing it at once, while no
# SC it could name leads (a takeover under way) or while the leader it would name is the one the
# SPU says it cannot reach (a dead leader whose claim has not expired yet): if this SC leads
# meanwhile it accepts the SPU at once. Well under the SPU's wait for an answer to Register.
STANDBY_HOLD = 1.0
# While holding, the leader a standby would name is looked at again this often (its own term
# starting wakes it at once: role_changed).
STANDBY_HOLD_POLL = 0.05
# A refused connection is logged once per (cause, peer address) in this many seconds; the
# repeats in between are counted (and the count logged with the next line), not logged each.
REFUSAL_LOG_INTERVAL = 60.0
# Distinct (cause, peer) pairs remembered for that; beyond it the oldest are forgotten (a
# forgotten pair is merely logged again), so refusals from many addresses cannot grow memory.
REFUSAL_LOG_KEYS = 1_024
# A frame error's message (ours, quoting a piece of the frame) is cut beyond this many characters.
FRAME_ERROR_CHARS = 160
# Stale confirmations of one `leading` frame refused one by one (an `error` each, naming the
# partition and its committed leader epoch); the rest of the frame's are refused together in one
# `error` of code STALE_LEADERSHIPS. One each made a 4 MiB frame of 90,000 stale entries cost the
# SC 2.2 s of its loop and 90,001 frames back (20 MB), beyond what its bytes' rate bounds.
STALE_ANSWERS_PER_FRAME = 16
STALE_LEADERSHIPS = "stale-leaderships"
# The code of a refusal of a leadership confirmation or proposal about a partition that is no
# longer the one of that name (deleted, maybe created again: another uid).
STALE_PARTITION = "stale-partition"


@dataclass
class Stats:
    """Counters the daemon's metrics read at scrape time."""

    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    frame_errors: dict[str, int] = field(default_factory=dict)
    frames: dict[str, int] = field(default_factory=dict)  # SPU frames taken in, by type
    stale_entries: int = 0  # offsets or confirmations at an epoch that is not (or no longer) the SPU's
    proposals: int = 0  # AlterIsr frames taken in
    heartbeat_timeouts: int = 0
    updates_sent: int = 0
    offsets_paced: int = 0  # Offsets frames that came sooner than the protocol allows (see _pace)
    frames_paced: int = 0  # times an SPU's reading stopped because its frames came over their bytes' rate
    held: int = 0  # registrations a standby held before answering (see STANDBY_HOLD)

    def count(self, table: dict[str, int], code: str) -> None:
        table[code] = table.get(code, 0) + 1


class Session:
    """One connected SPU: its incarnation, what it has been told, and its outgoing frames (sent in order)."""

    def __init__(self, spu_id: int, name: str, incarnation: int, websocket: web.WebSocketResponse, registered_at: int = 0) -> None:
        self.spu_id = spu_id
        # The registration it was accepted for: the SPU object holding the id when it connected, and
        # that object's create revision. Once another object holds the id (even under the same
        # name, deleted and registered again), this connection is not that SPU's.
        self.name = name
        self.registered_at = registered_at
        self.incarnation = reports.Incarnation(spu_id, incarnation)
        self.websocket = websocket
        self.hosted: dict[str, wire.ReplicaInfo] = {}  # partition -> what it was last told of it
        # Partition -> the uid of the log its process keeps for that name while it is told none (a
        # uid removed by hand, or none when it connected holding a log of one): told another uid
        # later, it drops that log.
        self.kept_uids: dict[str, int] = {}
        self.told_spus: dict[int, wire.SpuInfo] = {}
        self.outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued_bytes = 0  # in the outbox, with FRAME_OVERHEAD_BYTES a frame
        self.closing: tuple[str, str] | None = None
        self.last_frame_at = asyncio.get_running_loop().time()
        self.ready = False  # it said what it holds (Hosted): online, synced
        # When its Offsets frames, taken one per pace from now on, would have caught up (see _offsets_due).
        self.offsets_caught_up_at = -math.inf
        self.offsets_interval = DEFAULT_OFFSETS_INTERVAL  # what it was told at its Accepted

    @property
    def number(self) -> int:
        return self.incarnation.number

    def healthy(self, now: float, heartbeat_timeout: float) -> bool:
        """Open, and heard from within the heartbeat timeout: the SPU behind it is alive."""
        return self.closing is None and not self.websocket.closed and now - self.last_frame_at <= heartbeat_timeout

    def send(self, message: wire.Message) -> None:
        if self.closing is not None:
            return  # its connection is being closed: nobody will read more
        frame = wire.encode(message)
        cost = len(frame) + FRAME_OVERHEAD_BYTES
        if self.queued_bytes + cost > SEND_QUEUE_BYTES:
            reason = (
                f"SPU {self.spu_id} is not reading its frames ({self.outbox.qsize()} frames of "
                f"{self.queued_bytes} bytes queued; at most {SEND_QUEUE_BYTES} bytes)"
            )
            log.warning("closing a connection of an SPU that does not read", spu=self.spu_id, incarnation=self.number, reason=reason)
            self.close("too-slow", reason)
            return
        self.queued_bytes += cost
        self.outbox.put_nowait(frame)

    def close(self, code: str, reason: str) -> None:
        if self.closing is None:
            self.closing = (code, reason)
            self.outbox.put_nowait(None)

    async def write_loop(self) -> None:
        while True:
            frame = await self.outbox.get()
            if frame is not None:
                self.queued_bytes -= len(frame) + FRAME_OVERHEAD_BYTES
            if frame is None:
                code, reason = self.closing or ("closed", "closed by the SC")
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self.websocket.send_bytes(wire.encode(wire.Rejected(code=code, reason=reason)))
                await self.websocket.close(message=reason[:120].encode())
                return
            await self.websocket.send_bytes(frame)


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


def _digests(tokens: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(token.encode()).digest() for token in tokens)


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
        tokens: Sequence[str] | None = None,
        allow_remote_without_token: bool = False,
        heartbeat_timeout: float = 10.0,
        offsets_interval: float = DEFAULT_OFFSETS_INTERVAL,
        offsets_entries_per_second: int = DEFAULT_OFFSETS_ENTRIES_PER_SECOND,
        max_frame_bytes: int = wire.MAX_FRAME_BYTES,
        on_news: Callable[[set[str]], None] = lambda names: None,
        supervisor: supervisor_module.Supervisor | None = None,
        listener: transport.Port | None = None,
        certificate_identity: bool = False,
        push_linger: float = PUSH_LINGER,
        frame_bytes_per_second: int = FRAME_BYTES_PER_SECOND,
    ) -> None:
        self.local_store = local_store
        self.health = health
        self.live = live
        # The SPU tokens accepted (during a rotation the new one and the old), or None: no token.
        self.tokens = None if tokens is None else tuple(tokens)
        # What a presented token is compared with: digests are of equal lengths, so the comparison
        # takes as long whatever the length of the token presented (it tells nothing of the tokens').
        self._token_digests = () if tokens is None else _digests(tokens)
        # Under mutual TLS each SPU's client certificate names it (CN or DNS SAN spu-<id>).
        self.certificate_identity = certificate_identity
        # Without a token or certificates, anyone who reaches the port could be any SPU: only this host may.
        self.allow_remote = tokens is not None or certificate_identity or allow_remote_without_token
        self.heartbeat_timeout = heartbeat_timeout
        self.offsets_interval = offsets_interval
        self.offsets_entries_per_second = offsets_entries_per_second
        self.max_frame_bytes = max_frame_bytes
        self.push_linger = push_linger
        self.frame_bytes_per_second = frame_bytes_per_second
        self.frame_bytes_burst = 2 * max_frame_bytes  # the largest frames, two of them at once
        # SPU id -> when the bytes of its frames so far are paid for at that rate (kept across its
        # connections while in the future: a reconnection does not refill the burst).
        self._frame_bytes_due: dict[int, float] = {}
        # Told the partitions a leader's confirmation or proposal is about: the partition
        # controller looks at them (offsets never wake it: no decision depends on them).
        self.on_news = on_news
        # Connection limits and timeouts of the private port (None: the defaults).
        self.listener = listener if listener is not None else transport.Port(transport.PRIVATE)
        self.sessions: dict[int, Session] = {}
        # SPU id -> its current connection, once it said what it holds (what the controllers read).
        self.incarnations: dict[int, reports.Incarnation] = {}
        # Partition -> the pending AlterIsr of its leader's current connection, until answered.
        self.proposals: dict[str, reports.Proposal] = {}
        # Partition -> (SPU, leader epoch) of the last leadership confirmation accepted.
        self.confirmed: dict[str, tuple[int, int]] = {}
        # Partition -> the uid of the partition of that name that what this SC keeps of it
        # (confirmation, proposal, offsets) is about, for partitions that have one: a relist of the
        # store may show it was deleted and created again without naming it deleted (see
        # forget_recreated).
        self.identities: dict[str, int] = {}
        self._incarnation_counter = incarnation_base()
        # (partitions table epoch, SPU id -> the entries of the partitions it is a replica of):
        # built with one pass over the table and kept while the table does not change, so the
        # SPUs connecting together (an SC start, a takeover) cost their own replicas each, not a
        # pass over every partition.
        self._replicas_by_spu: tuple[int, dict[int, list[local.Entry[models.Partition]]]] | None = None
        self.stats = Stats()
        self.supervisor = supervisor if supervisor is not None else supervisor_module.Supervisor()
        self.refusals = RefusalLog()
        # Events any client can repeat at will, from any number of addresses: one line per kind.
        self.log = ratelimit.RateLimitedLog(log)
        self._runner: web.AppRunner | None = None
        self._pusher: asyncio.Task[None] | None = None
        # The partitions table's epoch its last push covered, while the pusher runs (see
        # pushed_through), and who is told after each push (the partition controller).
        self.pushed_epoch = 0
        self._pushing = False
        self.on_pushed: Callable[[], None] = lambda: None
        self.port: int | None = None
        # Why this SC takes no SPU now (None: it does), and the leader's private HOST:PORT when
        # known: a standby SC refuses every SPU, naming the leader to go to. Asked at each connection.
        self.standby_refusal: Callable[[], tuple[str, str | None] | None] = lambda: None
        # Set (and replaced) by role_changed: wakes the registrations a standby holds.
        self._role_changed = asyncio.Event()

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
        elif self.tokens is None and not self.allow_remote:
            log.warning(
                "no SPU token is configured: the private port accepts SPUs from this host (loopback) only; "
                "to accept SPUs from other hosts, give every SPU a shared token (spu_token_file, "
                "`sc spu run --token-file`)",
                port=self.port,
            )
        elif self.tokens is None:
            log.warning(
                "no SPU token is configured and spu_allow_remote_without_token is set: anyone who reaches "
                "the private port can connect as any registered SPU; configure spu_token_file",
                port=self.port,
            )

    def set_tokens(self, tokens: Sequence[str]) -> None:
        """New SPU tokens (their file changed): one of them is asked of every Register from now on.
        The SPUs connected keep their connections: they proved a token of their time, and a
        rotation must not take every SPU offline at once (Kafka and etcd keep established sessions
        too); one that reconnects needs a token listed now. Listing the new token with the old
        lets SPUs move over one at a time, a reconnection meanwhile refused to none."""
        self.tokens = tuple(tokens)
        self._token_digests = _digests(tokens)
        log.info("SPU tokens set: a registration presents one of them", tokens=len(self.tokens))

    def role_changed(self) -> None:
        """This SC's role changed (it leads now, or stopped leading): the registrations held
        look at ``standby_refusal`` again at once."""
        self._role_changed.set()
        self._role_changed = asyncio.Event()

    def end_term(self, reason: str) -> None:
        """This SC stopped leading: close every SPU connection (code ``not-leader``) and forget what
        they told it (the highest HWs aside); new ones are refused while ``standby_refusal`` says so."""
        for session in list(self.sessions.values()):
            session.close(NOT_LEADER, reason)
        self.proposals.clear()
        self.confirmed.clear()
        self.live.forget_statuses()

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
        # Who it is, before anything else: a client without the SPU token (or the SPU's
        # certificate) learns nothing, not even where the leader is, and is never held.
        refusal = self._identity_refusal(spu_id, tls.peercert_of(request.transport)) or self._token_refusal(register)
        if refusal is not None:
            await self._refuse(websocket, peer, spu_id, *refusal)
            return websocket
        standby = self.standby_refusal()
        if standby is not None and _worth_holding(standby, register):
            standby = await self._hold(standby, register)
        if standby is not None:
            await self._refuse(websocket, peer, spu_id, NOT_LEADER, standby[0], leader=standby[1])
            return websocket
        refusal = self._refusal(register)
        if refusal is not None:
            await self._refuse(websocket, peer, spu_id, *refusal)
            return websocket
        registered = self._registered(spu_id)
        assert registered is not None  # _refusal refused an id no SPU holds, and nothing awaited since
        self._incarnation_counter += 1
        session = Session(spu_id, registered.name, self._incarnation_counter, websocket, registered.create_revision)
        previous = self.sessions.get(spu_id)
        now = asyncio.get_running_loop().time()
        self.sessions[spu_id] = session
        if previous is not None:
            previous.close("replaced", f"a new connection for SPU {spu_id} replaced this one")
            log.info(
                "SPU connection replaced", spu=spu_id, peer=peer, incarnation=session.number,
                previous_was_healthy=previous.healthy(now, self.heartbeat_timeout),
            )
            self._gone(previous, now)
        self.stats.accepted += 1
        writer = asyncio.create_task(session.write_loop(), name=f"cm-writer-{spu_id}")
        try:
            session.offsets_interval = self.offsets_interval_now()
            session.send(
                wire.Accepted(
                    spu_id=spu_id, incarnation=session.number, heartbeat_timeout=self.heartbeat_timeout,
                    offsets_interval=session.offsets_interval,
                )
            )
            if await self._read_hosted(session):
                log.info(
                    "SPU connected", spu=spu_id, name=session.name, peer=peer, incarnation=session.number,
                    replicas=len(session.hosted),
                )
                await self._read_frames(session)
        finally:
            if self._frame_bytes_due.get(spu_id, 0.0) <= asyncio.get_running_loop().time():
                self._frame_bytes_due.pop(spu_id, None)
            if self.sessions.get(spu_id) is session:
                del self.sessions[spu_id]
                # An SC stopping says nothing of its SPUs.
                if session.closing is None or session.closing[0] != "shutting-down":
                    self._gone(session, asyncio.get_running_loop().time())
                log.info("SPU disconnected", spu=spu_id, incarnation=session.number, reason=session.closing)
            session.close(*(session.closing or ("closed", "connection closed")))
            with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
                async with asyncio.timeout(2.0):
                    await writer
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        return websocket

    async def _hold(self, standby: tuple[str, str | None], register: wire.Register) -> tuple[str, str | None] | None:
        """Hold a registration this standby would refuse (see STANDBY_HOLD) until it leads (None:
        accept it), names a leader worth going to, or the hold ends: the refusal to send then."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STANDBY_HOLD
        self.stats.held += 1
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return standby
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, STANDBY_HOLD_POLL)):
                    await self._role_changed.wait()
            current = self.standby_refusal()
            if current is None or not _worth_holding(current, register):
                return current
            standby = current

    def _gone(self, session: Session, now: float) -> None:
        """``session`` is over: the SPU is offline until a newer connection says what it holds, and
        nothing its proposals asked is pending any more (its leader re-sends them on that one)."""
        if self.incarnations.get(session.spu_id) is session.incarnation:
            del self.incarnations[session.spu_id]
        dropped = {name for name, proposal in self.proposals.items() if proposal.incarnation == session.number}
        for name in dropped:
            del self.proposals[name]
        self.health.set(session.spu_id, health_module.Health.OFFLINE, now)
        if session.spu_id not in self._holders():
            self.health.forget(session.spu_id)  # unregistered: offline was told, nothing more to keep

    async def _refuse(
        self, websocket: web.WebSocketResponse, peer: str | None, spu_id: int | None, code: str, reason: str,
        leader: str | None = None,
    ) -> None:
        """Tell the client why and close; count every refusal, log a cause and peer once an interval."""
        self.stats.count(self.stats.rejected, code)
        suppressed = self.refusals.due(code, peer, asyncio.get_running_loop().time())
        if suppressed is not None:
            log.warning(
                "SPU connection rejected", spu=spu_id, peer=peer, code=code, reason=reason,
                repeats_not_logged=suppressed,
            )
        await _reject(websocket, code, reason, leader)

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
            parsed = wire.parse_spu_message(message.data, min(self.max_frame_bytes, REGISTER_MAX_BYTES))
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

    async def _read_hosted(self, session: Session) -> bool:
        """The second frame says what the SPU's process holds: from then on the SPU is online (this
        incarnation), its Sync is sent, and the roles it was not told of are known (a restart)."""
        try:
            message = await session.websocket.receive(timeout=REGISTER_TIMEOUT)
        except asyncio.TimeoutError:
            session.close("hosted-timeout", f"no Hosted frame within {REGISTER_TIMEOUT:g} s of the registration")
            return False
        if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return False
        self._spend(session.spu_id, len(message.data))  # paid for before the next frame is read
        try:
            parsed = wire.parse_spu_message(message.data, self.max_frame_bytes)
        except wire.FrameError as error:
            self.stats.count(self.stats.frame_errors, error.code)
            # The reason is sent, and logged when the connection ends: it may quote anything.
            session.close(error.code, ratelimit.clipped(str(error), FRAME_ERROR_CHARS))
            return False
        if not isinstance(parsed, wire.Hosted):
            session.close("expected-hosted", f"the frame after the registration must be 'hosted', got {parsed.type!r}")
            return False
        if self.sessions.get(session.spu_id) is not session:
            return False  # replaced meanwhile
        session.last_frame_at = asyncio.get_running_loop().time()
        self.stats.count(self.stats.frames, "hosted")
        entries = self.replicas_of(session.spu_id)
        uids = {entry.name: uid for entry in entries if (uid := entry.obj.uid) is not None}
        hosted = reports.hosted_map(parsed.partitions, uids)
        session.kept_uids = {
            name: entry["uid"] for entry in parsed.partitions
            if "uid" in entry and (name := entry["partition"]) in hosted and name not in uids
        }  # fmt: skip
        partitions = [entry.obj for entry in entries]
        restarted = reports.roles_not_continued(session.spu_id, hosted, partitions)
        session.incarnation = reports.Incarnation(session.spu_id, session.number, hosted, restarted)
        self.incarnations[session.spu_id] = session.incarnation
        if restarted:
            log.info(
                "SPU restarted: roles it was not told of are decided again", spu=session.spu_id,
                incarnation=session.number, partitions=len(restarted),
            )
        session.ready = True
        self._send_sync(session)
        self.health.set(session.spu_id, health_module.Health.ONLINE, session.last_frame_at, session.number)
        return True

    def replicas_of(self, spu_id: int) -> list[local.Entry[models.Partition]]:
        """The partitions ``spu_id`` is a replica of, as the local store has them now (read it
        before the next await)."""
        table = self.local_store["partitions"]
        cached = self._replicas_by_spu
        if cached is None or cached[0] != table.epoch:
            by_spu: dict[int, list[local.Entry[models.Partition]]] = {}
            for entry in table.view.values():
                for replica in entry.obj.spec.replicas:
                    found = by_spu.get(replica)
                    if found is None:
                        by_spu[replica] = [entry]
                    else:
                        found.append(entry)
            cached = self._replicas_by_spu = (table.epoch, by_spu)
        return cached[1].get(spu_id, [])

    def _registered(self, spu_id: int) -> local.Entry[models.Spu] | None:
        """The SPU that holds ``spu_id``: of SPUs sharing it (written behind the SC's back), the
        one placement uses too (store/spu_index.py)."""
        return spu_index.holder(self.local_store["spus"].view, self.local_store.meta.values.get, spu_id)

    def _holders(self) -> dict[int, local.Entry[models.Spu]]:
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

    def _token_refusal(self, register: wire.Register) -> tuple[str, str] | None:
        """(code, reason) when an SPU token is configured and the Register does not present it.
        Checked before anything about the id is looked up, and before a standby answers: a
        client without it gets the same answer whatever the id and whatever this SC's role, so
        it can neither map the registered ids nor find the leader."""
        if self.tokens is None:
            return None
        presented = hashlib.sha256((register.token or "").encode()).digest()
        # Compared with every token, the first match no reason to stop: how long the check takes
        # tells nothing of which token matched.
        matched = False
        for digest in self._token_digests:
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            return "unauthorized", f"SPU id {register.spu_id} presented a missing or wrong token"
        return None

    def _refusal(self, register: wire.Register) -> tuple[str, str] | None:
        """(code, reason) when the Register of a client that passed _token_refusal is refused: an
        id no SPU holds, or a healthy session of the same id, which is never evicted by a client
        that could not prove it is that SPU (without a token nobody can: the newcomer waits until
        the session goes silent or closes)."""
        spu_id = register.spu_id
        if self._registered(spu_id) is None:
            return "unregistered", (
                f"SPU id {spu_id} is not registered with this SC; register it first "
                "(`sc spu register` or an SPU group)"
            )
        current = self.sessions.get(spu_id)
        proven = self.tokens is not None or self.certificate_identity
        if not proven and current is not None and current.healthy(asyncio.get_running_loop().time(), self.heartbeat_timeout):
            return "already-connected", (
                f"SPU {spu_id} is connected and healthy on another connection; a new connection may take over "
                f"only once that one has been silent for {self.heartbeat_timeout:g} s (or with the SPU token, "
                "when one is configured)"
            )
        return None

    async def _read_frames(self, session: Session) -> None:
        """Take frames in as they come, each one whole before the next (none supersedes another:
        proposals, confirmations and offset deltas all count). Taking a frame in never waits on
        anything, so a slow SPU only slows its own connection."""
        websocket = session.websocket
        loop = asyncio.get_running_loop()
        held: wire.Offsets | None = None  # an Offsets frame that came before its time
        await asyncio.sleep(self._frames_wait(session.spu_id))  # its `hosted` frame's bytes
        while session.closing is None:
            if held is not None and loop.time() >= self._offsets_due(session):
                self._take_offsets_at_its_time(session, held)
                held = None
                await asyncio.sleep(0)
                continue
            # Until the heartbeat timeout since its last frame, or the held frame's time.
            silence_ends = session.last_frame_at + self.heartbeat_timeout
            wait = silence_ends - loop.time() if held is None else min(silence_ends, self._offsets_due(session)) - loop.time()
            try:
                try:
                    # Never 0: aiohttp takes a timeout of 0 for none at all (a silent SPU kept forever).
                    message = await websocket.receive(timeout=max(wait, 0.001))
                except asyncio.TimeoutError:
                    if held is not None and loop.time() < silence_ends:
                        continue  # the held frame's time came
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
            session.last_frame_at = loop.time()
            if self.sessions.get(session.spu_id) is not session:
                return  # replaced: what it says is not its SPU's current word
            try:
                parsed = self._read_frame(session, message.data)
                self._spend(session.spu_id, len(message.data))
                if isinstance(parsed, wire.Offsets) and loop.time() < self._offsets_due(session):
                    # Sooner than the protocol allows. Held, and the SPU read on (its heartbeats,
                    # confirmations, proposals, and the WebSocket pings that are answered only
                    # as it is read); a second one before the first's time is a flood: reading
                    # stops until then, its frames waiting in its own socket.
                    self.stats.offsets_paced += 1
                    if held is not None:
                        await asyncio.sleep(max(0.0, self._offsets_due(session) - loop.time()))
                        if session.closing is not None or self.sessions.get(session.spu_id) is not session:
                            return
                        self._take_offsets_at_its_time(session, held)
                    held = parsed
                elif isinstance(parsed, wire.Offsets):
                    self._take_offsets_at_its_time(session, parsed)
                elif parsed is not None:
                    self._take(session, parsed)
            except Exception as error:
                # A bug here must not leave the SPU connected but unheard: drop it (it reconnects
                # and gets a fresh Sync).
                log.error("SPU frame handling failed", spu=session.spu_id, error=repr(error))
                session.close("internal-error", f"the SC failed to take a frame of SPU {session.spu_id} in: {error!r}")
                return
            # One frame at a time per SPU, then let everybody else run: fifty SPUs reporting
            # never starve the controllers, the API or the heartbeats. Longer for an SPU whose
            # frames came over their bytes' rate.
            await asyncio.sleep(self._frames_wait(session.spu_id))

    def _spend(self, spu_id: int, size: int) -> None:
        """Count a frame of ``size`` bytes against its SPU's rate (the generic cell rate algorithm,
        as for offsets: the time its bytes so far are paid for moves on by this frame's share)."""
        now = asyncio.get_running_loop().time()
        due = self._frame_bytes_due.get(spu_id, now)
        self._frame_bytes_due[spu_id] = max(due, now) + size / self.frame_bytes_per_second

    def _frames_wait(self, spu_id: int) -> float:
        """Seconds before the SPU's next frame is read: 0 within the burst, else until it is back
        within (capped well within the heartbeat timeout; the next frame's wait takes the rest)."""
        ahead = self._frame_bytes_due.get(spu_id, 0.0) - asyncio.get_running_loop().time()
        over = ahead - self.frame_bytes_burst / self.frame_bytes_per_second
        if over <= 0:
            return 0.0
        self.stats.frames_paced += 1
        return min(over, self.heartbeat_timeout / 2)

    def offsets_interval_now(self) -> float:
        """The offsets interval for an SPU connecting now: the setting, or longer, so that all SPUs
        together send at most offsets_entries_per_second entries (one per partition led)."""
        partitions = len(self.local_store["partitions"].view)
        return min(MAX_OFFSETS_INTERVAL, max(self.offsets_interval, partitions / self.offsets_entries_per_second))

    def _offsets_pace(self, session: Session) -> float:
        """Seconds per Offsets frame the protocol allows an SPU: its offsets interval, less some jitter;
        capped well within the heartbeat timeout (any frame read counts as the SPU's sign of life)."""
        return min(session.offsets_interval * OFFSETS_JITTER, self.heartbeat_timeout / 2)

    def _offsets_due(self, session: Session) -> float:
        """When an SPU's next Offsets frame may be taken in: one per pace, and a burst of
        OFFSETS_BURST_SECONDS' worth (at least one frame) when the SPU sent fewer before (what queued
        while the SC was busy). One sooner is held until then: flooding costs the SC what the SPU may
        send anyway, not its core (its claim on the store lapsed under 50 flooding SPUs).

        A virtual schedule (the generic cell rate algorithm): each frame taken moves the time its
        frames would have caught up one pace later; a frame is on time while that time is at most a
        burst ahead of now."""
        pace = self._offsets_pace(session)
        burst = max(1, int(OFFSETS_BURST_SECONDS / pace)) if pace > 0 else 1
        return session.offsets_caught_up_at - (burst - 1) * pace

    def _take_offsets_at_its_time(self, session: Session, message: wire.Offsets) -> None:
        now = asyncio.get_running_loop().time()
        session.offsets_caught_up_at = max(session.offsets_caught_up_at, now) + self._offsets_pace(session)
        self._take(session, message)

    def _take_frame(self, session: Session, frame: bytes | str) -> str:
        """Take one frame in; its type, refused or not (``unreadable`` if it has none)."""
        parsed = self._read_frame(session, frame)
        if parsed is None:
            return "unreadable"
        self._take(session, parsed)
        return parsed.type

    def _read_frame(self, session: Session, frame: bytes | str) -> wire.SpuMessages | None:
        """The frame's message, counted; None if it is unreadable (the SPU is told why)."""
        try:
            parsed = wire.parse_spu_message(frame, self.max_frame_bytes)
        except wire.FrameError as error:
            self._frame_refused(session, error)
            return None
        self.stats.count(self.stats.frames, parsed.type)
        return parsed

    def _take(self, session: Session, parsed: wire.SpuMessages) -> None:
        """Take one message in (a refused one is answered, and changes nothing)."""
        try:
            if isinstance(parsed, wire.Heartbeat):
                return
            if isinstance(parsed, wire.Offsets):
                self._take_offsets(session, parsed)
            elif isinstance(parsed, wire.Leading):
                self._take_leading(session, parsed)
            elif isinstance(parsed, wire.AlterIsr):
                self._take_proposal(session, parsed)
            elif isinstance(parsed, wire.Register):
                raise wire.FrameError("already-registered", f"SPU {session.spu_id} is already registered")
            else:
                raise wire.FrameError("already-hosted", f"SPU {session.spu_id} said what it holds already, on this connection")
        except wire.FrameError as error:
            self._frame_refused(session, error)

    def _frame_refused(self, session: Session, error: wire.FrameError) -> None:
        self.stats.count(self.stats.frame_errors, error.code)
        # The message may quote the SPU's bytes (a field name, a type tag) at any length, and
        # the SPU may send it again at will: an excerpt, logged once per kind an interval.
        detail = ratelimit.clipped(str(error), FRAME_ERROR_CHARS)
        self.log.warning(f"spu:frame:{error.code}", "frame refused", spu=session.spu_id, code=error.code, error=detail)
        session.send(wire.Error(code=error.code, message=detail))

    def _told(self, session: Session, name: str) -> wire.ReplicaInfo:
        told = session.hosted.get(name)
        if told is None:
            raise wire.FrameError("not-hosted", f"SPU {session.spu_id} sent partition {name!r}, which it does not host")
        return told

    def _take_offsets(self, session: Session, message: wire.Offsets) -> None:
        """Check the whole frame first, so a bad entry changes nothing at all. An entry from a
        leader at an epoch that is not the one it was told (a race with a leader change) is
        dropped and counted: only the current leader's offsets are shown. So is one about another
        partition of the name than the current one (its uid, named or told): sent
        about a partition deleted (and maybe created again) before the SPU read the news."""
        accepted = []
        spu_id, told_by_name = session.spu_id, session.hosted
        partitions = self.local_store["partitions"].view
        stale = 0
        for entry in message.partitions:
            told = told_by_name.get(entry["partition"])
            if told is None:
                raise wire.FrameError(
                    "not-hosted", f"SPU {spu_id} reported partition {entry['partition']!r}, which it does not host"
                )
            if entry["hw"] > entry["leo"]:
                # A replica's HW never passes its log end. The highest HW reported counts as
                # committed for good (it is stored, and a restarted replica must hold that much
                # to lead): one above every log would leave the partition leaderless.
                raise wire.FrameError(
                    "invalid",
                    f"SPU {spu_id} reported hw {entry['hw']} above its log end (leo {entry['leo']}) "
                    f"for partition {entry['partition']!r}",
                )
            followers = entry.get("followers")
            if followers:
                replicas = told.replicas
                seen: set[int] = set()
                for follower in followers:
                    if follower["spu"] not in replicas or follower["spu"] == spu_id:
                        strangers = [f["spu"] for f in followers if f["spu"] not in replicas] or [spu_id]
                        raise wire.FrameError(
                            "not-a-replica",
                            f"SPU {spu_id} reported followers {strangers} for partition "
                            f"{entry['partition']!r}, whose replicas are {replicas}",
                        )
                    if follower["spu"] in seen:
                        # Each entry would be kept (live status) until the partition's next report.
                        raise wire.FrameError(
                            "invalid",
                            f"SPU {spu_id} reported follower SPU {follower['spu']} of partition "
                            f"{entry['partition']!r} more than once",
                        )
                    if follower["hw"] > follower["leo"]:
                        # Nor does a follower's: what the SC shows and stores of it would be false.
                        raise wire.FrameError(
                            "invalid",
                            f"SPU {spu_id} reported hw {follower['hw']} above the log end (leo {follower['leo']}) "
                            f"of follower SPU {follower['spu']} for partition {entry['partition']!r}",
                        )
                    seen.add(follower["spu"])
            if told.leader == spu_id and told.leader_epoch == entry["leader_epoch"]:
                # Of the partition it was told, and that partition is still the current one.
                current = partitions.get(entry["partition"])
                if current is not None and _is_current(current.obj, entry.get("uid", told.uid)):
                    accepted.append((entry, current.obj.uid))
                    continue
            stale += 1
        self.stats.stale_entries += stale
        now = asyncio.get_running_loop().time()
        merge, identities = self.live.merge, self.identities
        for entry, identity in accepted:
            merge(spu_id, entry, now)
            if identity is not None:
                identities[entry["partition"]] = identity

    def _take_leading(self, session: Session, message: wire.Leading) -> None:
        """Leadership confirmations: accepted from the leader it was told, at the epoch it was
        told, about the partition of that name in the store now (its uid, named or
        told: one about a partition deleted since is refused STALE_PARTITION, and confirms no new
        one of the name); any other is stale and the SPU is told the committed epoch (it stops
        leading). The first STALE_ANSWERS_PER_FRAME refusals go one by one, the rest of the
        frame's in one `error` naming how many (each one's committed state is in the Sync and
        Updates sent before it on this connection: what the SC compares with is what it told). An
        entry for a partition it does not host refuses the whole frame, before anything is taken."""
        told_of = [(entry, self._told(session, entry["partition"])) for entry in message.partitions]
        partitions = self.local_store["partitions"].view
        news = set()
        stale = 0
        first_of_the_rest = ""
        for entry, told in told_of:
            name, epoch = entry["partition"], entry["leader_epoch"]
            current = partitions.get(name)
            identity = entry.get("uid", told.uid)
            if current is None or not _is_current(current.obj, identity):
                code = STALE_PARTITION
            elif told.leader != session.spu_id or told.leader_epoch != epoch:
                code = _stale_code(told, session.spu_id)
            else:
                self._keep_identity(current.obj)
                code = ""
            if code:
                stale += 1
                if stale > STALE_ANSWERS_PER_FRAME + 1:
                    continue  # counted, and answered together (nothing more is built for it)
                if code == STALE_PARTITION:
                    refusal = wire.Error(code=code, message=_another_partition(session.spu_id, name, identity, current), partition=name)
                else:
                    refusal = wire.Error(
                        code=code, message=_not_leading(session.spu_id, name, epoch, told), partition=name, leader_epoch=told.leader_epoch
                    )
                if stale <= STALE_ANSWERS_PER_FRAME:
                    session.send(refusal)
                else:
                    first_of_the_rest = refusal.message
                continue
            log.debug("leadership confirmed", spu=session.spu_id, partition=name, leader_epoch=epoch, incarnation=session.number)
            if self.confirmed.get(name) != (session.spu_id, epoch):
                self.confirmed[name] = (session.spu_id, epoch)
                news.add(name)
        self.stats.stale_entries += stale
        if stale > STALE_ANSWERS_PER_FRAME:
            session.send(
                wire.Error(
                    code=STALE_LEADERSHIPS,
                    message=(
                        f"SPU {session.spu_id} does not lead {stale - STALE_ANSWERS_PER_FRAME} more partitions of this "
                        f"frame at the leader epochs it named, or of the partitions it named (the first: "
                        f"{ratelimit.clipped(first_of_the_rest, FRAME_ERROR_CHARS)}); the sync and updates this SC sent "
                        "before this error say each one's committed leader and epoch, and which partition of the name it is"
                    ),
                )
            )
        if news:
            self.on_news(news)

    def _take_proposal(self, session: Session, message: wire.AlterIsr) -> None:
        """Held for the partition controller, which decides it against the committed state and
        answers (through ``answer``); a newer proposal of the same leader replaces it. One of an
        SPU that was not told it leads the partition at that leader epoch is refused at once: only
        a leader proposes, and another SPU's proposal must not take its leader's place (which
        would then never be answered, and a leader waits for its answer before it proposes again).
        So is one about another partition of the name than the current one (STALE_PARTITION)."""
        told = self._told(session, message.partition)
        self.stats.proposals += 1
        current = self.local_store["partitions"].view.get(message.partition)
        identity = told.uid if message.uid is None else message.uid
        if current is None or not _is_current(current.obj, identity):
            error, why = STALE_PARTITION, _another_partition(session.spu_id, message.partition, identity, current)
        elif told.leader != session.spu_id or told.leader_epoch != message.leader_epoch:
            error, why = _stale_code(told, session.spu_id), (
                f"SPU {session.spu_id} does not lead partition {message.partition!r} at leader epoch "
                f"{message.leader_epoch}: the committed leader is {told.leader} at leader epoch {told.leader_epoch}"
            )
        else:
            self._keep_identity(current.obj)
            # Its HW counts as committed only with its set (rule 4 may refuse it): the write that
            # commits the set carries it, and ``answer`` takes it in.
            self.proposals[message.partition] = reports.Proposal(
                message.partition, session.spu_id, session.number, message.leader_epoch, message.partition_epoch, tuple(message.isr),
                tuple((entry["spu"], entry["incarnation"]) for entry in message.incarnations), message.hw,
            )
            self.on_news({message.partition})
            return
        self.stats.stale_entries += 1
        session.send(
            wire.AlterIsrResult(
                partition=message.partition,
                error=error,
                message=why,
                leader_epoch=told.leader_epoch,
                partition_epoch=told.partition_epoch,
                isr=list(told.isr),
            )
        )

    def answer(self, proposal: reports.Proposal, message: wire.AlterIsrResult) -> None:
        """Send the answer to ``proposal``'s connection, if it is still its SPU's current one, and
        forget the proposal (unless a newer one replaced it). A committed proposal's HW counts as an
        Offsets entry's of its leader (its set may have been the committed one already: no write
        carried it)."""
        name = message.partition
        if message.error is None and proposal.hw is not None:
            self.live.committed(name, proposal.hw)
        if self.proposals.get(name) == proposal:
            del self.proposals[name]
        session = self.sessions.get(proposal.spu)
        if session is not None and session.number == proposal.incarnation and session.closing is None:
            session.send(message)

    # ------------------------------------------------------------------ pushing specs

    def _send_sync(self, session: Session, lost: dict[str, Lost] | None = None) -> None:
        """Tell ``session``'s SPU everything it hosts. ``lost``: given when the pusher starts again,
        where what it was told before is compared with the store as it is now: a uid written over
        meanwhile makes the SPU drop its log, which the committed state may count on."""
        spus = [_spu_info(entry.obj) for entry in self._holders().values()]
        before = session.hosted
        if lost is not None and before:
            partitions = self.local_store["partitions"].view
            for name, replica in list(before.items()):
                current = partitions.get(name)
                if current is not None and _uid_replaced(session, replica, current.obj):
                    _replica_gone(session, name, partitions, [], lost, in_place=True)
        incarnation = session.incarnation
        hosted = {entry.name: _replica_info(entry, incarnation) for entry in self.replicas_of(session.spu_id)}
        # Told none, the SPU keeps the log it holds: of the uid it was told before, or kept (or
        # named when it connected). Only for the partitions it still hosts.
        kept: dict[str, int] = {}
        for name, info in hosted.items():
            if info.uid is None:
                previous = before.get(name)
                held = session.kept_uids.get(name) if previous is None or previous.uid is None else previous.uid
                if held is not None:
                    kept[name] = held
        session.kept_uids = kept
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
        lost: dict[str, Lost] = {}
        for session in list(self.sessions.values()):
            if session.closing is None and session.ready:
                self._send_sync(session, lost)
        if lost:
            self._report_lost(lost)
        self.pushed_epoch = self.local_store["partitions"].epoch
        self._pushing = True
        try:
            while True:
                waiters = [asyncio.ensure_future(spu_listener.wait()), asyncio.ensure_future(partition_listener.wait())]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                    await asyncio.gather(*waiters, return_exceptions=True)
                # What else the same burst changes goes in the same Update (PUSH_LINGER).
                await asyncio.sleep(self.push_linger)
                self.push(spu_listener.changes(), partition_listener.changes())
        finally:
            self._pushing = False
            spu_listener.close()
            partition_listener.close()

    def forget_partition(self, name: str) -> None:
        """A deleted partition (maybe created again since, a new one): its leader's confirmation,
        offsets and held proposal go. The partition controller calls it too, when a pass sees the
        change before the pusher does, so the new partition is never decided on the old one's."""
        self.live.forget(name)
        self.confirmed.pop(name, None)
        self.proposals.pop(name, None)
        self.identities.pop(name, None)

    def forget_deleted(self, name: str, partitions: Mapping[str, local.Entry[models.Partition]]) -> None:
        """A pass read ``name`` deleted (maybe created again since: ``partitions`` holds the current
        ones): forget what this SC keeps of it, unless that is about the current partition of the
        name, by its uid. The pusher may have told the SPUs the new one, and its leader confirmed
        it, before the pass read the delete: a leader confirms a leadership once."""
        kept = self.identities.get(name)
        if kept is None or kept != _current_uid(partitions, name):
            self.forget_partition(name)

    def forget_recreated(self, partitions: Mapping[str, local.Entry[models.Partition]]) -> None:
        """Forget what this SC keeps of partitions that ``partitions`` (the current ones) no longer
        hold under the uid it was kept for: deleted, or created again. A full listing (a relist of
        the store) names nothing deleted; the pusher and the partition controller call this after
        one, each before it acts on the listing."""
        for name in [name for name, identity in self.identities.items() if _current_uid(partitions, name) != identity]:
            self.forget_partition(name)

    def _keep_identity(self, partition: models.Partition) -> None:
        """What this SC keeps of ``partition`` from now on is about that one (if it has an identity)."""
        if partition.uid is not None:
            self.identities[partition.name] = partition.uid

    def pushed_through(self, epoch: int) -> bool:
        """Whether every connected SPU was told the partitions as of the partitions table's
        ``epoch`` (True when no pusher runs: nobody is waiting to be told)."""
        return not self._pushing or self.pushed_epoch >= epoch

    def push(self, spu_changes: local.Changes[models.Spu], partition_changes: local.Changes[models.Partition]) -> None:
        """Tell each connected SPU what changed for it (one Update per SPU, only if non-empty)."""
        epoch = self.local_store.revision
        partitions_table = self.local_store["partitions"]
        partitions = partitions_table.view
        held = self._holders()
        concerned = Concerned(partition_changes)
        # A partition's replicas are told the same state: built once per push, not per SPU.
        built: BuiltStates = {}
        lost: dict[str, Lost] = {}
        interval = self.offsets_interval_now()
        for session in list(self.sessions.values()):
            holder = held.get(session.spu_id)
            if holder is None:
                session.close("unregistered", f"SPU {session.spu_id} was unregistered")
                continue
            if holder.name != session.name or holder.create_revision != session.registered_at:
                # Deleted and registered again (or taken by another object sharing the id) since
                # this connection was accepted: a new SPU, which starts from nothing.
                session.close(
                    "unregistered",
                    f"SPU {session.spu_id} ({session.name}) was unregistered, and the id registered again as {holder.name}",
                )
                continue
            if not session.ready:
                continue  # its Sync, once it said what it holds, will have everything
            changed_spus, deleted_spus = _spu_delta(session, spu_changes, held)
            changed, deleted = _replica_delta(session, partition_changes, partitions, concerned, built, lost)
            # A new interval only when it moved by a quarter: not an Update per partition created.
            new_interval = interval if abs(interval - session.offsets_interval) > session.offsets_interval / 4 else None
            if changed_spus or deleted_spus or changed or deleted or new_interval is not None:
                self.stats.updates_sent += 1
                if new_interval is not None:
                    session.offsets_interval = new_interval
                session.send(
                    wire.Update(
                        epoch=epoch,
                        spus=changed_spus,
                        deleted_spus=deleted_spus,
                        replicas=changed,
                        deleted_replicas=deleted,
                        offsets_interval=new_interval,
                    )
                )
        if spu_changes.full or spu_changes.deleted:
            for spu_id in self.health.known():
                if spu_id not in held and spu_id not in self.sessions:
                    self.health.forget(spu_id)
        if partition_changes.full:
            # A full listing names nothing deleted (a relist, or more deletions than the mirror
            # keeps tombstones for): whatever the current partitions do not hold is forgotten,
            # and so is what was kept of a partition of a name created again since.
            self.forget_recreated(partitions)
            self.live.keep_only(partitions)
            for name in [name for name in self.confirmed if name not in partitions]:
                del self.confirmed[name]
        for name in partition_changes.deleted:
            self.forget_partition(name)
        if lost:
            self._report_lost(lost)
        self.pushed_epoch = partitions_table.epoch
        self.on_pushed()

    def _report_lost(self, lost: dict[str, Lost]) -> None:
        """Partitions whose SPUs were just told to drop the log their committed state counts on:
        said once each (nothing of the SC's own does this: an operator's hand did), and decided
        again by the partition controller, now that those SPUs hold none of their records."""
        for name, noted in lost.items():
            if noted.in_place:
                cause = f"its uid was written over in place, from {noted.before} to {noted.now} (the SC never changes one)"
            else:
                cause = "it was deleted and written back with its committed state"
            log.error(
                f"partition {name!r} is another partition to its SPUs: {cause}; SPUs {sorted(noted.spus)}, which its "
                "committed state counts on, drop their log of it and are taken for replicas that lost its records (it "
                "may be left with no leader: only an unclean election then gives it one)",
                partition=name,
            )
        self.on_news(set(lost))


def _worth_holding(standby: tuple[str, str | None], register: wire.Register) -> bool:
    """Whether a standby's refusal is better held than sent: it names no leader (a takeover under
    way), or names the one this SPU says it cannot reach."""
    leader = standby[1]
    return leader is None or leader == register.unreachable_leader


def _not_leading(spu_id: int, name: str, epoch: int, told: wire.ReplicaInfo) -> str:
    return (
        f"SPU {spu_id} does not lead partition {name!r} at leader epoch {epoch}: "
        f"the committed leader is {told.leader} at leader epoch {told.leader_epoch}"
    )


def _current_uid(partitions: Mapping[str, local.Entry[models.Partition]], name: str) -> int | None:
    """The uid of the partition of that name now (None: there is none, or it has no uid)."""
    current = partitions.get(name)
    return None if current is None else current.obj.uid


def _is_current(current: models.Partition, named: int | None) -> bool:
    """Whether what names partition uid ``named`` (or was told it) is about ``current``, the
    partition of that name now: it has that uid, or none (created before partitions had one:
    there is no identity to check, and what names its name is taken as about it, as before)."""
    uid = current.uid
    return uid is None or uid == named


def _recreated(session: Session, told: wire.ReplicaInfo, partitions: Mapping[str, local.Entry[models.Partition]]) -> bool:
    """The partition ``told`` describes (the one of the log ``session``'s SPU holds) is not the
    current one of its name (deleted, maybe created again). One without a uid now is taken for
    the one held, as when it is told none."""
    current = partitions.get(told.partition)
    if current is None:
        return True
    uid = current.obj.uid
    return uid is not None and uid != _held_uid(session, told)


def _another_partition(spu_id: int, name: str, named: int | None, current: local.Entry[models.Partition] | None) -> str:
    now = "; there is none of that name now" if current is None else f"; the current one has uid {current.obj.uid}"
    return f"SPU {spu_id} named partition {name!r} of uid {named}: that partition was deleted{now}"


def _stale_code(told: wire.ReplicaInfo, spu_id: int) -> str:
    """The error code for a confirmation that does not match what the SPU was told."""
    return "stale-epoch" if told.leader == spu_id else "not-leader"


def _spu_delta(
    session: Session, changes: local.Changes[models.Spu], held: dict[int, local.Entry[models.Spu]]
) -> tuple[list[wire.SpuInfo], list[int]]:
    """What ``session`` was told of the ids ``changes`` touch and what their holders (``held``)
    are now: the ids of the SPUs changed, and the ids told under the name of an SPU changed or
    deleted (an SPU that moved off an id, or gave it up to another SPU sharing it)."""
    if changes.empty:
        return [], []
    if changes.full:
        ids = set(held) | set(session.told_spus)
    else:
        ids = {entry.obj.spec.id for entry in changes.updated}
        names = {entry.name for entry in changes.updated} | set(changes.deleted)
        ids.update(spu_id for spu_id, info in session.told_spus.items() if info.name in names)
    changed, deleted = [], []
    for spu_id in sorted(ids):
        holder = held.get(spu_id)
        if holder is None:
            if session.told_spus.pop(spu_id, None) is not None:
                deleted.append(spu_id)
            continue
        info = _spu_info(holder.obj)
        if session.told_spus.get(spu_id) != info:
            session.told_spus[spu_id] = info
            changed.append(info)
    return changed, deleted


# The states built in one push, by partition name and the leader told: each partition's replicas
# share one (the messages are frozen).
BuiltStates = dict[tuple[str, int | None], wire.ReplicaInfo]


class Concerned:
    """Which of a delta's changed partitions concern which SPU, found once per push: an SPU is
    concerned by the partitions it is a replica of, and by those it was told of before (it may
    have left them). A failover changes thousands of partitions, each of them concerning a few SPUs:
    each session then reads its own few instead of every change."""

    def __init__(self, changes: local.Changes[models.Partition]) -> None:
        self.updated = [] if changes.full else changes.updated
        self.position = {entry.name: index for index, entry in enumerate(self.updated)}
        self.by_spu: dict[int, list[int]] = {}
        for index, entry in enumerate(self.updated):
            for spu_id in entry.obj.spec.replicas:
                indexes = self.by_spu.setdefault(spu_id, [])
                if not indexes or indexes[-1] != index:  # in order, each once
                    indexes.append(index)

    def of(self, session: Session) -> list[local.Entry[models.Partition]]:
        """The changed partitions ``session`` may need to hear of, in the order they changed."""
        position, updated = self.position, self.updated
        indexes = self.by_spu.get(session.spu_id)
        restarted = session.incarnation.restarted
        changed = position.keys()  # a view, so isdisjoint walks the smaller side (a failover's push is large)
        if session.hosted.keys().isdisjoint(changed) and (not restarted or restarted.keys().isdisjoint(changed)):
            # The common case: none of these was told to it before, so its own replicas are all
            # (most SPUs of a large cluster are not even those, and cost two lookups).
            return [] if indexes is None else [updated[index] for index in indexes]
        found = set(indexes or ())
        found.update(position[name] for name in session.hosted.keys() & changed)
        if restarted:
            found.update(position[name] for name in restarted.keys() & changed)
        return [updated[index] for index in sorted(found)]


def _replica_delta(
    session: Session,
    changes: local.Changes[models.Partition],
    partitions: Mapping[str, local.Entry[models.Partition]],
    concerned: Concerned | None = None,
    built: BuiltStates | None = None,
    lost: dict[str, Lost] | None = None,
) -> tuple[list[wire.ReplicaInfo], list[str]]:
    """What ``session`` is told of ``changes``: the partitions it hosts whose state it was not
    told yet, and those it no longer hosts. ``concerned``: the changes sorted by SPU (else every
    change is looked at); ``built``: the states built for the other SPUs of this push, to share;
    ``lost``: where the partitions whose committed state counts on a log the SPU drops are noted."""
    if changes.empty:
        return [], []
    if changes.full:
        entries: Iterable[local.Entry[models.Partition]] = partitions.values()
    else:
        entries = (concerned or Concerned(changes)).of(session)
    changed: list[wire.ReplicaInfo] = []
    deleted: list[str] = []
    # Deletions first: a partition also changed was deleted and created again, and the SPU is told
    # both in one Update (it applies the deletions first): the new one starts from nothing there.
    # A full set names only those a relist found under a new create revision of their key; what
    # else is gone it leaves out, and a partition the SPU was told of under another uid than the
    # current one's was deleted too (and created again).
    for name in changes.deleted:
        _replica_gone(session, name, partitions, deleted, lost, in_place=False)
    if changes.full:
        rewritten = [name for name, told in session.hosted.items() if _recreated(session, told, partitions)]
    else:
        # A uid written over in place (the SC never changes one: a hand edit) is another partition
        # to the SPU too, which drops its log: it is told so as of one deleted and created again.
        entries = list(entries)
        rewritten = [entry.name for entry in entries if _uid_replaced(session, session.hosted.get(entry.name), entry.obj)]
    for name in rewritten:
        _replica_gone(session, name, partitions, deleted, lost, in_place=True)
    restarted = session.incarnation.restarted
    for entry in entries:
        partition: models.Partition = entry.obj
        name = partition.name
        if restarted and name in restarted and restarted[name] != partition.status.partition_epoch:
            del restarted[name]  # decided again since: the fact is spent
        told = session.hosted.get(name)
        if session.spu_id in partition.spec.replicas:
            info = _replica_info(entry, session.incarnation, built)
            if told != info:
                if info.uid is None:
                    if told is not None and told.uid is not None:
                        session.kept_uids[name] = told.uid  # told none, it keeps the log it holds
                elif session.kept_uids:
                    session.kept_uids.pop(name, None)
                session.hosted[name] = info
                changed.append(info)
        elif told is not None:
            del session.hosted[name]
            if session.kept_uids:
                session.kept_uids.pop(name, None)
            deleted.append(name)
    return changed, deleted


@dataclass
class Lost:
    """A partition told to SPUs as another one than the log they held (deleted and written back
    with its committed state, or its uid written over in place) while that state counts on them."""

    before: int | None  # the uid they were told before (None: none)
    now: int | None  # the partition's uid now
    in_place: bool  # its key was not deleted: its uid was written over
    spus: list[int] = field(default_factory=list)


def _held_uid(session: Session, told: wire.ReplicaInfo) -> int | None:
    """The uid of the log ``session``'s SPU holds of the partition ``told`` describes (None: none)."""
    return told.uid if told.uid is not None else session.kept_uids.get(told.partition)


def _uid_replaced(session: Session, told: wire.ReplicaInfo | None, partition: models.Partition) -> bool:
    """The SPU was told ``partition``'s name under another uid than the one it has now (or told
    none since, keeping the log of the one it held), though its key was not deleted: the uid was
    written over in place."""
    if told is None or partition.uid is None:
        return False
    held = _held_uid(session, told)
    return held is not None and held != partition.uid


def _replica_gone(
    session: Session,
    name: str,
    partitions: Mapping[str, local.Entry[models.Partition]],
    deleted: list[str],
    lost: dict[str, Lost] | None,
    in_place: bool,
) -> None:
    """``session``'s SPU is told its replica of ``name`` is gone (a partition of the name told
    later is a new one, which it starts empty): its process holds nothing of the partition of that
    name now. A new partition counts on no record yet (partition epoch 0), but one that comes back
    with a committed state (deleted and written back as it was, or its uid written over in place)
    does: where that state gives the SPU a role, the SPU is taken for a process that restarted
    without the records (the rules then take it out of the in-sync set, or leave the partition
    without a leader), not for a member that holds them, as before, when it was merely forgotten."""
    told = session.hosted.pop(name, None)
    kept = session.kept_uids.pop(name, None)
    if told is not None:
        deleted.append(name)
    incarnation = session.incarnation
    incarnation.forget(name)
    current = partitions.get(name)
    if current is None:
        return
    partition = current.obj
    epoch = partition.status.partition_epoch
    if epoch > 0 and session.spu_id in partition.spec.replicas and reports.has_role(partition, session.spu_id):
        incarnation.restarted[name] = epoch
        if lost is not None:
            before = kept if told is None or told.uid is None else told.uid
            noted = lost.setdefault(name, Lost(before, partition.uid, in_place))
            noted.spus.append(session.spu_id)


def _spu_info(spu: models.Spu) -> wire.SpuInfo:
    spec = spu.spec
    return wire.SpuInfo(
        id=spec.id,
        name=spu.name,
        rack=spec.rack,
        public_endpoint=wire.Endpoint(host=spec.public_endpoint.host, port=spec.public_endpoint.port),
        private_endpoint=wire.Endpoint(host=spec.private_endpoint.host, port=spec.private_endpoint.port),
    )


def _replica_info(
    entry: local.Entry[models.Partition],
    incarnation: reports.Incarnation,
    built: BuiltStates | None = None,
) -> wire.ReplicaInfo:
    """What an SPU is told of a partition it hosts: which one (its uid, if it has one), and the
    committed state. A leadership its current process was not told of when it connected is
    withheld (no leader) until the SC decides the partition again, so a restarted process never
    leads at an epoch granted to its predecessor.

    ``built``: the states already built from this same ``entry`` (one push), by name and leader
    told; the messages are frozen, so the SPUs of a partition share one."""
    partition = entry.obj
    status = partition.status
    leader: int | None = partition.spec.leader
    if status.resolution is models.PartitionResolution.LEADER_OFFLINE:
        leader = None
    elif leader == incarnation.spu and incarnation.restarted_at(partition.name, status.partition_epoch):
        leader = None
    if built is not None:
        shared = built.get((partition.name, leader))
        if shared is None:
            shared = built[(partition.name, leader)] = _build_replica_info(partition, leader)
        return shared
    return _build_replica_info(partition, leader)


def _build_replica_info(partition: models.Partition, leader: int | None) -> wire.ReplicaInfo:
    status = partition.status
    return wire.ReplicaInfo(
        partition=partition.name,
        uid=partition.uid,
        leader=leader,
        leader_epoch=status.leader_epoch,
        partition_epoch=status.partition_epoch,
        isr=partition.in_sync(),
        replicas=list(partition.spec.replicas),
    )


async def _reject(websocket: web.WebSocketResponse, code: str, reason: str, leader: str | None = None) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await websocket.send_bytes(wire.encode(wire.Rejected(code=code, reason=reason, leader=leader)))
    await websocket.close(message=reason[:120].encode())
