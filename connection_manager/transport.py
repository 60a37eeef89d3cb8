"""The listening sockets of both SC ports and a guard on every connection: an accept loop that keeps
each port under its connection limits (and each client address under its own) and backs off when
accepting fails, and timers that close a client too slow to send its first bytes, a request's
headers, or its next request, or to take what is left once its connection was closed. It reads no
more than a connection's first bytes (to pick its protocol) and knows HTTP only through aiohttp's
hooks (a request handler whose errors stay short, a middleware marking a request in progress): the
protocols spoken over it enforce their own body and frame timeouts, and report through its guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import errno
import functools
import gc
import json
import os
import re
import resource
import socket
import ssl
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import structlog
from aiohttp import streams, web

from connection_manager import ratelimit

log = structlog.get_logger(__name__)

PUBLIC = "public"
PRIVATE = "private"
# Descriptors left out of both ports' limits: the listening sockets, etcd's client and the
# embedded etcd's pipes, the history files, the logs.
RESERVED_DESCRIPTORS = 256
# The public port's share of the descriptors left; the private port keeps the rest, so a flood
# of the public port never stops SPUs from connecting.
PUBLIC_SHARE = 0.8
# Derived limits stop here whatever the file limit: each connection also costs memory.
MAX_DERIVED_PUBLIC = 10_000
MAX_DERIVED_PRIVATE = 4_096
# The slowest a body or frame may arrive on average, beyond the body timeout's allowance.
MIN_BODY_BYTES_PER_SECOND = 64 * 1024
# Request bodies and frames up to this size are not counted against a port's buffered bytes.
SMALL_BODY_BYTES = 64 * 1024
# Connections the kernel queues before they are accepted: as many as it allows (Linux caps
# listen()'s backlog at net.core.somaxconn, read from here). A burst that fills the queue makes
# every later client's connect wait a second, then three, for its SYN to be sent again.
SOMAXCONN_PATH = "/proc/sys/net/core/somaxconn"
# Where that cannot be read: Linux's default since 5.4 (other systems cap it at their own).
FALLBACK_BACKLOG = 4096
# Pause before accepting again after accept() failed (out of descriptors or memory), doubled at
# each failure in a row: asyncio's own loop logs and retries each failure at once.
FIRST_ACCEPT_PAUSE = 0.05
MAX_ACCEPT_PAUSE = 2.0
# A full garbage collection once failed requests may have left this many bytes in reference cycles
# (aiohttp keeps each parse error with its traceback, whose frames hold the chunk being parsed), at
# most once per interval: the daemon's first GC threshold is 50,000 objects and its startup heap
# is frozen, so that garbage could otherwise wait for hours.
COLLECT_AFTER_BYTES = 32 * 1024 * 1024
COLLECT_INTERVAL = 1.0
# The allocator gives memory back once no large body is held after this many bytes were, this
# many seconds later.
TRIM_AFTER_BYTES = 32 * 1024 * 1024
TRIM_DELAY = 1.0
# What a request abandoned mid-body may leave behind at most (its body is let go at once; aiohttp's
# buffer of the chunks not read yet is not).
ABANDONED_GARBAGE_BYTES = 2 * SMALL_BODY_BYTES
# aiohttp's own default for how long it drains an unread body after answering.
MAX_LINGERING_SECONDS = 10.0
# An HTTP request starts with its method: up to this many capital letters (and "-", "_"), then a
# space. Our routes use GET, POST and DELETE; anything else is refused before aiohttp parses it.
MAX_METHOD_BYTES = 16
_METHOD = re.compile(rb"[A-Z_-]{1,%d}(?: |$)" % MAX_METHOD_BYTES)
NOT_HTTP_EXCERPT_BYTES = 16
# aiohttp's parser quotes the header line it refuses: from the first of these words on (a bearer
# token, the live page's token subprotocol), the rest of the line is left out of what the SC logs
# and answers.
_CREDENTIAL = re.compile(r"(authorization|bearer|cookie).*", re.IGNORECASE)
# Reasons a connection is refused or closed, as counted in Stats.refused and /metrics.
LIMIT = "limit"  # the port is full of connections with a request in progress
PER_ADDRESS_LIMIT = "per-address-limit"
EVICTED = "evicted"  # the oldest connection with no request in progress, closed for a new one
NOT_HTTP = "not-http"  # the first bytes are no HTTP method: answered 400 without parsing
HEADER_TIMEOUT = "header-timeout"
BODY_TIMEOUT = "body-timeout"
IDLE_TIMEOUT = "idle-timeout"
CLOSE_TIMEOUT = "close-timeout"  # closed, but its client did not take what was left to send: aborted
REASONS = (LIMIT, PER_ADDRESS_LIMIT, EVICTED, NOT_HTTP, HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_TIMEOUT, CLOSE_TIMEOUT)
# Seconds a connection its protocol closed (a WebSocket's end: an SPU dropped, a watch ended) has
# to take the bytes still queued for it, before it is aborted and they are dropped. A polite close
# waits for them to be sent: a client that keeps its socket open and reads nothing held the
# connection, its descriptor and megabytes of the kernel's queue for as long as it liked.
CLOSE_SECONDS = 5.0


@dataclass(frozen=True)
class Timeouts:
    """Seconds a client may take (the defaults are controller/config.py's client_*_timeout)."""

    header: float = 10.0  # first bytes, a request's line and headers, a Fluvio frame's length and API key
    body: float = 30.0  # a pause in a request body or Fluvio frame
    idle: float = 60.0  # between two requests


def whole_body_seconds(pause: float, size: int) -> float:
    """Seconds a body (or frame) of ``size`` bytes may take in all, given the body timeout ``pause``:
    a trickle of a byte a second never pauses that long, but cannot hold a connection for long either."""
    return pause + size / MIN_BODY_BYTES_PER_SECOND


@dataclass(frozen=True)
class Limits:
    connections: int
    per_address: int
    buffered_bytes: int = 128 * 1024 * 1024
    backlog: int | None = None  # None: listen_backlog()


@dataclass(frozen=True)
class ConnectionLimits:
    public: int
    private: int
    per_address: int


def derive_limits(
    file_limit: int, public: int | None = None, private: int | None = None, per_address: int | None = None
) -> ConnectionLimits:
    """Each port's connection limit: the given ones, else shares of the descriptors ``file_limit``
    leaves after a reserve (the public port 80%, the private port the rest, each capped); one
    address may hold a quarter of the public port's limit unless given."""
    usable = max(2, file_limit - reserved_descriptors(file_limit))
    public_share = int(usable * PUBLIC_SHARE)
    public = public or max(1, min(MAX_DERIVED_PUBLIC, public_share))
    private = private or max(1, min(MAX_DERIVED_PRIVATE, usable - public_share))
    return ConnectionLimits(public, private, per_address or max(1, public // 4))


def reserved_descriptors(file_limit: int) -> int:
    """Descriptors kept out of the ports' limits: RESERVED_DESCRIPTORS, or a quarter of a small limit."""
    return RESERVED_DESCRIPTORS if file_limit >= 4 * RESERVED_DESCRIPTORS else file_limit // 4


def listen_backlog() -> int:
    """The listen backlog of both ports: the system's largest (net.core.somaxconn on Linux), else
    FALLBACK_BACKLOG."""
    try:
        with open(SOMAXCONN_PATH, "rb") as limit:
            text = limit.read(32).strip()
    except OSError:
        return FALLBACK_BACKLOG
    return int(text) if text.isdigit() and 0 < int(text) < 1 << 31 else FALLBACK_BACKLOG


def file_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return file_limit()


@dataclass
class Stats:
    """One port's counters, read by the daemon's metrics at scrape time."""

    open: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    accept_pauses: int = 0
    abandoned_requests: int = 0
    abandoned_bytes: int = 0
    collections: int = 0


class Budget:
    """Bytes of large request bodies and frames buffered at once on one port: a new one waits until
    it fits (one alone always fits, whatever its size). The caller bounds the wait. Once none is
    held any more after many were, the allocator is asked to give the memory back."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._freed = asyncio.Event()
        self._released = 0

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        if size <= SMALL_BODY_BYTES:
            yield
            return
        while self.held and self.held + size > self.capacity:
            self._freed.clear()
            await self._freed.wait()
        self.held += size
        try:
            yield
        finally:
            self.held -= size
            self._released += size
            self._freed.set()
            if not self.held and self._released >= TRIM_AFTER_BYTES:
                self._released = 0
                # Later: the body itself, and its copy being handled, are let go after this.
                asyncio.get_running_loop().call_later(TRIM_DELAY, give_memory_back)


class Port:
    """One listening port's policy (limits, timeouts) and live state: connections by client address,
    the buffered-bytes budget, counters, and a rate-limited log for what clients make happen.

    A client address beyond its share is refused. A full port makes room by closing its oldest
    connection that has no request in progress (not sent a complete one yet, or idle between two),
    so a flood of connections that never complete a request cannot lock new clients out; only a
    port full of requests in progress refuses a new connection.
    """

    def __init__(self, name: str, limits: Limits | None = None, timeouts: Timeouts = Timeouts()) -> None:
        if limits is None:
            derived = derive_limits(file_limit())
            limits = Limits(derived.public if name == PUBLIC else derived.private, derived.per_address)
        self.name = name
        self.limits = limits
        self.timeouts = timeouts
        self.stats = Stats()
        self.budget = Budget(limits.buffered_bytes)
        self.log = ratelimit.RateLimitedLog(log)
        self.by_address: dict[str, int] = {}
        # Connections with no request in progress, oldest first (a dict keeps insertion order).
        self.evictable: dict[Guard, None] = {}
        self._garbage = 0
        self._next_collection = 0.0
        self._deferred: asyncio.TimerHandle | None = None

    def admit(self, host: str) -> bool:
        """Take a connection slot for ``host`` (closing the oldest evictable connection if the port
        is full), or count (and log, rate-limited) why not."""
        held = self.by_address.get(host, 0)
        if held >= self.limits.per_address:
            self.refuse(PER_ADDRESS_LIMIT, limit=self.limits.per_address)
            return False
        if self.stats.open >= self.limits.connections:
            oldest = next(iter(self.evictable), None)
            if oldest is None:
                self.refuse(LIMIT, limit=self.limits.connections)
                return False
            oldest.evict()
        self.by_address[host] = held + 1
        self.stats.open += 1
        return True

    def release(self, host: str) -> None:
        self.stats.open -= 1
        held = self.by_address[host] - 1
        if held:
            self.by_address[host] = held
        else:
            del self.by_address[host]

    def refuse(self, reason: str, **fields: Any) -> None:
        self.stats.refused[reason] += 1
        emit = self.log.warning if reason in (LIMIT, PER_ADDRESS_LIMIT, EVICTED) else self.log.info
        emit(f"{self.name}:{reason}", "connections refused or closed", port=self.name, reason=reason, **fields)

    def abandoned(self, received: int) -> None:
        """A client left in the middle of a request body or frame of ``received`` bytes."""
        self.stats.abandoned_requests += 1
        self.stats.abandoned_bytes += received
        self.log.info(f"{self.name}:abandoned", "clients closed their connection in the middle of a request", port=self.name)
        self.garbage(ABANDONED_GARBAGE_BYTES)

    def garbage(self, size: int) -> None:
        """A failed request may have left ``size`` bytes in reference cycles: collect them once
        enough have gathered, whatever the GC's own thresholds."""
        self._garbage += size
        if self._garbage < COLLECT_AFTER_BYTES or self._deferred is not None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_collection:
            self._collect(loop)
        else:
            # The attack's last clients: collect when the interval ends, not at some later failure.
            self._deferred = loop.call_at(self._next_collection, self._collect, loop)

    def _collect(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deferred = None
        self._garbage = 0
        self._next_collection = loop.time() + COLLECT_INTERVAL
        self.stats.collections += 1
        gc.collect()
        give_memory_back()


def give_memory_back() -> None:
    """Return the allocator's free memory to the system. glibc keeps what large request buffers and
    the chunks read into them leave free on its heap (the RSS of 100 aborted 15 MiB uploads stayed
    65 MB above where it started; malloc_trim took it back); other C libraries have no such call."""
    if _malloc_trim is not None:
        _malloc_trim(0)


_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)


class Phase(enum.Enum):
    OPENING = "opening"  # nothing received yet
    HEADERS = "headers"  # an HTTP request has begun: its line and headers are due
    BUSY = "busy"  # a request is being handled (its body timeout is the handler's)
    IDLE = "idle"  # between two HTTP requests
    CLOSING = "closing"  # closed by its protocol, sending what it was left (up to CLOSE_SECONDS)
    DELEGATED = "delegated"  # a protocol with timeouts of its own (Fluvio) has the connection


class Guard(asyncio.Protocol):
    """Sits between one connection's transport and the protocol spoken on it, chosen by its first
    bytes (``choose`` gives None for bytes no protocol starts with): holds the connection's slot on
    its port and closes it when the client takes too long."""

    def __init__(
        self, port: Port, host: str, choose: Callable[[bytes], asyncio.Protocol | None], registry: set[Guard]
    ) -> None:
        self.port = port
        self.host = host
        self.phase = Phase.OPENING
        self.made = False
        self.transport: asyncio.Transport | None = None
        self.inner: asyncio.Protocol | None = None
        self._choose = choose
        self._registry = registry
        self._timer: asyncio.TimerHandle | None = None
        self._write_backlog = 0
        self._released = False
        self.received = 0
        # Set when aiohttp refused a request as malformed: what it parsed may be left in cycles.
        self.failed = False
        # The body of the last request, if its handler left some unread: aiohttp reads and drops
        # the rest ("lingering") for up to 10 s, and would wait that long after a disconnect too.
        self._unread: streams.StreamReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream socket's transport
        self.made = True
        self._registry.add(self)
        self.port.evictable[self] = None
        self._arm(self.port.timeouts.header)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        inner = self.inner
        if inner is None:
            if not data or self.transport is None:
                return
            inner = self._choose(data)
            if inner is None:
                self._not_http(data)
                return
            self.inner = inner
            if isinstance(inner, HttpHandler):
                inner.guard = self
                self.phase = Phase.HEADERS  # the first request is due by the opening deadline
            else:
                self.phase = Phase.DELEGATED
                self._disarm()
            inner.connection_made(self.transport)
        elif self.phase is Phase.IDLE:
            self.phase = Phase.HEADERS
            self._arm(self.port.timeouts.header)
        inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.inner is None:
            return False  # closed before saying anything: close our side too
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.transport = None
        self._registry.discard(self)
        self.port.evictable.pop(self, None)
        self.release()
        if self.failed:
            self.port.garbage(self.received)
        if self._unread is not None:
            self._unread.feed_eof()
            self._unread = None
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.port.release(self.host)

    # ------------------------------------------------------------------ what the protocols tell it

    def request_started(self) -> None:
        """A complete request is being handled (for Fluvio: a complete frame has come)."""
        self.phase = Phase.BUSY
        self._disarm()
        self._unread = None
        self.port.evictable.pop(self, None)

    def request_finished(self, body: streams.StreamReader, closing: bool = False) -> None:
        """The request is handled; ``closing``: its connection ends with it (a WebSocket's)."""
        if self.transport is None:
            return
        if closing or self.transport.is_closing():
            # What is left to send (a close frame, the frames queued before it) is sent within
            # CLOSE_SECONDS, like any wait on the client; meanwhile the connection may make room
            # for a new one, as an idle one does.
            self.phase = Phase.CLOSING
            self.port.evictable[self] = None
            self._arm(CLOSE_SECONDS)
            return
        self._unread = None if body.is_eof() else body
        self.phase = Phase.IDLE
        self._write_backlog = 0
        self.port.evictable[self] = None
        self._arm(self.port.timeouts.idle)

    def _not_http(self, data: bytes) -> None:
        """Answer bytes that cannot begin an HTTP request (TLS, junk) with a short 400 and close,
        without handing them to aiohttp, whose parse errors would keep them in reference cycles."""
        assert self.transport is not None
        self._disarm()
        self.port.refuse(NOT_HTTP, first_bytes=ratelimit.excerpt(data, NOT_HTTP_EXCERPT_BYTES))
        message = f"the request is not HTTP/1.1: it starts with {ratelimit.excerpt(data, NOT_HTTP_EXCERPT_BYTES)}"
        body = json.dumps({"error": {"code": "MalformedRequest", "message": message}}).encode()
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()

    def evict(self) -> None:
        """Close this connection at once for a new one; its slot is free on return."""
        self._disarm()
        self.port.evictable.pop(self, None)
        self.release()
        self.port.refuse(EVICTED, limit=self.port.limits.connections)
        if self.transport is not None:
            self.transport.abort()

    def timed_out(self, reason: str) -> None:
        """Count the connection as closed for ``reason`` and close it at once (unsent bytes dropped).
        One closed politely already and still here is stuck sending to a client that takes nothing:
        aborted too, counted as CLOSE_TIMEOUT."""
        self._disarm()
        transport = self.transport
        if transport is None:
            return
        if transport.is_closing():
            reason = CLOSE_TIMEOUT
        self.port.refuse(reason, seconds=self._timeout_of(reason))
        transport.abort()

    # ------------------------------------------------------------------ the timer

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.phase is Phase.IDLE and self.transport is not None:
            # Still writing its last answer to a client that reads it: not idle.
            backlog = self.transport.get_write_buffer_size()
            if backlog and backlog != self._write_backlog:
                self._write_backlog = backlog
                self._arm(self.port.timeouts.idle)
                return
        self.timed_out({Phase.IDLE: IDLE_TIMEOUT, Phase.CLOSING: CLOSE_TIMEOUT}.get(self.phase, HEADER_TIMEOUT))

    def _timeout_of(self, reason: str) -> float:
        timeouts = self.port.timeouts
        return {HEADER_TIMEOUT: timeouts.header, BODY_TIMEOUT: timeouts.body, CLOSE_TIMEOUT: CLOSE_SECONDS}.get(reason, timeouts.idle)


def guard_of(transport: asyncio.BaseTransport | None) -> Guard | None:
    """The guard of a connection accepted by a Listener (None for any other)."""
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, Guard) else None


# The TLS context for a new connection (connection_manager/tls.py): asked at each accept, so that a
# reloaded certificate serves the next handshake.
TlsContext = Callable[[], ssl.SSLContext]


class Listener(asyncio.AbstractServer):
    """Accepts connections on its sockets itself, so that a full port refuses them at once without
    a log line each, and a failing accept() pauses accepting for a growing time instead of spinning.
    With ``tls``, each connection's handshake comes first (within the header timeout), and its guard
    sees the decrypted bytes."""

    def __init__(
        self,
        port: Port,
        sockets: list[socket.socket],
        choose: Callable[[bytes], asyncio.Protocol | None],
        backlog: int,
        tls: TlsContext | None = None,
    ) -> None:
        self.port = port
        self.tls = tls
        self._sockets = sockets
        self._choose = choose
        self.backlog = backlog
        self._loop = asyncio.get_running_loop()
        self._serving = False
        self._pause = 0.0
        self._resume: asyncio.TimerHandle | None = None
        self._connecting: set[asyncio.Task[None]] = set()
        self._guards: set[Guard] = set()

    @classmethod
    async def open(
        cls,
        port: Port,
        host: str | None,
        port_number: int,
        choose: Callable[[bytes], asyncio.Protocol | None],
        tls: TlsContext | None = None,
    ) -> Listener:
        loop = asyncio.get_running_loop()
        addresses = await loop.getaddrinfo(host or None, port_number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        backlog = port.limits.backlog or listen_backlog()
        sockets: list[socket.socket] = []
        try:
            for family, kind, protocol, _, address in dict.fromkeys(addresses):
                sock = socket.socket(family, kind, protocol)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        listener = cls(port, sockets, choose, backlog, tls)
        await listener.start_serving()
        return listener

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        if not self._serving and self._sockets:
            self._serving = True
            self._listen()

    async def serve_forever(self) -> None:
        raise NotImplementedError("the listener serves from start_serving() until close()")

    def close(self) -> None:
        """Stop accepting; connections not yet handed to a protocol are dropped, the others are the
        protocols' to close (aiohttp's runner, the Fluvio server)."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._serving:
            self._unlisten()
            self._serving = False
        for sock in self._sockets:
            sock.close()
        self._sockets = []
        for task in self._connecting:
            task.cancel()
        for guard in list(self._guards):
            if guard.inner is None and guard.transport is not None:
                guard.transport.abort()

    async def wait_closed(self) -> None:
        if self._connecting:
            await asyncio.gather(*self._connecting, return_exceptions=True)

    def _listen(self) -> None:
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _unlisten(self) -> None:
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())

    def _accept(self, sock: socket.socket) -> None:
        # The whole queue at each wake-up: a connection waits behind every earlier one, and on a
        # busy loop each wake-up is a turn of many milliseconds, so taking a few per turn made a
        # liveness probe behind a burst of a thousand wait seconds. At most one queue's worth,
        # so a steady flood cannot hold the loop, and no more than the port holds: beyond it,
        # each would only evict one accepted in the same turn.
        for _ in range(min(self.backlog, self.port.limits.connections)):
            try:
                connection, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as error:
                self._pause_accepting(error)
                return
            self._pause = 0.0
            host = address[0] if isinstance(address, tuple) else str(address)
            if not self.port.admit(host):
                connection.close()
                continue
            guard = Guard(self.port, host, self._choose, self._guards)
            task = self._loop.create_task(self._connect(connection, guard))
            self._connecting.add(task)
            # A callback, not a finally: a task cancelled (by close) before it ran runs no finally.
            task.add_done_callback(functools.partial(self._connected, connection=connection, guard=guard))

    async def _connect(self, connection: socket.socket, guard: Guard) -> None:
        # OSError: the client is gone already, or its handshake failed (ssl.SSLError, a timeout).
        with contextlib.suppress(OSError):
            if self.tls is None:
                await self._loop.connect_accepted_socket(lambda: guard, sock=connection)
            else:
                await self._loop.connect_accepted_socket(
                    lambda: guard, sock=connection, ssl=self.tls(), ssl_handshake_timeout=self.port.timeouts.header
                )

    def _connected(self, task: asyncio.Task[None], connection: socket.socket, guard: Guard) -> None:
        self._connecting.discard(task)
        if not guard.made:  # never connected: no connection_lost will release its slot
            connection.close()
            guard.release()

    def _pause_accepting(self, error: OSError) -> None:
        self._pause = min(MAX_ACCEPT_PAUSE, self._pause * 2 or FIRST_ACCEPT_PAUSE)
        self.port.stats.accept_pauses += 1
        self.port.log.error(
            f"{self.port.name}:accept",
            "accepting connections paused: accept() failed",
            port=self.port.name,
            error=os.strerror(error.errno) if error.errno else str(error),
            out_of_descriptors=error.errno in (errno.EMFILE, errno.ENFILE),
            seconds=self._pause,
            open=self.port.stats.open,
        )
        self._unlisten()
        self._resume = self._loop.call_later(self._pause, self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._resume = None
        if self._serving:
            self._listen()


# ---------------------------------------------------------------------------- HTTP through aiohttp


class HttpHandler(web.RequestHandler):
    """aiohttp's protocol for one HTTP connection, whose own error answers (a request that is not
    HTTP, a line or header too long) are a short JSON error quoting at most a short escaped
    excerpt of what the client sent, logged once per interval without a traceback."""

    __slots__ = ("guard",)

    def __init__(self, server: web.Server, timeouts: Timeouts) -> None:
        # aiohttp's own keep-alive timer only backs the guard's up (which closes and counts first).
        # After an answer given before its whole body came (413, 408), aiohttp reads and drops the
        # rest so the client sees the answer: for no longer than the client had to send headers.
        super().__init__(
            server,
            loop=asyncio.get_running_loop(),
            keepalive_timeout=timeouts.idle + timeouts.header,
            lingering_time=min(MAX_LINGERING_SECONDS, timeouts.header),
            access_log=None,  # type: ignore[arg-type]  # None turns aiohttp's access log off; its annotation says Logger
        )
        self.guard: Guard | None = None

    def handle_error(
        self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        detail = ratelimit.excerpt(without_credentials(message or (str(exc) if exc is not None else HTTPStatus(status).phrase)))
        if exc is not None and exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # its frames hold the bytes being parsed
        if self.guard is not None:
            self.guard.failed = True
        port = self.guard.port if self.guard is not None else None
        if port is not None:
            emit = port.log.error if status >= 500 else port.log.info
            emit(f"{port.name}:http-{status}", "HTTP requests refused", port=port.name, status=status, error=detail)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was partly sent already: the connection is closed instead")
        code = "MalformedRequest" if status == HTTPStatus.BAD_REQUEST else HTTPStatus(status).phrase.replace(" ", "")
        answer = (
            f"the request is not valid HTTP/1.1 ({detail}); send a request line, headers, then the body"
            if status == HTTPStatus.BAD_REQUEST
            else f"{HTTPStatus(status).phrase} ({detail})"
        )
        response = web.json_response({"error": {"code": code, "message": answer}}, status=status)
        response.force_close()
        return response


def without_credentials(text: str) -> str:
    """``text`` (a parser's message quoting what a client sent) without what may be a credential:
    each line from the word that names one on."""
    return _CREDENTIAL.sub(r"\1 (the rest of the line is not shown: it may hold a credential)", text)


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Tells the connection's guard that a request is being handled (no header or idle timer runs
    meanwhile: a create may wait for its topic, a watch streams for hours) and when it is done."""
    guard: Guard | None = getattr(request.protocol, "guard", None)
    if guard is None:
        return await handler(request)
    guard.request_started()
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        return response
    finally:
        # A WebSocket's connection ends with its handler: aiohttp closes it next.
        guard.request_finished(request.content, closing=isinstance(response, web.WebSocketResponse))


class GuardedSite(web.BaseSite):
    """A TCP site of an aiohttp runner whose connections go through a Listener and a Guard. Its app
    must have ``middleware``. ``other`` may claim a connection by its first bytes for another
    protocol (Fluvio's, on the public port); the rest is HTTP."""

    __slots__ = ("_host", "_port_number", "_policy", "_other", "_tls")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port_number: int,
        policy: Port,
        other: Callable[[bytes], asyncio.Protocol | None] = lambda first: None,
        tls: TlsContext | None = None,
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port_number = port_number
        self._policy = policy
        self._other = other
        self._tls = tls

    @property
    def name(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self._host or '0.0.0.0'}:{self.port}"

    @property
    def port(self) -> int:
        sockets = self._server.sockets if isinstance(self._server, Listener) else ()
        return sockets[0].getsockname()[1] if sockets else self._port_number

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        app = getattr(self._runner, "app", None)
        if app is not None and middleware not in app.middlewares:
            raise RuntimeError("an app served through a GuardedSite needs transport.middleware")
        timeouts, other = self._policy.timeouts, self._other

        def choose(first: bytes) -> asyncio.Protocol | None:
            claimed = other(first)
            if claimed is not None:
                return claimed
            return HttpHandler(server, timeouts) if _METHOD.match(first, 0, MAX_METHOD_BYTES + 1) else None

        self._server = await Listener.open(self._policy, self._host, self._port_number, choose, tls=self._tls)
