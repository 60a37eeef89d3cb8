"""Placement plug-ins for the tests: what an operator would configure with --placement-plugin.

Each implements ReplicaPlacer (or fails to, on purpose); none reads or writes anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from controller import placement


class HighestFirst:
    """Every partition on the highest online ids, the highest leading: unlike any built-in strategy."""

    def place(
        self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]
    ) -> list[list[int]]:
        ordered = sorted(spu_ids, reverse=True)
        return [ordered[: spec.replication_factor] for _ in range(spec.count)]


class Chatty(HighestFirst):
    """Prints as it places, as a plug-in under development might: what it prints is its own affair."""

    def place(
        self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]
    ) -> list[list[int]]:
        print("placing", spec.count, "partitions")
        return super().place(spec, cluster, spu_ids)


class Hangs:
    """Answers after a minute, as a plug-in stuck on something would."""

    def place(self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]) -> None:
        time.sleep(60)


class Defers:
    """Leaves every placement to the strategy the request names."""

    def place(self, spec: placement.PlacementSpec, cluster: placement.ClusterView, spu_ids: Sequence[int]) -> None:
        return None


class BrokenAtStart:
    """Cannot be created: the daemon must refuse to start with it, naming it."""

    def __init__(self) -> None:
        raise RuntimeError("no licence file")


class NoPlaceMethod:
    """Not a ReplicaPlacer at all."""


# Not a class at all, as an operator might name by mistake.
HERE_IS_NOT_A_CLASS = "a string"
