"""The replication-state rules, one table per kind of transition: the exact next state (leader,
resolution, leader epoch, partition epoch, committed in-sync set), the cause, and the answer owed
to a leader's proposal. No offsets decide a leader anywhere in here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from connection_manager import reports
from controller.reconcile import partition_state as ps
from controller.reconcile.partition_state import State
from store import models

ONLINE, OFFLINE, LEADER_OFFLINE = ps.ONLINE, ps.OFFLINE, ps.LEADER_OFFLINE
# The partition's last write; SPUs registered at revision 1 unless a test says otherwise.
WRITTEN_AT = 10


@dataclass
class Spus:
    online_ids: set[int] = field(default_factory=lambda: {0, 1, 2})
    draining_ids: set[int] = field(default_factory=set)
    registered: dict[int, int] = field(default_factory=lambda: {0: 1, 1: 1, 2: 1, 3: 1})
    incarnations: Mapping[int, reports.Incarnation | None] = field(default_factory=dict)  # None: online, not connected
    unreadable_records: bool = False  # some SPU record in the store cannot be read

    def online(self, spu: int) -> bool:
        return spu in self.online_ids

    def draining(self, spu: int) -> bool:
        return spu in self.draining_ids

    def registered_at(self, spu: int) -> int | None:
        return self.registered.get(spu)

    def incarnation(self, spu: int) -> reports.Incarnation | None:
        """The one given, else an online SPU's connection numbered ``current(spu)`` (holding nothing)."""
        if spu in self.incarnations:
            return self.incarnations[spu]
        return reports.Incarnation(spu, current(spu)) if spu in self.online_ids else None

    def maybe_registered(self, spu: int) -> bool:
        return spu not in self.registered and self.unreadable_records


def current(spu: int) -> int:
    """The incarnation number of SPU ``spu``'s connection, unless a test gives another."""
    return 20 + spu


def restarted(spu: int, leo: int | None = None, partition_epoch: int = 4) -> reports.Incarnation:
    """SPU ``spu``'s connection found not to have been told of its role at ``partition_epoch``."""
    hosted: dict[str, tuple[int, int | None]] = {} if leo is None else {"t-0": (leo, None)}
    return reports.Incarnation(spu, 7, hosted, {"t-0": partition_epoch})


def partition(
    leader: int = 0,
    isr: tuple[int, ...] = (0, 1, 2),
    resolution: models.PartitionResolution = ONLINE,
    replicas: tuple[int, ...] = (0, 1, 2),
    leader_epoch: int = 3,
    partition_epoch: int = 4,
    hw: int = 100,
) -> models.Partition:
    return models.Partition(
        name="t-0",
        spec=models.PartitionSpec(leader=leader, replicas=list(replicas)),
        status=models.PartitionStatus(
            resolution=resolution,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            isr=[] if partition_epoch == 0 else list(isr),
            leader=models.ReplicaStatus(spu=leader, hw=hw, leo=hw),
        ),
    )


def decide(p: models.Partition, spus: Spus, **facts: Any) -> tuple[State | None, str, ps.Answer | None]:
    hw = p.status.leader.hw if p.status.leader is not None else -1
    decision = ps.decide(p, WRITTEN_AT, spus, ps.Facts(committed_hw=hw, **facts))
    transition = decision.transition
    return (None, "", decision.answer) if transition is None else (transition.state, transition.cause, decision.answer)


def proposal(
    isr: tuple[int, ...],
    spu: int = 0,
    leader_epoch: int = 3,
    partition_epoch: int = 4,
    incarnation: int = 1,
    named: dict[int, int] | None = None,
) -> reports.Proposal:
    """Leader ``spu``'s proposal, naming ``named`` incarnations (default: every other member's ``current``)."""
    if named is None:
        named = {member: current(member) for member in isr if member != spu}
    return reports.Proposal("t-0", spu, incarnation, leader_epoch, partition_epoch, isr, tuple(named.items()))


# ---------------------------------------------------------------------------- nothing to do


def test_a_healthy_partition_needs_nothing() -> None:
    assert decide(partition(), Spus()) == (None, "", None)


