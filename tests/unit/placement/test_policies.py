"""Placement policies: parsing and compaction as the seed describes, and its three examples exactly."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from controller.placement import cluster, model, policies
from store import models
from tests.unit.placement import helpers

# The seed's cluster: node-0x1 .. node-0x6 in sites 1-3, as SPU ids 1 .. 6.
SITES = helpers.racked({1: "site1", 2: "site1", 3: "site2", 4: "site2", 5: "site3", 6: "site3"})


def place(spus: list[placement.SpuInfo], partitions: int, replication_factor: int, text: str, **options: object):
    return helpers.place(spus, partitions, replication_factor, strategy="policies", policies=text, **options)


# --------------------------------------------------------------------------- parsing


def test_seed_compaction_example() -> None:
    text = "preferred_nodes=1,2,3;node=exclusive;shard=balanced;preferred_node=2,3,4;node=colocated"
    assert placement.compact_policies(text) == "shard=balanced;preferred_node=2,3,4;node=colocated"
    assert placement.parse_policies(text) == placement.Policies(
        node="colocated", shard="balanced", preferred_nodes=(2, 3, 4)
    )


def test_defaults() -> None:
    assert placement.parse_policies(None) == placement.Policies(node="balanced", shard="colocated", preferred_nodes=())
    assert placement.parse_policies(" ; ") == placement.Policies()
    assert placement.compact_policies("") == ""


def test_later_key_overrides_and_spaces_are_trimmed() -> None:
    assert placement.parse_policies(" node = exclusive ; node=balanced; preferred_nodes = 3, 1 ;") == placement.Policies(
        node="balanced", preferred_nodes=(3, 1)
    )
    assert placement.compact_policies(" node = exclusive ; shard=balanced; node=balanced") == "shard=balanced;node=balanced"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes=balanced", "placement policy 'nodes=balanced': unknown key 'nodes' (known: node, shard, preferred_nodes)"),
        ("node=spread", "placement policy 'node=spread': node must be colocated, balanced or exclusive, not 'spread'"),
        ("shard=", "placement policy 'shard=': shard must be colocated, balanced or exclusive, not ''"),
        ("node", "placement policy 'node' is not key=value"),
        ("preferred_nodes=1,x", "placement policy preferred_nodes=1,x: 'x' is not an SPU id"),
        ("preferred_node=1,-2", "placement policy preferred_node=1,-2: '-2' is not an SPU id"),
        ("preferred_nodes=2,2", "placement policy preferred_nodes=2,2: SPU 2 is listed twice"),
        # Not int(): "²" is a digit to isdigit() and not to int(), which also refuses 4,301 digits.
        ("preferred_nodes=1,²", "placement policy preferred_nodes=1,²: '²' is not an SPU id"),
        ("preferred_nodes=2147483648", "placement policy preferred_nodes=2147483648: '2147483648' is not an SPU id"),
        (
            "preferred_nodes=" + ",".join(map(str, range(5000))) + ",0",
            "placement policy preferred_nodes=0,1,2,3,4,5,6,7,8,9,... (23891 characters): SPU 0 is listed twice",
        ),
        (
            "preferred_nodes=" + "9" * 5000,
            "placement policy preferred_nodes=99999999999999999999... (5000 characters): "
            "'99999999999999999999... (5000 characters)' is not an SPU id",
        ),
    ],
)
def test_malformed_policies_are_clear_errors(text: str, message: str) -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.parse_policies(text)
    assert str(caught.value) == message
    with pytest.raises(placement.InvalidConfig):
        place(SITES, 1, 1, text)


def test_a_long_preferred_nodes_list_is_parsed_in_one_pass() -> None:
    """Each id was looked up in the list of those before it: 40,000 ids (229 KB, in a topic's spec or a
    placement request a read credential may send) took 13 s of the SC's CPU, 16 MiB of them days."""
    ids = list(range(10_000))  # as many as the policies' length limit allows
    text = "preferred_nodes=" + ",".join(map(str, ids))
    assert len(text) <= models.MAX_POLICIES_LENGTH
    assert placement.parse_policies(text).preferred_nodes == tuple(ids)
    with pytest.raises(placement.InvalidConfig, match=f"at most {models.MAX_POLICIES_LENGTH} are allowed"):
        placement.parse_policies(text + "," + ",".join(map(str, range(10_000, 20_000))))


# --------------------------------------------------------------------------- the seed's examples


def test_zig_zag_order_of_the_seed() -> None:
    # "Picks nodes from different sites in a zig-zag order [0x1, 0x3, 0x5, 0x2, 0x4, 0x6]".
    assert cluster.alternate([[1, 2], [3, 4], [5, 6]]) == [1, 3, 5, 2, 4, 6]
    assert cluster.alternate([[0, 5], [3], [1, 2]]) == [0, 3, 1, 5, 2]
    assert cluster.alternate([]) == []


def test_example_1_default_placement_zig_zag_and_colocated_shards() -> None:
    # node-0x1: (shard-0, replica-0), (shard-1, replica-0); 0x3: replica-1; 0x5: replica-2.
    assert place(SITES, 2, 3, "") == [[1, 3, 5], [1, 3, 5]]


