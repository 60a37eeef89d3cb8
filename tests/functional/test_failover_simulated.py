"""Failover with simulator SPUs: the daemon on a real etcd, SPUs replicating offsets over real sockets,
SPU processes killed with SIGKILL; every result read back from etcd. Also a topic, and an SPU,
deleted and created again under the same name while the SPU processes stay connected, also while the
SC's watch was down (it learns of it by relisting)."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from connection_manager import wire
from connection_manager.spu import settings as settings_module, simulator
from controller import config
from store import embedded_etcd, etcd, kv, models
from tests.fixtures import daemon as daemon_fixture, tcp_proxy
from tests.fixtures.daemon import Running, etcd_settings, running

pytestmark = pytest.mark.etcd

SPUS = 3


@pytest.fixture
async def sc(etcd_server: embedded_etcd.EmbeddedEtcd) -> AsyncIterator[Running]:
    settings = etcd_settings(etcd_server, spu_heartbeat_timeout=2.0, spu_offline_grace=5.0)
    async with running(settings) as handle:
        for spu_id, ports in enumerate(zip(*[iter(embedded_etcd.free_ports(2 * SPUS))] * 2)):
            await handle.register_spu(spu_id, online=False, ports=ports)
        yield handle


def private_address(sc: Running) -> str:
    return f"127.0.0.1:{sc.daemon.private_port}"


async def partitions(sc: Running) -> dict[str, models.Partition]:
    return await sc.read_all("partitions")


async def spus_online(sc: Running, count: int) -> None:
    found = await sc.read_all("spus")
    online = [spu for spu in found.values() if spu.status.resolution is models.SpuResolution.ONLINE]
    assert len(online) == count, found


async def create_topic(sc: Running, name: str, count: int, replication_factor: int) -> None:
    await sc.eventually(lambda: spus_online(sc, replication_factor), timeout=30)
    body: dict[str, Any] = {"name": name, "spec": {"partitions": count, "replicationFactor": replication_factor}}
    status, answer = await sc.call("POST", "/v1/topics", body)
    assert status == 201, answer


async def all_online_in_sync(sc: Running, lrs: int) -> None:
    found = await partitions(sc)
    assert found, "no partitions yet"
    for partition in found.values():
        assert partition.status.resolution is models.PartitionResolution.ONLINE, partition
        assert partition.status.lrs == lrs, partition


def spu_process(sc: Running, spu_id: int, token_file: Path | None = None) -> subprocess.Popen[bytes]:
    token = [] if token_file is None else ["--token-file", str(token_file)]
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "spu", "run", "--id", str(spu_id), "--sc-private", private_address(sc),
         "--log-format", "json", "--log-level", "warning", *token],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(process: subprocess.Popen[bytes], how: signal.Signals = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(how)
    process.wait(20)


async def test_killing_the_leader_process_moves_every_leadership_to_an_in_sync_follower_and_back(sc: Running) -> None:
    processes = {spu_id: spu_process(sc, spu_id) for spu_id in range(SPUS)}
    try:
        await create_topic(sc, "orders", 6, 3)
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=2), timeout=30)
        before = await partitions(sc)
        led_by_0 = sorted(name for name, p in before.items() if p.spec.leader == 0)
        assert len(led_by_0) == 2
        stop(processes[0], signal.SIGKILL)

        async def moved() -> None:
            now = await partitions(sc)
            for name in led_by_0:
                partition = now[name]
                assert partition.spec.leader in (1, 2) and partition.status.resolution is models.PartitionResolution.ONLINE, partition
                # The new leader held every committed record: its LEO was at least the old HW.
                old = before[name].status
                assert old.leader is not None and partition.status.leader is not None
                assert partition.status.leader.leo >= old.leader.hw

        await sc.eventually(moved, timeout=15)
        spu = await sc.read("spus", "spu-0")
        assert spu is not None and spu.status.resolution is models.SpuResolution.OFFLINE
        # SPU 0 comes back empty (no data dir): it catches up, is in sync, and leads again.
        processes[0] = spu_process(sc, 0)

        async def preferred_back() -> None:
            now = await partitions(sc)
            assert sorted(name for name, p in now.items() if p.spec.leader == 0) == led_by_0
            assert all(p.spec.leader == p.spec.replicas[0] for p in now.values())

        await sc.eventually(preferred_back, timeout=30)
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=2), timeout=30)
    finally:
        for process in processes.values():
            stop(process)
    assert [process.returncode for spu_id, process in sorted(processes.items())] == [0, 0, 0]


async def test_all_replicas_gone_is_leader_offline_until_the_last_leader_returns(sc: Running, tmp_path: Path) -> None:
    def start(spu_id: int) -> simulator.SimulatedSpu:
        return simulator.SimulatedSpu(spu_id, private_address(sc), data_dir=tmp_path)

    spus = {spu_id: start(spu_id) for spu_id in (0, 1)}
    for spu in spus.values():
        await spu.start()
    try:
        await sc.eventually(lambda: spus_online(sc, 2), timeout=30)
        body = {"name": "pair", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}}
        status, answer = await sc.call("POST", "/v1/topics", body)
        assert status == 201, answer
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=1), timeout=20)
        await spus[0].stop()  # the leader: SPU 1 takes over, alone in the in-sync set
        await sc.eventually(lambda: _leader_is(sc, "pair-0", 1, models.PartitionResolution.ONLINE, isr=[1]), timeout=15)
        await spus[1].stop()  # the last replica: nobody may lead
        await sc.eventually(lambda: _leader_is(sc, "pair-0", 1, models.PartitionResolution.LEADER_OFFLINE, isr=[1]), timeout=15)
        # SPU 0 missed what SPU 1 committed alone: it may not lead. SPU 1, the last leader, back
        # with its log (its data dir), may.
        spus[0] = start(0)
        await spus[0].start()
        await sc.eventually(lambda: spus_online(sc, 1), timeout=15)
        await asyncio.sleep(1.0)
        await _leader_is(sc, "pair-0", 1, models.PartitionResolution.LEADER_OFFLINE, isr=[1])
        spus[1] = start(1)
        await spus[1].start()
        await sc.eventually(lambda: _leader_is(sc, "pair-0", 1, models.PartitionResolution.ONLINE), timeout=15)
    finally:
        for spu in spus.values():
            await spu.stop()


async def test_the_last_replica_back_without_its_log_may_not_lead(sc: Running) -> None:
    """Without a data dir a restarted simulator holds nothing: the records its membership promised
    are gone, so it leaves the in-sync set and only an unclean election could give a leader."""
    spu = simulator.SimulatedSpu(0, private_address(sc))
    await spu.start()
    try:
        await sc.eventually(lambda: spus_online(sc, 1), timeout=30)
        body = {"name": "solo", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0]}]}}
        status, answer = await sc.call("POST", "/v1/topics", body)
        assert status == 201, answer
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=0), timeout=20)

        async def committed_and_reported() -> None:
            # Records committed, and reported (offsets interval 1 s): the SC knows they exist.
            status, shown = await sc.call("GET", "/v1/partitions/solo-0")
            assert status == 200 and shown["status"]["leader"]["hw"] > 0, shown

        await sc.eventually(committed_and_reported, timeout=15)
        await spu.stop()
        await sc.eventually(lambda: _leader_is(sc, "solo-0", 0, models.PartitionResolution.LEADER_OFFLINE, isr=[0]), timeout=15)
        spu = simulator.SimulatedSpu(0, private_address(sc))
        await spu.start()
        await sc.eventually(lambda: _leader_is(sc, "solo-0", 0, models.PartitionResolution.LEADER_OFFLINE, isr=[]), timeout=15)
    finally:
        await spu.stop()


async def test_idle_spus_send_nothing_per_partition(sc: Running) -> None:
    """The issue's cost: an idle cluster's SPUs used to send every partition they lead every
    400 ms. Now, once nothing changes, they send heartbeats only: no entry reaches the SC."""
    idle = settings_module.SpuSettings(append_records=0)
    spus = [simulator.SimulatedSpu(spu_id, private_address(sc), settings=idle) for spu_id in range(SPUS)]
    for spu in spus:
        await spu.start()
    try:
        await create_topic(sc, "idle", 30, 3)
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=2), timeout=30)
        connections = sc.daemon.connections
        assert connections is not None

        async def silent_for_2_s() -> None:
            # The leaders say what they lead once, when they start to lead (on a busy machine that
            # may be late): then a whole 2 s pass with heartbeats only. Reports every 400 ms, the
            # issue's cost, would never let 2 s pass.
            entries, frames = connections.live.reports, dict(connections.stats.frames)
            await asyncio.sleep(2.0)
            assert connections.live.reports == entries
            assert {kind: count - frames.get(kind, 0) for kind, count in connections.stats.frames.items() if kind != "heartbeat"} == {
                kind: 0 for kind in connections.stats.frames if kind != "heartbeat"
            }

        await asyncio.sleep(1.5)  # what the leaders say once, when they start to lead
        await sc.eventually(silent_for_2_s, timeout=30)
    finally:
        for spu in spus:
            await spu.stop()


async def _leader_is(
    sc: Running, name: str, leader: int | None, resolution: models.PartitionResolution, isr: list[int] | None = None
) -> None:
    partition = (await partitions(sc))[name]
    assert partition.status.resolution is resolution, partition
    if leader is not None:
        assert partition.spec.leader == leader, partition
    if isr is not None:
        assert partition.status.isr == isr, partition


async def test_drain_never_leaves_a_partition_without_a_leader(sc: Running) -> None:
    spus = [simulator.SimulatedSpu(spu_id, private_address(sc)) for spu_id in range(SPUS)]
    for spu in spus:
        await spu.start()
    try:
        await create_topic(sc, "orders", 6, 3)
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=2), timeout=30)
        seen: list[models.PartitionResolution] = []
        start = await sc.kv_store.revision() + 1

        async def watch() -> None:
            async for event in sc.kv_store.watch("partitions/", start):
                if event.value is not None:
                    seen.append(models.decode("partitions", event.value).status.resolution)

        watcher = asyncio.create_task(watch())
        status, body = await sc.call("POST", "/v1/spus/spu-0/drain")
        assert (status, body["drained"]) == (200, True), body
        await spus[0].stop()
        await asyncio.sleep(0.5)  # room for a partition to lose its leader, had one been left on SPU 0

        def moves_seen() -> None:
            assert seen  # the drain's moves, as the watch delivers them (late on a busy machine)

        await sc.eventually(moves_seen)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        assert seen and models.PartitionResolution.LEADER_OFFLINE not in seen
        assert all(p.spec.leader != 0 and p.status.resolution is models.PartitionResolution.ONLINE for p in (await partitions(sc)).values())
    finally:
        for spu in spus:
            await spu.stop()


class Impostor:
    """Claims to be an SPU on the private port in a loop (bounded), pushing a forged report right
    behind each Register: a high watermark of 1,000,000 and every follower at LEO 0."""

    def __init__(self, sc: Running, spu_id: int, partitions: list[str]) -> None:
        self.url = f"ws://{private_address(sc)}{wire.SPU_PATH}"
        self.spu_id = spu_id
        self.forged = wire.Offsets(
            partitions=[
                wire.PartitionOffsets(
                    partition=name, leader_epoch=0, hw=1_000_000, leo=1_000_000,
                    followers=[wire.ReplicaOffsets(spu=spu, hw=0, leo=0) for spu in range(SPUS) if spu != spu_id],
                )
                for name in partitions
            ]
        )
        self.answers: collections.Counter[str] = collections.Counter()
        self.stopping = asyncio.Event()

    async def run(self, max_tries: int) -> None:
        async with aiohttp.ClientSession() as client:
            for _ in range(max_tries):
                if self.stopping.is_set():
                    return
                async with client.ws_connect(self.url) as websocket:
                    await websocket.send_bytes(wire.encode(wire.Register(spu_id=self.spu_id)))
                    await websocket.send_bytes(wire.encode(self.forged))
                    answer = wire.parse_sc_message((await websocket.receive(timeout=5)).data)
                    self.answers[getattr(answer, "code", answer.type)] += 1
                await asyncio.sleep(0.01)


async def no_forged_offsets(sc: Running) -> None:
    status, shown = await sc.call("GET", "/v1/partitions")
    assert status == 200, shown
    assert all(p["status"].get("leader", {}).get("hw", 0) < 1_000_000 for p in shown), shown


@pytest.mark.parametrize("with_token", [False, True])
async def test_an_impostor_cannot_take_over_a_live_spu_and_its_death_is_noticed(
    etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path, with_token: bool
) -> None:
    """The measured attack: a client registering as SPU 0 in a loop while SPU 0 runs. It never
    replaces SPU 0, its forged reports never count; when SPU 0 is killed its partitions get new
    leaders (with a token the impostor keeps trying meanwhile and is never let in), and SPU 0
    restarted takes its place back."""
    token_file = tmp_path / "spu.token" if with_token else None
    if token_file is not None:
        token_file.write_text("s3cret\n")
    settings = etcd_settings(etcd_server, spu_heartbeat_timeout=2.0, spu_offline_grace=5.0, spu_token_file=token_file)
    async with running(settings) as sc:
        for spu_id, ports in enumerate(zip(*[iter(embedded_etcd.free_ports(2 * SPUS))] * 2)):
            await sc.register_spu(spu_id, online=False, ports=ports)
        processes = {spu_id: spu_process(sc, spu_id, token_file) for spu_id in range(SPUS)}
        connections = sc.daemon.connections
        assert connections is not None
        try:
            await create_topic(sc, "orders", 6, 3)
            await sc.eventually(lambda: all_online_in_sync(sc, lrs=2), timeout=30)
            before = await partitions(sc)
            led_by_0 = sorted(name for name, p in before.items() if p.spec.leader == 0)
            sessions = dict(connections.sessions)
            impostor = Impostor(sc, 0, led_by_0)
            await impostor.run(max_tries=40)
            assert impostor.answers == {"unauthorized" if with_token else "already-connected": 40}
            # SPU 0 was never replaced, nothing forged counted, every partition stayed as it was.
            assert connections.sessions == sessions
            await no_forged_offsets(sc)
            await all_online_in_sync(sc, lrs=2)
            assert {name: p.spec.leader for name, p in (await partitions(sc)).items()} == {
                name: p.spec.leader for name, p in before.items()
            }

            # SPU 0 dies. With a token the impostor keeps trying all along; without one it has
            # stopped (whoever registers first after a death is SPU 0 when nothing proves identity).
            trying = asyncio.create_task(impostor.run(max_tries=2_000)) if with_token else None
            stop(processes[0], signal.SIGKILL)

            async def moved() -> None:
                now = await partitions(sc)
                for name in led_by_0:
                    assert now[name].spec.leader in (1, 2), now[name]
                    assert now[name].status.resolution is models.PartitionResolution.ONLINE, now[name]

            await sc.eventually(moved, timeout=15)
            assert set(connections.sessions) == {1, 2} and connections.sessions[1] is sessions[1]
            # SPU 0 comes back; the preferred leaders return to it once it is in sync.
            processes[0] = spu_process(sc, 0, token_file)

            async def preferred_back() -> None:
                now = await partitions(sc)
                assert all(p.spec.leader == p.spec.replicas[0] for p in now.values()), now
                await all_online_in_sync(sc, lrs=2)

            await sc.eventually(preferred_back, timeout=30)
            if trying is not None:
                impostor.stopping.set()
                await trying
                assert set(impostor.answers) == {"unauthorized"}, impostor.answers
            await no_forged_offsets(sc)
        finally:
            for process in processes.values():
                stop(process)
    assert [process.returncode for _, process in sorted(processes.items())] == [0, 0, 0]


def fast_spu_process(sc: Running, spu_id: int) -> subprocess.Popen[bytes]:
    """An SPU process whose leaders append 10,000 records a second: a partition's HW is soon far
    above what a new log of the same name reaches in the moments after it is created."""
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "spu", "run", "--id", str(spu_id), "--sc-private", private_address(sc),
         "--append-interval", "0.1", "--append-records", "1000", "--log-format", "json", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_a_topic_deleted_and_created_again_through_the_api_is_a_new_topic(sc: Running) -> None:
    """Its leader stays connected throughout. Created again after the delete was pushed (its leader
    had confirmed the old partition at the same epoch), the new partition stayed Offline for good:
    the simulator never said `leading` again. Created again at once (within one push), it was
    written Online though its leader never confirmed it, with the old partition's HW, and its SPUs
    were told nothing (they kept the old log)."""
    processes = {spu_id: fast_spu_process(sc, spu_id) for spu_id in (0, 1)}
    body = {"name": "again", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}}
    try:
        await sc.eventually(lambda: spus_online(sc, 2), timeout=30)
        for at_once in (False, True, True):
            status, answer = await sc.call("POST", "/v1/topics", body)
            assert status == 201, answer
            await sc.eventually(lambda: all_online_in_sync(sc, lrs=1), timeout=20)
            old_hw = await live_hw_at_least(sc, "again-0", 20_000)
            old_uid = (await partitions(sc))["again-0"].uid
            since = (await sc.kv_store.list("partitions/")).revision + 1
            status, answer = await sc.call("DELETE", "/v1/topics/again")
            assert status in (200, 202), answer
            if not at_once:
                await sc.eventually(lambda: gone(sc, "again-0"), timeout=10)
                await asyncio.sleep(0.2)  # the SPUs are told it is gone
            # The API may refuse the name until the delete is through: ask again at once.
            for _ in range(400):
                status, answer = await sc.call("POST", "/v1/topics", body)
                if status == 201:
                    break
                await asyncio.sleep(0.005)
            assert status == 201, answer

            async def confirmed_anew() -> models.Partition:
                partition = (await partitions(sc)).get("again-0")
                assert partition is not None and partition.status.resolution is models.PartitionResolution.ONLINE, partition
                return partition

            await eventually_value(sc, confirmed_anew, timeout=20)
            # Written Online with what the new partition's leader reported, not the old one's HW: its
            # first Online write (a later write may carry a HW the new log reached since, on a loaded
            # machine even above the old one's).
            online = await first_online_write(sc, "again-0", since, other_than=old_uid)
            assert online.status.leader is not None and online.status.leader.hw < old_hw, (online, old_hw)
            await sc.eventually(lambda: all_online_in_sync(sc, lrs=1), timeout=20)
            status, answer = await sc.call("DELETE", "/v1/topics/again")
            assert status in (200, 202), answer
            await sc.eventually(lambda: gone(sc, "again-0"), timeout=10)
    finally:
        for process in processes.values():
            stop(process)
    assert [process.returncode for _, process in sorted(processes.items())] == [0, 0]


async def test_a_topic_deleted_and_created_again_while_the_scs_watch_was_down_is_a_new_topic(
    etcd_server: embedded_etcd.EmbeddedEtcd,
) -> None:
    """The SC's connection to etcd is cut; meanwhile the topic and its partition are deleted and
    created again in etcd (as another SC would: the topic as it was, a new partition Offline at
    epochs 0), and etcd compacts its history: the SC's watch cannot resume, and the SC relists. Its
    leader stays connected throughout. Before, the relist was taken for an update of the old
    partition: the new one was written Online at once (its leader had confirmed the old one at the
    same epoch) with the old one's HW, and its SPUs were not told the old replica was gone (they
    kept the old log)."""
    async with tcp_proxy.TcpProxy(etcd_server.host, etcd_server.client_port) as proxy:
        settings = config.Settings(
            store=config.StoreKind.ETCD, etcd_endpoints=[proxy.endpoint], key_prefix=f"/sc-test/{uuid.uuid4().hex}/",
            spu_heartbeat_timeout=2.0, spu_offline_grace=5.0, **daemon_fixture.COMMON_SETTINGS,
        )  # fmt: skip
        async with (
            running(settings) as sc,
            await etcd.EtcdStore.open(etcd_server.endpoints, settings.key_prefix, 2.0) as direct,
        ):
            for spu_id, ports in enumerate(zip(*[iter(embedded_etcd.free_ports(4))] * 2)):
                await sc.register_spu(spu_id, online=False, ports=ports)
            processes = {spu_id: fast_spu_process(sc, spu_id) for spu_id in (0, 1)}
            try:
                await sc.eventually(lambda: spus_online(sc, 2), timeout=30)
                body = {"name": "again", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}}
                status, answer = await sc.call("POST", "/v1/topics", body)
                assert status == 201, answer
                await sc.eventually(lambda: all_online_in_sync(sc, lrs=1), timeout=20)
                old_hw = await live_hw_at_least(sc, "again-0", 20_000)
                topic_key, partition_key = models.object_key("topics", "again"), models.object_key("partitions", "again-0")
                stored_topic = await direct.get(topic_key)
                assert stored_topic is not None
                new = models.new_partition(models.decode("topics", stored_topic.value), 0, [0, 1])

                proxy.hold()
                proxy.sever()
                await direct.txn([], [kv.Delete(partition_key), kv.Delete(topic_key)])
                await direct.txn([], [kv.Put(topic_key, stored_topic.value), kv.Put(partition_key, models.encode(new))])
                await direct.compact(await direct.revision())
                proxy.release()

                async def confirmed_anew() -> models.Partition:
                    stored = await direct.get(partition_key)
                    assert stored is not None
                    partition = models.decode("partitions", stored.value)
                    assert partition.status.resolution is models.PartitionResolution.ONLINE, partition
                    return partition

                online = await eventually_value(sc, confirmed_anew, timeout=20)
                # Written Online with what the new partition's leader reported, not the old one's HW.
                assert online.status.leader is not None and online.status.leader.hw < old_hw, (online, old_hw)
                await sc.eventually(lambda: all_online_in_sync(sc, lrs=1), timeout=20)
                context = sc.daemon.context
                assert context is not None
                # The first listing, and the relist: the change came through no watch.
                assert context.metrics.registry.get_sample_value("sc_reader_relists_total", {"kind": "partitions"}) == 2.0
            finally:
                for process in processes.values():
                    stop(process)
    assert [process.returncode for _, process in sorted(processes.items())] == [0, 0]


async def test_a_partition_whose_uid_is_changed_in_place_is_not_left_online_on_replicas_that_dropped_its_log(sc: Running) -> None:
    """The stored partition of a topic replicated on SPUs 0 and 1 is written again by hand (same
    key, same create revision) with another uid and nothing else changed. Its SPUs take it for
    another partition, as the protocol asks, and drop their logs: no replica holds the committed
    records any more. Before, the SC's mirror took a change of the uid alone for the same value
    written again and woke nobody, so the SPUs were told the new uid only at the partition's next
    change, whatever it was; and once told, the SC kept the partition Online, its leader at its
    epoch and both SPUs in the in-sync set, though both had started the log empty. Now the SPUs are
    told at once, and the SC takes them for replicas that came back without the records: the
    partition has no leader, and its in-sync set is emptied (only an unclean election, which
    records the loss, gives it one)."""
    processes = {spu_id: fast_spu_process(sc, spu_id) for spu_id in (0, 1)}
    body = {"name": "edited", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}}
    key = models.object_key("partitions", "edited-0")
    try:
        await sc.eventually(lambda: spus_online(sc, 2), timeout=30)
        status, answer = await sc.call("POST", "/v1/topics", body)
        assert status == 201, answer
        await sc.eventually(lambda: all_online_in_sync(sc, lrs=1), timeout=20)
        await live_hw_at_least(sc, "edited-0", 20_000)
        stored = await sc.kv_store.get(key)
        assert stored is not None
        before = models.decode("partitions", stored.value)
        assert before.uid is not None
        edited = before.model_copy(update={"uid": before.uid % models.MAX_PARTITION_UID + 1})
        await sc.kv_store.txn([kv.Compare(key, stored.mod_revision)], [kv.Put(key, models.encode(edited))])

        async def leaderless_with_nobody_in_sync() -> None:
            partition = (await partitions(sc))["edited-0"]
            assert partition.uid == edited.uid, partition
            assert partition.status.resolution is models.PartitionResolution.LEADER_OFFLINE, partition
            assert partition.status.isr == [], partition
            assert partition.status.leader_epoch > before.status.leader_epoch, partition

        await sc.eventually(leaderless_with_nobody_in_sync, timeout=20)
    finally:
        for process in processes.values():
            stop(process)
    assert [process.returncode for _, process in sorted(processes.items())] == [0, 0]


async def first_online_write(sc: Running, name: str, since: int, other_than: int | None) -> models.Partition:
    """The first write since revision ``since`` that made partition ``name`` (of another uid than
    ``other_than``) Online, as the store holds it (one was seen, so the watch does not wait)."""
    events = sc.kv_store.watch(f"partitions/{name}", since)
    try:
        async for event in events:
            if event.key != f"partitions/{name}" or event.value is None:
                continue
            partition = models.decode("partitions", event.value)
            if partition.uid != other_than and partition.status.resolution is models.PartitionResolution.ONLINE:
                return partition
    finally:
        await events.aclose()
    raise AssertionError(f"no Online write of {name!r} since revision {since}")


async def live_hw_at_least(sc: Running, name: str, hw: int) -> int:
    """Once the API shows ``name``'s leader at ``hw`` or beyond: the HW it shows."""

    async def reached() -> int:
        status, answer = await sc.call("GET", f"/v1/partitions/{name}")
        assert status == 200, answer
        shown = (answer["status"].get("leader") or {}).get("hw", -1)
        assert shown >= hw, answer
        return int(shown)

    return await eventually_value(sc, reached, timeout=20)


