"""The replica state machine: exact tables of LEO, HW and the followers the HW waits for through
fetches, appends and time; proposals of in-sync sets; leader-epoch fencing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from connection_manager.spu import replica as replica_module
from connection_manager.spu.replica import Diverging, EpochLog, Replica, ReplicaError, Role, Served

LAG = 2.0


def incarnation(follower: int) -> int:
    """The incarnation of follower ``follower``'s SC connection, as its fetches say it."""
    return 10 + follower


def leader(
    leo: int = 0, replicas: tuple[int, ...] = (0, 1, 2), isr: tuple[int, ...] | None = None, lag: float = LAG, epoch: int = 1
) -> Replica:
    replica = Replica("t-0", 0, lag, leo=leo, hw=0)
    replica.assign(0, replicas, 0.0, leader_epoch=epoch, partition_epoch=1, isr=replicas if isr is None else isr)
    return replica


@dataclass(frozen=True)
class Fetch:
    now: float
    follower: int
    offset: int
    max_records: int = 1000
    hw: int = 0


@dataclass(frozen=True)
class Append:
    now: float
    records: int


@dataclass(frozen=True)
class Refresh:
    now: float


def run(replica: Replica, steps: list[tuple[Fetch | Append | Refresh, Served | None, int, int]]) -> None:
    """Each step: (what happens, the leader's answer if a fetch, then its LEO and HW after it)."""
    for number, (step, answer, leo, hw) in enumerate(steps):
        served = None
        if isinstance(step, Fetch):
            served = replica.serve_fetch(
                step.follower, step.offset, step.hw, step.max_records, step.now, 1, 1 if step.offset else -1, incarnation(step.follower)
            )
        elif isinstance(step, Append):
            replica.append(step.records, step.now)
        else:
            replica.refresh(step.now)
        assert (served, replica.leo, replica.hw) == (answer, leo, hw), f"step {number}: {step}"


def served(offset: int, leo: int, hw: int, records: int) -> Served:
    return Served(offset, leo, hw, records, ((1, offset),) if records else ())


def test_a_new_leader_counts_nothing_committed_until_every_member_fetched_at_its_epoch() -> None:
    replica = Replica("t-0", 0, LAG, leo=50, hw=20)
    assert (replica.role, replica.leader, replica.told_epoch) == (Role.IDLE, None, None)
    assert replica.assign(0, [0, 1, 2], 0.0, leader_epoch=4, partition_epoch=6, isr=[0, 1, 2]) is True
    assert (replica.role, replica.leader, replica.leo, replica.hw, replica.in_sync, replica.told_epoch) == (
        Role.LEADER, 0, 50, 20, {1, 2}, 4
    )
    # Told the same again: no new leadership.
    assert replica.assign(0, [0, 1, 2], 1.0, leader_epoch=4, partition_epoch=6, isr=[0, 1, 2]) is False


def test_alone_in_the_committed_set_the_leader_commits_what_it_appends() -> None:
    run(leader(isr=(0,)), [
        (Append(0.0, 100), None, 100, 100),
        (Append(0.5, 0), None, 100, 100),
        (Append(1.0, 7), None, 107, 107),
    ])


def test_hw_is_the_lowest_leo_in_the_committed_set_and_followers_catch_up_in_bounded_rounds() -> None:
    run(leader(), [
        (Fetch(0.0, 1, 0), served(0, 0, 0, 0), 0, 0),
        (Fetch(0.0, 2, 0), served(0, 0, 0, 0), 0, 0),
        (Append(0.5, 100), None, 100, 0),
        (Fetch(0.75, 1, 0, max_records=60), served(0, 100, 0, 60), 100, 0),
        (Fetch(1.0, 1, 60, max_records=60), served(60, 100, 0, 40), 100, 0),
        (Fetch(1.0, 2, 0, max_records=60), served(0, 100, 0, 60), 100, 0),
        # Follower 1 has everything, follower 2 has 60 records: nothing is committed past 60 yet.
        (Fetch(1.25, 1, 100, max_records=60), served(100, 100, 0, 0), 100, 0),
        (Fetch(1.5, 2, 60, max_records=60), served(60, 100, 60, 40), 100, 60),
        (Fetch(1.75, 2, 100, max_records=60), served(100, 100, 100, 0), 100, 100),
    ])


