"""The cluster as every strategy sees it: eligible SPUs in id order, the RF check, rack layouts.

Purely computational, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from controller.placement import model

RackLayout = Literal["none", "flat", "paths"]


def eligible_spus(spus: Iterable[model.SpuInfo]) -> tuple[model.SpuInfo, ...]:
    """Online SPUs in id order: the only ones that may receive new replicas."""
    return tuple(sorted((spu for spu in spus if spu.online), key=lambda spu: spu.id))


def require_replicas(spus: Sequence[model.SpuInfo], replication_factor: int) -> None:
    """Raise InsufficientResources unless there are at least `replication_factor` online SPUs."""
    online = [spu.id for spu in sorted(spus, key=lambda spu: spu.id) if spu.online]
    if replication_factor <= len(online):
        return
    offline = [spu.id for spu in sorted(spus, key=lambda spu: spu.id) if not spu.online]
    missing = replication_factor - len(online)
    plural = "s" if replication_factor != 1 else ""
    if online:
        verb = "is" if len(online) == 1 else "are"
        have = f"only {len(online)} {verb} online (ids {model.format_ids(online)})"
    else:
        have = "none is online"
    message = (
        f"replication factor {replication_factor} needs {replication_factor} online SPU{plural}, "
        f"{have}: {missing} more needed"
    )
    if offline:
        message += f" (offline: {model.format_ids(offline)})"
    raise model.InsufficientResources(message, needed_spus=missing)


def rack_layout(spus: Sequence[model.SpuInfo], *, ignore_racks: bool = False) -> RackLayout:
    """How the eligible SPUs' racks are written: none, flat labels, or `/a/b` paths.

    A partial layout (some SPUs with a rack, some without) is an InvalidConfig naming the
    SPUs without one, never a silent fallback to rack-unaware placement.
    """
    if ignore_racks or not spus:
        return "none"
    without = [spu.id for spu in spus if spu.rack is None]
    if len(without) == len(spus):
        return "none"
    if without:
        spus_without = f"SPU{'s' if len(without) > 1 else ''} {model.format_ids(without)}"
        raise model.InvalidConfig(
            f"rack-aware placement needs a rack on every online SPU, but {spus_without} "
            f"{'have' if len(without) > 1 else 'has'} none: give {spus_without} a rack (sc spu set-rack ID --rack R), "
            "or create the topic with ignoreRackAssignment: true (sc topic create --ignore-rack-assignment)",
            fix=model.Fix.CLUSTER,
        )
    paths = [spu for spu in spus if spu.rack is not None and spu.rack.startswith("/")]
    if not paths:
        return "flat"
    if len(paths) != len(spus):
        flat = [f"{spu.id} ({spu.rack!r})" for spu in spus if not (spu.rack or "").startswith("/")]
        raise model.InvalidConfig(
            "racks must be all paths (/dc/rack) or all plain labels, not a mix: "
            f"SPU{'s' if len(flat) > 1 else ''} {', '.join(flat[:10])} "
            f"{'are' if len(flat) > 1 else 'is'} not a path while SPU {paths[0].id} has {paths[0].rack!r}",
            fix=model.Fix.CLUSTER,
        )
    return "paths"


def alternate(groups: Sequence[Sequence[int]]) -> list[int]:
    """One id from each group in turn, skipping exhausted groups: [[0, 5], [3], [1, 2]] gives 0, 3, 1, 5, 2.

    Kafka's rack-alternated broker list and the policies' zig-zag over locations.
    """
    deepest = max((len(group) for group in groups), default=0)
    return [group[depth] for depth in range(deepest) for group in groups if depth < len(group)]


def rack_path(spu: model.SpuInfo) -> tuple[str, ...]:
    """The levels of an SPU's rack: `/dc1/r2` gives ("dc1", "r2"); a plain label is one level."""
    rack = spu.rack
    if rack is None:
        return ()
    if not rack.startswith("/"):
        return (rack,)
    parts = tuple(rack[1:].split("/"))
    if any(part == "" for part in parts):
        raise model.InvalidConfig(
            f"rack {rack!r} of SPU {spu.id} is not a valid path: write it as /level1/level2 with no empty level",
            fix=model.Fix.CLUSTER,
        )
    return parts


def location(spu: model.SpuInfo) -> str | None:
    """The top level of an SPU's rack (its site / data centre), or None without a rack."""
    path = rack_path(spu)
    return path[0] if path else None
