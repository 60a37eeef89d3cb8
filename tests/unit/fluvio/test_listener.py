"""One public port, two protocols: HTTP answers as before, Fluvio frames reach the Fluvio server, and a
bad frame closes only its own connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import structlog

from connection_manager import ratelimit, transport
from controller import config
from controller.api.fluvio import client as client_module, messages, objects, server as server_module
from tests.fixtures import daemon as daemon_fixtures


@pytest.fixture
async def fluvio_sc() -> AsyncIterator[daemon_fixtures.Running]:
    settings = config.Settings(store=config.StoreKind.MEMORY, **daemon_fixtures.COMMON_SETTINGS)
    async with daemon_fixtures.running(settings) as handle:
        yield handle


async def connect(sc: daemon_fixtures.Running) -> client_module.Client:
    assert sc.daemon.public_port is not None
    return await client_module.Client.connect("127.0.0.1", sc.daemon.public_port)


async def closed_by_server(client: client_module.Client) -> None:
    async with asyncio.timeout(5):
        await client.closed.wait()


async def test_http_and_fluvio_share_the_port(fluvio_sc: daemon_fixtures.Running) -> None:
    client = await connect(fluvio_sc)
    try:
        assert await fluvio_sc.call("GET", "/healthz") == (200, {"status": "ok"})
        await fluvio_sc.register_spu(0)
        assert [meta.name for meta in await client.list(objects.SPU)] == ["spu-0"]
        assert await fluvio_sc.call("GET", "/v1/nothing/here") == (
            404,
            {"error": {"code": "NotFound", "message": "unknown kind 'nothing': use one of spus, spu-groups, topics, partitions"}},
        )
    finally:
        await client.close()


async def test_raw_http_bytes_still_get_an_http_answer(fluvio_sc: daemon_fixtures.Running) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", fluvio_sc.daemon.public_port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b'{"status": "ok"}')


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(messages.frame(bytes.fromhex("03eb 0013 00000002 0000 0005546f706963 00000003 000000")), id="short-list-payload"),
        pytest.param(messages.frame(bytes.fromhex("03ed 0013 00000002 0000")), id="unserved-api-key"),
        pytest.param(messages.frame(bytes.fromhex("03eb 0013 00000002 0000 0005546f706963 00000006 00000000 0200")), id="bad-bool"),
        # A length alone waits for its API key, up to the header timeout (test_overload.py).
        pytest.param((server_module.MAX_FRAME_BYTES + 1).to_bytes(4, "big") + messages.LIST.to_bytes(2, "big"), id="oversized"),
    ],
)
async def test_a_bad_frame_closes_only_its_connection(fluvio_sc: daemon_fixtures.Running, bad: bytes) -> None:
    victim, bystander = await connect(fluvio_sc), await connect(fluvio_sc)
    try:
        watch = bystander.watch(objects.SPU)
        await asyncio.wait_for(watch.get(), 5)  # the (empty) snapshot
        victim.send_raw(bad)
        await closed_by_server(victim)
        assert await bystander.list(objects.TOPIC) == []
        assert await fluvio_sc.call("GET", "/healthz") == (200, {"status": "ok"})
        await fluvio_sc.register_spu(1)  # the bystander's watch still streams
        update = (await asyncio.wait_for(watch.get(), 5)).update
        assert [(m.header, m.content.name) for m in update.changes] == [(messages.MessageType.UPDATE, "spu-1")]
    finally:
        await victim.close()
        await bystander.close()


async def test_a_connection_closed_before_its_first_byte_is_harmless(fluvio_sc: daemon_fixtures.Running) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", fluvio_sc.daemon.public_port)
    writer.close()
    await writer.wait_closed()
    assert await fluvio_sc.call("GET", "/healthz") == (200, {"status": "ok"})


async def test_a_frame_of_the_largest_size_is_served_as_fluvio() -> None:
    # Its length starts with 0x01, not 0x00: it is still a Fluvio frame, not an HTTP request. Only a
    # Create may be that large, and only on a store whose requests hold it.
    settings = config.Settings(store=config.StoreKind.MEMORY, etcd_max_request_bytes=server_module.MAX_FRAME_BYTES, **daemon_fixtures.COMMON_SETTINGS)
    request = messages.encode_request(
        messages.RequestHeader(messages.CREATE, 19, 7, "big"), messages.CreateRequest("SmartModule", "module", spec=b"")
    )
    message = request[4:] + b"\0" * (server_module.MAX_FRAME_BYTES - len(request) + 4)  # trailing bytes are ignored
    assert len(message) == server_module.MAX_FRAME_BYTES
    async with daemon_fixtures.running(settings) as fluvio_sc:
        answer = await send_and_read_answer(fluvio_sc, message)
    assert int.from_bytes(answer[:4], "big") == 7  # the Create's correlation id: answered as Fluvio


async def send_and_read_answer(fluvio_sc: daemon_fixtures.Running, message: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", fluvio_sc.daemon.public_port)
    try:
        writer.write(len(message).to_bytes(4, "big") + message)
        async with asyncio.timeout(30):
            answer = await reader.readexactly(messages.frame_length(await reader.readexactly(4)))
    finally:
        writer.close()
        await writer.wait_closed()
    return answer


@pytest.fixture
def held_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes the public port's byte budget was asked to hold, in order."""
    sizes: list[int] = []
    hold = transport.Budget.hold

    @contextlib.asynccontextmanager
    async def recording_hold(budget: transport.Budget, size: int) -> AsyncIterator[None]:
        sizes.append(size)
        async with hold(budget, size):
            yield

    monkeypatch.setattr(transport.Budget, "hold", recording_hold)
    return sizes


