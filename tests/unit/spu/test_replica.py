"""The replica offset state machine: exact tables of LEO, HW and ISR through fetches, appends and time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from connection_manager import wire
from connection_manager.spu.replica import Replica, ReplicaError, Role, Served

LAG = 2.0


def leader(leo: int = 0, replicas: tuple[int, ...] = (0, 1, 2), lag: float = LAG) -> Replica:
    replica = Replica("t-0", 0, lag, leo=leo, hw=0)
    replica.assign(0, replicas, now=0.0)
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


def run(replica: Replica, steps: list[tuple[Fetch | Append | Refresh, Served | None, int, int, set[int]]]) -> None:
    """Each step: (what happens, the leader's answer if a fetch, then LEO, HW and ISR followers after it)."""
    for number, (step, answer, leo, hw, in_sync) in enumerate(steps):
        served = None
        if isinstance(step, Fetch):
            served = replica.serve_fetch(step.follower, step.offset, step.hw, step.max_records, step.now)
        elif isinstance(step, Append):
            replica.append(step.records, step.now)
        else:
            replica.refresh(step.now)
        assert (served, replica.leo, replica.hw, replica.in_sync) == (answer, leo, hw, in_sync), f"step {number}: {step}"


def test_a_new_leader_has_an_isr_of_itself_so_its_hw_is_its_leo() -> None:
    replica = Replica("t-0", 0, LAG, leo=50, hw=20)
    assert (replica.role, replica.leader) == (Role.IDLE, None)
    replica.assign(0, [0, 1, 2], now=0.0)
    assert (replica.role, replica.leader, replica.leo, replica.hw, replica.in_sync, replica.followers) == (
        Role.LEADER, 0, 50, 50, set(), {}
    )


def test_alone_in_its_isr_the_leader_commits_what_it_appends() -> None:
    run(leader(), [
        (Append(0.0, 100), None, 100, 100, set()),
        (Append(0.5, 0), None, 100, 100, set()),
        (Append(1.0, 7), None, 107, 107, set()),
    ])


def test_hw_is_the_lowest_leo_in_the_isr_and_followers_catch_up_in_bounded_rounds() -> None:
    run(leader(), [
        (Fetch(0.0, 1, 0), Served(0, 0, 0, 0), 0, 0, {1}),
        (Fetch(0.0, 2, 0), Served(0, 0, 0, 0), 0, 0, {1, 2}),
        (Append(0.5, 100), None, 100, 0, {1, 2}),
        (Fetch(0.75, 1, 0, max_records=60), Served(0, 100, 0, 60), 100, 0, {1, 2}),
        (Fetch(1.0, 1, 60, max_records=60), Served(60, 100, 0, 40), 100, 0, {1, 2}),
        (Fetch(1.0, 2, 0, max_records=60), Served(0, 100, 0, 60), 100, 0, {1, 2}),
        # Follower 1 has everything, follower 2 has 60 records: nothing is committed past 60 yet.
        (Fetch(1.25, 1, 100, max_records=60), Served(100, 100, 0, 0), 100, 0, {1, 2}),
        (Fetch(1.5, 2, 60, max_records=60), Served(60, 100, 60, 40), 100, 60, {1, 2}),
        (Fetch(1.75, 2, 100, max_records=60), Served(100, 100, 100, 0), 100, 100, {1, 2}),
    ])


def test_a_follower_that_stops_fetching_leaves_the_isr_after_the_lag_time_and_the_hw_moves_on() -> None:
    replica = leader()
    run(replica, [
        (Fetch(0.0, 1, 0), Served(0, 0, 0, 0), 0, 0, {1}),
        (Fetch(0.0, 2, 0), Served(0, 0, 0, 0), 0, 0, {1, 2}),
        (Append(1.0, 100), None, 100, 0, {1, 2}),
        (Fetch(1.25, 1, 0), Served(0, 100, 0, 100), 100, 0, {1, 2}),
        (Fetch(1.25, 2, 0), Served(0, 100, 0, 100), 100, 0, {1, 2}),
        # Follower 1's last fetch: it has caught up at 1.5, then goes silent.
        (Fetch(1.5, 1, 100), Served(100, 100, 0, 0), 100, 0, {1, 2}),
        (Fetch(1.5, 2, 100), Served(100, 100, 100, 0), 100, 100, {1, 2}),
        (Append(2.0, 50), None, 150, 100, {1, 2}),
        (Fetch(2.25, 2, 100), Served(100, 150, 100, 50), 150, 100, {1, 2}),
        (Fetch(2.5, 2, 150), Served(150, 150, 100, 0), 150, 100, {1, 2}),
        (Refresh(3.5), None, 150, 100, {1, 2}),  # exactly the lag time since follower 1 caught up
        (Refresh(3.75), None, 150, 150, {2}),
    ])
    assert {spu: progress.leo for spu, progress in replica.followers.items()} == {1: 100, 2: 150}


def test_a_restarted_follower_leaves_the_isr_at_once_and_rejoins_only_once_it_has_caught_up() -> None:
    run(leader(), [
        (Fetch(0.0, 1, 0), Served(0, 0, 0, 0), 0, 0, {1}),
        (Fetch(0.0, 2, 0), Served(0, 0, 0, 0), 0, 0, {1, 2}),
        (Append(0.0, 100), None, 100, 0, {1, 2}),
        (Fetch(0.25, 1, 0), Served(0, 100, 0, 100), 100, 0, {1, 2}),
        (Fetch(0.25, 2, 0), Served(0, 100, 0, 100), 100, 0, {1, 2}),
        (Fetch(0.5, 1, 100), Served(100, 100, 0, 0), 100, 0, {1, 2}),
        (Fetch(0.5, 2, 100), Served(100, 100, 100, 0), 100, 100, {1, 2}),
        # Follower 1 comes back without its records: below the HW, it is out of sync at once.
        (Fetch(0.75, 1, 0, max_records=40), Served(0, 100, 100, 40), 100, 100, {2}),
        (Append(1.0, 20), None, 120, 100, {2}),
        (Fetch(1.0, 2, 100), Served(100, 120, 100, 20), 120, 100, {2}),
        (Fetch(1.25, 2, 120), Served(120, 120, 120, 0), 120, 120, {2}),
        (Fetch(1.25, 1, 40, max_records=40), Served(40, 120, 120, 40), 120, 120, {2}),
        (Fetch(1.5, 1, 80, max_records=40), Served(80, 120, 120, 40), 120, 120, {2}),
        (Fetch(1.75, 1, 120, max_records=40), Served(120, 120, 120, 0), 120, 120, {1, 2}),
    ])


def test_a_follower_keeping_pace_with_a_steady_producer_stays_in_the_isr() -> None:
    """Never at the leader's LEO when it fetches, but always at the LEO the leader had at its previous fetch."""
    replica = leader(replicas=(0, 1))
    steps: list[tuple[Fetch | Append | Refresh, Served | None, int, int, set[int]]] = [
        (Fetch(0.0, 1, 0), Served(0, 0, 0, 0), 0, 0, {1})
    ]
    for k in range(8):  # 4 s, twice the lag time
        # The leader knows the follower's previous fetch only: the HW trails by one round.
        steps.append((Append(0.5 * k + 0.1, 10), None, 10 * k + 10, max(0, 10 * k - 10), {1}))
        steps.append((Fetch(0.5 * k + 0.25, 1, 10 * k, max_records=10), Served(10 * k, 10 * k + 10, 10 * k, 10), 10 * k + 10, 10 * k, {1}))
    run(replica, steps)


def test_a_fetch_past_the_leaders_leo_is_answered_from_its_leo_and_the_follower_truncates() -> None:
    replica = leader(leo=120)
    assert replica.serve_fetch(1, 150, 110, 1000, now=0.0) == Served(150, 120, 120, 0)
    assert (replica.followers[1].leo, replica.followers[1].hw, replica.in_sync) == (120, 110, {1})

    follower = Replica("t-0", 1, LAG, leo=150, hw=110)
    follower.assign(0, [0, 1, 2], now=0.0)
    assert follower.apply_fetched(0, Served(150, 120, 100, 0)) is True
    assert (follower.leo, follower.hw) == (120, 100)


@pytest.mark.parametrize(
    ("leader_id", "served", "applied", "leo", "hw"),
    [
        (1, Served(50, 80, 60, 30), True, 80, 60),
        (1, Served(50, 200, 150, 100), True, 150, 150),  # its HW never passes its own LEO
        (2, Served(50, 80, 60, 30), False, 50, 10),  # from a leader it no longer follows
        (1, Served(40, 80, 60, 30), False, 50, 10),  # for a fetch at another offset: stale
    ],
)
def test_a_follower_applies_only_its_leaders_answer_to_its_current_fetch(
    leader_id: int, served: Served, applied: bool, leo: int, hw: int
) -> None:
    follower = Replica("t-0", 0, LAG, leo=50, hw=10)
    follower.assign(1, [1, 0], now=0.0)
    assert follower.apply_fetched(leader_id, served) is applied
    assert (follower.leo, follower.hw) == (leo, hw)


def test_an_idle_replica_neither_applies_fetches_nor_appends() -> None:
    replica = Replica("t-0", 0, LAG, leo=50, hw=10)
    replica.assign(None, [1, 0], now=0.0)
    assert (replica.role, replica.leader) == (Role.IDLE, None)
    assert replica.apply_fetched(1, Served(50, 80, 60, 30)) is False
    with pytest.raises(ReplicaError, match=r"^partition 't-0': only its leader appends, this replica is idle$"):
        replica.append(10, now=0.0)
    with pytest.raises(ReplicaError, match=r"^partition 't-0': only its leader serves fetches, this replica is idle$"):
        replica.serve_fetch(1, 0, 0, 10, now=0.0)


def test_an_answer_that_does_not_add_up_is_refused() -> None:
    follower = Replica("t-0", 0, LAG, leo=50, hw=10)
    follower.assign(1, [1, 0], now=0.0)
    with pytest.raises(
        ReplicaError,
        match=r"^partition 't-0': leader 1 answered a fetch at offset 50 with 20 records, LEO 60, HW 0, which do not add up$",
    ):
        follower.apply_fetched(1, Served(50, 60, 0, 20))
    assert (follower.leo, follower.hw) == (50, 10)


def test_losing_the_leadership_forgets_the_followers_and_regaining_it_starts_a_new_isr() -> None:
    replica = leader()
    replica.serve_fetch(1, 0, 0, 100, now=0.0)
    replica.append(30, now=0.0)
    assert (replica.hw, replica.in_sync) == (0, {1})
    replica.assign(1, [0, 1, 2], now=1.0)
    assert (replica.role, replica.leader, replica.followers, replica.in_sync, replica.leo, replica.hw) == (
        Role.FOLLOWER, 1, {}, set(), 30, 0
    )
    with pytest.raises(ReplicaError, match=r"only its leader appends, this replica is follower"):
        replica.append(1, now=1.0)
    replica.assign(0, [0, 1, 2], now=2.0)
    assert (replica.role, replica.followers, replica.in_sync, replica.hw) == (Role.LEADER, {}, set(), 30)


def test_a_follower_removed_from_the_replica_list_no_longer_holds_the_hw_back() -> None:
    replica = leader()
    replica.serve_fetch(1, 0, 0, 100, now=0.0)
    replica.serve_fetch(2, 0, 0, 100, now=0.0)
    replica.append(30, now=0.0)
    replica.serve_fetch(1, 30, 0, 100, now=0.25)
    assert (replica.hw, replica.in_sync) == (0, {1, 2})
    replica.assign(0, [0, 1], now=0.5)
    assert (replica.hw, replica.in_sync, list(replica.followers)) == (30, {1}, [1])


def test_the_report_lists_the_leaders_offsets_and_each_follower_heard_from() -> None:
    replica = leader(replicas=(0, 1, 2, 3))
    replica.serve_fetch(2, 0, 0, 100, now=0.0)
    replica.append(100, now=0.0)
    replica.serve_fetch(2, 0, 0, 40, now=0.25)
    replica.serve_fetch(1, 40, 40, 100, now=0.25)
    assert replica.report(now=0.5) == wire.LeaderReport(
        partition="t-0",
        hw=0,
        leo=100,
        followers=[wire.ReplicaOffsets(spu=1, hw=40, leo=40), wire.ReplicaOffsets(spu=2, hw=0, leo=0)],
    )


def test_invalid_settings_and_offsets_are_refused_with_the_offending_values() -> None:
    with pytest.raises(ReplicaError, match=r"^replica lag time must be positive, got 0 seconds$"):
        Replica("t-0", 0, 0)
    with pytest.raises(ReplicaError, match=r"^offsets of partition 't-0' cannot be negative: leo -1, hw 0$"):
        Replica("t-0", 0, LAG, leo=-1)
    with pytest.raises(ReplicaError, match=r"^partition 't-0': cannot append -5 records$"):
        leader().append(-5, now=0.0)
    with pytest.raises(ReplicaError, match=r"^partition 't-0': fetch offset -1 and max records 10 must not be negative$"):
        leader().serve_fetch(1, -1, 0, 10, now=0.0)