async def gone(sc: Running, name: str) -> None:
    assert name not in await partitions(sc)


async def eventually_value(sc: Running, check: Any, timeout: float) -> Any:
    """``sc.eventually`` that returns what ``check`` returned when it passed."""
    found: list[Any] = []

    async def passes() -> None:
        found.append(await check())

    await sc.eventually(passes, timeout=timeout)
    return found[-1]


async def test_an_spu_deleted_and_registered_again_through_the_api_is_a_new_spu(sc: Running) -> None:
    """Its process stays connected throughout. The registration its connection was accepted for is
    gone: the SC closes that connection, and the process joins again as the new SPU (a new
    incarnation). Before, when the new object came within one push, the old connection stayed and
    the new object went Online on it."""
    process = spu_process(sc, 2)
    connections = sc.daemon.connections
    assert connections is not None
    try:
        await sc.eventually(lambda: spu_online(sc, "spu-2"), timeout=30)
        old = connections.sessions[2]
        spec = (await sc.read("spus", "spu-2")).spec.model_dump(mode="json", by_alias=True)  # type: ignore[union-attr]  # read back: it exists
        status, answer = await sc.call("DELETE", "/v1/spus/spu-2")
        assert status in (200, 202), answer
        status, answer = await sc.call("POST", "/v1/spus", {"name": "spu-2", "spec": spec})
        assert status == 201, answer
        registered = await sc.kv_store.get(models.object_key("spus", "spu-2"))
        assert registered is not None

        async def joined_anew() -> None:
            assert old.closing is not None and old.closing[0] == "unregistered", old.closing
            session = connections.sessions.get(2)
            assert session is not None and session is not old and session.ready, session
            assert session.registered_at == registered.create_revision
            await spu_online(sc, "spu-2")

        await sc.eventually(joined_anew, timeout=20)
    finally:
        stop(process)
    assert process.returncode == 0


