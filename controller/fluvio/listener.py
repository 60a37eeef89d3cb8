"""The public port's listener: the first byte of each connection picks its protocol. A Fluvio frame
starts with its big-endian length (0x00); anything else (an HTTP method) goes to the aiohttp
application, unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from controller.fluvio import server as server_module


class Sniffer(asyncio.Protocol):
    """Holds a new connection until its first bytes arrive, then hands it over with those bytes."""

    def __init__(self, http: Callable[[], asyncio.Protocol], fluvio: Callable[[], asyncio.Protocol]) -> None:
        self._http = http
        self._fluvio = fluvio
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or not data:
            return
        protocol = self._fluvio() if data[0] == 0 else self._http()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        protocol.data_received(data)

    def eof_received(self) -> bool:
        return False  # closed before saying anything: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


class SniffingSite(web.TCPSite):
    """A TCP site of the aiohttp runner that also serves Fluvio connections on the same port."""

    __slots__ = ("_fluvio",)

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, fluvio: server_module.FluvioServer) -> None:
        super().__init__(runner, host, port)
        self._fluvio = fluvio

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site; TCPSite.start would bind plain HTTP
        http = self._runner.server
        assert http is not None
        await self._fluvio.start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Sniffer(http, self._fluvio.protocol),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        await self._fluvio.close()
