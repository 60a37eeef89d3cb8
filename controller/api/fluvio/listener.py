"""The public port's listener: the first byte of each connection picks its protocol. A Fluvio frame
starts with its big-endian length (0x00, or 0x01 for a frame of exactly 16 MiB); anything else (an
HTTP method) goes to the aiohttp application, unchanged. Limits and timeouts are the guarded site's (connection_manager/transport.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from connection_manager import transport
from controller.api.fluvio import server as server_module


class SniffingSite(transport.GuardedSite):
    """A guarded TCP site of the aiohttp runner that also serves Fluvio connections on the same port."""

    __slots__ = ("_fluvio",)

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        fluvio: server_module.FluvioServer,
        policy: transport.Port,
        tls: transport.TlsContext | None = None,
    ) -> None:
        # Under TLS the first byte sniffed is the first one decrypted: both protocols work over it.
        super().__init__(runner, host, port, policy, other=self._fluvio_protocol, tls=tls)
        self._fluvio = fluvio

    def _fluvio_protocol(self, first: bytes) -> asyncio.Protocol | None:
        # The length's first byte is at most the largest frame's; an HTTP method starts with a letter.
        return self._fluvio.protocol() if first[0] <= self._fluvio.max_frame_bytes >> 24 else None

    async def start(self) -> None:
        await self._fluvio.start()
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        await self._fluvio.close()
