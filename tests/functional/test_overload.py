"""Overload at the transport level, on 127.0.0.1: aborted uploads and oversized frames, slow and
silent clients on both ports, connection floods, accept() running out of descriptors, junk bytes.
Memory and logs are measured on a real `sc run` in a subprocess (its GC settings: first threshold
50,000, startup heap frozen); limits and timeouts on an in-process daemon with small settings.
Attackers connect from 127.0.0.2 and up, so the test's own /healthz (127.0.0.1) is another address.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from connection_manager import transport, wire
from controller import config
from controller.api import routes as api
from controller.api.fluvio import client as client_module, messages, objects, server as fluvio_server
from store import embedded_etcd
from tests.builders import eventually
from tests.fixtures import daemon as daemon_fixtures
from tests.fixtures.scripted_spu import ScriptedSpu

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
# "/healthz answers within 1 s during every attack" is the bound, which bench/overload.py
# holds (docs/benchmarks.md). Here /healthz must answer during every attack, within a bound far from
# both that and the outage (105 s): an sc process under attack shares the machine with
# another test, and 1 s measured the machine.
HEALTHZ_SECONDS = 10.0
# Slack on top of a configured timeout before a connection still open fails a test.
CLOSE_MARGIN = 5.0
# Seconds a connection refused at once (a full port) may take to be seen closed: patience, the
# refusal itself is counted by reason.
REFUSED_CLOSE = 10.0


# ---------------------------------------------------------------------------- helpers


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sent before it closed the connection; fails if still open after ``within`` s."""
    received = bytearray()
    async with asyncio.timeout(within):
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                received += chunk
    return bytes(received)


async def read_response(reader: asyncio.StreamReader, within: float = 10.0) -> tuple[bytes, Any]:
    """One HTTP answer: its status line and headers, and its JSON body."""
    async with asyncio.timeout(within):
        head = await reader.readuntil(b"\r\n\r\n")
        found = re.search(rb"\r\nContent-Length: (\d+)\r\n", head)
        assert found is not None, head
        length = int(found.group(1))
        return head, json.loads(await reader.readexactly(length))


async def connect_from(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0))


async def healthz_answers(url: str) -> None:
    async with aiohttp.ClientSession() as session, asyncio.timeout(HEALTHZ_SECONDS):
        async with session.get(f"{url}/healthz") as response:
            assert (response.status, await response.json()) == (200, {"status": "ok"})


async def healthz_answers_again(url: str) -> None:
    """Until /healthz answers (after an attack: the port may still be full for a moment)."""

    async def answers() -> None:
        try:
            await healthz_answers(url)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise AssertionError(f"/healthz does not answer: {error!r}") from None

    await eventually(answers, timeout=30)


def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.transport.abort()


def metric(text: str, name: str, **labels: str) -> float:
    shown = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    wanted = f"{name}{{{shown}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{wanted} is not in /metrics")


@dataclass
class ScProcess:
    process: subprocess.Popen[bytes]
    public_port: int
    private_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    def rss(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def descriptors(self) -> int:
        return len(list(Path(f"/proc/{self.process.pid}/fd").iterdir()))

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]

    async def metrics(self) -> str:
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/metrics") as response:
            return await response.text()


