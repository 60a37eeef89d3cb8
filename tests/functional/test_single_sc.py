"""One SC per store: `sc run` uses only the etcd it started, and refuses to run where another SC
is active. Real `sc run` processes, each with its own data dir, on free ports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from controller import config, daemon as daemon_module
from store import active_sc, embedded_etcd, etcd, kv, models
from tests.fixtures import daemon as daemon_fixture

pytestmark = pytest.mark.etcd


class ScRun:
    """`sc run` with its embedded etcd as a child process."""

    def __init__(self, data_dir: Path, etcd_ports: tuple[int, int], *extra: str) -> None:
        self.data_dir = data_dir
        self.public_port, self.private_port = embedded_etcd.free_ports(2)
        self.log_path = data_dir.with_suffix(".log")
        self.command = [
            sys.executable, "-m", "controller.cli", "run",
            "--data-dir", str(data_dir),
            "--embedded-etcd-client-port", str(etcd_ports[0]),
            "--embedded-etcd-peer-port", str(etcd_ports[1]),
            "--bind-host", "127.0.0.1",
            "--public-port", str(self.public_port),
            "--private-port", str(self.private_port),
            "--log-format", "json",
            *extra,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    def start(self, **environment: str) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **environment},
            )

    def wait_exit(self, timeout: float) -> tuple[int, str]:
        assert self.process is not None
        _, stderr = self.process.communicate(timeout=timeout)
        return self.process.returncode, stderr.decode()

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                assert self.process is not None and self.process.poll() is None, self.log_path.read_text()[-3000:]
                try:
                    async with session.get(f"{self.url}/healthz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"sc run not healthy within {timeout} s:\n{self.log_path.read_text()[-3000:]}")
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.communicate()


@pytest.fixture
def processes() -> Iterator[list[ScRun]]:
    started: list[ScRun] = []
    yield started
    for process in started:
        process.stop()


async def test_a_second_sc_run_on_the_same_etcd_ports_fails_within_seconds_naming_port_owner_and_flag(
    tmp_path: Path, processes: list[ScRun]
) -> None:
    etcd_ports = (client_port, _) = embedded_etcd.free_port_pair()
    first = ScRun(tmp_path / "first", etcd_ports)
    processes.append(first)
    first.start()
    await first.wait_healthy()
    etcd_pid = int((tmp_path / "first" / "etcd.lock").read_text().split("etcd pid ")[1])

    second = ScRun(tmp_path / "second", etcd_ports)
    processes.append(second)
    began = time.monotonic()
    second.start()
    code, stderr = second.wait_exit(timeout=30)
    assert time.monotonic() - began < 15  # the interpreter's start included
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        f"error: the embedded etcd cannot start: its client port 127.0.0.1:{client_port} is already in use by "
        f"pid {etcd_pid} (etcd, data dir {tmp_path / 'first' / 'etcd'}); stop that process, or give this SC "
        f"another client port with --embedded-etcd-client-port (or SC_EMBEDDED_ETCD_CLIENT_PORT)"
    )
    await first.wait_healthy(timeout=5)


# ---------------------------------------------------------------------------- one active SC per store


@contextlib.asynccontextmanager
async def store_of(settings: config.Settings) -> AsyncIterator[kv.KVStore]:
    """The test's own client of the store a daemon with ``settings`` uses."""
    store = await etcd.EtcdStore.open(settings.etcd_endpoints, settings.key_prefix, daemon_fixture.REQUEST_TIMEOUT)
    try:
        yield store
    finally:
        await store.close()


def claim_of(identity: active_sc.Identity) -> bytes:
    return identity.encode()


INTRUDER = active_sc.Identity("intruder", "elsewhere", 4242, "10.0.0.9:9003", "2026-01-05T10:00:00+00:00")
INTRUDER_TEXT = "SC intruder (pid 4242 on host elsewhere, public address 10.0.0.9:9003, active since 2026-01-05T10:00:00+00:00)"


async def test_a_second_sc_on_a_store_with_an_active_sc_refuses_naming_the_holder(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=2)
    async with daemon_fixture.running(settings) as first:
        assert first.daemon.active is not None and first.daemon.active.identity is not None
        identity = first.daemon.active.identity
        assert identity.address == f"127.0.0.1:{first.daemon.public_port}" and identity.pid == os.getpid()
        second = daemon_module.Daemon(settings)
        with pytest.raises(active_sc.AnotherScActive) as raised:
            await second.start()
        assert str(raised.value) == (
            f"another SC is active on this store: SC {identity.id} (pid {os.getpid()} on host {identity.host}, "
            f"public address {identity.address}, active since {identity.started}) holds "
            f"{settings.key_prefix}meta/active-sc. Until SC high availability lands, one SC runs per store: "
            "stop that SC first, or give this one a store of its own (--key-prefix, --etcd-endpoints or "
            "--data-dir). A crashed SC's claim ends 2 s after its last keep-alive."
        )
        assert await first.call("GET", "/healthz") == (200, {"status": "ok"})
    # Stopped, the first one gave its claim up: nobody waits for it to expire.
    async with store_of(settings) as store:
        assert await store.get(active_sc.KEY) is None


