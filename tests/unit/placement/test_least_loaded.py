"""Least-loaded placement: fewest leaders for the leader, fewest followers for each follower."""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any
from unittest import mock


from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from controller.placement import least_loaded, spread
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


# --------------------------------------------------------------------------- with racks


def issue_cluster() -> list[placement.SpuInfo]:
    """The issue's cluster: 12 SPUs in 4 racks, SPU i in rack r(i mod 4)."""
    return helpers.racked({spu_id: f"r{spu_id % 4}" for spu_id in range(12)})


def test_racks_and_failover_on_the_issues_cluster() -> None:
    # 48 partitions at RF 3: rack-unaware, 16 partitions had two replicas in one rack and one
    # survivor took 4 of a failed SPU's leaderships. Now every partition spans 3 racks, and each
    # SPU's 4 leaderships go to 4 different survivors (1 each: the least a failure can give).
    spus = issue_cluster()
    report = placement.balance(helpers.place(spus, 48, 3, strategy="least-loaded"), spus)
    assert report["rackViolations"] == {"count": 0, "partitions": []}
    assert report["failover"] == {"perSpu": {str(spu_id): 1 for spu_id in range(12)}, "max": 1, "worstSpu": 0}
    assert report["replicas"] == {"perSpu": {str(spu_id): 12 for spu_id in range(12)}, "min": 12, "max": 12, "spread": 0}
    assert report["leaders"] == {"perSpu": {str(spu_id): 4 for spu_id in range(12)}, "min": 4, "max": 4, "spread": 0}
    assert report["rackReplicas"] == {"perRack": {"r0": 36, "r1": 36, "r2": 36, "r3": 36}, "min": 36, "max": 36, "spread": 0}


def test_ignoring_racks_keeps_the_rack_unaware_picks() -> None:
    spus = issue_cluster()
    ignored = helpers.place(spus, 48, 3, strategy="least-loaded", ignore_rack_assignment=True)
    assert ignored == helpers.place(helpers.plain(12), 48, 3, strategy="least-loaded")
    report: dict[str, Any] = placement.balance(ignored, spus)
    assert report["rackViolations"]["count"] == 16
    assert report["failover"]["max"] == 4


def test_followers_go_to_other_racks_round_the_spus() -> None:
    # Leaders by fewest leaders (0..5); each first follower is the least-followed SPU of another
    # rack, from the SPU after the leader on: 0 takes 1, 1 takes 2 (its own rack r1 holds 1
    # and 4)... SPU i is in rack r(i mod 3).
    spus = helpers.racked({spu_id: f"r{spu_id % 3}" for spu_id in range(6)})
    assert helpers.place(spus, 6, 2, strategy="least-loaded") == [[0, 1], [1, 0], [2, 3], [3, 2], [4, 5], [5, 4]]


def test_path_racks_spread_over_sites_then_leaf_racks() -> None:
    # SPU i is in /dc(i mod 2)/r(i mod 4): two sites of two racks each. RF 3 takes both sites,
    # then the rack of the leader's site not yet used.
    spus = helpers.racked({spu_id: f"/dc{spu_id % 2}/r{spu_id % 4}" for spu_id in range(8)})
    replica_map = helpers.place(spus, 8, 3, strategy="least-loaded")
    assert replica_map == [
        [0, 1, 2], [1, 0, 3], [2, 5, 4], [3, 6, 0], [4, 7, 1], [5, 2, 7], [6, 3, 4], [7, 6, 5],
    ]  # fmt: skip
    for row in replica_map:
        assert len({spu_id % 2 for spu_id in row}) == 2  # both sites
        assert len({spu_id % 4 for spu_id in row}) == 3  # three different leaf racks


def test_existing_load_still_counts_with_racks() -> None:
    # The README's example with racks: topic big leads twice on SPU 0, so the leaders avoid it;
    # followers come from the other rack (0 and 1 are in a, 2 and 3 in b).
    spus = helpers.racked({0: "a", 1: "a", 2: "b", 3: "b"})
    existing = [("big", 0, (0, 1)), ("big", 1, (0, 2))]
    assert helpers.place(spus, 3, 2, strategy="least-loaded", existing=existing) == [[1, 3], [2, 0], [3, 0]]