def test_example_2_shard_exclusive() -> None:
    assert place(SITES, 2, 3, "shard=exclusive") == [[1, 3, 5], [2, 4, 6]]


def test_example_3_node_exclusive_with_rf_five_fails() -> None:
    with pytest.raises(placement.InsufficientResources) as caught:
        place(SITES, 1, 5, "node=exclusive")
    assert caught.value.code == "InsufficientResources"
    assert str(caught.value) == (
        "placement policy node=exclusive needs 5 locations (one per replica) but the online SPUs are in 3 "
        "(site1, site2, site3): 2 more needed"
    )


# --------------------------------------------------------------------------- the other rules


def test_shard_balanced_spreads_replicas_and_leaders() -> None:
    replica_map = place(SITES, 4, 3, "shard=balanced")
    assert replica_map == [[1, 3, 5], [2, 4, 6], [3, 1, 5], [4, 2, 6]]
    assert helpers.replica_counts(replica_map) == Counter(dict.fromkeys(range(1, 7), 2))


def test_shard_exclusive_needs_a_node_per_replica() -> None:
    with pytest.raises(placement.InsufficientResources) as caught:
        place(SITES, 3, 3, "shard=exclusive")
    assert str(caught.value) == (
        "placement policy shard=exclusive needs 9 free online SPUs (3 partitions x replication factor 3, "
        "one replica per SPU), only 6 are free: 3 more needed"
    )
    assert caught.value.needed_spus == 3


def test_node_colocated_keeps_a_partition_in_one_location() -> None:
    spus = helpers.racked({1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "c"})
    # Zig-zag a, b, c: [1, 2, 4, 3, 5, 6]; site a is too small for RF 2, so 2 leads in b.
    assert place(spus, 2, 2, "node=colocated") == [[2, 3], [2, 3]]
    with pytest.raises(placement.InsufficientResources) as caught:
        place(spus, 1, 4, "node=colocated")
    assert str(caught.value) == (
        "placement policy node=colocated needs 4 online SPUs in one location, the largest (c) has 3"
    )


def test_node_colocated_with_shard_exclusive_uses_one_location_per_partition() -> None:
    spus = helpers.racked({1: "a", 2: "b", 3: "b", 4: "c", 5: "c", 6: "c"})
    assert place(spus, 2, 2, "node=colocated;shard=exclusive") == [[2, 3], [4, 5]]
    with pytest.raises(placement.InsufficientResources) as caught:
        place(spus, 3, 2, "node=colocated;shard=exclusive")
    assert str(caught.value) == (
        "placement policies node=colocated and shard=exclusive need 3 groups of 2 free SPUs in one location; "
        "the free SPUs per location (a: 1, b: 2, c: 3) hold only 2"
    )


def test_node_exclusive_with_shard_exclusive_fills_the_fullest_locations_first() -> None:
    spus = helpers.racked({1: "a", 2: "b", 3: "c", 4: "c"})
    # Following the zig-zag [1, 2, 3, 4] alone, partition 0 would take a and b and leave
    # partition 1 with c only. Taking the location with most free SPUs first fits both.
    assert place(spus, 2, 2, "node=exclusive;shard=exclusive") == [[3, 1], [2, 4]]


def test_node_exclusive_with_shard_exclusive_that_cannot_fit() -> None:
    spus = helpers.racked({1: "a", 2: "a", 3: "a", 4: "a", 5: "b", 6: "c"})
    with pytest.raises(placement.InsufficientResources) as caught:
        place(spus, 3, 2, "node=exclusive;shard=exclusive")
    assert str(caught.value) == (
        "placement policies node=exclusive and shard=exclusive need 3 partitions x 2 replicas, each replica "
        "of a partition in its own location and on its own SPU; the free SPUs per location (a: 4, b: 1, c: 1) "
        "cannot hold that"
    )


def test_preferred_nodes_come_first_in_the_order_given() -> None:
    assert place(SITES, 2, 3, "preferred_nodes=6,2") == [[6, 2, 3], [6, 2, 3]]
    assert place(SITES, 2, 2, "preferred_nodes=6,2;shard=balanced") == [[6, 2], [6, 2]]


def test_preferred_nodes_yield_to_hard_policies() -> None:
    # 2 shares site1 with nothing chosen yet but 1 is in site1 too: node=exclusive skips it.
    assert place(SITES, 1, 3, "preferred_nodes=1,2;node=exclusive") == [[1, 3, 5]]


def test_unknown_preferred_node_is_an_error_and_an_offline_one_is_skipped() -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        place(SITES, 1, 1, "preferred_nodes=9,1")
    assert str(caught.value) == "placement policy preferred_nodes names SPU 9, which is not registered"
    spus = [*SITES[:1], placement.SpuInfo(2, "site1", online=False), *SITES[2:]]
    assert place(spus, 1, 2, "preferred_nodes=2") == [[1, 3]]


