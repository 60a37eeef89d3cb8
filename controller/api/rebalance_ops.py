"""The rebalance routes' work: plan from the mirror, store the run (meta/rebalance) by compare-and-swap,
report its progress, cancel it; a decommission is a run whose plan empties one more SPU.

The writes here are the intent only (the run, an SPU's spec.decommission); the rebalance controller
starts and cancels the moves, the partition controller carries them out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from controller import context as context_module
from controller.api import admin_ops, admission
from controller.placement import codec, planner
from controller.placement import model as placement_model
from controller.reconcile import moves, partition
from store import active_sc, kv, local, models

log = structlog.get_logger(__name__)

ApiError = admin_ops.ApiError
BODY_SHAPE = '{"maxMovesPerSpu": N}'


def max_moves_per_spu(body: dict[str, Any] | None, default: int) -> int:
    """The body's maxMovesPerSpu (the setting when absent): 400 for a wrong type, 422 out of range."""
    if body is None:
        return default
    unknown = sorted(set(body) - {"maxMovesPerSpu"})
    if unknown:
        raise ApiError(422, "InvalidRequest", f"{unknown[0]}: unknown field (the body is {BODY_SHAPE}, or empty)")
    limit = body.get("maxMovesPerSpu", default)
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise ApiError(400, "MalformedRequest", f"maxMovesPerSpu: must be a whole number, got {_shown(limit)}")
    if not 1 <= limit <= moves.MAX_MOVES_PER_SPU:
        raise ApiError(
            422, "InvalidRequest", f"maxMovesPerSpu: must be from 1 to {moves.MAX_MOVES_PER_SPU}, got {limit}"
        )
    return limit


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _online(context: context_module.Context, snapshot: local.Snapshot) -> Callable[[int], bool]:
    """Online as the partition controller judges it (connected now), or as recorded (without a
    connection manager, and on a standby: the SPUs connect to the leader, whose SPU controller
    records it): an offline SPU keeps its replicas and takes none."""
    active = context.active
    standby = active is not None and active.state is not active_sc.State.ACTIVE
    if context.connections is None or standby:
        recorded = {
            entry.obj.spec.id
            for entry in snapshot.entries("spus").values()
            if entry.obj.status.resolution is models.SpuResolution.ONLINE
        }
        return recorded.__contains__
    view = partition.ClusterView(health=context.connections.health.snapshot(), live={})
    return partition.Cluster(snapshot, view).online


async def _plan(context: context_module.Context, decommissioning: tuple[int, ...] = ()) -> Any:
    """The plan for the cluster as this SC's mirror has it, in a slot of the expensive-work gate and
    its worker thread: a large cluster's plan is seconds of CPU, and the read role may ask for dry
    runs (Busy beyond the slots and the queue)."""
    async with context.gate.slot(admission.REBALANCE):
        snapshot = context.local_store.snapshot()
        try:
            request = moves.plan_request(snapshot, _online(context, snapshot), decommissioning)
            return await context.gate.offload(planner.plan, request)
        except placement_model.PlacementError as error:
            raise ApiError(422, "CannotPlan", f"no rebalance plan: {error}") from None


def _refuse_if_busy(context: context_module.Context, current: moves.Run | None) -> None:
    """A new plan waits for the run in progress, and for every move of a cancelled one to go back."""
    if current is not None and current.state == moves.RUNNING:
        raise ApiError(
            409,
            "RebalanceRunning",
            f"a {current.kind} is running ({len(current.moves)} moves): wait until it is done "
            "(GET /v1/cluster/rebalance) or cancel it (DELETE /v1/cluster/rebalance) first",
        )
    moving = moves.moving_partitions(context.local_store.snapshot())
    if moving:
        raise ApiError(
            409,
            "MovesInProgress",
            f"{len(moving)} partition(s) are still moving or going back ({', '.join(moving[:5])}): plan again once they are done",
        )


async def _stored(context: context_module.Context) -> tuple[moves.Run | None, int]:
    """The run in the store itself (not the mirror: the compare-and-swap must see the latest), and
    its mod revision (0: none). A value that is not a run may be replaced by a new plan."""
    item = await context.kv_store.get(moves.KEY)
    if item is None:
        return None, 0
    try:
        return moves.decode(item.value), item.mod_revision
    except moves.InvalidRun as error:
        log.warning("replacing a stored rebalance run that cannot be read", problem=str(error))
        return None, item.mod_revision


async def rebalance(context: context_module.Context, limit: int, dry_run: bool) -> tuple[int, dict[str, Any]]:
    """POST /v1/cluster/rebalance: the plan; unless a dry run, stored and started."""
    admin_ops.require_synced(context)
    if dry_run:
        plan = await _plan(context)
        return 200, codec.plan_to_json(plan)
    current, revision = await _stored(context)
    _refuse_if_busy(context, current)
    plan = await _plan(context)
    run = _run(plan, moves.REBALANCE, limit)
    revision = await _write(context, [(moves.KEY, run.encode(), revision)], "storing the rebalance plan")
    _record_planned(context, run, revision)
    log.info("rebalance planned", moves=len(run.moves), replica_moves=plan.replica_moves, lower_bound=plan.lower_bound)
    return 202, {**codec.plan_to_json(plan), "state": run.state, "maxMovesPerSpu": limit}


