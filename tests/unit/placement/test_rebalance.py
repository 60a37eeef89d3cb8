"""The rebalance planner: exact plans for small clusters, the rules it keeps, and its checks."""

from __future__ import annotations

from typing import Any

import pytest

from controller import placement
from controller.placement import planner, rebalance

Spu = placement.SpuInfo


def plan(spus: list[placement.SpuInfo], partitions: list[tuple[str, list[int]]], **options: Any) -> placement.RebalancePlan:
    return placement.plan_rebalance(placement.RebalanceRequest(spus=spus, partitions=partitions, **options))


def moves(result: placement.RebalancePlan) -> list[tuple[str, list[int], list[int]]]:
    return [(move.partition, list(move.before), list(move.after)) for move in result.moves]


def kip6() -> list[tuple[str, list[int]]]:
    """KIP-6's example: SPUs 0 and 1 hold 7 and 6 replicas, SPUs 2 and 3 were just added."""
    return [(f"kip-{index}", [0, 1] if index % 2 == 0 else [1, 0]) for index in range(6)] + [("kip-6", [0])]


# --------------------------------------------------------------------------- adding SPUs


def test_kip6_counts_7_6_0_0_become_4_3_3_3_in_6_moves() -> None:
    result = plan([Spu(spu_id) for spu_id in range(4)], kip6())
    assert result.before.replicas == {0: 7, 1: 6, 2: 0, 3: 0}
    assert result.after.replicas == {0: 4, 1: 3, 2: 3, 3: 3}
    assert (result.replica_moves, result.lower_bound) == (6, 6)
    # One replica per partition moves: each keeps a replica (and its leader, but where the
    # leader's own replica leads the way to an SPU leading too few).
    assert moves(result) == [
        ("kip-0", [0, 1], [2, 1]),
        ("kip-1", [1, 0], [3, 0]),
        ("kip-2", [0, 1], [2, 1]),
        ("kip-3", [1, 0], [1, 2]),
        ("kip-4", [0, 1], [0, 3]),
        ("kip-5", [1, 0], [3, 0]),
    ]
    assert result.after.leaders == {0: 2, 1: 1, 2: 2, 3: 2}
    assert result.replica_targets == placement.Targets(floor=3, ceiling=4)
    assert result.leader_targets == placement.Targets(floor=1, ceiling=2)
    assert result.balanced and result.unreachable == () and result.notes == ()


def test_a_new_spu_takes_its_share_from_each_and_nothing_else_moves() -> None:
    partitions = [(f"t-{index}", [index % 3, (index + 1) % 3]) for index in range(6)]
    result = plan([Spu(spu_id) for spu_id in range(4)], partitions)
    assert moves(result) == [("t-0", [0, 1], [0, 3]), ("t-1", [1, 2], [1, 3]), ("t-2", [2, 0], [3, 2])]
    assert result.after.replicas == {0: 3, 1: 3, 2: 3, 3: 3}
    assert (result.replica_moves, result.lower_bound, result.leader_changes) == (3, 3, 0)


def test_a_balanced_cluster_gets_an_empty_plan() -> None:
    partitions = [(f"t-{index}", [index % 3, (index + 1) % 3]) for index in range(6)]
    result = plan([Spu(spu_id) for spu_id in range(3)], partitions)
    assert result.moves == ()
    assert (result.replica_moves, result.lower_bound, result.leader_changes) == (0, 0, 0)
    assert result.before == result.after
    assert result.balanced


def test_leaders_are_evened_out_by_reordering_without_moving_data() -> None:
    result = plan([Spu(spu_id) for spu_id in range(3)], [(f"t-{index}", [0, 1, 2]) for index in range(3)])
    assert moves(result) == [("t-0", [0, 1, 2], [1, 0, 2]), ("t-1", [0, 1, 2], [2, 0, 1])]
    assert (result.replica_moves, result.lower_bound, result.leader_changes) == (0, 0, 2)
    assert result.after.leaders == {0: 1, 1: 1, 2: 1}


def test_moves_are_listed_in_natural_partition_order_whatever_the_input_order() -> None:
    partitions = [("t-10", [0]), ("t-9", [0]), ("t-2", [0]), ("s-1", [0])]
    result = plan([Spu(0), Spu(1)], partitions)
    reordered = plan([Spu(1), Spu(0)], list(reversed(partitions)))
    assert result == reordered
    assert [move.partition for move in result.moves] == ["s-1", "t-2"]


# --------------------------------------------------------------------------- offline and decommissioning SPUs


