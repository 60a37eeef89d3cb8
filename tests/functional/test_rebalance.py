"""Rebalance and decommission end to end: the daemon on the memory store, simulator SPUs as a real
`sc spu run --count K` process replicating records over real sockets; moves carried out the KIP-455
way (new replicas join, catch up into the committed in-sync set, then the leaving ones go).

Leaders append all along and acknowledge only what is committed; each SPU's logs are on disk and
every leadership and acknowledgement is recorded (tests/fixtures/acknowledged.py), so each
scenario ends proving that no acknowledged record was lost: the final leaders hold every one, at
the epoch it was acknowledged with, and have committed at least as far."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from connection_manager import wire
from controller import config
from controller.reconcile import moves
from store import embedded_etcd, history, models
from tests.fixtures import acknowledged, processes as processes_module
from tests.fixtures.daemon import COMMON_SETTINGS, Running, etcd_settings, running
from tests.fixtures.scripted_spu import ScriptedSpu

RF = 3
PARTITIONS = 20
# The issue's check: 6 SPUs and 60 partitions at RF 3, 3 SPUs added and a rebalance.
ISSUE_PARTITIONS = 60
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def sc(tmp_path: Path) -> AsyncIterator[Running]:
    settings = config.Settings(
        store=config.StoreKind.MEMORY, spu_heartbeat_timeout=5.0, history_dir=tmp_path / "history", **COMMON_SETTINGS
    )
    async with running(settings) as handle:
        yield handle


@dataclass(frozen=True)
class Disk:
    """Where a test's SPU processes keep their logs (``--data-dir``) and record their leaderships
    and acknowledgements (``--record``, one file for all)."""

    work: Path

    @property
    def data_dir(self) -> Path:
        return self.work / "data"

    @property
    def record(self) -> Path:
        return self.work / "record.jsonl"

    @property
    def spu_logs(self) -> list[Path]:
        """The SPU processes' logs (warnings and errors, JSON lines), oldest process first."""
        return sorted(self.work.glob("spu-process-*.log"))

    def next_spu_log(self) -> Path:
        return self.work / f"spu-process-{len(self.spu_logs):02d}.log"


