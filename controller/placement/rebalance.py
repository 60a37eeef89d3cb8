"""Rebalance plans: what the planner is given (current replicas, SPUs, limits), its checks, and its answer.

Purely computational, no I/O. `planner.plan` makes the plan; carrying one out (reassignments,
progress, cancelling) belongs to the SC, which calls the planner directly.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import NamedTuple

from controller.placement import model, spread


class PartitionReplicas(NamedTuple):
    """One partition as it is placed now: its name (`<topic>-<index>`) and replicas, preferred leader first."""

    name: str
    replicas: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RebalanceRequest:
    """Everything a plan depends on; the same request always gives the same plan.

    `spus` are every SPU that holds or may hold replicas: online SPUs outside
    `decommissioning` take replicas; an offline SPU keeps the replicas it has and takes none;
    a decommissioning SPU (online or not) must end with none. `max_moves_per_spu` caps how
    many replica moves any one SPU takes part in (leaving or arriving); the plan then stops
    short and says so, and planning again after those moves continues.
    """

    spus: Sequence[model.SpuInfo]
    partitions: Sequence[PartitionReplicas | tuple[str, Sequence[int]]]
    decommissioning: Sequence[int] = ()
    max_moves_per_spu: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "spus", tuple(self.spus))
        object.__setattr__(self, "partitions", tuple(self.partitions))
        object.__setattr__(self, "decommissioning", tuple(self.decommissioning))


@dataclasses.dataclass(frozen=True)
class Move:
    """A partition whose replica list changes: `before` and `after`, preferred leader first.

    Replicas keep their places: an SPU that leaves is replaced where it stood, so the leader
    stays first unless the leader itself moves (then the SPU taking its replica leads), or
    the leadership goes to another replica it already had (no data moved for that).
    """

    partition: str
    before: tuple[int, ...]
    after: tuple[int, ...]

    @property
    def placed(self) -> tuple[int, ...]:
        """The SPUs that receive a replica they did not hold: each one is data to copy."""
        return tuple(spu_id for spu_id in self.after if spu_id not in self.before)


@dataclasses.dataclass(frozen=True)
class Load:
    """Replicas and preferred leaderships per SPU, for every SPU of the request (in id order)."""

    replicas: dict[int, int]
    leaders: dict[int, int]


@dataclasses.dataclass(frozen=True)
class Targets:
    """What balanced means: each SPU that takes replicas holds `floor` or `ceiling` of them."""

    floor: int
    ceiling: int


@dataclasses.dataclass(frozen=True)
class Shortfall:
    """An SPU the plan leaves outside its targets, and why (`kind` is "replicas" or "leaders")."""

    spu: int
    kind: str
    count: int
    floor: int
    ceiling: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RebalancePlan:
    """The moves, their cost against the lower bound, and the load before and after.

    `replica_moves` counts replicas placed on an SPU that did not hold them; `lower_bound` is
    the sum over SPUs of their replicas above their target (see `planner`). `leader_changes`
    counts partitions whose preferred leader becomes a replica they already had (no data
    moved). `unreachable` lists every SPU left outside its targets with the reason, and
    `notes` says why the plan moves more than the lower bound when it does.
    """

    moves: tuple[Move, ...]
    replica_moves: int
    lower_bound: int
    leader_changes: int
    before: Load
    after: Load
    replica_targets: Targets
    leader_targets: Targets
    unreachable: tuple[Shortfall, ...]
    notes: tuple[str, ...]

    @property
    def balanced(self) -> bool:
        return not self.unreachable


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A checked request: partitions in natural name order, SPUs in id order, racks as keys."""

    names: tuple[str, ...]
    rows: tuple[tuple[int, ...], ...]
    spus: tuple[model.SpuInfo, ...]
    decommissioning: frozenset[int]
    max_moves_per_spu: int | None
    rack_keys: dict[int, spread.RackKeys]


