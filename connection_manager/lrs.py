"""Live replica status (LRS): the offsets SPUs report for the partitions they lead, kept in memory.

Purely computational, no I/O. ``LiveReplicas.merge`` folds one report in and says whether it
changed something meaningful (who reports, or which followers are in sync); offsets alone
change many times a second and never reach the KV store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from connection_manager import wire


@dataclass(frozen=True, slots=True)
class ReplicaOffsets:
    spu: int
    hw: int
    leo: int


@dataclass(frozen=True, slots=True)
class LiveStatus:
    """The last report of a partition's leader: its offsets and its followers' as it tracks them."""

    leader: int
    hw: int
    leo: int
    followers: tuple[ReplicaOffsets, ...]
    reported_at: float

    def in_sync(self) -> frozenset[int]:
        """Followers holding every committed record: last reported LEO >= the leader's HW."""
        return in_sync_followers(self.hw, self.followers)

    def offsets_of(self, spu: int) -> ReplicaOffsets | None:
        if spu == self.leader:
            return ReplicaOffsets(spu, self.hw, self.leo)
        for follower in self.followers:
            if follower.spu == spu:
                return follower
        return None


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
        """Store ``reporter``'s report; True when the reporter or the in-sync set changed."""
        self.reports += 1
        followers = tuple(ReplicaOffsets(item.spu, item.hw, item.leo) for item in report.followers)
        previous = self._status.get(report.partition)
        status = LiveStatus(reporter, report.hw, report.leo, followers, now)
        self._status[report.partition] = status
        if previous is None or previous.leader != reporter:
            return True
        return previous.in_sync() != status.in_sync()

    def forget(self, partition: str) -> None:
        self._status.pop(partition, None)
