"""Pluggable placers (the KIP's ReplicaPlacer): the interface, asking a placer, checking its answer.

Purely computational, no I/O, and no import of anything a request names: placers arrive already
created, by name, from the operator's configuration (loaded by controller/placement_plugins.py).
A placer sees the cluster view (SPUs and the current assignment) and may return None to defer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from controller.placement import model


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """What a placer may look at: every SPU (online or not) and the partitions already placed."""

    spus: tuple[model.SpuInfo, ...]
    assignments: Mapping[tuple[str, int], tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class PlacementSpec:
    """What to place: `count` new partitions from index `first_partition` (after the topic's current ones)."""

    count: int
    first_partition: int
    replication_factor: int
    start_index: int
    current_replica_map: tuple[tuple[int, ...], ...]
    ignore_rack_assignment: bool
    policies: str | None


@runtime_checkable
class ReplicaPlacer(Protocol):
    """Implemented by plug-ins (configured as NAME=module:Class, instantiated with no arguments)."""

    def place(
        self, spec: PlacementSpec, cluster: ClusterView, spu_ids: Sequence[int]
    ) -> Sequence[Sequence[int]] | None:
        """One replica list per new partition (leader first) using only `spu_ids`, or None to defer."""
        ...


# The configured placers by the name a topic's placement.strategy gives them.
Placers = Mapping[str, ReplicaPlacer]


def place(name: str, placer: ReplicaPlacer, run: model.Run) -> list[list[int]] | None:
    """Ask the plug-in; None means it defers. Its answer is checked like any other placement."""
    request = run.request
    assignments = {
        (str(entry[0]), int(entry[1])): tuple(int(spu_id) for spu_id in entry[2]) for entry in request.existing
    }
    spec = PlacementSpec(
        count=run.count,
        first_partition=run.first_partition,
        replication_factor=run.replication_factor,
        start_index=run.start_index,
        current_replica_map=tuple(tuple(row) for row in request.current_replica_map),
        ignore_rack_assignment=request.ignore_rack_assignment,
        policies=request.policies,
    )
    view = ClusterView(spus=tuple(request.spus), assignments=assignments)
    try:
        answer = placer.place(spec, view, run.ids)
    except model.PlacementError:
        raise
    except Exception as error:  # a plug-in bug must not crash the controller
        raise _failed(f"placement plug-in {name!r} failed: {type(error).__name__}: {error}") from error
    if answer is None:
        return None
    return _checked(name, answer, run)


def _failed(message: str) -> model.InvalidConfig:
    # The plug-in is the operator's: fixing or replacing it makes the same topic placeable.
    return model.InvalidConfig(message, fix=model.Fix.PLUGINS)


def _checked(name: str, answer: object, run: model.Run) -> list[list[int]]:
    if not isinstance(answer, Sequence) or len(answer) != run.count:
        size = len(answer) if isinstance(answer, Sequence) else type(answer).__name__
        raise _failed(
            f"placement plug-in {name!r} returned {size} replica lists, {run.count} were asked for"
        )
    eligible = set(run.ids)
    replica_map: list[list[int]] = []
    for offset, replicas in enumerate(answer):
        partition = run.first_partition + offset
        if not isinstance(replicas, Sequence) or isinstance(replicas, str):
            raise _failed(f"placement plug-in {name!r}: partition {partition} is {replicas!r}, not a list")
        row = list(replicas)
        if len(row) != run.replication_factor:
            raise _failed(
                f"placement plug-in {name!r}: partition {partition} has {len(row)} replicas, "
                f"the replication factor is {run.replication_factor}"
            )
        strangers = [
            spu_id for spu_id in row if not (type(spu_id) is int and spu_id in eligible)  # noqa: E721 (bool is no id)
        ]
        if strangers:
            raise _failed(
                f"placement plug-in {name!r}: partition {partition} uses {strangers}, which "
                f"{'are' if len(strangers) > 1 else 'is'} not an online SPU"
            )
        if len(set(row)) != len(row):
            raise _failed(f"placement plug-in {name!r}: partition {partition} repeats an SPU: {row}")
        replica_map.append(row)
    return replica_map
