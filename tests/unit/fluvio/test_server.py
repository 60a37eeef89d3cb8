"""The Fluvio server's reads on a local store the test drives directly (no Reader, no controllers):
ApiVersions, List filters, Watch snapshots, coalesced change frames, and the writer's order."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from controller import config, context as context_module, metrics
from controller.api.fluvio import client as client_module, mapping, messages, objects as fluvio_objects, server as server_module
from store import local, memory, models
from tests import builders

Topic = models.Topic


def topic(name: str, resolution: str = "Provisioned", partitions: int = 1) -> models.Topic:
    """Provisioned by default, with the replica map that goes with it: what Fluvio clients list."""
    replica_map = {str(index): [index % 3] for index in range(partitions)} if resolution == "Provisioned" else {}
    return builders.topic(name, partitions, resolution=resolution, replica_map=replica_map)


class StoreServer:
    """A FluvioServer on 127.0.0.1 over a local store that the test writes itself."""

    def __init__(self, settings: config.Settings | None = None) -> None:
        self.local_store = local.LocalStore()
        self.context = context_module.Context(
            settings=settings or config.Settings(),
            kv_store=memory.MemoryStore(),
            local_store=self.local_store,
            metrics=metrics.Metrics(),
        )
        self.server = server_module.FluvioServer(self.context)
        self.revision = 0
        self.listening: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        for table in self.local_store.tables.values():
            table.resync([], 0)
        self.local_store.meta.resync([], 0)
        self.context.synced.set()
        await self.server.start()
        loop = asyncio.get_running_loop()
        self.listening = await loop.create_server(self.server.protocol, "127.0.0.1", 0)
        self.port = self.listening.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.listening is not None
        self.listening.close()
        await self.server.close()
        await self.context.lists.close()
        await self.context.kv_store.close()

    def apply(self, *objs: models.AnyObject) -> None:
        for obj in objs:
            self.revision += 1
            self.local_store[obj.kind].apply(obj, self.revision)

    def delete(self, kind: str, name: str) -> None:
        self.revision += 1
        self.local_store[kind].delete(name, self.revision)

    async def client(self) -> client_module.Client:
        return await client_module.Client.connect("127.0.0.1", self.port)


@pytest.fixture
async def store_server() -> AsyncIterator[StoreServer]:
    running = StoreServer()
    await running.start()
    yield running
    await running.stop()


@pytest.fixture
async def client(store_server: StoreServer) -> AsyncIterator[client_module.Client]:
    connected = await store_server.client()
    yield connected
    await connected.close()


def item(label: str, obj: models.AnyObject) -> fluvio_objects.Metadata:
    return mapping.ITEMS[label][2](obj)


async def next_frame(queue: asyncio.Queue[messages.WatchResponse], timeout: float = 5.0) -> messages.MetadataUpdate:
    async with asyncio.timeout(timeout):
        return (await queue.get()).update


# ---------------------------------------------------------------------------- ApiVersions and List


async def test_api_versions_advertise_exactly_the_apis_served(client: client_module.Client) -> None:
    assert client.api_versions == messages.ApiVersionsResponse(
        api_keys=[messages.ApiVersionKey(key, 11, 19) for key in (1001, 1002, 1003, 1004, 1006)], platform_version="0.17.3"
    )


async def test_topic_filters_are_substrings_or_ed_and_system_lists_none(store_server: StoreServer, client: client_module.Client) -> None:
    store_server.apply(topic("gamma"), topic("alpha"), topic("beta"))
    assert [meta.name for meta in await client.list(fluvio_objects.TOPIC)] == ["alpha", "beta", "gamma"]
    assert await client.list(fluvio_objects.TOPIC, "al", "mm") == [item(fluvio_objects.TOPIC, topic("alpha")), item(fluvio_objects.TOPIC, topic("gamma"))]
    assert await client.list(fluvio_objects.TOPIC, "zzz") == []
    assert await client.list(fluvio_objects.TOPIC, system=True) == []


async def test_lists_of_distinct_long_filters_keep_no_more_answers_than_the_cache_has_room_for() -> None:
    # A List's name filters are part of the key its answer is kept under: 8 filters of 7,000
    # characters each (in a frame below the 64 KiB a List may take) hold some 56 KB, however empty
    # the answer. 256 KiB has room for 4 of them.
    async with serving(list_cache_bytes=1 << 18) as store_server:
        store_server.apply(topic("alpha"))
        connected = await store_server.client()
        try:
            for number in range(40):
                filters = [f"{number:02d}{index}" + "x" * 7_000 for index in range(8)]
                assert await connected.list(fluvio_objects.TOPIC, *filters) == []
        finally:
            await connected.close()
        answers = store_server.context.lists.answers
        assert len(answers) <= 4
        assert answers.bytes <= answers.limit_bytes


async def test_partition_lists_ignore_filters_and_sort_by_index(store_server: StoreServer, client: client_module.Client) -> None:
    store_server.apply(builders.partition("orders-10", [1]), builders.partition("orders-2", [0]), builders.partition("audit-0", [2]))
    assert [meta.name for meta in await client.list(fluvio_objects.PARTITION, "nothing-matches")] == ["audit-0", "orders-2", "orders-10"]
    assert await client.list(fluvio_objects.PARTITION, system=True) == []


async def test_spu_lists_show_managed_and_custom_custom_spu_lists_only_custom(
    store_server: StoreServer, client: client_module.Client
) -> None:
    managed = builders.spu(2, name="main-0", spu_type="Managed")
    custom = builders.spu(7, name="edge-7")
    store_server.apply(custom, managed)
    assert await client.list(fluvio_objects.SPU) == [item(fluvio_objects.SPU, managed), item(fluvio_objects.SPU, custom)]
    assert await client.list(fluvio_objects.CUSTOM_SPU) == [item(fluvio_objects.CUSTOM_SPU, custom)]
    assert await client.list(fluvio_objects.SPU, "edge") == [item(fluvio_objects.SPU, custom)]


async def test_unserved_labels_list_empty_with_their_label(client: client_module.Client) -> None:
    answer = await client.request(messages.LIST, messages.ListRequest("SmartModule"))
    assert answer == messages.ListResponse("SmartModule", [])


async def test_objects_the_protocol_cannot_carry_are_left_out(store_server: StoreServer, client: client_module.Client) -> None:
    # 70,000 partitions do not fit TopicStatus.replica_map's u16 count.
    store_server.apply(topic("huge", partitions=70_000), topic("small"))
    assert [meta.name for meta in await client.list(fluvio_objects.TOPIC)] == ["small"]


# ---------------------------------------------------------------------------- Watch


async def test_watch_sends_a_snapshot_then_updates_and_deletes(store_server: StoreServer, client: client_module.Client) -> None:
    store_server.apply(topic("b"), topic("a"))
    frames = client.watch(fluvio_objects.TOPIC)
    snapshot = await next_frame(frames)
    assert (snapshot.changes, snapshot.all) == ([], [item(fluvio_objects.TOPIC, topic("a")), item(fluvio_objects.TOPIC, topic("b"))])
    assert snapshot.epoch == store_server.local_store["topics"].epoch

    store_server.apply(topic("c", "Pending"))
    update = await next_frame(frames)
    assert (update.changes, update.all) == ([messages.Message(messages.MessageType.UPDATE, item(fluvio_objects.TOPIC, topic("c", "Pending")))], [])

    store_server.delete("topics", "a")
    deleted = await next_frame(frames)
    assert deleted.changes == [messages.Message(messages.MessageType.DELETE, item(fluvio_objects.TOPIC, topic("a")))]
    assert deleted.epoch == store_server.local_store["topics"].epoch


async def test_a_burst_of_changes_is_one_frame_in_store_order(store_server: StoreServer, client: client_module.Client) -> None:
    frames = client.watch(fluvio_objects.TOPIC)
    assert (await next_frame(frames)).all == []  # the empty snapshot
    names = [f"t-{index}" for index in range(500)]
    for name in names:
        store_server.apply(topic(name, "Init"))  # no await between: the client must get one frame
    for name in names[:3]:
        store_server.apply(topic(name, "Pending"))
    store_server.delete("topics", names[3])
    frame = await next_frame(frames)
    # Latest state only, in the order of each object's last change; t-3 came and went unseen.
    assert [(message.header, message.content.name) for message in frame.changes] == (
        [(messages.MessageType.UPDATE, name) for name in names[4:] + names[:3]]
    )
    assert frame.changes[-1].content.status.resolution is fluvio_objects.TopicResolution.PENDING
    store_server.delete("topics", names[0])
    assert (await next_frame(frames)).changes == [messages.Message(messages.MessageType.DELETE, item(fluvio_objects.TOPIC, topic(names[0], "Pending")))]
    store_server.apply(topic("last"))
    assert [message.content.name for message in (await next_frame(frames)).changes] == ["last"]
    assert frames.empty()


async def test_unchanged_rewrites_send_nothing(store_server: StoreServer, client: client_module.Client) -> None:
    store_server.apply(topic("a"))
    frames = client.watch(fluvio_objects.TOPIC)
    await next_frame(frames)
    store_server.apply(topic("a"))  # same content at a new revision: no epoch, no wake-up
    store_server.apply(topic("z"))
    assert [message.content.name for message in (await next_frame(frames)).changes] == ["z"]


async def test_a_resync_that_lost_an_object_sends_its_delete(store_server: StoreServer, client: client_module.Client) -> None:
    store_server.apply(topic("kept"), topic("lost"))
    frames = client.watch(fluvio_objects.TOPIC)
    await next_frame(frames)
    store_server.local_store["topics"].resync([(topic("kept"), 1, 1), (topic("new"), 9, 9)], 9)
    frame = await next_frame(frames)
    assert sorted((message.header, message.content.name) for message in frame.changes) == [
        (messages.MessageType.UPDATE, "new"),
        (messages.MessageType.DELETE, "lost"),
    ]


async def test_an_object_deleted_and_created_again_between_two_frames_is_deleted_then_updated(
    store_server: StoreServer, client: client_module.Client
) -> None:
    """Even with the very same content: the client is told the old object is gone and a new one
    is there. Before, it was told nothing (the re-creation hid the delete)."""
    store_server.apply(topic("a"))
    frames = client.watch(fluvio_objects.TOPIC)
    await next_frame(frames)
    store_server.delete("topics", "a")
    store_server.apply(topic("a"))  # no await between: one frame
    frame = await next_frame(frames)
    assert [(message.header, message.content.name) for message in frame.changes] == [
        (messages.MessageType.DELETE, "a"),
        (messages.MessageType.UPDATE, "a"),
    ]


async def test_an_object_deleted_and_created_again_while_the_watch_was_down_is_deleted_then_updated(
    store_server: StoreServer, client: client_module.Client
) -> None:
    """The same, learnt from a relist: the listing holds "a" under a new create revision. Before,
    the client was told nothing (the relist was taken for an update of the same content)."""
    store_server.apply(topic("a"), topic("b"))
    frames = client.watch(fluvio_objects.TOPIC)
    await next_frame(frames)
    store_server.local_store["topics"].resync([(topic("a"), 7, 7), (topic("b"), 2, 2)], 8)
    frame = await next_frame(frames)
    assert [(message.header, message.content.name) for message in frame.changes] == [
        (messages.MessageType.DELETE, "a"),
        (messages.MessageType.UPDATE, "a"),
    ]


async def test_custom_spu_watch_shows_only_custom_spus(store_server: StoreServer, client: client_module.Client) -> None:
    custom = builders.spu(7, name="edge-7")
    store_server.apply(custom, builders.spu(2, name="main-0", spu_type="Managed"))
    frames = client.watch(fluvio_objects.CUSTOM_SPU)
    assert (await next_frame(frames)).all == [item(fluvio_objects.CUSTOM_SPU, custom)]
    store_server.apply(builders.spu(3, name="main-1", spu_type="Managed"), builders.spu(8, name="edge-8"))
    frame = await next_frame(frames)
    assert [(message.header, message.content.name) for message in frame.changes] == [(messages.MessageType.UPDATE, "edge-8")]


async def test_unserved_watch_labels_get_one_empty_snapshot(client: client_module.Client) -> None:
    frames = client.watch("SmartModule")
    assert await next_frame(frames) == messages.MetadataUpdate(0, [], [])
    assert (await client.list(fluvio_objects.TOPIC)) == []  # the connection still answers
    assert frames.empty()


async def test_several_watches_and_replies_share_one_connection(store_server: StoreServer, client: client_module.Client) -> None:
    topics, spus = client.watch(fluvio_objects.TOPIC), client.watch(fluvio_objects.SPU)
    await next_frame(topics), await next_frame(spus)
    store_server.apply(topic("a"), builders.spu(1))
    assert [m.content.name for m in (await next_frame(topics)).changes] == ["a"]
    assert [m.content.name for m in (await next_frame(spus)).changes] == ["spu-1"]
    assert [meta.name for meta in await client.list(fluvio_objects.TOPIC)] == ["a"]


# ---------------------------------------------------------------------------- the writer


class UnguardedTransport:
    """The transport of a connection no Listener accepted (no guard)."""

    def get_protocol(self) -> None:
        return None

    def abort(self) -> None:
        return None


class RecordingWriter:
    """A StreamWriter stand-in that records what the session writes."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.written = asyncio.Event()
        self.transport = UnguardedTransport()

    def write(self, data: bytes) -> None:
        self.frames.append(data)
        self.written.set()

    async def drain(self) -> None:
        return None

    def get_extra_info(self, name: str) -> Any:
        return None

    def close(self) -> None:
        return None

    async def wait_closed(self) -> None:
        return None


