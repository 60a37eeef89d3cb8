"""The Fluvio admin server: one session per connection (framing, dispatch, one ordered writer),
ApiVersions, List, and Watch streams fed from the local store; writes go to fluvio.admin.

Only an undecodable frame, one larger than its API allows (refused at its header, unread), a frame
too slow to arrive (its length and API key within the header timeout, its bytes as a request
body's), idleness with no watch and nothing in flight, a watch past the limits, or a client that
takes nothing for client_stall_seconds closes a connection, and only that one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from connection_manager import ratelimit, tls, transport
from controller import context as context_module
from controller.api import admin_ops, admission, auth, credentials, listing
from controller.api.fluvio import admin as admin_module, mapping, messages, objects as fluvio_objects, primitives
from store import local, models

log = structlog.get_logger(__name__)

# Any semver >= 0.9.0 satisfies Fluvio.connect; this is the release the 0.21 client was built from.
PLATFORM_VERSION = "0.17.3"
# The object APIs this SC serves, each in the type-labelled layout only (v11..19; the client picks 19).
SERVED_APIS = (messages.CREATE, messages.DELETE, messages.LIST, messages.WATCH, messages.UPDATE)
# Frames above this close the connection (as a body above it gets a 413 over HTTP); only a Create may
# come near it (messages.check_request_size), and only on a store whose requests hold that much.
MAX_FRAME_BYTES = 16 * 1024 * 1024
# Writes (create, delete, update) answered concurrently per connection; beyond, reading waits.
MAX_IN_FLIGHT = 32
# Answers queued for a client that is not reading them; beyond, its next frame is not read.
MAX_QUEUED_REPLIES = 64
# Watches per connection (the real client opens three, plus one per watch_topic()); a client that
# asks for more is closed rather than given a listener each.
MAX_WATCHES = 256
# A watch waits this long after a change before building its frame, so a burst goes out as one
# frame: the client buffers only 10 frames per watch before its whole connection stalls.
WATCH_LINGER_SECONDS = 0.02
# Frames above this are read in chunks of it into a buffer of their size.
READ_CHUNK = 256 * 1024
# A closing connection's last answers get this long to leave before they are dropped.
CLOSE_SECONDS = 5.0
# At a stop, the creates, deletes and updates being answered get this long to have their answers
# queued and written (a create waiting for a verdict is answered at once: Admin.stop).
STOP_GRACE_SECONDS = 1.0
STOP_POLL_SECONDS = 0.01
# A List refused for load is answered under this label: the client fails that one call ("downcast
# error") and keeps its connection and watches; a List answer has no error field, and closing the
# connection would break every later call of the client.
BUSY_LABEL = "Busy"
# A reply body at least this large is written after its frame header rather than copied behind it,
# so that a List answer shared by many connections is not copied once per connection; it is written
# in pieces of this size as the client takes them, holding a slot of the expensive-work gate.
LARGE_BODY_BYTES = 64 * 1024
# Items encoded between two yields to the loop: a first list of 100,000 partitions must not hold
# up every other connection (and the HTTP API) while it is encoded.
ENCODE_CHUNK = 1000

_SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "spus": lambda obj: (obj.spec.id, obj.name),
    "partitions": lambda obj: (obj.topic, obj.index),
}


def api_versions_body() -> bytes:
    keys = [messages.ApiVersionKey(key, messages.OBJECT_MIN_VERSION, messages.OBJECT_MAX_VERSION) for key in SERVED_APIS]
    return messages.encode_response_body(messages.ApiVersionsResponse(api_keys=keys, platform_version=PLATFORM_VERSION), 0)


class ItemCache:
    """Encoded Metadata items shared by every connection: each object version is encoded once per
    label and protocol version, however many lists and watches send it."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, int], dict[str, tuple[models.AnyObject, bytes | None]]] = {}

    def encoded(self, label: str, version: int, obj: models.AnyObject) -> bytes | None:
        """The item's bytes; None (logged once) for an object the protocol cannot carry."""
        table = self._tables.setdefault((label, version), {})
        cached = table.get(obj.name)
        if cached is not None and cached[0] is obj:
            return cached[1]
        _, _, item = mapping.ITEMS[label]
        try:
            data: bytes | None = fluvio_objects.encode_metadata(label, item(obj), version)
        except primitives.EncodeError as error:
            log.warning("object left out of Fluvio answers: the protocol cannot carry it", label=label, name=obj.name, error=str(error))
            data = None
        table[obj.name] = (obj, data)
        return data

    def prune(self, label: str, version: int, live: Mapping[str, Any]) -> None:
        """Forget deleted objects once they outnumber the live ones."""
        table = self._tables.get((label, version))
        if table is not None and len(table) > 2 * len(live) + 1024:
            self._tables[(label, version)] = {name: cached for name, cached in table.items() if name in live}