@contextlib.asynccontextmanager
async def spu_run(private_port: int, first_id: int, count: int, disk: Disk) -> AsyncIterator[asyncio.subprocess.Process]:
    """`sc spu run --count` for SPUs already registered, talking to whichever SC has ``private_port``."""
    disk.work.mkdir(parents=True, exist_ok=True)
    with open(disk.next_spu_log(), "ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controller.cli", "spu", "run", "--first-id", str(first_id), "--count", str(count),
            "--sc-private", f"127.0.0.1:{private_port}", "--append-interval", "0.2", "--append-records", "10",
            "--fetch-interval", "0.05", "--replica-lag-time", "30", "--log-format", "json", "--log-level", "warning",
            "--data-dir", str(disk.data_dir), "--record", str(disk.record),
            stdout=asyncio.subprocess.DEVNULL, stderr=log,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        yield process
    finally:
        await stop(process)


async def stop(*processes: asyncio.subprocess.Process) -> None:
    """SIGTERM to each still running (continued first), at once; then wait for them all."""
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
    for process in processes:
        await asyncio.wait_for(process.wait(), 20)


@contextlib.asynccontextmanager
async def simulated(sc: Running, first_id: int, count: int, disk: Disk) -> AsyncIterator[asyncio.subprocess.Process]:
    """SPUs ``first_id`` .. ``first_id + count - 1``: registered through the API, then run by one
    `sc spu run --count` process (records flowing), stopped with SIGTERM on the way out."""
    ports = embedded_etcd.free_ports(2 * count)
    for index in range(count):
        await sc.register_spu(first_id + index, online=False, ports=(ports[2 * index], ports[2 * index + 1]))
    assert sc.daemon.private_port is not None
    async with spu_run(sc.daemon.private_port, first_id, count, disk) as process:
        yield process


async def no_acknowledged_record_lost(
    sc: Running, disk: Disk, spu_ids: range, *processes: asyncio.subprocess.Process, partitions: int = PARTITIONS
) -> dict[str, int]:
    """Once each partition's current leader has acknowledged as far as any leader ever did, the SPU
    processes are frozen, all at once, and the SC's view is read again: when the record the frozen
    SPUs wrote agrees with it (``acknowledged.settled``), they are killed where they stand (what they
    journaled is what they acted on) and what was acknowledged is checked against their logs on
    disk; otherwise they go on and it is tried again. The highest offset acknowledged, per partition.

    Stopping them right after a read instead left a window in which a leader could change (an SPU's
    connection replaced: the SC elects another, the old leader follows it), and the check then read
    the log of a leader that had become a follower, its HW below what it had acknowledged."""
    placed: dict[str, acknowledged.Placed] = {}
    pids = [process.pid for process in processes if process.returncode is None]

    async def read_placed() -> None:
        status, listed = await sc.call("GET", "/v1/partitions")
        assert status == 200, listed
        placed.clear()
        placed.update({item["name"]: acknowledged.Placed.from_json(item) for item in listed})

    async def frozen_where_the_sc_says() -> None:
        await read_placed()
        assert acknowledged.caught_up(acknowledged.read(disk.record), placed), "a leader has not acknowledged that far yet"
        await processes_module.freeze(pids)
        try:
            await read_placed()
            settled = acknowledged.settled(acknowledged.read(disk.record), placed)
        except BaseException:
            processes_module.thaw(pids)
            raise
        if not settled:
            processes_module.thaw(pids)
            await asyncio.sleep(0.1)  # time for the change under way, the SPUs running
            raise AssertionError("a leader change is under way")

    await sc.eventually(frozen_where_the_sc_says, timeout=30)
    await kill(*processes)
    try:
        highest = acknowledged.check(disk.record, disk.data_dir, spu_ids, placed)
    except AssertionError as error:
        raise AssertionError(f"{error}\nthe SPU processes' warnings:\n{spu_warnings(disk)}") from None
    assert len(highest) == partitions, highest
    return highest


async def kill(*processes: asyncio.subprocess.Process) -> None:
    for process in processes:
        if process.returncode is None:
            process.kill()
    for process in processes:
        await asyncio.wait_for(process.wait(), 20)


def spu_warnings(disk: Disk, most: int = 30) -> str:
    """The last ``most`` lines the SPU processes logged (warnings and errors), for a failure's message."""
    lines = [f"{path.name}: {line}" for path in disk.spu_logs for line in path.read_text(errors="replace").splitlines()]
    return "\n".join(lines[-most:]) or "(none)"


async def caught_up_offsets(sc: Running) -> dict[str, list[int]]:
    """Partition -> the committed offset (status.leader.hw) that each of its moves' move-caught-up
    writes recorded in the SC's history, in order: what the audit counts as the records the move copied."""
    assert sc.daemon.history is not None
    await sc.daemon.history.flush()
    history_dir = sc.daemon.settings.history_dir
    assert history_dir is not None
    rows = list(history.HistoryReader(history_dir).records())
    changes = {(row["kind"], row["name"], row["revision"]): row for row in rows if row["type"] == "change"}
    found: dict[str, list[int]] = collections.defaultdict(list)
    for row in rows:
        if row["type"] == "action" and row["cause"] == "move-caught-up" and row["outcome"] == "applied":
            kind, name = row["keys"][0].split("/", 1)
            found[name].append(changes[(kind, name, row["revision"])]["object"]["status"]["leader"]["hw"])
    return dict(found)


def acknowledged_so_far(disk: Disk) -> dict[str, int]:
    return acknowledged.highest(acknowledged.read(disk.record))


def went_on(before: dict[str, int], after: dict[str, int]) -> None:
    """Records were committed in every partition after ``before`` was taken (the moves had records
    flowing); a partition ``before`` lacks had acknowledged nothing yet."""
    assert set(before) <= set(after) and all(after[name] > before.get(name, 0) for name in after), (before, after)


async def online(sc: Running, count: int) -> None:
    found = await sc.read_all("spus")
    assert sum(spu.status.resolution is models.SpuResolution.ONLINE for spu in found.values()) == count, found


async def all_in_sync(sc: Running, partitions: int = PARTITIONS) -> dict[str, models.Partition]:
    found: dict[str, models.Partition] = await sc.read_all("partitions")
    assert len(found) == partitions
    for partition in found.values():
        assert partition.status.resolution is models.PartitionResolution.ONLINE, partition
        assert sorted(partition.status.isr) == sorted(partition.spec.replicas), partition
    return found


def per_spu(partitions: dict[str, models.Partition], spu_ids: range) -> dict[int, int]:
    counts = dict.fromkeys(spu_ids, 0)
    for partition in partitions.values():
        for spu in partition.spec.replicas:
            counts[spu] += 1
    return counts


class Sampler:
    """GET /v1/partitions over and over while a run goes on: every partition's in-sync set, each time."""

    def __init__(self, sc: Running) -> None:
        self.sc = sc
        self.samples = 0
        self.shrunk: list[tuple[str, list[int], list[int]]] = []
        self.moving_seen: set[str] = set()

    async def run(self) -> None:
        while True:
            status, listed = await self.sc.call("GET", "/v1/partitions")
            assert status == 200, listed
            self.samples += 1
            for item in listed:
                spec, isr = item["spec"], item["status"]["isr"]
                if "reassignment" in spec:
                    self.moving_seen.add(item["name"])
                # Nothing fails here and nothing lags: below RF members can only be a move's doing.
                if len(isr) < RF:
                    self.shrunk.append((item["name"], spec["replicas"], isr))
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def sampling(sc: Running) -> AsyncIterator[Sampler]:
    sampler = Sampler(sc)
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def orders_on_six(sc: Running, partitions: int = PARTITIONS) -> dict[str, models.Partition]:
    """Once SPUs 0..5 are online: topic orders (``partitions`` at RF) on them, every partition in sync."""
    await sc.eventually(lambda: online(sc, 6), timeout=30)
    body = {"name": "orders", "spec": {"partitions": partitions, "replicationFactor": RF}}
    status, answer = await sc.call("POST", "/v1/topics", body)
    assert status == 201, answer
    await sc.eventually(lambda: all_in_sync(sc, partitions), timeout=30)
    found: dict[str, models.Partition] = await sc.read_all("partitions")
    return found


async def run_state(sc: Running, wanted: str) -> dict[str, Any]:
    status, progress = await sc.call("GET", "/v1/cluster/rebalance")
    assert status == 200, progress
    assert progress["state"] == wanted, progress
    return dict(progress)


async def test_new_spus_take_their_share_and_two_decommissioned_spus_end_empty(sc: Running, tmp_path: Path) -> None:
    disk = Disk(tmp_path)
    async with simulated(sc, 0, 6, disk) as six:
        before = await orders_on_six(sc, ISSUE_PARTITIONS)
        assert await run_state(sc, "idle") == {"state": "idle", "total": 0, "done": 0, "inFlight": [], "pending": 0, "skipped": []}

        async with simulated(sc, 6, 3, disk) as three:
            await sc.eventually(lambda: online(sc, 9), timeout=30)
            status, dry = await sc.call("POST", "/v1/cluster/rebalance?dryRun=true")
            assert status == 200, dry
            assert (await sc.read_all("partitions")) and await run_state(sc, "idle")  # a dry run stores nothing

            async with sampling(sc) as sampler:
                at_plan = acknowledged_so_far(disk)
                status, plan = await sc.call("POST", "/v1/cluster/rebalance", {"maxMovesPerSpu": 2})
                assert status == 202, plan
                assert plan["moves"] == dry["moves"]
                # 180 replicas over 9 SPUs: 20 each; the six old SPUs give 10 each.
                assert plan["replicaMoves"] == plan["lowerBound"] == 60
                assert plan["state"] == "running"
                # A second plan waits for this one.
                status, refused = await sc.call("POST", "/v1/cluster/rebalance")
                assert (status, refused["error"]["code"]) == (409, "RebalanceRunning")
                await sc.eventually(lambda: run_state(sc, "done"), timeout=60)
            await sc.eventually(lambda: all_in_sync(sc, ISSUE_PARTITIONS), timeout=30)
            after = await sc.read_all("partitions")
            assert sampler.samples > 1 and sampler.shrunk == [], sampler.shrunk[:5]
            assert sampler.moving_seen  # the samples saw moves in progress
            assert all(len(p.spec.replicas) == RF and p.spec.reassignment is None for p in after.values())
            counts = per_spu(after, range(9))
            assert counts == dict.fromkeys(range(9), 20), counts
            # Every partition ends as planned; the others never moved.
            planned = {move["partition"]: move["to"] for move in plan["moves"]}
            assert {name: p.spec.replicas for name, p in after.items()} == {
                name: planned.get(name, p.spec.replicas) for name, p in before.items()
            }
            progress = await run_state(sc, "done")
            assert (progress["total"], progress["done"], progress["inFlight"]) == (len(plan["moves"]), len(plan["moves"]), [])
            rebalanced = plan["moves"]

            # Decommission SPUs 2 and 5, one after the other: everything each holds moves, the rest
            # stay balanced (180 replicas over the 8, then the 7 SPUs left).
            decommissions: list[dict[str, Any]] = []
            for gone, shares in ((2, [22] * 4 + [23] * 4), (5, [25] * 2 + [26] * 5)):
                async with sampling(sc) as sampler:
                    status, plan = await sc.call("POST", f"/v1/spus/spu-{gone}/decommission")
                    assert status == 202, plan
                    assert (plan["spu"], plan["name"], plan["state"]) == (gone, f"spu-{gone}", "running")
                    assert plan["after"]["replicasPerSpu"][str(gone)] == 0
                    spu = await sc.read("spus", f"spu-{gone}")
                    assert isinstance(spu, models.Spu) and spu.spec.decommission
                    await sc.eventually(lambda: run_state(sc, "done"), timeout=60)

                    async def decommissioned(gone: int = gone) -> None:
                        spu = await sc.read("spus", f"spu-{gone}")
                        assert isinstance(spu, models.Spu) and spu.status.decommission is models.SpuDecommission.DONE, spu

                    await sc.eventually(decommissioned, timeout=20)
                await sc.eventually(lambda: all_in_sync(sc, ISSUE_PARTITIONS), timeout=30)
                assert sampler.shrunk == [], sampler.shrunk[:5]
                after = await sc.read_all("partitions")
                counts = per_spu(after, range(9))
                kept = sorted(count for spu, count in counts.items() if spu not in (2, 5)[: len(decommissions) + 1])
                assert all(counts[spu] == 0 for spu in (2, 5)[: len(decommissions) + 1]) and kept == shares, counts
                decommissions += plan["moves"]
            stored = await sc.kv_store.get(moves.KEY)
            assert stored is not None and moves.decode(stored.value).kind == moves.DECOMMISSION
            # The history holds what the audit's records moved are made of: the caught-up write of
            # each move that brings a replica (a decommission also reorders some partitions' replicas,
            # which copies nothing), with the committed offset the arriving replicas copied (records
            # flowed from the start).
            copied = await caught_up_offsets(sc)
            moved = collections.Counter(
                move["partition"] for move in [*rebalanced, *decommissions] if set(move["to"]) - set(move["from"])
            )
            assert {name: len(offsets) for name, offsets in copied.items()} == dict(moved), copied
            assert all(offset > 0 for offsets in copied.values() for offset in offsets), copied
            went_on(at_plan, await no_acknowledged_record_lost(sc, disk, range(9), six, three, partitions=ISSUE_PARTITIONS))


async def test_a_cancelled_rebalance_sends_the_moves_in_flight_back(sc: Running, tmp_path: Path) -> None:
    disk = Disk(tmp_path)
    async with simulated(sc, 0, 6, disk) as six:
        before = await orders_on_six(sc)
        async with simulated(sc, 6, 3, disk) as newcomers:
            await sc.eventually(lambda: online(sc, 9), timeout=30)
            # The new SPUs freeze: still Online for the heartbeat timeout, but no move can catch up.
            newcomers.send_signal(signal.SIGSTOP)
            async with sampling(sc) as sampler:
                status, plan = await sc.call("POST", "/v1/cluster/rebalance", {"maxMovesPerSpu": 1})
                assert status == 202, plan

                async def started() -> None:
                    progress = await run_state(sc, "running")
                    # One move per new SPU at most (each takes part in all of them), none can end.
                    assert len(progress["inFlight"]) == 3 and progress["done"] == 0, progress

                await sc.eventually(started, timeout=20)
                status, cancelled = await sc.call("DELETE", "/v1/cluster/rebalance")
                assert status == 200, cancelled
                assert cancelled == {"state": "cancelled", "kind": "rebalance", "total": len(plan["moves"])}
                status, again = await sc.call("DELETE", "/v1/cluster/rebalance")
                assert (status, again["error"]["code"]) == (409, "NotRunning")

                async def reverted() -> None:
                    found = await all_in_sync(sc)
                    assert {name: p.spec for name, p in found.items()} == {name: p.spec for name, p in before.items()}
                    progress = await run_state(sc, "cancelled")
                    assert (progress["inFlight"], progress["done"], progress["pending"]) == ([], 0, len(plan["moves"]))

                await sc.eventually(reverted, timeout=30)
            newcomers.send_signal(signal.SIGCONT)
            assert sampler.shrunk == [], sampler.shrunk[:5]
            # The topic's replica map is back too.
            topic = await sc.read("topics", "orders")
            assert isinstance(topic, models.Topic)
            assert topic.status.replica_map == {p.index: p.spec.replicas for p in before.values()}
            # A new plan may start now.
            status, dry = await sc.call("POST", "/v1/cluster/rebalance?dryRun=true")
            assert status == 200, dry
            await no_acknowledged_record_lost(sc, disk, range(9), six, newcomers)


@pytest.mark.etcd
async def test_a_rebalance_goes_on_after_the_sc_restarts(etcd_server: embedded_etcd.EmbeddedEtcd, tmp_path: Path) -> None:
    """The run and each move's progress are stored: a new SC on the same etcd finishes what the last one started."""
    disk = Disk(tmp_path)
    private_port, *spu_ports = embedded_etcd.free_ports(1 + 2 * 9)
    settings = etcd_settings(etcd_server, private_port=private_port, spu_heartbeat_timeout=5.0, spu_offline_grace=10.0)
    first_daemon = running(settings)
    first = await first_daemon.__aenter__()
    first_running = True
    try:
        for spu_id in range(6):
            await first.register_spu(spu_id, online=False, ports=(spu_ports[2 * spu_id], spu_ports[2 * spu_id + 1]))
        async with spu_run(private_port, 0, 6, disk) as six:
            await first.eventually(lambda: online(first, 6), timeout=30)
            status, answer = await first.call(
                "POST", "/v1/topics", {"name": "orders", "spec": {"partitions": PARTITIONS, "replicationFactor": RF}}
            )
            assert status == 201, answer
            await first.eventually(lambda: all_in_sync(first), timeout=30)
            for spu_id in range(6, 9):
                await first.register_spu(spu_id, online=False, ports=(spu_ports[2 * spu_id], spu_ports[2 * spu_id + 1]))
            async with spu_run(private_port, 6, 3, disk) as newcomers:
                await first.eventually(lambda: online(first, 9), timeout=30)
                # Frozen: the moves onto them stay in flight while the SC goes away.
                newcomers.send_signal(signal.SIGSTOP)
                status, plan = await first.call("POST", "/v1/cluster/rebalance", {"maxMovesPerSpu": 1})
                assert status == 202, plan
                assert plan["replicaMoves"] == plan["lowerBound"] == 18

                async def started() -> None:
                    progress = await run_state(first, "running")
                    assert len(progress["inFlight"]) == 3 and progress["done"] == 0, progress

                await first.eventually(started, timeout=20)
                first_running = False
                await first_daemon.__aexit__(None, None, None)

                async with running(settings) as second:
                    newcomers.send_signal(signal.SIGCONT)
                    await second.eventually(lambda: run_state(second, "done"), timeout=90)
                    await second.eventually(lambda: all_in_sync(second), timeout=30)
                    after = await second.read_all("partitions")
                    planned = {move["partition"]: move["to"] for move in plan["moves"]}
                    assert {name: p.spec.replicas for name, p in after.items() if name in planned} == planned
                    counts = per_spu(after, range(9))
                    assert sorted(counts.values()) == [6, 6, 6, 7, 7, 7, 7, 7, 7], counts
                    await no_acknowledged_record_lost(second, disk, range(9), six, newcomers)
    finally:
        if first_running:
            await first_daemon.__aexit__(None, None, None)


async def test_moves_onto_a_killed_spu_wait_for_it_and_the_others_go_on(sc: Running, tmp_path: Path) -> None:
    disk = Disk(tmp_path)
    ports = embedded_etcd.free_ports(2 * 9)
    private_port = sc.daemon.private_port
    assert private_port is not None
    for spu_id in range(6):
        await sc.register_spu(spu_id, online=False, ports=(ports[2 * spu_id], ports[2 * spu_id + 1]))
    async with spu_run(private_port, 0, 6, disk) as six:
        await orders_on_six(sc)
        for spu_id in range(6, 9):
            await sc.register_spu(spu_id, online=False, ports=(ports[2 * spu_id], ports[2 * spu_id + 1]))
        async with spu_run(private_port, 6, 2, disk) as two, spu_run(private_port, 8, 1, disk) as doomed:
            await sc.eventually(lambda: online(sc, 9), timeout=30)
            # Frozen, so that a move onto SPU 8 is surely in flight when it dies.
            two.send_signal(signal.SIGSTOP)
            doomed.send_signal(signal.SIGSTOP)
            async with sampling(sc) as sampler:
                at_plan = acknowledged_so_far(disk)
                status, plan = await sc.call("POST", "/v1/cluster/rebalance", {"maxMovesPerSpu": 1})
                assert status == 202, plan
                onto_8 = sorted(move["partition"] for move in plan["moves"] if 8 in move["to"] and 8 not in move["from"])
                assert len(onto_8) == 6

                async def started() -> None:
                    progress = await run_state(sc, "running")
                    assert len(progress["inFlight"]) == 3, progress

                await sc.eventually(started, timeout=20)
                doomed.kill()
                await doomed.wait()
                two.send_signal(signal.SIGCONT)

                async def the_others_done() -> None:
                    progress = await run_state(sc, "running")
                    # Every move not onto SPU 8 ends; of those onto it, one waits in flight, the rest unstarted.
                    assert progress["done"] == len(plan["moves"]) - 6, progress
                    assert len(progress["inFlight"]) == 1 and progress["inFlight"][0] in onto_8, progress
                    assert progress["pending"] == 5, progress

                await sc.eventually(the_others_done, timeout=60)
                # SPU 8 back (it held nothing of the moves: frozen before they started, killed
                # before any caught up): its moves catch up and the run ends.
                async with spu_run(private_port, 8, 1, disk) as back:
                    await sc.eventually(lambda: run_state(sc, "done"), timeout=60)
                    await sc.eventually(lambda: all_in_sync(sc), timeout=30)
                    # What the samples saw while SPU 8 ran (stopping it at the end shrinks its sets).
                    shrunk = list(sampler.shrunk)
                    after = await sc.read_all("partitions")
                    went_on(at_plan, await no_acknowledged_record_lost(sc, disk, range(9), six, two, back))
            assert shrunk == [], shrunk[:5]
            counts = per_spu(after, range(9))
            assert sorted(counts.values()) == [6, 6, 6, 7, 7, 7, 7, 7, 7], counts


async def test_a_dry_run_during_a_move_plans_from_where_the_move_ends() -> None:
    """While a move is in flight its partition's replicas are the old ones plus the ones being added
    ([0, 1, 2] for [0, 1] -> [2, 1]). Dry runs are answered then (the real ones are refused while
    moves are in progress), and they planned from that passing set: three replicas for a partition
    of replication factor 2, a "move" to three SPUs keeping the decommissioned one. They plan from
    the move's target now. (Found by a state machine of operator sequences.)"""
    settings = config.Settings(store=config.StoreKind.MEMORY, **COMMON_SETTINGS, spu_heartbeat_timeout=30.0)
    async with running(settings) as sc, aiohttp.ClientSession() as client:
        for spu_id in (0, 1, 2):
            await sc.register_spu(spu_id, online=False)
        assert sc.daemon.connections is not None and sc.daemon.context is not None
        spus = {spu_id: ScriptedSpu(client, sc.daemon.connections.port or 0, spu_id) for spu_id in (0, 1, 2)}
        try:
            for spu in spus.values():
                assert isinstance(await spu.connect(), wire.Accepted)
            context = sc.daemon.context

            def online() -> None:
                for spu_id in (0, 1, 2):
                    entry = context.local_store["spus"].view.get(f"spu-{spu_id}")
                    assert entry is not None and entry.obj.status.resolution is models.SpuResolution.ONLINE

            await sc.eventually(online)
            status, body = await sc.call("POST", "/v1/topics", {"name": "a", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}})
            assert status == 201, body
            await spus[0].wait_for(lambda: "a-0" in spus[0].replicas)
            await spus[0].lead("a-0")
            await spus[0].wait_for(lambda: spus[0].replicas["a-0"].partition_epoch >= 1)
            status, body = await sc.call("POST", "/v1/spus/spu-0/decommission")
            assert status == 202, body  # moves a-0 from [0, 1] to [2, 1]

            async def moving() -> None:
                partition = await sc.read("partitions", "a-0")
                assert isinstance(partition, models.Partition) and partition.spec.reassignment is not None
                assert partition.spec.replicas == [0, 1, 2] and partition.spec.reassignment.target == [2, 1]

            await sc.eventually(moving)
            status, body = await sc.call("POST", "/v1/cluster/rebalance?dryRun=true")
            assert status == 200, body
            assert (sum(body["after"]["replicasPerSpu"].values()), body["moves"]) == (2, []), body
            status, body = await sc.call("POST", "/v1/spus/spu-2/decommission?dryRun=true")
            assert status == 200, body
            assert sum(body["after"]["replicasPerSpu"].values()) == 2, body
            # (SPU 1 alone would remain: a-0's replica on SPU 2 has nowhere to go, only its leadership moves.)
            assert all(len(move["from"]) == 2 and len(move["to"]) == 2 for move in body["moves"]), body
        finally:
            for spu in spus.values():
                await spu.close()


