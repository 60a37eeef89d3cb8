"""Replica moves (Kafka's KIP-455), one table per step: start (the target's SPUs join as followers),
wait (until each is in the committed in-sync set), leadership off a leaving replica, then the
leaving replicas go. And a cancel, which reverts the same way. Exact states, replicas and causes."""

from __future__ import annotations

from typing import Any

import pytest

from controller.reconcile import partition_state as ps
from controller.reconcile.partition_state import State
from store import models
from tests.unit.test_partition_state import WRITTEN_AT, Spus, proposal

ONLINE, OFFLINE, LEADER_OFFLINE = ps.ONLINE, ps.OFFLINE, ps.LEADER_OFFLINE
MOVE = ps.CAUSE_REASSIGNMENT


def moving(
    previous: tuple[int, ...] = (0, 1, 2),
    target: tuple[int, ...] = (3, 1, 2),
    replicas: tuple[int, ...] | None = None,
    leader: int = 0,
    isr: tuple[int, ...] = (0, 1, 2),
    resolution: models.PartitionResolution = ONLINE,
    leader_epoch: int = 3,
    partition_epoch: int = 4,
) -> models.Partition:
    """Partition t-0 moving from ``previous`` to ``target`` (replicas default to previous: not started)."""
    return models.Partition(
        name="t-0",
        spec=models.PartitionSpec(
            leader=leader,
            replicas=list(previous if replicas is None else replicas),
            reassignment=models.Reassignment(previous=list(previous), target=list(target)),
        ),
        status=models.PartitionStatus(
            resolution=resolution,
            leader_epoch=leader_epoch,
            partition_epoch=partition_epoch,
            isr=list(isr),
            leader=models.ReplicaStatus(spu=leader, hw=100, leo=100),
        ),
    )


def step(p: models.Partition, spus: Spus, **facts: Any) -> tuple[State | None, str, tuple[int, ...] | None, bool]:
    """(the next state, its cause, the new spec.replicas (None: unchanged), whether the move ends)."""
    decision = ps.decide(p, WRITTEN_AT, spus, ps.Facts(committed_hw=100, **facts))
    transition = decision.transition
    if transition is None:
        return None, "", None, False
    return transition.state, transition.cause, transition.replicas, transition.ends_move


ALL_UP = Spus(online_ids={0, 1, 2, 3})


# ---------------------------------------------------------------------------- a move, step by step


def test_start_appends_the_target_s_new_spus_as_followers_and_changes_nothing_else() -> None:
    # Leader, in-sync set and both epochs as they were: only spec.replicas grows.
    assert step(moving(), ALL_UP) == (State(0, ONLINE, 3, 4, (0, 1, 2)), "", (0, 1, 2, 3), False)
    # Several new SPUs, in the target's order.
    assert step(moving(target=(4, 3, 2)), Spus(online_ids={0, 1, 2, 3, 4}, registered={i: 1 for i in range(5)})) == (
        State(0, ONLINE, 3, 4, (0, 1, 2)), "", (0, 1, 2, 4, 3), False
    )


def test_it_waits_until_every_new_replica_is_in_the_committed_in_sync_set() -> None:
    started = moving(replicas=(0, 1, 2, 3))
    assert step(started, ALL_UP) == (None, "", None, False)
    # The leader's grow proposal commits it (the ordinary in-sync rule, nothing special).
    grown = ps.decide(started, WRITTEN_AT, ALL_UP, ps.Facts(committed_hw=100, proposal=proposal((0, 1, 2, 3))))
    assert grown.transition is not None and grown.transition.state == State(0, ONLINE, 3, 5, (0, 1, 2, 3))
    # A new SPU that went offline after it joined leaves the in-sync set: the move waits again.
    caught_up = moving(replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3))
    assert step(caught_up, Spus(online_ids={0, 1, 2})) == (State(0, ONLINE, 3, 5, (0, 1, 2)), "", None, False)


def test_a_leaving_leader_hands_over_to_the_first_target_replica_in_sync_keeping_the_in_sync_set() -> None:
    caught_up = moving(replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3))
    assert step(caught_up, ALL_UP) == (State(3, ONLINE, 4, 5, (0, 1, 2, 3)), MOVE, None, False)
    # The first target replica cannot lead (draining): the next one in target order does.
    assert step(caught_up, Spus(online_ids={0, 1, 2, 3}, draining_ids={3})) == (
        State(1, ONLINE, 4, 5, (0, 1, 2, 3)), MOVE, None, False
    )


