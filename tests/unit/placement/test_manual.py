"""Manual replica assignment: every rule of the seed's assignment file, each failure named."""

from __future__ import annotations

from typing import Any

import pytest

from controller import placement
from tests.unit.placement import helpers

REGISTERED = [0, 1, 2, 3]


def problems(assignment: list[object], registered: list[int] = REGISTERED) -> list[str]:
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.validate_manual(assignment, registered)
    assert caught.value.code == "InvalidConfig"
    return list(caught.value.problems)


def test_seed_example_is_valid_and_gives_the_replica_map() -> None:
    assignment = [{"id": 0, "replicas": [0, 1, 2]}, {"id": 1, "replicas": [1, 2, 0]}]
    assert placement.validate_manual(assignment, REGISTERED) == [[0, 1, 2], [1, 2, 0]]


def test_pairs_and_entries_of_any_shape() -> None:
    assignment = [placement.ManualPartition(0, [2, 1]), (1, [3, 0]), {"id": 2, "replicas": [0, 1]}]
    assert placement.validate_manual(assignment, REGISTERED) == [[2, 1], [3, 0], [0, 1]]


def test_ids_must_be_in_order() -> None:
    """Fluvio refuses ids out of order rather than re-sort them; so do we, naming them."""
    assert problems([(1, [3, 0]), (0, [2, 1])]) == [
        "assigned partition ids must be in sequence and without gaps: 1, 0 are out of order (ids given: 1, 0)"
    ]
    assert problems([(0, [0]), (2, [1]), (1, [2]), (3, [3])]) == [
        "assigned partition ids must be in sequence and without gaps: 2, 1 are out of order (ids given: 0, 2, 1, 3)"
    ]


def test_empty_assignment() -> None:
    assert problems([]) == ["replica assignment is empty: it needs at least one partition"]


def test_ids_must_start_at_zero() -> None:
    assert problems([(1, [0]), (2, [1])]) == [
        "assigned partition ids must be in sequence and without gaps: 0 is missing (ids given: 1, 2)"
    ]


def test_ids_must_not_have_gaps() -> None:
    assert problems([(0, [0]), (2, [1]), (3, [2])]) == [
        "assigned partition ids must be in sequence and without gaps: 1 is missing (ids given: 0, 2, 3)"
    ]


def test_ids_must_not_repeat() -> None:
    assert problems([(0, [0]), (0, [1])]) == [
        "partition 0: the id appears more than once",
        "assigned partition ids must be in sequence and without gaps: 1 is missing (ids given: 0)",
    ]


@pytest.mark.parametrize("bad_id", [-1, "0", 1.0, True, None])
def test_ids_must_be_non_negative_integers(bad_id: object) -> None:
    found = problems([(bad_id, [0])])
    assert found[0] == f"entry 0: partition id {bad_id!r} is not a non-negative integer"


def test_replicas_must_not_be_empty() -> None:
    assert problems([(0, [])]) == ["partition 0: replicas is empty, it needs at least one SPU"]


def test_replicas_must_be_a_list() -> None:
    assert problems([(0, "0,1")]) == ["partition 0: replicas '0,1' is not a list of SPU ids"]


def test_all_partitions_need_the_same_number_of_replicas() -> None:
    assert problems([(0, [0, 1]), (1, [1]), (2, [2, 3, 0])]) == [
        "partition 1 has 1 replicas but partition 0 has 2: every partition needs the same number of replicas",
        "partition 2 has 3 replicas but partition 0 has 2: every partition needs the same number of replicas",
    ]


def test_replicas_must_be_unique() -> None:
    assert problems([(0, [1, 2, 1])]) == ["partition 0: SPU 1 is listed more than once"]


@pytest.mark.parametrize("bad_spu", [-3, "1", 2.5, False])
def test_replicas_must_be_non_negative_integers(bad_spu: object) -> None:
    assert problems([(0, [0, bad_spu])]) == [
        f"partition 0: replica {bad_spu!r} is not a non-negative integer SPU id",
    ]


def test_every_spu_must_be_registered() -> None:
    assert problems([(0, [0, 7]), (1, [9, 1])]) == [
        "partition 0: SPU 7 is not registered (registered: 0, 1, 2, 3)",
        "partition 1: SPU 9 is not registered (registered: 0, 1, 2, 3)",
    ]


def test_all_problems_are_reported_together_in_the_message() -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.validate_manual([(0, [0, 0]), (1, [8])], REGISTERED)
    assert str(caught.value) == (
        "invalid replica assignment: partition 0: SPU 0 is listed more than once; "
        "partition 1: SPU 8 is not registered (registered: 0, 1, 2, 3); "
        "partition 1 has 1 replicas but partition 0 has 2: every partition needs the same number of replicas"
    )


def test_compute_with_manual_strategy_keeps_the_start_index() -> None:
    request = placement.PlacementRequest(
        spus=[*helpers.plain(2), placement.SpuInfo(2, online=False)],
        strategy="manual",
        replica_assignment=[(0, [2, 0]), (1, [0, 1])],
        start_index=5,
    )
    result = placement.compute(request)
    # Registered (not necessarily online) SPUs are accepted: the file is the operator's choice.
    assert result.replica_map == [[2, 0], [0, 1]]
    assert result.next_start_index == 5


def test_compute_validates_against_registered_ids_when_given() -> None:
    request = placement.PlacementRequest(
        spus=helpers.plain(3), strategy="manual", replica_assignment=[(0, [2])], registered_spu_ids=[0, 1]
    )
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.compute(request)
    assert str(caught.value) == "invalid replica assignment: partition 0: SPU 2 is not registered (registered: 0, 1)"


def test_compute_checks_partitions_and_replication_factor_when_given() -> None:
    base: dict[str, Any] = {"spus": helpers.plain(3), "strategy": "manual", "replica_assignment": [(0, [0, 1])]}
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.compute(placement.PlacementRequest(partitions=2, **base))
    assert str(caught.value) == "partitions is 2 but the replica assignment defines 1"
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.compute(placement.PlacementRequest(replication_factor=3, **base))
    assert str(caught.value) == "replication factor is 3 but the replica assignment gives 2 replicas per partition"


def test_manual_strategy_without_assignment() -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.compute(placement.PlacementRequest(spus=helpers.plain(1), strategy="manual"))
    assert str(caught.value) == "strategy manual needs a replicaAssignment"


def test_a_long_list_of_problems_is_cut_in_the_message_but_kept_whole() -> None:
    assignment = [(index, [9]) for index in range(12)]
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.validate_manual(assignment, REGISTERED)
    assert len(caught.value.problems) == 12
    assert str(caught.value).endswith(
        "partition 9: SPU 9 is not registered (registered: 0, 1, 2, 3); and 2 more"
    )


def test_a_row_has_at_most_the_largest_replication_factor() -> None:
    """As a computed topic's: a row of a million SPU ids was checked id by id (and a POST
    /v1/placement, which a read credential may send, has no topic model in front of it)."""
    registered = list(range(200))
    longest = list(range(128))
    assert placement.validate_manual([(0, longest)], registered) == [longest]
    assert problems([(0, longest), (1, list(range(1_000_000)))], registered) == [
        "partition 1: replicas lists 1000000 SPUs; at most 128 are allowed (the largest replication factor)"
    ]


def test_a_partition_id_past_32_bits_is_named_with_the_limit() -> None:
    """Fluvio's partition ids are u32: said as such, not only as a gap in the sequence."""
    assert problems([(2**32, [0])])[0] == (
        "entry 0: partition id 4294967296 is above 4294967295, the largest partition id (Fluvio's are 32-bit)"
    )