def test_an_offline_spu_keeps_its_replicas_takes_none_and_is_not_counted() -> None:
    spus = [Spu(0), Spu(1), Spu(2, online=False), Spu(3)]
    partitions = [("t-0", [0, 2]), ("t-1", [0, 1]), ("t-2", [2, 1]), ("t-3", [0, 1])]
    result = plan(spus, partitions)
    # 6 replicas on the three online SPUs: 2 each. SPU 2 keeps its 2 and gets nothing.
    assert moves(result) == [("t-0", [0, 2], [3, 2]), ("t-1", [0, 1], [0, 3]), ("t-3", [0, 1], [1, 0])]
    assert result.after.replicas == {0: 2, 1: 2, 2: 2, 3: 2}
    assert (result.replica_moves, result.lower_bound) == (2, 2)


def test_a_decommissioned_spu_is_emptied_and_the_rest_balanced() -> None:
    spus = [Spu(spu_id) for spu_id in range(4)]
    partitions = [(f"t-{index}", [index % 4, (index + 1) % 4]) for index in range(8)]
    result = plan(spus, partitions, decommissioning=[3])
    assert result.after.replicas == {0: 6, 1: 5, 2: 5, 3: 0}
    assert result.after.leaders[3] == 0
    assert (result.replica_moves, result.lower_bound) == (4, 4)
    assert result.balanced
    for move in result.moves:
        assert len(move.after) == len(move.before) == len(set(move.after))


def test_a_replica_with_no_direct_receiver_goes_through_another_spu_and_the_plan_says_so() -> None:
    # SPU 3 leaves; SPU 1 is the only one below target, but it holds p-0 already: p-0 goes to
    # SPU 0, which passes one of its own on to SPU 1. One move above the lower bound.
    spus = [Spu(spu_id) for spu_id in range(4)]
    partitions = [("p-0", [3, 1]), ("a-0", [0]), ("a-1", [0]), ("c-0", [2]), ("c-1", [2])]
    result = plan(spus, partitions, decommissioning=[3])
    assert moves(result) == [("a-0", [0], [1]), ("p-0", [3, 1], [0, 1])]
    assert (result.replica_moves, result.lower_bound) == (2, 1)
    assert result.after.replicas == {0: 2, 1: 2, 2: 2, 3: 0}
    assert result.notes == (
        "2 replica moves, 1 above the lower bound of 1",
        "1 replica(s) had no SPU below its target that could take them (each such SPU already held the "
        "partition), so each goes through an SPU at its target, one move more: SPU 3's replica of p-0 goes "
        "to SPU 0, SPU 0 passes a-0 to SPU 1",
    )


def test_a_partition_with_nowhere_to_go_stays_and_the_plan_names_it() -> None:
    # RF 2 on 2 SPUs: once SPU 1 leaves, SPU 0 is the only one left and already holds t-0.
    result = plan([Spu(0), Spu(1)], [("t-0", [0, 1]), ("t-1", [1])], decommissioning=[1])
    assert moves(result) == [("t-1", [1], [0])]
    assert result.unreachable == (
        placement.Shortfall(
            spu=0,
            kind="replicas",
            count=2,
            floor=3,
            ceiling=3,
            reason="no SPU above its target has a replica that may come here: it holds the partition already",
        ),
        placement.Shortfall(
            spu=1,
            kind="replicas",
            count=1,
            floor=0,
            ceiling=0,
            reason="decommissioning, but its replicas of t-0 may go to no SPU that takes replicas: "
            "each already holds the partition",
        ),
    )
    assert not result.balanced


def test_replicas_on_decommissioning_spus_with_no_spu_left_to_take_them() -> None:
    with pytest.raises(placement.InsufficientResources) as caught:
        plan([Spu(0), Spu(1, online=False)], [("t-0", [0])], decommissioning=[0])
    assert str(caught.value) == (
        "1 replicas are on decommissioning SPUs and no online SPU may take them: "
        "bring an SPU online or register a new one"
    )


# --------------------------------------------------------------------------- racks


