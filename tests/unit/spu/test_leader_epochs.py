"""KIP-101's scenarios on the simulator's replica logic: leader changes, crashes and restarts with
short logs, then every replica follows the last leader. No record any leader counted committed is
lost, and the logs end identical (same records, same leader epochs, same offsets).

The SC's part is played by hand here (who leads at which epoch, the committed in-sync set, as
its rules would choose); test_partition_state.py checks those rules.
"""

from __future__ import annotations

from connection_manager.spu.replica import Diverging, Replica, Role, Served

LAG = 2.0
PARTITION = "t-0"
REPLICAS = (0, 1, 2)


class Cluster:
    def __init__(self, replicas: tuple[int, ...] = REPLICAS) -> None:
        self.replicas = replicas
        self.logs = {spu: Replica(PARTITION, spu, LAG) for spu in replicas}
        self.up = set(replicas)
        # Each process's SC connection, as its fetches name it: a restarted process has a new one.
        self.incarnations = {spu: 1 for spu in replicas}
        self.leader_epoch = 0
        self.partition_epoch = 0
        self.leader: int | None = None
        self.isr: tuple[int, ...] = replicas
        # Every commit a leader made: (the HW, the runs of its log below it then).
        self.committed: list[tuple[int, list[tuple[int, int]]]] = []
        self.now = 0.0

    @property
    def leading(self) -> int:
        assert self.leader is not None, "no leader elected yet"
        return self.leader

    def elect(self, leader: int, isr: tuple[int, ...]) -> None:
        assert leader in isr and leader in self.up, (leader, isr, self.up)
        self.leader_epoch += 1
        self.partition_epoch += 1
        self.leader, self.isr = leader, isr
        for spu in self.up:
            self.logs[spu].assign(leader, self.replicas, self.now, self.leader_epoch, self.partition_epoch, isr)

    def crash(self, spu: int, keep: int | None = None) -> None:
        """The SPU stops; its process comes back later with its log, cut to ``keep`` records (a
        machine crash that lost what was not on disk) or whole."""
        self.up.discard(spu)
        old = self.logs[spu].log
        leo = old.leo if keep is None else min(keep, old.leo)
        runs = [run for run in old.runs if run[1] < leo]
        self.logs[spu] = Replica(PARTITION, spu, LAG, leo=leo, hw=min(self.logs[spu].hw, leo), epochs=runs)

    def restart(self, spu: int) -> None:
        self.up.add(spu)
        self.incarnations[spu] += 1
        self.logs[spu].assign(self.leader, self.replicas, self.now, self.leader_epoch, self.partition_epoch, self.isr)

    def append(self, records: int) -> None:
        assert self.leader is not None
        self.logs[self.leader].append(records, self.now)
        self._note()

    def fetch(self, spu: int, max_records: int = 1000) -> None:
        """One fetch of ``spu`` from its leader, answered and applied."""
        self.now += 0.01
        follower, leader = self.logs[spu], self.logs[self.leading]
        answer = leader.serve_fetch(
            spu, follower.leo, follower.hw, max_records, self.now, follower.leader_epoch, follower.log.last_epoch,
            self.incarnations[spu],
        )
        assert isinstance(answer, Served | Diverging), answer
        assert follower.apply_fetched(self.leading, answer) is True
        self._note()

    def catch_up(self, *spus: int) -> None:
        for _ in range(10):
            for spu in spus:
                self.fetch(spu)

    def _note(self) -> None:
        leader = self.logs[self.leading]
        if not self.committed or leader.hw > self.committed[-1][0]:
            self.committed.append((leader.hw, leader.log.runs_between(0, leader.hw)))

    def assert_nothing_committed_lost_and_logs_identical(self) -> None:
        leader = self.logs[self.leading]
        for hw, runs in self.committed:
            assert leader.log.runs_between(0, hw) == runs, (hw, runs, leader.log.runs)
        for spu in self.up:
            assert (self.logs[spu].leo, self.logs[spu].log.runs) == (leader.leo, leader.log.runs), spu


def test_no_truncation_to_the_high_watermark_so_an_immediate_election_loses_nothing() -> None:
    """KIP-101 scenario 1: the follower knows an older HW than the leader when it restarts;
    truncating to it and then leading would lose a committed record. It keeps its log."""
    cluster = Cluster((0, 1))
    cluster.elect(0, (0, 1))
    cluster.append(2)
    cluster.fetch(1)  # B has both records, the leader's HW is still 0 in its answer
    cluster.fetch(1)  # the leader counts them committed: HW 2; B learns HW 2 only now
    assert (cluster.logs[0].hw, cluster.committed[-1][0]) == (2, 2)
    cluster.crash(1)
    cluster.restart(1)
    assert cluster.logs[1].leo == 2
    cluster.crash(0)
    cluster.elect(1, (1,))  # the SC: B (in sync) leads
    cluster.append(1)
    cluster.restart(0)
    cluster.catch_up(0)
    cluster.assert_nothing_committed_lost_and_logs_identical()
    assert cluster.logs[0].log.runs == [(1, 0), (2, 2)]