def check(request: RebalanceRequest) -> Cluster:
    """Validate the request and put it in the planner's order (names sorted naturally: t-2 before t-10)."""
    spus = request.spus
    by_id: dict[int, model.SpuInfo] = {}
    for spu in spus:
        if not isinstance(spu, model.SpuInfo):
            raise model.InvalidConfig(f"spus must be SpuInfo values, got {spu!r}")
        if not _is_int(spu.id) or spu.id < 0:
            raise model.InvalidConfig(f"SPU id {spu.id!r} is not a non-negative integer")
        if spu.id in by_id:
            raise model.InvalidConfig(f"SPU id {spu.id} appears more than once in spus")
        if spu.rack is not None and (not isinstance(spu.rack, str) or not spu.rack.strip()):
            raise model.InvalidConfig(f"rack {spu.rack!r} of SPU {spu.id} must be a non-empty string or null")
        if not isinstance(spu.online, bool):
            raise model.InvalidConfig(f"online of SPU {spu.id} must be true or false, not {spu.online!r}")
        by_id[spu.id] = spu
    spread.check_racks(by_id.values())
    decommissioning: set[int] = set()
    for spu_id in request.decommissioning:
        if not _is_int(spu_id) or spu_id not in by_id:
            raise model.InvalidConfig(
                f"decommissioning SPU {spu_id!r} is not in spus (known: {model.format_ids(sorted(by_id))})"
            )
        decommissioning.add(spu_id)
    limit = request.max_moves_per_spu
    if limit is not None and (not _is_int(limit) or limit < 1):
        raise model.InvalidConfig(f"maxMovesPerSpu must be an integer of at least 1, got {limit!r}")
    seen: set[str] = set()
    entries: list[tuple[str, tuple[int, ...]]] = []
    for entry in request.partitions:
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise model.InvalidConfig(f"partition {entry!r} is not (name, [spu ids])")
        name, replicas = entry
        if not isinstance(name, str) or not name:
            raise model.InvalidConfig(f"partition name {name!r} must be a non-empty string")
        if name in seen:
            raise model.InvalidConfig(f"partition {name} appears more than once")
        seen.add(name)
        if not isinstance(replicas, tuple | list) or not replicas:
            raise model.InvalidConfig(f"partition {name} must list at least one replica, got {replicas!r}")
        for spu_id in replicas:
            if not _is_int(spu_id):
                raise model.InvalidConfig(f"partition {name} has replica {spu_id!r}, not an SPU id")
            if spu_id not in by_id:
                raise model.InvalidConfig(
                    f"partition {name} has a replica on SPU {spu_id}, which is not in spus: "
                    "list every SPU that holds replicas (online false for one that is down)"
                )
        if len(set(replicas)) != len(replicas):
            raise model.InvalidConfig(f"partition {name} repeats an SPU: {list(replicas)}")
        entries.append((name, tuple(replicas)))
    entries.sort(key=lambda entry: natural_key(entry[0]))
    ordered = tuple(sorted(by_id.values(), key=lambda spu: spu.id))
    return Cluster(
        names=tuple(name for name, _ in entries),
        rows=tuple(replicas for _, replicas in entries),
        spus=ordered,
        decommissioning=frozenset(decommissioning),
        max_moves_per_spu=limit,
        rack_keys={spu.id: spread.rack_keys(spu) for spu in ordered},
    )


_DIGITS = re.compile(r"([0-9]+)")


def natural_key(name: str) -> tuple[tuple[int, str | int], ...]:
    """`orders-2` before `orders-10`: digit runs compare as numbers (tagged, so text and numbers never meet)."""
    head, dash, index = name.rpartition("-")
    if dash and index.isdigit() and index.isascii() and not _DIGITS.search(head):
        return ((0, head + dash), (1, int(index)))  # the usual `<topic>-<index>`, without the regex split
    return tuple((1, int(part)) if part.isascii() and part.isdigit() else (0, part) for part in _DIGITS.split(name) if part)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