def test_a_leader_whose_followers_left_commits_nothing_more_alone() -> None:
    """The issue's two leaders: a leader cut off from its followers (and from the SC) never
    shrinks its in-sync set itself, so it commits nothing they miss, however long it waits."""
    replica = leader()
    replica.append(100, 0.0)
    replica.serve_fetch(1, 100, 0, 1000, 0.1, 1, 1, incarnation=incarnation(1))
    replica.serve_fetch(2, 100, 0, 1000, 0.1, 1, 1, incarnation=incarnation(2))
    assert replica.hw == 100
    replica.append(50, 0.2)  # the followers are gone: nobody fetches these
    replica.refresh(5.0)
    assert (replica.leo, replica.hw) == (150, 100)
    # It proposes to leave them out; until the SC commits that, the HW stays (maximal set).
    proposal = replica.proposal(5.0, retry_after=1.0)
    assert proposal is not None and proposal.isr == (0,)
    assert (replica.hw, replica.in_sync) == (100, {1, 2})
    replica.proposal_answered(None, 1, 2, [0], 5.1)
    assert (replica.hw, replica.in_sync, replica.isr, replica.pending) == (150, set(), (0,), None)


def test_a_follower_is_proposed_out_after_the_lag_time_and_back_in_once_caught_up() -> None:
    replica = leader()
    for follower in (1, 2):
        replica.serve_fetch(follower, 0, 0, 1000, 0.0, 1, -1, incarnation(follower))
    replica.append(100, 1.0)
    replica.serve_fetch(1, 0, 0, 1000, 1.25, 1, -1, incarnation=incarnation(1))
    replica.serve_fetch(2, 0, 0, 1000, 1.25, 1, -1, incarnation=incarnation(2))
    replica.serve_fetch(1, 100, 0, 1000, 1.5, 1, 1, incarnation=incarnation(1))  # follower 1's last fetch: caught up at 1.5
    replica.serve_fetch(2, 100, 0, 1000, 1.5, 1, 1, incarnation=incarnation(2))
    assert replica.hw == 100
    replica.append(50, 2.0)
    replica.serve_fetch(2, 150, 0, 1000, 2.5, 1, 1, incarnation=incarnation(2))
    assert replica.proposal(3.5, 1.0) is None  # exactly the lag time since follower 1 caught up
    proposal = replica.proposal(3.75, 1.0)
    assert proposal == replica_module.Proposal((0, 2), 1, 1, 3.75, hw=100)  # the HW then: follower 1 at 100
    # One proposal in flight: none other until it is answered or the SC's state moves past it.
    assert replica.proposal(4.0, 1.0) is None
    replica.assign(0, [0, 1, 2], 4.0, leader_epoch=1, partition_epoch=2, isr=[0, 2])
    assert (replica.pending, replica.isr, replica.hw) == (None, (0, 2), 150)
    # Follower 1 catches up (its LEO reaches the HW): proposed back in.
    replica.serve_fetch(2, 150, 150, 1000, 4.9, 1, 1, incarnation=incarnation(2))
    replica.serve_fetch(1, 150, 100, 1000, 5.0, 1, 1, incarnation=incarnation(1))
    assert replica.proposal(5.0, 1.0) == replica_module.Proposal((0, 1, 2), 1, 2, 5.0, hw=150, incarnations=((1, 11),))  # it holds the 150 committed
    # Proposed, it counts for the HW at once: nothing is committed that it misses.
    replica.append(10, 5.1)
    replica.serve_fetch(2, 160, 150, 1000, 5.2, 1, 1, incarnation=incarnation(2))
    assert (replica.in_sync, replica.hw) == ({1, 2}, 150)


def test_a_refused_proposal_is_not_repeated_before_the_retry_delay() -> None:
    replica = leader(replicas=(0, 1), isr=(0,))
    replica.serve_fetch(1, 0, 0, 1000, 0.0, 1, -1, incarnation=incarnation(1))
    first = replica.proposal(0.0, 1.0)
    assert first is not None and first.isr == (0, 1)
    replica.proposal_answered("member-offline", 1, 1, [0], 0.1)
    assert (replica.pending, replica.isr) == (None, (0,))
    replica.serve_fetch(1, 0, 0, 1000, 0.5, 1, -1, incarnation=incarnation(1))
    assert replica.proposal(0.5, 1.0) is None
    assert replica.proposal(1.2, 1.0) == replica_module.Proposal((0, 1), 1, 1, 1.2, incarnations=((1, 11),))


