"""A small asyncio client of the Fluvio admin protocol (our codec on a socket): what a standby SC
sends its Fluvio writes on to the leader with (forward.py), and what the tests and the bench speak
where the real client cannot (SPU, SPU group and custom SPU requests, raw frames).

Multiplexed like Fluvio's: requests in flight at once, replies matched by correlation id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from typing import Any

from controller.api.fluvio import messages, objects
from store import supervisor

VERSION = messages.OBJECT_MAX_VERSION


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> None:
        self.reader = reader
        self.writer = writer
        self.client_id = client_id
        self.received_bytes = 0
        self.api_versions: messages.ApiVersionsResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[int, int, asyncio.Future[messages.Response]]] = {}
        self._watches: dict[int, asyncio.Queue[messages.WatchResponse]] = {}
        self._reading = asyncio.create_task(self._read_loop(), name="fluvio-client-read")
        self.closed = asyncio.Event()

    @classmethod
    async def connect(cls, host: str, port: int, client_id: str = "fluvio", tls: ssl.SSLContext | None = None) -> Client:
        """Connect (over TLS with ``tls``) and exchange ApiVersions, as the real client does first."""
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        client = cls(reader, writer, client_id)
        try:
            versions = await client.request(messages.API_VERSIONS, messages.ApiVersionsRequest("0.15.2", "linux", "x86_64"), version=2)
        except BaseException:
            await client.close()
            raise
        assert isinstance(versions, messages.ApiVersionsResponse)
        client.api_versions = versions
        return client

    async def close(self) -> None:
        await supervisor.cancel_and_wait(self._reading)
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def request(self, api_key: int, body: Any, version: int = VERSION) -> messages.Response:
        correlation_id = next(self._ids)
        future: asyncio.Future[messages.Response] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (api_key, version, future)
        self.writer.write(messages.encode_request(messages.RequestHeader(api_key, version, correlation_id, self.client_id), body))
        try:
            return await future
        finally:
            self._pending.pop(correlation_id, None)

    async def status(self, api_key: int, body: Any) -> messages.Status:
        answer = await self.request(api_key, body)
        assert isinstance(answer, messages.Status), answer
        return answer

    async def list(self, label: str, *filters: str, system: bool = False) -> list[objects.Metadata]:
        answer = await self.request(messages.LIST, messages.ListRequest(label, list(filters), system=system))
        assert isinstance(answer, messages.ListResponse) and answer.label == label, answer
        return answer.items

    def watch(self, label: str, version: int = VERSION) -> asyncio.Queue[messages.WatchResponse]:
        """Start a Watch; its frames arrive in the returned queue (unbounded: the test reads at will)."""
        correlation_id = next(self._ids)
        queue: asyncio.Queue[messages.WatchResponse] = asyncio.Queue()
        self._watches[correlation_id] = queue
        self._pending[correlation_id] = (messages.WATCH, version, asyncio.get_running_loop().create_future())
        header = messages.RequestHeader(messages.WATCH, version, correlation_id, "dummy")
        self.writer.write(messages.encode_request(header, messages.WatchRequest(label)))
        return queue

    async def _read_loop(self) -> None:
        try:
            while True:
                prefix = await self.reader.readexactly(4)
                message = await self.reader.readexactly(messages.frame_length(prefix))
                self.received_bytes += 4 + len(message)
                correlation_id = int.from_bytes(message[:4], "big", signed=True)
                pending = self._pending.get(correlation_id)
                if pending is None:
                    continue  # a late reply to a request given up on
                api_key, version, future = pending
                _, answer = messages.decode_response(message, api_key, version)
                queue = self._watches.get(correlation_id)
                if queue is not None:
                    assert isinstance(answer, messages.WatchResponse)
                    queue.put_nowait(answer)
                elif not future.done():
                    future.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as error:
            self._fail_pending(f"the SC closed the connection ({error!r})")
        except Exception as error:  # an answer our codec cannot read: nothing after it can be trusted
            self._fail_pending(f"could not decode the SC's answer ({error!r}); the connection is closed")
            self.writer.close()
        finally:
            self.closed.set()

    def _fail_pending(self, reason: str) -> None:
        for _, _, future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError(reason))