def test_more_replicas_than_racks_fill_the_least_used_rack_next() -> None:
    # Two racks, RF 3: two replicas in one rack is unavoidable, never three.
    spus = helpers.racked({spu_id: "ab"[spu_id % 2] for spu_id in range(6)})
    for row in helpers.place(spus, 12, 3, strategy="least-loaded"):
        assert sorted(Counter(spu_id % 2 for spu_id in row).values()) == [1, 2]


def test_racks_on_some_spus_only_is_refused_like_the_other_strategies() -> None:
    spus = [placement.SpuInfo(0, "a"), placement.SpuInfo(1, "b"), placement.SpuInfo(2)]
    request = placement.PlacementRequest(spus=spus, partitions=1, replication_factor=2, strategy="least-loaded")
    try:
        placement.compute(request)
    except placement.InvalidConfig as error:
        assert str(error) == (
            "rack-aware placement needs a rack on every online SPU, but SPU 2 has none: give SPU 2 a rack "
            "(sc spu set-rack ID --rack R), or create the topic with ignoreRackAssignment: true "
            "(sc topic create --ignore-rack-assignment)"
        )
    else:
        raise AssertionError("a partial rack layout was accepted")
    assert helpers.place(spus, 2, 2, strategy="least-loaded", ignore_rack_assignment=True) == [[0, 1], [1, 0]]


@settings(max_examples=60, deadline=None)
@given(
    rack_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    partitions=st.integers(1, 60),
    data=st.data(),
)
def test_rack_aware_picks_spread_racks_and_first_followers(
    rack_sizes: list[int], partitions: int, data: st.DataObject
) -> None:
    """Each partition spans min(RF, racks) racks; each leader's first followers take turns over the
    SPUs of the other racks (over all others with one rack): their counts differ by at most one."""
    racks: dict[int, str] = {}
    for rack, size in enumerate(rack_sizes):
        for _ in range(size):
            racks[len(racks) * 3 + 1] = f"rack{rack}"  # sparse ids
    spus = helpers.racked(racks)
    replication_factor = data.draw(st.integers(1, len(spus)))
    replica_map = helpers.place(spus, partitions, replication_factor, strategy="least-loaded")
    wanted = min(replication_factor, len(rack_sizes))
    for row in replica_map:
        assert len(row) == replication_factor == len(set(row))
        assert len({racks[spu_id] for spu_id in row}) == wanted
    if replication_factor < 2:
        return
    for leader in racks:
        others = [spu_id for spu_id in racks if racks[spu_id] != racks[leader]] if len(rack_sizes) > 1 else []
        allowed = others or [spu_id for spu_id in racks if spu_id != leader]
        firsts = Counter(row[1] for row in replica_map if row[0] == leader)
        if firsts:
            assert set(firsts) <= set(allowed)
            assert max(firsts.values()) - min(firsts[spu_id] for spu_id in allowed) <= 1


def _rack_aware_by_the_rules(
    spus: list[placement.SpuInfo], partitions: int, replication_factor: int, existing: list[tuple[str, int, tuple[int, ...]]]
) -> list[list[int]]:
    """The rack-aware picks, written as the rules read, with no heap: each pick scans every SPU.

    The leader is the SPU with the fewest leaders (lowest id on ties). Each follower is, among the
    SPUs not yet in the partition whose site, then leaf rack, holds the fewest of its replicas
    (any unused site while one is left), the one with the smallest (followers, (position +
    followers) mod n, position); the first follower also must not have followed this leader
    first more often than the level, which rises to the fewest when every allowed SPU is above it.
    """
    online = sorted((spu for spu in spus if spu.online), key=lambda spu: spu.id)
    size = len(online)
    position_of = {spu.id: position for position, spu in enumerate(online)}
    keys = [spread.rack_keys(spu) for spu in online]
    site = [entry[0] for entry in keys]
    leaf = [entry[-1] for entry in keys]
    site_size, leaf_size = Counter(site), Counter(leaf)
    leaders, followers = [0] * size, [0] * size
    first_followers: list[Counter[int]] = [Counter() for _ in online]
    for _topic, _partition, replicas in existing:
        held = [position_of.get(spu_id) for spu_id in replicas]
        for index, position in enumerate(held):
            if position is not None:
                (leaders if index == 0 else followers)[position] += 1
        if len(held) > 1 and held[0] is not None and held[1] is not None:
            first_followers[held[0]][held[1]] += 1
    level = [0] * size
    replica_map = []
    for _ in range(partitions):
        leader = min(range(size), key=lambda position: (leaders[position], position))
        leaders[leader] += 1
        chosen = [leader]
        for replica in range(1, replication_factor):
            sites = Counter(site[position] for position in chosen)
            leaves = Counter(leaf[position] for position in chosen)
            if len(site_size) >= replication_factor or len(sites) < len(site_size):
                allowed = [position for position in range(size) if site[position] not in sites]
            else:
                fewest_site = min(count for name, count in sites.items() if count < site_size[name])
                fewest_leaf = min(
                    leaves[leaf[position]]
                    for position in range(size)
                    if sites[site[position]] == fewest_site and leaves[leaf[position]] < leaf_size[leaf[position]]
                )
                allowed = [
                    position
                    for position in range(size)
                    if sites[site[position]] == fewest_site and leaves[leaf[position]] == fewest_leaf
                ]
            allowed = [position for position in allowed if position not in chosen]
            if replica == 1:
                paired = first_followers[leader]
                if all(paired[position] > level[leader] for position in allowed):
                    level[leader] = min(paired[position] for position in allowed)
                allowed = [position for position in allowed if paired[position] <= level[leader]]
                pick = min(allowed, key=lambda position: (followers[position], (position + followers[position]) % size, position))
                paired[pick] += 1
            else:
                pick = min(allowed, key=lambda position: (followers[position], (position + followers[position]) % size, position))
            followers[pick] += 1
            chosen.append(pick)
        replica_map.append([online[position].id for position in chosen])
    return replica_map


