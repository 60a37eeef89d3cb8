"""Kafka's assignment as AdminUtils implements it: the design's spread and Kafka's own test vectors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from controller.placement import kafka
from tests.unit.placement import helpers

# kafka-replication-design.txt: partition k on broker i = k mod n; "the jth replica of
# partition k will be assigned to broker (i + j + k) mod n" with k counting the partitions
# broker i leads. Brokers 0-4, p0 to p14 (the figure the page lost), RF 3.
DESIGN_P0_TO_P14 = [
    [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
    [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    [0, 3, 4], [1, 4, 0], [2, 0, 1], [3, 1, 2], [4, 2, 3],
]  # fmt: skip


def test_design_document_spread_on_five_brokers() -> None:
    assert helpers.place(helpers.plain(5), 15, 3, strategy="kafka") == DESIGN_P0_TO_P14


def test_design_document_failed_broker_load_spreads_over_all_survivors() -> None:
    # "if broker-0 goes down, partitions p0, p1, and p2 [the three it leads] can be served
    # from all remaining 4 brokers".
    replica_map = helpers.place(helpers.plain(5), 15, 3, strategy="kafka")
    led_by_zero = [row for row in replica_map if row[0] == 0]
    assert led_by_zero == [[0, 1, 2], [0, 2, 3], [0, 3, 4]]
    assert {spu_id for row in led_by_zero for spu_id in row[1:]} == {1, 2, 3, 4}
    assert placement.balance(replica_map, helpers.plain(5))["failover"] == {
        "perSpu": {"0": 1, "1": 1, "2": 1, "3": 1, "4": 1}, "max": 1, "worstSpu": 0,
    }  # fmt: skip


def test_kafka_admin_test_vector_rack_unaware() -> None:
    # AdminUtils.assignReplicasToBrokers(brokers 0-4, 10 partitions, RF 3, fixedStartIndex 0)
    # as asserted by Kafka's AdminTest.testReplicaAssignment.
    assert helpers.place(helpers.plain(5), 10, 3, strategy="kafka") == [
        [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
        [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    ]  # fmt: skip


def test_shift_keeps_growing_where_computed_wraps_its_gap() -> None:
    # Partition 15: Kafka's shift is 3, so followers are 1 + (3 + j) % 4 after the leader;
    # computed's gap wrapped back to 0 (gap_max = 3) and gives [0, 1, 2].
    replica_map = helpers.place(helpers.plain(5), 16, 3, strategy="kafka")
    assert replica_map[15] == [0, 4, 1]
    assert helpers.place(helpers.plain(5), 16, 3)[15] == [0, 1, 2]


def test_start_index_is_start_and_initial_shift() -> None:
    assert helpers.place(helpers.plain(5), 3, 3, strategy="kafka", start_index=2) == [[2, 0, 1], [3, 1, 2], [4, 2, 3]]


def test_rack_alternated_list_kafka_vector() -> None:
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert kafka.rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    del racks[5]
    assert kafka.rack_alternated(racks) == [0, 3, 1, 4, 2]


def test_kafka_admin_rack_aware_test_vector() -> None:
    # AdminRackAwareTest.testGetRackAlternatedBrokerListAndAssignReplicasToBrokers:
    # assignReplicasToBrokers(rackMap, 7 partitions, RF 3, fixedStartIndex 0, startPartitionId 0).
    spus = helpers.racked({0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"})
    assert helpers.place(spus, 7, 3, strategy="kafka") == [
        [0, 3, 1], [3, 1, 5], [1, 5, 4], [5, 4, 2], [4, 2, 0], [2, 0, 3], [0, 4, 2],
    ]  # fmt: skip


def test_rack_aware_with_unequal_racks_probes_past_a_taken_rack() -> None:
    # Alternated list [0 (a), 2 (b), 1 (a)]. Partition 2: leader 1 (a); the first probe lands
    # on 0, also in rack a, so it is skipped and 2 (rack b) is taken. Partition 3 starts
    # the second pass: shift 1, base 1 * 2 racks.
    spus = helpers.racked({0: "a", 1: "a", 2: "b"})
    assert helpers.place(spus, 4, 2, strategy="kafka") == [[0, 2], [2, 1], [1, 2], [0, 2]]


def test_rack_aware_when_rf_exceeds_racks_fills_from_any_rack() -> None:
    spus = helpers.racked({0: "a", 1: "a", 2: "b", 3: "b"})
    # Alternated [0, 2, 1, 3]; after one replica per rack, any unused broker is taken.
    assert helpers.place(spus, 4, 3, strategy="kafka") == [[0, 2, 1], [2, 1, 3], [1, 3, 0], [3, 0, 2]]


def test_partial_racks_are_an_error() -> None:
    spus = [placement.SpuInfo(0, "a"), placement.SpuInfo(1), placement.SpuInfo(2, "b")]
    with pytest.raises(placement.InvalidConfig) as caught:
        helpers.place(spus, 1, 2, strategy="kafka")
    assert "SPU 1 has none" in str(caught.value)
    assert helpers.place(spus, 3, 2, strategy="kafka", ignore_rack_assignment=True) == [[0, 1], [1, 2], [2, 0]]


def test_one_broker_and_rf_equal_to_brokers() -> None:
    assert helpers.place([placement.SpuInfo(4)], 2, 1, strategy="kafka") == [[4], [4]]
    assert helpers.place(helpers.plain(3), 4, 3, strategy="kafka") == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]]


def test_offline_brokers_are_skipped() -> None:
    spus = helpers.plain(4)
    spus[1] = placement.SpuInfo(1, online=False)
    assert helpers.place(spus, 3, 2, strategy="kafka") == [[0, 2], [2, 3], [3, 0]]


@settings(max_examples=40, deadline=None)
@given(
    racks=st.integers(1, 5),
    per_rack=st.integers(1, 5),
    replication_factor=st.integers(1, 6),
    partitions=st.integers(1, 40),
    start_index=st.integers(0, 60),
)
def test_equal_racks_shortcut_matches_probing_every_partition(
    racks: int, per_rack: int, replication_factor: int, partitions: int, start_index: int
) -> None:
    n = racks * per_rack
    replication_factor = min(replication_factor, n)
    rack_of = {spu_id: f"r{spu_id % racks}" for spu_id in range(n)}
    arranged = kafka.rack_alternated(rack_of)
    rack_at = [int(rack_of[broker][1:]) for broker in arranged]
    probed = [
        [
            arranged[position]
            for position in kafka._probe(
                (partition + start_index) % n,
                (start_index + partition // n) * racks,
                replication_factor,
                rack_at,
                racks,
            )
        ]
        for partition in range(partitions)
    ]
    assert kafka.rack_aware(rack_of, partitions, replication_factor, start_index) == probed
