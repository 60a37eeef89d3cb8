"""The rules of a partition's replication state: its leader, leader epoch and committed in-sync set.

Purely computational, no I/O: (the stored partition, what the SC knows of its SPUs, a leader's
proposal) -> the next state to write, or nothing, and the answer to the proposal. Every rule is in
``decide``'s ladder; docs/replication.md states them for people and a real SPU's implementers.
It never looks at offsets to choose a leader: the committed in-sync set is the whole story.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from connection_manager import reports
from controller.reconcile import election
from store import models

ONLINE = models.PartitionResolution.ONLINE
OFFLINE = models.PartitionResolution.OFFLINE
LEADER_OFFLINE = models.PartitionResolution.LEADER_OFFLINE

# The structured causes of a leader change (Action.cause), as the audits report them.
CAUSE_SPU_OFFLINE = "spu-offline"
CAUSE_PREFERRED = "preferred-leader"
CAUSE_DRAIN = "drain"
CAUSE_UNCLEAN = "unclean"
CAUSE_REASSIGNMENT = "reassignment"  # leadership off a replica a move takes away (or back, on a cancel)
# A move's events, as its writes record them (Action.cause; the leader change's is CAUSE_REASSIGNMENT).
MOVE_ADDING = "move-adding"  # the target's new SPUs joined the replicas
MOVE_CAUGHT_UP = "move-caught-up"  # the last of them joined the committed in-sync set
MOVE_COMPLETED = "move-completed"  # the leaving replicas went: replicas = target
MOVE_REVERTED = "move-reverted"  # a cancelled move is back on its previous replicas

# Why the SC refuses a leader's proposal (AlterIsrResult.error), stable for SPUs.
NOT_LEADER = "not-leader"
STALE_EPOCH = "stale-epoch"
INVALID = "invalid"
MEMBER_OFFLINE = "member-offline"
UNKNOWN_PARTITION = "unknown-partition"
# An SPU the proposal adds is connected under another incarnation than the one the proposal names:
# the leader saw another process of it catch up (KIP-903), which may have lost records since.
STALE_INCARNATION = "stale-incarnation"


class Spus(Protocol):
    """What the rules ask of the cluster, at one moment."""

    def online(self, spu: int) -> bool:
        """Connected through an incarnation that reported what it holds (or, before it reconnects
        after an SC start, recorded Online and within the grace period)."""

    def draining(self, spu: int) -> bool: ...

    def registered_at(self, spu: int) -> int | None:
        """The create revision of the SPU that holds this id; None when no SPU does."""

    def incarnation(self, spu: int) -> reports.Incarnation | None: ...

    def maybe_registered(self, spu: int) -> bool:
        """No SPU this SC can read holds this id, but some SPU record in the store cannot be read
        (a newer SC's fields, a hand edit): that one may hold it."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What the SC knows of one partition beyond its stored state."""

    committed_hw: int  # the highest high watermark known (stored, or reported since the SC started)
    confirmed: bool = False  # its leader confirmed it leads at the current leader epoch
    proposal: reports.Proposal | None = None
    unclean: bool = False  # unclean_leader_election
    rebalance: bool = True  # a preferred-leader move may be decided in this pass


@dataclass(frozen=True, slots=True)
class State:
    leader: int  # spec.leader: while LeaderOffline, the last leader
    resolution: models.PartitionResolution
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Transition:
    state: State
    cause: str  # a leader change's cause; "" when the leader stays
    reason: str
    # A replica move's step: the new spec.replicas (None: unchanged), and whether the move ends
    # (spec.reassignment is cleared in the same write).
    replicas: tuple[int, ...] | None = None
    ends_move: bool = False
    # The move's event this write records (MOVE_* below; the history's cause), "" for none.
    move_event: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer owed to a proposal now: ``error`` None when its set is committed. It carries the
    stored state (the caller adds it)."""

    proposal: reports.Proposal
    error: str | None
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    transition: Transition | None = None
    answer: Answer | None = None
    refused: str = ""  # why a transition that is due cannot be written (its epochs are spent)
    # The proposal rule 4 accepted: the transition commits its set (or it is the committed set
    # already). Its HW is committed with it, and with no other decision.
    accepted: reports.Proposal | None = None


NOTHING = Decision()


def stored_state(partition: models.Partition) -> State:
    status = partition.status
    return State(
        partition.spec.leader, status.resolution, status.leader_epoch, status.partition_epoch, tuple(partition.in_sync())
    )


class Members:
    """The partition's view of its replicas: which can vouch for the committed records now."""

    def __init__(self, partition: models.Partition, mod_revision: int, spus: Spus, committed_hw: int) -> None:
        self.name = partition.name
        self.fresh = partition.status.partition_epoch == 0
        self.partition_epoch = partition.status.partition_epoch
        self.mod_revision = mod_revision
        self.spus = spus
        self.committed_hw = committed_hw

    def current(self, spu: int) -> bool:
        """Registered, and since before the partition's last write: a member's place was earned by
        that registration of the id; an id deleted and registered again inherits nothing."""
        since = self.spus.registered_at(spu)
        return since is not None and (self.fresh or since <= self.mod_revision)

    def restarted(self, spu: int) -> bool:
        incarnation = self.spus.incarnation(spu)
        return incarnation is not None and incarnation.restarted_at(self.name, self.partition_epoch)

    def sound(self, spu: int) -> bool:
        """Up, and the same process that earned its role: it holds every committed record."""
        return self.current(spu) and self.spus.online(spu) and not self.restarted(spu)

    def returned(self, spu: int) -> bool:
        """Up after a restart, holding at least the committed offset the SC knows: it may lead only
        when no sound member can (a restarted process may have lost what the SC did not hear of)."""
        if not (self.current(spu) and self.spus.online(spu) and self.restarted(spu)):
            return False
        incarnation = self.spus.incarnation(spu)
        leo = None if incarnation is None else incarnation.leo(self.name)
        # A process that does not list the partition holds none of it: its log ends at 0.
        return (leo or 0) >= self.committed_hw

    def registered_again(self, spu: int) -> bool:
        """Registered since the partition's last write: not current until the SC writes it again."""
        since = self.spus.registered_at(spu)
        return since is not None and not self.fresh and since > self.mod_revision

    def may_vouch(self, spu: int) -> bool:
        """May still hold every committed record, up or not: its registration is current, or may
        be (its SPU record cannot be read just now), and it did not come back without them."""
        return (self.current(spu) or self.spus.maybe_registered(spu)) and not self.lost_records(spu)

    def lost_records(self, spu: int) -> bool:
        """Restarted and back without every record the SC knows committed."""
        return self.current(spu) and self.spus.online(spu) and self.restarted(spu) and not self.returned(spu)

    def leads_well(self, spu: int) -> bool:
        return self.sound(spu) and not self.spus.draining(spu)

    def why_not(self, spu: int) -> str:
        if not self.current(spu):
            if self.spus.registered_at(spu) is not None:
                return "was registered again"
            return "has no SPU record this SC can read" if self.spus.maybe_registered(spu) else "is no longer registered"
        if not self.spus.online(spu):
            return "went offline"
        if self.restarted(spu):
            return "restarted"
        return "is draining"


def decide(partition: models.Partition, mod_revision: int, spus: Spus, facts: Facts) -> Decision:
    """The next state of ``partition`` (stored at ``mod_revision``) and the answer owed to its
    proposal, if any. One ladder: the first rule that applies decides, and a write carries every
    in-sync change due at once. A partition whose epochs would pass models.MAX_EPOCH (a stored
    value anyone may have written) changes no more: the decision says why, and a proposal is
    refused."""
    decision = _decide(partition, mod_revision, spus, facts)
    transition = decision.transition
    if transition is None or max(transition.state.leader_epoch, transition.state.partition_epoch) <= models.MAX_EPOCH:
        return decision
    status = partition.status
    refused = (
        f"partition {partition.name!r} cannot change: its epochs would pass {models.MAX_EPOCH} "
        f"(leader epoch {status.leader_epoch}, partition epoch {status.partition_epoch}); delete and recreate its topic"
    )
    answer = decision.answer
    if facts.proposal is not None and (answer is None or answer.error is None):
        answer = Answer(facts.proposal, INVALID, refused)
    return Decision(None, answer, refused)  # nothing accepted: the set is not committed


def _decide(partition: models.Partition, mod_revision: int, spus: Spus, facts: Facts) -> Decision:
    stored = stored_state(partition)
    members = Members(partition, mod_revision, spus, facts.committed_hw)
    replicas = partition.spec.replicas
    leader = None if stored.resolution is LEADER_OFFLINE else stored.leader
    # A leader outside the committed in-sync set may lack committed records: only a stored state
    # written by someone else has one (every write of the SC keeps the leader in it).
    outside = leader is not None and leader not in stored.isr
    if leader is None or outside or not members.sound(leader):
        transition = _lead_again(partition, stored, members, facts, leader, "is not in the in-sync set" if outside else "")
        if transition is None and partition.spec.reassignment is not None:
            transition = _revert_leaderless(partition, stored, partition.spec.reassignment)
        answer = None
        if facts.proposal is not None:
            answer = _settled(stored, facts.proposal) or Answer(
                facts.proposal, STALE_EPOCH, f"partition {partition.name!r} is changing leader; wait for the SC's update"
            )
        return Decision(transition, answer)

    # Members that cannot vouch for the committed records any more leave (the leader commits
    # nothing they miss from now on), with a proposal's change if one is due.
    isr = [spu for spu in stored.isr if spu == leader or members.sound(spu)]
    why = [f"SPU {spu} {members.why_not(spu)}" for spu in stored.isr if spu not in isr]
    answer = proposed = None
    if facts.proposal is not None:
        answer = _settled(stored, facts.proposal)
        if answer is None:
            answer, proposed = _check(partition, stored, members, facts.proposal)
    if proposed is not None:
        if set(proposed) == set(stored.isr):
            answer = Answer(facts.proposal, None, "committed")  # type: ignore[arg-type]  # proposed comes from facts.proposal, so it is set
        else:
            # Answered once the write is back: a later pass finds the proposal settled.
            isr = [spu for spu in proposed if spu == leader or members.sound(spu)]
            why = [f"leader SPU {leader} proposed {list(proposed)} at partition epoch {stored.partition_epoch}"]
            why += [f"SPU {spu} {members.why_not(spu)}" for spu in proposed if spu not in isr]

    resolution = stored.resolution
    if resolution is OFFLINE and facts.confirmed:
        resolution = ONLINE
        why.append(f"leader SPU {leader} confirmed it leads at leader epoch {stored.leader_epoch}")

    new_leader, cause = leader, ""
    move = partition.spec.reassignment
    changed_isr = tuple(isr) != tuple(stored.isr)
    # A move steps from the committed state only: never in the write that changes the in-sync set.
    step = None
    if move is not None and resolution is ONLINE and stored.resolution is ONLINE and not changed_isr:
        step = _move_step(partition, move, leader, stored.isr, members)
    if step is not None:
        new_leader, isr = step.leader, list(step.isr)
        if new_leader != leader:
            cause = CAUSE_REASSIGNMENT
        why.append(step.why)
    elif spus.draining(leader):
        moved_to = election.elect(replicas, [spu for spu in isr if spu != leader], members.leads_well)
        if moved_to is not None:
            new_leader, cause = moved_to, CAUSE_DRAIN
            why.append(f"leader SPU {leader} is being drained")
    elif move is None and facts.rebalance and resolution is ONLINE and replicas[0] != leader:
        preferred = replicas[0]
        if preferred in isr and members.leads_well(preferred):
            new_leader, cause = preferred, CAUSE_PREFERRED
            why.append(f"preferred leader SPU {preferred} is back and in the in-sync set")

    changed_isr = tuple(isr) != tuple(stored.isr)
    # A replica outside the in-sync set whose id was registered again since the last write may
    # join only by a proposal made after it (the leader may have proposed the id's previous SPU):
    # a write of the next partition epoch makes it current and voids any proposal made before.
    renewed = [spu for spu in replicas if spu not in stored.isr and members.registered_again(spu)]
    if renewed:
        why.append(
            f"SPU(s) {renewed} registered again since the partition's last write: "
            f"proposals made at partition epoch {stored.partition_epoch} cannot add them"
        )
    accepted = None if proposed is None else facts.proposal
    if new_leader == leader and not changed_isr and resolution is stored.resolution and step is None and not renewed:
        return Decision(None, answer, accepted=accepted)
    # The partition epoch counts changes of the leader or of the in-sync set (and the first
    # confirmation, and an id registered again); a move's change of the replica list alone is not one,
    # except at partition epoch 0, where every replica counts as in sync: written at 0, the SPUs a
    # move adds would count too, with none of the records. At 1 the in-sync set is written out.
    regrown = members.fresh and step is not None and step.replicas is not None
    bump = new_leader != leader or changed_isr or resolution is not stored.resolution or bool(renewed) or regrown
    state = State(
        new_leader,
        resolution,
        stored.leader_epoch + (new_leader != leader),
        stored.partition_epoch + bump,
        tuple(isr),
    )
    reason = "; ".join(why)
    if new_leader != leader:
        reason += f": SPU {new_leader} now leads at leader epoch {state.leader_epoch}"
    elif changed_isr:
        reason += f": in-sync set {list(state.isr)}"
    if step is None:
        event = ""
        if move is not None and changed_isr and _caught_up(move, isr) and not _caught_up(move, stored.isr):
            event = MOVE_CAUGHT_UP
            reason += f"; move to {move.target}: every new replica is in the in-sync set"
        return Decision(Transition(state, cause, reason, move_event=event), answer, accepted=accepted)
    return Decision(Transition(state, cause, reason, step.replicas, step.ends, step.event), answer, accepted=accepted)


def _caught_up(move: models.Reassignment, isr: Sequence[int]) -> bool:
    return not move.cancelled and all(spu in isr for spu in move.adding)


@dataclass(frozen=True, slots=True)
class _MoveStep:
    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...] | None  # None: unchanged
    ends: bool
    why: str
    event: str = ""


