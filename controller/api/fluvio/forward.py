"""A standby SC's Fluvio writes, sent on to the SC that leads the store.

Fluvio's admin protocol has no redirect: a client that sent a Create to a standby waits for a
Status on that connection. The standby checks the client's rights itself (its credentials are the
same as the leader's), then sends the request, unchanged, to the leader's public port (one
connection per leader, kept while it works) and answers with the leader's Status. Under TLS it
connects with TLS, verifying the leader's certificate with ``tls_client_ca`` (else the system's
CAs) and, with ``tls_client_ca`` set, presenting its own certificate: the leader then sees the
standby as the client (its CN needs the admin role there; the standby logs who asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable

import structlog

from controller.api.fluvio import client as client_module, messages
from controller.api.fluvio.messages import Error

log = structlog.get_logger(__name__)

Request = messages.CreateRequest | messages.DeleteRequest | messages.UpdateRequest
_API_KEYS: dict[type, int] = {
    messages.CreateRequest: messages.CREATE,
    messages.DeleteRequest: messages.DELETE,
    messages.UpdateRequest: messages.UPDATE,
}
# The identity the standby gives in the requests it sends on (the leader logs it).
CLIENT_ID = "sc-standby"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as written in an SC's claim; ValueError otherwise."""
    host, separator, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise ValueError(f"{address[:80]!r} is not HOST:PORT")
    return host, int(port)


class Forwarder:
    """Sends Fluvio writes on to the leader at the address it is given each time."""

    def __init__(self, timeout: float, tls: Callable[[], ssl.SSLContext | None] = lambda: None) -> None:
        self.timeout = timeout  # for one request, answer included (a Create waits for provisioning)
        self.tls = tls
        self.forwarded = 0
        self._client: client_module.Client | None = None
        self._address: tuple[str, int] | None = None
        self._lock = asyncio.Lock()

    async def forward(self, leader: str, request: Request, version: int, name: str) -> messages.Status:
        """The leader's Status for ``request``; a Status naming the problem when it cannot be had."""
        try:
            address = split_address(leader)
        except ValueError as error:
            return _failure(name, f"this SC is a standby, and the leader's address in the store is unusable: {error}")
        try:
            async with asyncio.timeout(self.timeout):
                connection = await self._connection(address)
                answer = await connection.request(_API_KEYS[type(request)], request, version)
        except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as error:
            await self._drop()
            reason = f"no answer within {self.timeout:g} s" if isinstance(error, TimeoutError) else str(error) or type(error).__name__
            return _failure(name, f"this SC is a standby and could not reach the leader at {leader}: {reason}; try again")
        if not isinstance(answer, messages.Status):
            return _failure(name, f"the leader at {leader} answered with {type(answer).__name__}, not a status")
        self.forwarded += 1
        return answer

    async def close(self) -> None:
        await self._drop()

    async def _connection(self, address: tuple[str, int]) -> client_module.Client:
        async with self._lock:
            if self._client is not None and (self._address != address or self._client.closed.is_set()):
                await self._drop_locked()
            if self._client is None:
                self._client = await client_module.Client.connect(*address, client_id=CLIENT_ID, tls=self.tls())
                self._address = address
            return self._client

    async def _drop(self) -> None:
        async with self._lock:
            await self._drop_locked()

    async def _drop_locked(self) -> None:
        connection, self._client, self._address = self._client, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


def _failure(name: str, message: str) -> messages.Status:
    return messages.Status(name, messages.ErrorCode(Error.OTHER, (message,)), message)