async def spu_online(sc: Running, name: str) -> None:
    spu = await sc.read("spus", name)
    assert spu is not None and spu.status.resolution is models.SpuResolution.ONLINE, spu


def spu_process_with_logs(sc: Running, spu_id: int, data_dir: Path, append_records: int) -> subprocess.Popen[bytes]:
    """An SPU process that keeps its logs in ``data_dir`` (a restarted one resumes them), its
    leaders appending ``append_records`` records every 0.1 s."""
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "spu", "run", "--id", str(spu_id), "--sc-private", private_address(sc),
         "--data-dir", str(data_dir), "--append-interval", "0.1", "--append-records", str(append_records),
         "--log-format", "json", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def test_an_spu_back_from_away_does_not_take_its_old_log_for_a_partition_created_again(sc: Running, tmp_path: Path) -> None:
    """SPU 0 alone holds topic `again`; its process is killed, the topic deleted and created again
    with the same placement (its partition starts again at leader epoch 0), and the process
    restarted from its data directory. It said it held `again-0` up to the old log's end, and the
    simulator resumed that log for the new partition: SPU 0 came back as a replica holding the
    committed records, led the new partition with the old one's, and the SC showed and wrote the
    old HW for a partition just created. Its log names the partition's create revision now: the
    SC takes it for no record of the new partition, and the simulator starts the new one empty
    (the restarted process appends nothing: its HW stays 0)."""
    body = {"name": "again", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0]}]}}
    process = spu_process_with_logs(sc, 0, tmp_path, append_records=1_000)
    try:
        await sc.eventually(lambda: spu_online(sc, "spu-0"), timeout=30)
        status, answer = await sc.call("POST", "/v1/topics", body)
        assert status == 201, answer
        old_hw = await live_hw_at_least(sc, "again-0", 5_000)
        stop(process, signal.SIGKILL)

        async def leaderless() -> None:
            partition = (await partitions(sc)).get("again-0")
            assert partition is not None and partition.status.resolution is models.PartitionResolution.LEADER_OFFLINE, partition

        await sc.eventually(leaderless, timeout=20)
        status, answer = await sc.call("DELETE", "/v1/topics/again")
        assert status in (200, 202), answer
        await sc.eventually(lambda: gone(sc, "again-0"), timeout=10)
        status, answer = await sc.call("POST", "/v1/topics", body)
        assert status == 201, answer
        process = spu_process_with_logs(sc, 0, tmp_path, append_records=0)

        async def led_by_0() -> None:
            partition = (await partitions(sc)).get("again-0")
            assert partition is not None and partition.status.resolution is models.PartitionResolution.ONLINE, partition
            assert partition.spec.leader == 0, partition

        await sc.eventually(led_by_0, timeout=30)
        # Its leader's first report: what it holds of the new partition.
        assert await live_hw_at_least(sc, "again-0", 0) == 0 < old_hw
        stored = (await partitions(sc))["again-0"]
        assert stored.status.leader is not None and stored.status.leader.hw < old_hw, stored.status
    finally:
        stop(process)
    assert process.returncode == 0