@pytest.mark.parametrize(
    ("epoch", "answer", "role"),
    [
        (1, served(0, 0, 0, 0), Role.LEADER),
        (0, replica_module.FENCED_LEADER_EPOCH, Role.LEADER),  # the follower has not heard of this leader yet
        # A newer leader probably exists; only the SC's word deposes it (the fetch port proves nothing).
        (2, replica_module.UNKNOWN_LEADER_EPOCH, Role.LEADER),
    ],
)
def test_a_fetch_at_another_leader_epoch_is_refused(epoch: int, answer: object, role: Role) -> None:
    replica = leader()
    assert replica.serve_fetch(1, 0, 0, 100, 0.0, epoch, -1, incarnation=incarnation(1)) == answer
    assert (replica.role, replica.followers.keys() == ({1} if epoch == 1 else set())) == (role, True)


def test_a_fetch_from_a_log_that_parts_from_the_leaders_is_answered_with_where_it_diverges() -> None:
    replica = Replica("t-0", 0, LAG, leo=100, hw=0, epochs=[(1, 0), (3, 60)])
    replica.assign(0, [0, 1], 0.0, leader_epoch=3, partition_epoch=1, isr=[0, 1])
    # Follower with epoch 2 records from 50 to 120: the leader's largest epoch <= 2 is 1, ending at 60.
    assert replica.serve_fetch(1, 120, 0, 100, 0.0, 3, 2, incarnation=incarnation(1)) == Diverging(120, 1, 60)
    # Follower with epoch 1 records up to 80: epoch 1 ends at 60 in the leader's log.
    assert replica.serve_fetch(1, 80, 0, 100, 0.0, 3, 1, incarnation=incarnation(1)) == Diverging(80, 1, 60)
    # A matching log: served, with the epochs of what is sent.
    assert replica.serve_fetch(1, 60, 0, 100, 0.0, 3, 1, incarnation=incarnation(1)) == Served(60, 100, 60, 40, ((3, 60),))
    assert replica.serve_fetch(1, 50, 0, 20, 0.0, 3, 1, incarnation=incarnation(1)) == Served(50, 100, 60, 20, ((1, 50), (3, 60)))


def test_a_follower_truncates_where_its_log_parts_then_takes_the_leaders_records() -> None:
    follower = Replica("t-0", 1, LAG, leo=120, hw=40, epochs=[(1, 0), (2, 50)])
    follower.assign(0, [0, 1], 0.0, leader_epoch=3, partition_epoch=1, isr=[0, 1])
    assert follower.apply_fetched(0, Diverging(120, 1, 60)) is True
    # min(leader's end of epoch 1 = 60, its own end of epoch 1 = 50)
    assert (follower.leo, follower.hw, follower.log.runs) == (50, 40, [(1, 0)])
    assert follower.apply_fetched(0, Served(50, 100, 90, 50, ((1, 50), (3, 60)))) is True
    assert (follower.leo, follower.hw, follower.log.runs) == (100, 90, [(1, 0), (3, 60)])


@pytest.mark.parametrize(
    ("leader_id", "answer", "applied", "leo", "hw"),
    [
        (1, Served(50, 80, 60, 30, ((1, 50),)), True, 80, 60),
        (1, Served(50, 200, 150, 100, ((1, 50),)), True, 150, 150),  # its HW never passes its own LEO
        (2, Served(50, 80, 60, 30, ((1, 50),)), False, 50, 10),  # from a leader it no longer follows
        (1, Served(40, 80, 60, 30, ((1, 40),)), False, 50, 10),  # for a fetch at another offset: stale
    ],
)
def test_a_follower_applies_only_its_leaders_answer_to_its_current_fetch(
    leader_id: int, answer: Served, applied: bool, leo: int, hw: int
) -> None:
    follower = Replica("t-0", 0, LAG, leo=50, hw=10, epochs=[(1, 0)])
    follower.assign(1, [1, 0], 0.0, leader_epoch=1)
    assert follower.apply_fetched(leader_id, answer) is applied
    assert (follower.leo, follower.hw) == (leo, hw)


def test_an_idle_replica_neither_applies_fetches_nor_appends_nor_serves() -> None:
    replica = Replica("t-0", 0, LAG, leo=50, hw=10)
    replica.assign(None, [1, 0], 0.0, leader_epoch=2)
    assert (replica.role, replica.leader, replica.told_epoch) == (Role.IDLE, None, None)
    assert replica.apply_fetched(1, Served(50, 80, 60, 30, ((2, 50),))) is False
    with pytest.raises(ReplicaError, match=r"^partition 't-0': only its leader appends, this replica is idle$"):
        replica.append(10, now=0.0)
    assert replica.serve_fetch(1, 0, 0, 10, 0.0, 2, -1, incarnation=incarnation(1)) == replica_module.NOT_LEADER