def test_a_partition_as_created_stays_offline_until_its_leader_confirms_then_writes_its_in_sync_set() -> None:
    fresh = partition(resolution=OFFLINE, leader_epoch=0, partition_epoch=0, hw=-1)
    assert decide(fresh, Spus()) == (None, "", None)
    assert decide(fresh, Spus(), confirmed=True) == (State(0, ONLINE, 0, 1, (0, 1, 2)), "", None)


# ---------------------------------------------------------------------------- the leader is lost


@pytest.mark.parametrize(
    ("spus", "expected", "cause"),
    [
        # offline: the first in-sync replica in preferred order that is up leads, epoch + 1,
        # and the old leader leaves the in-sync set
        (Spus(online_ids={1, 2}), State(1, ONLINE, 4, 5, (1, 2)), ps.CAUSE_SPU_OFFLINE),
        # a draining member only if no other can
        (Spus(online_ids={1, 2}, draining_ids={1}), State(2, ONLINE, 4, 5, (1, 2)), ps.CAUSE_SPU_OFFLINE),
        (Spus(online_ids={1}, draining_ids={1}), State(1, ONLINE, 4, 5, (1,)), ps.CAUSE_SPU_OFFLINE),
        # restarted (its new connection was not told it leads): as if it went offline
        (Spus(incarnations={0: restarted(0, leo=100)}), State(1, ONLINE, 4, 5, (1, 2)), ps.CAUSE_SPU_OFFLINE),
        # unregistered, or registered again since the partition's last write: it inherits nothing
        (Spus(registered={1: 1, 2: 1}), State(1, ONLINE, 4, 5, (1, 2)), ps.CAUSE_SPU_OFFLINE),
        (Spus(registered={0: WRITTEN_AT + 1, 1: 1, 2: 1}), State(1, ONLINE, 4, 5, (1, 2)), ps.CAUSE_SPU_OFFLINE),
    ],
)
def test_a_lost_leader_is_replaced_from_the_committed_in_sync_set(spus: Spus, expected: State, cause: str) -> None:
    assert decide(partition(), spus)[:2] == (expected, cause)


def test_a_follower_outside_the_in_sync_set_never_leads_even_if_it_is_the_only_one_up() -> None:
    # SPU 2 is up but left the in-sync set: LeaderOffline, epoch + 1 (the old leader is fenced),
    # and the in-sync set is kept whole (SPU 0 and 1 may still hold every committed record).
    assert decide(partition(isr=(0, 1)), Spus(online_ids={2})) == (State(0, LEADER_OFFLINE, 4, 5, (0, 1)), "", None)


def test_a_leader_offline_partition_waits_for_a_member_then_it_leads_again() -> None:
    lost = partition(isr=(0, 1), resolution=LEADER_OFFLINE, leader_epoch=4, partition_epoch=5)
    assert decide(lost, Spus(online_ids={2})) == (None, "", None)
    # The last leader is back: it leads again at a new epoch.
    assert decide(lost, Spus(online_ids={0, 2}))[:2] == (State(0, ONLINE, 5, 6, (0,)), ps.CAUSE_SPU_OFFLINE)
    # The other member is back: it leads, the offline one leaves the in-sync set.
    assert decide(lost, Spus(online_ids={1}))[:2] == (State(1, ONLINE, 5, 6, (1,)), ps.CAUSE_SPU_OFFLINE)
    # Both: preferred order.
    assert decide(lost, Spus(online_ids={0, 1}))[:2] == (State(0, ONLINE, 5, 6, (0, 1)), ps.CAUSE_SPU_OFFLINE)


