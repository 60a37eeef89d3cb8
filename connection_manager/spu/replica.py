"""One partition replica on a simulated SPU, offsets and leader epochs only: a leader (appends,
serves fetches, computes the HW over the committed in-sync set, proposes changes to it) or a follower.

Purely computational, no I/O: time is passed in (loop seconds). The rules are the protocol's
(docs/replication.md), written out in the docstrings below so a test can state every offset.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NOT_LEADER = "not-leader"
NOT_A_REPLICA = "not-a-replica"
FENCED_LEADER_EPOCH = "fenced-leader-epoch"  # the follower's epoch is older than the leader's
UNKNOWN_LEADER_EPOCH = "unknown-leader-epoch"  # newer: this leader has probably been replaced
INCONSISTENT_PARTITION = "inconsistent-partition"  # another partition of that name (another uid)
NO_EPOCH = -1  # the last epoch of an empty log


class Role(str, enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    IDLE = "idle"  # no leader it may follow (or it learned its epoch is over): neither appends nor fetches


class ReplicaError(ValueError):
    """An operation this replica cannot perform in its role, or an answer that contradicts itself."""


class EpochLog:
    """A log as offsets only: its end (LEO) and the leader epoch of its records, as runs
    ``[(epoch, start offset), ...]`` (each run holds at least one record, epochs increase). Two
    replicas' logs are identical up to an offset when their runs agree up to it (Kafka's leader
    epoch cache, KIP-101)."""

    def __init__(self, leo: int = 0, runs: Iterable[tuple[int, int]] = ()) -> None:
        self.leo = leo
        self.runs: list[tuple[int, int]] = [(epoch, start) for epoch, start in runs]
        epochs = [epoch for epoch, _ in self.runs]
        starts = [start for _, start in self.runs]
        valid = (
            leo >= 0
            and epochs == sorted(set(epochs))
            and starts == sorted(set(starts))
            and all(0 <= start < leo for start in starts)
            and (not self.runs or self.runs[0][1] == 0)
            and (self.runs or leo == 0)
        )
        if not valid:
            raise ReplicaError(f"epoch runs {self.runs} do not describe a log ending at {leo}")

    @property
    def last_epoch(self) -> int:
        return self.runs[-1][0] if self.runs else NO_EPOCH

    def append(self, epoch: int, records: int) -> None:
        if records <= 0:
            return
        if self.last_epoch != epoch:
            if epoch < self.last_epoch:
                raise ReplicaError(f"cannot append records of epoch {epoch} after epoch {self.last_epoch}")
            self.runs.append((epoch, self.leo))
        self.leo += records

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """KIP-101/279's OffsetsForLeaderEpoch: (the largest epoch <= ``epoch`` this log holds, the
        offset where it ends: the next run's start, or the LEO); (NO_EPOCH, 0) if none."""
        index = bisect.bisect_right([run_epoch for run_epoch, _ in self.runs], epoch) - 1
        if index < 0:
            return NO_EPOCH, 0
        found = self.runs[index][0]
        end = self.runs[index + 1][1] if index + 1 < len(self.runs) else self.leo
        return found, end

    def epoch_at(self, offset: int) -> int:
        """The leader epoch of the record at ``offset`` (NO_EPOCH past the end)."""
        if not 0 <= offset < self.leo:
            return NO_EPOCH
        index = bisect.bisect_right([start for _, start in self.runs], offset) - 1
        return self.runs[index][0]

    def truncate(self, offset: int) -> None:
        """Drop every record from ``offset`` on."""
        if offset >= self.leo:
            return
        self.runs = [run for run in self.runs if run[1] < offset]
        self.leo = max(0, offset)

    def runs_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """The runs of the records in [start, end), the first starting at ``start``."""
        if start >= end:
            return []
        runs = []
        for index, (epoch, run_start) in enumerate(self.runs):
            run_end = self.runs[index + 1][1] if index + 1 < len(self.runs) else self.leo
            if run_end > start and run_start < end:
                runs.append((epoch, max(run_start, start)))
        return runs

    def extend(self, runs: Sequence[tuple[int, int]], start: int, records: int) -> None:
        """Append ``records`` records at ``start`` (== the LEO) whose epochs are ``runs``."""
        if start != self.leo:
            raise ReplicaError(f"records fetched at offset {start} cannot extend a log ending at {self.leo}")
        end = start + records
        bounds = [run_start for _, run_start in runs]
        if records and (not runs or bounds[0] != start or bounds != sorted(bounds) or bounds[-1] >= end):
            raise ReplicaError(f"epoch runs {list(runs)} do not describe {records} records from offset {start}")
        for index, (epoch, run_start) in enumerate(runs):
            run_end = runs[index + 1][1] if index + 1 < len(runs) else end
            self.append(epoch, run_end - run_start)

    def identical_to(self, other: EpochLog, upto: int) -> bool:
        return self.runs_between(0, upto) == other.runs_between(0, upto) and min(self.leo, other.leo) >= upto