def test_the_leaving_replicas_go_last_and_only_they_leave_the_in_sync_set() -> None:
    handed_over = moving(replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3), leader=3, leader_epoch=4, partition_epoch=5)
    assert step(handed_over, ALL_UP) == (State(3, ONLINE, 4, 6, (1, 2, 3)), "", (3, 1, 2), True)
    # A leaving replica already out of the in-sync set: the set stays, and so does the partition epoch.
    assert step(moving(replicas=(0, 1, 2, 3), isr=(1, 2, 3), leader=3), ALL_UP) == (
        State(3, ONLINE, 3, 4, (1, 2, 3)), "", (3, 1, 2), True
    )
    # A member of the target outside the in-sync set (it was before the move) does not hold it up.
    follower_moves = moving(target=(0, 1, 3), replicas=(0, 1, 2, 3), isr=(0, 2, 3))
    assert step(follower_moves, ALL_UP) == (State(0, ONLINE, 3, 5, (0, 3)), "", (0, 1, 3), True)


def test_a_reordering_changes_no_data_and_ends_at_once() -> None:
    reorder = moving(target=(1, 0, 2))
    assert step(reorder, ALL_UP) == (State(0, ONLINE, 3, 4, (0, 1, 2)), "", (1, 0, 2), True)


def test_no_step_while_the_partition_is_not_online_and_the_preferred_leader_waits_for_the_move() -> None:
    assert step(moving(resolution=OFFLINE), ALL_UP) == (None, "", None, False)
    # Led by 1 after a failover, moving 2 away and waiting for 3: preferred SPU 0 does not take over now.
    waiting = moving(target=(0, 1, 3), replicas=(0, 1, 2, 3), leader=1, isr=(0, 1, 2))
    assert step(waiting, ALL_UP) == (None, "", None, False)


def test_a_leader_lost_mid_move_is_replaced_from_the_in_sync_set_and_the_move_goes_on() -> None:
    started = moving(replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3))
    state, cause, replicas, ends = step(started, Spus(online_ids={1, 2, 3}))
    assert (state, cause, replicas, ends) == (State(1, ONLINE, 4, 5, (1, 2, 3)), ps.CAUSE_SPU_OFFLINE, None, False)
    # Then SPU 1 is in the target: the leaving SPU 0 (offline) goes.
    after = moving(replicas=(0, 1, 2, 3), isr=(1, 2, 3), leader=1, leader_epoch=4, partition_epoch=5)
    assert step(after, Spus(online_ids={1, 2, 3})) == (State(1, ONLINE, 4, 5, (1, 2, 3)), "", (3, 1, 2), True)


def test_a_move_of_a_partition_at_partition_epoch_0_writes_its_in_sync_set_out() -> None:
    # Stored Online at partition epoch 0 (written by someone else): every replica counts as in sync.
    # SPU 3 joining at epoch 0 would count too, with none of the records, and could lead.
    p = moving(partition_epoch=0)
    assert step(p, ALL_UP) == (State(0, ONLINE, 3, 1, (0, 1, 2)), "", (0, 1, 2, 3), False)


# ---------------------------------------------------------------------------- cancel


@pytest.mark.parametrize(
    ("cancelled", "expected"),
    [
        # Not started: the move simply ends.
        (moving(target=(0, 1, 2)), (State(0, ONLINE, 3, 4, (0, 1, 2)), "", (0, 1, 2), True)),
        # Started, new SPU not caught up: it is dropped, nothing else changes.
        (moving(target=(0, 1, 2), replicas=(0, 1, 2, 3)), (State(0, ONLINE, 3, 4, (0, 1, 2)), "", (0, 1, 2), True)),
        # Caught up: it leaves the in-sync set with its replica.
        (
            moving(target=(0, 1, 2), replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3)),
            (State(0, ONLINE, 3, 5, (0, 1, 2)), "", (0, 1, 2), True),
        ),
        # It already leads: leadership goes back to the first previous replica in sync first.
        (
            moving(target=(0, 1, 2), replicas=(0, 1, 2, 3), isr=(1, 2, 3), leader=3, leader_epoch=4),
            (State(1, ONLINE, 5, 5, (1, 2, 3)), MOVE, None, False),
        ),
        # ... and no previous replica is in sync: it keeps leading until one is.
        (moving(target=(0, 1, 2), replicas=(0, 1, 2, 3), isr=(3,), leader=3), (None, "", None, False)),
    ],
)
def test_a_cancelled_move_reverts_to_the_previous_replicas(
    cancelled: models.Partition, expected: tuple[State | None, str, tuple[int, ...] | None, bool]
) -> None:
    assert step(cancelled, ALL_UP) == expected