def test_a_member_whose_spu_record_cannot_be_read_stays_in_the_in_sync_set_until_it_can() -> None:
    # SPU 0 alone holds every committed record; its SPU record turns unreadable (a newer SC wrote a
    # field this one does not know, or a hand edit), so its id is registered to no SPU this SC can
    # read. It cannot lead meanwhile, but it is not unregistered: it stays the in-sync set, and
    # leads again once its record is readable and it is up. (Taking it out left an empty in-sync
    # set: only an unclean election could bring the partition back.)
    alone = partition(isr=(0,))
    unknown = Spus(online_ids={1, 2}, registered={1: 1, 2: 1}, unreadable_records=True)
    assert decide(alone, unknown) == (State(0, LEADER_OFFLINE, 4, 5, (0,)), "", None)
    lost = partition(isr=(0,), resolution=LEADER_OFFLINE, leader_epoch=4, partition_epoch=5)
    assert decide(lost, unknown) == (None, "", None)
    assert decide(lost, Spus(online_ids={0, 1, 2}))[:2] == (State(0, ONLINE, 5, 6, (0,)), ps.CAUSE_SPU_OFFLINE)
    # With every SPU record readable, an id no SPU holds is unregistered: it inherits nothing.
    assert decide(alone, Spus(online_ids={1, 2}, registered={1: 1, 2: 1})) == (State(0, LEADER_OFFLINE, 4, 5, ()), "", None)
    # Beside a leader that is fine, such a member is out of sync like any member that is not up.
    followed = partition(isr=(0, 1))
    assert decide(followed, Spus(online_ids={0, 2}, registered={0: 1, 2: 1}, unreadable_records=True))[0] == State(0, ONLINE, 3, 5, (0,))


@pytest.mark.parametrize(
    ("leo", "expected"),
    [
        # It holds at least the committed offset the SC knows: it may lead (last replica standing).
        (100, State(0, ONLINE, 5, 6, (0,))),
        # It came back without records its membership promised: it leaves; nobody is left.
        (99, State(0, LEADER_OFFLINE, 4, 6, ())),
    ],
)
def test_the_last_member_back_after_a_restart_leads_only_with_every_committed_record(leo: int, expected: State) -> None:
    lost = partition(isr=(0,), resolution=LEADER_OFFLINE, leader_epoch=4, partition_epoch=5)
    spus = Spus(online_ids={0, 1}, incarnations={0: restarted(0, leo=leo, partition_epoch=5)})
    assert decide(lost, spus)[0] == expected


@pytest.mark.parametrize(("hw", "expected"), [(-1, State(0, ONLINE, 5, 6, (0,))), (0, State(0, ONLINE, 5, 6, (0,))), (1, State(0, LEADER_OFFLINE, 4, 6, ()))])
def test_a_process_that_does_not_list_the_partition_holds_none_of_it(hw: int, expected: State) -> None:
    """Its log ends at 0: enough when nothing is known committed, not otherwise."""
    lost = partition(isr=(0,), resolution=LEADER_OFFLINE, leader_epoch=4, partition_epoch=5, hw=hw)
    spus = Spus(online_ids={0}, incarnations={0: restarted(0, partition_epoch=5)})
    assert decide(lost, spus)[0] == expected


def test_a_restarted_member_is_second_choice_to_one_that_never_stopped() -> None:
    lost = partition(isr=(0, 1), resolution=LEADER_OFFLINE, leader_epoch=4, partition_epoch=5)
    spus = Spus(online_ids={0, 1}, incarnations={0: restarted(0, leo=500, partition_epoch=5)})
    assert decide(lost, spus)[0] == State(1, ONLINE, 5, 6, (1,))


def test_unclean_election_is_opt_in_picks_the_most_advanced_replica_up_and_is_recorded_as_such() -> None:
    p = partition(isr=(0, 1))
    hosted = {2: reports.Incarnation(2, 3, {"t-0": (80, 3)}), 3: reports.Incarnation(3, 4, {"t-0": (90, 3)})}
    spus = Spus(online_ids={2, 3}, incarnations=hosted)
    assert decide(p, spus)[:2] == (State(0, LEADER_OFFLINE, 4, 5, (0, 1)), "")
    four = partition(isr=(0, 1), replicas=(0, 1, 2, 3))
    assert decide(four, spus, unclean=True)[:2] == (State(3, ONLINE, 4, 5, (3,)), ps.CAUSE_UNCLEAN)


