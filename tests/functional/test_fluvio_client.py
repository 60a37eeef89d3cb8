"""The real `fluvio` Python client (PyPI 0.21.0) against a running SC on a real etcd.

The client holds Python's global lock while it waits, so it runs in a subprocess with a hard
timeout, never in the test's event loop. SPUs are simulator SPUs (in-process, over real sockets):
the created topics' partitions go Online with the leaders of our placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest

from connection_manager.spu import simulator
from store import embedded_etcd, models
from tests.fixtures import daemon as daemon_fixtures

pytestmark = [
    pytest.mark.etcd,
    pytest.mark.skipif(
        importlib.util.find_spec("fluvio") is None,
        reason="the fluvio client is not installed (pip install fluvio==0.21.0; it is in the dev extra)",
    ),
]

CLIENT_TIMEOUT = 60.0
SPU_IDS = (5001, 5002, 5003)

PRELUDE = """
import json, sys
import fluvio

def emit(key, value):
    print(json.dumps({key: value}), flush=True)

def error_text(call, *args):
    try:
        call(*args)
    except Exception as error:
        return str(error)
    return None

config = fluvio.FluvioConfig.new(sys.argv[1])
"""


class FakeSpus:
    """Plain TCP servers on the SPUs' public ports that record which one a producer dialled, and
    the API key of its first frame (a real SPU would answer; these never do)."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.handlers: set[asyncio.Task[None]] = set()
        self.dialled: asyncio.Queue[tuple[int, int]] = asyncio.Queue()

    async def start(self, count: int) -> list[int]:
        for _ in range(count):
            server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
            self.servers.append(server)
        return [server.sockets[0].getsockname()[1] for server in self.servers]

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("sockname")[1]
        handler = asyncio.current_task()
        assert handler is not None
        self.handlers.add(handler)
        try:
            length = int.from_bytes(await reader.readexactly(4), "big")
            message = await reader.readexactly(length)
            self.dialled.put_nowait((port, int.from_bytes(message[:2], "big")))
            await reader.read()  # hold the connection until the client goes away
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.handlers.discard(handler)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        for handler in list(self.handlers):
            handler.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)
        for server in self.servers:
            await server.wait_closed()


@pytest.fixture
async def fake_spus() -> AsyncIterator[FakeSpus]:
    spus = FakeSpus()
    yield spus
    await spus.stop()


@pytest.fixture
async def fluvio_sc(etcd_server: embedded_etcd.EmbeddedEtcd, fake_spus: FakeSpus) -> AsyncIterator[daemon_fixtures.Running]:
    """The daemon with simulator SPUs (so partitions go Online); their public ports are the fakes'."""
    async with daemon_fixtures.running(daemon_fixtures.etcd_settings(etcd_server)) as sc:
        ports = await fake_spus.start(len(SPU_IDS))
        private_ports = embedded_etcd.free_ports(len(SPU_IDS))
        for spu_id, port, private_port in zip(SPU_IDS, ports, private_ports, strict=True):
            await sc.register_spu(spu_id, online=False, ports=(port, private_port))
        spus = [simulator.SimulatedSpu(spu_id, f"127.0.0.1:{sc.daemon.private_port}") for spu_id in SPU_IDS]
        for spu in spus:
            await spu.start()

        async def all_online() -> None:
            found = await sc.read_all("spus")
            assert {spu.status.resolution for spu in found.values()} == {models.SpuResolution.ONLINE}

        try:
            await sc.eventually(all_online)
            yield sc
        finally:
            for spu in spus:
                await spu.stop()


class ClientRun:
    """One client subprocess: its JSON lines as they come, killed at the latest after CLIENT_TIMEOUT."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.results: dict[str, Any] = {}
        self.output: list[str] = []

    @classmethod
    async def start(cls, sc: daemon_fixtures.Running, script: str) -> ClientRun:
        assert sc.daemon.public_port is not None
        return await cls.start_at(sc.daemon.public_port, script)

    @classmethod
    async def start_at(cls, port: int, script: str) -> ClientRun:
        """A client of the SC whose public port on 127.0.0.1 is ``port``."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PRELUDE + textwrap.dedent(script),
            f"127.0.0.1:{port}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return cls(process)

    async def until(self, key: str) -> Any:
        """Read lines until ``key`` has been emitted; its value."""
        assert self.process.stdout is not None
        async with asyncio.timeout(CLIENT_TIMEOUT):
            while key not in self.results:
                line = await self.process.stdout.readline()
                if not line:
                    raise AssertionError(f"the client ended before emitting {key!r}:\n" + "".join(self.output))
                text = line.decode(errors="replace")
                self.output.append(text)
                if text.startswith("{"):
                    self.results.update(json.loads(text))
        return self.results[key]

    async def finish(self) -> dict[str, Any]:
        """Every result, once the script has ended by itself (it is killed if it overruns)."""
        try:
            await self.until("done")
            async with asyncio.timeout(CLIENT_TIMEOUT):
                await self.process.wait()
        finally:
            await self.kill()
        assert self.process.returncode == 0, "".join(self.output)
        return self.results

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


async def run_client(sc: daemon_fixtures.Running, script: str) -> dict[str, Any]:
    return await (await ClientRun.start(sc, textwrap.dedent(script) + 'emit("done", True)\n')).finish()


