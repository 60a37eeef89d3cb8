"""Properties of the rebalance planner on random clusters and placements (hypothesis).

Clusters have sparse ids, SPUs without replicas (the added ones), offline SPUs, decommissions,
and no racks, plain racks or path racks; every current placement is valid (distinct SPUs).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from controller import placement
from controller.placement import spread

Spu = placement.SpuInfo


@st.composite
def requests(
    draw: st.DrawFn,
    racks: str | None = None,
    decommission: bool = True,
    offline: bool = True,
    limit: bool = True,
    largest: int = 8,
) -> placement.RebalanceRequest:
    mode = racks or draw(st.sampled_from(["none", "flat", "path"]))
    ids = draw(st.lists(st.integers(0, 40), min_size=2, max_size=largest, unique=True))
    spus = []
    for spu_id in ids:
        rack = None
        if mode == "flat":
            rack = draw(st.sampled_from(["ra", "rb", "rc"]))
        elif mode == "path":
            rack = f"/dc{draw(st.integers(0, 1))}/{draw(st.sampled_from(['ra', 'rb', 'rc']))}"
        spus.append(Spu(spu_id, rack, online=not (offline and draw(st.booleans()) and draw(st.booleans()))))
    holders = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True))
    partitions = []
    for index in range(draw(st.integers(1, 3 * largest))):
        replication_factor = draw(st.integers(1, min(3, len(holders))))
        replicas = draw(st.permutations(holders))[:replication_factor]
        partitions.append((f"t-{index}", list(replicas)))
    leaving = draw(st.lists(st.sampled_from(ids), max_size=2, unique=True)) if decommission else []
    if not any(spu.online and spu.id not in leaving for spu in spus):
        leaving = []
        spus[0] = Spu(spus[0].id, spus[0].rack)
    return placement.RebalanceRequest(
        spus=spus,
        partitions=partitions,
        decommissioning=leaving,
        max_moves_per_spu=draw(st.none() | st.integers(1, 4)) if limit else None,
    )


def takers(request: placement.RebalanceRequest) -> list[int]:
    return sorted(spu.id for spu in request.spus if spu.online and spu.id not in request.decommissioning)


def counts(rows: list[list[int]] | list[tuple[int, ...]]) -> Counter[int]:
    return Counter(spu_id for row in rows for spu_id in row)


def lower_bound(request: placement.RebalanceRequest) -> tuple[int, int, int]:
    """API.md's lower bound, worked out here from its words: (bound, floor, ceiling)."""
    held = counts([list(replicas) for _, replicas in request.partitions])
    counted = takers(request)
    total = sum(held[spu_id] for spu_id in [*counted, *request.decommissioning])
    floor, extra = divmod(total, len(counted))
    ceilings = sorted(counted, key=lambda spu_id: (-held[spu_id], spu_id))[:extra]
    target = {spu_id: floor + (1 if spu_id in ceilings else 0) for spu_id in counted}
    bound = sum(max(0, held[spu_id] - target[spu_id]) for spu_id in counted)
    return bound + sum(held[spu_id] for spu_id in request.decommissioning), floor, floor + (1 if extra else 0)


def after_rows(request: placement.RebalanceRequest, result: placement.RebalancePlan) -> dict[str, tuple[int, ...]]:
    rows = {name: tuple(replicas) for name, replicas in request.partitions}
    for move in result.moves:
        assert move.before == rows[move.partition], "a move starts from the current replicas"
        rows[move.partition] = move.after
    return rows