def test_logs_that_diverged_when_both_replicas_crashed_become_identical() -> None:
    """KIP-101 scenario 2: A holds m1 and m2, B only m1 (committed: m1); both crash, B comes back
    first and leads, writes m3 at m2's offset. A, back, must drop m2 for m3."""
    cluster = Cluster((0, 1))
    cluster.elect(0, (0, 1))
    cluster.append(1)
    cluster.catch_up(1)
    cluster.append(1)  # m2: B never gets it
    assert (cluster.logs[0].leo, cluster.logs[1].leo, cluster.logs[0].hw) == (2, 1, 1)
    cluster.crash(0)
    cluster.crash(1)
    cluster.restart(1)
    cluster.elect(1, (1,))
    cluster.append(1)  # m3 at offset 1, epoch 2
    cluster.restart(0)
    follower = cluster.logs[0]
    answer = cluster.logs[1].serve_fetch(0, follower.leo, follower.hw, 100, 1.0, follower.leader_epoch, follower.log.last_epoch)
    assert answer == Diverging(2, 1, 1)
    cluster.catch_up(0)
    cluster.assert_nothing_committed_lost_and_logs_identical()
    assert cluster.logs[0].log.runs == [(1, 0), (2, 1)]


def test_logs_diverged_over_two_leader_changes_become_identical() -> None:
    """Three replicas, two leader changes: A's uncommitted tail of epoch 1, B's records of epoch
    2 that C took, C's epoch 3. A returns last and truncates twice over (KIP-279's iteration)."""
    cluster = Cluster()
    cluster.elect(0, (0, 1, 2))
    cluster.append(10)
    cluster.fetch(1)
    cluster.fetch(2, max_records=6)
    cluster.fetch(1)
    cluster.fetch(2, max_records=0)
    assert cluster.logs[0].hw == 6
    cluster.append(5)  # epoch 1, offsets 10..14: nobody fetches them
    cluster.crash(0)
    cluster.elect(1, (1, 2))
    cluster.append(3)  # epoch 2, offsets 10..12
    cluster.catch_up(2)
    assert cluster.logs[2].log.runs == [(1, 0), (2, 10)] and cluster.logs[1].hw == 13
    cluster.crash(1)
    cluster.elect(2, (2,))
    cluster.append(2)  # epoch 3, offsets 13..14
    cluster.restart(0)
    cluster.restart(1)
    cluster.catch_up(0, 1)
    cluster.assert_nothing_committed_lost_and_logs_identical()
    assert cluster.logs[0].log.runs == [(1, 0), (2, 10), (3, 13)]
    assert cluster.logs[0].leo == 15


def test_a_follower_restarting_with_a_truncated_log_catches_up_and_loses_nothing_committed() -> None:
    cluster = Cluster()
    cluster.elect(0, (0, 1, 2))
    cluster.append(20)
    cluster.catch_up(1, 2)
    assert cluster.logs[0].hw == 20
    cluster.crash(2, keep=8)  # a machine crash: the tail of its log was not on disk
    # The SC removes it from the in-sync set (a new partition epoch, the same leader epoch).
    cluster.partition_epoch += 1
    cluster.isr = (0, 1)
    cluster.logs[0].assign(0, REPLICAS, cluster.now, cluster.leader_epoch, cluster.partition_epoch, cluster.isr)
    cluster.logs[1].assign(0, REPLICAS, cluster.now, cluster.leader_epoch, cluster.partition_epoch, cluster.isr)
    cluster.append(5)
    cluster.catch_up(1)
    cluster.restart(2)
    assert cluster.logs[2].leo == 8
    cluster.catch_up(2)
    cluster.assert_nothing_committed_lost_and_logs_identical()
    # Caught up, the leader proposes it back into the in-sync set, naming the process it saw catch up.
    proposal = cluster.logs[0].proposal(cluster.now, retry_after=1.0)
    assert proposal is not None and (proposal.isr, proposal.incarnations) == ((0, 1, 2), ((2, 2),))


def test_a_deposed_leader_that_kept_appending_truncates_to_the_new_leaders_log() -> None:
    """A paused leader (a network partition) appends at its old epoch after another was elected;
    nothing it appended then was committed (its followers left), and it all goes when it follows."""
    cluster = Cluster()
    cluster.elect(0, (0, 1, 2))
    cluster.append(10)
    cluster.catch_up(1, 2)
    old = cluster.logs[0]
    cluster.up.discard(0)  # cut off: it does not hear of the election
    cluster.elect(1, (1, 2))
    old.append(7, cluster.now)  # still believes it leads at epoch 1
    old.refresh(cluster.now + 10)
    assert (old.role, old.hw) == (Role.LEADER, 10)  # nothing new committed alone
    cluster.append(4)
    cluster.catch_up(2)
    cluster.up.add(0)
    old.assign(1, REPLICAS, cluster.now, cluster.leader_epoch, cluster.partition_epoch, cluster.isr)
    cluster.catch_up(0)
    cluster.assert_nothing_committed_lost_and_logs_identical()
    assert cluster.logs[0].log.runs == [(1, 0), (2, 10)]
