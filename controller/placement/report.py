"""The balance report of a replica map: load per SPU and per rack, rack violations, failover spread.

Purely computational, no I/O. The report is JSON-ready (SPU ids as string keys, in id order).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controller.placement import model


def _spread(counts: dict[int, int] | dict[str, int]) -> dict[str, int]:
    values = list(counts.values())
    low, high = (min(values), max(values)) if values else (0, 0)
    return {"min": low, "max": high, "spread": high - low}


def balance(replica_map: Sequence[Sequence[int]], spus: Iterable[model.SpuInfo]) -> dict[str, object]:
    """How evenly `replica_map` loads the cluster.

    - `replicas` / `leaders`: count per SPU (online SPUs and any SPU the map uses), min, max, spread;
    - `rackReplicas` / `rackLeaders`: the same per rack (null when no SPU has a rack);
    - `rackViolations`: partitions spanning fewer racks than min(their replica count, racks);
    - `failover`: for each SPU, if it failed and each partition it leads moved to its next
      online replica, the most extra leaderships one survivor would take (`max` over SPUs,
      `worstSpu` where it happens). The seed's goal is that this stays near
      leaders / (SPUs - 1): a failed SPU's load spreads over all survivors.
    """
    spus = sorted(spus, key=lambda spu: spu.id)
    rack_of = {spu.id: spu.rack for spu in spus}
    online = {spu.id for spu in spus if spu.online}
    used = {spu_id for row in replica_map for spu_id in row}
    ids = sorted(online | used)
    replicas = dict.fromkeys(ids, 0)
    leaders = dict.fromkeys(ids, 0)
    for row in replica_map:
        if row:
            leaders[row[0]] += 1
        for spu_id in row:
            replicas[spu_id] += 1

    racks = sorted({rack for spu_id in ids if (rack := rack_of.get(spu_id)) is not None})
    report: dict[str, object] = {
        "replicas": {"perSpu": {str(spu_id): count for spu_id, count in replicas.items()}, **_spread(replicas)},
        "leaders": {"perSpu": {str(spu_id): count for spu_id, count in leaders.items()}, **_spread(leaders)},
        "rackReplicas": None,
        "rackLeaders": None,
    }
    violations = _violations(replica_map, rack_of, _online_racks(rack_of, online))
    if racks:
        rack_replicas = dict.fromkeys(racks, 0)
        rack_leaders = dict.fromkeys(racks, 0)
        for spu_id in ids:
            rack = rack_of.get(spu_id)
            if rack is not None:
                rack_replicas[rack] += replicas[spu_id]
                rack_leaders[rack] += leaders[spu_id]
        report["rackReplicas"] = {"perRack": rack_replicas, **_spread(rack_replicas)}
        report["rackLeaders"] = {"perRack": rack_leaders, **_spread(rack_leaders)}
    report["rackViolations"] = {"count": len(violations), "partitions": violations}
    report["failover"] = _failover(replica_map, ids, online)
    return report


def rack_violations(replica_map: Sequence[Sequence[int]], spus: Iterable[model.SpuInfo]) -> list[int]:
    """The partitions whose replicas span fewer racks than min(their replica count, the racks of the
    online SPUs): the report's `rackViolations`, for a caller that needs only them."""
    global _last_racks
    last = _last_racks
    if last is not None and last[0] is spus:
        rack_of, online_racks = last[1], last[2]
    else:
        listed = list(spus)
        rack_of = {spu.id: spu.rack for spu in listed}
        online_racks = _online_racks(rack_of, {spu.id for spu in listed if spu.online})
        if type(spus) is tuple and len(listed) <= model.CACHED_SPUS_LIMIT:
            _last_racks = (spus, rack_of, online_racks)
    return _violations(replica_map, rack_of, online_racks)


# The last SPU tuple looked at (immutable, of frozen SpuInfo): the topic controller checks every
# topic it places against the same tuple, and need not map 100 SPUs' racks again for each.
_last_racks: tuple[tuple[model.SpuInfo, ...], dict[int, str | None], int] | None = None


def _online_racks(rack_of: dict[int, str | None], online: set[int]) -> int:
    return len({rack for spu_id in online if (rack := rack_of.get(spu_id)) is not None})


def _violations(replica_map: Sequence[Sequence[int]], rack_of: dict[int, str | None], online_racks: int) -> list[int]:
    if online_racks < 2:
        return []  # one rack (or none): every partition spans all the racks it can
    violations = []
    for partition, row in enumerate(replica_map):
        spanned = len({rack for spu_id in row if (rack := rack_of.get(spu_id)) is not None})
        if spanned < min(len(row), online_racks):
            violations.append(partition)
    return violations


def _failover(replica_map: Sequence[Sequence[int]], ids: list[int], online: set[int]) -> dict[str, object]:
    takeovers: dict[int, dict[int, int]] = {spu_id: {} for spu_id in ids}
    for row in replica_map:
        if not row:
            continue
        failed = row[0]
        successor = next((spu_id for spu_id in row[1:] if spu_id in online), None)
        if successor is not None:
            taken = takeovers[failed]
            taken[successor] = taken.get(successor, 0) + 1
    per_spu = {str(spu_id): max(takeovers[spu_id].values(), default=0) for spu_id in ids}
    worst = max(ids, key=lambda spu_id: (max(takeovers[spu_id].values(), default=0), -spu_id), default=None)
    return {
        "perSpu": per_spu,
        "max": max(per_spu.values(), default=0),
        "worstSpu": worst if worst is not None and per_spu[str(worst)] > 0 else None,
    }