async def test_replies_go_out_before_pending_watch_frames(store_server: StoreServer) -> None:
    writer = RecordingWriter()
    session = server_module.Session(store_server.server, asyncio.StreamReader(), writer)  # type: ignore[arg-type]  # a recording stand-in for the StreamWriter
    watch = server_module.WatchStream(session, 3, fluvio_objects.TOPIC, 19)
    watch.listener = listener = store_server.local_store["topics"].listener()
    session.watch_ready(watch)
    session.reply(9, b"reply")
    loop = asyncio.create_task(session._write_loop())
    try:
        async with asyncio.timeout(5):
            while len(writer.frames) < 2:
                writer.written.clear()
                await writer.written.wait()
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        listener.close()
    assert writer.frames[0] == messages.response_frame(9, b"reply")
    epoch = store_server.local_store["topics"].epoch
    assert writer.frames[1] == messages.response_frame(3, messages.watch_body(fluvio_objects.TOPIC, epoch, [], []))


class BlockedWriter(RecordingWriter):
    """A client that has stopped reading: every drain waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = asyncio.Event()

    async def drain(self) -> None:
        await self.reading.wait()


async def test_a_client_that_stops_reading_stops_being_read(store_server: StoreServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its next frame is left unread, not decoded and held while the queue waits: a decoded request
    is ten to forty times its frame (a 16 MiB create held 170 MB for client_stall_seconds)."""
    monkeypatch.setattr(server_module, "MAX_QUEUED_REPLIES", 2)
    decoded: list[bytes] = []
    decode = messages.decode_request

    def counting(message: bytes) -> messages.Request:
        decoded.append(message)
        return decode(message)

    monkeypatch.setattr(messages, "decode_request", counting)
    reader = asyncio.StreamReader()
    writer = BlockedWriter()
    session = server_module.Session(store_server.server, reader, writer)  # type: ignore[arg-type]  # a recording stand-in for the StreamWriter
    for correlation_id in range(1, 5):
        reader.feed_data(messages.encode_request(messages.RequestHeader(messages.LIST, 19, correlation_id), messages.ListRequest(fluvio_objects.TOPIC)))
    running = asyncio.create_task(session.run())
    try:
        async with asyncio.timeout(5):
            while len(session._replies) < 2:  # one being written (its drain blocks), two queued
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert len(decoded) == 3 and len(writer.frames) == 1
        writer.reading.set()
        async with asyncio.timeout(5):
            while len(writer.frames) < 4:
                writer.written.clear()
                await writer.written.wait()
        assert len(decoded) == 4
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_too_many_watches_close_the_connection(client: client_module.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "MAX_WATCHES", 3)
    watches = [client.watch(fluvio_objects.TOPIC) for _ in range(3)]
    for frames in watches:
        await next_frame(frames)
    client.watch(fluvio_objects.SPU)
    async with asyncio.timeout(5):
        await client.closed.wait()


