"""Small builders shared by the placement tests (plain functions, no fixtures)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from controller import placement


def plain(count: int, *, first_id: int = 0) -> list[placement.SpuInfo]:
    """`count` online SPUs without racks, ids first_id, first_id + 1, ..."""
    return [placement.SpuInfo(id=first_id + index) for index in range(count)]


def racked(racks: dict[int, str]) -> list[placement.SpuInfo]:
    """Online SPUs with the given racks."""
    return [placement.SpuInfo(id=spu_id, rack=rack) for spu_id, rack in racks.items()]


def place(spus: Sequence[placement.SpuInfo], partitions: int, replication_factor: int, **options: Any) -> list[list[int]]:
    request = placement.PlacementRequest(
        spus=spus, partitions=partitions, replication_factor=replication_factor, **options
    )
    return placement.compute(request).replica_map


def leader_counts(replica_map: Iterable[Sequence[int]]) -> Counter[int]:
    return Counter(row[0] for row in replica_map)


def replica_counts(replica_map: Iterable[Sequence[int]]) -> Counter[int]:
    return Counter(spu_id for row in replica_map for spu_id in row)
