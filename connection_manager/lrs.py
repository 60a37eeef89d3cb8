"""Live replica status (LRS): the offsets leaders report for the partitions they lead, kept in memory.

Purely computational, no I/O. Offsets are for people (the API) and audits only: no decision of
the SC depends on them, so they never reach the KV store on their own. ``LiveReplicas`` also
keeps the highest high watermark any leader reported per partition (in an Offsets entry, or with a
proposal the SC committed), which the SC shows and writes with the partition's next status write,
so the committed offset it shows never goes back; a restarted replica leads again only if it holds
that much (the one decision an offset takes part in). The connection manager checks what it merges
(a HW never passes its log end).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import NamedTuple

from connection_manager import wire

UNKNOWN_OFFSET = -1


class ReplicaOffsets(NamedTuple):
    spu: int
    hw: int
    leo: int


class LiveStatus(NamedTuple):
    """The last report of a partition's leader at ``leader_epoch``: its offsets and its followers'."""

    leader: int
    leader_epoch: int
    hw: int
    leo: int
    followers: tuple[ReplicaOffsets, ...]
    reported_at: float

    def offsets_of(self, spu: int) -> ReplicaOffsets | None:
        if spu == self.leader:
            return ReplicaOffsets(spu, self.hw, self.leo)
        for follower in self.followers:
            if follower.spu == spu:
                return follower
        return None


class LiveReplicas:
    """Partition name -> its leader's last LiveStatus. Written by the connection manager only."""

    def __init__(self) -> None:
        self._status: dict[str, LiveStatus] = {}
        self._max_hw: dict[str, int] = {}
        self.reports = 0  # partition entries merged, for the intake metric

    def get(self, partition: str) -> LiveStatus | None:
        return self._status.get(partition)

    @property
    def view(self) -> Mapping[str, LiveStatus]:
        return self._status

    @property
    def max_hws(self) -> Mapping[str, int]:
        return self._max_hw

    def max_hw(self, partition: str) -> int:
        """The highest high watermark reported for ``partition`` since this SC started (-1: none)."""
        return self._max_hw.get(partition, UNKNOWN_OFFSET)

    def merge(self, reporter: int, entry: wire.PartitionOffsets, now: float) -> None:
        """Store ``reporter``'s entry; the caller checked that it leads the partition at that epoch."""
        self.reports += 1
        name, hw = entry["partition"], entry["hw"]
        followers = tuple([ReplicaOffsets(item["spu"], item["hw"], item["leo"]) for item in entry.get("followers", ())])
        self._status[name] = LiveStatus(reporter, entry["leader_epoch"], hw, entry["leo"], followers, now)
        if hw > self._max_hw.get(name, UNKNOWN_OFFSET):
            self._max_hw[name] = hw

    def committed(self, partition: str, hw: int) -> None:
        """The current leader of ``partition`` said (in a proposal the SC committed) that its HW reached ``hw``."""
        if hw > self._max_hw.get(partition, UNKNOWN_OFFSET):
            self._max_hw[partition] = hw

    def forget_statuses(self) -> None:
        """Every leader's status goes (its connection did): the next ones come with the new
        connections. The highest HWs stay: a committed offset stays committed."""
        self._status.clear()

    def keep_only(self, partitions: Container[str]) -> None:
        """Forget every partition that ``partitions`` does not hold (deleted while nobody was told)."""
        for table in (self._status, self._max_hw):
            for name in [name for name in table if name not in partitions]:
                del table[name]

    def forget(self, partition: str) -> None:
        """A deleted partition: a new one of the same name starts from nothing."""
        self._status.pop(partition, None)
        self._max_hw.pop(partition, None)
