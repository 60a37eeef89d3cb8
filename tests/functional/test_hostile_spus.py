"""Hostile or buggy SPUs on the private port (protocol v2): a hypothesis state machine runs the real
SC (daemon on the memory store) with a few registered SPUs as scripted WebSocket clients that send
any sequence of well-formed frames, and checks after every step what the SC committed and told.

Invariants (docs/replication.md, "The guarantees" and "The rules"):
- no SC task restarted, no error-level log line;
- every stored version of a partition: leaderEpoch and partitionEpoch never decrease; a change of
  the leader (to or from no leader too) comes with leaderEpoch + 1, and leaderEpoch moves by at
  most 1 (the same SPU may be elected again at a new epoch); an Online leader is in isr; isr is a subset of replicas;
- a new leader comes from the committed isr of the version before;
- the in-sync set grows only through a proposal of that version's leader at its epochs, listing
  the new members, each of them online when the write landed, under the incarnation the proposal
  named (KIP-903);
- no two different SPUs are ever told leadership of one partition at one leaderEpoch;
- an alterIsrResult with error null means the stored set at its epochs is the proposed one;
- the committed HW the SC knows (stored, or reported since it started) is one an SPU sent in a
  well-formed offsets entry (hw at most leo) or in a proposal answered committed;
- once the SC settled, no proposal of a current connection is left unanswered.

It runs a handful of examples in the suite (the same ones on every run: the deterministic
hypothesis profile); `SC_HOSTILE_EXAMPLES=200 scripts/test tests/functional/test_hostile_spus.py
--hypothesis-profile=explore` searches further. The defect it found first (a follower's proposal
took the place of its leader's, which was then never answered) has its own example test below.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from connection_manager import wire
from controller import config
from store import models
from tests.fixtures.daemon import COMMON_SETTINGS, Running, running
from tests.fixtures.machines import TOKEN, DaemonMachine, machine_settings
from tests.fixtures.scripted_spu import ScriptedSpu

SPU_IDS = (0, 1, 2)
TOPICS = {"a": (1, 3), "b": (1, 2)}  # name -> (partitions, replication factor)
PARTITIONS = ["a-0", "b-0"]
BIG = 2**63 - 1
LEADER_OFFLINE = models.PartitionResolution.LEADER_OFFLINE
ONLINE = models.PartitionResolution.ONLINE

epoch_choice = st.one_of(
    st.just("told"), st.just("told"), st.just("told"), st.just("stored"), st.just("told+1"),
    st.integers(0, 6), st.just(BIG), st.just(BIG - 1),
)
isr_choice = st.lists(st.sampled_from([0, 1, 2, 7]), min_size=0, max_size=4)
offset_choice = st.one_of(st.integers(0, 50), st.just(BIG))


def effective_leader(partition: models.Partition) -> int | None:
    return None if partition.status.resolution is LEADER_OFFLINE else partition.spec.leader


class HostileSpus(DaemonMachine):
    def __init__(self) -> None:
        super().__init__()
        # partition -> list of (version, (SPU, incarnation) of each connection ready at the time)
        self.versions: dict[str, list[tuple[models.Partition, frozenset[tuple[int, int]]]]] = {p: [] for p in PARTITIONS}
        self.checked: dict[str, int] = {p: 0 for p in PARTITIONS}
        # (partition, spu, leader_epoch, partition_epoch, isr, incarnations named) of every proposal sent
        self.proposals: list[tuple[str, int, int, int, tuple[int, ...], dict[int, int]]] = []
        self.sent_marks: list[tuple[ScriptedSpu, str, int]] = []
        # (client, partition, how many frames it had received, hw) of every proposal sent
        self.proposal_hws: list[tuple[ScriptedSpu, str, int, int | None]] = []
        # partition -> the HWs sent in offsets entries whose HW was at most their log end
        self.reported_hws: dict[str, set[int]] = {p: set() for p in PARTITIONS}
        self.run(self._start())

    async def _start(self) -> None:
        await self.start_daemon(spu_offline_grace=5.0)
        self.watcher = self.loop.create_task(self._watch())
        for spu_id in SPU_IDS:
            await self.sc.register_spu(spu_id, online=False)
        for spu_id in SPU_IDS:
            await self._connect(spu_id, "fresh")

        def online() -> None:
            spus = self.context.local_store["spus"].view
            for spu_id in SPU_IDS:
                entry = spus.get(f"spu-{spu_id}")
                assert entry is not None and entry.obj.status.resolution is models.SpuResolution.ONLINE

        await self.sc.eventually(online)
        for name, (count, factor) in TOPICS.items():
            status, answer = await self.sc.call(
                "POST", "/v1/topics", {"name": name, "spec": {"partitions": count, "replicationFactor": factor}}
            )
            assert status == 201, answer
        await self._settle()

        def told() -> None:
            for name in PARTITIONS:
                assert len(self.versions[name]) >= 1

        await self.sc.eventually(told)
        await self._settle()

    async def _watch(self) -> None:
        async for event in self.context.kv_store.watch("partitions/", 1):
            if event.value is None:
                continue
            partition = models.decode("partitions", event.value)
            ready = frozenset(
                (spu, session.number) for spu, session in self.connections.sessions.items() if session.ready and session.closing is None
            )
            self.versions.setdefault(partition.name, []).append((partition, ready))

    async def _connect(self, spu_id: int, mode: str, hosted: list[wire.HostedReplica] | None = None) -> None:
        old = self.spus.get(spu_id)
        if mode == "held" and old is not None:
            hosted = old.held()
        elif mode == "fresh":
            hosted = []
        if mode != "replace" and old is not None:
            await old.close()
        spu = ScriptedSpu(self.client, self.connections.port or 0, spu_id)
        answer = await spu.connect(TOKEN, heartbeat=1.0, hosted=hosted or [])
        assert isinstance(answer, wire.Accepted), answer
        self.spus[spu_id] = spu
        self.all_clients.append(spu)

    async def _settle(self) -> None:
        """Until nothing moves for 100 ms: the store's revision, what the SPUs received, proposals."""

        async def measure() -> tuple[int, int, int]:
            received = sum(len(client.received) for client in self.all_clients)
            return await self.context.kv_store.revision(), received, len(self.connections.proposals)

        await self.settle(measure, polls=4, pause=0.025, limit=10.0)

    async def stop(self) -> None:
        self.watcher.cancel()
        await asyncio.gather(self.watcher, return_exceptions=True)
        await super().stop()

    # ------------------------------------------------------------------ helpers

    def stored(self, name: str) -> models.Partition:
        entry = self.context.local_store["partitions"].get(name)
        assert entry is not None
        return entry.obj

    def pick_epoch(self, choice: Any, told: int, stored: int) -> int:
        if choice == "told":
            return told
        if choice == "stored":
            return stored
        if choice == "told+1":
            return min(told + 1, BIG)
        return int(choice)

    async def step(self, action: Any) -> None:
        await action
        await self._settle()

    # ------------------------------------------------------------------ rules

    @rule(spu_id=st.sampled_from(SPU_IDS), mode=st.sampled_from(["held", "fresh", "replace", "random"]),
          entries=st.lists(st.tuples(st.sampled_from(PARTITIONS), offset_choice, st.one_of(st.none(), st.integers(0, 6), st.just(BIG))), max_size=3, unique_by=lambda e: e[0]))
    def reconnect(self, spu_id: int, mode: str, entries: list[tuple[str, int, int | None]]) -> None:
        hosted = [wire.HostedReplica(partition=p, leo=leo, leader_epoch=epoch) for p, leo, epoch in entries]
        self.steps.append(f"reconnect({spu_id}, {mode}, {entries})")
        self.run(self.step(self._connect(spu_id, mode, hosted)))

    @rule(spu_id=st.sampled_from(SPU_IDS))
    def disconnect(self, spu_id: int) -> None:
        spu = self.connected(spu_id)
        if spu is None:
            return
        self.steps.append(f"disconnect({spu_id})")
        self.run(self.step(spu.close()))

    @rule(spu_id=st.sampled_from(SPU_IDS), partitions=st.lists(st.sampled_from(PARTITIONS), min_size=1, max_size=2, unique=True), epoch=epoch_choice)
    def leading(self, spu_id: int, partitions: list[str], epoch: Any) -> None:
        spu = self.connected(spu_id)
        if spu is None:
            return
        entries = []
        for name in partitions:
            told = spu.replicas[name].leader_epoch if name in spu.replicas else 0
            entries.append(wire.Leadership(partition=name, leader_epoch=self.pick_epoch(epoch, told, self.stored(name).status.leader_epoch)))
        self.steps.append(f"leading({spu_id}, {entries})")
        self.run(self.step(spu.send(wire.Leading(partitions=entries))))

    @rule(spu_id=st.sampled_from(SPU_IDS))
    def confirm_all(self, spu_id: int) -> None:
        """A well-behaved SPU: confirms every leadership it was told."""
        spu = self.connected(spu_id)
        if spu is None:
            return
        led = [name for name, info in spu.replicas.items() if info.leader == spu_id]
        if not led:
            return
        self.steps.append(f"confirm_all({spu_id}) {[(n, spu.replicas[n].leader_epoch) for n in led]}")
        self.run(self.step(spu.lead(*led)))

    def _proposal(
        self, spu: ScriptedSpu, name: str, le: Any, pe: Any, isr: list[int], hw: int | None, named: str = "current"
    ) -> wire.AlterIsr:
        """``named``: each other SPU of ``isr`` the test connected, under its current connection's
        incarnation ("current"), the one before ("previous", as a leader that saw an earlier process
        catch up), or nobody ("none", as an SPU older than the field)."""
        info = spu.replicas.get(name)
        stored = self.stored(name).status
        told_le = info.leader_epoch if info is not None else 0
        told_pe = info.partition_epoch if info is not None else 0
        message = wire.AlterIsr(
            partition=name,
            leader_epoch=self.pick_epoch(le, told_le, stored.leader_epoch),
            partition_epoch=self.pick_epoch(pe, told_pe, stored.partition_epoch),
            isr=isr,
            hw=hw,
            incarnations=[
                wire.MemberIncarnation(spu=member, incarnation=accepted.incarnation - 1 if named == "previous" else accepted.incarnation)
                for member in sorted(set(isr) - {spu.spu_id})
                if named != "none" and (client := self.spus.get(member)) is not None and (accepted := client.accepted) is not None
            ],
        )
        incarnations = {entry["spu"]: entry["incarnation"] for entry in message.incarnations}
        self.proposal_hws.append((spu, name, len(spu.received), hw))
        self.proposals.append((name, spu.spu_id, message.leader_epoch, message.partition_epoch, tuple(isr), incarnations))
        if name in spu.replicas:  # else it is refused with an error frame (not-hosted)
            self.sent_marks.append((spu, name, len(spu.received)))
        return message

    @rule(spu_id=st.sampled_from(SPU_IDS), name=st.sampled_from(PARTITIONS), le=epoch_choice, pe=epoch_choice,
          isr=isr_choice, hw=st.one_of(st.none(), offset_choice), named=st.sampled_from(["current", "current", "previous", "none"]))
    def alter_isr(self, spu_id: int, name: str, le: Any, pe: Any, isr: list[int], hw: int | None, named: str) -> None:
        spu = self.connected(spu_id)
        if spu is None:
            return
        message = self._proposal(spu, name, le, pe, isr, hw, named)
        self.steps.append(f"alter_isr({spu_id}, {message!r})")
        self.run(self.step(spu.send(message)))

    @rule(first=st.sampled_from(SPU_IDS), second=st.sampled_from(SPU_IDS), name=st.sampled_from(PARTITIONS),
          isr1=isr_choice, isr2=isr_choice)
    def two_proposals_at_once(self, first: int, second: int, name: str, isr1: list[int], isr2: list[int]) -> None:
        """Two SPUs propose for one partition at their told epochs, without the SC settling between."""
        a, b = self.connected(first), self.connected(second)
        if a is None or b is None:
            return
        m1 = self._proposal(a, name, "told", "told", isr1, None)
        m2 = self._proposal(b, name, "told", "told", isr2, None)
        self.steps.append(f"two_proposals({first}: {m1!r}, {second}: {m2!r})")

        async def both() -> None:
            await a.send(m1)
            await b.send(m2)

        self.run(self.step(both()))

    @rule(spu_id=st.sampled_from(SPU_IDS), name=st.sampled_from(PARTITIONS), le=epoch_choice, hw=offset_choice,
          leo=offset_choice, followers=st.lists(st.sampled_from([0, 1, 2]), max_size=2, unique=True))
    def offsets(self, spu_id: int, name: str, le: Any, hw: int, leo: int, followers: list[int]) -> None:
        spu = self.connected(spu_id)
        if spu is None:
            return
        info = spu.replicas.get(name)
        told = info.leader_epoch if info is not None else 0
        entry = wire.PartitionOffsets(
            partition=name, leader_epoch=self.pick_epoch(le, told, self.stored(name).status.leader_epoch), hw=hw, leo=leo,
            followers=[wire.ReplicaOffsets(spu=f, hw=min(hw, leo), leo=leo) for f in followers],
        )
        if hw <= leo:
            self.reported_hws[name].add(hw)
        self.steps.append(f"offsets({spu_id}, {entry})")
        self.run(self.step(spu.send(wire.Offsets(partitions=[entry]))))

    @rule(spu_id=st.sampled_from(SPU_IDS), frame=st.sampled_from(["heartbeat", "hosted", "register"]))
    def other_frame(self, spu_id: int, frame: str) -> None:
        spu = self.connected(spu_id)
        if spu is None:
            return
        message: wire.Message = {
            "heartbeat": wire.Heartbeat(),
            "hosted": wire.Hosted(partitions=[]),
            "register": wire.Register(spu_id=spu_id, token=TOKEN),
        }[frame]
        self.steps.append(f"{frame}({spu_id})")
        self.run(self.step(spu.send(message)))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def stored_versions(self) -> None:
        for name, versions in self.versions.items():
            for index in range(max(1, self.checked[name]), len(versions)):
                old, _ = versions[index - 1]
                new, ready = versions[index]
                self._check_pair(name, old, new, ready)
            for partition, _ in versions[self.checked[name]:]:
                status = partition.status
                in_sync = partition.in_sync()
                assert set(status.isr) <= set(partition.spec.replicas), (name, status, self.steps)
                if status.resolution is ONLINE:
                    assert partition.spec.leader in in_sync, (name, partition, self.steps)
            self.checked[name] = len(versions)

    def _check_pair(self, name: str, old: models.Partition, new: models.Partition, ready: frozenset[tuple[int, int]]) -> None:
        o, n = old.status, new.status
        context = (name, old.spec, o, new.spec, n, self.steps)
        assert n.leader_epoch >= o.leader_epoch and n.partition_epoch >= o.partition_epoch, context
        old_leader, new_leader = effective_leader(old), effective_leader(new)
        if old_leader != new_leader:
            assert n.leader_epoch == o.leader_epoch + 1, context
            if new_leader is not None:
                assert new_leader in old.in_sync(), ("leader from outside the committed isr", context)
        else:
            # The same SPU may be elected again at a new epoch (a restarted leader that returned).
            assert n.leader_epoch in (o.leader_epoch, o.leader_epoch + 1), context
            if n.leader_epoch != o.leader_epoch:
                assert new_leader is not None and new_leader in old.in_sync(), ("re-election from outside the isr", context)
        grown = set(new.in_sync()) - set(old.in_sync())
        if grown:
            backing = [
                p for p in self.proposals
                if p[0] == name and p[1] == old_leader and p[2] == o.leader_epoch and p[3] == o.partition_epoch
                and grown <= set(p[4])
            ]
            assert backing, ("isr grew without a proposal of the leader at the epochs", grown, context)
            assert grown <= {spu for spu, _ in ready}, ("isr grew with SPUs not online", grown, ready, context)
            assert any(all((spu, p[5].get(spu)) in ready for spu in grown) for p in backing), (
                "isr grew with SPUs not named under the incarnation they were connected as", grown, ready, backing, context
            )

    @invariant()
    def leadership_told_once_per_epoch(self) -> None:
        told: dict[tuple[str, int], set[int]] = {}
        for client in self.all_clients:
            for message in client.received:
                infos = message.replicas if isinstance(message, (wire.Sync, wire.Update)) else []
                for info in infos:
                    if info.leader is not None:
                        told.setdefault((info.partition, info.leader_epoch), set()).add(info.leader)
        clashes = {key: leaders for key, leaders in told.items() if len(leaders) > 1}
        assert not clashes, (clashes, self.steps)

    @invariant()
    def committed_answers_are_true(self) -> None:
        stored_at = {
            (name, p.status.leader_epoch, p.status.partition_epoch): set(p.in_sync())
            for name, versions in self.versions.items() for p, _ in versions
        }
        for client in self.all_clients:
            for message in client.received:
                if isinstance(message, wire.AlterIsrResult) and message.error is None:
                    key = (message.partition, message.leader_epoch, message.partition_epoch)
                    assert stored_at.get(key) == set(message.isr), (message, stored_at.get(key), self.steps)

    @invariant()
    def committed_hw_comes_from_a_well_formed_report(self) -> None:
        may_count = {name: {-1, *hws} for name, hws in self.reported_hws.items()}
        for index, (client, name, mark, hw) in enumerate(self.proposal_hws):
            # Its answer comes before the client's next proposal for the partition (steps settle).
            later = [m for c, n, m, _ in self.proposal_hws[index + 1:] if c is client and n == name]
            answers = client.received[mark:later[0] if later else len(client.received)]
            committed = any(isinstance(m, wire.AlterIsrResult) and m.partition == name and m.error is None for m in answers)
            if committed and hw is not None:
                may_count[name].add(hw)
        for name in PARTITIONS:
            known = [self.connections.live.max_hw(name)]
            known += [p.status.leader.hw for p, _ in self.versions[name] if p.status.leader is not None]
            assert max(known) <= max(may_count[name]), (name, known, may_count[name], self.steps)

    @invariant()
    def proposals_answered(self) -> None:
        pending = {
            name: proposal for name, proposal in self.connections.proposals.items()
            if (session := self.connections.sessions.get(proposal.spu)) is not None and session.number == proposal.incarnation
        }
        assert not pending, (pending, self.steps)
        # The last proposal each current connection sent for a partition was answered on it.
        for client, name, mark in self.sent_marks:
            if self.spus.get(client.spu_id) is not client or self.connected(client.spu_id) is None:
                continue
            answered = any(
                isinstance(message, wire.AlterIsrResult) and message.partition == name for message in client.received[mark:]
            )
            assert answered, ("proposal never answered", client.spu_id, name, self.steps)