@settings(max_examples=150, deadline=None)
@given(
    layout=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=14),
    paths=st.booleans(),
    partitions=st.integers(1, 40),
    data=st.data(),
)
def test_rack_aware_picks_are_those_the_rules_name(
    layout: list[tuple[int, int]], paths: bool, partitions: int, data: st.DataObject
) -> None:
    """Whatever the heaps do to go faster, each pick is the one a scan of every SPU makes."""
    spus = [
        placement.SpuInfo(
            id=index * 2 + 1,
            rack=f"/dc{site}/r{rack}" if paths else f"r{site}",
            online=data.draw(st.booleans()) if index > 0 else True,
        )
        for index, (site, rack) in enumerate(layout)
    ]
    online = [spu.id for spu in spus if spu.online]
    replication_factor = data.draw(st.integers(1, len(online)))
    existing = data.draw(
        st.lists(
            st.lists(st.sampled_from([spu.id for spu in spus] + [99]), min_size=1, max_size=4, unique=True).map(tuple),
            max_size=12,
        )
    )
    rows = [("other", index, replicas) for index, replicas in enumerate(existing)]
    # Both implementations, whichever `_by_rows` would choose for this cluster.
    by_rows = data.draw(st.booleans())
    with mock.patch.object(least_loaded, "_by_rows", lambda leaves, factor: by_rows):
        placed = helpers.place(spus, partitions, replication_factor, strategy="least-loaded", existing=rows)
    assert placed == _rack_aware_by_the_rules(spus, partitions, replication_factor, rows)


def test_a_replication_factor_near_the_spu_count_does_not_pop_refused_spus_at_every_pick() -> None:
    """At RF 64 on 64 SPUs in 4 racks, each pick popped every SPU the racks or the partition
    refused (2,839 heap pops for 10 partitions); the picks now read rows per rack, and the only
    heap left is the leaders'."""
    spus = [placement.SpuInfo(spu_id, rack=f"r{spu_id % 4}") for spu_id in range(64)]
    pops = 0
    real_pop = heapq.heappop

    def counting_pop(heap: list[int]) -> int:
        nonlocal pops
        pops += 1
        return real_pop(heap)

    with mock.patch.object(heapq, "heappop", counting_pop):
        replica_map = helpers.place(spus, 10, 64, strategy="least-loaded")
    assert all(sorted(row) == list(range(64)) for row in replica_map)
    assert all(len({spu_id % 4 for spu_id in row[:4]}) == 4 for row in replica_map)
    assert pops <= 10 * 64


def test_the_rows_are_chosen_from_three_replicas_per_leaf_rack_on() -> None:
    assert not least_loaded._by_rows(50, 3)
    assert not least_loaded._by_rows(8, 16)
    assert least_loaded._by_rows(8, 24)
    assert least_loaded._by_rows(3, 128)