# The memory store's default request limit (etcd's 1.5 MiB) and 64 KiB: the largest topic create stored.
CREATE_LIMIT = 1_572_864 + 65_536


@pytest.mark.parametrize(
    ("api_key", "name", "length", "limit"),
    [
        pytest.param(messages.LIST, "List", server_module.MAX_FRAME_BYTES, 65_536, id="list-of-16-MiB"),
        pytest.param(messages.DELETE, "Delete", server_module.MAX_FRAME_BYTES, 65_536, id="delete-of-16-MiB"),
        pytest.param(messages.WATCH, "Watch", 65_537, 65_536, id="watch"),
        pytest.param(messages.UPDATE, "Update", 65_537, 65_536, id="update"),
        pytest.param(messages.API_VERSIONS, "ApiVersions", 1_000_000, 65_536, id="api-versions"),
        pytest.param(messages.CREATE, "Create", CREATE_LIMIT + 1, CREATE_LIMIT, id="create-above-one-etcd-request"),
        pytest.param(messages.CREATE, "Create", server_module.MAX_FRAME_BYTES, CREATE_LIMIT, id="create-of-16-MiB"),
        # Above every frame the port takes: still named by its API and judged by that API's limit.
        pytest.param(messages.LIST, "List", server_module.MAX_FRAME_BYTES + 1, 65_536, id="list-above-the-port-limit"),
        pytest.param(messages.CREATE, "Create", 2**31 - 1, CREATE_LIMIT, id="create-of-2-GiB"),
    ],
)
async def test_a_frame_larger_than_its_api_allows_is_refused_at_its_header(
    fluvio_sc: daemon_fixtures.Running, held_sizes: list[int], api_key: int, name: str, length: int, limit: int
) -> None:
    """Only the length and the API key are sent: the connection closes without waiting for the rest,
    and the frame never had room in the port's byte budget. A bystander is unaffected."""
    victim, bystander = await connect(fluvio_sc), await connect(fluvio_sc)
    try:
        with structlog.testing.capture_logs() as logged:
            victim.send_raw(length.to_bytes(4, "big") + api_key.to_bytes(2, "big"))
            await closed_by_server(victim)
        assert await bystander.list(objects.TOPIC) == []
    finally:
        await victim.close()
        await bystander.close()
    refusals = [entry for entry in logged if entry["event"] == "closing Fluvio connections: a frame larger than its API allows"]
    assert [{key: entry[key] for key in ("log_level", "api_key", "api", "length", "limit")} for entry in refusals] == [
        {"log_level": "warning", "api_key": api_key, "api": name, "length": length, "limit": limit}
    ]
    assert length not in held_sizes


async def test_an_unserved_api_key_is_refused_at_its_header(fluvio_sc: daemon_fixtures.Running, held_sizes: list[int]) -> None:
    victim = await connect(fluvio_sc)
    try:
        with structlog.testing.capture_logs() as logged:
            victim.send_raw(server_module.MAX_FRAME_BYTES.to_bytes(4, "big") + (1005).to_bytes(2, "big"))  # Mirroring
            await closed_by_server(victim)
    finally:
        await victim.close()
    assert [entry["error"] for entry in logged if entry["event"] == "closing Fluvio connections: undecodable frame"] == [
        ratelimit.excerpt("API key 1005 is not one this SC serves (known: [18, 1001, 1002, 1003, 1004, 1006])")
    ]
    assert server_module.MAX_FRAME_BYTES not in held_sizes


async def test_the_largest_legitimate_requests_other_than_create_are_answered(fluvio_sc: daemon_fixtures.Running) -> None:
    """The most name filters a List may carry, each of the longest name, and a Delete and an Update
    of the longest name, all far below their limit."""
    longest = [f"{index:02d}" + "x" * 61 for index in range(messages.MAX_NAME_FILTERS)]
    client = await connect(fluvio_sc)
    try:
        assert await client.list(objects.SPU, *longest) == []
        assert await client.list(objects.TOPIC, *longest) == []
        name = longest[0]
        assert await client.status(messages.DELETE, messages.DeleteRequest(objects.TOPIC, name)) == messages.Status(
            name, messages.ErrorCode(messages.Error.TOPIC_NOT_FOUND), f"Topic {name!r} not found"
        )
        update = messages.UpdateRequest(objects.TOPIC, name, messages.AddPartition(1))
        assert (await client.status(messages.UPDATE, update)).error_code == messages.ErrorCode(messages.Error.TOPIC_NOT_FOUND)
    finally:
        await client.close()
