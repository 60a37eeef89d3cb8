"""Multi-level rack awareness: the KIP's ring tree, exact maps and the spread it promises."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from controller.placement import multilevel
from tests.unit.placement import helpers

# The KIP's case: 3 DCs with 2 racks each (2 SPUs per rack here).
THREE_DCS = helpers.racked({spu_id: f"/dc{spu_id // 4 + 1}/r{spu_id // 2 % 2 + 1}" for spu_id in range(12)})


def test_three_dcs_two_racks_rf_three_puts_one_replica_in_each_dc() -> None:
    # Walk: dc1/r1 0, dc2/r1 4, dc3/r1 8, dc1/r2 2, dc2/r2 6, dc3/r2 10, then 1, 5, 9, 3, 7, 11.
    # From partition 4 on the sets repeat, and each is rotated so a member that has not led yet leads.
    assert helpers.place(THREE_DCS, 12, 3, strategy="multi-level") == [
        [0, 4, 8], [2, 6, 10], [1, 5, 9], [3, 7, 11],
        [4, 8, 0], [6, 10, 2], [5, 9, 1], [7, 11, 3],
        [8, 0, 4], [10, 2, 6], [9, 1, 5], [11, 3, 7],
    ]  # fmt: skip


def test_three_dcs_every_spu_leads_once_per_twelve_partitions() -> None:
    replica_map = helpers.place(THREE_DCS, 12, 3, strategy="multi-level")
    assert helpers.leader_counts(replica_map) == Counter(dict.fromkeys(range(12), 1))


def test_flat_racks_named_like_paths_would_not_separate_dcs_but_levels_do() -> None:
    # The KIP's complaint: racks /DC1/R1 .. as flat labels may put two replicas in one DC.
    flat = helpers.racked({spu.id: spu.rack.replace("/", "-") for spu in THREE_DCS if spu.rack})
    flat_map = helpers.place(flat, 12, 3)
    assert any(len({spu_id // 4 for spu_id in row}) < 3 for row in flat_map)
    levelled = helpers.place(THREE_DCS, 12, 3)
    assert all(len({spu_id // 4 for spu_id in row}) == 3 for row in levelled)


def test_unbalanced_tree_skips_a_full_data_centre() -> None:
    # /dc1 holds only SPU 0; once it has a replica of the partition the walk passes it by.
    spus = helpers.racked({0: "/dc1", 1: "/dc2", 2: "/dc2", 3: "/dc2"})
    assert helpers.place(spus, 4, 3, strategy="multi-level") == [[0, 1, 2], [3, 1, 0], [2, 3, 0], [1, 2, 0]]


def test_without_racks_the_root_is_one_ring() -> None:
    assert helpers.place(helpers.plain(4), 4, 2, strategy="multi-level") == [[0, 1], [2, 3], [1, 0], [3, 2]]


def test_racks_ignored_gives_the_same_single_ring() -> None:
    assert helpers.place(THREE_DCS, 4, 2, strategy="multi-level", ignore_rack_assignment=True) == [
        [0, 1], [2, 3], [4, 5], [6, 7],
    ]  # fmt: skip


def test_plain_labels_are_one_level() -> None:
    spus = helpers.racked({0: "b", 1: "a", 2: "b", 3: "a"})
    # Ring over racks a [1, 3], b [0, 2]: 1, 0, 3, 2, ...
    assert helpers.place(spus, 2, 2, strategy="multi-level") == [[1, 0], [3, 2]]


def test_start_index_continues_the_walk() -> None:
    # Start 1 is where one unconstrained pick leaves the rings: the walk begins at 4.
    assert helpers.place(THREE_DCS, 2, 3, strategy="multi-level", start_index=1) == [[4, 8, 2], [6, 10, 1]]


def test_depths_must_match() -> None:
    spus = helpers.racked({0: "/dc1/r1", 1: "/dc1/r2", 2: "/dc2"})
    with pytest.raises(placement.InvalidConfig) as caught:
        helpers.place(spus, 1, 2, strategy="multi-level")
    assert str(caught.value) == (
        "multi-level racks must all have the same depth: SPU 0 has '/dc1/r1' (2 levels), SPU 2 has '/dc2' (1 levels)"
    )


def test_empty_level_in_a_path_is_an_error() -> None:
    spus = helpers.racked({0: "/dc1//r1", 1: "/dc1/r2/"})
    with pytest.raises(placement.InvalidConfig) as caught:
        helpers.place(spus, 1, 1, strategy="multi-level")
    assert str(caught.value) == (
        "rack '/dc1//r1' of SPU 0 is not a valid path: write it as /level1/level2 with no empty level"
    )


def test_offline_spus_leave_the_tree() -> None:
    spus = [*THREE_DCS[:4], placement.SpuInfo(4, "/dc2/r1", online=False), *THREE_DCS[5:]]
    replica_map = helpers.place(spus, 30, 3, strategy="multi-level")
    assert all(4 not in row for row in replica_map)


# --------------------------------------------------------------------------- properties


@st.composite
def trees(draw: st.DrawFn, uniform: bool) -> list[placement.SpuInfo]:
    """SPUs in a random rack tree of 1-3 levels (uniform: every node of a level alike)."""
    depth = draw(st.integers(1, 3))
    widths = [draw(st.integers(1, 3)) for _ in range(depth)]
    paths: list[tuple[str, ...]] = [()]
    for width in widths:
        paths = [
            (*path, f"n{child}")
            for path in paths
            for child in range(width if uniform else draw(st.integers(1, 3)))
        ]
    spus: list[placement.SpuInfo] = []
    leaf_size = draw(st.integers(1, 3))
    for path in paths:
        for _ in range(leaf_size if uniform else draw(st.integers(1, 3))):
            spus.append(placement.SpuInfo(len(spus), "/" + "/".join(path)))
    return spus


def _levels(spu: placement.SpuInfo) -> tuple[str, ...]:
    assert spu.rack is not None
    return tuple(spu.rack[1:].split("/"))


@settings(max_examples=40, deadline=None)
@given(spus=trees(uniform=True), partitions=st.integers(1, 30), start_index=st.integers(0, 50), data=st.data())
def test_uniform_shortcut_is_the_ring_walk(
    spus: list[placement.SpuInfo], partitions: int, start_index: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    root = multilevel.build_tree(spus)
    assert multilevel.is_uniform(root)
    expected = multilevel.walk(root, partitions, replication_factor, start_index)
    assert multilevel._uniform_walk(multilevel.build_tree(spus), partitions, replication_factor, start_index) == expected


@settings(max_examples=60, deadline=None)
@given(spus=trees(uniform=False), partitions=st.integers(1, 25), start_index=st.integers(0, 50), data=st.data())
def test_siblings_differ_by_at_most_one_per_partition_unless_full(
    spus: list[placement.SpuInfo], partitions: int, start_index: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    replica_map = helpers.place(spus, partitions, replication_factor, strategy="multi-level", start_index=start_index)
    levels = {spu.id: _levels(spu) for spu in spus}
    capacity = Counter(prefix for path in levels.values() for prefix in (path[: depth + 1] for depth in range(len(path))))
    for row in replica_map:
        assert len(row) == replication_factor == len(set(row))
        used = Counter(prefix for spu_id in row for prefix in (levels[spu_id][: d + 1] for d in range(len(levels[spu_id]))))
        nodes = list(capacity)
        for node in nodes:
            for sibling in nodes:
                same_parent = len(node) == len(sibling) and node[:-1] == sibling[:-1]
                if same_parent and used[node] > used[sibling] + 1:
                    # Only a sibling whose every SPU already holds a replica may fall behind.
                    assert used[sibling] == capacity[sibling], (row, node, sibling)


@settings(max_examples=40, deadline=None)
@given(spus=trees(uniform=True), partitions=st.integers(1, 40), start_index=st.integers(0, 50), data=st.data())
def test_uniform_tree_counts_per_node_differ_by_at_most_one_at_every_level(
    spus: list[placement.SpuInfo], partitions: int, start_index: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    replica_map = helpers.place(spus, partitions, replication_factor, strategy="multi-level", start_index=start_index)
    levels = {spu.id: _levels(spu) for spu in spus}
    depth = len(levels[0])
    for level in range(1, depth + 1):
        counts = Counter({path[:level]: 0 for path in levels.values()})
        counts.update(levels[spu_id][:level] for row in replica_map for spu_id in row)
        assert max(counts.values()) - min(counts.values()) <= 1, (level, counts)
    per_spu = Counter(dict.fromkeys(levels, 0))
    per_spu.update(spu_id for row in replica_map for spu_id in row)
    assert max(per_spu.values()) - min(per_spu.values()) <= 1


@settings(max_examples=25, deadline=None)
@given(spus=trees(uniform=False), partitions=st.integers(1, 20), data=st.data())
def test_deterministic(spus: list[placement.SpuInfo], partitions: int, data: st.DataObject) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    first = helpers.place(spus, partitions, replication_factor, strategy="multi-level")
    assert helpers.place(list(reversed(spus)), partitions, replication_factor, strategy="multi-level") == first
