"""Rack spread as least-loaded placement and the rebalance planner both measure it: per rack level.

Purely computational, no I/O. A plain rack label is one level; a path rack (`/dc1/r2`) is
measured at its top level (`dc1`, the site) and at its leaf (the whole path); middle levels of
deeper paths are not counted on their own (a leaf names them anyway).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controller.placement import cluster, model

RackKeys = tuple[str, ...]


def rack_keys(spu: model.SpuInfo) -> RackKeys:
    """`()` without a rack, `(label,)` for a plain one, `(top, leaf)` for a path.

    A one-level path (`/dc1`) is its own top and leaf, so every path SPU has two keys and the
    levels of two SPUs always line up.
    """
    path = cluster.rack_path(spu)
    if not path:
        return ()
    if spu.rack is not None and not spu.rack.startswith("/"):
        return (path[0],)
    return (path[0], "/" + "/".join(path))


def check_racks(spus: Iterable[model.SpuInfo]) -> None:
    """Refuse racks that mix plain labels and paths: their levels cannot be compared.

    SPUs without a rack are allowed beside either: they add no rack to a partition's spread.
    """
    paths: model.SpuInfo | None = None
    plain: model.SpuInfo | None = None
    for spu in sorted(spus, key=lambda spu: spu.id):
        keys = rack_keys(spu)  # also refuses malformed paths, naming the SPU
        if len(keys) == 2 and paths is None:
            paths = spu
        elif len(keys) == 1 and plain is None:
            plain = spu
    if paths is not None and plain is not None:
        raise model.InvalidConfig(
            "racks must be all paths (/dc/rack) or all plain labels, not a mix: "
            f"SPU {plain.id} has {plain.rack!r} while SPU {paths.id} has {paths.rack!r}"
        )


def spread(keys: Sequence[RackKeys], levels: int) -> tuple[int, ...]:
    """How many distinct racks a partition's replicas span, per level (SPUs without a rack add none)."""
    return tuple(len({entry[level] for entry in keys if entry}) for level in range(levels))
