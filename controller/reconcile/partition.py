"""Partition controller decisions: leader elections and the committed in-sync set, from the
stored state and what the SC knows of its SPUs; answers to leaders' proposals.

Purely computational, no I/O: (snapshot, the cluster view and the names to look at) -> actions and
answers. The rules are ``partition_state``'s; this module finds what to look at, fast, and turns
transitions into writes. Offsets never decide anything: they are only shown.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from connection_manager import health as health_module
from connection_manager import lrs, reports
from controller.reconcile import actions, election, faults as faults_module, partition_state
from store import local, models

ONLINE = models.PartitionResolution.ONLINE
OFFLINE = models.PartitionResolution.OFFLINE
LEADER_OFFLINE = models.PartitionResolution.LEADER_OFFLINE
HEALTH_ONLINE, HEALTH_OFFLINE = health_module.Health.ONLINE, health_module.Health.OFFLINE

# The structured causes of a leader change (Action.cause), as the audits report them.
CAUSE_SPU_OFFLINE = partition_state.CAUSE_SPU_OFFLINE
CAUSE_PREFERRED = partition_state.CAUSE_PREFERRED
CAUSE_DRAIN = partition_state.CAUSE_DRAIN
CAUSE_UNCLEAN = partition_state.CAUSE_UNCLEAN
CAUSE_REASSIGNMENT = partition_state.CAUSE_REASSIGNMENT


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the partition controller knows beyond the store, all of it from SPUs' current connections."""

    health: Mapping[int, health_module.HealthRecord]
    live: Mapping[str, lrs.LiveStatus]
    unclean_election: bool = False
    rebalance_batch: int = 100
    incarnations: Mapping[int, reports.Incarnation] = field(default_factory=dict)
    proposals: Mapping[str, reports.Proposal] = field(default_factory=dict)
    # Partition -> (SPU, leader epoch) of the last leadership confirmation accepted.
    confirmed: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Partition -> the highest high watermark reported since the SC started.
    max_hw: Mapping[str, int] = field(default_factory=dict)
    # Partitions with a good leader decided per pass, and writes that change no leader (elections
    # are never held back): a failover writes its elections first and the in-sync changes of the
    # SPU's followerships next, a batch per pass, so the loop serves the rest in between.
    changes_batch: int = 500


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the partition controller needs beyond the snapshot: the cluster view, and the
    partitions to look at (``names``; every partition when None)."""

    view: ClusterView
    names: Collection[str] | None = None
    # Decide the partitions whose leader cannot lead alone when others are concerned too, and
    # postpone those (see decide). The controller turns it off for the pass after a split.
    urgent_first: bool = True
    # Decide only those, postponing every other, even when all or none are urgent: the
    # controller's elections are on their way to the SPUs, and the rest can wait for them.
    hold_others: bool = False
    # Where a partition whose decision raised goes (faults.py).
    faults: faults_module.Faults = faults_module.RAISE


@dataclass(slots=True)
class Decided:
    """Unlike the other kinds, a pass owes answers too: leaders' proposals are refused or
    committed here, and the answer goes back on 9004 (not through the store)."""

    actions: list[actions.Action] = field(default_factory=list)
    # (the proposal, the answer to send its SPU)
    answers: list[tuple[reports.Proposal, partition_state.Answer, partition_state.State]] = field(default_factory=list)
    # Partitions with a change due that did not fit in this pass: to look at again at once.
    postponed: set[str] = field(default_factory=set)
    # Whether this pass decided only the partitions whose leader cannot lead, postponing the others.
    split: bool = False
    # Those others (part of ``postponed``): each has a leader that can lead, so it stays out of
    # the urgent ones until it changes or an SPU hosting it does.
    not_urgent: set[str] = field(default_factory=set)
    # Partitions led by another SPU than their preferred one, looked at after this pass's batch of
    # preferred-leader moves was full: due again once the moves decided here are written.
    preferred_waiting: set[str] = field(default_factory=set)
    # Partitions with a change due that cannot be written (their epochs are spent): why.
    refused: dict[str, str] = field(default_factory=dict)


def decide(snapshot: local.Snapshot, inputs: Inputs) -> Decided:
    """Actions for the partitions in ``inputs.names`` (every partition when None), and the answers
    owed to proposals about them (a proposal for a partition that does not exist is refused)."""
    partitions = snapshot.entries("partitions")
    view, names = inputs.view, inputs.names
    cluster = Cluster(snapshot, view)
    decided = Decided()
    rebalanced = changes = looked = 0
    candidates: Collection[str] = partitions if names is None else names
    good = cluster.good
    # Whether some partition may have a leader that cannot lead: an SPU registered but not good.
    # (A full pass of a healthy cluster skips the scan below: 100,000 lookups.)
    some_bad = names is not None or len(good) < cluster.registered
    if inputs.urgent_first and some_bad:
        # A failover's elections are written before anything else is even decided: an SPU that
        # led 2,000 partitions follows 4,000 more, whose in-sync changes can wait one pass.
        urgent = [
            name for name in candidates
            if (entry := partitions.get(name)) is not None and entry.obj.spec.leader not in good
        ]
        if inputs.hold_others or (urgent and len(urgent) < len(candidates)):
            chosen = set(urgent)
            decided.not_urgent.update(name for name in candidates if name not in chosen)
            decided.postponed.update(decided.not_urgent)
            decided.split = True
            candidates = urgent
    for name in candidates:
        entry = partitions.get(name)
        if entry is None:
            proposal = view.proposals.get(name)
            if proposal is not None:
                answer = partition_state.Answer(
                    proposal, partition_state.UNKNOWN_PARTITION, f"partition {name!r} does not exist"
                )
                decided.answers.append((proposal, answer, partition_state.State(proposal.spu, OFFLINE, 0, 0, ())))
            continue
        try:
            if cluster.quiet(entry, view):
                continue
            partition: models.Partition = entry.obj
            if partition.spec.leader in good:
                # Bounded work per pass: deciding 4,000 in-sync changes took the event loop for
                # ~600 ms, in which the elections just written could not reach the SPUs.
                if looked >= view.changes_batch:
                    decided.postponed.add(name)
                    continue
                looked += 1
            facts = partition_state.Facts(
                committed_hw=committed_hw(partition, view.max_hw),
                confirmed=view.confirmed.get(name) == (partition.spec.leader, partition.status.leader_epoch),
                proposal=view.proposals.get(name),
                unclean=view.unclean_election,
                rebalance=rebalanced < view.rebalance_batch,
            )
            decision = partition_state.decide(partition, entry.mod_revision, cluster, facts)
            transition = decision.transition
            if transition is not None and not transition.cause and changes >= view.changes_batch:
                decided.postponed.add(name)
                continue
            hw = facts.committed_hw
            accepted = decision.accepted
            if accepted is not None and accepted.hw is not None:
                # Written with the set it was proposed with (a move's caught-up write records what
                # the new replicas copied); a refused proposal's HW is never written.
                hw = max(hw, accepted.hw)
            # Built before anything of it is kept: a step that raises leaves nothing behind.
            write = None if transition is None else _write(entry, transition, view, hw)
        except Exception as error:  # this partition only (faults.py); its proposal waits
            inputs.faults.record("partitions", name, error)
            continue
        if transition is not None and not transition.cause:
            changes += 1
        if decision.answer is not None:
            decided.answers.append((decision.answer.proposal, decision.answer, partition_state.stored_state(partition)))
        if decision.refused:
            decided.refused[name] = decision.refused
        if transition is None or write is None:
            if not facts.rebalance and partition.spec.replicas[0] != partition.spec.leader:
                decided.preferred_waiting.add(name)
            continue
        rebalanced += transition.cause == CAUSE_PREFERRED
        decided.actions.append(write)
    # Leader changes first: they are what a failover waits for, the in-sync changes can follow.
    decided.actions.sort(key=lambda action: action.verb is not actions.Verb.ELECT)
    return decided


class HostingIndex:
    """SPU id -> the names of the partitions with a replica on it, kept up to date from the
    partition controller's changes, so a change of one SPU looks at its partitions only (a failover
    at 100,000 partitions would otherwise check every partition first). A deleted partition leaves
    it at once; one moved off an SPU leaves that SPU's set when a change of the SPU looks at it, so
    churn leaves nothing behind (before, every topic ever deleted stayed, and each SPU change
    looked at all of its partitions again)."""

    def __init__(self) -> None:
        self._hosting: dict[int, set[str]] = {}
        self.built = False

    def update(self, snapshot: local.Snapshot, changes: local.Changes[models.Partition]) -> None:
        if changes.full or not self.built:
            self._hosting = {}
            entries: Iterable[local.Entry[models.Partition]] = snapshot.entries("partitions").values()
            self.built = True
        else:
            entries = changes.updated
            if changes.deleted:
                gone = set(changes.deleted)
                for held in self._hosting.values():
                    held -= gone
                for spu in [spu for spu, held in self._hosting.items() if not held]:
                    del self._hosting[spu]
        hosting = self._hosting
        for entry in entries:
            for spu in entry.obj.spec.replicas:
                names = hosting.get(spu)
                if names is None:
                    names = hosting[spu] = set()
                names.add(entry.name)

    def of(self, spu_ids: Iterable[int], partitions: Mapping[str, local.Entry[models.Partition]] | None = None) -> set[str]:
        """The partitions on ``spu_ids``; given the current ``partitions``, the names of those that
        moved off an SPU leave its set on the way."""
        found: set[str] = set()
        for spu in spu_ids:
            names = self._hosting.get(spu)
            if not names:
                continue
            if partitions is not None:
                names.difference_update(
                    [name for name in names if (entry := partitions.get(name)) is None or spu not in entry.obj.spec.replicas]
                )
            found |= names
        return found

    def size(self) -> int:
        """Names held, over every SPU (a replica's count when up to date)."""
        return sum(len(names) for names in self._hosting.values())


def committed_hw(partition: models.Partition, max_hw: Mapping[str, int]) -> int:
    """The highest high watermark known: stored, or reported since the SC started."""
    stored = partition.status.leader
    return max(-1 if stored is None else stored.hw, max_hw.get(partition.name, -1))


def draining_spus(snapshot: local.Snapshot) -> frozenset[int]:
    """The ids of the SPUs an operator asked to drain (spec.drain)."""
    return frozenset(
        entry.obj.spec.id
        for entry in snapshot.entries("spus").values()
        if entry.obj.spec.drain
    )


class Cluster:
    """``partition_state.Spus`` over one snapshot and view. An SPU is online when connected through
    an incarnation that said what it holds, or (before it reconnects after an SC restart) when
    recorded Online and still within the SPU controller's grace period."""

    def __init__(self, snapshot: local.Snapshot, view: ClusterView, also_draining: Collection[int] = ()) -> None:
        self._health = view.health
        self._incarnations = view.incarnations
        self._recorded_online = set()
        self._registered: dict[int, int] = {}
        draining = set(also_draining)
        for entry in snapshot.entries("spus").values():
            spu: models.Spu = entry.obj
            spu_id = spu.spec.id
            if spu.status.resolution is models.SpuResolution.ONLINE:
                self._recorded_online.add(spu_id)
            if spu.spec.drain:
                draining.add(spu_id)
            # Of SPUs sharing an id (only writes behind the SC's back make them), the first created.
            known = self._registered.get(spu_id)
            self._registered[spu_id] = entry.create_revision if known is None else min(known, entry.create_revision)
        self._draining = frozenset(draining)
        # SPU records in the store this SC cannot read: any id not registered may be one of theirs.
        self._unreadable = bool(snapshot.unreadable("spus"))
        self.newest_registration = max(self._registered.values(), default=0)
        self.registered = len(self._registered)
        # SPUs nothing is to be decided about in the common case: up, leading freely, registered,
        # and whose connection took up every role it had.
        self.good = frozenset(
            spu_id
            for spu_id in self._registered
            if spu_id not in self._draining
            and self.online(spu_id)
            and not (spu_id in self._incarnations and self._incarnations[spu_id].restarted)
        )

    def online(self, spu: int) -> bool:
        record = self._health.get(spu)
        if record is not None and record.state is HEALTH_ONLINE:
            return True
        if record is not None and record.state is HEALTH_OFFLINE:
            return False
        return spu in self._recorded_online

    def draining(self, spu: int) -> bool:
        return spu in self._draining

    def registered_at(self, spu: int) -> int | None:
        return self._registered.get(spu)

    def incarnation(self, spu: int) -> reports.Incarnation | None:
        return self._incarnations.get(spu)

    def maybe_registered(self, spu: int) -> bool:
        return self._unreadable and spu not in self._registered

    def quiet(self, entry: local.Entry[models.Partition], view: ClusterView) -> bool:
        """Nothing can be due for this partition (checked without building anything): Online,
        led and in sync through good SPUs registered before its last write, no proposal, and no
        preferred leader waiting to take over. Every partition of a large cluster goes through
        here on each full pass."""
        partition: models.Partition = entry.obj
        status = partition.status
        if view.proposals and partition.name in view.proposals:
            return False
        if partition.spec.reassignment is not None:
            return False  # a move in progress: its next step may be due
        resolution = status.resolution
        if resolution is OFFLINE:
            # As created, until its leader confirms it leads.
            if view.confirmed.get(partition.name) == (partition.spec.leader, status.leader_epoch):
                return False
        elif resolution is not ONLINE:
            return False
        good = self.good
        spec = partition.spec
        leader = spec.leader
        if leader not in good or (self.newest_registration > entry.mod_revision and status.partition_epoch):
            return False
        in_sync = status.isr if status.partition_epoch else spec.replicas
        for spu in in_sync:
            if spu not in good:
                return False
        preferred = spec.replicas[0]
        return resolution is OFFLINE or preferred == leader or preferred not in good or preferred not in in_sync


def _write(entry: local.Entry[models.Partition], transition: partition_state.Transition, view: ClusterView, hw: int) -> actions.Action:
    partition: models.Partition = entry.obj
    state = transition.state
    spec = partition.spec
    moved = transition.replicas is not None or transition.ends_move
    if moved:
        spec = models.PartitionSpec(
            leader=state.leader,
            replicas=list(transition.replicas if transition.replicas is not None else spec.replicas),
            reassignment=None if transition.ends_move else spec.reassignment,
        )
    status = _status(spec, partition, state, view.live.get(partition.name), hw)
    if state.leader == partition.spec.leader and not moved:
        if transition.move_event:
            return actions.update_status(partition, status, entry.mod_revision, transition.reason, cause=transition.move_event)
        return actions.update_status(partition, status, entry.mod_revision, transition.reason)
    if state.leader != spec.leader:
        spec = models.PartitionSpec(leader=state.leader, replicas=spec.replicas, reassignment=spec.reassignment)
    updated = partition.model_copy(update={"spec": spec, "status": status})
    if state.leader == partition.spec.leader:
        # A move's change of the replica list: spec and status in one compare-and-swap, no election.
        return actions.move_step(partition, updated, entry.mod_revision, transition.reason, transition.move_event)
    return actions.elect(partition, updated, entry.mod_revision, transition.reason, transition.cause)


def _status(
    spec: models.PartitionSpec, partition: models.Partition, state: partition_state.State, live: lrs.LiveStatus | None, hw: int
) -> models.PartitionStatus:
    """The stored status for ``state``, with the offsets last known (shown, never decided from)
    and the highest committed offset known, so the shown HW never goes back."""
    known = _known_offsets(partition, live)
    leader = known.get(state.leader)
    # Built without validation: every value is an SPU id, an epoch or an offset the SC holds
    # already (a failover writes thousands of these in one pass).
    construct = models.ReplicaStatus.model_construct
    return models.PartitionStatus.model_construct(
        resolution=state.resolution,
        leader_epoch=state.leader_epoch,
        partition_epoch=state.partition_epoch,
        isr=list(state.isr),
        leader=construct(spu=state.leader, hw=hw, leo=-1 if leader is None else leader.leo),
        replicas=[known.get(spu) or construct(spu=spu, hw=-1, leo=-1) for spu in spec.replicas if spu != state.leader],
        lrs=partition_state.in_sync_followers(state),
    )


def _known_offsets(partition: models.Partition, live: lrs.LiveStatus | None) -> dict[int, models.ReplicaStatus]:
    status = partition.status
    known = {replica.spu: replica for replica in status.replicas}
    if status.leader is not None:
        known[status.leader.spu] = status.leader
    if _current(partition, live):
        assert live is not None
        known[live.leader] = models.ReplicaStatus(spu=live.leader, hw=live.hw, leo=live.leo)
        for follower in live.followers:
            known[follower.spu] = models.ReplicaStatus(spu=follower.spu, hw=follower.hw, leo=follower.leo)
    return known


def _current(partition: models.Partition, live: lrs.LiveStatus | None) -> bool:
    """``live`` was reported by the partition's leader at its current leader epoch."""
    status = partition.status
    return (
        live is not None
        and status.resolution is not LEADER_OFFLINE
        and live.leader == partition.spec.leader
        and live.leader_epoch == status.leader_epoch
    )


def with_live_offsets(partition: models.Partition, live: lrs.LiveStatus | None, max_hw: int = -1) -> models.Partition:
    """The partition as the API shows it: the stored status with its leader's latest offsets, and
    the highest committed offset known as ``leader.hw`` (it never goes back, across leaders too)."""
    status = partition.status
    stored = status.leader
    hw = max(-1 if stored is None else stored.hw, max_hw)
    if not _current(partition, live):
        if stored is None or hw == stored.hw:
            return partition
        return partition.model_copy(update={"status": status.model_copy(update={"leader": stored.model_copy(update={"hw": hw})})})
    assert live is not None
    known = _known_offsets(partition, live)
    shown = status.model_copy(
        update={
            "leader": models.ReplicaStatus(spu=live.leader, hw=max(hw, live.hw), leo=live.leo),
            "replicas": [known.get(spu) or models.ReplicaStatus(spu=spu) for spu in partition.spec.replicas if spu != live.leader],
        }
    )
    return partition.model_copy(update={"status": shown})


def drain_blockers(snapshot: local.Snapshot, spu: int, view: ClusterView) -> dict[str, str]:
    """The partitions ``spu`` leads that no other replica could take over if it were drained
    (besides the SPUs already draining), each with the reason, by name; {} when every one could.

    The same election a drain runs (a member of the committed in-sync set, up, not draining), so
    what this names is exactly what the drain would leave behind right now."""
    cluster = Cluster(snapshot, view, also_draining=(spu,))
    blocked = {}
    for entry in snapshot.entries("partitions").values():
        partition: models.Partition = entry.obj
        if partition.spec.leader != spu or partition.status.resolution is LEADER_OFFLINE:
            continue
        members = partition_state.Members(partition, entry.mod_revision, cluster, -1)
        followers = [member for member in partition.in_sync() if member != spu]
        if election.elect(partition.spec.replicas, followers, members.leads_well) is None:
            blocked[partition.name] = _why_stuck(partition, spu, cluster, members)
    return dict(sorted(blocked.items(), key=lambda item: _name_order(item[0])))


def _why_stuck(partition: models.Partition, leader: int, cluster: Cluster, members: partition_state.Members) -> str:
    """Why no follower of ``leader`` may take over: the first of the election's conditions none meets."""
    followers = [spu for spu in partition.spec.replicas if spu != leader]
    if not followers:
        return "it has no other replica"
    up = [spu for spu in followers if cluster.online(spu)]
    if not up:
        return f"no follower is online ({_spus(followers)} offline)"
    in_sync = [spu for spu in up if spu in partition.in_sync() and members.sound(spu)]
    if not in_sync:
        followers_are = "the online followers ({}) are" if len(up) > 1 else "the online follower ({}) is"
        return f"{followers_are.format(_spus(up))} not in the in-sync set {partition.in_sync()}"
    if len(in_sync) == 1:
        return f"the only in-sync follower online, SPU {in_sync[0]}, is draining too"
    return f"the in-sync followers online ({_spus(in_sync)}) are draining too"


def describe_blockers(blocked: Mapping[str, str], limit: int = 10) -> str:
    """``name (reason), ...`` for at most ``limit`` partitions, then how many more."""
    shown = [f"{name} ({reason})" for name, reason in list(blocked.items())[:limit]]
    more = len(blocked) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _spus(ids: list[int]) -> str:
    return f"SPU {ids[0]}" if len(ids) == 1 else "SPUs " + ", ".join(str(spu) for spu in ids)


def _name_order(name: str) -> tuple[str, int]:
    topic, _, index = name.rpartition("-")
    return (topic, int(index)) if index.isdigit() else (name, -1)


def led_by(snapshot: local.Snapshot, spu: int) -> list[str]:
    """Names of the partitions ``spu`` leads (with a leader, i.e. not LeaderOffline), sorted."""
    return sorted(
        entry.obj.name
        for entry in snapshot.entries("partitions").values()
        if entry.obj.spec.leader == spu
        and entry.obj.status.resolution is not LEADER_OFFLINE
    )