def _move_step(
    partition: models.Partition, move: models.Reassignment, leader: int, isr: tuple[int, ...], members: Members
) -> _MoveStep | None:
    """The next step of a replica move (KIP-455), from the committed state; None while it waits.

    1. The target's new SPUs join spec.replicas as followers (leader, in-sync set, epochs kept).
    2. Wait until every one of them is in the committed in-sync set (the leader's grow proposal).
    3. A leader the target does not keep hands over to the first target replica in sync that may
       lead (a leader change; the in-sync set kept); it waits while none may.
    4. The leaving replicas go, from the replicas and the in-sync set alike: replicas = target.
    A cancelled move (target = previous) adds nothing, so it goes to 3 at once."""
    replicas = partition.spec.replicas
    target = move.target
    label = "cancelled move back" if move.cancelled else "move"
    missing = [spu for spu in target if spu not in replicas]
    if missing:
        grown = (*replicas, *missing)
        return _MoveStep(leader, isr, grown, False, f"{label} to {target}: SPU(s) {missing} join as followers", MOVE_ADDING)
    waiting = [spu for spu in move.adding if spu not in isr]
    if waiting:
        return None
    if leader not in target:
        successor = election.elect(target, [spu for spu in isr if spu != leader], members.leads_well)
        if successor is None:
            return None
        return _MoveStep(
            successor, isr, None, False, f"{label} to {target}: leader SPU {leader} leaves, SPU {successor} is in sync"
        )
    leaving = [spu for spu in replicas if spu not in target]
    kept = tuple(spu for spu in isr if spu in target)
    why = f"{label} to {target} done: " + (f"SPU(s) {leaving} leave" if leaving else "replicas reordered")
    return _MoveStep(leader, kept, tuple(target), True, why, MOVE_REVERTED if move.cancelled else MOVE_COMPLETED)