@pytest.mark.parametrize(
    ("cancelled", "spus", "expected"),
    [
        # The partition's only replica went for good during a move onto SPU 3 (never in sync):
        # the cancel drops SPU 3 although nobody leads; leader, epochs and in-sync set stay.
        (
            moving(previous=(0,), target=(0,), replicas=(0, 3), isr=(0,), resolution=LEADER_OFFLINE),
            Spus(online_ids={3}),
            (State(0, LEADER_OFFLINE, 3, 4, (0,)), "", (0,), True),
        ),
        (
            moving(previous=(0, 1), target=(0, 1), replicas=(0, 1, 3), isr=(0, 1), resolution=LEADER_OFFLINE),
            Spus(online_ids={3}),
            (State(0, LEADER_OFFLINE, 3, 4, (0, 1)), "", (0, 1), True),
        ),
        # A leaving replica in the in-sync set may be the one holding the records: it waits.
        (
            moving(previous=(0,), target=(0,), replicas=(0, 3), isr=(0, 3), resolution=LEADER_OFFLINE),
            Spus(online_ids=set()),
            (None, "", None, False),
        ),
        # A move that is not cancelled waits for a leader.
        (
            moving(previous=(0,), target=(3,), replicas=(0, 3), isr=(0,), resolution=LEADER_OFFLINE),
            Spus(online_ids={3}),
            (None, "", None, False),
        ),
    ],
)
def test_a_cancelled_move_of_a_partition_nobody_can_lead_ends(
    cancelled: models.Partition, spus: Spus, expected: tuple[State | None, str, tuple[int, ...] | None, bool]
) -> None:
    assert step(cancelled, spus) == expected


# ---------------------------------------------------------------------------- stored form


def test_a_move_is_stored_in_the_spec_and_a_malformed_one_is_refused_with_the_values() -> None:
    p = moving(replicas=(0, 1, 2, 3))
    assert models.decode("partitions", models.encode(p)) == p
    assert models.encode(p).count(b'"reassignment":{"previous":[0,1,2],"target":[3,1,2]}') == 1
    # Absent when no move is in progress: stored partitions are as they were.
    plain = models.Partition(name="t-0", spec=models.PartitionSpec(leader=0, replicas=[0, 1]))
    assert b"reassignment" not in models.encode(plain)
    with pytest.raises(ValueError, match=r"reassignment previous \[0, 5\] must be among the replicas \[0, 1\]"):
        models.PartitionSpec(leader=0, replicas=[0, 1], reassignment=models.Reassignment(previous=[0, 5], target=[0, 1]))
    with pytest.raises(ValueError, match=r"reassignment target \[1, 1\] lists an SPU more than once"):
        models.Reassignment(previous=[0], target=[1, 1])
    with pytest.raises(ValueError):
        models.Reassignment(previous=[0], target=[])


# ---------------------------------------------------------------------------- what the history records


def test_each_step_names_its_event_for_the_history() -> None:
    def event(p: models.Partition, spus: Spus = ALL_UP, **facts: Any) -> str:
        transition = ps.decide(p, WRITTEN_AT, spus, ps.Facts(committed_hw=100, **facts)).transition
        assert transition is not None
        return transition.move_event

    assert event(moving()) == ps.MOVE_ADDING
    assert event(moving(replicas=(0, 1, 2, 3)), proposal=proposal((0, 1, 2, 3))) == ps.MOVE_CAUGHT_UP
    assert event(moving(replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3))) == ""  # the leader change: its cause says it
    assert event(moving(replicas=(0, 1, 2, 3), isr=(0, 1, 2, 3), leader=3)) == ps.MOVE_COMPLETED
    assert event(moving(target=(0, 1, 2), replicas=(0, 1, 2, 3))) == ps.MOVE_REVERTED
    # An in-sync change that does not complete the catching up is no event.
    two_new = moving(target=(3, 4, 2), replicas=(0, 1, 2, 3, 4))
    spus = Spus(online_ids={0, 1, 2, 3, 4}, registered={i: 1 for i in range(5)})
    assert event(two_new, spus, proposal=proposal((0, 1, 2, 3))) == ""
