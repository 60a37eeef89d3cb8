"""Partition controller decisions: status from live replica reports, leader elections.

Purely computational, no I/O: (snapshot, the live cluster view and the names to look at) -> actions.
Writes a partition only when its resolution, leader or in-sync set changes, never for offsets.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from connection_manager import health as health_module
from connection_manager import lrs
from controller.reconcile import actions, election
from store import local, models

ONLINE = models.PartitionResolution.ONLINE
OFFLINE = models.PartitionResolution.OFFLINE
LEADER_OFFLINE = models.PartitionResolution.LEADER_OFFLINE
HEALTH_ONLINE, HEALTH_OFFLINE = health_module.Health.ONLINE, health_module.Health.OFFLINE

# The structured causes of a leader change (Action.cause), as the audits report them.
CAUSE_SPU_OFFLINE = "spu-offline"
CAUSE_PREFERRED = "preferred-leader"
CAUSE_DRAIN = "drain"
CAUSE_UNCLEAN = "unclean"


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the partition controller knows beyond the store: who is connected, and what they report."""

    health: Mapping[int, health_module.HealthRecord]
    live: Mapping[str, lrs.LiveStatus]
    unclean_election: bool = False
    rebalance_batch: int = 100


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the partition controller needs beyond the snapshot: the cluster view, and the
    partitions to look at (``names``; every partition when None)."""

    view: ClusterView
    names: Iterable[str] | None = None


def decide(snapshot: local.Snapshot, inputs: Inputs) -> list[actions.Action]:
    """Actions for the partitions in ``inputs.names`` (every partition when None)."""
    partitions = snapshot.entries("partitions")
    view = inputs.view
    online = _Online(snapshot, view)
    decided: list[actions.Action] = []
    rebalanced = 0
    for name in partitions if inputs.names is None else inputs.names:
        entry = partitions.get(name)
        if entry is None:
            continue
        action = _decide_one(entry, online, view)
        if action is None and rebalanced < view.rebalance_batch:
            action = _preferred_leader(entry, online, view)
            rebalanced += action is not None
        if action is not None:
            decided.append(action)
    return decided


def draining_spus(snapshot: local.Snapshot) -> frozenset[int]:
    """The ids of the SPUs an operator asked to drain (spec.drain)."""
    return frozenset(
        entry.obj.spec.id  # type: ignore[attr-defined]
        for entry in snapshot.entries("spus").values()
        if entry.obj.spec.drain  # type: ignore[attr-defined]
    )


class _Online:
    """Whether an SPU is up: connected now, or (before it reconnects after an SC restart)
    recorded Online and still within the SPU controller's grace period; and whether it may lead
    (up and not draining)."""

    def __init__(self, snapshot: local.Snapshot, view: ClusterView, also_draining: Collection[int] = ()) -> None:
        self._health = view.health
        self._recorded_online = set()
        draining = set(also_draining)
        for entry in snapshot.entries("spus").values():
            spu: models.Spu = entry.obj  # type: ignore[assignment]
            if spu.status.resolution is models.SpuResolution.ONLINE:
                self._recorded_online.add(spu.spec.id)
            if spu.spec.drain:
                draining.add(spu.spec.id)
        self.draining = frozenset(draining)

    def __call__(self, spu: int) -> bool:
        record = self._health.get(spu)
        if record is not None and record.state is HEALTH_ONLINE:
            return True
        if record is not None and record.state is HEALTH_OFFLINE:
            return False
        return spu in self._recorded_online

    def may_lead(self, spu: int) -> bool:
        return self(spu) and spu not in self.draining


def _decide_one(entry: local.Entry, online: _Online, view: ClusterView) -> actions.Action | None:
    partition: models.Partition = entry.obj  # type: ignore[assignment]
    spec, status = partition.spec, partition.status
    leader = spec.leader
    live = view.live.get(partition.name)
    if live is not None and live.leader != leader:
        live = None  # a report from a former leader says nothing of the current one

    if status.resolution is LEADER_OFFLINE:
        return _recover(entry, online, view)
    if not online(leader):
        return _replace_leader(entry, live, online, view, CAUSE_SPU_OFFLINE)
    if leader in online.draining:
        return _replace_leader(entry, live, online, view, CAUSE_DRAIN)
    if live is None:
        return None  # the leader has not reported yet: the status stays as it is
    if _still_meant(status, spec.replicas, live):
        return None  # only offsets moved: nothing to write (the common case, checked without models)
    desired = _status_from_live(spec.replicas, live)
    reason = f"leader SPU {leader} reports {desired.lrs} of {len(spec.replicas) - 1} followers in sync"
    return actions.update_status(partition, desired, entry.mod_revision, reason)


def _replace_leader(
    entry: local.Entry, live: lrs.LiveStatus | None, online: _Online, view: ClusterView, cause: str
) -> actions.Action | None:
    partition: models.Partition = entry.obj  # type: ignore[assignment]
    spec, status = partition.spec, partition.status
    leo, leader_hw = _known_offsets(status, live)
    if cause == CAUSE_DRAIN:
        # Only to a replica that may lead, in sync: else the draining leader keeps it (a drain
        # never leaves a partition without a leader, nor risks its committed records).
        chosen = election.elect(spec.replicas, spec.leader, online.may_lead, leo, leader_hw)
        if chosen is None:
            return None
        return _elect(entry, chosen, leo, leader_hw, cause, f"leader SPU {spec.leader} " + _WHY[cause])
    chosen = _choose(spec.replicas, spec.leader, online, leo, leader_hw, view.unclean_election)
    if chosen is None:
        if status.resolution is LEADER_OFFLINE:
            return None
        lost = _status_at_loss(spec, status, live)
        reason = f"leader SPU {spec.leader} is offline and no in-sync follower is online"
        return actions.update_status(partition, lost, entry.mod_revision, reason)
    return _elect(entry, chosen, leo, leader_hw, cause, f"leader SPU {spec.leader} " + _WHY[cause])


_WHY = {
    CAUSE_SPU_OFFLINE: "went offline",
    CAUSE_DRAIN: "is being drained",
}


def _choose(
    replicas: list[int], leaving: int | None, online: _Online, leo: Mapping[int, int], leader_hw: int, unclean: bool
) -> election.Election | None:
    """A new leader when the current one cannot lead: an in-sync replica that is not draining;
    else one that is (better a draining leader than none); else, if allowed, an unclean one."""
    return election.elect(replicas, leaving, online.may_lead, leo, leader_hw) or election.elect(
        replicas, leaving, online, leo, leader_hw, unclean
    )


def _recover(entry: local.Entry, online: _Online, view: ClusterView) -> actions.Action | None:
    """A LeaderOffline partition: a replica that was in sync when the leader was lost is back."""
    partition: models.Partition = entry.obj  # type: ignore[assignment]
    spec, status = partition.spec, partition.status
    leo, leader_hw = _known_offsets(status, None)
    # The leader itself first (no leader change), unless it is draining and another in-sync
    # replica is back; a draining leader still leads rather than leave the partition leaderless.
    chosen = None
    if not online.may_lead(spec.leader):
        chosen = election.elect(spec.replicas, spec.leader, online.may_lead, leo, leader_hw)
    if chosen is None and online(spec.leader):
        back = models.PartitionStatus(
            resolution=ONLINE, leader=status.leader, replicas=status.replicas, lrs=status.lrs
        )
        reason = f"leader SPU {spec.leader} is back online"
        return actions.update_status(partition, back, entry.mod_revision, reason)
    if chosen is None:
        chosen = _choose(spec.replicas, spec.leader, online, leo, leader_hw, view.unclean_election)
    if chosen is None:
        return None
    reason = f"replica SPU {chosen.leader} is back online and was in sync when leader SPU {spec.leader} was lost"
    return _elect(entry, chosen, leo, leader_hw, CAUSE_SPU_OFFLINE, reason)


def _preferred_leader(entry: local.Entry, online: _Online, view: ClusterView) -> actions.Action | None:
    """Leadership returns to the first replica once it is back and in sync (Kafka's balancing)."""
    partition: models.Partition = entry.obj  # type: ignore[assignment]
    spec, status = partition.spec, partition.status
    preferred = spec.replicas[0]
    if spec.leader == preferred or status.resolution is not ONLINE or not online.may_lead(preferred):
        return None
    live = view.live.get(partition.name)
    if live is None or live.leader != spec.leader or preferred not in live.in_sync():
        return None
    leo = {offsets.spu: offsets.leo for offsets in live.followers}
    chosen = election.Election(preferred, clean=True)
    reason = f"preferred leader SPU {preferred} is back and in sync"
    return _elect(entry, chosen, leo, live.hw, CAUSE_PREFERRED, reason)


def _elect(
    entry: local.Entry, chosen: election.Election, leo: Mapping[int, int], leader_hw: int, cause: str, reason: str
) -> actions.Action:
    partition: models.Partition = entry.obj  # type: ignore[assignment]
    replicas = partition.spec.replicas
    new_leader = chosen.leader
    unknown = election.UNKNOWN_OFFSET
    # The former leader leaves the in-sync set at once (Kafka shrinks the ISR the same way): from
    # now on the new leader commits records it does not have, until it is reported caught up.
    leo = {spu: offset for spu, offset in leo.items() if spu != partition.spec.leader}
    followers = [
        models.ReplicaStatus(spu=spu, hw=min(leader_hw, leo.get(spu, unknown)), leo=leo.get(spu, unknown))
        for spu in replicas
        if spu != new_leader
    ]
    # The new leader's high watermark is the committed point it is known to hold.
    new_leo = leo.get(new_leader, unknown)
    status = models.PartitionStatus(
        resolution=ONLINE,
        leader=models.ReplicaStatus(spu=new_leader, hw=min(leader_hw, new_leo), leo=new_leo),
        replicas=followers,
        lrs=len(lrs.in_sync_followers(leader_hw, (lrs.ReplicaOffsets(f.spu, f.hw, f.leo) for f in followers))),
    )
    updated = partition.model_copy(
        update={"spec": models.PartitionSpec(leader=new_leader, replicas=replicas), "status": status}
    )
    if not chosen.clean:
        cause = CAUSE_UNCLEAN
        reason += f"; unclean election: SPU {new_leader} may miss committed records"
    return actions.elect(partition, updated, entry.mod_revision, f"{reason}: SPU {new_leader} now leads", cause)


def _known_offsets(status: models.PartitionStatus, live: lrs.LiveStatus | None) -> tuple[dict[int, int], int]:
    """Each replica's last LEO and the leader's HW: from the live report, else the stored status."""
    if live is not None:
        leo = {offsets.spu: offsets.leo for offsets in live.followers}
        leo[live.leader] = live.leo
        return leo, live.hw
    leo = {replica.spu: replica.leo for replica in status.replicas}
    if status.leader is None:
        return leo, election.UNKNOWN_OFFSET
    leo[status.leader.spu] = status.leader.leo
    return leo, status.leader.hw


def _status_at_loss(
    spec: models.PartitionSpec, status: models.PartitionStatus, live: lrs.LiveStatus | None
) -> models.PartitionStatus:
    """LeaderOffline, keeping the offsets known when the leader was lost: they decide who may
    lead when a replica returns."""
    if live is not None:
        return _status_from_live(spec.replicas, live).model_copy(update={"resolution": LEADER_OFFLINE})
    return status.model_copy(update={"resolution": LEADER_OFFLINE})


def _status_from_live(replicas: list[int], live: lrs.LiveStatus) -> models.PartitionStatus:
    reported = {offsets.spu: offsets for offsets in live.followers}
    followers = []
    for spu in replicas:
        if spu == live.leader:
            continue
        offsets = reported.get(spu)
        followers.append(
            models.ReplicaStatus(spu=spu)
            if offsets is None
            else models.ReplicaStatus(spu=spu, hw=offsets.hw, leo=offsets.leo)
        )
    in_sync = live.in_sync() & set(replicas)
    return models.PartitionStatus(
        resolution=ONLINE,
        leader=models.ReplicaStatus(spu=live.leader, hw=live.hw, leo=live.leo),
        replicas=followers,
        lrs=len(in_sync),
    )


def _still_meant(status: models.PartitionStatus, replicas: list[int], live: lrs.LiveStatus) -> bool:
    """True when the stored status means what ``live`` says for the KV store: Online, the same
    leader and the same in-sync set (offsets may differ, they stay in memory).

    Every partition of a large cluster goes through here on each full pass, so it compares the
    stored status with the report directly instead of building the desired status as models."""
    leader = status.leader
    if status.resolution is not ONLINE or leader is None or leader.spu != live.leader:
        return False
    in_sync = live.in_sync()
    if not in_sync.issubset(replicas):
        in_sync = in_sync.intersection(replicas)
    return stored_in_sync(status) == in_sync


def stored_in_sync(status: models.PartitionStatus) -> frozenset[int]:
    if status.leader is None:
        return frozenset()
    return frozenset(replica.spu for replica in status.replicas if replica.leo >= status.leader.hw)


def with_live_offsets(partition: models.Partition, live: lrs.LiveStatus | None) -> models.Partition:
    """The partition as the API shows it: the stored status with the leader's latest offsets."""
    if live is None or live.leader != partition.spec.leader or partition.status.resolution is not ONLINE:
        return partition
    return partition.model_copy(update={"status": _status_from_live(partition.spec.replicas, live)})


def drain_blockers(snapshot: local.Snapshot, spu: int, view: ClusterView) -> dict[str, str]:
    """The partitions ``spu`` leads that no other replica could take over if it were drained
    (besides the SPUs already draining), each with the reason, by name; {} when every one could.

    The same election a drain runs (online, not draining, in sync by the same offsets), so what
    this names is exactly what the drain would leave behind right now."""
    online = _Online(snapshot, view, also_draining=(spu,))
    blocked = {}
    for entry in snapshot.entries("partitions").values():
        partition: models.Partition = entry.obj  # type: ignore[assignment]
        spec, status = partition.spec, partition.status
        if spec.leader != spu or status.resolution is LEADER_OFFLINE:
            continue
        live = view.live.get(partition.name)
        if live is not None and live.leader != spu:
            live = None
        leo, leader_hw = _known_offsets(status, live)
        if election.elect(spec.replicas, spu, online.may_lead, leo, leader_hw) is None:
            blocked[partition.name] = _why_stuck(spec.replicas, spu, online, leo, leader_hw)
    return dict(sorted(blocked.items(), key=lambda item: _name_order(item[0])))


def _why_stuck(replicas: list[int], leader: int, online: _Online, leo: Mapping[int, int], leader_hw: int) -> str:
    """Why no follower of ``leader`` may take over: the first of the election's conditions none meets."""
    followers = [spu for spu in replicas if spu != leader]
    if not followers:
        return "it has no other replica"
    up = [spu for spu in followers if online(spu)]
    if not up:
        return f"no follower is online ({_spus(followers)} offline)"
    in_sync = [spu for spu in up if leo.get(spu, election.UNKNOWN_OFFSET) >= leader_hw]
    if not in_sync:
        followers_are = "the online followers ({}) are" if len(up) > 1 else "the online follower ({}) is"
        return f"{followers_are.format(_spus(up))} out of sync (behind the high watermark {leader_hw})"
    if len(in_sync) == 1:
        return f"the only in-sync follower online, SPU {in_sync[0]}, is draining too"
    return f"the in-sync followers online ({_spus(in_sync)}) are draining too"


def describe_blockers(blocked: Mapping[str, str], limit: int = 10) -> str:
    """``name (reason), ...`` for at most ``limit`` partitions, then how many more."""
    shown = [f"{name} ({reason})" for name, reason in list(blocked.items())[:limit]]
    more = len(blocked) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _spus(ids: list[int]) -> str:
    return f"SPU {ids[0]}" if len(ids) == 1 else "SPUs " + ", ".join(str(spu) for spu in ids)


def _name_order(name: str) -> tuple[str, int]:
    topic, _, index = name.rpartition("-")
    return (topic, int(index)) if index.isdigit() else (name, -1)


def led_by(snapshot: local.Snapshot, spu: int) -> list[str]:
    """Names of the partitions ``spu`` leads (with a leader, i.e. not LeaderOffline), sorted."""
    return sorted(
        entry.obj.name
        for entry in snapshot.entries("partitions").values()
        if entry.obj.spec.leader == spu  # type: ignore[attr-defined]
        and entry.obj.status.resolution is not LEADER_OFFLINE  # type: ignore[attr-defined]
    )