async def test_a_list_with_more_name_filters_than_any_client_sends_closes_the_connection(store_server: StoreServer) -> None:
    # Each filter is tried on every object, on the event loop: 2 million filters (a 16 MiB frame)
    # against 1,000 topics held the loop for two minutes, SPU heartbeats included.
    store_server.apply(topic("alpha"), topic("beta"))
    connected = await store_server.client()
    try:
        many = [f"f{index}" for index in range(10_000)]
        allowed = many[: messages.MAX_NAME_FILTERS - 1]
        assert await connected.list(fluvio_objects.TOPIC, *allowed, "alp") == [item(fluvio_objects.TOPIC, topic("alpha"))]
        with pytest.raises(ConnectionError):
            await connected.list(fluvio_objects.TOPIC, *many)
        async with asyncio.timeout(5):
            await connected.closed.wait()
    finally:
        await connected.close()


async def test_large_answers_are_encoded_in_chunks_between_other_work(
    store_server: StoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "ENCODE_CHUNK", 10)
    store_server.apply(*(topic(f"t-{index:03d}") for index in range(100)))
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    ticker = asyncio.create_task(other_work())
    try:
        await asyncio.sleep(0)  # the ticker starts
        before = ticks
        body = await store_server.server.list_body(messages.ListRequest(fluvio_objects.TOPIC), 19)
        during = ticks - before
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    assert during >= 9  # the loop ran other work between the ten chunks
    assert messages.decode_response(messages.response_frame(1, body)[4:], messages.LIST, 19)[1] == messages.ListResponse(
        fluvio_objects.TOPIC, [item(fluvio_objects.TOPIC, topic(f"t-{index:03d}")) for index in range(100)]
    )


