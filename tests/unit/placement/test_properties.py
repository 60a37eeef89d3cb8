"""Properties every strategy keeps, on random clusters (hypothesis)."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from tests.unit.placement import helpers

STRATEGIES = ["computed", "kafka", "least-loaded", "multi-level", "policies"]


@st.composite
def clusters(draw: st.DrawFn, racks: str | None = None) -> list[placement.SpuInfo]:
    """1-10 SPUs with sparse ids, some offline; racks none, uneven or equal-sized (all online)."""
    mode = racks or draw(st.sampled_from(["none", "uneven", "equal"]))
    if mode == "equal":
        rack_count, per_rack = draw(st.integers(1, 4)), draw(st.integers(1, 3))
        ids = draw(st.lists(st.integers(0, 60), min_size=rack_count * per_rack, max_size=rack_count * per_rack, unique=True))
        return [placement.SpuInfo(spu_id, f"rack{index % rack_count}") for index, spu_id in enumerate(ids)]
    ids = draw(st.lists(st.integers(0, 60), min_size=1, max_size=10, unique=True))
    offline = draw(st.sets(st.sampled_from(ids), max_size=max(0, len(ids) - 1)))
    rack_names = ["ra", "rb", "rc"]
    return [
        placement.SpuInfo(
            spu_id,
            None if mode == "none" else draw(st.sampled_from(rack_names)),
            spu_id not in offline,
        )
        for spu_id in ids
    ]


def online_ids(spus: list[placement.SpuInfo]) -> list[int]:
    return sorted(spu.id for spu in spus if spu.online)


@settings(max_examples=80, deadline=None)
@given(
    spus=clusters(),
    strategy=st.sampled_from([*STRATEGIES, "policies:shard=balanced", "policies:shard=balanced;node=exclusive"]),
    partitions=st.integers(1, 30),
    start_index=st.integers(0, 100),
    data=st.data(),
)
def test_every_strategy_places_rf_distinct_online_spus_deterministically(
    spus: list[placement.SpuInfo], strategy: str, partitions: int, start_index: int, data: st.DataObject
) -> None:
    online = online_ids(spus)
    replication_factor = data.draw(st.integers(1, len(online)))
    name, _, policies = strategy.partition(":")
    options: dict[str, object] = {"strategy": name, "start_index": start_index}
    if policies:
        options["policies"] = policies
    try:
        replica_map = helpers.place(spus, partitions, replication_factor, **options)
    except placement.InsufficientResources:
        # Only a hard policy may refuse a cluster with enough online SPUs: more replicas than locations.
        assert "node=exclusive" in policies
        assert replication_factor > len({spu.rack for spu in spus if spu.online})
        return
    except placement.InvalidConfig:
        # ... or a location policy on SPUs without racks.
        assert "node=exclusive" in policies and all(spu.rack is None for spu in spus)
        return
    assert len(replica_map) == partitions
    for row in replica_map:
        assert len(row) == replication_factor
        assert len(set(row)) == replication_factor
        assert set(row) <= set(online)
    shuffled = list(spus)
    random.Random(partitions).shuffle(shuffled)
    assert helpers.place(shuffled, partitions, replication_factor, **options) == replica_map


@settings(max_examples=60, deadline=None)
@given(
    spus=clusters(),
    strategy=st.sampled_from(["computed", "kafka"]),
    start_index=st.integers(0, 100),
    offset=st.integers(0, 20),
    data=st.data(),
)
def test_computed_and_kafka_lead_with_every_spu_once_per_n_consecutive_partitions(
    spus: list[placement.SpuInfo], strategy: str, start_index: int, offset: int, data: st.DataObject
) -> None:
    online = online_ids(spus)
    n = len(online)
    replication_factor = data.draw(st.integers(1, n))
    replica_map = helpers.place(spus, offset + 2 * n, replication_factor, strategy=strategy, start_index=start_index)
    for first in range(offset, offset + n + 1):
        assert helpers.leader_counts(replica_map[first : first + n]) == Counter(dict.fromkeys(online, 1))
    counts = helpers.leader_counts(replica_map[:offset])
    assert max(counts.values(), default=0) - min((counts[spu_id] for spu_id in online), default=0) <= 1


@settings(max_examples=50, deadline=None)
@given(spus=clusters(racks="uneven"), partitions=st.integers(1, 30), start_index=st.integers(0, 50), data=st.data())
def test_kafka_rack_aware_spans_as_many_racks_as_it_can(
    spus: list[placement.SpuInfo], partitions: int, start_index: int, data: st.DataObject
) -> None:
    spus = [placement.SpuInfo(spu.id, spu.rack) for spu in spus]  # all online
    replication_factor = data.draw(st.integers(1, len(spus)))
    racks = {spu.id: spu.rack for spu in spus}
    wanted = min(replication_factor, len(set(racks.values())))
    replica_map = helpers.place(spus, partitions, replication_factor, strategy="kafka", start_index=start_index)
    assert all(len({racks[spu_id] for spu_id in row}) == wanted for row in replica_map)


@settings(max_examples=50, deadline=None)
@given(spus=clusters(racks="equal"), partitions=st.integers(1, 30), start_index=st.integers(0, 50), data=st.data())
def test_computed_rack_aware_spans_as_many_racks_as_it_can_when_racks_are_equal(
    spus: list[placement.SpuInfo], partitions: int, start_index: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(spus)))
    racks = {spu.id: spu.rack for spu in spus}
    wanted = min(replication_factor, len(set(racks.values())))
    replica_map = helpers.place(spus, partitions, replication_factor, start_index=start_index)
    assert all(len({racks[spu_id] for spu_id in row}) == wanted for row in replica_map)
    report = placement.balance(replica_map, spus)
    assert report["rackViolations"] == {"count": 0, "partitions": []}


@settings(max_examples=50, deadline=None)
@given(spus=clusters(), split=st.integers(0, 20), rest=st.integers(1, 20), data=st.data())
def test_computed_runs_chained_by_start_index_continue_one_run(
    spus: list[placement.SpuInfo], split: int, rest: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(online_ids(spus))))
    whole = placement.compute(
        placement.PlacementRequest(spus=spus, partitions=split + rest, replication_factor=replication_factor)
    )
    first = (
        placement.compute(placement.PlacementRequest(spus=spus, partitions=split, replication_factor=replication_factor))
        if split
        else placement.PlacementResult([], 0)
    )
    second = placement.compute(
        placement.PlacementRequest(
            spus=spus, partitions=rest, replication_factor=replication_factor, start_index=first.next_start_index
        )
    )
    assert second.next_start_index == split + rest
    assert first.replica_map + second.replica_map == whole.replica_map