def required_spread(request: placement.RebalanceRequest, replicas: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """min(what the partition spans, the racks that remain to it) per level, worked out independently."""
    keys = {spu.id: spread.rack_keys(spu) for spu in request.spus}
    levels = max((len(entry) for entry in keys.values()), default=0)
    online = set(takers(request))
    staying = {spu.id for spu in request.spus if not spu.online and spu.id not in request.decommissioning}
    remaining = [keys[spu_id] for spu_id in online] + [keys[spu_id] for spu_id in replicas if spu_id in staying]
    now = spread.spread([keys[spu_id] for spu_id in replicas], levels)
    return tuple(min(now[level], len({entry[level] for entry in remaining if entry})) for level in range(levels))


def shuffled(request: placement.RebalanceRequest, seed: int) -> placement.RebalanceRequest:
    spus, partitions = list(request.spus), list(request.partitions)
    random.Random(seed).shuffle(spus)
    random.Random(seed + 1).shuffle(partitions)
    return placement.RebalanceRequest(
        spus=spus,
        partitions=partitions,
        decommissioning=list(reversed(request.decommissioning)),
        max_moves_per_spu=request.max_moves_per_spu,
    )


@settings(max_examples=150, deadline=None)
@given(request=requests(racks="none", decommission=False, limit=False))
def test_without_racks_a_plan_moves_exactly_the_lower_bound_and_balances(request: placement.RebalanceRequest) -> None:
    result = placement.plan_rebalance(request)
    bound, floor, ceiling = lower_bound(request)
    assert (result.replica_moves, result.lower_bound) == (bound, bound)
    after = counts(list(after_rows(request, result).values()))
    assert all(floor <= after[spu_id] <= ceiling for spu_id in takers(request))
    assert [shortfall for shortfall in result.unreachable if shortfall.kind == "replicas"] == []


@settings(max_examples=200, deadline=None)
@given(request=requests(), seed=st.integers(0, 1000))
def test_every_plan_keeps_replication_factors_and_rack_spread_and_is_deterministic(
    request: placement.RebalanceRequest, seed: int
) -> None:
    result = placement.plan_rebalance(request)
    before = {name: tuple(replicas) for name, replicas in request.partitions}
    after = after_rows(request, result)
    may_take = set(takers(request))
    keys = {spu.id: spread.rack_keys(spu) for spu in request.spus}
    levels = max((len(entry) for entry in keys.values()), default=0)
    participation: Counter[int] = Counter()
    for name, replicas in after.items():
        assert len(replicas) == len(before[name]) == len(set(replicas)), "the replication factor is kept"
        placed = [spu_id for spu_id in replicas if spu_id not in before[name]]
        assert set(placed) <= may_take, "only online SPUs outside the decommission take replicas"
        participation.update(placed)
        participation.update(spu_id for spu_id in before[name] if spu_id not in replicas)
        now = spread.spread([keys[spu_id] for spu_id in replicas], levels)
        assert all(now[level] >= needed for level, needed in enumerate(required_spread(request, before[name])))
    if request.max_moves_per_spu is not None:
        assert max(participation.values(), default=0) <= request.max_moves_per_spu
    assert result.replica_moves == sum(len(move.placed) for move in result.moves)
    assert result.lower_bound == lower_bound(request)[0]
    assert dict(counts(list(after.values()))) == {spu_id: count for spu_id, count in result.after.replicas.items() if count}
    assert placement.plan_rebalance(shuffled(request, seed)) == result


@settings(max_examples=150, deadline=None)
@given(request=requests(racks="none", limit=False))
def test_without_racks_a_decommission_empties_the_spu_whenever_some_spu_may_take_each_replica(
    request: placement.RebalanceRequest,
) -> None:
    result = placement.plan_rebalance(request)
    counted = takers(request)
    room = all(
        sum(1 for spu_id in replicas if spu_id in request.decommissioning)
        <= sum(1 for spu_id in counted if spu_id not in replicas)
        for _, replicas in request.partitions
    )
    if room:
        assert all(result.after.replicas[spu_id] == 0 for spu_id in request.decommissioning)
        assert all(result.after.leaders[spu_id] == 0 for spu_id in request.decommissioning)


def within_the_bound_exists(request: placement.RebalanceRequest) -> bool:
    """Brute force: some set of lower-bound-many moves, from SPUs above the floor (or leaving) to
    SPUs below the ceiling, balances the cluster without any partition losing spread."""
    bound, floor, ceiling = lower_bound(request)
    if bound == 0:
        return True
    rows = {name: list(replicas) for name, replicas in request.partitions}
    held = counts(list(rows.values()))
    counted = takers(request)
    leaving = set(request.decommissioning)
    givers = {spu_id for spu_id in held if spu_id in leaving or (spu_id in counted and held[spu_id] > floor)}
    receivers = [spu_id for spu_id in counted if held[spu_id] < ceiling]
    keys = {spu.id: spread.rack_keys(spu) for spu in request.spus}
    levels = max((len(entry) for entry in keys.values()), default=0)
    candidates = [
        (name, giver, receiver)
        for name, replicas in rows.items()
        for giver in replicas
        if giver in givers
        for receiver in receivers
        if receiver not in replicas
    ]
    for chosen in itertools.combinations(candidates, bound):
        final = Counter(held)
        new_rows = {name: list(replicas) for name, replicas in rows.items()}
        possible = True
        for name, giver, receiver in chosen:
            row = new_rows[name]
            if giver not in row or receiver in row:
                possible = False
                break
            row[row.index(giver)] = receiver
            final[giver] -= 1
            final[receiver] += 1
        if not possible or any(final[spu_id] for spu_id in leaving):
            continue
        if not all(floor <= final[spu_id] <= ceiling for spu_id in counted):
            continue
        if all(
            spread.spread([keys[spu_id] for spu_id in new_rows[name]], levels)[level] >= needed
            for name, replicas in rows.items()
            for level, needed in enumerate(required_spread(request, replicas))
        ):
            return True
    return False


# Derandomized: the planner is exact wherever augmenting paths reach (see planner.plan), and
# this runs a brute force per example; a fixed set of examples keeps the run the same each time.
@settings(max_examples=200, deadline=None, derandomize=True)
@given(request=requests(limit=False, largest=5))
def test_never_above_the_lower_bound_when_a_plan_within_it_exists(request: placement.RebalanceRequest) -> None:
    if lower_bound(request)[0] > 4:
        return  # the brute force would take too long
    result = placement.plan_rebalance(request)
    if within_the_bound_exists(request):
        assert result.replica_moves == result.lower_bound
        assert [shortfall for shortfall in result.unreachable if shortfall.kind == "replicas"] == []
