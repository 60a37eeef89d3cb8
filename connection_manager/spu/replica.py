"""One partition replica on a simulated SPU, offsets only: a leader (appends, serves fetches, ISR, HW) or a follower.

Purely computational, no I/O: time is passed in (loop seconds). The rules are Kafka's, written out
in the docstrings below, so a test can state every offset exactly.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from connection_manager import wire


class Role(str, enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    IDLE = "idle"  # the partition has no leader: this replica neither appends nor fetches


class ReplicaError(ValueError):
    """An operation this replica cannot perform in its role, or an answer that contradicts itself."""


@dataclass(slots=True)
class FollowerProgress:
    """The leader's view of one follower, updated by each of its fetches."""

    leo: int  # the follower's fetch offset: every record below it is on the follower
    hw: int  # the high watermark the follower said it has
    last_fetch_at: float
    last_fetch_leader_leo: int  # the leader's LEO when that fetch arrived
    last_caught_up_at: float | None  # last moment the follower had every record the leader had; None: never


@dataclass(frozen=True, slots=True)
class Served:
    """A leader's answer to one partition of a fetch: its offsets and how many records it sends from ``offset``."""

    offset: int  # the follower's fetch offset, as asked
    leo: int
    hw: int
    records: int


class Replica:
    """A partition replica hosted by ``spu_id``. Starts idle; ``assign`` gives it its role.

    Leader rules:
    - ``append`` grows the LEO.
    - A fetch at offset ``o`` tells the leader the follower has every record below ``o``. The
      follower "caught up" at that fetch if ``o`` >= the leader's LEO, or, failing that, at its
      previous fetch if ``o`` >= the leader's LEO at that previous fetch (Kafka's rule, so a
      follower that keeps pace with a steady producer counts as caught up).
    - The ISR is the leader plus the followers that caught up within ``lag_time`` seconds. A
      follower joins when it caught up within the window and its LEO >= the HW; it leaves when
      its last catch-up is older than the window, or its fetch offset fell below the HW (it
      restarted without its records).
    - HW = the lowest LEO in the ISR, and never moves back. A new leader starts with an ISR of
      itself alone, so its HW becomes its LEO (the seed's "the new leader chooses its LEO as the
      new HW"); followers join once they fetch.
    - A fetch at an offset past the leader's LEO is served as if at the leader's LEO: the follower
      truncates (a former leader's records the new leader never got).
    - ``max_records`` bounds the records one fetch carries, so catching up takes several rounds.

    Follower rules: ``apply_fetched`` takes the leader's answer to the fetch it sent at its LEO;
    an answer for another offset or another leader is stale and ignored. New LEO = min(offset,
    leader LEO) + records; HW = min(leader HW, LEO).
    """

    def __init__(self, partition: str, spu_id: int, lag_time: float, leo: int = 0, hw: int = 0) -> None:
        if lag_time <= 0:
            raise ReplicaError(f"replica lag time must be positive, got {lag_time!r} seconds")
        if leo < 0 or hw < 0:
            raise ReplicaError(f"offsets of partition {partition!r} cannot be negative: leo {leo}, hw {hw}")
        self.partition = partition
        self.spu_id = spu_id
        self.lag_time = lag_time
        self.leo = leo
        self.hw = min(hw, leo)
        self.role = Role.IDLE
        self.leader: int | None = None
        self.replicas: tuple[int, ...] = ()
        self.followers: dict[int, FollowerProgress] = {}  # leader only: followers heard from since it leads
        self.in_sync: set[int] = set()  # leader only: followers in the ISR (the leader is implied)

    # ------------------------------------------------------------------ roles

    def assign(self, leader: int | None, replicas: Iterable[int], now: float) -> None:
        """Take the role the SC gives: leader, follower of ``leader``, or idle when ``leader`` is None."""
        self.replicas = tuple(replicas)
        if leader == self.spu_id:
            if self.role is not Role.LEADER:
                self.followers.clear()
                self.in_sync.clear()
            self.role = Role.LEADER
            for spu in [spu for spu in self.followers if spu not in self.replicas]:
                del self.followers[spu]
                self.in_sync.discard(spu)
            self.refresh(now)
        else:
            self.role = Role.IDLE if leader is None else Role.FOLLOWER
            self.followers.clear()
            self.in_sync.clear()
        self.leader = leader

    # ------------------------------------------------------------------ leader

    def append(self, records: int, now: float) -> None:
        if self.role is not Role.LEADER:
            raise ReplicaError(f"partition {self.partition!r}: only its leader appends, this replica is {self.role.value}")
        if records < 0:
            raise ReplicaError(f"partition {self.partition!r}: cannot append {records} records")
        self.leo += records
        self.refresh(now)

    def serve_fetch(self, follower: int, offset: int, follower_hw: int, max_records: int, now: float) -> Served:
        """Record ``follower``'s fetch at ``offset`` and answer it with at most ``max_records`` records."""
        if self.role is not Role.LEADER:
            raise ReplicaError(f"partition {self.partition!r}: only its leader serves fetches, this replica is {self.role.value}")
        if offset < 0 or max_records < 0:
            raise ReplicaError(
                f"partition {self.partition!r}: fetch offset {offset} and max records {max_records} must not be negative"
            )
        position = min(offset, self.leo)
        progress = self.followers.get(follower)
        if progress is None:
            progress = self.followers[follower] = FollowerProgress(position, 0, now, self.leo, None)
            if position >= self.leo:
                progress.last_caught_up_at = now
        else:
            if position >= self.leo:
                progress.last_caught_up_at = now
            elif position >= progress.last_fetch_leader_leo:
                # It had, at its previous fetch, every record the leader had then.
                caught_up = progress.last_caught_up_at
                progress.last_caught_up_at = progress.last_fetch_at if caught_up is None else max(caught_up, progress.last_fetch_at)
        progress.leo = position
        progress.hw = min(follower_hw, position)
        progress.last_fetch_at = now
        progress.last_fetch_leader_leo = self.leo
        self.refresh(now)
        return Served(offset, self.leo, self.hw, min(self.leo - position, max_records))

    def refresh(self, now: float) -> None:
        """Apply the ISR rules at ``now`` (followers leave or join) and advance the HW."""
        if self.role is not Role.LEADER:
            return
        for spu in sorted(self.in_sync):
            progress = self.followers[spu]
            if progress.leo < self.hw or not self._caught_up_recently(progress, now):
                self.in_sync.discard(spu)
        for spu, progress in self.followers.items():
            if spu not in self.in_sync and progress.leo >= self.hw and self._caught_up_recently(progress, now):
                self.in_sync.add(spu)
        self.hw = max(self.hw, min([self.leo, *(self.followers[spu].leo for spu in self.in_sync)]))

    def _caught_up_recently(self, progress: FollowerProgress, now: float) -> bool:
        return progress.last_caught_up_at is not None and now - progress.last_caught_up_at <= self.lag_time

    def report(self, now: float) -> wire.LeaderReport:
        """The LRS entry for this partition: the leader's offsets and each follower heard from, by id."""
        if self.role is not Role.LEADER:
            raise ReplicaError(f"partition {self.partition!r}: only its leader reports, this replica is {self.role.value}")
        self.refresh(now)
        followers = [
            wire.ReplicaOffsets(spu=spu, hw=progress.hw, leo=progress.leo)
            for spu, progress in sorted(self.followers.items())
        ]
        return wire.LeaderReport(partition=self.partition, hw=self.hw, leo=self.leo, followers=followers)

    # ------------------------------------------------------------------ follower

    def apply_fetched(self, leader: int, served: Served) -> bool:
        """Take ``leader``'s answer; False (nothing changed) when it is stale: another leader or offset."""
        if self.role is not Role.FOLLOWER or leader != self.leader or served.offset != self.leo:
            return False
        start = min(served.offset, served.leo)
        if served.records < 0 or start + served.records > served.leo or served.hw > served.leo:
            raise ReplicaError(
                f"partition {self.partition!r}: leader {leader} answered a fetch at offset {served.offset} with "
                f"{served.records} records, LEO {served.leo}, HW {served.hw}, which do not add up"
            )
        self.leo = start + served.records
        self.hw = min(served.hw, self.leo)
        return True
