"""What one simulated SPU knows and holds: the SC's picture (SPUs, its replicas) and each replica's offsets.

Purely computational, no I/O: applies Sync/Update, serves and applies fetches, appends, builds the
LRS. Time is passed in. The session, the fetch server and the fetchers drive it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from connection_manager import wire
from connection_manager.spu import fetch_wire, replica as replica_module


@dataclass(frozen=True, slots=True)
class Offsets:
    leo: int
    hw: int


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """A snapshot of one replica, for tests, benchmarks and logs."""

    partition: str
    role: replica_module.Role
    leader: int | None
    leo: int
    hw: int
    in_sync: tuple[int, ...]  # leader only: the followers in its ISR, by id (the leader itself is implied)
    followers: Mapping[int, int]  # leader only: each follower heard from -> its LEO as the leader knows it


class SyncRequired(ValueError):
    """An Update arrived before any Sync: there is nothing to apply the delta to."""


class SpuState:
    def __init__(self, spu_id: int, lag_time: float) -> None:
        self.spu_id = spu_id
        self.lag_time = lag_time
        self.spus: dict[int, wire.SpuInfo] = {}
        self.replicas: dict[str, replica_module.Replica] = {}
        self.epoch: int | None = None
        self.synced = False
        # Leader id -> partitions followed from it, rebuilt when the SC's picture changes, so a
        # fetch round costs the partitions it fetches, not every replica hosted here.
        self._following: dict[int, list[str]] = {}
        # Offsets from a checkpoint, given to a partition the first Sync assigns; dropped after it.
        self._restored: dict[str, Offsets] = {}

    def restore(self, offsets: Mapping[str, Offsets]) -> None:
        """Offsets saved by a previous run, resumed by the partitions the first Sync gives this SPU."""
        if self.synced:
            raise ValueError(f"SPU {self.spu_id}: offsets can only be restored before the first sync")
        self._restored = dict(offsets)

    # ------------------------------------------------------------------ the SC's picture

    def apply_sync(self, sync: wire.Sync, now: float) -> None:
        """The full picture: partitions it does not list are no longer hosted here."""
        self.spus = {spu.id: spu for spu in sync.spus}
        listed = {info.partition for info in sync.replicas}
        for name in [name for name in self.replicas if name not in listed]:
            del self.replicas[name]
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
            self.replicas.pop(name, None)
        for info in update.replicas:
            self._assign(info, now)
        self.epoch = update.epoch
        self._index()

    def _assign(self, info: wire.ReplicaInfo, now: float) -> None:
        replica = self.replicas.get(info.partition)
        if replica is None:
            restored = self._restored.pop(info.partition, Offsets(0, 0))
            replica = replica_module.Replica(info.partition, self.spu_id, self.lag_time, restored.leo, restored.hw)
            self.replicas[info.partition] = replica
        replica.assign(info.leader, info.replicas, now)

    def endpoint_of(self, spu_id: int) -> wire.Endpoint | None:
        """Where ``spu_id`` serves fetches, as the SC last described it."""
        spu = self.spus.get(spu_id)
        return None if spu is None else spu.private_endpoint

    def _index(self) -> None:
        following: dict[int, list[str]] = {}
        for name, replica in sorted(self.replicas.items()):
            if replica.role is replica_module.Role.FOLLOWER and replica.leader is not None:
                following.setdefault(replica.leader, []).append(name)
        self._following = following

    def followed_leaders(self) -> dict[int, list[str]]:
        """Leader id -> the partitions this SPU follows from it, by name."""
        return {leader: list(names) for leader, names in self._following.items()}

    # ------------------------------------------------------------------ leading

    def append(self, records: int, now: float) -> None:
        """One burst: ``records`` more records in every partition this SPU leads."""
        for replica in self.replicas.values():
            if replica.role is replica_module.Role.LEADER:
                replica.append(records, now)

    def serve(self, request: fetch_wire.FetchRequest, now: float) -> fetch_wire.FetchResponse:
        """Answer every partition of one fetch; a partition it cannot serve gets an error, the others their records."""
        answers = []
        for wanted in request.partitions:
            replica = self.replicas.get(wanted.partition)
            if replica is None or replica.role is not replica_module.Role.LEADER:
                answers.append(fetch_wire.PartitionFetched(partition=wanted.partition, offset=wanted.offset, error="not-leader"))
            elif request.spu not in replica.replicas:
                answers.append(fetch_wire.PartitionFetched(partition=wanted.partition, offset=wanted.offset, error="not-a-replica"))
            else:
                served = replica.serve_fetch(request.spu, wanted.offset, wanted.hw, request.max_records, now)
                answers.append(
                    fetch_wire.PartitionFetched(
                        partition=wanted.partition, offset=served.offset, leo=served.leo, hw=served.hw, records=served.records
                    )
                )
        return fetch_wire.FetchResponse(partitions=answers)

    def live_replicas(self, now: float) -> wire.LiveReplicas:
        """The LRS: one report per partition this SPU leads, by name (empty: still the heartbeat)."""
        return wire.LiveReplicas(
            leaders=[
                replica.report(now)
                for _, replica in sorted(self.replicas.items())
                if replica.role is replica_module.Role.LEADER
            ]
        )

    # ------------------------------------------------------------------ following

    def fetch_request(self, leader: int, max_records: int) -> fetch_wire.FetchRequest | None:
        """The next fetch round towards ``leader``: every partition followed from it, at its LEO; None if none."""
        partitions = [
            fetch_wire.PartitionFetch(partition=name, offset=self.replicas[name].leo, hw=self.replicas[name].hw)
            for name in self._following.get(leader, ())
        ]
        if not partitions:
            return None
        return fetch_wire.FetchRequest(spu=self.spu_id, max_records=max_records, partitions=partitions)

    def apply_response(self, leader: int, response: fetch_wire.FetchResponse) -> dict[str, str]:
        """Take ``leader``'s answer partition by partition; returns partition -> why it was not applied.

        A stale answer (the replica moved on, or follows another leader now) is skipped silently;
        a refusal or an inconsistent answer is returned, and the other partitions still apply.
        """
        problems: dict[str, str] = {}
        for answer in response.partitions:
            if answer.error is not None:
                problems[answer.partition] = answer.error
                continue
            replica = self.replicas.get(answer.partition)
            if replica is None:
                continue
            served = replica_module.Served(answer.offset, answer.leo, answer.hw, answer.records)
            try:
                replica.apply_fetched(leader, served)
            except replica_module.ReplicaError as error:
                problems[answer.partition] = str(error)
        return problems

    # ------------------------------------------------------------------ observing

    def offsets(self) -> dict[str, Offsets]:
        """Every partition's offsets, for the checkpoint; restored ones not yet assigned are kept."""
        current = {name: Offsets(replica.leo, replica.hw) for name, replica in self.replicas.items()}
        return {**self._restored, **current}

    def status(self, partition: str, now: float) -> ReplicaStatus | None:
        replica = self.replicas.get(partition)
        if replica is None:
            return None
        replica.refresh(now)
        return ReplicaStatus(
            partition=partition,
            role=replica.role,
            leader=replica.leader,
            leo=replica.leo,
            hw=replica.hw,
            in_sync=tuple(sorted(replica.in_sync)),
            followers={spu: progress.leo for spu, progress in sorted(replica.followers.items())},
        )
