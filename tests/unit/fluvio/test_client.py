"""The test client of the Fluvio admin protocol: an answer it cannot read fails the request waiting
for it, with the reason, instead of leaving it waiting forever."""

from __future__ import annotations

import asyncio

import pytest

from controller.api.fluvio import client as client_module, messages


async def test_an_answer_that_cannot_be_decoded_fails_the_waiting_request_with_the_reason() -> None:
    async def answer_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = messages.frame_length(await reader.readexactly(4))
        request = await reader.readexactly(length)
        correlation_id = request[4:8]  # after the api key and version (2 bytes each)
        body = correlation_id + b"\xff\xff"  # an ApiVersions answer cut short
        writer.write(len(body).to_bytes(4, "big") + body)
        await writer.drain()
        await reader.read()  # until the client goes
        writer.close()

    server = await asyncio.start_server(answer_garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionError, match="could not decode"):
            await asyncio.wait_for(client_module.Client.connect("127.0.0.1", port), 5)
    finally:
        server.close()
        await server.wait_closed()
