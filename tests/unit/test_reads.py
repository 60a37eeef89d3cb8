"""Expensive reads and watch fan-out against a real public API on 127.0.0.1: the gate and its 429,
pages and continue tokens, lists shared by identical requests, placement off the event loop, each
change encoded once for every watcher, watchers that fall behind dropped, the watcher limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from controller import config, placement
from controller.api import listing
from store import models
from tests.unit import api_server
from tests.builders import partition, topic
from tests.unit.api_server import server, spu  # noqa: F401 (server is a fixture)


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


@contextlib.asynccontextmanager
async def serving(**settings: Any) -> AsyncIterator[api_server.ApiServer]:
    server = api_server.ApiServer(settings=config.Settings(**settings))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def get(server: api_server.ApiServer, path: str) -> tuple[int, dict[str, str], Any]:
    assert server.session is not None
    async with server.session.get(path) as response:
        return response.status, dict(response.headers), await response.json()


def count_encodings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every models.encode from now on (the real one runs) adds one to the returned counter."""
    counter = [0]
    real = models.encode

    def counted(obj: models.AnyObject) -> bytes:
        counter[0] += 1
        return real(obj)

    monkeypatch.setattr(models, "encode", counted)
    return counter


# ---------------------------------------------------------------------------- the gate


async def test_lists_beyond_the_gate_are_429_with_retry_after_and_health_never_waits() -> None:
    async with serving(max_expensive_requests=1, max_expensive_queue=0, expensive_queue_seconds=2.5) as server:
        await server.put(topic("a"))
        async with server.context.gate.slot("placement"):
            status, headers, body = await get(server, "/v1/topics")
            assert (status, headers["Retry-After"]) == (429, "3")
            assert body == error(
                "TooManyRequests",
                "the SC is busy: 1 expensive requests (lists, placements, dry runs) are running and 0 are waiting, the "
                "most it takes (max_expensive_requests=1, max_expensive_queue=0); retry in 3 s, or list in pages with ?limit=",
            )
            assert (await get(server, "/v1/topics?limit=1"))[0] == 429
            assert (await server.call("POST", "/v1/placement", {"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1}))[0] == 429
            assert (await server.call("POST", "/v1/topics?dryRun=true", {"name": "b", "spec": {"partitions": 1, "replicationFactor": 1}}))[0] == 429
            assert await server.call("GET", "/healthz") == (200, {"status": "ok"})
            assert (await server.call("GET", "/v1/topics/a"))[0] == 200  # one object is not expensive
            assert server.session is not None
            async with server.session.get("/metrics") as response:
                text = await response.text()
        assert 'sc_expensive_requests_refused_total{purpose="list"} 2.0' in text
        assert 'sc_expensive_requests_refused_total{purpose="placement"} 1.0' in text
        assert 'sc_expensive_requests_refused_total{purpose="dry-run"} 1.0' in text
        assert "sc_expensive_requests_running 1.0" in text
        assert (await get(server, "/v1/topics"))[0] == 200


async def test_a_list_waits_in_the_queue_for_a_slot() -> None:
    async with serving(max_expensive_requests=1, max_expensive_queue=1, expensive_queue_seconds=60) as server:
        await server.put(topic("a"))
        holder = server.context.gate.slot("placement")
        await holder.__aenter__()
        waiting = asyncio.create_task(get(server, "/v1/topics"))
        while server.context.gate.waiting == 0:
            await asyncio.sleep(0.005)
        assert (await get(server, "/v1/spus"))[0] == 429  # the queue is full
        identical = asyncio.create_task(get(server, "/v1/topics"))  # shares the waiting one's answer
        await holder.__aexit__(None, None, None)
        assert (await asyncio.wait_for(identical, 5))[0] == 200
        status, _, body = await asyncio.wait_for(waiting, 5)
        assert (status, [obj["name"] for obj in body]) == (200, ["a"])


async def test_a_hundred_concurrent_lists_get_their_answer_or_a_429_and_health_answers_throughout() -> None:
    async with serving(max_expensive_requests=2, max_expensive_queue=4, expensive_queue_seconds=60) as server:
        names = [f"t{number:02d}-{index}" for number in range(100) for index in range(20)]
        await server.put(*(partition(name, [0]) for name in names))
        # Both slots busy: four lists wait, the other 96 are refused at once.
        holders = [server.context.gate.slot("placement") for _ in range(2)]
        for holder in holders:
            await holder.__aenter__()
        # Each asks for another topic: no two share an answer.
        lists = [asyncio.create_task(get(server, f"/v1/partitions?topic=t{number:02d}")) for number in range(100)]
        while sum(task.done() for task in lists) < 96:
            assert await server.call("GET", "/healthz") == (200, {"status": "ok"})
            await asyncio.sleep(0.01)
        assert server.context.gate.waiting == 4
        assert await server.call("GET", "/healthz") == (200, {"status": "ok"})
        for holder in holders:
            await holder.__aexit__(None, None, None)
        answers = await asyncio.wait_for(asyncio.gather(*lists), 10)
        served = [(number, body) for number, (status, _, body) in enumerate(answers) if status == 200]
        refused = [(headers, body) for status, headers, body in answers if status == 429]
        assert (len(served), len(refused)) == (4, 96)
        for number, body in served:
            assert [obj["name"] for obj in body] == [f"t{number:02d}-{index}" for index in range(20)]
        for headers, body in refused:
            assert (headers["Retry-After"], body["error"]["code"]) == ("60", "TooManyRequests")
        assert (server.context.gate.running, server.context.gate.waiting) == (0, 0)


# ---------------------------------------------------------------------------- whole lists, shared


async def test_concurrent_identical_lists_are_encoded_once(server: api_server.ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    await server.put(*(partition(f"p-{index}", [0]) for index in range(300)))
    encodings = count_encodings(monkeypatch)
    answers = await asyncio.gather(*(get(server, "/v1/partitions") for _ in range(50)))
    assert encodings[0] == 300
    assert {json.dumps(body) for _, _, body in answers} == {json.dumps(answers[0][2])}
    assert [obj["name"] for obj in answers[0][2]] == [f"p-{index}" for index in range(300)]
    revision = max(item.mod_revision for item in (await server.kv_store.list("partitions/")).items)
    assert {headers["X-Revision"] for _, headers, _ in answers} == {str(revision)}
    assert all("X-Continue" not in headers for _, headers, _ in answers)
    await get(server, "/v1/partitions")  # nothing changed: the kept answer
    assert encodings[0] == 300
    await server.put(partition("p-300", [0]))
    encodings[0] = 0  # the write encoded it once
    assert len((await get(server, "/v1/partitions"))[2]) == 301
    assert encodings[0] == 301


async def test_writing_a_large_answer_takes_a_slot_and_a_small_kept_one_none() -> None:
    async with serving(max_expensive_requests=1, max_expensive_queue=0) as server:
        await server.put(*(topic(f"t{number:03d}", reason="x" * 1000) for number in range(100)), spu(1))
        assert (await get(server, "/v1/topics"))[0] == 200  # about 110 KB, built and kept
        assert (await get(server, "/v1/spus"))[0] == 200  # small, built and kept
        async with server.context.gate.slot("placement"):
            assert (await get(server, "/v1/topics"))[0] == 429  # kept, but writing it is work
            status, _, body = await get(server, "/v1/spus")
            assert (status, [obj["name"] for obj in body]) == (200, ["spu-1"])
        assert server.context.lists.answers.served["cached"] == 2
        status, _, body = await get(server, "/v1/topics")
        assert (status, len(body)) == (200, 100)


def kernel_send_buffer_max() -> int:
    """The most a socket's send buffer grows to by itself (tcp_wmem's maximum; 4 MiB by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


async def test_a_client_that_takes_nothing_of_a_large_list_is_dropped() -> None:
    # Larger than the kernel can hold for the client: with a 3 MB list, a kernel whose send buffer
    # grew to its 4 MiB maximum at once (seen with BBR on loopback) took the whole answer, and the
    # server never had to wait for the client at all.
    reason = "x" * ((kernel_send_buffer_max() + (2 << 20)) // 300)
    async with serving(client_stall_seconds=0.2) as server:
        await server.put(*(topic(f"t{number:03d}", reason=reason) for number in range(300)))
        dropped = "dropping a client that took nothing of an answer"
        with structlog.testing.capture_logs() as logged:
            reader, writer = await stalled_client(server, b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                assert await until_closed(reader, lambda: any(entry["event"] == dropped for entry in logged)) == "closed"
            finally:
                writer.close()
        assert (await get(server, "/v1/topics"))[0] == 200


async def stalled_client(server: api_server.ApiServer, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with a small receive buffer that sends ``request`` and reads nothing until told to."""
    port = int(server.url.rpartition(":")[2])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    writer.transport.pause_reading()  # type: ignore[attr-defined]  # a socket transport: it can pause reading
    writer.write(request)
    await writer.drain()
    return reader, writer


async def until_closed(reader: asyncio.StreamReader, given_up: Callable[[], object], timeout: float = 30) -> str:
    """Once the server says it gave up on us (``given_up()``), read everything until the server's
    end closes; "closed" (reset or EOF) or "open" at the timeout. Waiting for its decision rather
    than a fixed time: on a busy machine a client that reads too soon is no stalled client."""
    transport = reader._transport  # type: ignore[attr-defined]  # StreamReader keeps its transport private
    try:
        async with asyncio.timeout(timeout):
            while not given_up():
                await asyncio.sleep(0.01)
            transport.resume_reading()
            while await reader.read(1 << 16):
                pass
    except (ConnectionResetError, TimeoutError) as stopped:
        return "open" if isinstance(stopped, TimeoutError) else "closed"
    return "closed"


# ---------------------------------------------------------------------------- pages


async def walk(server: api_server.ApiServer, path: str, limit: int, between: Callable[[int], Any] | None = None) -> list[str]:
    names: list[str] = []
    token = None
    pages = 0
    separator = "&" if "?" in path else "?"
    while True:
        query = f"{separator}limit={limit}" + (f"&continue={token}" if token else "")
        status, headers, body = await get(server, path + query)
        assert status == 200, body
        assert len(body) <= limit
        names += [obj["name"] for obj in body]
        pages += 1
        token = headers.get("X-Continue")
        if token is None:
            return names
        if between is not None:
            await between(pages)


async def test_pages_walk_the_listing_in_order(server: api_server.ApiServer) -> None:
    await server.put(*(partition(f"{name}-{index}", [0]) for name in ("b", "a") for index in range(12)))
    await server.put(spu(10, "s10"), spu(2, "s2"), spu(7, "s7"))
    whole = [obj["name"] for obj in (await get(server, "/v1/partitions"))[2]]
    assert whole == [f"{name}-{index}" for name in ("a", "b") for index in range(12)]
    assert await walk(server, "/v1/partitions", 5) == whole
    assert await walk(server, "/v1/partitions", 24) == whole
    assert await walk(server, "/v1/partitions", 10_000) == whole
    assert await walk(server, "/v1/partitions?topic=b", 5) == whole[12:]
    assert await walk(server, "/v1/spus", 2) == ["s2", "s7", "s10"]
    assert await walk(server, "/v1/spu-groups", 3) == []
    status, headers, body = await get(server, "/v1/partitions?limit=3")
    assert (status, [obj["name"] for obj in body]) == (200, ["a-0", "a-1", "a-2"])
    assert listing.decode_token(headers["X-Continue"], "partitions", None) == ("a", 2)
    # The revision of the kind's last change: the store held exactly this listing at it.
    assert headers["X-Revision"] == str(max(item.mod_revision for item in (await server.kv_store.list("partitions/")).items))


async def test_pages_walk_every_object_exactly_once_while_objects_change(server: api_server.ApiServer) -> None:
    names = [f"t{number}-{index}" for number in range(5) for index in range(20)]
    await server.put(*(partition(name, [0]) for name in names))
    created: list[str] = []
    deleted: list[str] = []

    async def churn(page: int) -> None:
        # Before and after the cursor: created, deleted and modified partitions.
        fresh = [partition(f"t{page % 5}-{100 + page}", [0]), partition(f"a{page}-0", [0]), partition(f"z{page}-0", [0])]
        await server.put(*fresh, partition(f"t4-{page}", [1]), partition(f"t0-{page}", [1]))
        created.extend(obj.name for obj in fresh)
        victim = f"t2-{19 - page}"
        await server.kv_store.delete(f"partitions/{victim}")
        await server.mirrored()
        deleted.append(victim)

    seen = await walk(server, "/v1/partitions", 7, churn)
    assert len(seen) == len(set(seen))  # nothing twice
    there_throughout = set(names) - set(deleted)
    assert there_throughout <= set(seen)  # everything that was there all along, once
    assert set(seen) <= set(names) | set(created)
    assert seen == sorted(seen, key=lambda name: (name.rpartition("-")[0], int(name.rpartition("-")[2])))


async def test_page_parameters_are_checked(server: api_server.ApiServer) -> None:
    topics_token = listing.encode_token("topics", None, ("a",))
    cases = [
        ("/v1/topics?limit=0", 400, error("MalformedRequest", "query parameter limit is the page size, at least 1, got 0")),
        ("/v1/topics?limit=10001", 400, error("MalformedRequest", "query parameter limit is at most 10000, got 10001")),
        ("/v1/topics?limit=-1", 400, error("MalformedRequest", "query parameter limit must be a whole number, got '-1'")),
        ("/v1/topics?limit=" + "9" * 5000, 400, None),
        (
            "/v1/topics?continue=" + topics_token,
            422,
            error("InvalidRequest", "query parameter continue needs limit (the page size): pass ?limit=N&continue=TOKEN"),
        ),
        (
            "/v1/topics?limit=5&continue=garbled!",
            400,
            error(
                "MalformedRequest",
                "query parameter continue: it is not a token this SC issued (it does not decode); start the listing "
                "again without continue",
            ),
        ),
        (
            "/v1/partitions?limit=5&continue=" + topics_token,
            400,
            error(
                "MalformedRequest",
                "query parameter continue: it was issued for a listing of topics, not of partitions: pass the same "
                "kind and filter; start the listing again without continue",
            ),
        ),
        ("/v1/topics?limit=5&continue=" + "A" * 513, 400, None),
        ("/v1/topics?limit=5&continue=", 400, None),
    ]
    for path, status, body in cases:
        answer = await server.call("GET", path)
        assert answer[0] == status, (path, answer)
        if body is not None:
            assert answer[1] == body, path
    status, headers, body = await get(server, "/v1/topics?limit=5&continue=" + topics_token)
    assert (status, body, "X-Continue" in headers) == (200, [], False)


# ---------------------------------------------------------------------------- placement


async def test_placements_are_computed_in_the_worker_process_and_dry_runs_off_the_event_loop(
    server: api_server.ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real = placement.compute

    def recorded(request: placement.PlacementRequest, placers: placement.Placers) -> placement.PlacementResult:
        threads.append(threading.current_thread().name)
        return real(request, placers)

    monkeypatch.setattr(placement, "compute", recorded)
    await server.put(spu(0), spu(1), spu(2))
    status, body = await server.call("POST", "/v1/placement", {"partitions": 4000, "replicationFactor": 3})
    assert (status, len(body["replicaMap"]), body["replicaMap"][:2], body["nextStartIndex"]) == (200, 4000, [[0, 1, 2], [1, 2, 0]], 4000)
    assert body["balance"]["replicas"]["perSpu"] == {"0": 4000, "1": 4000, "2": 4000}
    # Not in this process: in the placement worker, a child process of its own.
    worker = server.context.placement_worker
    assert threads == [] and worker.pid is not None and worker.pid != os.getpid()
    status, body = await server.call("POST", "/v1/topics?dryRun=true", {"name": "t", "spec": {"partitions": 3, "replicationFactor": 2}})
    assert (status, body["replicaMap"]) == (200, [[0, 1], [1, 2], [2, 0]])
    assert len(threads) == 1 and threads[0].startswith("sc-expensive")
    assert threading.current_thread().name not in threads
    assert await server.call("POST", "/v1/placement", {"partitions": 2, "replicationFactor": 4}) == (
        422,
        error(
            "InsufficientResources",
            "replication factor 4 needs 4 online SPUs, only 3 are online (ids 0, 1, 2): 1 more needed",
        ),
    )


async def test_placement_answers_equal_the_plain_json_encoding(server: api_server.ApiServer) -> None:
    request = {"spus": [{"id": spu_id, "rack": f"r{spu_id % 3}"} for spu_id in range(9)], "partitions": 4321, "replicationFactor": 3}
    assert server.session is not None
    async with server.session.post("/v1/placement", json=request) as response:
        answer = json.loads(await response.read())
    placement_request = placement.request_from_json(request)
    result = placement.compute(placement_request)
    assert answer == placement.result_to_json(result, placement_request.spus)


# ---------------------------------------------------------------------------- watch fan-out


async def next_event(stream: aiohttp.ClientResponse) -> dict[str, Any]:
    line = await asyncio.wait_for(stream.content.readline(), 5)
    assert line.endswith(b"\n"), line
    return json.loads(line)


async def until_sync(stream: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    events = [await next_event(stream)]
    while events[-1]["type"] != "SYNC":
        events.append(await next_event(stream))
    return events


@pytest.mark.parametrize("watchers", [1, 20])
async def test_each_change_is_encoded_once_whatever_the_number_of_watchers(
    server: api_server.ApiServer, monkeypatch: pytest.MonkeyPatch, watchers: int
) -> None:
    await server.put(topic("a"))
    assert server.session is not None
    async with contextlib.AsyncExitStack() as streams:
        opened = [await streams.enter_async_context(server.session.get("/v1/watch/topics")) for _ in range(watchers)]
        websocket = await streams.enter_async_context(server.session.ws_connect("/v1/watch/topics"))
        for stream in opened:
            assert [event["type"] for event in await until_sync(stream)] == ["ADDED", "SYNC"]
        assert (await websocket.receive_json(timeout=5))["type"] == "ADDED"
        assert (await websocket.receive_json(timeout=5))["type"] == "SYNC"
        changes = [(obj.key, models.encode(obj)) for version in range(10) for obj in (topic("a", reason=f"v{version}"), topic(f"new-{version}"))]
        encodings = count_encodings(monkeypatch)
        events: list[list[dict[str, Any]]] = [[] for _ in opened]
        over_websocket = []
        for key, value in changes:  # written as they were encoded above: only the SC encodes from here
            stored = await server.kv_store.get(key)
            if stored is None:
                await server.kv_store.create(key, value)
            else:
                await server.kv_store.update(key, value, stored.mod_revision)
            for received, stream in zip(events, opened, strict=True):
                received.append(await next_event(stream))
            over_websocket.append(await websocket.receive_json(timeout=5))
        assert encodings[0] == 20  # one per change, not one per change and watcher
        assert all(received == events[0] for received in events)
        assert over_websocket == events[0]
        assert [(event["type"], event["object"]["name"]) for event in events[0][:3]] == [
            ("MODIFIED", "a"),
            ("ADDED", "new-0"),
            ("MODIFIED", "a"),
        ]
    assert server.context.watchers.encodings["topics"] >= 20


async def test_a_watcher_that_takes_nothing_is_dropped_while_the_others_get_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(watch_buffer_bytes=256 * 1024, client_stall_seconds=60) as server:
        await server.put(topic("a"))
        table = server.context.local_store["topics"]
        listeners = len(table._listeners)
        assert server.session is not None
        reader, writer = await stalled_client(server, b"GET /v1/watch/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            async with server.session.get("/v1/watch/topics") as reading:
                await until_sync(reading)
                received: list[dict[str, Any]] = []
                for version in range(300):  # 6 MB, far more than the socket buffers and the 256 KB buffer
                    await server.put(topic("a", reason=f"{version:03d}" + "x" * 20_000))
                    received.append(await next_event(reading))
                assert [event["object"]["status"]["reason"][:3] for event in received] == [f"{v:03d}" for v in range(300)]
                assert await until_closed(reader, lambda: server.context.watchers.dropped) == "closed"
                assert server.context.watchers.dropped == {("http", "overflow"): 1}
                assert server.context.watchers.open[("http", "topics")] == 1
        finally:
            writer.close()
        for _ in range(1000):  # the server notices the reading client leave within WATCH_DISCONNECT_POLL_SECONDS (1 s)
            if len(table._listeners) == listeners and not server.context.watchers.total:
                break
            await asyncio.sleep(0.01)
        assert (len(table._listeners), server.context.watchers.total) == (listeners, 0)


async def test_a_watcher_that_takes_nothing_of_its_snapshot_is_dropped_at_the_stall_deadline() -> None:
    async with serving(client_stall_seconds=0.2) as server:
        await server.put(*(topic(f"t{number:03d}", reason="x" * 10_000) for number in range(300)))  # 3 MB
        reader, writer = await stalled_client(server, b"GET /v1/watch/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            assert await until_closed(reader, lambda: server.context.watchers.dropped) == "closed"
        finally:
            writer.close()
        assert server.context.watchers.dropped == {("http", "stalled"): 1}


async def test_watchers_past_the_limits_are_429() -> None:
    async with serving(max_watchers=3, max_watchers_per_address=2) as server:
        assert server.session is not None
        async with server.session.get("/v1/watch/topics") as first, server.session.ws_connect("/v1/watch/spus"):
            await until_sync(first)
            async with server.session.get("/v1/watch/topics") as refused:
                assert (refused.status, refused.headers["Retry-After"]) == (429, "5")
                assert (await refused.json())["error"] == {
                    "code": "TooManyRequests",
                    "message": "the SC already serves 2 watch streams to 127.0.0.1, the limit for one address "
                    "(max_watchers_per_address=2); close some or retry in 5 s",
                }
            async with server.session.get("/metrics") as response:
                text = await response.text()
            assert 'sc_watchers{kind="topics",protocol="http"} 1.0' in text
            assert 'sc_watchers{kind="spus",protocol="websocket"} 1.0' in text
            assert 'sc_watchers_refused_total{protocol="http"} 1.0' in text
        for _ in range(1000):  # as above: the server notices within WATCH_DISCONNECT_POLL_SECONDS
            if not server.context.watchers.total:
                break
            await asyncio.sleep(0.01)
        async with server.session.get("/v1/watch/topics") as again:
            assert again.status == 200