async def test_an_spu_keeps_its_log_when_the_scs_store_was_copied_key_by_key(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:
    """The SC's store is migrated as `etcdctl make-mirror` does it: every key written anew, with
    the same content, into another store (here another key prefix), where each has a new create
    revision. An SC on the copy, and SPU 0 restarted from its data directory, must go on with the
    same partition: before, its identity was its key's create revision, so the copy was another
    partition to the SPU, which started it empty (the committed records lost, the HW back to 0)."""
    original = etcd_settings(etcd_server, spu_heartbeat_timeout=2.0, spu_offline_grace=5.0)
    body = {"name": "moved", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0]}]}}
    async with running(original) as sc:
        first, second = embedded_etcd.free_ports(2)
        await sc.register_spu(0, online=False, ports=(first, second))
        process = spu_process_with_logs(sc, 0, tmp_path, append_records=1_000)
        try:
            await sc.eventually(lambda: spu_online(sc, "spu-0"), timeout=30)
            status, answer = await sc.call("POST", "/v1/topics", body)
            assert status == 201, answer
            old_hw = await live_hw_at_least(sc, "moved-0", 5_000)
        finally:
            stop(process)
        assert process.returncode == 0

        async def written() -> int:
            stored = (await partitions(sc))["moved-0"]
            assert stored.status.leader is not None and stored.status.leader.hw >= old_hw, stored.status
            return stored.status.leader.hw

        # What the SPU last held is committed in the store before it is copied.
        stored_hw = await eventually_value(sc, written, timeout=20)
    copy = etcd_settings(etcd_server, spu_heartbeat_timeout=2.0, spu_offline_grace=5.0)
    async with (
        await etcd.EtcdStore.open(etcd_server.endpoints, original.key_prefix, 2.0) as source,
        await etcd.EtcdStore.open(etcd_server.endpoints, copy.key_prefix, 2.0) as target,
    ):
        listed = await source.list("")
        # As make-mirror copies a small store: what is there in one transaction, without the keys'
        # leases (held by a process gone now).
        await target.txn([], [kv.Put(item.key, item.value) for item in listed.items if not item.lease])
        copied = await target.get(models.object_key("partitions", "moved-0"))
        original_key = await source.get(models.object_key("partitions", "moved-0"))
        assert copied is not None and original_key is not None and copied.create_revision != original_key.create_revision
    async with running(copy) as sc:
        process = spu_process_with_logs(sc, 0, tmp_path, append_records=0)
        try:

            async def led_by_0() -> None:
                partition = (await partitions(sc)).get("moved-0")
                assert partition is not None and partition.status.resolution is models.PartitionResolution.ONLINE, partition
                assert partition.spec.leader == 0, partition

            await sc.eventually(led_by_0, timeout=30)
            # Its leader's report: the log it kept, every committed record in it.
            assert await live_hw_at_least(sc, "moved-0", stored_hw) >= stored_hw
        finally:
            stop(process)
        assert process.returncode == 0
