"""SPU controller decisions: SPU resolution follows the connection manager's health view; a
drained SPU's status says how far its drain is (Draining, Drained) and what keeps it from ending; a
decommissioned one's, whether replicas are still on it (InProgress, Done).

Purely computational, no I/O: (snapshot, health, what SPUs reported, clock) -> actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from connection_manager import health as health_module
from controller.reconcile import actions, faults as faults_module, moves, partition
from store import local, models

ONLINE, OFFLINE, INIT = models.SpuResolution.ONLINE, models.SpuResolution.OFFLINE, models.SpuResolution.INIT
DRAINING, DRAINED = models.SpuDrain.DRAINING, models.SpuDrain.DRAINED
IN_PROGRESS, DECOMMISSIONED = models.SpuDecommission.IN_PROGRESS, models.SpuDecommission.DONE


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the SPU controller needs beyond the snapshot: the connection manager's health view,
    the loop clock's ``now``, when the SC started (``started_at``, same clock), how long SPUs
    recorded Online have to reconnect after that (``grace_period``), and the partition
    controller's cluster view (what SPUs reported), which a drain's progress is judged by."""

    health: Mapping[int, health_module.HealthRecord]
    now: float
    started_at: float
    grace_period: float
    view: partition.ClusterView | None = None
    # Where an SPU whose decision raised goes (faults.py).
    faults: faults_module.Faults = faults_module.RAISE


def decide(snapshot: local.Snapshot, inputs: Inputs) -> list[actions.Action]:
    """Online while connected; Offline once it disconnects, or once the grace period after an SC
    start passes without it reconnecting (Fluvio would leave it Online forever). A drained SPU
    is Draining while it leads a partition, Drained once it leads none."""
    health, now, started_at, grace_period = inputs.health, inputs.now, inputs.started_at, inputs.grace_period
    spus = snapshot.entries("spus")
    draining = partition.draining_spus(snapshot)
    leading = _leading(snapshot, draining) if draining else {}
    retiring = [entry.obj.spec.id for entry in spus.values() if entry.obj.spec.decommission]
    held = moves.holdings(snapshot, retiring)
    view = inputs.view if inputs.view is not None else partition.ClusterView(health, {})
    decided = []
    for entry in spus.values():
        try:
            spu: models.Spu = entry.obj
            record = health.get(spu.spec.id)
            state = health_module.Health.UNKNOWN if record is None else record.state
            current = spu.status
            target, why = _target(current.resolution, state, now - started_at, grace_period)
            desired = models.SpuStatus(resolution=current.resolution if target is None else target)
            reasons = [why] if desired.resolution is not current.resolution else []
            if spu.spec.drain:
                desired, why = _drained(snapshot, spu, desired, leading.get(spu.spec.id, []), view)
                if (desired.drain, desired.reason) != (current.drain, current.reason):
                    reasons.append(why)
            elif current.drain is not None:
                reasons.append(f"SPU {spu.spec.id} is no longer draining")
            if spu.spec.decommission:
                count = held.get(spu.spec.id, 0)
                decommission = IN_PROGRESS if count else DECOMMISSIONED
                desired = desired.model_copy(update={"decommission": decommission})
                if decommission is not current.decommission:
                    reasons.append(
                        f"SPU {spu.spec.id} is decommissioned: "
                        + (f"{count} replica(s) still on it" if count else "it holds no replica, it may be deleted")
                    )
            elif current.decommission is not None:
                reasons.append(f"SPU {spu.spec.id} is no longer decommissioned")
            if desired != current:
                decided.append(actions.update_status(spu, desired, entry.mod_revision, "; ".join(reasons)))
        except Exception as error:  # this SPU only (faults.py): nothing of it was added
            inputs.faults.record("spus", entry.name, error)
    return decided


def _leading(snapshot: local.Snapshot, spu_ids: frozenset[int]) -> dict[int, list[str]]:
    """The partitions each of ``spu_ids`` leads now (LeaderOffline ones have no leader), in one pass."""
    leading: dict[int, list[str]] = {}
    for entry in snapshot.entries("partitions").values():
        leader = entry.obj.spec.leader
        if leader in spu_ids and entry.obj.status.resolution is not models.PartitionResolution.LEADER_OFFLINE:
            leading.setdefault(leader, []).append(entry.name)
    return leading


def _drained(
    snapshot: local.Snapshot, spu: models.Spu, status: models.SpuStatus, leading: list[str], view: partition.ClusterView
) -> tuple[models.SpuStatus, str]:
    if not leading:
        return status.model_copy(update={"drain": DRAINED}), f"SPU {spu.spec.id} is drained: it leads no partition"
    blocked = partition.drain_blockers(snapshot, spu.spec.id, view)
    if not blocked:
        draining = status.model_copy(update={"drain": DRAINING})
        return draining, f"SPU {spu.spec.id} is draining: {len(leading)} leadership(s) to move"
    stuck = (
        f"{len(blocked)} of the {len(leading)} partition(s) it leads cannot move: "
        + partition.describe_blockers(blocked)
    )
    return status.model_copy(update={"drain": DRAINING, "reason": stuck}), f"SPU {spu.spec.id} is draining; {stuck}"


def _target(
    current: models.SpuResolution, state: health_module.Health, uptime: float, grace_period: float
) -> tuple[models.SpuResolution | None, str]:
    if state is health_module.Health.ONLINE:
        return ONLINE, "SPU connected"
    if state is health_module.Health.OFFLINE:
        return (OFFLINE, "SPU disconnected") if current is not INIT else (None, "")
    if current is ONLINE and uptime >= grace_period:
        return OFFLINE, f"SPU did not reconnect within {grace_period:g} s of the SC starting"
    return None, ""