async def test_a_move_onto_an_spu_deleted_and_registered_again_ends(sc: Running, tmp_path: Path) -> None:
    """An id registered again inherits no membership, but earns it back as any follower does: its
    leader proposes it once it caught up. Before, its proposals were refused for good ("SPU 4 was
    registered again"), and a move onto it stayed in flight with four replicas."""
    disk = Disk(tmp_path)
    async with simulated(sc, 0, 4, disk):
        await sc.eventually(lambda: online(sc, 4), timeout=30)
        status, body = await sc.call("POST", "/v1/topics", {"name": "t", "spec": {"partitions": 6, "replicationFactor": 3}})
        assert status == 201, body
        await sc.eventually(lambda: all_in_sync(sc, 6), timeout=30)
        async with simulated(sc, 4, 1, disk) as four:
            await sc.eventually(lambda: online(sc, 5), timeout=30)
            four.send_signal(signal.SIGSTOP)  # so that the move onto it is surely in flight
            status, plan = await sc.call("POST", "/v1/cluster/rebalance", {"maxMovesPerSpu": 1})
            assert status == 202, plan

            async def started() -> None:
                assert len((await run_state(sc, "running"))["inFlight"]) == 1

            await sc.eventually(started, timeout=20)
            four.kill()
            await four.wait()
        status, body = await sc.call("DELETE", "/v1/spus/spu-4")
        assert status == 200, body
        async with simulated(sc, 4, 1, disk):  # registered again
            await sc.eventually(lambda: run_state(sc, "done"), timeout=45)
            await sc.eventually(lambda: all_in_sync(sc, 6), timeout=30)
            found = await all_in_sync(sc, 6)
    assert all(partition.spec.reassignment is None and len(partition.spec.replicas) == 3 for partition in found.values())
    assert any(4 in partition.spec.replicas for partition in found.values())


