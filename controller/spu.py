"""SPU controller decisions: SPU resolution follows the connection manager's health view.

Purely computational, no I/O: (snapshot, health, clock) -> actions.
"""

from __future__ import annotations

from collections.abc import Mapping

from connection_manager import health as health_module
from controller import actions
from store import local, models

ONLINE, OFFLINE, INIT = models.SpuResolution.ONLINE, models.SpuResolution.OFFLINE, models.SpuResolution.INIT


def decide(
    snapshot: local.Snapshot,
    health: Mapping[int, health_module.HealthRecord],
    now: float,
    started_at: float,
    grace_period: float,
) -> list[actions.Action]:
    """Online while connected; Offline once it disconnects, or once the grace period after an SC
    start passes without it reconnecting (Fluvio would leave it Online forever)."""
    decided = []
    for entry in snapshot.entries("spus").values():
        spu: models.Spu = entry.obj  # type: ignore[assignment]
        record = health.get(spu.spec.id)
        state = health_module.Health.UNKNOWN if record is None else record.state
        current = spu.status.resolution
        target, reason = _target(current, state, now - started_at, grace_period)
        if target is not None and target is not current:
            decided.append(
                actions.update_status(spu, models.SpuStatus(resolution=target), entry.mod_revision, reason)
            )
    return decided


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
