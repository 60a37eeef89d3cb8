"""A simulated SPU's connection to the SC's private port (protocol v2): register, say what it holds,
apply Sync/Update, confirm leaderships and propose in-sync sets as they come, heartbeat, and send
the offsets that changed at most once per offsets interval.

Reconnects forever (capped exponential backoff with jitter) after a drop or a refusal, until cancelled.
Given several SC addresses (an SC and its standbys), it tries the next one at once when one cannot
be reached, and goes straight to the leader a standby names when it refuses (``not-leader``); the
backoff applies once every address failed in a row. When a named leader cannot be reached (it died,
its claim has not expired), the SPU says so in its next Register, and a standby holds it until it
leads itself (docs/replication.md, "Connecting").
While disconnected the SPU keeps its last picture and keeps replicating: the data plane does not need
the SC (but its leaders cannot change their in-sync sets, so they commit nothing a lost member misses).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Collection, Iterable, Sequence

import aiohttp
import structlog

from connection_manager import wire
from connection_manager.spu import (
    backoff as backoff_module,
    replica as replica_module,
    settings as settings_module,
    state as state_module,
)


NOT_LEADER = "not-leader"  # the refusal of a standby SC (connection_manager/server.py)
# How often an SPU waiting for the SC's answer to its ping looks whether it came. A look later than
# this by more than LOOP_HELD_SLACK means this SPU's own event loop was held (a long step, a busy
# host): the time it was held does not count against the SC, whose answer may be in the socket unread.
PING_LOOK_INTERVAL = 0.1
LOOP_HELD_SLACK = 0.1


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); ValueError naming the text otherwise."""
    host, separator, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    # ASCII digits, and few of them, before int(): "²".isdigit() is true, and int() refuses 4,301 digits.
    digits = port.isascii() and port.isdigit() and len(port) <= 5
    if not separator or not host or not digits or not 0 < int(port) < 65536:
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        raise ValueError(f"{shown!r} is not HOST:PORT (for example 127.0.0.1:9004)")
    return host, int(port)


class SessionError(Exception):
    """The SC broke the protocol on this connection; the session drops it and reconnects."""


