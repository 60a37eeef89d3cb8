"""The one entry point: check a placement request, keep current partitions, run the chosen strategy.

Purely computational, no I/O. A plug-in named in the request must be one of the placers the
caller hands in (the operator's configuration): nothing a request names is ever imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from controller.placement import cluster, computed, kafka, least_loaded, manual, model, multilevel, plugins, policies

_STRATEGIES: dict[str, Callable[[model.Run], list[list[int]]]] = {
    "computed": computed.place,
    "kafka": kafka.place,
    "least-loaded": least_loaded.place,
    "multi-level": multilevel.place,
    "policies": policies.place,
}


_NO_PLACERS: Mapping[str, plugins.ReplicaPlacer] = {}


def compute(request: model.PlacementRequest, placers: plugins.Placers = _NO_PLACERS) -> model.PlacementResult:
    """Place the partitions the request asks for, or raise InsufficientResources / InvalidConfig.

    Partitions in `current_replica_map` keep their replicas; the others are placed as one run
    starting at `start_index`, and `next_start_index` is `start_index` plus the number of
    partitions placed (a manual assignment places none). Policies select the policies
    strategy unless another one is named. A plug-in, when named (as the strategy, or as
    `plugin` in front of a built-in strategy), must be one of `placers`; it is asked first,
    and if it returns None the strategy runs (computed, when the plug-in is the strategy).
    """
    last = _last_spus
    if last is None or last[0] is not request.spus:
        _check_spus_once(request.spus)
    strategy, plugin = _strategy_and_plugin(request, placers)
    if strategy == "manual":
        return manual.place(request)
    _check_counts(request)
    current = request.current_replica_map
    _check_current(request)
    count = request.partitions - len(current)
    replica_map = [list(row) for row in current]
    if count == 0:
        return model.PlacementResult(replica_map=replica_map, next_start_index=request.start_index)
    cluster.require_replicas(request.spus, request.replication_factor)
    run = model.Run(
        spus=_eligible(request.spus),
        count=count,
        first_partition=len(current),
        replication_factor=request.replication_factor,
        start_index=request.start_index,
        request=request,
    )
    placed = plugins.place(plugin, placers[plugin], run) if plugin is not None else None
    if placed is None:
        placed = _STRATEGIES[strategy](run)
    replica_map.extend(placed)
    return model.PlacementResult(replica_map=replica_map, next_start_index=request.start_index + count)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_spus_once(spus: object) -> None:
    """The SPU checks, remembered for the last few SPU lists: a controller pass places many
    topics on the same cluster, and checking 1,000 SPUs each time would dominate."""
    try:
        key: tuple[model.SpuInfo, ...] = tuple(spus)  # type: ignore[arg-type]  # any input: a non-iterable raises TypeError, caught here
        hash(key)
    except TypeError:
        _check_spus(spus)
        return
    if len(key) > model.CACHED_SPUS_LIMIT:
        _check_spus(key)  # not remembered: a placement request's list may be huge
        return
    _checked_spus(key)


@functools.lru_cache(maxsize=8)
def _checked_spus(spus: tuple[model.SpuInfo, ...]) -> None:
    _check_spus(spus)


# The last SPU tuple placed on, and its eligible SPUs. A controller pass places every topic on
# one tuple (immutable, of frozen SpuInfo): while it is the same object, it was checked, and
# neither the checks nor hashing 100 SPUs twice per topic (for the caches below) are repeated.
_last_spus: tuple[tuple[model.SpuInfo, ...], tuple[model.SpuInfo, ...]] | None = None


def _eligible(spus: object) -> tuple[model.SpuInfo, ...]:
    global _last_spus
    last = _last_spus
    if last is not None and last[0] is spus:
        return last[1]
    listed: tuple[model.SpuInfo, ...] = tuple(spus)  # type: ignore[arg-type]  # checked by _check_spus_once before any placement
    if len(listed) > model.CACHED_SPUS_LIMIT:
        return cluster.eligible_spus(listed)  # not remembered: a placement request's list may be huge
    eligible = _eligible_cached(listed)
    if type(spus) is tuple:
        _last_spus = (spus, eligible)
    return eligible


@functools.lru_cache(maxsize=8)
def _eligible_cached(spus: tuple[model.SpuInfo, ...]) -> tuple[model.SpuInfo, ...]:
    return cluster.eligible_spus(spus)


def _check_spus(spus: object) -> None:
    if not isinstance(spus, list | tuple):
        raise model.InvalidConfig(f"spus must be a list of SpuInfo values, got {spus!r}")
    seen: set[int] = set()
    for spu in spus:
        if not isinstance(spu, model.SpuInfo):
            raise model.InvalidConfig(f"spus must be SpuInfo values, got {spu!r}")
        if not _is_int(spu.id) or spu.id < 0:
            raise model.InvalidConfig(f"SPU id {spu.id!r} is not a non-negative integer")
        if spu.id in seen:
            raise model.InvalidConfig(f"SPU id {spu.id} appears more than once in spus")
        seen.add(spu.id)
        if spu.rack is not None and (not isinstance(spu.rack, str) or not spu.rack.strip()):
            raise model.InvalidConfig(f"rack {spu.rack!r} of SPU {spu.id} must be a non-empty string or null")
        if not isinstance(spu.online, bool):
            raise model.InvalidConfig(f"online of SPU {spu.id} must be true or false, not {spu.online!r}")


def check_strategy(strategy: str, placers: plugins.Placers) -> None:
    """Raise InvalidConfig unless `strategy` is built in or the name of a configured placer."""
    if strategy in model.STRATEGIES or strategy in placers:
        return
    configured = ", ".join(sorted(placers)) or "none"
    built_in = ", ".join(model.STRATEGIES)
    if ":" in strategy:
        # A module reference: what a spec could name before plug-ins were the operator's to load.
        raise model.InvalidConfig(
            f"placement strategy {strategy!r} names a module: a topic names a built-in strategy ({built_in}) or "
            f"a placement plug-in configured on this SC, by its name (configured: {configured}); the SC "
            f"imports only the plug-ins its operator configures ({_CONFIGURE})"
        )
    raise model.InvalidConfig(
        f"placement strategy {strategy!r} is neither built in ({built_in}) nor a placement plug-in configured "
        f"on this SC (configured: {configured}); {_CONFIGURED_BY}",
        fix=model.Fix.PLUGINS,
    )


_CONFIGURE = "sc run --placement-plugin NAME=module:Class"
_CONFIGURED_BY = f"plug-ins are configured by the operator ({_CONFIGURE})"


def _strategy_and_plugin(request: model.PlacementRequest, placers: plugins.Placers) -> tuple[str, str | None]:
    strategy, plugin = request.strategy, request.plugin
    if not isinstance(strategy, str):
        raise model.InvalidConfig(f"strategy must be a string, not {strategy!r}")
    if plugin is not None and not isinstance(plugin, str):
        raise model.InvalidConfig(f"plugin must be a string, not {plugin!r}")
    check_strategy(strategy, placers)
    if strategy not in model.STRATEGIES:
        if plugin is not None and plugin != strategy:
            raise model.InvalidConfig(f"strategy {strategy!r} and plugin {plugin!r} name two different plug-ins")
        strategy, plugin = "computed", strategy
    elif plugin is not None and plugin not in placers:
        raise model.InvalidConfig(
            f"placement plug-in {plugin!r} is not configured on this SC "
            f"(configured: {', '.join(sorted(placers)) or 'none'}); {_CONFIGURED_BY}",
            fix=model.Fix.SPEC if ":" in plugin else model.Fix.PLUGINS,
        )
    if request.policies is not None and not isinstance(request.policies, str):
        raise model.InvalidConfig(f"placement policies must be a string, not {request.policies!r}")
    if request.policies is not None and request.policies.strip():
        if strategy == "computed":
            strategy = "policies"  # the default strategy gives way to policies a topic carries
        elif strategy != "policies":
            raise model.InvalidConfig(
                f"placement policies {request.policies!r} only apply to strategy policies, not {strategy}"
            )
    if request.replica_assignment is not None and strategy != "manual":
        raise model.InvalidConfig(f"a replica assignment needs strategy manual, not {strategy}")
    if plugin is not None and strategy == "manual":
        raise model.InvalidConfig("a manual replica assignment cannot be handed to a placement plug-in")
    return strategy, plugin


def _check_counts(request: model.PlacementRequest) -> None:
    for name, value, lowest in (
        ("partitions", request.partitions, 1),
        ("replication factor", request.replication_factor, 1),
        ("start index", request.start_index, 0),
    ):
        if not _is_int(value) or value < lowest:
            raise model.InvalidConfig(f"{name} must be an integer of at least {lowest}, got {value!r}")
    for entry in request.existing:
        if (
            not isinstance(entry, tuple | list)
            or len(entry) != 3
            or not _is_int(entry[1])
            or not isinstance(entry[2], tuple | list)
            or not all(_is_int(spu_id) for spu_id in entry[2])
        ):
            raise model.InvalidConfig(f"existing partition {entry!r} is not (topic, partition, [spu ids])")


def _check_current(request: model.PlacementRequest) -> None:
    current = request.current_replica_map
    if len(current) > request.partitions:
        raise model.InvalidConfig(
            f"the topic already has {len(current)} partitions, more than the {request.partitions} asked for: "
            "partitions can be added, not removed"
        )
    for partition, row in enumerate(current):
        if not all(_is_int(spu_id) and spu_id >= 0 for spu_id in row):
            raise model.InvalidConfig(f"current partition {partition} has replicas {list(row)!r}, not SPU ids")
        if len(set(row)) != len(row):
            raise model.InvalidConfig(f"current partition {partition} repeats an SPU: {list(row)}")
        if len(row) != request.replication_factor:
            raise model.InvalidConfig(
                f"current partition {partition} has {len(row)} replicas but the replication factor is "
                f"{request.replication_factor}: existing partitions keep their replicas, so the replication "
                "factor cannot change here"
            )
