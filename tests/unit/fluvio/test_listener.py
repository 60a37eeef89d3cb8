"""One public port, two protocols: HTTP answers as before, Fluvio frames reach the Fluvio server, and a
bad frame closes only its own connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

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
        pytest.param((server_module.MAX_FRAME_BYTES + 1).to_bytes(4, "big"), id="oversized"),
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


async def test_a_frame_of_the_largest_size_is_served_as_fluvio(fluvio_sc: daemon_fixtures.Running) -> None:
    # Its length starts with 0x01, not 0x00: it is still a Fluvio frame, not an HTTP request.
    request = messages.encode_request(messages.RequestHeader(messages.LIST, 19, 7, "big"), messages.ListRequest(objects.TOPIC))
    message = request[4:] + b"\0" * (server_module.MAX_FRAME_BYTES - len(request) + 4)  # trailing bytes are ignored
    assert len(message) == server_module.MAX_FRAME_BYTES
    reader, writer = await asyncio.open_connection("127.0.0.1", fluvio_sc.daemon.public_port)
    try:
        writer.write(len(message).to_bytes(4, "big") + message)
        async with asyncio.timeout(30):
            answer = await reader.readexactly(messages.frame_length(await reader.readexactly(4)))
    finally:
        writer.close()
        await writer.wait_closed()
    assert int.from_bytes(answer[:4], "big") == 7  # the List's correlation id: answered as Fluvio