# ---------------------------------------------------------------------------- load


@contextlib.asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[StoreServer]:
    running = StoreServer(config.Settings(**settings))
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


async def test_a_client_that_takes_nothing_is_dropped_at_the_stall_deadline_and_its_socket_closed() -> None:
    async with serving(client_stall_seconds=0.2) as store_server:
        # A 6 MB snapshot: more than the socket buffers take.
        store_server.apply(*(topic(f"t{number:03d}").model_copy(update={"status": models.TopicStatus(reason="x" * 20_000)}) for number in range(300)))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", store_server.port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
        try:
            writer.transport.pause_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
            writer.write(messages.encode_request(messages.RequestHeader(messages.WATCH, 19, 1, "slow"), messages.WatchRequest(fluvio_objects.TOPIC)))
            async with asyncio.timeout(30):
                while store_server.server._sessions or store_server.context.watchers.total:
                    await asyncio.sleep(0.01)
            assert store_server.context.watchers.dropped == {("fluvio", "stalled"): 1}
            writer.transport.resume_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
            with contextlib.suppress(ConnectionResetError):
                async with asyncio.timeout(30):
                    while await reader.read(1 << 16):
                        pass  # what the kernel had buffered, then the end: the SC's side is gone
        finally:
            writer.close()


async def test_identical_lists_share_one_answer_and_a_busy_sc_refuses_a_list_but_keeps_the_connection() -> None:
    async with serving(max_expensive_requests=1, max_expensive_queue=0) as store_server:
        store_server.apply(topic("b"), topic("a"))
        clients = [await store_server.client() for _ in range(5)]
        try:
            answers = await asyncio.gather(*(client.list(fluvio_objects.TOPIC) for client in clients))
            assert all(answer == [item(fluvio_objects.TOPIC, topic("a")), item(fluvio_objects.TOPIC, topic("b"))] for answer in answers)
            served = store_server.context.lists.answers.served
            assert served["built"] + served["shared"] + served["cached"] == 5 and served["built"] == 1
            async with store_server.context.gate.slot("placement"):
                refused = await clients[0].request(messages.LIST, messages.ListRequest(fluvio_objects.SPU))
                assert refused == messages.ListResponse(server_module.BUSY_LABEL, [])
                assert store_server.context.gate.refused == {"fluvio-list": 1}
                # The answer kept for this table needs no slot.
                assert await clients[0].list(fluvio_objects.TOPIC) == answers[0]
            assert [meta.name for meta in await clients[0].list(fluvio_objects.SPU)] == []
        finally:
            for client in clients:
                await client.close()