async def test_a_cancelled_move_of_a_partition_nobody_can_lead_ends_and_a_new_plan_is_taken(sc: Running, tmp_path: Path) -> None:
    """The only replica of t-3 is gone for good; its decommission is cancelled. The revert drops
    the replica being added (never in sync) although nobody leads; before, the move stayed and
    every later plan was refused MovesInProgress."""
    disk = Disk(tmp_path)
    async with simulated(sc, 0, 3, disk):
        async with simulated(sc, 3, 1, disk) as three:
            await sc.eventually(lambda: online(sc, 4), timeout=30)
            status, body = await sc.call("POST", "/v1/topics", {"name": "t", "spec": {"partitions": 4, "replicationFactor": 1}})
            assert status == 201, body
            await sc.eventually(lambda: all_in_sync(sc, 4), timeout=30)
            three.kill()
            await three.wait()

        async def leaderless() -> None:
            partition = await sc.read("partitions", "t-3")
            assert isinstance(partition, models.Partition)
            assert partition.status.resolution is models.PartitionResolution.LEADER_OFFLINE

        await sc.eventually(leaderless, timeout=30)
        status, plan = await sc.call("POST", "/v1/spus/spu-3/decommission")
        assert status == 202, plan
        assert [move["partition"] for move in plan["moves"]] == ["t-3"]

        async def in_flight() -> None:
            assert (await run_state(sc, "running"))["inFlight"] == ["t-3"]

        await sc.eventually(in_flight, timeout=20)
        status, body = await sc.call("DELETE", "/v1/cluster/rebalance")
        assert status == 200, body

        async def reverted() -> None:
            progress = await run_state(sc, "cancelled")
            assert progress["inFlight"] == [], progress
            partition = await sc.read("partitions", "t-3")
            assert isinstance(partition, models.Partition)
            assert partition.spec.reassignment is None and partition.spec.replicas == [3], partition.spec

        await sc.eventually(reverted, timeout=20)
        status, body = await sc.call("POST", "/v1/cluster/rebalance")
        assert status == 202, body


