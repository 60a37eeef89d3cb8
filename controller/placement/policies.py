"""Placement policies: node and shard locality affinity plus preferred nodes, parsed and applied.

Purely computational, no I/O. A node is an SPU, its location the top level of its rack, a
shard a partition of the topic.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from controller.placement import cluster, model
from store import models

AFFINITIES = ("colocated", "balanced", "exclusive")
LARGEST_SPU_ID = 2**31 - 1
_CANONICAL_KEYS = {
    "node": "node",
    "shard": "shard",
    "preferred_nodes": "preferred_nodes",
    "preferred_node": "preferred_nodes",
}


@dataclasses.dataclass(frozen=True)
class Policies:
    """The effective policies of a topic (defaults: node=balanced, shard=colocated, no preferred nodes)."""

    node: str = "balanced"
    shard: str = "colocated"
    preferred_nodes: tuple[int, ...] = ()


def _segments(text: str) -> list[tuple[str, str]]:
    """(canonical key, `key=value` as written) for each non-empty segment, validated."""
    if len(text) > models.MAX_POLICIES_LENGTH:
        raise model.InvalidConfig(
            f"placement policies are {len(text)} characters long ({_cut(text)!r}): at most "
            f"{models.MAX_POLICIES_LENGTH} are allowed"
        )
    segments: list[tuple[str, str]] = []
    for raw in text.split(";"):
        segment = raw.strip()
        if not segment:
            continue
        key, equals, value = segment.partition("=")
        key, value = key.strip(), value.strip()
        if not equals:
            raise model.InvalidConfig(f"placement policy {segment!r} is not key=value")
        canonical = _CANONICAL_KEYS.get(key)
        if canonical is None:
            raise model.InvalidConfig(
                f"placement policy {segment!r}: unknown key {key!r} (known: node, shard, preferred_nodes)"
            )
        if canonical in ("node", "shard") and value not in AFFINITIES:
            raise model.InvalidConfig(
                f"placement policy {segment!r}: {key} must be colocated, balanced or exclusive, not {value!r}"
            )
        if canonical == "preferred_nodes":
            _preferred(key, value)
        segments.append((canonical, f"{key}={value}"))
    return segments


def _preferred(key: str, value: str) -> tuple[int, ...]:
    if not value:
        return ()
    ids: list[int] = []
    seen: set[int] = set()  # not `in ids`: a list of n ids would take n² steps
    for item in value.split(","):
        item = item.strip()
        # ASCII digits, few enough for an SPU id, before int(): "²".isdigit() is true and int()
        # refuses it, as it refuses 4,301 digits.
        if not (item.isascii() and item.isdigit() and len(item) <= 10 and int(item) <= LARGEST_SPU_ID):
            raise model.InvalidConfig(f"placement policy {key}={_cut(value)}: {_cut(item)!r} is not an SPU id")
        spu_id = int(item)
        if spu_id in seen:
            raise model.InvalidConfig(f"placement policy {key}={_cut(value)}: SPU {spu_id} is listed twice")
        seen.add(spu_id)
        ids.append(spu_id)
    return tuple(ids)


def _cut(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def parse_policies(text: str | None) -> Policies:
    """Parse `key=value;...`; a later key overrides an earlier one; unknown keys or values are errors."""
    settings: dict[str, str] = {}
    for canonical, written in _segments(text or ""):
        settings[canonical] = written.partition("=")[2]
    preferred = settings.get("preferred_nodes", "")
    return Policies(
        node=settings.get("node", "balanced"),
        shard=settings.get("shard", "colocated"),
        preferred_nodes=_preferred("preferred_nodes", preferred),
    )


def compact_policies(text: str | None) -> str:
    """Each key once, as last written, at the position of its last occurrence (the seed's compaction)."""
    segments = _segments(text or "")
    last = {canonical: index for index, (canonical, _) in enumerate(segments)}
    return ";".join(written for index, (canonical, written) in enumerate(segments) if last[canonical] == index)


@dataclasses.dataclass
class _Cluster:
    """Eligible nodes renumbered by their rank in the rotated zig-zag order (rank = tie-break)."""

    ids: list[int]  # rank -> SPU id
    location: list[int]  # rank -> location number
    location_names: list[str]
    location_size: list[int]
    preferred: list[int]  # ranks of eligible preferred nodes, in the policy's order


def _cluster(run: model.Run, policies: Policies) -> _Cluster:
    layout = cluster.rack_layout(run.spus, ignore_racks=run.request.ignore_rack_assignment)
    if layout == "none" and policies.node != "balanced":
        raise model.InvalidConfig(
            f"placement policy node={policies.node} places replicas by location, but the online SPUs have no "
            "rack (or racks are ignored): give every SPU a rack or use node=balanced",
            fix=model.Fix.CLUSTER,
        )
    by_location: dict[str, list[int]] = {}
    for spu in run.spus:
        by_location.setdefault((cluster.location(spu) or "") if layout != "none" else "", []).append(spu.id)
    names = sorted(by_location)
    columns = [by_location[name] for name in names]
    zigzag = cluster.alternate(columns)
    shift = run.start_index % len(zigzag)
    ids = zigzag[shift:] + zigzag[:shift]
    number = {name: index for index, name in enumerate(names)}
    location_of = {spu_id: number[name] for name, column in by_location.items() for spu_id in column}
    rank_of = {spu_id: rank for rank, spu_id in enumerate(ids)}
    known = {spu.id for spu in run.request.spus}
    unknown = [spu_id for spu_id in policies.preferred_nodes if spu_id not in known]
    if unknown:
        raise model.InvalidConfig(
            f"placement policy preferred_nodes names SPU{'s' if len(unknown) > 1 else ''} "
            f"{model.format_ids(unknown)}, which {'are' if len(unknown) > 1 else 'is'} not registered",
            fix=model.Fix.CLUSTER,
        )
    return _Cluster(
        ids=ids,
        location=[location_of[spu_id] for spu_id in ids],
        location_names=names,
        location_size=[len(column) for column in columns],
        preferred=[rank_of[spu_id] for spu_id in policies.preferred_nodes if spu_id in rank_of],
    )


def place(run: model.Run) -> list[list[int]]:
    """Honour node affinity (pick candidates across locations), then shard affinity (place on them).

    Candidates are ranked: preferred nodes first (in the order given), then, with
    node=balanced, locations holding fewest replicas of the partition; with shard=balanced,
    nodes holding fewest replicas of the topic (for the leader: fewest leaders first); last,
    the zig-zag order over locations (rotated by the start index). Hard rules filter:
    node=exclusive (one replica per location), node=colocated (all in the leader's
    location), shard=exclusive (a node holds one replica of the topic at most).
    """
    policies = parse_policies(run.request.policies)
    nodes = _cluster(run, policies)
    current = run.request.current_replica_map
    if policies.shard == "colocated" and current:
        return _join_shard_zero(run, current[0])
    _check_feasible(run, policies, nodes)
    if policies.shard == "balanced" and policies.node != "colocated":
        return _balanced_spread(run, policies, nodes)
    return _greedy(run, policies, nodes)


def _join_shard_zero(run: model.Run, shard_zero: Sequence[int]) -> list[list[int]]:
    eligible = {spu.id for spu in run.spus}
    offline = [spu_id for spu_id in shard_zero if spu_id not in eligible]
    if offline:
        raise model.InsufficientResources(
            f"placement policy shard=colocated puts new partitions on partition 0's SPUs "
            f"{model.format_ids(list(shard_zero))}, but {model.format_ids(offline)} "
            f"{'are' if len(offline) > 1 else 'is'} offline"
        )
    return [list(shard_zero) for _ in range(run.count)]


def _taken_by_current(run: model.Run, nodes: _Cluster) -> set[int]:
    rank_of = {spu_id: rank for rank, spu_id in enumerate(nodes.ids)}
    return {rank_of[spu_id] for row in run.request.current_replica_map for spu_id in row if spu_id in rank_of}


def _check_feasible(run: model.Run, policies: Policies, nodes: _Cluster) -> None:
    """Fail early, with counts, when a hard policy cannot be met by any placement."""
    rf, count = run.replication_factor, run.count
    free = list(nodes.location_size)
    if policies.shard == "exclusive":
        for rank in _taken_by_current(run, nodes):
            free[nodes.location[rank]] -= 1
    locations = len(nodes.location_names)
    if policies.node == "exclusive" and rf > locations:
        raise model.InsufficientResources(
            f"placement policy node=exclusive needs {rf} locations (one per replica) but the online SPUs "
            f"are in {locations} ({', '.join(nodes.location_names)}): {rf - locations} more needed"
        )
    if policies.node == "colocated" and max(nodes.location_size) < rf:
        largest = max(range(locations), key=lambda index: nodes.location_size[index])
        raise model.InsufficientResources(
            f"placement policy node=colocated needs {rf} online SPUs in one location, the largest "
            f"({nodes.location_names[largest]}) has {nodes.location_size[largest]}"
        )
    if policies.shard != "exclusive":
        return
    available = sum(free)
    if count * rf > available:
        raise model.InsufficientResources(
            f"placement policy shard=exclusive needs {count * rf} free online SPUs ({count} partitions x "
            f"replication factor {rf}, one replica per SPU), only {available} are free: "
            f"{count * rf - available} more needed",
            needed_spus=count * rf - available,
        )
    if policies.node == "exclusive" and sum(min(size, count) for size in free) < count * rf:
        raise model.InsufficientResources(
            f"placement policies node=exclusive and shard=exclusive need {count} partitions x {rf} replicas, "
            "each replica of a partition in its own location and on its own SPU; the free SPUs per location "
            f"({', '.join(f'{name}: {size}' for name, size in zip(nodes.location_names, free, strict=True))}) "
            "cannot hold that"
        )
    if policies.node == "colocated" and sum(size // rf for size in free) < count:
        raise model.InsufficientResources(
            f"placement policies node=colocated and shard=exclusive need {count} groups of {rf} free SPUs in "
            f"one location; the free SPUs per location "
            f"({', '.join(f'{name}: {size}' for name, size in zip(nodes.location_names, free, strict=True))}) "
            f"hold only {sum(size // rf for size in free)}"
        )


def _counts(run: model.Run, nodes: _Cluster) -> tuple[list[int], list[int]]:
    """Leaders and replicas per node from this topic's current partitions."""
    rank_of = {spu_id: rank for rank, spu_id in enumerate(nodes.ids)}
    leaders = [0] * len(nodes.ids)
    totals = [0] * len(nodes.ids)
    for row in run.request.current_replica_map:
        for index, spu_id in enumerate(row):
            rank = rank_of.get(spu_id)
            if rank is not None:
                totals[rank] += 1
                if index == 0:
                    leaders[rank] += 1
    return leaders, totals


def _no_candidate(policies: Policies, partition: int, replica: int) -> model.InsufficientResources:
    return model.InsufficientResources(
        f"placement policies node={policies.node}, shard={policies.shard}: no online SPU can take replica "
        f"{replica} of partition {partition} without breaking a hard policy"
    )


def _greedy(run: model.Run, policies: Policies, nodes: _Cluster) -> list[list[int]]:
    """Every rule applied literally, one replica at a time, scanning all nodes (the reference).

    Used for shard=colocated (one partition is computed, then repeated), shard=exclusive (at
    most one pick per node) and node=colocated (scans stay inside one location's worth of
    choices in practice); shard=balanced with node=balanced/exclusive uses the heap version.
    """
    n = len(nodes.ids)
    preferred_rank = [len(nodes.preferred)] * n
    for order, rank in enumerate(nodes.preferred):
        preferred_rank[rank] = order
    leaders, totals = _counts(run, nodes)
    used = _taken_by_current(run, nodes) if policies.shard == "exclusive" else set()
    free = list(nodes.location_size)
    for rank in used:
        free[nodes.location[rank]] -= 1
    rf = run.replication_factor
    shards = 1 if policies.shard == "colocated" else run.count
    replica_map: list[list[int]] = []
    for shard in range(shards):
        chosen: list[int] = []
        per_location: dict[int, int] = {}
        for replica in range(rf):
            best_key: tuple[int, ...] | None = None
            best = -1
            for rank in range(n):
                if rank in chosen or rank in used:
                    continue
                location = nodes.location[rank]
                if policies.node == "exclusive" and location in per_location:
                    continue
                if policies.node == "colocated":
                    if chosen and location != nodes.location[chosen[0]]:
                        continue
                    if not chosen and free[location] < rf:
                        continue
                key: tuple[int, ...] = (preferred_rank[rank],)
                if policies.node == "balanced":
                    key += (per_location.get(location, 0),)
                if policies.node == "exclusive" and policies.shard == "exclusive":
                    key += (-free[location],)
                if policies.shard == "balanced":
                    key += (leaders[rank], totals[rank]) if not chosen else (totals[rank],)
                key += (rank,)
                if best_key is None or key < best_key:
                    best_key, best = key, rank
            if best < 0:
                raise _no_candidate(policies, run.first_partition + shard, replica)
            chosen.append(best)
            per_location[nodes.location[best]] = per_location.get(nodes.location[best], 0) + 1
            totals[best] += 1
            if replica == 0:
                leaders[best] += 1
            if policies.shard == "exclusive":
                used.add(best)
                free[nodes.location[best]] -= 1
        replica_map.append([nodes.ids[rank] for rank in chosen])
    if policies.shard == "colocated":
        return [list(replica_map[0]) for _ in range(run.count)]
    return replica_map


def _balanced_spread(run: model.Run, policies: Policies, nodes: _Cluster) -> list[list[int]]:
    """shard=balanced with node=balanced or exclusive: the same ranking as `_greedy`, with heaps.

    Two heaps of packed integers, rebuilt lazily (an entry is stale once its node's counts
    moved on): `(leaders, replicas, rank)` for the leader, `(replicas, rank)` for followers.
    A follower must come from a location holding the fewest replicas of the partition
    (node=balanced; with node=exclusive, from an unused location); nodes that do not qualify
    are set aside and pushed back, so a pick costs O(log n) plus the few set aside.
    """
    n = len(nodes.ids)
    rf = run.replication_factor
    leaders, totals = _counts(run, nodes)
    rank_bits = max(1, n.bit_length())
    total_bits = (max(totals, default=0) + run.count * rf + 1).bit_length()
    rank_mask = (1 << rank_bits) - 1
    leader_heap = [((leaders[rank] << total_bits | totals[rank]) << rank_bits) | rank for rank in range(n)]
    total_heap = [totals[rank] << rank_bits | rank for rank in range(n)]
    heapq.heapify(leader_heap)
    heapq.heapify(total_heap)
    locations = len(nodes.location_names)
    exclusive = policies.node == "exclusive"
    replica_map: list[list[int]] = []
    for shard in range(run.count):
        chosen: list[int] = []
        per_location = [0] * locations
        locations_used = 0
        for replica in range(rf):
            pick = -1
            for rank in nodes.preferred:
                if rank not in chosen and not (exclusive and per_location[nodes.location[rank]]):
                    pick = rank
                    break
            if pick < 0 and replica == 0:
                while True:
                    entry = heapq.heappop(leader_heap)
                    rank = entry & rank_mask
                    if entry >> rank_bits == (leaders[rank] << total_bits | totals[rank]):
                        pick = rank
                        break
            elif pick < 0:
                if locations_used < locations:
                    wanted = 0
                elif exclusive:
                    raise _no_candidate(policies, run.first_partition + shard, replica)
                else:
                    wanted = min(
                        per_location[location]
                        for location in range(locations)
                        if per_location[location] < nodes.location_size[location]
                    )
                set_aside = []
                while total_heap:
                    entry = heapq.heappop(total_heap)
                    rank = entry & rank_mask
                    if entry >> rank_bits != totals[rank]:
                        continue  # stale
                    if rank in chosen or per_location[nodes.location[rank]] != wanted:
                        set_aside.append(entry)
                        continue
                    pick = rank
                    break
                for entry in set_aside:
                    heapq.heappush(total_heap, entry)
                if pick < 0:
                    raise _no_candidate(policies, run.first_partition + shard, replica)
            chosen.append(pick)
            location = nodes.location[pick]
            if not per_location[location]:
                locations_used += 1
            per_location[location] += 1
            totals[pick] += 1
            if replica == 0:
                leaders[pick] += 1
            heapq.heappush(leader_heap, ((leaders[pick] << total_bits | totals[pick]) << rank_bits) | pick)
            heapq.heappush(total_heap, totals[pick] << rank_bits | pick)
        replica_map.append([nodes.ids[rank] for rank in chosen])
    return replica_map