async def decommission(context: context_module.Context, name: str, limit: int, dry_run: bool = False) -> tuple[int, dict[str, Any]]:
    """POST /v1/spus/{name}/decommission: mark the SPU decommissioned and store the plan that empties
    it, in one transaction (both or neither); a dry run only answers the plan."""
    admin_ops.require_synced(context)
    key = models.object_key("spus", name)
    stored_spu = await context.kv_store.get(key)
    spu = None if stored_spu is None else admin_ops.decoded("spus", stored_spu)
    if stored_spu is None or not isinstance(spu, models.Spu):
        raise ApiError(404, "NotFound", f"{admin_ops.label('spus', name)} not found")
    spu_id = spu.spec.id
    if dry_run:
        plan = await _plan(context, (spu_id,))
        return 200, {**codec.plan_to_json(plan), "spu": spu_id, "name": name}
    current, revision = await _stored(context)
    _refuse_if_busy(context, current)
    plan = await _plan(context, (spu_id,))
    leaving = sorted(set(moves.decommissioning_spus(context.local_store.snapshot())) | {spu_id})
    run = _run(plan, moves.DECOMMISSION, limit, leaving)
    writes = [(moves.KEY, run.encode(), revision)]
    if not spu.spec.decommission:
        marked = spu.model_copy(update={"spec": spu.spec.model_copy(update={"decommission": True})})
        writes.append((key, models.encode(marked), stored_spu.mod_revision))
    revision = await _write(context, writes, f"decommissioning SPU {spu_id} ({name!r})")
    _record_planned(context, run, revision)
    log.info("decommission planned", spu=spu_id, name=name, moves=len(run.moves))
    answer = {**codec.plan_to_json(plan), "state": run.state, "maxMovesPerSpu": limit, "spu": spu_id, "name": name}
    return 202, answer


def _run(plan: Any, kind: str, limit: int, leaving: list[int] | None = None) -> moves.Run:
    if len(plan.moves) > moves.MAX_MOVES:
        raise ApiError(
            422,
            "PlanTooLarge",
            f"the plan has {len(plan.moves)} moves, more than the {moves.MAX_MOVES} a run holds: "
            "add fewer SPUs at once, or decommission one SPU at a time",
        )
    return moves.run_of(plan, kind, limit, leaving or ())


def _record_planned(context: context_module.Context, run: moves.Run, revision: int) -> None:
    """Each move of a stored run, in the history as planned (the run's key is not an object: the
    Reader records no change of it)."""
    if context.history is None:
        return
    for move in run.moves:
        context.history.record_action(
            "partitions", move.partition, "plan", f"{run.kind} planned: {list(move.before)} -> {list(move.after)}",
            moves.CAUSE_PLANNED, 0, "applied", revision, [moves.KEY],
        )


async def _write(context: context_module.Context, writes: list[tuple[str, bytes, int]], doing: str) -> int:
    """The writes in one transaction, each compared with the revision it was read at; the commit's revision."""
    compares = [kv.Compare(key, revision) for key, _, revision in writes]
    try:
        return await context.kv_store.txn(compares, [kv.Put(key, value) for key, value, _ in writes])
    except kv.Conflict:
        raise ApiError(409, "Conflict", f"the cluster changed while {doing}: plan again") from None
    except kv.TooLarge as error:
        raise ApiError(
            422, "PlanTooLarge", f"the plan cannot be stored ({error}): rebalance with fewer partitions moving at once"
        ) from None


class Progress:
    """GET /v1/cluster/rebalance, from this SC's mirror. The run is decoded again only when
    meta/rebalance changed: decoding 10,000 moves is over 100 ms on the event loop, which any read
    credential may ask for."""

    def __init__(self) -> None:
        self._known: moves.Stored | None = None

    def answer(self, context: context_module.Context) -> dict[str, Any]:
        admin_ops.require_synced(context)
        snapshot = context.local_store.snapshot()
        self._known = moves.stored(snapshot, self._known)
        return moves.progress(snapshot, self._known).to_json()


async def cancel(context: context_module.Context) -> dict[str, Any]:
    """DELETE /v1/cluster/rebalance: the run is cancelled; its moves in flight go back."""
    admin_ops.require_synced(context)
    current, revision = await _stored(context)
    if current is None or current.state != moves.RUNNING:
        state = "idle" if current is None else current.state
        raise ApiError(409, "NotRunning", f"no rebalance is running (state {state}): there is nothing to cancel")
    revision = await _write(context, [(moves.KEY, current.with_state(moves.CANCELLED).encode(), revision)], "cancelling the rebalance")
    if context.history is not None:
        context.history.record_action(
            "meta", "rebalance", "cancel", f"{current.kind} of {len(current.moves)} moves cancelled: moves in flight go back",
            moves.CAUSE_RUN, 0, "applied", revision, [moves.KEY],
        )
    log.info("rebalance cancelled", kind=current.kind, moves=len(current.moves))
    return {"state": moves.CANCELLED, "kind": current.kind, "total": len(current.moves)}