@contextlib.asynccontextmanager
async def sc_process(tmp_path: Path, *flags: str, open_files: int | None = None) -> AsyncIterator[ScProcess]:
    """`sc run --store memory` in a subprocess (JSON log in tmp_path), ready to serve."""
    public_port, private_port = embedded_etcd.free_ports(2)
    log_path = tmp_path / "sc.log"
    command = [
        sys.executable, "-m", "controller.cli", "run", "--store", "memory", "--bind-host", "127.0.0.1",
        "--public-port", str(public_port), "--private-port", str(private_port), "--log-format", "json", *flags,
    ]  # fmt: skip

    if open_files is not None:
        # Set in the child by a small exec wrapper, not by preexec_fn: Python code run between
        # fork and exec in a test process whose gRPC threads are busy can abort the child.
        wrapper = (
            "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({open_files}, {open_files})); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
        )
        command = [sys.executable, "-c", wrapper, *command[1:]]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    running = ScProcess(process, public_port, private_port, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log_path.read_text()
            with contextlib.suppress(aiohttp.ClientError, AssertionError, TimeoutError):
                await healthz_answers(running.url)
                break
            assert time.monotonic() < deadline, "sc run did not start"
            await asyncio.sleep(0.1)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def during(attack: Awaitable[Any], check: Callable[[], Awaitable[None]]) -> list[Any]:
    """Run ``attack`` and keep running ``check`` until it is over; the results of ``check`` runs."""
    task = asyncio.ensure_future(attack)
    checks = 0
    try:
        while not task.done():
            await check()
            checks += 1
            await asyncio.sleep(0.05)
        return [await task, checks]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def settings(**overrides: Any) -> config.Settings:
    return config.Settings(store=config.StoreKind.MEMORY, **{**daemon_fixtures.COMMON_SETTINGS, **overrides})


# ---------------------------------------------------------------------------- 1. aborted uploads


ABORTED_PER_ROUND = 12
ROUNDS = 3
ANNOUNCED = 16_000_000
SENT = 15 * MiB
BUFFERED = 64 * MiB


async def aborted_http_upload(port: int, host: str) -> None:
    _, writer = await connect_from(host, port)
    writer.write(b"POST /v1/placement HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
    writer.write(b"Content-Length: %d\r\n\r\n" % ANNOUNCED)
    await _send_then_abort(writer)


async def aborted_fluvio_frame(port: int, host: str) -> None:
    _, writer = await connect_from(host, port)
    # A Create: the only request that may be this large (on a store whose requests hold it, below).
    writer.write(ANNOUNCED.to_bytes(4, "big") + messages.CREATE.to_bytes(2, "big"))
    await _send_then_abort(writer)


async def _send_then_abort(writer: asyncio.StreamWriter) -> None:
    chunk = b" " * (256 * 1024)
    for _ in range(SENT // len(chunk)):
        writer.write(chunk)
        await writer.drain()
    writer.transport.abort()


@pytest.mark.parametrize("upload", [aborted_http_upload, aborted_fluvio_frame], ids=["http-body", "fluvio-frame"])
async def test_aborted_uploads_keep_no_memory_and_log_no_error(
    tmp_path: Path, upload: Callable[[int, str], Awaitable[None]]
) -> None:
    """The issue's 100 x 15 MiB x 3 took RSS from 75 MB to 4.7 GB, with a 500 and a traceback each."""
    async with sc_process(
        tmp_path, "--max-buffered-request-bytes", str(BUFFERED), "--client-header-timeout", "60", "--etcd-max-request-bytes", str(16 * MiB)
    ) as sc:
        await healthz_answers(sc.url)
        baseline, descriptors = sc.rss(), sc.descriptors()
        peak = baseline

        async def sample() -> None:
            nonlocal peak
            peak = max(peak, sc.rss())
            await healthz_answers(sc.url)

        for round_number in range(ROUNDS):
            attack = asyncio.gather(*(upload(sc.public_port, f"127.0.0.{2 + i % 4}") for i in range(ABORTED_PER_ROUND)))
            _, checks = await during(attack, sample)
            assert checks > 0, round_number

        async def all_closed() -> None:
            assert sc.descriptors() <= descriptors

        await eventually(all_closed)
        # Bodies are buffered only up to max_buffered_request_bytes at once, and let go when their client
        # leaves: given back to the system at most one collection interval after the last one left.
        assert peak - baseline < BUFFERED + 64 * MiB, (baseline, peak)

        async def memory_given_back() -> None:
            assert sc.rss() - baseline < 24 * MiB, (baseline, peak, sc.rss())

        await eventually(memory_given_back)
        assert metric(await sc.metrics(), "sc_requests_abandoned_total", port="public") == ROUNDS * ABORTED_PER_ROUND
    lines = sc.log_lines()
    assert [line for line in lines if line["level"] in ("error", "critical") or "exception" in line] == []
    abandoned = [line for line in lines if line["event"] == "clients closed their connection in the middle of a request"]
    assert 1 <= len(abandoned) <= ROUNDS, abandoned  # one line per 10 s, not one per client


async def test_a_content_length_above_the_limit_is_refused_before_the_body_is_read() -> None:
    async with daemon_fixtures.running(settings()) as sc:
        reader, writer = await asyncio.open_connection("127.0.0.1", sc.daemon.public_port)
        try:
            writer.write(b"POST /v1/placement HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % (api.MAX_BODY_BYTES + 1))
            head, body = await read_response(reader)  # answered with no body byte sent
        finally:
            writer.transport.abort()
        assert head.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in head
        assert body == {
            "error": {
                "code": "RequestTooLarge",
                "message": f"the request body is {api.MAX_BODY_BYTES + 1} bytes (Content-Length); "
                f"the limit is {api.MAX_BODY_BYTES} bytes",
            }
        }


async def test_a_chunked_body_is_cut_at_the_limit() -> None:
    async with daemon_fixtures.running(settings()) as sc:
        reader, writer = await asyncio.open_connection("127.0.0.1", sc.daemon.public_port)
        chunk = b" " * MiB
        try:
            writer.write(b"POST /v1/placement HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                for _ in range(api.MAX_BODY_BYTES // MiB + 1):
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
            head, body = await read_response(reader)
        finally:
            writer.transport.abort()
        assert head.startswith(b"HTTP/1.1 413 ")
        assert body["error"] == {
            "code": "RequestTooLarge",
            "message": f"the request body is larger than {api.MAX_BODY_BYTES} bytes",
        }


# ---------------------------------------------------------------------------- 2. slow and silent clients


HEADER, BODY, IDLE = 0.5, 0.5, 1.0


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    pass


async def partial_request_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /heal")


async def partial_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1")


async def slow_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"name\": ")


async def trickled_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> asyncio.Task[None]:
    writer.write(b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n")
    return asyncio.create_task(_trickle(writer))


async def fluvio_trickled_frame(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> asyncio.Task[None]:
    writer.write((1000).to_bytes(4, "big") + messages.LIST.to_bytes(2, "big"))
    return asyncio.create_task(_trickle(writer))


async def _trickle(writer: asyncio.StreamWriter) -> None:
    """A byte every 0.2 s (never a pause of BODY seconds) until the connection is gone."""
    with contextlib.suppress(ConnectionError):
        for _ in range(int(4 * (BODY + CLOSE_MARGIN) / 0.2)):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.2)


async def idle_after_a_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert (await reader.readuntil(b'{"status": "ok"}')).startswith(b"HTTP/1.1 200 OK")


async def fluvio_length_prefix_alone(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write((1000).to_bytes(4, "big"))  # the API key, read with the length, never comes


async def fluvio_oversized_length_alone(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # Above the port's largest frame (16 MiB): refused by its API's limit, once the API key comes.
    writer.write((fluvio_server.MAX_FRAME_BYTES + 1).to_bytes(4, "big"))


async def fluvio_header_start_alone(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write((1000).to_bytes(4, "big") + messages.LIST.to_bytes(2, "big"))


async def fluvio_partial_prefix(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"\x00\x00")


async def fluvio_idle_after_a_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    header = messages.RequestHeader(messages.API_VERSIONS, 2, 1, "idle")
    writer.write(messages.encode_request(header, messages.ApiVersionsRequest("0.15.2", "linux", "x86_64")))
    length = int.from_bytes(await reader.readexactly(4), "big")
    await reader.readexactly(length)


async def partial_websocket_upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(f"GET {wire.SPU_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upg".encode())


@pytest.mark.parametrize(
    ("port_name", "client", "reason", "answer"),
    [
        (transport.PUBLIC, silent, transport.HEADER_TIMEOUT, b""),
        (transport.PUBLIC, partial_request_line, transport.HEADER_TIMEOUT, b""),
        (transport.PUBLIC, partial_headers, transport.HEADER_TIMEOUT, b""),
        (transport.PUBLIC, slow_body, transport.BODY_TIMEOUT, b"HTTP/1.1 408 Request Timeout\r\n"),
        (transport.PUBLIC, trickled_body, transport.BODY_TIMEOUT, b"HTTP/1.1 408 Request Timeout\r\n"),
        (transport.PUBLIC, idle_after_a_request, transport.IDLE_TIMEOUT, b""),
        (transport.PUBLIC, fluvio_length_prefix_alone, transport.HEADER_TIMEOUT, b""),
        (transport.PUBLIC, fluvio_oversized_length_alone, transport.HEADER_TIMEOUT, b""),
        (transport.PUBLIC, fluvio_header_start_alone, transport.BODY_TIMEOUT, b""),
        (transport.PUBLIC, fluvio_partial_prefix, transport.HEADER_TIMEOUT, b""),
        (transport.PUBLIC, fluvio_trickled_frame, transport.BODY_TIMEOUT, b""),
        (transport.PUBLIC, fluvio_idle_after_a_request, transport.IDLE_TIMEOUT, b""),
        (transport.PRIVATE, silent, transport.HEADER_TIMEOUT, b""),
        (transport.PRIVATE, partial_websocket_upgrade, transport.HEADER_TIMEOUT, b""),
    ],
    ids=lambda value: value.__name__ if callable(value) else None,
)
async def test_slow_and_silent_clients_are_closed_within_their_timeout(
    port_name: str, client: Callable[..., Awaitable[asyncio.Task[None] | None]], reason: str, answer: bytes
) -> None:
    tight = settings(client_header_timeout=HEADER, client_body_timeout=BODY, client_idle_timeout=IDLE)
    async with daemon_fixtures.running(tight) as sc:
        number = sc.daemon.public_port if port_name == transport.PUBLIC else sc.daemon.private_port
        assert number is not None
        reader, writer = await connect_from("127.0.0.2", number)
        still_sending = None
        try:
            still_sending = await client(reader, writer)
            received = await closed_by_server(reader, IDLE + CLOSE_MARGIN)
        finally:
            writer.transport.abort()
            if still_sending is not None:
                await still_sending
        assert received.startswith(answer), received[:200]
        ports = sc.daemon.ports
        assert ports is not None
        port = ports[0] if port_name == transport.PUBLIC else ports[1]
        assert port.stats.refused == {**dict.fromkeys(transport.REASONS, 0), reason: 1}

        async def released() -> None:
            assert (port.stats.open, port.by_address) == (0, {})

        await sc.eventually(released)


async def test_a_connection_closing_after_an_answer_its_client_does_not_read_is_aborted() -> None:
    """A client asks with `Connection: close` once the socket's buffers are full of the answers it
    did not read, and keeps the socket open, reading nothing. aiohttp closes the connection
    politely after the answer, which waits for the client to take it: the idle timer that fired
    then left a closing connection be, so it stayed for as long as the client liked. It is
    aborted now, counted as `close-timeout`."""
    tight = settings(client_header_timeout=HEADER, client_body_timeout=BODY, client_idle_timeout=IDLE)
    async with daemon_fixtures.running(tight) as sc:
        ports, number = sc.daemon.ports, sc.daemon.public_port
        assert ports is not None and number is not None
        port = ports[0]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind(("127.0.0.2", 0))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", number))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.transport.pause_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
        try:

            # The SC's side of this connection (it has no request in progress before the first),
            # counting the requests it answered.
            [guard] = [guard for guard in port.evictable if guard.host == "127.0.0.2"]
            answered = 0
            finished = guard.request_finished

            def counted(*args: Any, **kwargs: Any) -> None:
                nonlocal answered
                answered += 1
                finished(*args, **kwargs)

            guard.request_finished = counted  # type: ignore[method-assign]  # wrapped to count the answers, as the guard calls it

            def backlog() -> int:
                """What the SC's socket did not take of its answers."""
                return guard.transport.get_write_buffer_size() if guard.transport is not None else 0

            # Answers until the socket's buffers are full (a few MB), fifty at a time: fewer than
            # the SC writes before it stops answering (64 KiB left in its own buffer).
            for batch in range(1, 2_000):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 50)
                await writer.drain()
                await sc.eventually(lambda: answered == 50 * batch)  # noqa: B023  # this batch's
                await asyncio.sleep(0.01)  # its last answer is written after its handler's end
                if backlog():
                    break
            assert 0 < backlog() < 64 * 1024, backlog()
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            await writer.drain()

            async def released() -> None:
                assert "127.0.0.2" not in port.by_address

            await sc.eventually(released, timeout=30.0)
            assert port.stats.refused[transport.CLOSE_TIMEOUT] == 1, {k: v for k, v in port.stats.refused.items() if v}
        finally:
            writer.transport.abort()


async def test_requests_watches_and_spus_outlast_the_timeouts() -> None:
    """Only a client that is slow to send is cut: a watch, a Fluvio watch and an SPU stay for longer."""
    tight = settings(client_header_timeout=HEADER, client_body_timeout=BODY, client_idle_timeout=IDLE, spu_heartbeat_timeout=5.0)
    async with daemon_fixtures.running(tight) as sc, aiohttp.ClientSession() as session:
        assert sc.daemon.public_port is not None and sc.daemon.private_port is not None
        await sc.register_spu(0, online=False)
        spu = ScriptedSpu(session, sc.daemon.private_port, 0)
        assert isinstance(await spu.connect(heartbeat=0.25), wire.Accepted)
        fluvio = await client_module.Client.connect("127.0.0.1", sc.daemon.public_port)
        try:
            fluvio_watch = fluvio.watch(objects.TOPIC)
            await asyncio.wait_for(fluvio_watch.get(), 5)
            async with session.get(f"{sc.url}/v1/watch/topics") as lines:
                assert json.loads(await lines.content.readline())["type"] == "SYNC"
                await asyncio.sleep(IDLE + HEADER + 1.0)  # longer than any timeout
                await sc.register_spu(1)
                status, _ = await sc.call("POST", "/v1/topics", {"name": "later", "spec": {"partitions": 1, "replicationFactor": 1}})
                assert status == 201
                assert json.loads(await asyncio.wait_for(lines.content.readline(), 5))["object"]["name"] == "later"
            update = (await asyncio.wait_for(fluvio_watch.get(), 5)).update
            assert [m.content.name for m in update.changes] == ["later"]
            assert sc.daemon.connections is not None and sc.daemon.connections.sessions[0] is not None
            assert sc.daemon.connections.stats.heartbeat_timeouts == 0
            ports = sc.daemon.ports
            assert ports is not None
            # Idle keep-alive connections of the test's own HTTP client may have been closed; nothing else was.
            refused = [{**port.stats.refused, transport.IDLE_TIMEOUT: 0} for port in ports]
            assert refused == [dict.fromkeys(transport.REASONS, 0)] * 2
        finally:
            await fluvio.close()
            await spu.close()


# ---------------------------------------------------------------------------- 2. connection limits


async def test_connection_limits_keep_room_for_new_clients_and_the_private_port_for_spus() -> None:
    limited = settings(
        max_connections_public=20, max_connections_private=6, max_connections_per_address=8,
        spu_heartbeat_timeout=2.0, client_header_timeout=60.0, client_body_timeout=60.0,
    )  # fmt: skip
    async with daemon_fixtures.running(limited) as sc, aiohttp.ClientSession() as session:
        public_port, private_port = sc.daemon.public_port, sc.daemon.private_port
        assert public_port is not None and private_port is not None
        for spu_id in range(2):
            await sc.register_spu(spu_id, online=False)
        first_spu = ScriptedSpu(session, private_port, 0)
        assert isinstance(await first_spu.connect(heartbeat=0.25), wire.Accepted)
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            # One address: its share of the port, then refused at once; /healthz from another address answers.
            for _ in range(8):
                held.append(await connect_from("127.0.0.2", public_port))
            reader, writer = await connect_from("127.0.0.2", public_port)
            assert await closed_by_server(reader, REFUSED_CLOSE) == b""
            writer.transport.abort()
            await healthz_answers(sc.url)
            ports = sc.daemon.ports
            assert ports is not None
            public, private = ports
            await sc.session.close()  # its keep-alive connection would take a slot
            await sc.eventually(open_connections(public, 8))
            # Connections that never send a request fill the port: a new one takes the oldest one's place.
            for host in ("127.0.0.3", "127.0.0.3", "127.0.0.4") * 4:
                held.append(await connect_from(host, public_port))
            await sc.eventually(open_connections(public, 20))
            held.append(await connect_from("127.0.0.5", public_port))
            assert await closed_by_server(held[0][0], REFUSED_CLOSE) == b""
            await healthz_answers(sc.url)  # takes the next oldest one's place
            assert await closed_by_server(held[1][0], REFUSED_CLOSE) == b""
            # A port full of requests in progress refuses a new connection, from any address.
            close_all([writer for _, writer in held])
            await sc.eventually(open_connections(public, 0))
            for host in ("127.0.0.2", "127.0.0.3") * 8 + ("127.0.0.4",) * 4:
                held.append(await connect_from(host, public_port))
                await slow_body(*held[-1])
            await sc.eventually(open_connections(public, 20, evictable=0))
            reader, writer = await connect_from("127.0.0.5", public_port)
            assert await closed_by_server(reader, REFUSED_CLOSE) == b""
            writer.transport.abort()
            # SPUs still connect to the private port, and the connected one kept its heartbeats.
            second_spu = ScriptedSpu(session, private_port, 1)
            assert isinstance(await second_spu.connect(heartbeat=0.25), wire.Accepted)
            await second_spu.close()
            assert public.stats.refused == {
                **dict.fromkeys(transport.REASONS, 0), transport.PER_ADDRESS_LIMIT: 1, transport.EVICTED: 2, transport.LIMIT: 1
            }
            assert private.stats.refused == dict.fromkeys(transport.REASONS, 0)
        finally:
            close_all([writer for _, writer in held])
        await healthz_answers_again(sc.url)
        assert sc.daemon.connections is not None and sc.daemon.connections.stats.heartbeat_timeouts == 0
        assert 0 in sc.daemon.connections.sessions
        await first_spu.close()


def open_connections(port: transport.Port, count: int, evictable: int | None = None) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        assert port.stats.open == count
        if evictable is not None:
            assert len(port.evictable) == evictable

    return check


# ---------------------------------------------------------------------------- 2. accept() out of descriptors


async def test_accept_out_of_descriptors_backs_off_logs_once_and_recovers(tmp_path: Path) -> None:
    """asyncio's own accept loop logged "socket.accept() out of system resource" 583,210 times in 2.5 min."""
    flags = ("--max-connections-public", "1000", "--max-connections-per-address", "1000", "--max-connections-private", "10")
    async with sc_process(tmp_path, *flags, open_files=160) as sc:
        held: list[asyncio.StreamWriter] = []
        try:
            for index in range(220):  # more than the daemon's 160 descriptors, fewer than that and its backlog
                held.append((await connect_from(f"127.0.0.{2 + index % 8}", sc.public_port))[1])
            await asyncio.sleep(3.0)  # out of descriptors all along
        finally:
            close_all(held)

        await healthz_answers_again(sc.url)
        lines = sc.log_lines()
        paused = [line for line in lines if line["event"] == "accepting connections paused: accept() failed"]
        assert len(paused) == 1 and paused[0]["out_of_descriptors"] is True, paused
        assert [line for line in lines if "socket.accept()" in line["event"]] == []
        assert metric(await sc.metrics(), "sc_accept_paused_total", port="public") >= 1


# ---------------------------------------------------------------------------- 6. junk and echoes


JUNK = {
    "not-http": b"Z" * (64 * 1024),
    "tls": b"\x16\x03\x01" + bytes(range(256)) * 256,
    "http-line-too-long": b"GET / HTTP/1.1\r\nX-Long: " + b"a" * (64 * 1024),
}


async def test_junk_gets_a_short_answer_a_short_rate_limited_log_and_keeps_no_memory(tmp_path: Path) -> None:
    """The issue's 300 x 1 MiB of junk gave 45 MiB of ERROR tracebacks echoing it, and 64 KiB echoed per reply."""
    async with sc_process(tmp_path) as sc:
        started = time.monotonic()
        logged_before = sc.log_path.stat().st_size
        for port in (sc.public_port, sc.private_port):
            for name, junk in JUNK.items():
                reader, writer = await connect_from("127.0.0.2", port)
                try:
                    writer.write(junk)  # small enough to be read whole: the answer is not lost to a reset
                    answer = await closed_by_server(reader, 10)
                finally:
                    writer.transport.abort()
                head, _, body = answer.partition(b"\r\n\r\n")
                assert re.match(rb"HTTP/1\.[01] 400 ", head) and len(answer) < 1024, (name, answer[:300])
                error = json.loads(body)["error"]
                assert error["code"] == "MalformedRequest", (name, error)
                assert len(error["message"]) < 200 and junk[20:40].decode("latin-1") not in error["message"], (name, error)
        baseline = sc.rss()
        big = [kind * (MiB // len(kind)) for kind in JUNK.values()]

        async def flood(index: int) -> None:
            reader, writer = await connect_from(f"127.0.0.{2 + index % 4}", sc.public_port)
            try:
                with contextlib.suppress(ConnectionError):
                    writer.write(big[index % len(big)])
                    await writer.drain()
                with contextlib.suppress(ConnectionError):
                    await closed_by_server(reader, 10)
            finally:
                writer.transport.abort()

        for first in range(0, 300, 30):
            await asyncio.gather(*(flood(index) for index in range(first, first + 30)))
        await healthz_answers(sc.url)
        flooded = sc.rss()
        async with aiohttp.ClientSession() as session:
            huge_name = json.dumps({"name": "x" * MiB, "spec": {"partitions": 1, "replicationFactor": 1}}).encode()
            async with session.post(f"{sc.url}/v1/topics", data=io.BytesIO(huge_name)) as response:
                answer = await response.read()
            assert response.status == 422 and len(answer) < 1024 and b"x" * 201 not in answer, answer[:300]

        def refusals_logged() -> None:
            # The last lines reach the log file (an sc process on a busy machine may be late).
            written = sc.log_path.read_bytes()[logged_before:]
            lines = [json.loads(line) for line in written[: written.rfind(b"\n") + 1].splitlines()]  # whole lines
            assert {line["port"] for line in lines if line.get("reason") == transport.NOT_HTTP} == {"private", "public"}
            assert {line["port"] for line in lines if line["event"] == "HTTP requests refused"} == {"private", "public"}

        await eventually(refusals_logged)
        logged = sc.log_path.read_bytes()[logged_before:]
        intervals = 1 + int((time.monotonic() - started) / 10)
    # Unparsed junk leaves nothing; aiohttp's parse errors are collected once 32 MiB may be held.
    assert flooded - baseline < 64 * MiB, (baseline, flooded)
    assert len(logged) < 4096 * intervals, logged[:2000]
    assert b"Traceback" not in logged and b"Z" * 65 not in logged and b"a" * 65 not in logged
    lines = [json.loads(line) for line in logged.splitlines()]
    not_http = [(line["port"], line["reason"]) for line in lines if line.get("reason") == transport.NOT_HTTP]
    malformed = [(line["port"], line["status"]) for line in lines if line["event"] == "HTTP requests refused"]
    assert sorted(set(not_http)) == [("private", "not-http"), ("public", "not-http")] and len(not_http) <= 2 * intervals
    assert sorted(set(malformed)) == [("private", 400), ("public", 400)] and len(malformed) <= 2 * intervals


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (Linux's struct tcp_info starts with it: 1 established)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the TCP state from Linux's TCP_INFO")
async def test_the_listen_backlog_setting_is_the_kernel_queue_of_both_ports() -> None:
    """listen_backlog overrides the system's largest backlog on both ports: with the loop accepting
    nothing, the kernel completes exactly backlog + 1 connections on each (Linux queues one more)."""
    backlog, burst = 5, 20
    settings = config.Settings(store=config.StoreKind.MEMORY, **{**daemon_fixtures.COMMON_SETTINGS, "listen_backlog": backlog})
    async with daemon_fixtures.running(settings) as sc:
        established: dict[int, int] = {}
        # No await from here on: the loop accepts nothing meanwhile, the kernel's queue holds them.
        for port_number in (sc.daemon.public_port, sc.daemon.private_port):
            assert port_number is not None
            clients: list[socket.socket] = []
            try:
                for _ in range(burst):
                    client = socket.socket()
                    clients.append(client)
                    client.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        client.connect(("127.0.0.1", port_number))
                deadline = time.monotonic() + 5.0  # loopback connects complete at once; a dropped SYN waits 1 s
                while sum(tcp_state(client) == 1 for client in clients) < backlog + 1 and time.monotonic() < deadline:
                    time.sleep(0.05)
                established[port_number] = sum(tcp_state(client) == 1 for client in clients)
            finally:
                for client in clients:
                    client.close()
    assert established == {sc.daemon.public_port: backlog + 1, sc.daemon.private_port: backlog + 1}
