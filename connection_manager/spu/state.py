"""What one simulated SPU knows and holds: the SC's picture (SPUs, its replicas' committed state)
and each replica's log, and what changed since its I/O last looked.

Purely computational, no I/O: applies Sync/Update and the SC's answers, serves and applies fetches,
appends, makes proposals, builds the frames it sends the SC. Time is passed in. The session, the
fetch server, the fetchers and the simulator drive it, and drain ``changes`` after each step.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from connection_manager import wire
from connection_manager.spu import fetch_wire, replica as replica_module

Role = replica_module.Role


@dataclass(frozen=True, slots=True)
class Offsets:
    """A replica's log as a checkpoint keeps it: its end, HW, leader epoch runs, and the uid of the
    partition it is of (None: never told one)."""

    leo: int
    hw: int
    epochs: tuple[tuple[int, int], ...] = ()
    uid: int | None = None


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """A snapshot of one replica, for tests, benchmarks and logs."""

    partition: str
    role: replica_module.Role
    leader: int | None
    leader_epoch: int | None
    leo: int
    hw: int
    in_sync: tuple[int, ...]  # leader only: the followers its HW waits for, by id (the leader itself is implied)
    followers: Mapping[int, int]  # leader only: each follower heard from at this epoch -> its LEO
    isr: tuple[int, ...]  # the committed in-sync set the SC gave it


@dataclass(slots=True)
class Changes:
    """What happened since the I/O last drained it."""

    logs: set[str] = field(default_factory=set)  # LEO, HW or epochs changed: journal them
    leaderships: dict[str, int] = field(default_factory=dict)  # started leading: partition -> leader epoch
    # Committed while leading: -> (leader epoch, HW, the epoch of the record at HW - 1).
    acked: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    proposals: list[tuple[str, replica_module.Proposal]] = field(default_factory=list)
    stepped_down: dict[str, int] = field(default_factory=dict)  # the SC said a newer epoch exists: -> that epoch
    # Replicas the SC took off this SPU (an Update's deletions, a Sync that left them out): a
    # partition of the same name assigned later is a new one, whose leadership is said again.
    removed: set[str] = field(default_factory=set)


class SyncRequired(ValueError):
    """An Update arrived before any Sync: there is nothing to apply the delta to."""


class SpuState:
    def __init__(self, spu_id: int, lag_time: float, proposal_retry: float = 1.0) -> None:
        self.spu_id = spu_id
        self.lag_time = lag_time
        self.proposal_retry = proposal_retry
        self.spus: dict[int, wire.SpuInfo] = {}
        self.replicas: dict[str, replica_module.Replica] = {}
        self.epoch: int | None = None
        self.synced = False
        self.changes = Changes()
        # Led partitions whose offsets changed since the last Offsets frame.
        self.offsets_changed: set[str] = set()
        # Leader id -> partitions followed from it, rebuilt when the SC's picture changes, so a
        # fetch round costs the partitions it fetches, not every replica hosted here.
        self._following: dict[int, list[str]] = {}
        self._followed_from: dict[str, int] = {}  # partition -> the leader it is followed from
        # Logs from a checkpoint, given to a partition the first Sync assigns; dropped after it.
        self._restored: dict[str, Offsets] = {}
        # The number the SC gave this SPU's current connection (Accepted); None before the first.
        # Every fetch carries it: a leader counts what this process holds, not a previous one's.
        self.incarnation: int | None = None

    def restore(self, offsets: Mapping[str, Offsets]) -> None:
        """Logs saved by a previous run, resumed by the partitions the first Sync gives this SPU."""
        if self.synced:
            raise ValueError(f"SPU {self.spu_id}: offsets can only be restored before the first sync")
        self._restored = dict(offsets)

    def drain(self) -> Changes:
        changes, self.changes = self.changes, Changes()
        return changes

    # ------------------------------------------------------------------ the SC's picture

    def apply_sync(self, sync: wire.Sync, now: float) -> None:
        """The full picture: partitions it does not list are no longer hosted here."""
        self.spus = {spu.id: spu for spu in sync.spus}
        listed = {info.partition for info in sync.replicas}
        for name in [name for name in self.replicas if name not in listed]:
            self._remove(name)
        for info in sync.replicas:
            self._assign(info, now)
        self._restored.clear()
        self.epoch = sync.epoch
        self.synced = True
        self._index()

    def apply_update(self, update: wire.Update, now: float) -> None:
        """A delta: deletions first, so a partition deleted and re-created in one update starts afresh."""
        if not self.synced:
            raise SyncRequired(f"update of epoch {update.epoch} arrived before any sync")
        for spu_id in update.deleted_spus:
            self.spus.pop(spu_id, None)
        for spu in update.spus:
            self.spus[spu.id] = spu
        for name in update.deleted_replicas:
            self._remove(name)
        for info in update.replicas:
            self._assign(info, now)
        self.epoch = update.epoch
        self._reindex([*update.deleted_replicas, *(info.partition for info in update.replicas)])

    def _remove(self, name: str) -> None:
        """The SC took the replica off this SPU, or it is of another partition of the name than the
        one the SC describes now: a partition of that name assigned later is a new one."""
        if self.replicas.pop(name, None) is not None:
            self.changes.removed.add(name)
            self.changes.leaderships.pop(name, None)  # not to be said: it leads it no more
        self.offsets_changed.discard(name)

    def _assign(self, info: wire.ReplicaInfo, now: float) -> None:
        name, identity = info.partition, info.uid
        replica = self.replicas.get(name)
        replaced = replica is not None and _another(replica.uid, identity)
        if replaced:
            # Deleted and created again while this SPU did not hear of it (it was away, or the SC
            # relisted its store): the records it holds are the old partition's, not this one's.
            self._remove(name)
            replica = None
        if replica is None:
            restored = self._restored.pop(name, None)
            if restored is not None:
                replaced = replaced or _another(restored.uid, identity)
            kept = Offsets(0, 0) if restored is None or replaced else restored
            replica = replica_module.Replica(name, self.spu_id, self.lag_time, kept.leo, kept.hw, kept.epochs, identity)
            self.replicas[name] = replica
            if restored is not None or replaced:
                self.changes.logs.add(name)  # the journal holds this name's old log: it is this one now
        elif identity is not None and replica.uid != identity:
            replica.uid = identity  # told at last (an older SC, or a log saved without it)
            self.changes.logs.add(name)
        hw = replica.hw
        started = replica.assign(info.leader, info.replicas, now, info.leader_epoch, info.partition_epoch, info.isr)
        if started:
            assert replica.leader_epoch is not None
            self.changes.leaderships[info.partition] = replica.leader_epoch
            self.offsets_changed.add(info.partition)
        self._noted(replica, hw, replica.leo)

    def _noted(self, replica: replica_module.Replica, hw: int, leo: int) -> None:
        """Record what moved on ``replica`` since it had ``hw`` and ``leo``."""
        name = replica.partition
        if replica.hw != hw or replica.leo != leo:
            self.changes.logs.add(name)
            if replica.role is Role.LEADER:
                self.offsets_changed.add(name)
                if replica.hw > hw:
                    assert replica.leader_epoch is not None
                    self.changes.acked[name] = (replica.leader_epoch, replica.hw, replica.log.epoch_at(replica.hw - 1))

    def endpoint_of(self, spu_id: int) -> wire.Endpoint | None:
        """Where ``spu_id`` serves fetches, as the SC last described it."""
        spu = self.spus.get(spu_id)
        return None if spu is None else spu.private_endpoint

    def _index(self) -> None:
        following: dict[int, list[str]] = {}
        followed_from: dict[str, int] = {}
        for name, replica in sorted(self.replicas.items()):
            if replica.role is Role.FOLLOWER and replica.leader is not None:
                following.setdefault(replica.leader, []).append(name)
                followed_from[name] = replica.leader
        self._following, self._followed_from = following, followed_from

    def _reindex(self, names: Iterable[str]) -> None:
        """``_index`` for the partitions ``names`` only (an Update's, a fence's): roles change
        nowhere else, and an SPU of thousands of replicas must not sort them all at each Update."""
        following, followed_from = self._following, self._followed_from
        for name in names:
            before = followed_from.pop(name, None)
            if before is not None:
                listed = following[before]
                del listed[bisect.bisect_left(listed, name)]
                if not listed:
                    del following[before]
            replica = self.replicas.get(name)
            if replica is not None and replica.role is Role.FOLLOWER and replica.leader is not None:
                bisect.insort(following.setdefault(replica.leader, []), name)
                followed_from[name] = replica.leader

    def leaders_followed(self) -> list[int]:
        """The ids of the leaders this SPU follows partitions from (no copy of their partitions)."""
        return list(self._following)

    def followed_leaders(self) -> dict[int, list[str]]:
        """Leader id -> the partitions this SPU follows from it, by name."""
        return {leader: list(names) for leader, names in self._following.items()}

    def proposal_answered(self, result: wire.AlterIsrResult, now: float) -> None:
        replica = self.replicas.get(result.partition)
        if replica is not None:
            hw = replica.hw
            replica.proposal_answered(result.error, result.leader_epoch, result.partition_epoch, result.isr, now)
            self._noted(replica, hw, replica.leo)

    def fenced(self, partition: str, leader_epoch: int) -> bool:
        """The SC said ``leader_epoch`` is the partition's: stop leading an older one at once."""
        replica = self.replicas.get(partition)
        if replica is None or not replica.step_down(leader_epoch):
            return False
        self.changes.stepped_down[partition] = leader_epoch
        self._reindex((partition,))
        return True

    # ------------------------------------------------------------------ what it tells the SC

    def hosted(self) -> wire.Hosted:
        """Every replica this process holds, with the leader epoch it was told with its role."""
        entries = [
            _identified(wire.HostedReplica(partition=name, leo=offsets.leo, leader_epoch=None), offsets.uid)
            for name, offsets in sorted(self._restored.items())
            if name not in self.replicas
        ]
        entries += [
            _identified(wire.HostedReplica(partition=name, leo=replica.leo, leader_epoch=replica.told_epoch), replica.uid)
            for name, replica in sorted(self.replicas.items())
        ]
        return wire.Hosted(partitions=entries)

    def leaderships(self) -> wire.Leading | None:
        """Every partition it leads, at its epoch (said again after each Sync)."""
        led = [
            _identified(
                wire.Leadership(partition=name, leader_epoch=replica.leader_epoch),  # type: ignore[typeddict-item]  # a leader has its epoch
                replica.uid,
            )
            for name, replica in sorted(self.replicas.items())
            if replica.role is Role.LEADER
        ]
        return wire.Leading(partitions=led) if led else None

    def pending_proposals(self) -> list[tuple[str, replica_module.Proposal]]:
        return [
            (name, replica.pending)
            for name, replica in sorted(self.replicas.items())
            if replica.role is Role.LEADER and replica.pending is not None
        ]

    def offsets(self, only_changed: bool = True) -> list[wire.PartitionOffsets]:
        """Live offsets of the partitions it leads: those that changed since the last call (all of
        them with ``only_changed`` False)."""
        names = sorted(self.offsets_changed) if only_changed else sorted(self.replicas)
        self.offsets_changed = set()
        entries = []
        for name in names:
            replica = self.replicas.get(name)
            if replica is None or replica.role is not Role.LEADER:
                continue
            entry = wire.PartitionOffsets(
                partition=name,
                leader_epoch=replica.leader_epoch,  # type: ignore[typeddict-item]  # a leader has its epoch
                hw=replica.hw,
                leo=replica.leo,
                followers=[
                    wire.ReplicaOffsets(spu=spu, hw=progress.hw, leo=progress.leo)
                    for spu, progress in sorted(replica.followers.items())
                ],
            )
            entries.append(_identified(entry, replica.uid))
        return entries

    # ------------------------------------------------------------------ leading

    def append(self, records: int, now: float) -> None:
        """One burst: ``records`` more records in every partition this SPU leads."""
        for replica in self.replicas.values():
            if replica.role is Role.LEADER:
                hw, leo = replica.hw, replica.leo
                replica.append(records, now)
                self._noted(replica, hw, leo)

    def tick(self, now: float) -> None:
        """Time passed: each led partition's HW and in-sync set are looked at again (proposals)."""
        for name, replica in self.replicas.items():
            if replica.role is not Role.LEADER:
                continue
            hw, leo = replica.hw, replica.leo
            proposal = replica.proposal(now, self.proposal_retry)
            self._noted(replica, hw, leo)
            if proposal is not None:
                self.changes.proposals.append((name, proposal))

    def serve(self, request: fetch_wire.FetchRequest, now: float) -> fetch_wire.FetchResponse:
        """Answer every partition of one fetch; a partition it cannot serve gets an error, the others their records."""
        answers = []
        for wanted in request.partitions:
            name = wanted.partition
            replica = self.replicas.get(name)
            if replica is None:
                answers.append(fetch_wire.PartitionFetched(partition=name, offset=wanted.offset, error="not-leader"))
                continue
            if _another(replica.uid, wanted.uid):
                # The same name and maybe epoch, but another partition: its log says nothing of this one.
                answers.append(
                    fetch_wire.PartitionFetched(partition=name, offset=wanted.offset, error=replica_module.INCONSISTENT_PARTITION)
                )
                continue
            hw, leo = replica.hw, replica.leo
            progress = replica.followers.get(request.spu)
            before = None if progress is None else progress.leo
            answer = replica.serve_fetch(
                request.spu, wanted.offset, wanted.hw, request.max_records, now, wanted.leader_epoch, wanted.last_fetched_epoch,
                request.incarnation,
            )
            if isinstance(answer, str):
                answers.append(fetch_wire.PartitionFetched(partition=name, offset=wanted.offset, error=answer))
                continue
            self._noted(replica, hw, leo)
            progress = replica.followers.get(request.spu)
            if progress is not None and progress.leo != before:
                self.offsets_changed.add(name)
            if isinstance(answer, replica_module.Diverging):
                answers.append(
                    fetch_wire.PartitionFetched(
                        partition=name, offset=answer.offset, leo=replica.leo, hw=replica.hw,
                        diverging_epoch=answer.epoch, diverging_end_offset=answer.end_offset,
                    )
                )
            else:
                answers.append(
                    fetch_wire.PartitionFetched(
                        partition=name, offset=answer.offset, leo=answer.leo, hw=answer.hw, records=answer.records,
                        epochs=list(answer.epochs),
                    )
                )
        return fetch_wire.FetchResponse(partitions=answers)

    # ------------------------------------------------------------------ following

    def fetch_request(self, leader: int, max_records: int) -> fetch_wire.FetchRequest | None:
        """The next fetch round towards ``leader``: every partition followed from it, at its LEO; None
        if none, or before the SC accepted a connection of this process (it has no incarnation to say)."""
        if self.incarnation is None:
            return None
        partitions = []
        for name in self._following.get(leader, ()):
            replica = self.replicas[name]
            if replica.role is not Role.FOLLOWER or replica.leader_epoch is None:
                continue
            partitions.append(
                fetch_wire.PartitionFetch(
                    partition=name,
                    offset=replica.leo,
                    hw=replica.hw,
                    leader_epoch=replica.leader_epoch,
                    last_fetched_epoch=replica.log.last_epoch,
                    uid=replica.uid,
                )
            )
        if not partitions:
            return None
        return fetch_wire.FetchRequest(
            spu=self.spu_id, incarnation=self.incarnation, max_records=max_records, partitions=partitions
        )

    def apply_response(
        self, leader: int, response: fetch_wire.FetchResponse, request: fetch_wire.FetchRequest | None = None
    ) -> dict[str, str]:
        """Take ``leader``'s answer partition by partition; returns partition -> why it was not applied.

        A stale answer (the replica moved on, or follows another leader now, or is another
        partition of the name than the one ``request`` fetched for) is skipped silently; a
        refusal or an inconsistent answer is returned, and the other partitions still apply.
        """
        problems: dict[str, str] = {}
        asked = {} if request is None else {wanted.partition: wanted.uid for wanted in request.partitions}
        for answer in response.partitions:
            if answer.error is not None:
                problems[answer.partition] = answer.error
                continue
            replica = self.replicas.get(answer.partition)
            if replica is None or _another(replica.uid, asked.get(answer.partition)):
                continue
            taken: replica_module.Served | replica_module.Diverging
            if answer.diverging_epoch is not None and answer.diverging_end_offset is not None:
                taken = replica_module.Diverging(answer.offset, answer.diverging_epoch, answer.diverging_end_offset)
            else:
                taken = replica_module.Served(answer.offset, answer.leo, answer.hw, answer.records, tuple(answer.epochs))
            hw, leo = replica.hw, replica.leo
            try:
                replica.apply_fetched(leader, taken)
            except replica_module.ReplicaError as error:
                problems[answer.partition] = str(error)
            self._noted(replica, hw, leo)
        return problems

    # ------------------------------------------------------------------ observing

    def logs(self, names: Iterable[str] | None = None) -> dict[str, Offsets]:
        """Replicas' logs (``names``, or all), for the checkpoint; restored ones not yet assigned are kept."""
        current = {
            name: Offsets(replica.leo, replica.hw, tuple(replica.log.runs), replica.uid)
            for name, replica in self.replicas.items()
            if names is None or name in names
        }
        if names is not None:
            return current
        return {**self._restored, **current}

    def status(self, partition: str, now: float) -> ReplicaStatus | None:
        replica = self.replicas.get(partition)
        if replica is None:
            return None
        hw, leo = replica.hw, replica.leo
        replica.refresh(now)
        self._noted(replica, hw, leo)
        return ReplicaStatus(
            partition=partition,
            role=replica.role,
            leader=replica.leader,
            leader_epoch=replica.leader_epoch,
            leo=replica.leo,
            hw=replica.hw,
            in_sync=tuple(sorted(replica.in_sync)),
            followers={spu: progress.leo for spu, progress in sorted(replica.followers.items())},
            isr=replica.isr,
        )


def _another(held: int | None, told: int | None) -> bool:
    """A log of partition ``held`` is of another partition than ``told`` (both known, and differ)."""
    return held is not None and told is not None and held != told


Identified = TypeVar("Identified", wire.HostedReplica, wire.Leadership, wire.PartitionOffsets)


def _identified(entry: Identified, uid: int | None) -> Identified:
    """``entry`` naming the partition it is about, when the SC told which (an SC older than the
    field, never told, would refuse the key)."""
    if uid is not None:
        entry["uid"] = uid
    return entry