def test_an_unregistered_member_leaves_even_the_leaderless_in_sync_set() -> None:
    lost = partition(isr=(0, 1), resolution=LEADER_OFFLINE, leader_epoch=4, partition_epoch=5)
    spus = Spus(online_ids=set(), registered={0: 1, 2: 1})
    assert decide(lost, spus)[0] == State(0, LEADER_OFFLINE, 4, 6, (0,))
    # Registered again and back: it is no member, so it does not lead.
    spus = Spus(online_ids={1}, registered={0: 1, 1: WRITTEN_AT + 5, 2: 1})
    assert decide(lost, spus)[0] == State(0, LEADER_OFFLINE, 4, 6, (0,))


# ---------------------------------------------------------------------------- followers


@pytest.mark.parametrize(
    ("spus", "isr"),
    [
        (Spus(online_ids={0, 1}), (0, 1)),  # offline
        (Spus(incarnations={2: restarted(2, leo=500)}), (0, 1)),  # restarted: it may have lost records
        (Spus(registered={0: 1, 1: 1}), (0, 1)),  # unregistered
        (Spus(online_ids={0}), (0,)),  # both: the leader alone
    ],
)
def test_a_member_that_cannot_vouch_for_the_records_leaves_and_the_leader_stays(spus: Spus, isr: tuple[int, ...]) -> None:
    assert decide(partition(), spus) == (State(0, ONLINE, 3, 5, isr), "", None)


# ---------------------------------------------------------------------------- proposals


@pytest.mark.parametrize(
    ("proposed", "spus", "expected"),
    [
        # shrink: a follower too far behind for too long
        (proposal((0, 2)), Spus(), State(0, ONLINE, 3, 5, (0, 2))),
        # grow: a follower caught up (kept in replica order)
        (proposal((2, 0, 1)), Spus(), State(0, ONLINE, 3, 5, (0, 1, 2))),
    ],
)
def test_the_current_leader_s_proposal_is_committed_and_answered_once_written(
    proposed: reports.Proposal, spus: Spus, expected: State
) -> None:
    p = partition(isr=(0, 1)) if len(proposed.isr) == 3 else partition()
    assert decide(p, spus, proposal=proposed) == (expected, "", None)
    # The write is back: the proposal is settled and answered.
    written = partition(isr=expected.isr, partition_epoch=5)
    assert decide(written, spus, proposal=proposed) == (None, "", ps.Answer(proposed, None, "committed"))


def test_a_proposal_that_changes_nothing_is_answered_at_once() -> None:
    same = proposal((0, 1, 2))
    assert decide(partition(), Spus(), proposal=same) == (None, "", ps.Answer(same, None, "committed"))


@pytest.mark.parametrize(
    ("proposed", "spus", "code"),
    [
        (proposal((0, 1), leader_epoch=2), Spus(), ps.STALE_EPOCH),  # an older leader epoch
        (proposal((0, 2), partition_epoch=3), Spus(), ps.STALE_EPOCH),  # raced with another change
        (proposal((0, 1), leader_epoch=9), Spus(), ps.STALE_EPOCH),  # newer than the SC knows
        (proposal((1, 2), spu=1), Spus(), ps.NOT_LEADER),
        (proposal((1, 2)), Spus(), ps.INVALID),  # without the leader
        (proposal((0, 5)), Spus(), ps.INVALID),  # not a replica
        (proposal((0, 1, 1)), Spus(), ps.INVALID),
        (proposal((0, 1, 2)), Spus(online_ids={0, 1}), ps.MEMBER_OFFLINE),  # a new member must be up
        (proposal((0, 1, 2)), Spus(incarnations={2: restarted(2, partition_epoch=4)}), ps.MEMBER_OFFLINE),
        # KIP-903: the leader saw another process of SPU 2 catch up (it reconnected since)
        (proposal((0, 1, 2), named={2: current(2) - 1}), Spus(), ps.STALE_INCARNATION),
        # a proposal that adds a member must say under which incarnation it caught up
        (proposal((0, 1, 2), named={}), Spus(), ps.INVALID),
        (proposal((0, 1, 2), named={1: current(1)}), Spus(), ps.INVALID),
        (proposal((0, 1, 2), named={2: current(2), 3: 5}), Spus(), ps.INVALID),  # not in the proposed set
    ],
)
def test_a_proposal_is_refused_with_a_typed_error_and_nothing_changes(proposed: reports.Proposal, spus: Spus, code: str) -> None:
    p = partition(isr=(0, 1))
    state, cause, answer = decide(p, spus, proposal=proposed)
    assert answer is not None and (answer.error, answer.proposal) == (code, proposed), answer
    # Only the SC's own rules may still change something (an offline follower leaves).
    assert state is None or state.leader_epoch == 3


