"""Crash tests: the real `sc run` process SIGKILLed while creating topics, then restarted.

Every topic must end Provisioned with exactly its partitions (none duplicated or missing) and
the start-index chain unbroken; an idle restart writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from controller.reconcile import topic as topic_controller
from store import active_sc, embedded_etcd, etcd, kv, models
from tests import builders
from tests.fixtures import sc_run

pytestmark = pytest.mark.etcd

SPUS = 5
TOPICS = 200


class ScProcess:
    """`sc run` as a child process on a shared etcd, under its own key prefix."""

    def __init__(self, endpoints: list[str], prefix: str, log_path: Path) -> None:
        self.endpoints = endpoints
        self.prefix = prefix
        self.log_path = log_path
        self.port, self.private_port = embedded_etcd.free_ports(2)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            sys.executable, "-m", "controller.cli", "run",
            "--etcd-endpoints", ",".join(f"http://{endpoint}" for endpoint in self.endpoints),
            "--key-prefix", self.prefix,
            "--bind-host", "127.0.0.1",
            "--public-port", str(self.port),
            "--private-port", str(self.private_port),
            # SPUs are recorded Online in etcd and no SPU connects in this test: keep them Online.
            "--spu-offline-grace", "3600",
            "--log-format", "json",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        await sc_run.wait_healthy(self.process, self.url, self.log_path, timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def terminate(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            return self.process.wait(30)
        return self.process.returncode


@pytest.fixture
def sc_process(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> Iterator[ScProcess]:
    process = ScProcess(etcd_server.endpoints, f"/crash-{uuid.uuid4().hex[:8]}/", tmp_path / "sc.log")
    yield process
    process.kill()


async def seed_online_spus(store: etcd.EtcdStore) -> None:
    for spu_id in range(SPUS):
        spu = builders.spu(spu_id)
        await store.create(spu.key, models.encode(spu))


def topic_body(index: int) -> dict[str, object]:
    return {"name": f"t{index:03d}", "spec": {"partitions": 1 + index % 7, "replicationFactor": 3}}


async def create_topics(url: str, indexes: list[int]) -> list[int]:
    """POST the topics (without waiting for provisioning); returns those not acknowledged."""
    failed: list[int] = []
    async with aiohttp.ClientSession() as session:

        async def create(index: int) -> None:
            try:
                async with session.post(f"{url}/v1/topics?timeout=0", json=topic_body(index)) as response:
                    if response.status not in (200, 201, 202, 409):
                        failed.append(index)
            except aiohttp.ClientError:
                failed.append(index)

        for start in range(0, len(indexes), 8):
            await asyncio.gather(*(create(index) for index in indexes[start : start + 8]))
    return failed


async def all_provisioned(store: etcd.EtcdStore, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        topics = {item.key: models.decode("topics", item.value) for item in (await store.list("topics/")).items}
        partitions = [models.decode("partitions", item.value) for item in (await store.list("partitions/")).items]
        done = len(topics) == TOPICS and all(
            topic.status.resolution is models.TopicResolution.PROVISIONED for topic in topics.values()
        )
        if done:
            expected = sorted(
                models.partition_name(topic.name, index)
                for topic in topics.values()
                for index in range(topic.spec.partition_count())
            )
            if sorted(partition.name for partition in partitions) == expected:
                return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not converged: {len(topics)} topics, {len(partitions)} partitions")
        await asyncio.sleep(0.2)


async def test_sigkill_while_creating_200_topics_converges(sc_process: ScProcess, etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    store = await etcd.EtcdStore.open(etcd_server.endpoints, sc_process.prefix)
    try:
        await seed_online_spus(store)
        sc_process.start()
        await sc_process.wait_healthy()
        first_half = asyncio.ensure_future(create_topics(sc_process.url, list(range(TOPICS))))
        # Kill it once provisioning is under way, or at the latest with a quarter of the creates
        # still to come (provisioning can keep up with the creates on a fast machine).
        while (
            len((await store.list("partitions/")).items) < 10 and len((await store.list("topics/")).items) < TOPICS * 3 // 4
        ):
            await asyncio.sleep(0.005)
        sc_process.kill()
        unacknowledged = await first_half
        assert unacknowledged, "the kill came after every create: the test did not crash mid-way"

        sc_process.start()
        await sc_process.wait_healthy()
        assert await create_topics(sc_process.url, unacknowledged) == []
        await all_provisioned(store)

        # Exactly the replica map of every topic, and the chain advanced once per topic.
        topics = [models.decode("topics", item.value) for item in (await store.list("topics/")).items]
        for item in (await store.list("partitions/")).items:
            partition = models.decode("partitions", item.value)
            owner = next(topic for topic in topics if topic.name == partition.topic)
            assert owner.status.replica_map[partition.index] == partition.spec.replicas
        chain = await store.get(topic_controller.CHAIN_KEY)
        assert chain is not None
        assert json.loads(chain.value) == {"nextStartIndex": sum(1 + index % 7 for index in range(TOPICS))}

        # An idle restart writes nothing but its candidacy and its claim (made at start), and their
        # release with its resignation note (one transaction at stop).
        assert sc_process.terminate() == 0
        before = await store.revision()
        sc_process.start()
        await sc_process.wait_healthy()

        async def claimed() -> None:
            # Healthy is not leading yet: on a busy machine the claim may come later.
            claim = await store.get(active_sc.KEY)
            assert claim is not None and claim.mod_revision > before, claim

        await builders.eventually(claimed, timeout=30)
        await asyncio.sleep(1.0)  # idle: room for writes it should not make
        assert sc_process.terminate() == 0
        after = await store.revision()
        assert after == before + 3  # which the events below check
        async with contextlib.aclosing(store.watch("", before + 1)) as events:
            written = [(event.type, event.key) async for event in _until(events, after)]
        candidate = written[0][1]
        assert candidate.startswith(active_sc.CANDIDATES)
        # (_until ends at the first event of the last revision: the rest of that transaction is read back.)
        assert written == [(kv.EventType.PUT, candidate), (kv.EventType.PUT, active_sc.KEY), (kv.EventType.DELETE, active_sc.KEY)]
        resigned = await store.get(active_sc.RESIGNED_KEY)
        assert resigned is not None and resigned.mod_revision == after and await store.get(candidate) is None
    finally:
        await store.close()


async def _until(events: AsyncIterator[kv.WatchEvent], revision: int) -> AsyncIterator[kv.WatchEvent]:
    """The events up to ``revision`` included."""
    async for event in events:
        yield event
        if event.revision >= revision:
            return