def test_racks_keep_their_spread_and_limit_what_balance_can_reach() -> None:
    # Three racks, every partition in all three. SPU 3 joins rack a: a replica may only move
    # inside its rack, so rack a's two SPUs share its 4 replicas and b and c keep theirs.
    spus = [Spu(0, "a"), Spu(1, "b"), Spu(2, "c"), Spu(3, "a")]
    result = plan(spus, [(f"t-{index}", [0, 1, 2]) for index in range(4)])
    assert moves(result) == [
        ("t-0", [0, 1, 2], [2, 3, 1]),
        ("t-1", [0, 1, 2], [3, 1, 2]),
        ("t-2", [0, 1, 2], [1, 0, 2]),
    ]
    assert result.after.replicas == {0: 2, 1: 4, 2: 4, 3: 2}
    assert (result.replica_moves, result.lower_bound) == (2, 3)
    for move in result.moves:
        assert {"a", "b", "c"} == {spus[spu_id].rack for spu_id in move.after}
    assert [(shortfall.spu, shortfall.count) for shortfall in result.unreachable] == [(0, 2), (1, 4), (2, 4), (3, 2)]
    assert result.unreachable[1].reason == (
        "none of its replicas may go to an SPU below its target: each such SPU already holds the partition, "
        "or the partition would lose a rack"
    )
    assert result.notes == (
        "1 move(s) even out SPUs that racks keep below their target (see unreachable), from SPUs holding two "
        "or more replicas more",
    )


def test_a_move_into_another_rack_is_taken_when_the_spread_allows_it() -> None:
    # Racks a (0, 1) and b (2, 3): SPU 2 holds all of b's replicas; SPU 3 takes half, inside b.
    spus = [Spu(0, "a"), Spu(1, "a"), Spu(2, "b"), Spu(3, "b")]
    partitions = [("t-0", [0, 2]), ("t-1", [1, 2]), ("t-2", [0, 2]), ("t-3", [1, 2])]
    result = plan(spus, partitions)
    assert result.after.replicas == {0: 2, 1: 2, 2: 2, 3: 2}
    assert (result.replica_moves, result.lower_bound) == (2, 2)
    for move in result.moves:
        assert {spus[spu_id].rack for spu_id in move.after} == {"a", "b"}


def test_path_racks_count_spread_at_the_site_and_at_the_leaf() -> None:
    # t-0 spans both sites; SPU 3 (dc2) is empty. Moving SPU 0's replica to SPU 2 (dc1) would
    # leave t-0 in dc1 only: refused; SPU 3 takes it.
    spus = [Spu(0, "/dc2/r1"), Spu(1, "/dc1/r1"), Spu(2, "/dc1/r2"), Spu(3, "/dc2/r2")]
    partitions = [("t-0", [0, 1]), ("t-1", [0, 1]), ("t-2", [0, 2])]
    result = plan(spus, partitions)
    for move in result.moves:
        assert {spus[spu_id].rack.split("/")[1] for spu_id in move.after} == {"dc1", "dc2"}  # type: ignore[union-attr]  # every SPU of this cluster has a rack
    assert result.after.replicas == {0: 2, 1: 2, 2: 1, 3: 1}
    assert (result.replica_moves, result.lower_bound) == (1, 1)


def test_decommissioning_in_a_rack_overfills_the_rack_rather_than_lose_it() -> None:
    # Each partition is in racks a, b and c; SPU 5 of rack c leaves: its replicas must stay in
    # rack c, so SPU 2 takes them both, the second above the ceiling, and the plan says why.
    spus = [Spu(0, "a"), Spu(1, "b"), Spu(2, "c"), Spu(3, "a"), Spu(4, "b"), Spu(5, "c")]
    partitions = [(f"t-{index}", [index % 2 * 3, index % 2 * 3 + 1, 5 if index < 2 else 2]) for index in range(4)]
    result = plan(spus, partitions, decommissioning=[5])
    assert result.after.replicas[5] == 0
    assert result.after.replicas[2] == 4
    assert result.notes == (
        "1 replica(s) of decommissioning SPUs go to SPUs above the ceiling: racks leave no SPU at or below its "
        "target that may take them",
    )
    assert [shortfall.spu for shortfall in result.unreachable if shortfall.kind == "replicas"] == [2]


# --------------------------------------------------------------------------- limits


def test_max_moves_per_spu_stops_the_plan_early_and_says_so() -> None:
    partitions = [(f"t-{index}", [index % 2]) for index in range(8)]
    result = plan([Spu(0), Spu(1), Spu(2), Spu(3)], partitions, max_moves_per_spu=1)
    assert (result.replica_moves, result.lower_bound) == (2, 4)
    assert result.after.replicas == {0: 3, 1: 3, 2: 1, 3: 1}
    assert {shortfall.reason for shortfall in result.unreachable if shortfall.kind == "replicas"} == {
        "maxMovesPerSpu 1 reached: plan again once these moves are done"
    }


