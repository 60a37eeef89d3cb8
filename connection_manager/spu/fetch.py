"""The SPU<->SPU private endpoint: the fetch server a leader runs, and one fetch loop per leader followed.

``fetch_wire`` frames over TCP; offsets are ``SpuState``'s. A round fetches every partition followed
from that leader, then waits ``fetch_interval``; an unreachable leader means no progress, and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from connection_manager import wire
from connection_manager.spu import (
    backoff as backoff_module,
    fetch_wire,
    settings as settings_module,
    state as state_module,
)


class LeaderRefused(Exception):
    """The leader answered a fetch with an error frame and closed the connection."""


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(fetch_wire.HEADER_BYTES)
    return await reader.readexactly(fetch_wire.body_length(header))


class FetchServer:
    """Serves followers' fetches on one address; ``listen`` again moves it, ``close`` drops every connection."""

    def __init__(self, state: state_module.SpuState, on_change: Callable[[], None] = lambda: None) -> None:
        self.state = state
        self.on_change = on_change  # after each fetch served: HWs may have moved, a leader may have stepped down
        self.address: tuple[str, int] | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.log = structlog.get_logger(__name__).bind(spu=state.spu_id)

    async def listen(self, host: str, port: int) -> None:
        await self.close()
        # Shielded: asyncio's create_server yields once more after opening its socket, and a cancel
        # there (the SPU stopping) would lose the server with its socket still listening.
        starting = asyncio.ensure_future(asyncio.start_server(self._serve, host, port))
        try:
            self._server = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                started = await starting  # a step or two away
                started.close()
                await started.wait_closed()
            raise
        self.address = (host, port)
        self.log.info("fetch server listening", host=host, port=port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Server.close leaves accepted connections open: followers must see their leader go away.
        # Closing the transport ends each handler's read; cancelling a handler is the last resort,
        # because 3.11's StreamReaderProtocol logs a cancelled handler as an error.
        for writer in self._connections.values():
            writer.close()
        if self._connections:
            _, stuck = await asyncio.wait(list(self._connections), timeout=1.0)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        await server.wait_closed()
        self.log.info("fetch server closed", address=self.address)
        self.address = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    request = fetch_wire.parse_request(await _read_frame(reader))
                except wire.FrameError as error:
                    peer = writer.get_extra_info("peername")
                    self.log.warning("fetch frame refused", peer=peer, code=error.code, error=str(error))
                    writer.write(fetch_wire.encode(fetch_wire.FetchError(code=error.code, message=str(error))))
                    await writer.drain()
                    return
                response = self.state.serve(request, loop.time())
                self.on_change()
                writer.write(fetch_wire.encode(response))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the follower went away
        finally:
            del self._connections[task]
            writer.close()


class Fetchers:
    """One fetch loop per leader this SPU follows; ``reconcile`` after every change of the SC's picture."""

    def __init__(
        self, state: state_module.SpuState, settings: settings_module.SpuSettings, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.state = state
        self.settings = settings
        self.on_change = on_change  # after each answer applied: logs moved (journaled before the next fetch)
        self._loops: dict[int, tuple[wire.Endpoint, asyncio.Task[None]]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self.log = structlog.get_logger(__name__).bind(spu=state.spu_id)

    @property
    def leaders(self) -> dict[int, wire.Endpoint]:
        """Leader id -> the endpoint its loop fetches from."""
        return {leader: endpoint for leader, (endpoint, _) in self._loops.items()}

    def reconcile(self) -> None:
        wanted: dict[int, wire.Endpoint | None] = {
            leader: self.state.endpoint_of(leader) for leader in self.state.leaders_followed()
        }
        for leader, (followed, task) in list(self._loops.items()):
            if wanted.get(leader) != followed:
                self._retire(leader, task)
        for leader, endpoint in wanted.items():
            if leader in self._loops:
                continue
            if endpoint is None:
                self.log.warning("leader has no known endpoint; its partitions wait", leader=leader)
                continue
            task = asyncio.create_task(self._follow(leader, endpoint), name=f"spu-{self.state.spu_id}-fetch-{leader}")
            self._loops[leader] = (endpoint, task)

    def _retire(self, leader: int, task: asyncio.Task[None]) -> None:
        del self._loops[leader]
        task.cancel()
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        for leader, (_, task) in list(self._loops.items()):
            self._retire(leader, task)
        await asyncio.gather(*self._stopping, return_exceptions=True)

    async def _follow(self, leader: int, endpoint: wire.Endpoint) -> None:
        backoff = backoff_module.Backoff(self.settings.fetch_retry_initial, self.settings.fetch_retry_max)
        log = self.log.bind(leader=leader, host=endpoint.host, port=endpoint.port)
        reachable = True  # log the first failure after a success, not every retry
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 a wait_for cancelled as the connection
                # completes loses it, and its socket leaks.
                async with asyncio.timeout(self.settings.request_timeout):
                    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            except (OSError, TimeoutError) as error:
                if reachable:
                    log.info("leader unreachable; its partitions stop advancing", error=str(error) or type(error).__name__)
                reachable = False
                await asyncio.sleep(backoff.next_delay())
                continue
            log.info("fetching from leader")
            reachable = True
            try:
                await self._fetch_rounds(leader, reader, writer, backoff, log)
            except (OSError, asyncio.IncompleteReadError, TimeoutError, wire.FrameError, LeaderRefused) as error:
                log.info("leader connection lost", error=str(error) or type(error).__name__)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            await asyncio.sleep(backoff.next_delay())

    async def _fetch_rounds(
        self,
        leader: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        backoff: backoff_module.Backoff,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        reported: dict[str, str] = {}
        while True:
            request = self.state.fetch_request(leader, self.settings.fetch_max_records)
            if request is not None:
                writer.write(fetch_wire.encode(request))
                await writer.drain()
                async with asyncio.timeout(self.settings.request_timeout):
                    body = await _read_frame(reader)
                response = fetch_wire.parse_response(body)
                if isinstance(response, fetch_wire.FetchError):
                    raise LeaderRefused(f"leader refused the fetch: {response.code}: {response.message}")
                problems = self.state.apply_response(leader, response, request)
                self.on_change()
                if problems != reported:
                    # Logged when they change: "not-leader" repeats until the SC's update reaches both SPUs.
                    if problems:
                        log.info("leader did not serve some partitions", problems=problems)
                    reported = problems
                backoff.reset()
            await asyncio.sleep(self.settings.fetch_interval)