def test_an_spu_registered_again_earns_its_place_back_by_a_proposal_made_after_the_sc_took_note() -> None:
    # SPU 2 was deleted and registered again after the partition's last write: it inherits no
    # membership, and a proposal made before is no evidence (its leader may have seen the id's
    # previous SPU catch up). The SC writes the next partition epoch, which voids such proposals...
    again = Spus(registered={0: 1, 1: 1, 2: WRITTEN_AT + 5})
    noted = State(0, ONLINE, 3, 5, (0, 1))
    assert decide(partition(isr=(0, 1)), again) == (noted, "", None)
    state, _, answer = decide(partition(isr=(0, 1)), again, proposal=proposal((0, 1, 2)))
    assert state == noted and answer is not None and answer.error == ps.MEMBER_OFFLINE
    assert answer.message == "cannot add to the in-sync set of 't-0': SPU 2 was registered again"
    # ... and once that write is back (the registration now precedes it), the leader's next
    # proposal takes the SPU back as any follower that caught up.
    written = partition(isr=(0, 1), partition_epoch=5)
    since_the_write = Spus(registered={0: 1, 1: 1, 2: WRITTEN_AT - 1})
    assert decide(written, since_the_write) == (None, "", None)
    assert decide(written, since_the_write, proposal=proposal((0, 1, 2), partition_epoch=5)) == (
        State(0, ONLINE, 3, 6, (0, 1, 2)), "", None
    )


def test_a_refusal_says_what_is_wrong_with_the_values() -> None:
    _, _, answer = decide(partition(isr=(0, 1)), Spus(online_ids={0, 1}), proposal=proposal((0, 1, 2)))
    assert answer is not None and answer.message == "cannot add to the in-sync set of 't-0': SPU 2 went offline"
    _, _, answer = decide(partition(), Spus(), proposal=proposal((0, 2), partition_epoch=3))
    assert answer is not None and answer.message == (
        "proposal made at leader epoch 3, partition epoch 3; the partition is at leader epoch 3, partition epoch 4"
    )


def test_a_proposal_adds_a_member_only_under_the_incarnation_its_leader_saw_catch_up() -> None:
    """KIP-903: leader 0 saw SPU 2 catch up through the fetches of its connection 21; SPU 2's
    machine then crashed, its new process (a shorter log) connected as 22. SPU 2 is outside the
    in-sync set, so it is not "restarted" for this partition: it is online and current, and only
    the incarnation the proposal names shows the leader spoke of the previous process."""
    spus = Spus(incarnations={2: reports.Incarnation(2, 22, {"t-0": (40, None)})})
    stale = proposal((0, 1, 2), named={2: 21})
    assert decide(partition(isr=(0, 1)), spus, proposal=stale) == (
        None,
        "",
        ps.Answer(
            stale,
            ps.STALE_INCARNATION,
            "cannot add to the in-sync set of 't-0': SPU 2 is connected as incarnation 22, the proposal names 21; "
            "it must catch up again as it is now",
        ),
    )
    # Not connected to this SC (before it reconnects after an SC start, it counts as online):
    # whichever incarnation the proposal names is not its current one.
    _, _, answer = decide(partition(isr=(0, 1)), Spus(incarnations={2: None}), proposal=proposal((0, 1, 2)))
    assert answer is not None and answer.error == ps.STALE_INCARNATION, answer
    # The leader saw the new process catch up: it names 22, and SPU 2 joins.
    fresh = proposal((0, 1, 2), named={2: 22})
    assert decide(partition(isr=(0, 1)), spus, proposal=fresh) == (State(0, ONLINE, 3, 5, (0, 1, 2)), "", None)
    # Without the incarnation (an SPU older than the field): refused, naming the SPU.
    unnamed = proposal((0, 1, 2), named={})
    _, _, answer = decide(partition(isr=(0, 1)), spus, proposal=unnamed)
    assert answer is not None and (answer.error, answer.message) == (
        ps.INVALID,
        "cannot add SPU(s) [2] to the in-sync set of 't-0' without the incarnation under which each caught up (incarnations)",
    )
    # Shrinking needs none; naming members it keeps is allowed and not checked.
    assert decide(partition(), spus, proposal=proposal((0, 1), named={}))[0] == State(0, ONLINE, 3, 5, (0, 1))
    assert decide(partition(), spus, proposal=proposal((0, 1, 2), named={1: 3}))[2] == ps.Answer(
        proposal((0, 1, 2), named={1: 3}), None, "committed"
    )