class FluvioServer:
    """Serves every Fluvio connection of one daemon."""

    def __init__(
        self,
        context: context_module.Context,
        readiness: admin_module.Readiness = admin_module.Readiness.PROVISIONED,
        create_wait: float = admin_module.CREATE_WAIT_SECONDS,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.context = context
        self.admin = admin_module.Admin(context, readiness, create_wait)
        self.items = ItemCache()
        self.max_frame_bytes = max_frame_bytes
        self.api_versions = api_versions_body()
        # For what clients make happen (bad frames, timeouts): one line per kind per interval.
        self.log = ratelimit.RateLimitedLog(log)
        self._sessions: dict[asyncio.Task[None], Session] = {}
        self._background: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._background = self.context.supervisor.spawn("fluvio-admin-waits", self.admin.run)

    async def close(self) -> None:
        # Answers before the connections close: a client whose create was cut off unanswered
        # cannot tell whether it was written (it was; its verdict is left to the next SC).
        self.admin.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_SECONDS
        while any(session.answering for session in self._sessions.values()) and loop.time() < deadline:
            await asyncio.sleep(STOP_POLL_SECONDS)
        await self.admin.forwarder.close()
        tasks = list(self._sessions) + ([self._background] if self._background is not None else [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sessions.clear()
        self._background = None

    @property
    def create_frame_limit(self) -> int:
        """The largest Create frame read: what a topic create may hold before it is parsed, as over
        HTTP (one store request and some room). A manual assignment takes fewer bytes in Fluvio's
        encoding than stored (a row of one SPU id: 13 bytes, 30 stored at least; 4 more per id on
        both sides; measured, 0.43 to 0.81 of the least stored), so no frame above this holds a
        topic the store could keep."""
        return min(self.max_frame_bytes, admin_ops.topic_content_limit(self.context.kv_store))

    def protocol(self) -> asyncio.StreamReaderProtocol:
        """A protocol for one new connection (the listener hands it the transport)."""
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._connected)

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(self, reader, writer)
        task = asyncio.create_task(session.run(), name="fluvio-session")
        self._sessions[task] = session
        task.add_done_callback(lambda done: self._sessions.pop(done, None))

    async def encode_all(self, label: str, version: int, objects: list[models.AnyObject]) -> list[bytes | None]:
        """The item of each object (None where it cannot be carried), yielding to the loop between
        chunks; the caller captured ``objects`` at one moment, so the answer stays consistent."""
        encoded: list[bytes | None] = []
        for start in range(0, len(objects), ENCODE_CHUNK):
            if start:
                await asyncio.sleep(0)
            encoded += [self.items.encoded(label, version, obj) for obj in objects[start : start + ENCODE_CHUNK]]
        return encoded

    async def list_body(self, request: messages.ListRequest, version: int) -> bytes:
        """Topic: name filters are substrings OR-ed, and system selects system topics (we have none);
        Partition: filters ignored; SPU, CustomSpu, SpuGroup: substring filters. Unserved labels: [].

        Built once per version of the table for every identical List (and kept while the table does
        not change), inside a slot of the expensive-work gate (admission.Busy if none comes)."""
        label = request.label
        served = mapping.ITEMS.get(label)
        if served is None or (request.system and label in (fluvio_objects.TOPIC, fluvio_objects.PARTITION)):
            return messages.list_body(label, [])
        kind, keep, _ = served
        table = self.context.local_store[kind]
        filters = tuple(request.name_filters) if label != fluvio_objects.PARTITION else ()
        lists = self.context.lists

        async def build(taken: Callable[[int], None]) -> listing.Answer:
            async with self.context.gate.slot(admission.FLUVIO_LIST):
                view = table.view
                objects = [view[name].obj for name in lists.names(kind)]
                revision = table.revision
                taken(table.epoch)
                if keep is not None:
                    objects = [obj for obj in objects if keep(obj)]
                if filters:
                    objects = [obj for obj in objects if any(part in obj.name for part in filters)]
                encoded = await self.encode_all(label, version, objects)
                self.items.prune(label, version, table.view)
                return listing.Answer(messages.list_body(label, [item for item in encoded if item is not None]), revision)

        answer = await lists.answers.get(("fluvio", label, version, filters), table.epoch, None, build)
        return answer.body


class _ClosedMidFrame(Exception):
    def __init__(self, received: int) -> None:
        super().__init__(f"the client closed its connection after {received} bytes of a frame")
        self.received = received


class Session:
    """One connection: reads frames in order, answers each by correlation id, writes one frame at a time."""

    def __init__(self, server: FluvioServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        # Fluvio's protocol carries no token: a client certificate (under mutual TLS) is the credential.
        common_name, _ = tls.peer_names(writer.get_extra_info("peercert"))
        self.presented = auth.Presented(None, common_name, self.address)
        self._principal = self._authenticate()
        self._credentials = server.context.authenticator.credentials  # what _principal was found in
        # (frame header, body, what gives back the gate slot its writing holds, if any)
        self._replies: collections.deque[tuple[bytes, bytes, Callable[[], None] | None]] = collections.deque()
        # Watches with a frame to build, in the order they asked (an ordered set).
        self._dirty: dict[WatchStream, None] = {}
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._answering = 0  # creates, deletes and updates being answered
        self._watches = 0
        # The admitted watch streams of this connection (counted against max_watchers).
        self.watchers: set[admission.Watcher] = set()

    def _authenticate(self) -> auth.Principal | auth.Unauthenticated:
        try:
            return self.server.context.authenticator.authenticate(None, self.presented.certificate_cn, self.address)
        except auth.Unauthenticated as refused:
            return refused

    @property
    def principal(self) -> auth.Principal | auth.Unauthenticated:
        """Who this connection is, from the current credentials: a connection lasts, and credentials
        replaced since (their file changed) apply to its next request (a role lowered, say)."""
        credentials = self.server.context.authenticator.credentials
        if credentials is not self._credentials:
            self._principal, self._credentials = self._authenticate(), credentials
        return self._principal

    async def _until_revoked(self) -> None:
        """Returns once replaced credentials take the principal this connection had: its watches
        answer with no error field (nothing else could tell the client), so it is closed."""
        if isinstance(self.principal, auth.Unauthenticated):
            await asyncio.Event().wait()  # it never had one: its Lists and Watches close it already
        reason = await credentials.until_refused(self.server.context.authenticator, self.presented, auth.Right(auth.READ))
        self.server.log.warning("fluvio:revoked", "closing Fluvio connections whose credential was revoked", peer=self.peer, reason=reason)

    async def run(self) -> None:
        reading = asyncio.create_task(self._read_loop(), name="fluvio-read")
        writing = asyncio.create_task(self._write_loop(), name="fluvio-write")
        revoked = asyncio.create_task(self._until_revoked(), name="fluvio-credential")
        try:
            await asyncio.wait((reading, writing, revoked), return_when=asyncio.FIRST_COMPLETED)
        finally:
            tasks = [reading, writing, revoked, *self._tasks]
            for task in tasks:
                task.cancel()
            try:
                await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                # Even if the server's close cancels this task right here: the socket is closed,
                # and gate slots held for replies never written are given back.
                for watcher in self.watchers:
                    watcher.release()
                self.watchers.clear()
                for _, _, release in self._replies:
                    if release is not None:
                        release()
                self._replies.clear()
                self.writer.close()
            with contextlib.suppress(ConnectionError, OSError, TimeoutError):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await self.writer.wait_closed()
            self.writer.transport.abort()  # answers a client never read are dropped, not kept

    # ------------------------------------------------------------------ reading

    async def _read_loop(self) -> None:
        settings = self.server.context.settings
        guard = transport.guard_of(self.writer.transport)
        while True:
            # Room first, then the frame: a request decoded and then held while its client reads
            # nothing is ten to forty times its frame, outside max_buffered_request_bytes.
            while len(self._replies) >= MAX_QUEUED_REPLIES:
                self._room.clear()
                await self._room.wait()
            try:
                first = await self._first_byte(settings.client_idle_timeout)
                if first is None:
                    self._timed_out(guard, transport.IDLE_TIMEOUT)
                    return
                try:
                    async with asyncio.timeout(settings.client_header_timeout):
                        prefix = first + await self.reader.readexactly(3)
                        # Any length: the API key comes first, so that a refusal names the API.
                        length = messages.frame_length(prefix, messages.LARGEST_FRAME_LENGTH)
                        head = await self.reader.readexactly(min(length, messages.API_KEY_BYTES))
                except TimeoutError:
                    self._timed_out(guard, transport.HEADER_TIMEOUT)
                    return
                # Before the frame has room in the port's budget or memory: most APIs need very little,
                # and none more than max_frame_bytes.
                messages.check_request_size(
                    head, length, self.server.create_frame_limit, min(messages.MAX_SMALL_REQUEST_BYTES, self.server.max_frame_bytes)
                )
                try:
                    message = await self._read_frame(head, length, settings.client_body_timeout, guard)
                except TimeoutError:
                    self._timed_out(guard, transport.BODY_TIMEOUT)
                    return
                request = messages.decode_request(message)
            except (asyncio.IncompleteReadError, _ClosedMidFrame) as error:
                received = len(error.partial) if isinstance(error, asyncio.IncompleteReadError) else error.received
                if received:
                    if guard is not None:
                        guard.port.abandoned(received)
                    self.server.log.info("fluvio:closed-mid-frame", "Fluvio clients closed mid-frame", peer=self.peer, received=received)
                return
            except (ConnectionError, OSError):
                return
            except messages.FrameTooLarge as refused:
                self.server.log.warning(
                    "fluvio:frame-too-large",
                    "closing Fluvio connections: a frame larger than its API allows",
                    peer=self.peer,
                    api_key=refused.api_key,
                    api=messages.API_NAMES[refused.api_key],
                    length=refused.length,
                    limit=refused.limit,
                )
                return
            except primitives.DecodeError as error:
                self.server.log.warning(
                    "fluvio:undecodable",
                    "closing Fluvio connections: undecodable frame",
                    peer=self.peer,
                    error=ratelimit.excerpt(str(error)),
                )
                return
            del message  # up to max_frame_bytes, not kept while this request waits for room
            if guard is not None and guard.phase is not transport.Phase.BUSY:
                guard.request_started()  # a client that sent a whole frame is not evicted for a new one
            if not await self._dispatch(request):
                return

    async def _read_frame(self, head: bytes, length: int, pause: float, guard: transport.Guard | None) -> bytes:
        """A frame's ``length`` bytes, ``head`` (already read) first, as a request body is read
        (api.read_body): a large one waits for room in the port's buffered bytes, then goes into one
        buffer of its size (a growing buffer leaves copies and holes behind); TimeoutError after a
        pause of ``pause`` seconds, or when it is slower than the body rate allows."""
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as holding:
            if guard is not None:
                async with asyncio.timeout(pause):
                    await holding.enter_async_context(guard.port.budget.hold(length))
            deadline = loop.time() + transport.whole_body_seconds(pause, length)
            if length <= READ_CHUNK:
                async with asyncio.timeout_at(deadline):
                    return head + await self.reader.readexactly(length - len(head))
            frame = bytearray(length)
            with memoryview(frame) as view:
                view[: len(head)] = head
                filled = len(head)
                while filled < length:
                    async with asyncio.timeout_at(min(loop.time() + pause, deadline)):
                        chunk = await self.reader.read(min(length - filled, READ_CHUNK))
                    if not chunk:
                        raise _ClosedMidFrame(filled)
                    view[filled : filled + len(chunk)] = chunk
                    filled += len(chunk)
            return bytes(frame)

    async def _first_byte(self, idle: float) -> bytes | None:
        """The next frame's first byte; None once none came for ``idle`` seconds while this
        connection had no watch, no request in flight and no answer queued."""
        while True:
            try:
                async with asyncio.timeout(idle):
                    return await self.reader.readexactly(1)
            except TimeoutError:
                if not self._tasks and not self._replies:
                    return None

    def _timed_out(self, guard: transport.Guard | None, reason: str) -> None:
        if guard is not None:
            guard.timed_out(reason)
        else:
            self.server.log.info(
                f"fluvio:{reason}", "closing Fluvio connections: the client was too slow", peer=self.peer, reason=reason
            )

    async def _dispatch(self, request: messages.Request) -> bool:
        """Start answering one request; False when the connection must close."""
        header, body = request.header, request.body
        correlation_id, version = header.correlation_id, header.api_version
        if isinstance(body, messages.ApiVersionsRequest):
            self.reply(correlation_id, self.server.api_versions)
            return True
        if isinstance(body, (messages.ListRequest, messages.WatchRequest)) and isinstance(self.principal, auth.Unauthenticated):
            # A List or Watch answer has no error field: an empty one would lie, so the connection closes.
            self.server.log.warning("fluvio:unauthenticated", "closing Fluvio connections without a credential", peer=self.peer, reason=str(self.principal))
            return False
        if isinstance(body, (messages.ListRequest, messages.WatchRequest)):
            # Before the store has synced a list would be empty, not true.
            await self.server.context.synced.wait()
        if isinstance(body, messages.ListRequest):
            gate = self.server.context.gate
            try:
                answer = await self.server.list_body(body, version)
                release = None
                if len(answer) >= LARGE_BODY_BYTES:
                    # Writing it is expensive work too (a thousand clients taking the same 5 MB):
                    # the slot is held until it is written.
                    await gate.acquire(admission.FLUVIO_LIST)
                    release = gate.release
                self.reply(correlation_id, answer, release)
            except admission.Busy as busy:
                self.server.log.warning("fluvio:list-busy", "refusing Fluvio Lists: the SC is busy", peer=self.peer, label=body.label, reason=busy.message)
                self.reply(correlation_id, messages.list_body(BUSY_LABEL, []))
        elif isinstance(body, messages.WatchRequest):
            self._watches += 1
            if self._watches > MAX_WATCHES:
                self.server.log.warning("fluvio:too-many-watches", "closing Fluvio connections: too many watches", peer=self.peer, limit=MAX_WATCHES)
                return False
            watch = WatchStream(self, correlation_id, body.label, version)
            if watch.table is not None:
                # A watch holds a listener and what its client knows: it counts against the limits.
                # Its frames have no error field; closing tells the client, which can connect again later.
                try:
                    watch.watcher = self.server.context.watchers.admit("fluvio", watch.table.kind, self.address)
                except admission.Busy as busy:
                    self.server.log.warning("fluvio:watch-refused", "closing Fluvio connections: a watch was refused", peer=self.peer, reason=busy.message)
                    return False
                self.watchers.add(watch.watcher)
            self._spawn(watch.run(), "fluvio-watch")
        else:
            await self._slots.acquire()
            self._spawn(self._answer(correlation_id, version, body), "fluvio-request")
        return True

    @property
    def answering(self) -> bool:
        """Whether a create, delete or update is being answered, or an answer waits to be written."""
        return self._answering > 0 or bool(self._replies)

    async def _answer(
        self, correlation_id: int, version: int, body: messages.CreateRequest | messages.DeleteRequest | messages.UpdateRequest
    ) -> None:
        self._answering += 1
        try:
            status = await self.server.admin.answer(body, self.principal, version)
            self.reply(correlation_id, messages.encode_response_body(status, version))
        finally:
            self._answering -= 1
            self._slots.release()

    def _spawn(self, coroutine: Any, name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ writing

    def reply(self, correlation_id: int, body: bytes, release: Callable[[], None] | None = None) -> None:
        self._replies.append((messages.response_header(correlation_id, len(body)), body, release))
        self._wake.set()

    def watch_ready(self, watch: WatchStream) -> None:
        self._dirty[watch] = None
        self._wake.set()

    async def _write_loop(self) -> None:
        """Replies first, then one frame per ready watch in turn, built at send time so that changes
        arriving while the socket is busy coalesce into it."""
        while True:
            if self._replies:
                header, body, release = self._replies.popleft()
                self._room.set()
                try:
                    sent = await self._send(header, body)
                finally:
                    if release is not None:
                        release()
            elif self._dirty:
                watch = next(iter(self._dirty))
                del self._dirty[watch]
                frame = await watch.build_frame()
                if frame is None:
                    continue
                sent = await self._send(frame, b"")
            else:
                self._wake.clear()
                await self._wake.wait()
                continue
            if not sent:
                return

    async def _send(self, header: bytes, body: bytes) -> bool:
        """Write one frame (a large body in pieces, not copied); False when the connection is done
        for. A client that takes nothing for client_stall_seconds is dropped: its connection is
        aborted, since closing it politely would wait for the client to take what is queued."""
        stall = self.server.context.settings.client_stall_seconds
        if len(body) < LARGE_BODY_BYTES:
            pieces: list[bytes | memoryview] = [header + body]
        else:
            view = memoryview(body)
            pieces = [header, *(view[start : start + LARGE_BODY_BYTES] for start in range(0, len(body), LARGE_BODY_BYTES))]
        try:
            for piece in pieces:
                self.writer.write(piece)
                async with asyncio.timeout(stall):
                    await self.writer.drain()
        except TimeoutError:
            self.server.log.warning(
                "fluvio:write-stall", "dropping Fluvio connections: the client took nothing for a while", peer=self.peer, seconds=stall
            )
            for watcher in self.watchers:
                watcher.dropped("stalled")
            self.writer.transport.abort()
            return False
        except (ConnectionError, OSError):
            return False
        return True


class WatchStream:
    """One Watch request: a snapshot frame first, then UPDATE/DELETE frames of what changed.

    Level-based like the HTTP watch: states the client did not see yet are coalesced into the
    latest one, so nothing queues up per client in the daemon.
    """

    def __init__(self, session: Session, correlation_id: int, label: str, version: int) -> None:
        self.session = session
        self.correlation_id = correlation_id
        self.label = label
        self.version = version
        served = mapping.ITEMS.get(label)
        self.table: local.KindStore[Any] | None = None
        self.keep: Callable[[models.AnyObject], bool] | None = None
        if served is not None:
            kind, self.keep, _ = served
            self.table = session.server.context.local_store[kind]
        self.listener: local.Listener[Any] | None = None
        self.watcher: admission.Watcher | None = None
        self.known: dict[str, models.AnyObject] = {}
        self.first = True
        self._built = asyncio.Event()

    async def run(self) -> None:
        if self.table is None:
            # Not a type we serve (SmartModule, ...): one empty snapshot, which the client ignores.
            self.session.watch_ready(self)
            return
        self.listener = self.table.listener(local.Part.ALL)
        try:
            while True:
                await self.listener.wait()
                if not self.first:
                    await asyncio.sleep(WATCH_LINGER_SECONDS)
                self._built.clear()
                self.session.watch_ready(self)
                await self._built.wait()
        finally:
            self.listener.close()

    async def build_frame(self) -> bytes | None:
        """The next frame (None if nothing visible changed since the last)."""
        self._built.set()
        if self.table is None or self.listener is None:
            return messages.response_frame(self.correlation_id, messages.watch_body(self.label, 0, [], []))
        changes = self.listener.changes()
        if self.first:
            self.first = False
            objects = [entry.obj for entry in changes.updated if self.keep is None or self.keep(entry.obj)]
            objects.sort(key=_SORT_KEYS.get(self.table.kind, lambda obj: obj.name))
            self.known = {obj.name: obj for obj in objects}
            encoded = await self.session.server.encode_all(self.label, self.version, objects)
            snapshot = [item for item in encoded if item is not None]
            return messages.response_frame(self.correlation_id, messages.watch_body(self.label, changes.epoch, [], snapshot))
        changed = self._messages(changes)
        if not changed:
            return None
        items = await self.session.server.encode_all(self.label, self.version, [obj for _, obj in changed])
        told = [(header, item) for (header, _), item in zip(changed, items, strict=True) if item is not None]
        self.session.server.items.prune(self.label, self.version, self.table.view)
        return messages.response_frame(self.correlation_id, messages.watch_body(self.label, changes.epoch, told, []))

    def _messages(self, changes: local.Changes[models.AnyObject]) -> list[tuple[messages.MessageType, models.AnyObject]]:
        changed: list[tuple[messages.MessageType, models.AnyObject]] = []
        known = self.known
        updated = [entry.obj for entry in changes.updated]
        if changes.full:
            # Behind a resync fence: whatever the client knows that is gone now was deleted.
            fresh = {obj.name for obj in updated}
            for name in [name for name in known if name not in fresh]:
                changed.append((messages.MessageType.DELETE, known.pop(name)))
        # Deletions first: a name also updated was created again, and the client is told of a new object.
        for name in changes.deleted:
            gone = known.pop(name, None)
            if gone is not None:
                changed.append((messages.MessageType.DELETE, gone))
        for obj in updated:
            previous = known.get(obj.name)
            if self.keep is not None and not self.keep(obj):
                if previous is not None:
                    changed.append((messages.MessageType.DELETE, known.pop(obj.name)))
                continue
            if previous is None or (previous is not obj and previous != obj):
                changed.append((messages.MessageType.UPDATE, obj))
                known[obj.name] = obj
        return changed

