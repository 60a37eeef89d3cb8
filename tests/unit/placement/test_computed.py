"""Computed replica assignment: the seed's tables and examples, exactly, plus edge cases."""

from __future__ import annotations

import pytest

from controller import placement
from controller.placement import computed
from tests.unit.placement import helpers

# fluvio-replica-assignment.txt, "Computed Replica Assignment": 5 SPUs, 16 partitions, RF 3.
SEED_TABLE = [
    [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
    [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    [0, 3, 4], [1, 4, 0], [2, 0, 1], [3, 1, 2], [4, 2, 3],
    [0, 1, 2],
]  # fmt: skip

# Example 1 - balanced rack distribution: 12 SPUs, racks a..d of 3.
EXAMPLE_1_RACKS = {spu_id: f"rack-{'abcd'[spu_id // 3]}" for spu_id in range(12)}
EXAMPLE_1_MAP = [
    [0, 4, 8, 9], [4, 8, 9, 1], [8, 9, 1, 5], [9, 1, 5, 6],
    [1, 5, 6, 10], [5, 6, 10, 2], [6, 10, 2, 3], [10, 2, 3, 7],
    [2, 3, 7, 11], [3, 7, 11, 0], [7, 11, 0, 4], [11, 0, 4, 8],
]  # fmt: skip

# Example 2 - unbalanced: rack-a: 0; rack-b: 1, 2; rack-c: 3, 4, 5.
EXAMPLE_2_RACKS = {0: "rack-a", 1: "rack-b", 2: "rack-b", 3: "rack-c", 4: "rack-c", 5: "rack-c"}
EXAMPLE_2_MAP = [[3, 2, 0], [2, 0, 4], [0, 4, 1], [4, 1, 5], [1, 5, 3], [5, 3, 2]]


def test_seed_table_five_spus_sixteen_partitions() -> None:
    result = placement.compute(placement.PlacementRequest(spus=helpers.plain(5), partitions=16, replication_factor=3))
    assert result.replica_map == SEED_TABLE
    assert result.next_start_index == 16


def test_seed_gap_column_is_the_follower_shift() -> None:
    # The table's "gaps" column: 0 for indexes 0-4, 1 for 5-9, 2 for 10-14, back to 0 at 15.
    gaps = [(row[1] - row[0] - 1) % 5 for row in SEED_TABLE]
    assert gaps == [0] * 5 + [1] * 5 + [2] * 5 + [0]


def test_seed_chaining_example_next_run_starts_at_nine() -> None:
    # "if the last replica assignment completed at index 8, the next run starts at index 9 and
    # partition 0 is assigned replica: [4, 1, 2]".
    first = placement.compute(placement.PlacementRequest(spus=helpers.plain(5), partitions=9, replication_factor=3))
    assert first.next_start_index == 9
    second = placement.compute(
        placement.PlacementRequest(
            spus=helpers.plain(5), partitions=3, replication_factor=3, start_index=first.next_start_index
        )
    )
    assert second.replica_map == [[4, 1, 2], [0, 3, 4], [1, 4, 0]]
    assert second.next_start_index == 12


@pytest.mark.parametrize("racks", [None, EXAMPLE_1_RACKS], ids=["round-robin", "rack-aware"])
def test_chained_runs_continue_the_single_run(racks: dict[int, str] | None) -> None:
    spus = helpers.racked(racks) if racks else helpers.plain(12)
    whole = helpers.place(spus, 30, 3)
    first = placement.compute(placement.PlacementRequest(spus=spus, partitions=11, replication_factor=3))
    rest = placement.compute(
        placement.PlacementRequest(spus=spus, partitions=19, replication_factor=3, start_index=first.next_start_index)
    )
    assert first.replica_map + rest.replica_map == whole
    assert rest.next_start_index == 30


def test_rack_example_1_sequence_and_map() -> None:
    spus = helpers.racked(EXAMPLE_1_RACKS)
    assert computed.rack_sequence(spus) == [0, 4, 8, 9, 1, 5, 6, 10, 2, 3, 7, 11]
    assert helpers.place(spus, 12, 4) == EXAMPLE_1_MAP


def test_rack_example_1_leaders_and_followers_per_rack() -> None:
    spus = helpers.racked(EXAMPLE_1_RACKS)
    report = placement.balance(EXAMPLE_1_MAP, spus)
    # The seed's last two rows: Leaders 3 3 3 3, Followers 9 9 9 9.
    assert report["rackLeaders"] == {
        "perRack": {"rack-a": 3, "rack-b": 3, "rack-c": 3, "rack-d": 3}, "min": 3, "max": 3, "spread": 0,
    }  # fmt: skip
    assert report["rackReplicas"] == {
        "perRack": {"rack-a": 12, "rack-b": 12, "rack-c": 12, "rack-d": 12}, "min": 12, "max": 12, "spread": 0,
    }  # fmt: skip


def test_rack_example_2_sequence_and_map() -> None:
    spus = helpers.racked(EXAMPLE_2_RACKS)
    assert computed.rack_sequence(spus) == [3, 2, 0, 4, 1, 5]
    assert helpers.place(spus, 6, 3) == EXAMPLE_2_MAP


def test_rack_example_2_leaders_and_followers_per_rack() -> None:
    report = placement.balance(EXAMPLE_2_MAP, helpers.racked(EXAMPLE_2_RACKS))
    # Leaders 3 2 1 and followers 6 4 2 for rack-c, rack-b, rack-a.
    assert report["rackLeaders"] == {"perRack": {"rack-a": 1, "rack-b": 2, "rack-c": 3}, "min": 1, "max": 3, "spread": 2}
    assert report["rackReplicas"] == {"perRack": {"rack-a": 3, "rack-b": 6, "rack-c": 9}, "min": 3, "max": 9, "spread": 6}


def test_rack_sequence_orders_equal_sized_racks_by_name_and_ids_within() -> None:
    spus = helpers.racked({7: "zeta", 2: "alpha", 5: "zeta", 9: "alpha"})
    # Matrix: alpha [2, 9], zeta [5, 7]; diagonal walk: (0,0)=2, (1,1)=7, (0,1)=9, (1,0)=5.
    assert computed.rack_sequence(spus) == [2, 7, 9, 5]


def test_rack_sequence_of_racks_of_four_two_and_two() -> None:
    # Matrix a [0, 1, 2, 3], b [4, 5], c [6, 7] (3 rows, 4 columns); short racks wrap, so the
    # walk meets 5 and 6 a second time and skips them.
    spus = helpers.racked({0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "c", 7: "c"})
    assert computed.rack_sequence(spus) == [0, 5, 6, 1, 4, 7, 2, 3]


def test_rf_equal_to_spu_count() -> None:
    assert helpers.place(helpers.plain(4), 5, 4) == [
        [0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2], [0, 1, 2, 3],
    ]  # fmt: skip


def test_rf_one() -> None:
    assert helpers.place(helpers.plain(3), 4, 1) == [[0], [1], [2], [0]]


def test_one_spu() -> None:
    assert helpers.place([placement.SpuInfo(id=7)], 3, 1) == [[7], [7], [7]]


def test_more_partitions_than_spus_with_two_passes_of_gaps() -> None:
    # n = 3, RF 2: gap_max 2, so the gap goes 0, 1, 0 over the passes.
    assert helpers.place(helpers.plain(3), 7, 2) == [[0, 1], [1, 2], [2, 0], [0, 2], [1, 0], [2, 1], [0, 1]]


def test_start_index_beyond_spu_count() -> None:
    result = placement.compute(
        placement.PlacementRequest(spus=helpers.plain(5), partitions=3, replication_factor=3, start_index=23)
    )
    assert result.replica_map == [[3, 0, 1], [4, 1, 2], [0, 3, 4]]
    assert result.next_start_index == 26


def test_offline_spus_are_skipped_and_ids_sorted() -> None:
    spus = [
        placement.SpuInfo(id=30),
        placement.SpuInfo(id=10),
        placement.SpuInfo(id=25, online=False),
        placement.SpuInfo(id=20),
        placement.SpuInfo(id=5, online=False),
    ]
    assert helpers.place(spus, 4, 2) == [[10, 20], [20, 30], [30, 10], [10, 30]]


def test_offline_spu_is_never_a_replica_even_when_racks_are_used() -> None:
    spus = helpers.racked(EXAMPLE_2_RACKS)
    spus[3] = placement.SpuInfo(id=3, rack="rack-c", online=False)
    # Eligible racks: rack-c [4, 5], rack-b [1, 2], rack-a [0]: sequence 1, 5, 0, 2, 4.
    assert computed.rack_sequence([spu for spu in spus if spu.online]) == [1, 5, 0, 2, 4]
    assert helpers.place(spus, 5, 3) == [[1, 5, 0], [5, 0, 2], [0, 2, 4], [2, 4, 1], [4, 1, 5]]


def test_partial_racks_are_an_error_naming_the_spus_without_one() -> None:
    spus = [placement.SpuInfo(0, "r1"), placement.SpuInfo(1), placement.SpuInfo(2, "r2"), placement.SpuInfo(3)]
    with pytest.raises(placement.InvalidConfig) as caught:
        helpers.place(spus, 2, 2)
    assert caught.value.code == "InvalidConfig"
    assert str(caught.value) == (
        "rack-aware placement needs a rack on every online SPU, but SPUs 1, 3 have none: give SPUs 1, 3 a rack "
        "(sc spu set-rack ID --rack R), or create the topic with ignoreRackAssignment: true "
        "(sc topic create --ignore-rack-assignment)"
    )
    assert caught.value.fix is placement.Fix.CLUSTER  # an SPU change makes the same topic placeable


def test_partial_racks_with_racks_ignored_is_plain_round_robin() -> None:
    spus = [placement.SpuInfo(0, "r1"), placement.SpuInfo(1), placement.SpuInfo(2, "r2")]
    assert helpers.place(spus, 3, 2, ignore_rack_assignment=True) == [[0, 1], [1, 2], [2, 0]]


def test_racks_on_offline_spus_only_do_not_make_racks_partial() -> None:
    spus = [placement.SpuInfo(0), placement.SpuInfo(1), placement.SpuInfo(2, "r1", online=False)]
    assert helpers.place(spus, 2, 2) == [[0, 1], [1, 0]]


def test_ignore_rack_assignment_gives_the_rack_unaware_table() -> None:
    spus = helpers.racked({spu_id: f"r{spu_id % 2}" for spu_id in range(5)})
    assert helpers.place(spus, 16, 3, ignore_rack_assignment=True) == SEED_TABLE


def test_path_racks_are_placed_by_the_multi_level_strategy() -> None:
    spus = helpers.racked({spu_id: f"/dc{spu_id % 3}/r{spu_id // 3 % 2}" for spu_id in range(6)})
    assert helpers.place(spus, 6, 3) == helpers.place(spus, 6, 3, strategy="multi-level")
    assert helpers.place(spus, 6, 3) == [[0, 1, 2], [3, 4, 5], [1, 2, 0], [4, 5, 3], [2, 0, 1], [5, 3, 4]]


def test_paths_mixed_with_plain_labels_is_an_error() -> None:
    spus = helpers.racked({0: "/dc1/r1", 1: "r2", 2: "/dc2/r1"})
    with pytest.raises(placement.InvalidConfig) as caught:
        helpers.place(spus, 1, 2)
    assert str(caught.value) == (
        "racks must be all paths (/dc/rack) or all plain labels, not a mix: SPU 1 ('r2') is not a path "
        "while SPU 0 has '/dc1/r1'"
    )