def test_a_proposal_during_a_leader_change_is_refused_as_stale() -> None:
    state, cause, answer = decide(partition(), Spus(online_ids={1, 2}), proposal=proposal((0, 1)))
    assert (state, cause) == (State(1, ONLINE, 4, 5, (1, 2)), ps.CAUSE_SPU_OFFLINE)
    assert answer is not None and answer.error == ps.STALE_EPOCH


# ---------------------------------------------------------------------------- leadership moves


def test_preferred_leader_return_keeps_the_in_sync_set_as_it_is() -> None:
    led_by_1 = partition(leader=1, isr=(1, 2, 0))
    assert decide(led_by_1, Spus())[:2] == (State(0, ONLINE, 4, 5, (1, 2, 0)), ps.CAUSE_PREFERRED)
    # Not before it is in the in-sync set, nor while it drains, nor past the pass's batch.
    assert decide(partition(leader=1, isr=(1, 2)), Spus()) == (None, "", None)
    assert decide(led_by_1, Spus(draining_ids={0})) == (None, "", None)
    assert decide(led_by_1, Spus(), rebalance=False) == (None, "", None)


def test_the_former_leader_stays_eligible_after_a_preferred_return() -> None:
    """The issue's wrong eligibility: the former leader keeps its place in the in-sync set, so
    when the preferred leader dies at once, the former leader (holding every record) leads."""
    led_by_1 = partition(leader=1, isr=(0, 1), replicas=(0, 1))
    moved, _, _ = decide(led_by_1, Spus(online_ids={0, 1}))
    assert moved == State(0, ONLINE, 4, 5, (0, 1))
    after = partition(leader=0, isr=moved.isr, replicas=(0, 1), leader_epoch=4, partition_epoch=5)
    assert decide(after, Spus(online_ids={1}))[:2] == (State(1, ONLINE, 5, 6, (1,)), ps.CAUSE_SPU_OFFLINE)


def test_drain_moves_leadership_within_the_in_sync_set_or_not_at_all() -> None:
    assert decide(partition(), Spus(draining_ids={0}))[:2] == (State(1, ONLINE, 4, 5, (0, 1, 2)), ps.CAUSE_DRAIN)
    assert decide(partition(), Spus(draining_ids={0, 1}))[:2] == (State(2, ONLINE, 4, 5, (0, 1, 2)), ps.CAUSE_DRAIN)
    # Nobody else in the in-sync set may lead: the draining leader keeps it.
    assert decide(partition(isr=(0, 2)), Spus(draining_ids={0, 2})) == (None, "", None)
    assert decide(partition(isr=(0,)), Spus(draining_ids={0})) == (None, "", None)