def _revert_leaderless(partition: models.Partition, stored: State, move: models.Reassignment) -> Transition | None:
    """A cancelled move of a partition nobody can lead ends when no replica it drops is in the
    committed in-sync set: those hold none of the committed records the partition needs. Else
    (and for a move that is not cancelled) it waits for a leader, as every move step does."""
    if stored.resolution is not LEADER_OFFLINE or not move.cancelled or stored.leader not in move.target:
        return None
    leaving = [spu for spu in partition.spec.replicas if spu not in move.target]
    if any(spu in stored.isr for spu in leaving):
        return None
    reason = (
        f"cancelled move back to {move.target} done while no replica can lead: "
        f"SPU(s) {leaving} leave, none of them in the in-sync set {list(stored.isr)}"
    )
    return Transition(stored, "", reason, tuple(move.target), True, MOVE_REVERTED)


def _lead_again(
    partition: models.Partition, stored: State, members: Members, facts: Facts, leader: int | None, why: str = ""
) -> Transition | None:
    """The leader is gone (offline, restarted, unregistered, outside the in-sync set: ``why``) or
    there is none (LeaderOffline):
    the first member that can vouch for every committed record leads; else nobody, unless an
    unclean election is allowed."""
    replicas = partition.spec.replicas
    isr = stored.isr
    chosen = None
    # In order of preference: up and not draining, up, back from a restart with the records the
    # SC knows committed (not draining, then draining).
    for eligible in (
        members.leads_well,
        members.sound,
        lambda spu: members.returned(spu) and not members.spus.draining(spu),
        members.returned,
    ):
        chosen = election.elect(replicas, isr, eligible)
        if chosen is not None:
            break
    if leader is None:
        lost = f"partition {partition.name!r} has no leader"
    else:
        lost = f"leader SPU {leader} {why or members.why_not(leader)}"
    if chosen is not None:
        new_isr = tuple(spu for spu in replicas if spu in isr and (spu == chosen or members.sound(spu)))
        if leader is None:
            back = "is back online" if not members.restarted(chosen) else "is back, with the committed records"
            why = f"{lost}; SPU {chosen} {back} and in the in-sync set"
        else:
            why = lost
        state = State(chosen, ONLINE, stored.leader_epoch + 1, stored.partition_epoch + 1, new_isr)
        return Transition(state, CAUSE_SPU_OFFLINE, f"{why}: SPU {chosen} now leads at leader epoch {state.leader_epoch}")
    if facts.unclean:
        def hosted_leo(spu: int) -> int | None:
            incarnation = members.spus.incarnation(spu)
            return None if incarnation is None else incarnation.leo(partition.name)

        chosen = election.elect_unclean(replicas, lambda spu: members.current(spu) and members.spus.online(spu), hosted_leo)
        if chosen is not None:
            state = State(chosen, ONLINE, stored.leader_epoch + 1, stored.partition_epoch + 1, (chosen,))
            reason = (
                f"{lost} and no in-sync replica is online; unclean election: SPU {chosen} may miss committed "
                f"records: SPU {chosen} now leads at leader epoch {state.leader_epoch}"
            )
            return Transition(state, CAUSE_UNCLEAN, reason)
    # Nobody may lead. Every member that may still hold the committed records stays (offline ones
    # too: they may lead when they return, and ones whose SPU record cannot be read now); one that
    # came back without them, or whose id was unregistered or registered again, leaves. Possibly
    # nobody is left: then only an unclean election helps.
    keep = tuple(spu for spu in isr if members.may_vouch(spu))
    if stored.resolution is LEADER_OFFLINE and keep == tuple(isr) and not members.fresh:
        return None
    gone = [spu for spu in isr if spu not in keep]
    state = State(
        stored.leader,
        LEADER_OFFLINE,
        stored.leader_epoch + (stored.resolution is not LEADER_OFFLINE),
        stored.partition_epoch + 1,
        keep,
    )
    reason = f"{lost} and no replica of the in-sync set {list(isr)} can lead"
    if gone:
        reason += "; " + ", ".join(f"SPU {spu} {_why_gone(members, spu)}" for spu in gone)
    return Transition(state, "", reason + f": in-sync set {list(keep)}")