def test_an_answer_that_does_not_add_up_is_refused() -> None:
    follower = Replica("t-0", 0, LAG, leo=50, hw=10)
    follower.assign(1, [1, 0], 0.0, leader_epoch=1)
    with pytest.raises(
        ReplicaError,
        match=r"^partition 't-0': leader 1 answered a fetch at offset 50 with 20 records, LEO 60, HW 0, which do not add up$",
    ):
        follower.apply_fetched(1, Served(50, 60, 0, 20, ((1, 50),)))
    with pytest.raises(ReplicaError, match=r"epoch runs \[\] do not describe 5 records from offset 50"):
        follower.apply_fetched(1, Served(50, 60, 0, 5, ()))
    assert (follower.leo, follower.hw) == (50, 10)


def test_losing_the_leadership_forgets_the_followers_and_a_new_epoch_starts_afresh() -> None:
    replica = leader()
    replica.serve_fetch(1, 0, 0, 100, 0.0, 1, -1, incarnation=incarnation(1))
    replica.append(30, 0.0)
    replica.assign(1, [0, 1, 2], 1.0, leader_epoch=2, partition_epoch=2, isr=[0, 1, 2])
    assert (replica.role, replica.leader, replica.followers, replica.leo, replica.hw, replica.told_epoch) == (
        Role.FOLLOWER, 1, {}, 30, 0, 2
    )
    assert replica.assign(0, [0, 1, 2], 2.0, leader_epoch=3, partition_epoch=3, isr=[0, 1, 2]) is True
    assert (replica.role, replica.followers) == (Role.LEADER, {})
    replica.append(5, 2.0)
    assert replica.log.runs == [(1, 0), (3, 30)]


def test_a_stale_epoch_from_the_sc_makes_a_leader_step_down_and_an_older_one_does_nothing() -> None:
    replica = leader(epoch=4)
    assert replica.step_down(4) is False and replica.role is Role.LEADER
    assert replica.step_down(5) is True and replica.role is Role.IDLE


def test_epoch_log_runs_end_offsets_and_truncation() -> None:
    log = EpochLog(100, [(0, 0), (2, 40), (5, 70)])
    assert [log.end_offset_for(epoch) for epoch in (-1, 0, 1, 2, 4, 5, 9)] == [
        (-1, 0), (0, 40), (0, 40), (2, 70), (2, 70), (5, 100), (5, 100)
    ]
    assert log.runs_between(30, 80) == [(0, 30), (2, 40), (5, 70)]
    assert log.runs_between(70, 70) == []
    assert [log.epoch_at(offset) for offset in (-1, 0, 39, 40, 69, 70, 99, 100)] == [-1, 0, 0, 2, 2, 5, 5, -1]
    log.truncate(45)
    assert (log.leo, log.runs, log.last_epoch) == (45, [(0, 0), (2, 40)], 2)
    log.truncate(40)
    assert (log.leo, log.runs) == (40, [(0, 0)])
    with pytest.raises(ReplicaError, match=r"epoch runs \[\(1, 5\)\] do not describe a log ending at 10"):
        EpochLog(10, [(1, 5)])
    with pytest.raises(ReplicaError, match="cannot append records of epoch 1 after epoch 2"):
        EpochLog(10, [(0, 0), (2, 5)]).append(1, 3)


def test_invalid_settings_and_offsets_are_refused_with_the_offending_values() -> None:
    with pytest.raises(ReplicaError, match=r"^replica lag time must be positive, got 0 seconds$"):
        Replica("t-0", 0, 0)
    with pytest.raises(ReplicaError, match=r"^offsets of partition 't-0' cannot be negative: leo -1, hw 0$"):
        Replica("t-0", 0, LAG, leo=-1)
    with pytest.raises(ReplicaError, match=r"^partition 't-0': cannot append -5 records$"):
        leader().append(-5, now=0.0)
    with pytest.raises(ReplicaError, match=r"^partition 't-0': fetch offset -1 and max records 10 must not be negative$"):
        leader().serve_fetch(1, -1, 0, 10, 0.0, 1, -1, incarnation=incarnation(1))