@dataclass(slots=True)
class FollowerProgress:
    """The leader's view of one follower at its leader epoch, updated by each of its fetches."""

    leo: int  # the follower's fetch offset: every record below it is on the follower, as on the leader
    hw: int  # the high watermark the follower said it has
    last_fetch_at: float
    last_fetch_leader_leo: int  # the leader's LEO when that fetch arrived
    last_caught_up_at: float | None  # last moment the follower had every record the leader had; None: never
    # The follower's connection to the SC its fetches named (None: a follower too old to say). All
    # of the above is of that process: a fetch under another incarnation starts the record afresh.
    incarnation: int | None = None


@dataclass(frozen=True, slots=True)
class Served:
    """A leader's answer to one partition of a fetch: its offsets and ``records`` records from
    ``offset``, whose epochs are ``epochs`` (runs, the first at ``offset``)."""

    offset: int
    leo: int
    hw: int
    records: int
    epochs: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Diverging:
    """The follower's log differs from the leader's from ``end_offset`` in epoch ``epoch`` (the
    largest epoch <= the follower's last the leader holds): it truncates, then fetches again."""

    offset: int
    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class Proposal:
    """The in-sync set a leader asked the SC to commit, at its epochs; one in flight at a time."""

    isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int
    sent_at: float
    hw: int = 0  # the leader's HW when it proposed
    # (SPU, incarnation) for each follower it adds to the committed set: the process it saw catch up.
    incarnations: tuple[tuple[int, int], ...] = ()
    uid: int | None = None  # the partition's, as the SC told it (None: not told)