async def test_a_large_list_holds_a_gate_slot_until_written_and_a_stalled_reader_gives_it_back() -> None:
    async with serving(client_stall_seconds=0.2) as store_server:
        store_server.apply(*(topic(f"t{number:03d}").model_copy(update={"status": models.TopicStatus(reason="x" * 20_000)}) for number in range(300)))
        gate = store_server.context.gate
        client = await store_server.client()
        try:
            assert len(await client.list(fluvio_objects.TOPIC)) == 300  # 6 MB, taken: the slot is back
            assert (gate.running, gate.admitted) == (0, {"fluvio-list": 2})  # one to build, one to write
        finally:
            await client.close()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", store_server.port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
        try:
            writer.transport.pause_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
            writer.write(messages.encode_request(messages.RequestHeader(messages.LIST, 19, 1, "slow"), messages.ListRequest(fluvio_objects.TOPIC)))
            async with asyncio.timeout(30):
                while gate.admitted["fluvio-list"] < 3:  # the kept answer: only the writing takes one
                    await asyncio.sleep(0.01)
                while store_server.server._sessions:
                    await asyncio.sleep(0.01)
            assert gate.running == 0
        finally:
            writer.close()


async def test_watches_past_the_limit_close_the_connection() -> None:
    async with serving(max_watchers=2) as store_server:
        first = await store_server.client()
        try:
            topics, partitions = first.watch(fluvio_objects.TOPIC), first.watch(fluvio_objects.PARTITION)
            await next_frame(topics)
            await next_frame(partitions)
            assert store_server.context.watchers.open == {("fluvio", "topics"): 1, ("fluvio", "partitions"): 1}
            second = await store_server.client()
            try:
                second.watch(fluvio_objects.SPU)
                async with asyncio.timeout(5):
                    await second.closed.wait()
                assert store_server.context.watchers.refused == {"fluvio": 1}
            finally:
                await second.close()
            first.watch("SmartModule")  # not served: no listener, not counted
            assert (await next_frame(first.watch("SmartModule"))).all == []
        finally:
            await first.close()
        async with asyncio.timeout(5):
            while store_server.context.watchers.total:
                await asyncio.sleep(0.01)
