"""A simulated SPU's connection to the SC's private port: register, apply Sync/Update, send the LRS every 400 ms.

Reconnects forever (capped exponential backoff with jitter) after a drop or a refusal, until cancelled.
While disconnected the SPU keeps its last picture and keeps replicating: the data plane does not need the SC.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import aiohttp
import structlog

from connection_manager import wire
from connection_manager.spu import backoff as backoff_module, settings as settings_module, state as state_module


class SessionError(Exception):
    """The SC broke the protocol on this connection; the session drops it and reconnects."""


class ScSession:
    def __init__(
        self,
        state: state_module.SpuState,
        sc_address: tuple[str, int],
        token: str | None,
        settings: settings_module.SpuSettings,
        on_change: Callable[[], None],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.state = state
        host, port = sc_address
        # With ``tls`` (the SC's CA, and this SPU's client certificate under mutual TLS): wss.
        self.tls = tls
        self.url = f"{'wss' if tls is not None else 'ws'}://{f'[{host}]' if ':' in host else host}:{port}{wire.SPU_PATH}"
        self.token = token
        self.settings = settings
        self.on_change = on_change  # called after each Sync or Update is applied
        self.connected = False  # accepted and synced on the current connection
        self._synced_here = False  # a Sync was applied on the current (or just ended) connection
        self.connections = 0  # connections the SC accepted since start
        self.last_rejection: wire.Rejected | None = None
        self.log = structlog.get_logger(__name__).bind(spu=state.spu_id)

    async def run(self) -> None:
        backoff = backoff_module.Backoff(self.settings.reconnect_initial, self.settings.reconnect_max)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.request_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                self._synced_here = False
                try:
                    await self._serve_connection(http)
                except (aiohttp.ClientError, OSError, TimeoutError) as error:
                    # The first failure in a row is news; the retries of an SC that stays down are not.
                    log = self.log.info if backoff.attempt == 0 or self._synced_here else self.log.debug
                    log("sc connection failed; retrying with backoff", url=self.url, error=_describe(error))
                except (wire.FrameError, SessionError, state_module.SyncRequired) as error:
                    self.log.warning("sc broke the protocol; reconnecting for a fresh sync", url=self.url, error=str(error))
                finally:
                    self.connected = False
                if self._synced_here:
                    backoff.reset()
                delay = backoff.next_delay()
                self.log.debug("sc reconnect scheduled", delay=round(delay, 3), attempt=backoff.attempt)
                await asyncio.sleep(delay)

    async def _serve_connection(self, http: aiohttp.ClientSession) -> None:
        """One connection, until it ends."""
        async with http.ws_connect(
            self.url,
            heartbeat=self.settings.sc_ping_interval,
            max_msg_size=wire.MAX_FRAME_BYTES,
            ssl=self.tls if self.tls is not None else True,
            # A stopping SPU waits this long at most for the SC to acknowledge the close.
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=1.0),
        ) as ws:
            await ws.send_str(wire.encode(wire.Register(spu_id=self.state.spu_id, token=self.token)).decode())
            answer = await self._receive(ws, self.settings.request_timeout)
            if isinstance(answer, wire.Rejected):
                self.last_rejection = answer
                self.log.error("sc rejected the registration", code=answer.code, reason=answer.reason)
                return
            if not isinstance(answer, wire.Accepted):
                raise SessionError(f"expected accepted or rejected after register, got {_kind(answer)}")
            if answer.spu_id != self.state.spu_id:
                raise SessionError(f"the SC accepted SPU {answer.spu_id}, but this is SPU {self.state.spu_id}")
            self.connections += 1
            self.log.info("sc accepted", url=self.url, heartbeat_timeout=answer.heartbeat_timeout)
            if answer.heartbeat_timeout <= self.settings.lrs_interval:
                self.log.warning(
                    "the SC's heartbeat timeout is not above this SPU's report interval: it will be marked offline",
                    heartbeat_timeout=answer.heartbeat_timeout,
                    lrs_interval=self.settings.lrs_interval,
                )
            reporter = asyncio.create_task(self._report(ws), name=f"spu-{self.state.spu_id}-lrs")
            try:
                await self._apply_messages(ws)
            finally:
                reporter.cancel()
                await asyncio.gather(reporter, return_exceptions=True)

    async def _apply_messages(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        loop = asyncio.get_running_loop()
        while True:
            message = await self._receive(ws, None)
            if message is None:
                self.log.info("sc closed the connection", close_code=ws.close_code)
                return
            if isinstance(message, wire.Sync):
                self.state.apply_sync(message, loop.time())
                self._synced_here = self.connected = True
                self.log.info("sc sync applied", epoch=message.epoch, spus=len(message.spus), replicas=len(message.replicas))
                self.on_change()
            elif isinstance(message, wire.Update):
                if not self._synced_here:
                    raise SessionError(f"update of epoch {message.epoch} arrived before the sync on this connection")
                self.state.apply_update(message, loop.time())
                self.log.debug(
                    "sc update applied",
                    epoch=message.epoch,
                    replicas=[info.partition for info in message.replicas],
                    deleted_replicas=message.deleted_replicas,
                    spus=[spu.id for spu in message.spus],
                    deleted_spus=message.deleted_spus,
                )
                self.on_change()
            elif isinstance(message, wire.Error):
                self.log.warning("sc refused a frame", code=message.code, message=message.message)
            elif isinstance(message, wire.Rejected):
                self.last_rejection = message
                self.log.error("sc ended the session", code=message.code, reason=message.reason)
                return
            else:
                raise SessionError(f"unexpected {_kind(message)} message after the registration was accepted")

    async def _receive(
        self, ws: aiohttp.ClientWebSocketResponse, timeout: float | None
    ) -> wire.Accepted | wire.Rejected | wire.Sync | wire.Update | wire.Error | None:
        """The next SC message, or None once the connection is closed."""
        frame = await ws.receive(timeout)
        if frame.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            return wire.parse_sc_message(frame.data)
        return None

    async def _report(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """The LRS at a fixed rate; empty until this connection's Sync (the old picture may be stale)."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        try:
            while True:
                report = self.state.live_replicas(loop.time()) if self.connected else wire.LiveReplicas()
                await ws.send_str(wire.encode(report).decode())
                next_at += self.settings.lrs_interval
                await asyncio.sleep(max(0.0, next_at - loop.time()))
        except (aiohttp.ClientError, ConnectionError) as error:
            # Without heartbeats the SC will mark this SPU offline: end the connection and start again.
            self.log.info("sc report failed; closing the connection", error=_describe(error))
            await ws.close()


def _kind(message: object) -> str:
    return str(getattr(message, "type", "no")) if message is not None else "the connection closing"


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__