HostileSpus.TestCase.settings = machine_settings("SC_HOSTILE", examples=12)
TestHostileSpus = HostileSpus.TestCase


async def test_a_followers_proposal_does_not_take_the_place_of_its_leaders() -> None:
    """Leader 0 proposes at the epochs it was told; follower 1 sends an AlterIsr for the same
    partition right after (buggy, or hostile). Both are answered (rule 4). The SC kept one pending
    proposal per partition, and the follower's replaced the leader's, which was then never
    answered: a leader waits for its answer before it proposes again, so it never proposed again
    for that partition (a lagging follower was never taken out; its high watermark could stall)."""
    settings_ = config.Settings(store=config.StoreKind.MEMORY, **COMMON_SETTINGS, spu_heartbeat_timeout=30.0)
    async with running(settings_) as sc, aiohttp.ClientSession() as client:
        for spu_id in SPU_IDS:
            await sc.register_spu(spu_id, online=False)
        assert sc.daemon.connections is not None and sc.daemon.context is not None
        port = sc.daemon.connections.port or 0
        spus = {spu_id: ScriptedSpu(client, port, spu_id) for spu_id in SPU_IDS}
        try:
            for spu in spus.values():
                assert isinstance(await spu.connect(), wire.Accepted)
            context = sc.daemon.context

            def online() -> None:
                for spu_id in SPU_IDS:
                    entry = context.local_store["spus"].view.get(f"spu-{spu_id}")
                    assert entry is not None and entry.obj.status.resolution is models.SpuResolution.ONLINE

            await sc.eventually(online)
            status, body = await sc.call(
                "POST", "/v1/topics", {"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1, 2]}]}}
            )
            assert status == 201, body
            leader, follower = spus[0], spus[1]
            await leader.wait_for(lambda: "t-0" in leader.replicas and leader.replicas["t-0"].leader == 0)
            await leader.lead("t-0")
            await leader.wait_for(lambda: leader.replicas["t-0"].partition_epoch == 1)  # Online, isr [0, 1, 2]
            await leader.propose("t-0", [0, 1, 2])  # the committed set again: answered "committed"
            await follower.propose("t-0", [1])
            await follower.wait_for(lambda: follower.results("t-0"))
            assert [(result.error, result.leader_epoch) for result in follower.results("t-0")] == [("not-leader", 0)]
            await leader.wait_for(lambda: leader.results("t-0"))
            assert [(result.error, result.message) for result in leader.results("t-0")] == [(None, "committed")]
        finally:
            for spu in spus.values():
                await spu.close()


@contextlib.asynccontextmanager
async def led_by_spu_0(settings: config.Settings) -> AsyncIterator[tuple[Running, dict[int, ScriptedSpu]]]:
    """The SC with SPUs 0 and 1 connected, and partition t-0 (replicas [0, 1]) Online, led by 0
    with isr [0, 1] (partition epoch 1)."""
    async with running(settings) as sc, aiohttp.ClientSession() as client:
        for spu_id in (0, 1):
            await sc.register_spu(spu_id, online=False)
        assert sc.daemon.connections is not None
        port = sc.daemon.connections.port or 0
        spus = {spu_id: ScriptedSpu(client, port, spu_id) for spu_id in (0, 1)}
        try:
            for spu in spus.values():
                assert isinstance(await spu.connect(), wire.Accepted)
            status, body = await sc.call("POST", "/v1/topics", {"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}})
            assert status == 201, body
            leader = spus[0]
            await leader.wait_for(lambda: "t-0" in leader.replicas and leader.replicas["t-0"].leader == 0)
            await leader.lead("t-0")
            await leader.wait_for(lambda: leader.replicas["t-0"].partition_epoch == 1)
            yield sc, spus
        finally:
            for spu in spus.values():
                await spu.close()


async def shown_hw(sc: Running) -> int:
    status, body = await sc.call("GET", "/v1/partitions/t-0")
    assert status == 200, body
    return int(body["status"]["leader"]["hw"])


async def shows_hw(sc: Running, expected: int) -> None:
    assert await shown_hw(sc) == expected


async def test_a_high_watermark_above_the_log_end_is_refused_and_leaves_no_partition_leaderless(settings: config.Settings) -> None:
    """A leader reported hw 2^63 - 1 with leo 5 (and a follower at that hw with leo 0): the SC took
    it, showed it, and wrote it with the partition's next status write, never to go back. When
    both replicas came back as new processes holding 10 records, neither held "every committed
    record", so the partition stayed leaderless with an empty in-sync set (only an unclean election
    could lead it). Now each such frame is refused, naming the values, and the HW stays the last
    one a well-formed report gave."""
    settings = settings.model_copy(update={"spu_offsets_interval": 0.1})
    async with led_by_spu_0(settings) as (sc, spus):
        leader = spus[0]
        await leader.report(("t-0", 5, 5, {1: 5}))
        await sc.eventually(lambda: shows_hw(sc, 5))
        epoch = leader.epoch("t-0")
        for (hw, leo), (follower_hw, follower_leo) in (((BIG, 5), (5, 5)), ((5, 5), (BIG, 0))):
            entry = wire.PartitionOffsets(
                partition="t-0", leader_epoch=epoch, hw=hw, leo=leo,
                followers=[wire.ReplicaOffsets(spu=1, hw=follower_hw, leo=follower_leo)],
            )
            await leader.send(wire.Offsets(partitions=[entry]))

        def errors() -> list[tuple[str, str]]:
            return [(m.code, m.message) for m in leader.received if isinstance(m, wire.Error)]

        await leader.wait_for(lambda: len(errors()) == 2)
        assert errors() == [
            ("invalid", f"SPU 0 reported hw {BIG} above its log end (leo 5) for partition 't-0'"),
            ("invalid", f"SPU 0 reported hw {BIG} above the log end (leo 0) of follower SPU 1 for partition 't-0'"),
        ]
        assert await shown_hw(sc) == 5
        # Both replicas go: nobody leads, and the status written holds the HW known.
        for spu in spus.values():
            await spu.close()

        async def leaderless() -> None:
            stored = await sc.read("partitions", "t-0")
            assert isinstance(stored, models.Partition) and stored.status.resolution is LEADER_OFFLINE, stored
            assert stored.status.leader is not None and stored.status.leader.hw == 5, stored.status

        await sc.eventually(leaderless)
        # Both come back as new processes holding 10 records, more than the 5 committed: one leads.
        assert sc.daemon.connections is not None
        for spu_id in (0, 1):
            spus[spu_id] = ScriptedSpu(spus[spu_id].session, sc.daemon.connections.port or 0, spu_id)
            held = [wire.HostedReplica(partition="t-0", leo=10, leader_epoch=None)]
            assert isinstance(await spus[spu_id].connect(hosted=held), wire.Accepted)

        async def led_again() -> None:
            stored = await sc.read("partitions", "t-0")
            assert isinstance(stored, models.Partition) and stored.status.resolution is ONLINE, stored
            assert stored.spec.leader in stored.status.isr, stored

        await sc.eventually(led_again)


async def test_a_refused_proposals_hw_does_not_count_committed(settings: config.Settings) -> None:
    """A proposal's HW is written with the write that commits its set (rule 4). A refused one's
    (here: it names SPU 5, no replica) raised the HW the SC knows from 7 to 2^63 - 1 all the same,
    and the next status write stored it for good."""
    async with led_by_spu_0(settings) as (sc, spus):
        leader = spus[0]
        await leader.report(("t-0", 7, 7, {1: 7}))
        await sc.eventually(lambda: shows_hw(sc, 7))
        await leader.propose("t-0", [0, 5], hw=BIG, incarnations={5: 1})
        await leader.wait_for(lambda: leader.results("t-0"))
        [refused] = leader.results("t-0")
        assert refused.error == "invalid", refused
        assert await shown_hw(sc) == 7
        # A shrink at HW 8 is committed: its write records 8 (the leader's next offsets have not come).
        await leader.propose("t-0", [0], hw=8)
        await leader.wait_for(lambda: len(leader.results("t-0")) == 2)
        committed = leader.results("t-0")[1]
        assert (committed.error, committed.isr) == (None, [0]), committed
        stored = await sc.read("partitions", "t-0")
        assert isinstance(stored, models.Partition) and stored.status.leader is not None
        assert (stored.status.isr, stored.status.leader.hw) == ([0], 8), stored.status
        assert await shown_hw(sc) == 8


async def test_a_leaders_frames_about_a_topic_deleted_and_created_again_count_for_nothing(settings: config.Settings) -> None:
    """Topic t is deleted and created again with the same placement: its partition t-0 starts
    again at leader epoch 0 on the same leader. The leader's frames about the old t-0 that reach
    the SC after it told the leader of the new one (sent before the leader read that update) named
    the partition by name and epoch alone, so the old leadership confirmed the new partition, and
    the old log's HW became the new one's, shown and written for good. Each names the partition's
    uid now: those about the old one are refused (`stale-partition`) or dropped."""
    settings = settings.model_copy(update={"spu_offsets_interval": 0.1})
    async with led_by_spu_0(settings) as (sc, spus):
        leader = spus[0]
        await leader.report(("t-0", 7, 7, {1: 7}))
        await sc.eventually(lambda: shows_hw(sc, 7))
        old = leader.replicas["t-0"]
        assert old.uid is not None
        status, body = await sc.call("DELETE", "/v1/topics/t")
        assert status in (200, 202, 204), body

        async def gone() -> None:
            assert await sc.read("partitions", "t-0") is None

        await sc.eventually(gone)
        status, body = await sc.call("POST", "/v1/topics", {"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 1]}]}})
        assert status == 201, body
        await leader.wait_for(lambda: "t-0" in leader.replicas and leader.replicas["t-0"].uid != old.uid)
        new = leader.replicas["t-0"]
        assert (new.leader, new.leader_epoch, new.partition_epoch) == (0, 0, 0)  # as old was: only the uid tells them apart
        # What the leader said of the old partition before it read that update.
        identity = old.uid
        leadership = wire.Leadership(partition="t-0", leader_epoch=0, uid=identity)
        await leader.send(wire.Leading(partitions=[leadership]))
        offsets = wire.PartitionOffsets(partition="t-0", leader_epoch=0, hw=1_000, leo=1_000, uid=identity)
        await leader.send(wire.Offsets(partitions=[offsets]))
        await leader.send(wire.AlterIsr(partition="t-0", leader_epoch=0, partition_epoch=1, isr=[0], hw=1_000, uid=identity))
        await leader.wait_for(lambda: leader.results("t-0"))
        [refused] = leader.results("t-0")
        assert refused.error == "stale-partition", refused
        [error] = [m for m in leader.received if isinstance(m, wire.Error)]
        assert (error.code, error.partition) == ("stale-partition", "t-0"), error
        stored = await sc.read("partitions", "t-0")
        assert isinstance(stored, models.Partition) and stored.status.resolution is models.PartitionResolution.OFFLINE, stored
        # Confirmed by its leader, it is Online, with none of the old partition's HW.
        await leader.lead("t-0")

        async def online() -> None:
            stored = await sc.read("partitions", "t-0")
            assert isinstance(stored, models.Partition) and stored.status.resolution is ONLINE, stored
            assert stored.status.leader is not None and stored.status.leader.hw < 7, stored.status

        await sc.eventually(online)
        assert await shown_hw(sc) < 7
        await leader.report(("t-0", 3, 3, {1: 3}))
        await sc.eventually(lambda: shows_hw(sc, 3))
