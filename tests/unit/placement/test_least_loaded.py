"""Least-loaded placement: fewest leaders for the leader, fewest followers for each follower."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from tests.unit.placement import helpers


def test_empty_cluster() -> None:
    # p1: SPU 1 has the fewest leaders; 0 the fewest followers. p2: leader 2, follower 3 ...
    assert helpers.place(helpers.plain(4), 6, 2, strategy="least-loaded") == [
        [0, 1], [1, 0], [2, 3], [3, 2], [0, 1], [1, 0],
    ]  # fmt: skip


def test_existing_partitions_of_other_topics_count() -> None:
    existing = [("t0", 0, (0, 1)), ("t0", 1, (0, 2))]
    # Leaders [2, 0, 0], followers [0, 1, 1] before the first pick.
    assert helpers.place(helpers.plain(3), 3, 2, strategy="least-loaded", existing=existing) == [[1, 0], [2, 0], [1, 2]]


def test_load_on_offline_or_unknown_spus_is_ignored() -> None:
    spus = [placement.SpuInfo(0), placement.SpuInfo(1, online=False), placement.SpuInfo(2)]
    existing = [placement.ExistingPartition("t", 0, (1, 9)), placement.ExistingPartition("t", 1, (0, 2))]
    # Only 0 (1 leader) and 2 (1 follower) carry load that matters.
    assert helpers.place(spus, 2, 2, strategy="least-loaded", existing=existing) == [[2, 0], [0, 2]]


def test_add_partitions_keeps_current_partitions_and_counts_them() -> None:
    result = placement.compute(
        placement.PlacementRequest(
            spus=helpers.plain(3),
            partitions=4,
            replication_factor=2,
            strategy="least-loaded",
            current_replica_map=[[0, 1], [1, 2]],
            start_index=7,
        )
    )
    assert result.replica_map == [[0, 1], [1, 2], [2, 0], [0, 1]]
    assert result.next_start_index == 9


def test_never_the_same_spu_twice_even_when_it_is_the_least_loaded_follower() -> None:
    # SPU 0 has fewest leaders AND fewest followers: the follower goes to the next one.
    existing = [("t", 0, (1, 2)), ("t", 1, (2, 1))]
    assert helpers.place(helpers.plain(3), 1, 3, strategy="least-loaded", existing=existing) == [[0, 1, 2]]


def test_rf_equal_to_spu_count_and_one_spu() -> None:
    assert helpers.place(helpers.plain(3), 3, 3, strategy="least-loaded") == [[0, 1, 2], [1, 0, 2], [2, 0, 1]]
    assert helpers.place([placement.SpuInfo(5)], 2, 1, strategy="least-loaded") == [[5], [5]]


@settings(max_examples=40, deadline=None)
@given(
    spu_count=st.integers(1, 12),
    partitions=st.integers(1, 40),
    existing=st.lists(st.lists(st.integers(0, 14), min_size=1, max_size=4, unique=True), max_size=12),
    data=st.data(),
)
def test_each_pick_is_the_least_loaded_eligible_spu(
    spu_count: int, partitions: int, existing: list[list[int]], data: st.DataObject
) -> None:
    """Replay the map pick by pick against the counts, the rule the issue states."""
    replication_factor = data.draw(st.integers(1, spu_count))
    offline = set(data.draw(st.lists(st.integers(0, spu_count + 2), max_size=2)))
    spus = [placement.SpuInfo(spu_id, online=spu_id not in offline) for spu_id in range(spu_count + 3)]
    online = [spu.id for spu in spus if spu.online]
    if len(online) < replication_factor:
        return
    replica_map = helpers.place(
        spus,
        partitions,
        replication_factor,
        strategy="least-loaded",
        existing=[("other", index, tuple(row)) for index, row in enumerate(existing)],
    )
    leaders = Counter(row[0] for row in existing)
    followers = Counter(spu_id for row in existing for spu_id in row[1:])
    for row in replica_map:
        assert len(row) == replication_factor == len(set(row))
        assert row[0] == min(online, key=lambda spu_id: (leaders[spu_id], spu_id))
        leaders[row[0]] += 1
        for position in range(1, replication_factor):
            candidates = [spu_id for spu_id in online if spu_id not in row[:position]]
            assert row[position] == min(candidates, key=lambda spu_id: (followers[spu_id], spu_id))
            followers[row[position]] += 1