class Replica:
    """A partition replica hosted by ``spu_id``. Starts idle; ``assign`` gives it the SC's state.

    Leader rules:
    - Its records get its leader epoch. A fetch carries the follower's leader epoch: another
      epoch is refused (``fenced-leader-epoch`` if older, ``unknown-leader-epoch`` if newer). It
      stops leading when the SC says a newer epoch exists (``step_down``). A fetch also carries the
      epoch of the follower's last record; if the follower's log does not match the leader's up
      to the fetch offset, the answer is ``Diverging`` (where the logs part) and nothing else.
    - A fetch at offset ``o`` tells the leader the follower holds every record below ``o``. The
      follower "caught up" at that fetch if ``o`` >= the leader's LEO, or, failing that, at its
      previous fetch if ``o`` >= the leader's LEO at that previous fetch. A fetch carries the
      incarnation of the follower's SC connection: what the leader recorded of another
      incarnation (another process, which may have lost records since) is forgotten first.
    - HW = the lowest LEO over the committed in-sync set the SC gave it, plus the members of its
      pending proposal (Kafka's maximal ISR, KIP-497), each follower as fetched at this epoch
      (one not heard from at this epoch holds it back). It never moves back.
    - It never changes the in-sync set itself: ``proposal`` names the set it wants (a member
      that has not caught up within ``lag_time`` leaves; a replica caught up recently whose LEO
      reached the HW joins, named with the incarnation it caught up under; a follower whose
      fetches carried none never joins), one at a time, until the SC answers or its state moves past it.
    - ``max_records`` bounds the records one fetch carries, so catching up takes several rounds.

    Follower rules: ``apply_fetched`` takes the leader's answer to the fetch it sent at its LEO
    and epochs; an answer for another offset, leader or epoch is stale and ignored. Records
    extend its log with their epochs; ``Diverging`` truncates it to where the logs part (the
    smaller of the leader's end offset for that epoch and its own), and it fetches again.
    HW = min(leader HW, LEO).
    """

    def __init__(
        self,
        partition: str,
        spu_id: int,
        lag_time: float,
        leo: int = 0,
        hw: int = 0,
        epochs: Iterable[tuple[int, int]] = (),
        uid: int | None = None,
    ) -> None:
        if lag_time <= 0:
            raise ReplicaError(f"replica lag time must be positive, got {lag_time!r} seconds")
        if leo < 0 or hw < 0:
            raise ReplicaError(f"offsets of partition {partition!r} cannot be negative: leo {leo}, hw {hw}")
        self.partition = partition
        # Which partition of that name this log is of: its uid, as the SC told it (None: not told,
        # by an SC older than the field, or of a partition that has none). Another one is another log.
        self.uid = uid
        self.spu_id = spu_id
        self.lag_time = lag_time
        runs = list(epochs) or ([(0, 0)] if leo > 0 else [])
        self.log = EpochLog(leo, runs)
        self.hw = min(hw, leo)
        self.role = Role.IDLE
        self.leader: int | None = None
        # The leader epoch this process was told with its role (None: told none yet): what it
        # reports when it connects, so the SC knows whether it is the process that earned its role.
        self.leader_epoch: int | None = None
        self.partition_epoch = 0
        self.isr: tuple[int, ...] = ()  # the committed in-sync set, as the SC said
        self.replicas: tuple[int, ...] = ()
        self.followers: dict[int, FollowerProgress] = {}  # leader only: followers heard from at this epoch
        self.pending: Proposal | None = None
        # The last refused proposal's set and incarnations, and when: not repeated for a while.
        self._refused: tuple[tuple[int, ...], tuple[tuple[int, int], ...], float] | None = None
        self.leader_since = 0.0

    @property
    def leo(self) -> int:
        return self.log.leo

    @property
    def in_sync(self) -> set[int]:
        """Leader only: the followers the HW waits for (committed in-sync set and pending proposal)."""
        if self.role is not Role.LEADER:
            return set()
        return self._hw_set() - {self.spu_id}

    @property
    def told_epoch(self) -> int | None:
        """The leader epoch of its current role (leader, or follower of a leader); None when idle."""
        return self.leader_epoch if self.role is not Role.IDLE else None

    # ------------------------------------------------------------------ roles

    def assign(
        self,
        leader: int | None,
        replicas: Iterable[int],
        now: float,
        leader_epoch: int = 0,
        partition_epoch: int = 0,
        isr: Iterable[int] | None = None,
    ) -> bool:
        """Take the state the SC committed; True when this replica starts leading at a new epoch."""
        self.replicas = tuple(replicas)
        committed = tuple(self.replicas if isr is None else isr)
        new_term = leader_epoch != self.leader_epoch or leader != self.leader
        started = False
        if leader == self.spu_id:
            if self.role is not Role.LEADER or new_term:
                self.followers.clear()
                self.pending, self._refused = None, None
                self.leader_since = now
                started = True
            self.role = Role.LEADER
            # A follower outside the committed set may have left the replicas and come back (its
            # log deleted) in states this leader never heard of, epochs unchanged: where it last
            # fetched says nothing of what it holds now. It proposes one in only after a fetch made
            # since the state it was last told. Members keep theirs: the HW counts them.
            for spu in [spu for spu in self.followers if spu not in self.replicas or spu not in committed]:
                del self.followers[spu]
        else:
            self.role = Role.IDLE if leader is None else Role.FOLLOWER
            self.followers.clear()
            self.pending, self._refused = None, None
        self.leader = leader
        self.leader_epoch = leader_epoch
        if self.pending is not None and partition_epoch > self.pending.partition_epoch:
            self.pending = None  # the SC's state moved past it: committed or not, this is the state now
        self.partition_epoch = partition_epoch
        self.isr = committed
        self.refresh(now)
        return started

    def step_down(self, leader_epoch: int) -> bool:
        """It learned that ``leader_epoch`` is the partition's: if newer than its own, it stops
        leading (or following) at once and waits for the SC's state. True when it stopped."""
        if self.role is Role.IDLE or (self.leader_epoch is not None and leader_epoch <= self.leader_epoch):
            return False
        self.role = Role.IDLE
        self.followers.clear()
        self.pending = None
        return True

    # ------------------------------------------------------------------ leader

    def append(self, records: int, now: float) -> None:
        if self.role is not Role.LEADER:
            raise ReplicaError(f"partition {self.partition!r}: only its leader appends, this replica is {self.role.value}")
        if records < 0:
            raise ReplicaError(f"partition {self.partition!r}: cannot append {records} records")
        assert self.leader_epoch is not None
        self.log.append(self.leader_epoch, records)
        self.refresh(now)

    def serve_fetch(
        self,
        follower: int,
        offset: int,
        follower_hw: int,
        max_records: int,
        now: float,
        leader_epoch: int | None = None,
        last_fetched_epoch: int = NO_EPOCH,
        incarnation: int | None = None,
    ) -> Served | Diverging | str:
        """Answer ``follower``'s fetch at ``offset`` (its LEO, whose last record has epoch
        ``last_fetched_epoch``), made at ``leader_epoch`` (None: this leader's own) by the follower's
        process connected to the SC as ``incarnation`` (None: it does not say): records, where its
        log diverges, or an error code."""
        if self.role is not Role.LEADER:
            return NOT_LEADER
        if follower not in self.replicas or follower == self.spu_id:
            return NOT_A_REPLICA
        if offset < 0 or max_records < 0:
            raise ReplicaError(
                f"partition {self.partition!r}: fetch offset {offset} and max records {max_records} must not be negative"
            )
        assert self.leader_epoch is not None
        if leader_epoch is not None and leader_epoch != self.leader_epoch:
            # A newer epoch in a fetch is not acted on: the fetch port proves nothing, and a false
            # one would silence a good leader. It commits nothing new anyway (this follower does
            # not fetch from it at its epoch); the SC's word makes it stop.
            return UNKNOWN_LEADER_EPOCH if leader_epoch > self.leader_epoch else FENCED_LEADER_EPOCH
        if offset > 0:
            epoch, end = self.log.end_offset_for(last_fetched_epoch)
            if epoch != last_fetched_epoch or end < offset:
                return Diverging(offset, epoch, end)
        position = offset
        progress = self.followers.get(follower)
        if progress is not None and progress.incarnation != incarnation:
            # Another process of the follower (KIP-903), or the same one reconnected to the SC: it
            # has caught up only once it does so again, under the incarnation it has now.
            progress = None
        if progress is None:
            progress = self.followers[follower] = FollowerProgress(position, 0, now, self.leo, None, incarnation)
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
        records = min(self.leo - position, max_records)
        return Served(offset, self.leo, self.hw, records, tuple(self.log.runs_between(position, position + records)))

    def _hw_set(self) -> set[int]:
        members = set(self.isr)
        if self.pending is not None:
            members.update(self.pending.isr)
        members.add(self.spu_id)
        return members

    def refresh(self, now: float) -> None:
        """Advance the HW: the lowest LEO over the in-sync set and the pending proposal's members."""
        if self.role is not Role.LEADER:
            return
        lowest = self.leo
        for spu in self._hw_set():
            if spu == self.spu_id:
                continue
            progress = self.followers.get(spu)
            if progress is None:
                return  # not heard from at this epoch: nothing more is committed
            lowest = min(lowest, progress.leo)
        if lowest > self.hw:
            self.hw = lowest

    def _caught_up_recently(self, progress: FollowerProgress | None, now: float) -> bool:
        if progress is None or progress.last_caught_up_at is None:
            return False
        return now - progress.last_caught_up_at <= self.lag_time

    def wanted_isr(self, now: float) -> tuple[int, ...]:
        """The in-sync set this leader would commit now, in replica order."""
        committed = set(self.isr)
        wanted = []
        for spu in self.replicas:
            if spu == self.spu_id:
                wanted.append(spu)
                continue
            progress = self.followers.get(spu)
            if spu in committed:
                # Not caught up within the lag time (counted from this leadership's start for one
                # that has not caught up since): it holds the HW back, so it leaves.
                never = progress is None or progress.last_caught_up_at is None
                if self._caught_up_recently(progress, now) or (never and now - self.leader_since <= self.lag_time):
                    wanted.append(spu)
            elif (
                progress is not None
                and progress.incarnation is not None
                and progress.leo >= self.hw
                and self._caught_up_recently(progress, now)
            ):
                wanted.append(spu)
        return tuple(wanted)

    def proposal(self, now: float, retry_after: float) -> Proposal | None:
        """A new proposal to send, if the wanted set differs from the committed one and none is in
        flight (a refused one is not repeated before ``retry_after`` seconds)."""
        if self.role is not Role.LEADER or self.pending is not None:
            return None
        self.refresh(now)
        wanted = self.wanted_isr(now)
        if set(wanted) == set(self.isr):
            return None
        # Each follower it adds, with the incarnation it caught up under (wanted_isr adds none without).
        named = tuple(
            (spu, progress.incarnation)
            for spu in wanted
            if spu not in self.isr and (progress := self.followers.get(spu)) is not None and progress.incarnation is not None
        )
        refused = self._refused
        # A refused proposal is not repeated for a while; one naming another incarnation is news.
        if refused is not None and refused[:2] == (wanted, named) and now - refused[2] < retry_after:
            return None
        assert self.leader_epoch is not None
        self.pending = Proposal(wanted, self.leader_epoch, self.partition_epoch, now, self.hw, named, self.uid)
        return self.pending

    def proposal_answered(
        self, error: str | None, leader_epoch: int, partition_epoch: int, isr: Sequence[int], now: float
    ) -> None:
        """The SC's answer: adopt its state when it is this leadership's and newer; a refusal
        clears the proposal (the same one waits ``retry_after`` before it is made again)."""
        pending = self.pending
        if pending is None or self.role is not Role.LEADER or leader_epoch != self.leader_epoch:
            return
        if error is not None:
            self._refused = (pending.isr, pending.incarnations, now)
        self.pending = None
        if partition_epoch >= self.partition_epoch:
            self.partition_epoch = partition_epoch
            self.isr = tuple(isr)
        self.refresh(now)

    # ------------------------------------------------------------------ follower

    def apply_fetched(self, leader: int, answer: Served | Diverging, leader_epoch: int | None = None) -> bool:
        """Take ``leader``'s answer to its fetch; False (nothing changed) when it is stale: another
        leader, epoch or offset."""
        if self.role is not Role.FOLLOWER or leader != self.leader or answer.offset != self.leo:
            return False
        if leader_epoch is not None and leader_epoch != self.leader_epoch:
            return False
        if isinstance(answer, Diverging):
            # Where the logs part: the leader's end of that epoch, or this log's own end of it.
            _, own_end = self.log.end_offset_for(answer.epoch)
            self.log.truncate(min(answer.end_offset, own_end))
            self.hw = min(self.hw, self.leo)
            return True
        if answer.records < 0 or answer.offset + answer.records > answer.leo or answer.hw > answer.leo:
            raise ReplicaError(
                f"partition {self.partition!r}: leader {leader} answered a fetch at offset {answer.offset} with "
                f"{answer.records} records, LEO {answer.leo}, HW {answer.hw}, which do not add up"
            )
        self.log.extend(answer.epochs, answer.offset, answer.records)
        self.hw = min(answer.hw, self.leo)
        return True