class ScSession:
    def __init__(
        self,
        state: state_module.SpuState,
        sc_addresses: Sequence[tuple[str, int]],
        token: str | None,
        settings: settings_module.SpuSettings,
        on_change: Callable[[Collection[str] | None], None],
        tls: ssl.SSLContext | None = None,
        on_step: Callable[[], None] = lambda: None,
    ) -> None:
        self.state = state
        # The SCs of the store, in the order given: one of them leads.
        self.addresses = list(sc_addresses)
        if not self.addresses:
            raise ValueError("an SPU needs at least one SC address")
        self._current = 0
        self._failed_in_row = 0  # addresses that failed since one accepted or named the leader
        self._named: tuple[str, int] | None = None  # the leader a standby named: tried next
        self._named_as: str | None = None  # that leader as the standby wrote it (HOST:PORT)
        # The leader a standby named that this SPU then could not reach: said in Register, so a
        # standby that would name it again holds the registration instead (it may lead soon).
        self._unreachable: str | None = None
        self._held = False  # the last refusal came after the standby held the registration a while
        self._reached = False  # the current connection attempt reached its SC (the WebSocket opened)
        self._refused_here: wire.Rejected | None = None  # the refusal of the current connection attempt
        self._stayed = False  # the previous attempt asked the same standby again (see _stay)
        self._standby_seen = False  # a standby refused this SPU since one last accepted it
        # With ``tls`` (the SC's CA, and this SPU's client certificate under mutual TLS): wss.
        self.tls = tls
        self.token = token
        self.settings = settings
        # Called after each Sync (with None: anything may have changed) or Update (with the
        # partitions it named) is applied, and after a fence (with its partition).
        self.on_change = on_change
        self.on_step = on_step  # called after anything changed the state (it drains state.changes)
        self.connected = False  # accepted and synced on the current connection
        self._synced_here = False  # a Sync was applied on the current (or just ended) connection
        self.connections = 0  # connections the SC accepted since start
        self.incarnation: int | None = None  # the SC's number for the current connection
        self.offsets_interval = 1.0  # seconds between offsets frames: the SC says (Accepted, Update)
        self.last_rejection: wire.Rejected | None = None
        self._outbox: asyncio.Queue[bytes] | None = None
        # Leaderships said on this connection: partition -> leader epoch. A replica removed from
        # this SPU is forgotten, so a new partition of the name is confirmed at the same epoch.
        self._confirmed: dict[str, int] = {}
        self._heard_at = 0.0  # loop time of the last frame of any kind read from the SC
        self.log = structlog.get_logger(__name__).bind(spu=state.spu_id)

    @property
    def address(self) -> tuple[str, int]:
        """The SC this session connects to now (or last did)."""
        return self._named or self.addresses[self._current]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{'wss' if self.tls is not None else 'ws'}://{f'[{host}]' if ':' in host else host}:{port}{wire.SPU_PATH}"

    async def run(self) -> None:
        backoff = backoff_module.Backoff(self.settings.reconnect_initial, self.settings.reconnect_max)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.request_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                self._synced_here = False
                self._refused_here = None
                redirected = False
                try:
                    redirected = await self._serve_connection(http)
                except (aiohttp.ClientError, OSError, TimeoutError) as error:
                    if self._named is not None and not self._reached:
                        self._unreachable = self._named_as
                    # The first failure in a row is news; the retries of an SC that stays down are not.
                    log = self.log.info if backoff.attempt == 0 or self._synced_here else self.log.debug
                    log("sc connection failed; retrying with backoff", url=self.url, error=_describe(error))
                except (wire.FrameError, SessionError, state_module.SyncRequired) as error:
                    self.log.warning("sc broke the protocol; reconnecting for a fresh sync", url=self.url, error=str(error))
                finally:
                    self.connected = False
                    self._outbox = None
                if self._synced_here:
                    backoff.reset()
                if redirected:
                    continue  # straight to the leader the standby named
                if self._stay():
                    continue  # the standby that held it knows no leader yet: it is about to take over
                if not self._next_address():
                    continue  # another SC to try before waiting
                if self._standby_seen:
                    # SCs answer, and one will lead (an election, a takeover): no backing off,
                    # and no wait at all when a standby held this SPU's registration meanwhile.
                    self._standby_seen = False
                    backoff.reset()
                    if not self._held:
                        await asyncio.sleep(self.settings.leader_wait)
                    continue
                delay = backoff.next_delay()
                self.log.debug("sc reconnect scheduled", delay=round(delay, 3), attempt=backoff.attempt)
                await asyncio.sleep(delay)

    def _next_address(self) -> bool:
        """Move on to the next SC after this one failed or ended; True when every address failed in
        a row since one last accepted this SPU (then the backoff applies before trying again)."""
        if self._named is not None:
            self._named = self._named_as = None  # the named leader failed: back to the list, where it stood
        else:
            self._current = (self._current + 1) % len(self.addresses)
        if self._synced_here:
            self._failed_in_row = 0
            self._standby_seen = False
            return len(self.addresses) == 1
        self._failed_in_row += 1
        if self._failed_in_row >= len(self.addresses):
            self._failed_in_row = 0
            return True
        return False

    def _stay(self) -> bool:
        """A standby held this SPU's registration and still named no leader (its hold ended while
        it was about to lead, say): ask it again at once instead of going round the list, whose
        other SCs may be the dead leader. Once in a row, so that a standby that never learns of a
        leader does not keep the SPU from the others."""
        refusal = self._refused_here
        stay = (
            not self._stayed and self._held and refusal is not None
            and refusal.code == NOT_LEADER and refusal.leader is None and self._named is None
        )  # fmt: skip
        self._stayed = stay
        return stay

    def _follow(self, rejection: wire.Rejected) -> bool:
        """A standby refused this SPU: go to the leader it names (True), if it names a usable one."""
        if rejection.code != NOT_LEADER or rejection.leader is None:
            return False
        try:
            named = parse_address(rejection.leader)
        except ValueError:
            self.log.warning("a standby SC named a leader that is not HOST:PORT", leader=rejection.leader[:80])
            return False
        if named == self.address:
            return False  # named itself: no use going round
        self._named, self._named_as = named, rejection.leader
        self.log.info("sc is a standby; going to the leader it names", standby=self.url, leader=rejection.leader)
        return True

    # ------------------------------------------------------------------ sending

    def send(self, message: wire.Message) -> bool:
        """Queue ``message`` on the current connection once synced; False (dropped) otherwise:
        what it said is said again after the next Sync (leaderships, pending proposals, offsets)."""
        if self._outbox is None or not self.connected:
            return False
        self._outbox.put_nowait(wire.encode(message))
        return True

    def tell(self, changes: state_module.Changes) -> None:
        """What the SC must hear of ``changes``: new leaderships and new proposals."""
        for name in changes.removed:
            self._confirmed.pop(name, None)
        self._confirm(changes.leaderships.items())
        for name, proposal in changes.proposals:
            self.send(_alter_isr(name, proposal))

    def _confirm(self, leaderships: Iterable[tuple[str, int]]) -> None:
        """Say each leadership once per connection (and again for a partition of the same name
        assigned after the replica was removed: a new partition, which its leader must confirm)."""
        fresh = sorted(item for item in leaderships if self._confirmed.get(item[0]) != item[1])
        if fresh and self.send(wire.Leading(partitions=[self._leadership(name, epoch) for name, epoch in fresh])):
            self._confirmed.update(fresh)

    def _leadership(self, name: str, epoch: int) -> wire.Leadership:
        """A leadership naming its partition's uid when the SC told it."""
        leadership = wire.Leadership(partition=name, leader_epoch=epoch)
        replica = self.state.replicas.get(name)
        if replica is not None and replica.uid is not None:
            leadership["uid"] = replica.uid
        return leadership

    async def _write(self, ws: aiohttp.ClientWebSocketResponse, outbox: asyncio.Queue[bytes]) -> None:
        while True:
            frame = await outbox.get()
            await ws.send_bytes(frame)

    # ------------------------------------------------------------------ one connection

    async def _serve_connection(self, http: aiohttp.ClientSession) -> bool:
        """One connection, until it ends; True if a standby refused it naming the leader to go to."""
        self._reached = False
        async with http.ws_connect(
            self.url,
            # Pings are this session's own (_watch_sc), and so are the answers to the SC's: aiohttp's
            # heartbeat gives up on an SC whose pong came while this process's loop was held.
            heartbeat=None,
            autoping=False,
            max_msg_size=wire.MAX_FRAME_BYTES,
            ssl=self.tls if self.tls is not None else True,
            # A stopping SPU waits this long at most for the SC to acknowledge the close.
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=1.0),
        ) as ws:
            self._reached = True
            if self._named is not None:
                self._unreachable = None  # the named leader answers (as a leader or not)
            register = wire.Register(spu_id=self.state.spu_id, token=self.token, unreachable_leader=self._unreachable)
            await ws.send_bytes(wire.encode(register))
            loop = asyncio.get_running_loop()
            asked_at = loop.time()
            answer = await self._receive(ws, self.settings.request_timeout)
            self._held = loop.time() - asked_at >= self.settings.leader_wait
            if isinstance(answer, wire.Rejected):
                self.last_rejection = self._refused_here = answer
                self._standby_seen = self._standby_seen or answer.code == NOT_LEADER
                if self._follow(answer):
                    return True
                log = self.log.info if answer.code == NOT_LEADER else self.log.error
                log("sc rejected the registration", code=answer.code, reason=answer.reason)
                return False
            if not isinstance(answer, wire.Accepted):
                raise SessionError(f"expected accepted or rejected after register, got {_kind(answer)}")
            if answer.spu_id != self.state.spu_id:
                raise SessionError(f"the SC accepted SPU {answer.spu_id}, but this is SPU {self.state.spu_id}")
            self._unreachable = None
            # What this process holds, before anything the SC says on this connection changes it.
            await ws.send_bytes(wire.encode(self.state.hosted()))
            self.connections += 1
            # Fetches say it from here: a leader counts only what it sees of this connection's process.
            self.incarnation = self.state.incarnation = answer.incarnation
            self.offsets_interval = answer.offsets_interval
            self.log.info(
                "sc accepted", url=self.url, incarnation=answer.incarnation, heartbeat_timeout=answer.heartbeat_timeout
            )
            outbox: asyncio.Queue[bytes] = asyncio.Queue()
            self._outbox = outbox
            self._confirmed = {}
            tasks = [
                asyncio.create_task(self._write(ws, outbox), name=f"spu-{self.state.spu_id}-sc-writer"),
                asyncio.create_task(self._heartbeat(answer.heartbeat_timeout), name=f"spu-{self.state.spu_id}-heartbeat"),
                asyncio.create_task(self._offsets(), name=f"spu-{self.state.spu_id}-offsets"),
                asyncio.create_task(
                    self._watch_sc(ws, self.settings.sc_ping_timeout or answer.heartbeat_timeout), name=f"spu-{self.state.spu_id}-sc-pings"
                ),
            ]
            try:
                await self._apply_messages(ws, tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return False

    async def _apply_messages(self, ws: aiohttp.ClientWebSocketResponse, tasks: list[asyncio.Task[None]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            receiving = asyncio.ensure_future(self._receive(ws, None))
            done, _ = await asyncio.wait([receiving, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if receiving not in done:
                receiving.cancel()
                await asyncio.gather(receiving, return_exceptions=True)
                for task in done:
                    error = task.exception()
                    # Without heartbeats the SC will mark this SPU offline, and an SC that does not
                    # answer pings is gone: end the connection, start again.
                    self.log.warning("sc connection lost; reconnecting", error=_describe(error) if error else "ended")
                return
            message = receiving.result()
            if message is None:
                # A warning: the SC stopping, or the connection failing.
                error = ws.exception()
                self.log.warning("sc connection closed; reconnecting", close_code=ws.close_code, error=_describe(error) if error else None)
                return
            if isinstance(message, wire.Sync):
                self.state.apply_sync(message, loop.time())
                self._synced_here = self.connected = True
                self.log.info("sc sync applied", epoch=message.epoch, spus=len(message.spus), replicas=len(message.replicas))
                self.on_change(None)
                self.on_step()
                self._after_sync()
            elif isinstance(message, wire.Update):
                if not self._synced_here:
                    raise SessionError(f"update of epoch {message.epoch} arrived before the sync on this connection")
                self.state.apply_update(message, loop.time())
                if message.offsets_interval is not None:
                    self.offsets_interval = message.offsets_interval
                self.log.debug(
                    "sc update applied",
                    epoch=message.epoch,
                    replicas=[info.partition for info in message.replicas],
                    deleted_replicas=message.deleted_replicas,
                    spus=[spu.id for spu in message.spus],
                    deleted_spus=message.deleted_spus,
                )
                self.on_change({info.partition for info in message.replicas}.union(message.deleted_replicas))
                self.on_step()
            elif isinstance(message, wire.AlterIsrResult):
                if message.error is not None:
                    self.log.info("sc refused an in-sync proposal", partition=message.partition, code=message.error, message=message.message)
                self.state.proposal_answered(message, loop.time())
                self.on_step()
            elif isinstance(message, wire.Error):
                self.log.warning("sc refused a frame", code=message.code, message=message.message)
                if message.partition is not None and message.leader_epoch is not None:
                    if self.state.fenced(message.partition, message.leader_epoch):
                        self.on_change({message.partition})
                        self.on_step()
            elif isinstance(message, wire.Rejected):
                self.last_rejection = message
                self.log.error("sc ended the session", code=message.code, reason=message.reason)
                return
            else:
                raise SessionError(f"unexpected {_kind(message)} message after the registration was accepted")

    def _after_sync(self) -> None:
        """Everything the SC may have missed while this SPU was away: every leadership, every
        pending proposal (the SC forgot them with the old connection), every live offset."""
        leading = self.state.leaderships()
        if leading is not None:
            self._confirm((entry["partition"], entry["leader_epoch"]) for entry in leading.partitions)
        for name, proposal in self.state.pending_proposals():
            self.send(_alter_isr(name, proposal))
        entries = self.state.offsets(only_changed=False)
        if entries:
            self.send(wire.Offsets(partitions=entries))

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse, timeout: float | None) -> wire.ScMessages | None:
        """The next SC message, or None once the connection is closed. Pings are answered and
        pongs taken on the way; every frame read is a sign the SC is there."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await ws.receive()
                self._heard_at = asyncio.get_running_loop().time()
                if frame.type is aiohttp.WSMsgType.PING:
                    await ws.pong(frame.data)
                elif frame.type is aiohttp.WSMsgType.PONG:
                    continue
                elif frame.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    return wire.parse_sc_message(frame.data)
                else:
                    return None

    async def _watch_sc(self, ws: aiohttp.ClientWebSocketResponse, window: float) -> None:
        """Ping the SC every ``sc_ping_interval``; SessionError if nothing comes back within
        ``window`` seconds (the SC's heartbeat timeout, unless ``sc_ping_timeout`` says otherwise),
        to notice a dead connection that TCP has not reported.

        Only time this process's loop was free to read counts: a look that comes late (the loop
        was held) gives the SC's answer, maybe in the socket already, another look."""
        loop = asyncio.get_running_loop()
        interval = self.settings.sc_ping_interval
        while True:
            await asyncio.sleep(interval)
            asked_at = loop.time()
            await ws.ping()
            waited = 0.0
            while self._heard_at < asked_at:
                if waited >= window:
                    raise SessionError(f"no answer from the SC within {window:g} s of a ping")
                step = min(PING_LOOK_INTERVAL, window - waited)
                before = loop.time()
                await asyncio.sleep(step)
                # The step, or a little more; the rest of a late look was this loop's, not the SC's.
                waited += min(loop.time() - before, step + LOOP_HELD_SLACK)

    async def _heartbeat(self, heartbeat_timeout: float) -> None:
        """A small frame with no per-partition payload, four times per heartbeat timeout."""
        interval = min(self.settings.heartbeat_interval, heartbeat_timeout / 4)
        frame = wire.encode(wire.Heartbeat())
        while True:
            if self._outbox is not None:
                self._outbox.put_nowait(frame)
            await asyncio.sleep(interval)

    async def _offsets(self) -> None:
        """The offsets that changed, at most once per offsets interval (the SC's latest word);
        nothing while nothing changes."""
        while True:
            await asyncio.sleep(self.offsets_interval)
            if self.connected:
                entries = self.state.offsets()
                if entries:
                    self.send(wire.Offsets(partitions=entries))


def _alter_isr(name: str, proposal: replica_module.Proposal) -> wire.AlterIsr:
    return wire.AlterIsr(
        partition=name, leader_epoch=proposal.leader_epoch, partition_epoch=proposal.partition_epoch, isr=list(proposal.isr),
        hw=proposal.hw,
        incarnations=[wire.MemberIncarnation(spu=spu, incarnation=number) for spu, number in proposal.incarnations],
        uid=proposal.uid,
    )


def _kind(message: object) -> str:
    return str(getattr(message, "type", "no")) if message is not None else "the connection closing"


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__
