"""Replica moves under faults, as a state machine over the rules (``partition_state.decide``) with
a small model of the SPUs: their logs, what each process was told, its connection, its
registration. Moves start, are cancelled, and meet SPUs that crash, reconnect, are drained,
deleted and registered again, an SC that restarts (only the store is left), and proposals that
arrive late. After every step: the leader is a member of the in-sync set, the set a subset of the
replicas, epochs never go back, every current member holds every acknowledged record, and a
leader never commits over a record acknowledged before. Once every SPU is up, a move ends."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from connection_manager import reports
from controller.reconcile import partition_state as ps
from store import models

IDS = range(5)
NAME = "t-0"
ONLINE, OFFLINE, LEADER_OFFLINE = ps.ONLINE, ps.OFFLINE, ps.LEADER_OFFLINE


@dataclass
class Node:
    """One SPU id: the registration holding it, and the machine (its journaled log) and process."""

    registered_at: int | None = 1
    alive: bool = True  # a process runs
    online: bool = True  # connected to the SC, Hosted sent
    draining: bool = False
    log: list[int] = field(default_factory=list)  # each record's leader epoch
    hosts: bool = False  # the process holds the replica (told it is one, or found on disk)
    leader: int | None = None  # the leader its process was told (None: idle)
    epoch: int | None = None  # the leader epoch of that role
    isr: tuple[int, ...] = ()  # the in-sync set it was told (a leader's HW counts it)
    partition_epoch: int = 0
    followers: dict[int, int] = field(default_factory=dict)  # a leader's view: follower -> offset it holds
    seen: dict[int, int] = field(default_factory=dict)  # a leader's view: follower -> the incarnation it fetched under
    hw: int = 0
    pending: tuple[int, ...] | None = None  # a leader's proposal in flight
    number: int = 0  # the current connection's incarnation
    incarnation: reports.Incarnation | None = None

    def told_epoch(self) -> int | None:
        return self.epoch if self.leader is not None else None


class View:
    """``partition_state.Spus`` over the model."""

    def __init__(self, nodes: dict[int, Node]) -> None:
        self.nodes = nodes

    def online(self, spu: int) -> bool:
        node = self.nodes.get(spu)
        return node is not None and node.online

    def draining(self, spu: int) -> bool:
        node = self.nodes.get(spu)
        return node is not None and node.draining

    def registered_at(self, spu: int) -> int | None:
        node = self.nodes.get(spu)
        return None if node is None else node.registered_at

    def incarnation(self, spu: int) -> reports.Incarnation | None:
        node = self.nodes.get(spu)
        return None if node is None or not node.online else node.incarnation

    def maybe_registered(self, spu: int) -> bool:
        return False


class Moves(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.revision = 2
        self.nodes = {spu: Node() for spu in IDS}
        self.nodes[4] = Node(registered_at=None, alive=False, online=False)
        self.partition = models.Partition(
            name=NAME,
            spec=models.PartitionSpec(leader=0, replicas=[0, 1, 2]),
            status=models.PartitionStatus(
                resolution=ONLINE, leader_epoch=1, partition_epoch=1, isr=[0, 1, 2],
                leader=models.ReplicaStatus(spu=0, hw=0, leo=0),
            ),
        )
        self.mod_revision = 2
        self.acked: list[int] = []  # every record acknowledged to a producer, in order
        self.sc_hw = 0  # the highest HW the SC knows (stored, or reported since it started)
        self.proposals: list[reports.Proposal] = []  # sent, not yet read by the SC
        self.epochs = (1, 1)
        self.steps: list[str] = []
        for spu in (0, 1, 2, 3):
            node = self.nodes[spu]
            node.number = 1
            node.incarnation = reports.Incarnation(spu, 1, {}, {})
        self._push()

    # ------------------------------------------------------------------ the SC

    def _write(self, partition: models.Partition) -> None:
        self.revision += 1
        self.partition, self.mod_revision = partition, self.revision
        self._push()

    def _push(self) -> None:
        """Every connected SPU takes the committed state (the SC's update), as the simulator does."""
        partition = self.partition
        status = partition.status
        for spu, node in self.nodes.items():
            if not node.online:
                continue
            incarnation = node.incarnation
            assert incarnation is not None
            if incarnation.restarted.get(NAME, status.partition_epoch) != status.partition_epoch:
                del incarnation.restarted[NAME]
            if spu not in partition.spec.replicas:
                if node.hosts:  # deletedReplicas: the replica and its log go
                    node.hosts, node.log, node.leader, node.epoch, node.followers, node.pending = False, [], None, None, {}, None
                continue
            leader: int | None = partition.spec.leader
            if status.resolution is LEADER_OFFLINE or (leader == spu and incarnation.restarted_at(NAME, status.partition_epoch)):
                leader = None
            new_term = status.leader_epoch != node.epoch or leader != node.leader
            if leader == spu:
                if new_term or node.leader != spu:
                    node.followers, node.pending = {}, None
                node.followers = {f: o for f, o in node.followers.items() if f in partition.spec.replicas}
            else:
                node.followers, node.pending = {}, None
            node.hosts = True
            node.leader, node.epoch = leader, status.leader_epoch
            if node.pending is not None and status.partition_epoch > node.partition_epoch:
                node.pending = None
            node.partition_epoch = status.partition_epoch
            node.isr = tuple(partition.in_sync())

    def _decide(self, proposal: reports.Proposal | None = None) -> None:
        partition = self.partition
        leader = self.nodes[partition.spec.leader]
        confirmed = leader.online and leader.leader == partition.spec.leader and leader.epoch == partition.status.leader_epoch
        facts = ps.Facts(committed_hw=self.sc_hw, confirmed=confirmed, proposal=proposal)
        decision = ps.decide(partition, self.mod_revision, View(self.nodes), facts)
        transition = decision.transition
        if transition is None:
            return
        state = transition.state
        spec = partition.spec
        replicas = list(transition.replicas if transition.replicas is not None else spec.replicas)
        reassignment = None if transition.ends_move else spec.reassignment
        written = models.Partition(
            name=NAME,
            spec=models.PartitionSpec(leader=state.leader, replicas=replicas, reassignment=reassignment),
            status=models.PartitionStatus(
                resolution=state.resolution, leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch,
                isr=list(state.isr), leader=models.ReplicaStatus(spu=state.leader, hw=self.sc_hw, leo=-1),
            ),
        )
        self.steps.append(f"  wrote {state} replicas={replicas} move={reassignment} ({transition.reason})")
        self._write(written)

    @rule()
    def sc_pass(self) -> None:
        self._decide()

    @precondition(lambda self: self.proposals)
    @rule(data=st.data())
    def sc_reads_a_proposal(self, data: st.DataObject) -> None:
        proposal = self.proposals.pop(data.draw(st.integers(0, len(self.proposals) - 1)))
        node = self.nodes[proposal.spu]
        if not node.online or node.number != proposal.incarnation:
            return  # a pending proposal dies with its connection
        self._decide(proposal)

    @rule()
    def sc_restarts(self) -> None:
        """Nothing in memory survives: the HW it knows is the stored one, and every SPU reconnects."""
        stored = self.partition.status.leader
        self.sc_hw = -1 if stored is None else stored.hw
        self.proposals.clear()
        for node in self.nodes.values():
            node.online = False

    # ------------------------------------------------------------------ the rebalance controller

    @precondition(lambda self: self.partition.spec.reassignment is None)
    @rule(goal=st.lists(st.sampled_from(list(IDS)), min_size=1, max_size=3, unique=True))
    def move_starts(self, goal: list[int]) -> None:
        spec = self.partition.spec
        move = models.Reassignment(previous=list(spec.replicas), target=goal)
        self._write(self.partition.model_copy(update={"spec": spec.model_copy(update={"reassignment": move})}))

    @precondition(lambda self: self.partition.spec.reassignment is not None and not self.partition.spec.reassignment.cancelled)
    @rule()
    def move_cancelled(self) -> None:
        spec = self.partition.spec
        assert spec.reassignment is not None
        back = models.Reassignment(previous=spec.reassignment.previous, target=spec.reassignment.previous)
        self._write(self.partition.model_copy(update={"spec": spec.model_copy(update={"reassignment": back})}))

    @precondition(lambda self: self.partition.spec.reassignment is not None)
    @rule(goal=st.lists(st.sampled_from(list(IDS)), min_size=1, max_size=3, unique=True))
    def move_retargeted(self, goal: list[int]) -> None:
        """Another target while the move is in flight (a stored object anyone may have written)."""
        spec = self.partition.spec
        assert spec.reassignment is not None
        again = models.Reassignment(previous=spec.reassignment.previous, target=goal)
        self._write(self.partition.model_copy(update={"spec": spec.model_copy(update={"reassignment": again})}))

    # ------------------------------------------------------------------ SPUs

    def _leads(self, node: Node) -> bool:
        return node.alive and node.leader is not None and node.leader == self._id(node)

    def _id(self, node: Node) -> int:
        return next(spu for spu, other in self.nodes.items() if other is node)

    @rule(spu=st.sampled_from(list(IDS)))
    def produce(self, spu: int) -> None:
        node = self.nodes[spu]
        if self._leads(node):
            assert node.epoch is not None
            node.log.append(node.epoch)

    @rule(spu=st.sampled_from(list(IDS)))
    def fetch(self, spu: int) -> None:
        """The follower truncates where the logs diverge, tells the leader what it holds, copies the rest."""
        node = self.nodes[spu]
        if not node.alive or node.leader is None or node.leader == spu:
            return
        leader = self.nodes[node.leader]
        if not self._leads(leader) or leader.epoch != node.epoch or spu not in self._told_replicas(leader):
            return
        common = 0
        while common < min(len(node.log), len(leader.log)) and node.log[common] == leader.log[common]:
            common += 1
        del node.log[common:]
        leader.followers[spu] = len(node.log)
        leader.seen[spu] = node.number
        node.log.extend(leader.log[len(node.log):])

    def _told_replicas(self, leader: Node) -> list[int]:
        # What the leader was told; the model's pushes reach every connected SPU at once.
        return self.partition.spec.replicas if leader.online else [*leader.followers, self._id(leader)]

    @rule(spu=st.sampled_from(list(IDS)))
    def leader_commits(self, spu: int) -> None:
        """HW: the lowest log end over the in-sync set it was told and its proposal's members."""
        node = self.nodes[spu]
        if not self._leads(node):
            return
        counted = set(node.isr) | set(node.pending or ())
        hw = min([len(node.log), *(node.followers.get(f, 0) for f in counted if f != spu)])
        if hw <= node.hw:
            return
        node.hw = hw
        if hw > len(self.acked):
            assert node.log[: len(self.acked)] == self.acked, f"SPU {spu} commits over acknowledged records"
            self.acked = node.log[:hw]
        if node.online and node.epoch == self.partition.status.leader_epoch:
            self.sc_hw = max(self.sc_hw, hw)

    @rule(spu=st.sampled_from(list(IDS)), out=st.sets(st.sampled_from(list(IDS))))
    def leader_proposes(self, spu: int, out: set[int]) -> None:
        """Caught-up replicas in, any others out (the test decides who lags)."""
        node = self.nodes[spu]
        if not self._leads(node) or not node.online or node.pending is not None:
            return
        assert node.epoch is not None
        caught_up = [f for f, offset in node.followers.items() if offset >= node.hw and f not in node.isr]
        proposed = tuple(m for m in (*node.isr, *caught_up) if m == spu or m not in out)
        if set(proposed) == set(node.isr):
            return
        node.pending = proposed
        named = tuple((f, node.seen[f]) for f in proposed if f in caught_up)
        self.proposals.append(reports.Proposal(NAME, spu, node.number, node.epoch, node.partition_epoch, proposed, named))

    @rule(spu=st.sampled_from(list(IDS)))
    def crash(self, spu: int) -> None:
        node = self.nodes[spu]
        node.alive = node.online = False
        node.leader = node.epoch = node.pending = None
        node.followers, node.hw = {}, 0

    @rule(spu=st.sampled_from(list(IDS)), lost=st.integers(1, 3))
    def crash_losing_the_tail(self, spu: int, lost: int) -> None:
        """A machine crash of a follower outside the in-sync set: its unflushed tail is gone. Its
        leader may have seen it catch up, and proposed it, before (KIP-903). (A member's loss is
        the rules' restart case; every member losing records is beyond any rule.)"""
        if spu in self.partition.in_sync() or spu == self.partition.spec.leader:
            return
        self.crash(spu)
        node = self.nodes[spu]
        del node.log[max(0, len(node.log) - lost):]

    @rule(spu=st.sampled_from(list(IDS)))
    def disconnect(self, spu: int) -> None:
        self.nodes[spu].online = False

    @rule(spu=st.sampled_from(list(IDS)))
    def connect(self, spu: int) -> None:
        """A new connection (of the same process, or of a new one if it was down): Hosted, then sync."""
        node = self.nodes[spu]
        if node.online or node.registered_at is None:
            return
        node.alive = True
        node.number += 1
        hosted = {NAME: (len(node.log), node.told_epoch())} if node.hosts or node.log else {}
        node.hosts = bool(hosted)
        restarted = reports.roles_not_continued(spu, hosted, [self.partition])
        node.incarnation = reports.Incarnation(spu, node.number, hosted, restarted)
        node.online = True
        self._push()

    @rule(spu=st.sampled_from(list(IDS)))
    def drain_toggled(self, spu: int) -> None:
        self.nodes[spu].draining = not self.nodes[spu].draining

    @rule(spu=st.sampled_from(list(IDS)))
    def deleted(self, spu: int) -> None:
        node = self.nodes[spu]
        node.registered_at = None
        node.online = False  # its connection goes with its record

    @rule(spu=st.sampled_from(list(IDS)))
    def registered(self, spu: int) -> None:
        """The id registered again: a new SPU (another machine: nothing on its disk)."""
        if self.nodes[spu].registered_at is None:
            self.revision += 1
            self.nodes[spu] = Node(registered_at=self.revision, alive=False, online=False)

    # ------------------------------------------------------------------ a move ends

    @precondition(lambda self: self.partition.spec.reassignment is not None)
    @rule()
    def everything_comes_back(self) -> None:
        """Every SPU registered, up and not draining, replicating: the move must end (or nobody is
        left who holds the committed records)."""
        for spu, node in self.nodes.items():
            if node.registered_at is None:
                self.revision += 1
                self.nodes[spu] = Node(registered_at=self.revision, alive=False, online=False)
        for spu, node in self.nodes.items():
            node.draining = False
            if not node.online:
                self.connect(spu)
        for _ in range(12):
            self._decide()
            for spu in IDS:
                self.fetch(spu)
                self.fetch(spu)
            for spu in IDS:
                self.leader_commits(spu)
            self.proposals.clear()
            for spu, node in self.nodes.items():
                node.pending = None
                self.leader_proposes(spu, set())
            for proposal in self.proposals:
                self._decide(proposal)
            self.proposals.clear()
            if self.partition.spec.reassignment is None:
                return
        status = self.partition.status
        assert status.resolution is LEADER_OFFLINE and not status.isr, f"the move did not end: {self.partition!r}"

    # ------------------------------------------------------------------ invariants

    @invariant()
    def the_committed_state_is_safe(self) -> None:
        partition = self.partition
        spec, status = partition.spec, partition.status
        assert status.leader_epoch >= self.epochs[0] and status.partition_epoch >= self.epochs[1], "an epoch went back"
        self.epochs = (status.leader_epoch, status.partition_epoch)
        assert set(status.isr) <= set(spec.replicas), f"in-sync set {status.isr} outside the replicas {spec.replicas}"
        if status.resolution is ONLINE:
            assert spec.leader in status.isr, f"leader {spec.leader} outside the in-sync set {status.isr}"
        for member in partition.in_sync():
            node = self.nodes[member]
            if node.registered_at is not None and node.registered_at <= self.mod_revision:
                assert node.log[: len(self.acked)] == self.acked, f"member SPU {member} lacks acknowledged records"
        if status.resolution is ONLINE:
            leader = self.nodes[spec.leader]
            if leader.registered_at is not None and leader.registered_at <= self.mod_revision:
                assert leader.log[: len(self.acked)] == self.acked, f"leader SPU {spec.leader} lacks acknowledged records"


Moves.TestCase.settings = settings(
    max_examples=600, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_replica_moves_under_faults = Moves.TestCase



def test_a_follower_that_lost_its_tail_is_not_added_by_a_proposal_made_before_its_crash() -> None:
    """KIP-903, the machine's steps by hand: SPU 2 is out of the in-sync set, catches up, its leader
    proposes it back; its machine crashes losing its tail, and its new process connects before the
    SC reads the proposal. The proposal names the old process: refused, and every member still
    holds every acknowledged record. Once the leader sees the new process catch up, it joins."""
    machine = Moves()

    def sc_reads_the_proposal() -> None:
        machine._decide(machine.proposals.pop())
        machine.the_committed_state_is_safe()

    machine.leader_proposes(0, {2})
    sc_reads_the_proposal()
    assert machine.partition.status.isr == [0, 1]
    for _ in range(3):
        machine.produce(0)
    for _ in range(2):  # the second fetch tells the leader what the first copied
        machine.fetch(1)
        machine.fetch(2)
    machine.leader_commits(0)
    assert len(machine.acked) == 3
    machine.leader_proposes(0, set())
    machine.crash_losing_the_tail(2, 2)
    machine.connect(2)
    sc_reads_the_proposal()
    assert machine.partition.status.isr == [0, 1]
    machine.nodes[0].pending = None  # refused: the leader may propose again
    for _ in range(2):
        machine.fetch(2)
    machine.leader_proposes(0, set())
    sc_reads_the_proposal()
    assert machine.partition.status.isr == [0, 1, 2]