async def test_a_claim_left_by_a_crashed_sc_delays_the_next_start_by_its_ttl_at_most(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=6)
    async with store_of(settings) as store:
        crashed = await store.grant_lease(2)  # never kept alive: its SC is gone
        await store.claim(active_sc.KEY, claim_of(INTRUDER), crashed.id)
        async with daemon_fixture.running(settings) as sc:
            stored = await store.get(active_sc.KEY)
            assert sc.daemon.active is not None and sc.daemon.active.identity is not None
            assert stored is not None and stored.value == sc.daemon.active.identity.encode()


async def test_an_sc_whose_claim_was_deleted_claims_it_again_and_writes_again(
    etcd_server: embedded_etcd.EmbeddedEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="store.active_sc")
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=2)
    async with daemon_fixture.running(settings) as sc:
        first = await sc.kv_store.get(active_sc.KEY)
        assert first is not None
        await sc.kv_store.delete(active_sc.KEY)

        async def claimed_again() -> None:
            again = await sc.kv_store.get(active_sc.KEY)
            assert again is not None and again.value == first.value and again.create_revision > first.create_revision
            assert await sc.call("GET", "/healthz") == (200, {"status": "ok"})

        await sc.eventually(claimed_again)
        status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "orders", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert status == 202, body
        key = f"{settings.key_prefix}meta/active-sc"
        assert [record.getMessage() for record in caplog.records] == [
            f"this SC lost its claim on {key} ({key} was deleted): writes are paused while it claims it again",
            f"this SC holds {key} again: writes resume",
        ]


async def test_an_sc_whose_claim_another_sc_took_stops_writing(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    settings = daemon_fixture.etcd_settings(etcd_server, active_sc_lease_ttl=2)
    async with daemon_fixture.running(settings) as sc:
        assert sc.daemon.active is not None and sc.daemon.context is not None
        await sc.register_spu(0)
        claimed = await sc.kv_store.get(active_sc.KEY)
        assert claimed is not None
        # Someone writes another SC's claim over it (no lease: it stays).
        await sc.kv_store.update(active_sc.KEY, claim_of(INTRUDER), claimed.mod_revision)
        await asyncio.wait_for(sc.daemon.active.superseded.wait(), 10)
        reason = f"this SC may not write: another SC is active on this store ({INTRUDER_TEXT}); this SC is stopping"
        assert await sc.call("GET", "/healthz") == (503, {"status": "inactive", "reason": reason})
        status, body = await sc.call("POST", "/v1/topics", {"name": "refused", "spec": {"partitions": 1, "replicationFactor": 1}})
        assert (status, body["error"]["code"]) == (503, "Unavailable"), body
        assert reason in body["error"]["message"]
        # A topic written behind its back is seen, decided on, and not written: its action is kept.
        topic = models.Topic.model_validate({"name": "behind", "spec": {"partitions": 1, "replicationFactor": 1}})
        await sc.kv_store.create(topic.key, models.encode(topic))
        metrics = sc.daemon.context.metrics

        async def refused() -> None:
            assert metrics.actions.labels("topics", "update-status", "unavailable")._value.get() >= 1

        await sc.eventually(refused)
        stored = await sc.read("topics", "behind")
        assert stored is not None and stored.status.resolution is models.TopicResolution.INIT
        assert await sc.kv_store.get("topics/refused") is None


async def test_sc_run_exits_naming_the_sc_that_took_its_store_over(tmp_path: Path, processes: list[ScRun]) -> None:
    etcd_ports = embedded_etcd.free_port_pair()
    sc = ScRun(tmp_path / "sc", etcd_ports)
    processes.append(sc)
    sc.start(SC_ACTIVE_SC_LEASE_TTL="2")
    await sc.wait_healthy()
    store = await etcd.EtcdStore.open([f"127.0.0.1:{etcd_ports[0]}"], kv.DEFAULT_PREFIX, 2.0)
    try:
        claimed = await store.get(active_sc.KEY)
        assert claimed is not None
        await store.update(active_sc.KEY, claim_of(INTRUDER), claimed.mod_revision)
        code, stderr = await asyncio.to_thread(sc.wait_exit, 30)
    finally:
        await store.close()
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        f"error: another SC is active on this store: {INTRUDER_TEXT} holds /sc/meta/active-sc. Until SC high "
        "availability lands, one SC runs per store: stop that SC first, or give this one a store of its own "
        "(--key-prefix, --etcd-endpoints or --data-dir). A crashed SC's claim ends 2 s after its last keep-alive."
    )
