"""Live replica status (LRS): the offsets SPUs report for the partitions they lead, kept in memory.

Purely computational, no I/O. ``LiveReplicas.merge`` folds one report in and says whether it
changed something meaningful (who reports, or which followers are in sync); offsets alone
change many times a second and never reach the KV store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from connection_manager import wire


class ReplicaOffsets(NamedTuple):
    spu: int
    hw: int
    leo: int


class LiveStatus:
    """The last report of a partition's leader: its offsets and its followers' as it tracks them.

    Immutable by convention; its in-sync set is computed once, when the report is taken in."""

    __slots__ = ("leader", "hw", "leo", "followers", "reported_at", "_in_sync")

    def __init__(
        self,
        leader: int,
        hw: int,
        leo: int,
        followers: tuple[ReplicaOffsets, ...],
        reported_at: float,
        in_sync: frozenset[int] | None = None,
    ) -> None:
        self.leader = leader
        self.hw = hw
        self.leo = leo
        self.followers = followers
        self.reported_at = reported_at
        self._in_sync = in_sync_followers(hw, followers) if in_sync is None else in_sync

    def in_sync(self) -> frozenset[int]:
        """Followers holding every committed record: last reported LEO >= the leader's HW."""
        return self._in_sync

    def offsets_of(self, spu: int) -> ReplicaOffsets | None:
        if spu == self.leader:
            return ReplicaOffsets(spu, self.hw, self.leo)
        for follower in self.followers:
            if follower.spu == spu:
                return follower
        return None

    def _key(self) -> tuple[int, int, int, tuple[ReplicaOffsets, ...], float]:
        return (self.leader, self.hw, self.leo, self.followers, self.reported_at)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LiveStatus) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"LiveStatus(leader={self.leader}, hw={self.hw}, leo={self.leo}, "
            f"followers={self.followers!r}, reported_at={self.reported_at!r})"
        )


def in_sync_followers(leader_hw: int, followers: Iterable[ReplicaOffsets]) -> frozenset[int]:
    return frozenset(follower.spu for follower in followers if follower.leo >= leader_hw)


class LiveReplicas:
    """Partition name -> its leader's last LiveStatus. Written by the connection manager only."""

    def __init__(self) -> None:
        self._status: dict[str, LiveStatus] = {}
        self.reports = 0  # LeaderReports merged, for the intake metric

    def get(self, partition: str) -> LiveStatus | None:
        return self._status.get(partition)

    @property
    def view(self) -> Mapping[str, LiveStatus]:
        return self._status

    def merge(self, reporter: int, report: wire.LeaderReport, now: float) -> bool:
        """Store ``reporter``'s report; True when the reporter or the in-sync set changed.

        Called for every partition of every LRS frame (tens of thousands a second in a large
        cluster), so it builds one tuple and one set and compares nothing else."""
        self.reports += 1
        hw = report["hw"]
        followers = tuple([ReplicaOffsets(item["spu"], item["hw"], item["leo"]) for item in report.get("followers", ())])
        in_sync = frozenset([item.spu for item in followers if item.leo >= hw])
        name = report["partition"]
        previous = self._status.get(name)
        self._status[name] = LiveStatus(reporter, hw, report["leo"], followers, now, in_sync)
        return previous is None or previous.leader != reporter or previous._in_sync != in_sync

    def forget(self, partition: str) -> None:
        self._status.pop(partition, None)

    def forget_leader(self, spu: int) -> set[str]:
        """Drop every report ``spu`` made as leader; the names of the partitions concerned."""
        names = {name for name, status in self._status.items() if status.leader == spu}
        for name in names:
            del self._status[name]
        return names