def test_an_epoch_never_goes_back_and_every_leader_change_bumps_it() -> None:
    steps = [
        (Spus(online_ids={1, 2}), 1),  # failover
        (Spus(online_ids=set()), 1),  # everyone gone: no leader, a new epoch fences the last one
        (Spus(online_ids={1}), 1),  # back
        (Spus(online_ids={0, 1}), 1),  # still led by 1, 0 not in the in-sync set any more
    ]
    p = partition()
    epochs = [p.status.leader_epoch]
    leaders = {(p.spec.leader, p.status.leader_epoch)}
    for spus, _ in steps:
        state, _, _ = decide(p, spus)
        if state is None:
            continue
        status = p.status.model_copy(
            update={
                "resolution": state.resolution, "leader_epoch": state.leader_epoch,
                "partition_epoch": state.partition_epoch, "isr": list(state.isr),
            }
        )
        p = p.model_copy(update={"spec": models.PartitionSpec(leader=state.leader, replicas=p.spec.replicas), "status": status})
        epochs.append(state.leader_epoch)
        if state.resolution is ONLINE:
            leaders.add((state.leader, state.leader_epoch))
    assert epochs == sorted(epochs) and epochs == [3, 4, 5, 6]
    assert len({epoch for _, epoch in leaders}) == len(leaders)  # one leader per epoch


TOP = 2**63 - 1  # the largest epoch a stored partition may hold (models.MAX_EPOCH)


@pytest.mark.parametrize(
    ("stored", "spus", "facts"),
    [
        # Its leader went offline: an election needs leaderEpoch + 1.
        (partition(leader_epoch=TOP), Spus(online_ids={1, 2}), {}),
        # A follower went offline: the in-sync set shrinks with partitionEpoch + 1.
        (partition(partition_epoch=TOP), Spus(online_ids={0, 1}), {}),
        # The leader proposes to shrink the set.
        (partition(partition_epoch=TOP), Spus(), {"proposal": proposal((0, 1), partition_epoch=TOP)}),
    ],
    ids=["election", "member-offline", "proposal"],
)
def test_a_partition_whose_epochs_are_spent_is_not_written_past_them(stored: models.Partition, spus: Spus, facts: Any) -> None:
    """Epochs only grow, up to the largest a stored partition may hold. A stored partition may have
    been written by anyone; one at the limit must not be decided into a status no SC can read
    back (the SC once wrote leaderEpoch 2**63 and its own reader refused it): nothing is written,
    the decision says why, and a proposal is refused."""
    decision = ps.decide(stored, WRITTEN_AT, spus, ps.Facts(committed_hw=100, **facts))
    assert decision.transition is None
    assert decision.refused == (
        f"partition 't-0' cannot change: its epochs would pass {TOP} "
        f"(leader epoch {stored.status.leader_epoch}, partition epoch {stored.status.partition_epoch}); "
        "delete and recreate its topic"
    )
    if "proposal" in facts:
        assert decision.answer is not None and decision.answer.error == ps.INVALID
        assert decision.answer.message == decision.refused


def test_spus_a_stored_in_sync_set_lists_beside_the_replicas_are_not_members() -> None:
    """Anyone may have written the stored set: SPU 7 is no replica of t-0, so it is no member. It
    neither keeps the partition from going LeaderOffline nor stays in what is written."""
    stored = partition(leader=0, isr=(0, 1, 7), replicas=(0, 1, 2))
    assert stored.in_sync() == [0, 1]
    # Its members are offline (they may hold the committed records, so they stay); 7 is up.
    state, _, _ = decide(stored, Spus(online_ids={2, 7}, registered={0: 1, 1: 1, 2: 1, 7: 1}))
    assert state == State(0, LEADER_OFFLINE, 4, 5, (0, 1))


def test_a_stored_leader_outside_its_in_sync_set_is_replaced_by_a_member() -> None:
    """Every write of the SC keeps the leader in the in-sync set; a stored state written by someone
    else may not. Such a leader may lack committed records, so a member leads instead."""
    stored = partition(leader=0, isr=(1, 2))
    decision = ps.decide(stored, WRITTEN_AT, Spus(), ps.Facts(committed_hw=100))
    assert decision.transition is not None
    assert decision.transition.state == State(1, ONLINE, 4, 5, (1, 2))
    assert decision.transition.cause == ps.CAUSE_SPU_OFFLINE
    assert decision.transition.reason.startswith("leader SPU 0 is not in the in-sync set")