def _why_gone(members: Members, spu: int) -> str:
    if not members.current(spu):
        return members.why_not(spu)
    return f"restarted without every committed record (below offset {members.committed_hw})"


def _settled(stored: State, proposal: reports.Proposal) -> Answer | None:
    """The answer to a proposal made at epochs the partition has moved past; None if it has not."""
    if (proposal.leader_epoch, proposal.partition_epoch) == (stored.leader_epoch, stored.partition_epoch):
        return None
    if proposal.leader_epoch == stored.leader_epoch and proposal.partition_epoch < stored.partition_epoch:
        if set(proposal.isr) == set(stored.isr):
            return Answer(proposal, None, "committed")
    return Answer(
        proposal,
        STALE_EPOCH,
        f"proposal made at leader epoch {proposal.leader_epoch}, partition epoch {proposal.partition_epoch}; "
        f"the partition is at leader epoch {stored.leader_epoch}, partition epoch {stored.partition_epoch}",
    )


def _check(
    partition: models.Partition, stored: State, members: Members, proposal: reports.Proposal
) -> tuple[Answer | None, tuple[int, ...] | None]:
    """(a refusal, None) or (None, the proposed set in replica order) for a proposal at the current epochs."""
    replicas = partition.spec.replicas
    if proposal.spu != stored.leader:
        return Answer(proposal, NOT_LEADER, f"SPU {stored.leader} leads partition {partition.name!r}, not SPU {proposal.spu}"), None
    if len(set(proposal.isr)) != len(proposal.isr) or not set(proposal.isr) <= set(replicas) or proposal.spu not in proposal.isr:
        message = (
            f"proposed in-sync set {list(proposal.isr)} must list distinct replicas of {replicas}, the leader "
            f"SPU {proposal.spu} among them"
        )
        return Answer(proposal, INVALID, message), None
    named = dict(proposal.incarnations)
    if len(named) != len(proposal.incarnations) or not set(named) <= set(proposal.isr):
        message = (
            f"incarnations must name distinct SPUs of the proposed in-sync set {list(proposal.isr)}, "
            f"got {[spu for spu, _ in proposal.incarnations]}"
        )
        return Answer(proposal, INVALID, message), None
    adding = [spu for spu in proposal.isr if spu not in stored.isr]
    unnamed = [spu for spu in adding if spu not in named]
    if unnamed:
        message = (
            f"cannot add SPU(s) {unnamed} to the in-sync set of {partition.name!r} without the incarnation "
            "under which each caught up (incarnations)"
        )
        return Answer(proposal, INVALID, message), None
    joining = [spu for spu in adding if not members.sound(spu)]
    if joining:
        reasons = ", ".join(f"SPU {spu} {members.why_not(spu)}" for spu in joining)
        return Answer(proposal, MEMBER_OFFLINE, f"cannot add to the in-sync set of {partition.name!r}: {reasons}"), None
    stale = []
    for spu in adding:
        current = members.spus.incarnation(spu)
        if current is None:
            stale.append(f"SPU {spu} has not connected to this SC since it started (the proposal names incarnation {named[spu]})")
        elif current.number != named[spu]:
            stale.append(f"SPU {spu} is connected as incarnation {current.number}, the proposal names {named[spu]}")
    if stale:
        message = f"cannot add to the in-sync set of {partition.name!r}: {', '.join(stale)}; it must catch up again as it is now"
        return Answer(proposal, STALE_INCARNATION, message), None
    return None, tuple(spu for spu in replicas if spu in proposal.isr)


def in_sync_followers(state: State) -> int:
    """``status.lrs``: the in-sync set's members other than the leader."""
    return sum(1 for spu in state.isr if spu != state.leader)