async def test_admin_topics_end_to_end(fluvio_sc: daemon_fixtures.Running) -> None:
    first = await run_client(
        fluvio_sc,
        """
        admin = fluvio.FluvioAdmin.connect_with_config(config)
        emit("connected", True)
        admin.create_topic("a-topic")
        emit("duplicate", error_text(admin.create_topic, "a-topic"))
        """,
    )
    assert first == {"connected": True, "duplicate": "Topic already exists", "done": True}
    a_topic = await fluvio_sc.read("topics", "a-topic")
    assert a_topic is not None and a_topic.spec == models.TopicSpec(partitions=1, replication_factor=1, ignore_rack_assignment=True)

    # The placement b-topic will get: the HTTP API's dry run on the same chain.
    status, predicted = await fluvio_sc.call("POST", "/v1/topics?dryRun=true", {"name": "b-topic", "spec": {"partitions": 3, "replicationFactor": 2}})
    assert status == 200
    second = await run_client(
        fluvio_sc,
        """
        admin = fluvio.FluvioAdmin.connect_with_config(config)
        spec = fluvio.TopicSpec.create().with_partitions(3).with_replications(2).with_ignore_rack(False)
        admin.create_topic("b-topic", spec.with_retention_time(3600).with_segment_size(10_000_000).build())
        emit("topics", [topic.name() for topic in admin.all_topics()])
        emit("filtered", [topic.name() for topic in admin.list_topics(["b"])])
        emit("partitions", [partition.name() for partition in admin.list_partitions([])])
        admin.delete_topic("a-topic")
        emit("missing", error_text(admin.delete_topic, "no-such-topic"))
        emit("after_delete", [topic.name() for topic in admin.list_topics([])])
        """,
    )
    assert second == {
        "topics": ["a-topic", "b-topic"],
        "filtered": ["b-topic"],
        "partitions": ["a-topic-0", "b-topic-0", "b-topic-1", "b-topic-2"],
        "missing": "Topic not found",
        "after_delete": ["b-topic"],
        "done": True,
    }
    replica_map = dict(enumerate(predicted["replicaMap"]))
    assert await fluvio_sc.partitions_of("b-topic") == replica_map
    partitions = await fluvio_sc.read_all("partitions")
    assert {index: partitions[f"b-topic-{index}"].spec.leader for index in range(3)} == {
        index: replicas[0] for index, replicas in replica_map.items()
    }
    assert {p.spec.leader for p in partitions.values() if p.topic == "b-topic"} <= set(SPU_IDS)

    async def b_topic_online() -> None:
        found = await fluvio_sc.read_all("partitions")
        for index, replicas in replica_map.items():
            partition = found[f"b-topic-{index}"]
            assert partition.status.resolution is models.PartitionResolution.ONLINE, partition
            assert partition.status.leader is not None and partition.status.leader.spu == replicas[0], partition

    await fluvio_sc.eventually(b_topic_online, timeout=20)

    async def a_topic_gone() -> None:
        assert await fluvio_sc.read("topics", "a-topic") is None
        assert await fluvio_sc.partitions_of("a-topic") == {}

    await fluvio_sc.eventually(a_topic_gone)


async def test_watch_topic_gives_the_snapshot_then_the_delete(fluvio_sc: daemon_fixtures.Running) -> None:
    results = await run_client(
        fluvio_sc,
        """
        admin = fluvio.FluvioAdmin.connect_with_config(config)
        admin.create_topic("w-topic")
        admin.create_topic("kept")
        stream = admin.watch_topic()
        snapshot = next(stream)
        emit("snapshot", sorted(item.name() for item in snapshot.all()))
        admin.delete_topic("w-topic")
        seen = []
        while not any(kind == "delete" for kind, _ in seen):
            update = next(stream)
            seen += [("delete" if change.is_delete() else "update", change.metadata_topic_spec().name()) for change in update.changes()]
        emit("changes", seen)
        """,
    )
    assert results["snapshot"] == ["kept", "w-topic"]
    assert results["changes"][-1] == ["delete", "w-topic"]
    assert all(name == "w-topic" for _, name in results["changes"])


async def test_a_producer_dials_the_leader_spu_it_resolved_through_the_watches(
    fluvio_sc: daemon_fixtures.Running, fake_spus: FakeSpus
) -> None:
    status, body = await fluvio_sc.call("POST", "/v1/topics", {"name": "p-topic", "spec": {"partitions": 1, "replicationFactor": 2}})
    assert status == 201, body
    leader = body["status"]["replicaMap"]["0"][0]

    async def partition_created() -> None:
        assert await fluvio_sc.partitions_of("p-topic") != {}

    await fluvio_sc.eventually(partition_created)
    spus = await fluvio_sc.read_all("spus")
    leader_port = next(spu.spec.public_endpoint.port for spu in spus.values() if spu.spec.id == leader)
    run = await ClientRun.start(
        fluvio_sc,
        """
        client = fluvio.Fluvio.connect_with_config(config)
        producer = client.topic_producer("p-topic")
        emit("producer", True)
        emit("unknown", error_text(client.topic_producer, "no-such-topic"))
        producer.send_string("hello")
        producer.flush()  # never returns: the fake SPU does not answer
        """,
    )
    try:
        assert await run.until("producer") is True
        assert await run.until("unknown") is not None
        async with asyncio.timeout(CLIENT_TIMEOUT):
            port, api_key = await fake_spus.dialled.get()
    finally:
        await run.kill()
    # The client's first frame to an SPU is ApiVersions (18), sent to the leader's advertised port.
    assert (port, api_key) == (leader_port, 18)