# --------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("request_options", "message"),
    [
        ({"partitions": [("t-0", [0, 9])]}, "partition t-0 has a replica on SPU 9, which is not in spus: "
         "list every SPU that holds replicas (online false for one that is down)"),
        ({"partitions": [("t-0", [0]), ("t-0", [1])]}, "partition t-0 appears more than once"),
        ({"partitions": [("t-0", [1, 1])]}, "partition t-0 repeats an SPU: [1, 1]"),
        ({"partitions": [("t-0", [])]}, "partition t-0 must list at least one replica, got []"),
        ({"partitions": [("", [0])]}, "partition name '' must be a non-empty string"),
        ({"partitions": [("t-0", [True])]}, "partition t-0 has replica True, not an SPU id"),
        ({"decommissioning": [7]}, "decommissioning SPU 7 is not in spus (known: 0, 1)"),
        ({"max_moves_per_spu": 0}, "maxMovesPerSpu must be an integer of at least 1, got 0"),
        ({"spus": [Spu(0), Spu(0)]}, "SPU id 0 appears more than once in spus"),
        ({"spus": [Spu(0, "a"), Spu(1, "/dc/r")]}, "racks must be all paths (/dc/rack) or all plain labels, "
         "not a mix: SPU 0 has 'a' while SPU 1 has '/dc/r'"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_value(request_options: dict[str, object], message: str) -> None:
    options: dict[str, Any] = {"spus": [Spu(0), Spu(1)], "partitions": [("t-0", [0])], **request_options}
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.plan_rebalance(placement.RebalanceRequest(**options))
    assert str(caught.value) == message


def test_natural_order_of_partition_names() -> None:
    names = ["t-10", "t-2", "a1-3", "t-1x", "t", "t-", "u-²"]
    assert sorted(names, key=rebalance.natural_key) == ["a1-3", "t", "t-", "t-1x", "t-2", "t-10", "u-²"]


def test_the_planner_module_is_what_the_package_exports() -> None:
    assert placement.plan_rebalance is planner.plan


def test_a_pick_passes_over_the_replicas_its_receiver_holds_without_judging_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """With few SPUs a receiver soon holds most partitions at the front of every giver's list: a pick
    judged each of those again (about 250 judgements per move for 30,000 partitions on 12 SPUs, a
    plan of 3 to 5 s). Only those it may take, and the lookahead after the first, are judged now."""
    spus = [Spu(spu_id) for spu_id in range(14)]
    partitions = [(f"t-{index}", [index % 12, (index + 1) % 12, (index + 5) % 12]) for index in range(30_000)]
    judged = 0
    valid = planner._Planner._valid

    def counted(self: planner._Planner, *args: Any) -> bool:
        nonlocal judged
        judged += 1
        return valid(self, *args)

    monkeypatch.setattr(planner._Planner, "_valid", counted)
    result = plan(spus, partitions)
    assert result.replica_moves == result.lower_bound > 12_000
    assert judged < result.replica_moves * (planner._PREFERENCE_LOOKAHEAD + 2), judged / result.replica_moves


def test_a_leadership_path_stops_reading_a_leaders_partitions_once_they_can_reach_no_one_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The search for a chain of leadership handovers read every partition each leader on its way
    led, although a leader's partitions reach only the few SPUs that follow in them: here 16,005
    partition reads per search (249 searches), and 3.2 s of the 12-SPU, 3-rack plan of
    bench/rebalance.py's shape. A leader's partitions are now read only until every SPU they can
    hand a leadership to has been reached: 1,378 per search here."""
    spus = [Spu(spu_id, rack=f"r{spu_id % 3}") for spu_id in range(14)]
    partitions = [(f"t-{index}", [index % 12, (index + 1) % 12, (index + 5) % 12]) for index in range(30_000)]
    read = searches = 0
    search = planner._Planner._handover_path

    class Counted(list[list[int]]):
        def __getitem__(self, index: Any) -> Any:
            nonlocal read
            read += 1
            return super().__getitem__(index)

    def counted(self: planner._Planner, *args: Any) -> bool:
        nonlocal searches
        searches += 1
        rows, self.rows = self.rows, Counted(self.rows)
        try:
            return search(self, *args)
        finally:
            self.rows = rows

    monkeypatch.setattr(planner._Planner, "_handover_path", counted)
    result = plan(spus, partitions)
    assert result.replica_moves > 1_000 and searches > 100, (result.replica_moves, searches)
    assert read < searches * 4_000, read / searches