def test_a_leader_forgets_where_a_follower_outside_the_in_sync_set_was_each_time_it_is_told_the_state() -> None:
    """A follower dropped from the replicas (it deletes its log) and added back by a later move, both
    while the leader was cut off from the SC, looks unchanged to the leader: same replicas, same
    leader epoch. What it last fetched says nothing of what it holds now, so the leader waits for a
    fetch made after the state it was told before it proposes the follower in."""
    replica = leader()
    replica.append(100, 0.0)
    replica.serve_fetch(1, 100, 0, 1000, 0.1, 1, 1, incarnation=incarnation(1))
    replica.serve_fetch(2, 100, 0, 1000, 0.1, 1, 1, incarnation=incarnation(2))
    assert replica.hw == 100
    # Missed: SPU 2 left (in-sync set (0, 1), partition epoch 2) and came back (a move's first step,
    # epochs unchanged). The leader hears only the end state, within the lag time of 2's last fetch.
    replica.assign(0, [0, 1, 2], 0.5, leader_epoch=1, partition_epoch=2, isr=[0, 1])
    assert replica.proposal(0.6, 1.0) is None
    replica.serve_fetch(2, 0, 100, 1000, 0.7, 1, -1, incarnation=incarnation(2))  # its log is empty now
    assert replica.proposal(0.8, 1.0) is None
    replica.serve_fetch(2, 100, 100, 1000, 0.9, 1, 1, incarnation=incarnation(2))  # caught up again: now it may join
    assert replica.proposal(1.0, 1.0) == replica_module.Proposal((0, 1, 2), 1, 2, 1.0, hw=100, incarnations=((2, 12),))


def test_a_fetch_under_another_incarnation_starts_the_followers_record_afresh() -> None:
    """KIP-903: the leader saw follower 2 catch up under incarnation 5; its machine crashed (the
    unflushed tail lost) and its new process, connected to the SC as 6, fetches from a lower
    offset. Nothing the leader recorded of process 5 counts: follower 2 is not proposed in until
    it caught up again, and then it is named under 6."""
    replica = leader(isr=(0, 1))
    replica.append(100, 0.0)
    replica.serve_fetch(1, 100, 0, 1000, 0.1, 1, 1, incarnation=incarnation(1))
    replica.serve_fetch(2, 100, 0, 1000, 0.1, 1, 1, incarnation=5)
    assert replica.wanted_isr(0.2) == (0, 1, 2)
    replica.serve_fetch(2, 40, 0, 1000, 0.3, 1, 1, incarnation=6)  # the new process: a shorter log
    assert replica.followers[2] == replica_module.FollowerProgress(40, 0, 0.3, 100, None, 6)
    assert replica.wanted_isr(0.4) == (0, 1)
    assert replica.proposal(0.4, 1.0) is None
    replica.serve_fetch(2, 100, 40, 1000, 0.5, 1, 1, incarnation=6)  # caught up again
    assert replica.proposal(0.6, 1.0) == replica_module.Proposal((0, 1, 2), 1, 1, 0.6, hw=100, incarnations=((2, 6),))


def test_a_proposal_names_the_incarnation_it_saw_and_one_refused_is_made_again_under_a_new_one() -> None:
    """The proposal named 5; the SC refused it (stale-incarnation: follower 2 reconnected as 6).
    The same set under 5 waits out the retry delay; once a fetch under 6 shows it caught up, the
    proposal naming 6 goes at once."""
    replica = leader(isr=(0, 1))
    replica.serve_fetch(1, 0, 0, 1000, 0.0, 1, -1, incarnation=incarnation(1))
    replica.serve_fetch(2, 0, 0, 1000, 0.0, 1, -1, incarnation=5)
    first = replica.proposal(0.0, 1.0)
    assert first == replica_module.Proposal((0, 1, 2), 1, 1, 0.0, incarnations=((2, 5),))
    replica.proposal_answered("stale-incarnation", 1, 1, [0, 1], 0.1)
    replica.serve_fetch(2, 0, 0, 1000, 0.2, 1, -1, incarnation=5)
    assert replica.proposal(0.3, 1.0) is None
    replica.serve_fetch(2, 0, 0, 1000, 0.4, 1, -1, incarnation=6)
    assert replica.proposal(0.5, 1.0) == replica_module.Proposal((0, 1, 2), 1, 1, 0.5, incarnations=((2, 6),))


def test_a_follower_whose_fetches_name_no_incarnation_is_never_proposed_in() -> None:
    """An SPU older than the field cannot say which process fetches: the SC would refuse to add it."""
    replica = leader(isr=(0, 1))
    replica.serve_fetch(1, 0, 0, 1000, 0.0, 1, -1, incarnation=incarnation(1))
    replica.serve_fetch(2, 0, 0, 1000, 0.0, 1, -1)
    assert (replica.wanted_isr(0.1), replica.proposal(0.1, 1.0)) == ((0, 1), None)
    assert replica.followers[2] == replica_module.FollowerProgress(0, 0, 0.0, 0, 0.0, None)  # recorded all the same