async def test_replicas_left_on_an_unregistered_spu_move_off_it_when_an_operator_rebalances(sc: Running, tmp_path: Path) -> None:
    """SPU 3 dies for good and is unregistered with replicas still on it (allowed, with warnings):
    they stay assigned to its id, out of the in-sync sets. A rebalance then moves them to the
    SPUs left, every partition back at its replication factor, nothing acknowledged lost. Before,
    the planner refused every plan ("partition t-0 has a replica on SPU 3, which is not in spus"),
    a decommission of any other SPU too, until an SPU took id 3 again."""
    disk = Disk(tmp_path)
    async with simulated(sc, 0, 3, disk) as three:
        async with simulated(sc, 3, 1, disk) as doomed:
            await sc.eventually(lambda: online(sc, 4), timeout=30)
            status, body = await sc.call("POST", "/v1/topics", {"name": "t", "spec": {"partitions": 8, "replicationFactor": 2}})
            assert status == 201, body
            await sc.eventually(lambda: all_in_sync(sc, 8), timeout=30)
            on_3 = sorted(name for name, partition in (await sc.read_all("partitions")).items() if 3 in partition.spec.replicas)
            assert on_3
            doomed.kill()
            await doomed.wait()
        status, body = await sc.call("DELETE", "/v1/spus/spu-3")
        assert status == 200, body
        assert any("still holds replicas" in warning for warning in body["warnings"]), body

        async def out_of_the_in_sync_sets() -> None:
            found = await sc.read_all("partitions")
            assert all(3 not in p.status.isr and p.status.resolution is models.PartitionResolution.ONLINE for p in found.values())

        await sc.eventually(out_of_the_in_sync_sets, timeout=30)
        status, plan = await sc.call("POST", "/v1/cluster/rebalance")
        assert status == 202, plan
        assert sorted(move["partition"] for move in plan["moves"] if 3 in move["from"]) == on_3, plan
        assert all(3 not in move["to"] for move in plan["moves"]) and plan["after"]["replicasPerSpu"].get("3", 0) == 0, plan
        await sc.eventually(lambda: run_state(sc, "done"), timeout=60)
        await sc.eventually(lambda: all_in_sync(sc, 8), timeout=30)
        found = await all_in_sync(sc, 8)
        assert all(3 not in p.spec.replicas and len(p.spec.replicas) == 2 for p in found.values()), found
        await no_acknowledged_record_lost(sc, disk, range(3), three, partitions=8)
