"""Random, truncated and corrupted Fluvio frames (and some HTTP garbage) for a bounded time against a
daemon on a real etcd: it stays healthy, HTTP and Fluvio keep answering, and the store is unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest

from controller.api.fluvio import client as client_module, messages, objects
from store import embedded_etcd
from tests.fixtures import daemon as daemon_fixtures

pytestmark = pytest.mark.etcd

FUZZ_SECONDS = 5.0
WORKERS = 8
SEED = 8

# Requests that read, or that write nothing once corrupted: a mutated Create of a real label could
# be a valid create, so writes are only ever sent truncated (which never decodes).
HEADER = messages.RequestHeader(messages.LIST, 19, 1, "fuzz")
READS = [
    messages.encode_request(messages.RequestHeader(messages.API_VERSIONS, 2, 1, "fluvio"), messages.ApiVersionsRequest("0.15.2", "linux", "x86_64")),
    messages.encode_request(HEADER, messages.ListRequest(objects.TOPIC, ["a"])),
    messages.encode_request(HEADER, messages.ListRequest(objects.SPU)),
    messages.encode_request(messages.RequestHeader(messages.WATCH, 19, 2, "dummy"), messages.WatchRequest(objects.PARTITION)),
]
WRITES = [
    messages.encode_request(
        messages.RequestHeader(messages.CREATE, 19, 3, "fluvio"),
        messages.CreateRequest(objects.TOPIC, "fuzzed", spec=objects.TopicSpec(objects.ComputedReplicas(1, 1, True))),
    ),
    messages.encode_request(messages.RequestHeader(messages.DELETE, 19, 4, "fluvio"), messages.DeleteRequest(objects.TOPIC, "kept")),
    messages.encode_request(messages.RequestHeader(messages.UPDATE, 19, 5, "fluvio"), messages.UpdateRequest(objects.TOPIC, "kept", messages.AddPartition(1))),
    messages.encode_request(messages.RequestHeader(messages.DELETE, 19, 6, "fluvio"), messages.DeleteRequest(objects.CUSTOM_SPU, messages.SpuKeyId(0))),
]


def garbage(rng: random.Random) -> bytes:
    body = rng.randbytes(rng.randrange(0, 300))
    return len(body).to_bytes(4, "big") + body


def truncated_write(rng: random.Random) -> bytes:
    frame = rng.choice(WRITES)
    message = frame[4:]
    cut = message[: rng.randrange(0, len(message))]
    # The length still announces the whole message: the server reads the short body as the frame.
    return len(cut).to_bytes(4, "big") + cut


def corrupted_read(rng: random.Random) -> bytes:
    message = bytearray(rng.choice(READS)[4:])
    for _ in range(rng.randrange(1, 4)):
        message[rng.randrange(len(message))] = rng.randrange(256)
    return len(message).to_bytes(4, "big") + bytes(message)


def unserved_write(rng: random.Random) -> bytes:
    """A well-formed write of a label we do not serve, with a random payload."""
    api_key = rng.choice([messages.CREATE, messages.DELETE, messages.UPDATE])
    label = "Fuzz" + "".join(rng.choice("xyz") for _ in range(rng.randrange(4)))
    payload = rng.randbytes(rng.randrange(0, 40))
    message = (
        api_key.to_bytes(2, "big") + (19).to_bytes(2, "big") + (7).to_bytes(4, "big") + b"\x00\x04fuzz"
        + len(label).to_bytes(2, "big") + label.encode() + len(payload).to_bytes(4, "big") + payload
    )  # fmt: skip
    return len(message).to_bytes(4, "big") + message


def oversized(rng: random.Random) -> bytes:
    return rng.randrange(16 * 1024 * 1024 + 1, 2**31).to_bytes(4, "big")


def http_garbage(rng: random.Random) -> bytes:
    return rng.choice([b"GET /", b"POST /v1/topics HTTP/1.1\r\nContent-Length: 5\r\n\r\n{", b"\x16\x03\x01"]) + rng.randbytes(20)


KINDS: list[Callable[[random.Random], bytes]] = [garbage, truncated_write, corrupted_read, unserved_write, oversized]


async def fuzz_connection(port: int, rng: random.Random, counts: dict[str, int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if rng.random() < 0.1:
            writer.write(http_garbage(rng))
            counts["http"] += 1
        else:
            for _ in range(rng.randrange(1, 4)):
                kind = rng.choice(KINDS)
                frame = kind(rng)
                # Sometimes only part of a frame, then the connection goes away.
                writer.write(frame[: rng.randrange(1, len(frame) + 1)] if rng.random() < 0.2 else frame)
                counts[kind.__name__] += 1
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rng.choice([0.0, 0.01, 0.05])):
                while await reader.read(65536):
                    pass
    except ConnectionError:
        counts["reset"] += 1
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.fixture
async def fuzz_sc(etcd_server: embedded_etcd.EmbeddedEtcd) -> AsyncIterator[daemon_fixtures.Running]:
    async with daemon_fixtures.running(daemon_fixtures.etcd_settings(etcd_server)) as sc:
        yield sc


async def test_fuzzed_frames_change_nothing(fuzz_sc: daemon_fixtures.Running) -> None:
    await fuzz_sc.register_spu(0)
    status, _ = await fuzz_sc.call("POST", "/v1/topics", {"name": "kept", "spec": {"partitions": 2, "replicationFactor": 1}})
    assert status == 201

    async def partitions_created() -> None:
        assert sorted(await fuzz_sc.partitions_of("kept")) == [0, 1]

    await fuzz_sc.eventually(partitions_created)
    before = await fuzz_sc.kv_store.list("")
    port = fuzz_sc.daemon.public_port
    assert port is not None
    rng = random.Random(SEED)
    counts: dict[str, int] = dict.fromkeys([kind.__name__ for kind in KINDS] + ["http", "reset"], 0)
    deadline = time.monotonic() + FUZZ_SECONDS

    async def worker(seed: int) -> None:
        worker_rng = random.Random(seed)
        while time.monotonic() < deadline:
            await fuzz_connection(port, worker_rng, counts)

    # A client that stays connected all along, watching, must be unaffected.
    bystander = await client_module.Client.connect("127.0.0.1", port)
    try:
        watch = bystander.watch(objects.TOPIC)
        await asyncio.wait_for(watch.get(), 5)
        await asyncio.gather(*(worker(rng.randrange(2**32)) for _ in range(WORKERS)))
        assert await fuzz_sc.call("GET", "/healthz") == (200, {"status": "ok"})
        status, topics = await fuzz_sc.call("GET", "/v1/topics")
        assert (status, [topic["name"] for topic in topics]) == (200, ["kept"])
        assert [meta.name for meta in await bystander.list(objects.TOPIC)] == ["kept"]
        assert watch.empty(), "the bystander's watch saw changes"
    finally:
        await bystander.close()
    after = await fuzz_sc.kv_store.list("")
    assert [(item.key, item.value, item.mod_revision) for item in after.items] == [
        (item.key, item.value, item.mod_revision) for item in before.items
    ]
    assert after.revision == before.revision
    assert all(counts[kind.__name__] > 20 for kind in KINDS), counts
    fresh = await client_module.Client.connect("127.0.0.1", port)
    try:
        assert [meta.name for meta in await fresh.list(objects.PARTITION)] == ["kept-0", "kept-1"]
    finally:
        await fresh.close()