def test_start_index_rotates_the_zig_zag() -> None:
    # Zig-zag [1, 3, 5, 2, 4, 6] rotated by 1: [3, 5, 2, 4, 6, 1].
    assert place(SITES, 1, 3, "", start_index=1) == [[3, 5, 2]]


def test_location_is_the_top_level_of_a_rack_path() -> None:
    spus = helpers.racked({1: "/site1/r1", 2: "/site1/r2", 3: "/site2/r1", 4: "/site2/r2"})
    assert place(spus, 1, 2, "node=exclusive") == [[1, 3]]


def test_location_policies_need_racks() -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        place(helpers.plain(3), 1, 2, "node=exclusive")
    assert str(caught.value) == (
        "placement policy node=exclusive places replicas by location, but the online SPUs have no rack "
        "(or racks are ignored): give every SPU a rack or use node=balanced"
    )
    # Without racks every SPU is in one location: node=balanced has nothing to spread over.
    assert place(helpers.plain(3), 2, 2, "shard=balanced") == [[0, 1], [2, 0]]


def test_add_partitions_with_colocated_shards_join_partition_zero() -> None:
    result = placement.compute(
        placement.PlacementRequest(
            spus=SITES, partitions=3, replication_factor=3, strategy="policies", current_replica_map=[[2, 4, 6]]
        )
    )
    assert result.replica_map == [[2, 4, 6], [2, 4, 6], [2, 4, 6]]
    offline = [*SITES[:3], placement.SpuInfo(4, "site2", online=False), *SITES[4:]]
    with pytest.raises(placement.InsufficientResources) as caught:
        placement.compute(
            placement.PlacementRequest(
                spus=offline, partitions=2, replication_factor=3, strategy="policies", current_replica_map=[[2, 4, 6]]
            )
        )
    assert str(caught.value) == (
        "placement policy shard=colocated puts new partitions on partition 0's SPUs 2, 4, 6, but 4 is offline"
    )


def test_add_partitions_with_exclusive_shards_avoid_the_current_ones() -> None:
    result = placement.compute(
        placement.PlacementRequest(
            spus=SITES,
            partitions=2,
            replication_factor=3,
            strategy="policies",
            policies="shard=exclusive",
            current_replica_map=[[1, 3, 5]],
        )
    )
    assert result.replica_map == [[1, 3, 5], [2, 4, 6]]


def test_default_strategy_with_policies_means_policies() -> None:
    assert helpers.place(SITES, 2, 3, policies="shard=exclusive") == [[1, 3, 5], [2, 4, 6]]


# --------------------------------------------------------------------------- properties


@st.composite
def clusters(draw: st.DrawFn) -> list[placement.SpuInfo]:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    spus: list[placement.SpuInfo] = []
    for location, size in enumerate(sizes):
        for _ in range(size):
            spus.append(placement.SpuInfo(len(spus), f"site{location}"))
    return spus


def _run(spus: list[placement.SpuInfo], count: int, replication_factor: int, text: str, start: int) -> model.Run:
    request = placement.PlacementRequest(
        spus=spus, partitions=count, replication_factor=replication_factor, strategy="policies", policies=text
    )
    return model.Run(tuple(spus), count, 0, replication_factor, start, request)


@settings(max_examples=60, deadline=None)
@given(
    spus=clusters(),
    count=st.integers(1, 12),
    node=st.sampled_from(["balanced", "exclusive"]),
    preferred=st.lists(st.integers(0, 6), max_size=3, unique=True),
    start=st.integers(0, 20),
    data=st.data(),
)
def test_heap_version_matches_the_literal_greedy(
    spus: list[placement.SpuInfo], count: int, node: str, preferred: list[int], start: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    preferred = [spu_id for spu_id in preferred if spu_id < len(spus)]
    text = f"node={node};shard=balanced;preferred_nodes={','.join(map(str, preferred))}"
    run = _run(spus, count, replication_factor, text, start)
    parsed = policies.parse_policies(text)
    nodes = policies._cluster(run, parsed)
    try:
        expected = policies._greedy(run, parsed, nodes)
    except placement.InsufficientResources:
        with pytest.raises(placement.InsufficientResources):
            policies._balanced_spread(run, parsed, nodes)
        return
    assert policies._balanced_spread(run, parsed, nodes) == expected


@settings(max_examples=60, deadline=None)
@given(spus=clusters(), count=st.integers(1, 6), data=st.data())
def test_exclusive_pair_succeeds_exactly_when_the_counting_condition_holds(
    spus: list[placement.SpuInfo], count: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    sizes = Counter(spu.rack for spu in spus)
    feasible = replication_factor <= len(sizes) and sum(min(size, count) for size in sizes.values()) >= (
        count * replication_factor
    )
    try:
        replica_map = place(spus, count, replication_factor, "node=exclusive;shard=exclusive")
    except placement.InsufficientResources:
        assert not feasible
        return
    assert feasible
    rack_of = {spu.id: spu.rack for spu in spus}
    assert all(len({rack_of[spu_id] for spu_id in row}) == replication_factor for row in replica_map)
    assert len({spu_id for row in replica_map for spu_id in row}) == count * replication_factor
