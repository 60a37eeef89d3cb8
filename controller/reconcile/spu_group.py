"""SPU-group controller decisions: a group owns managed SPUs ``<group>-<i>`` with ids minId+i.

Purely computational, no I/O. A colliding id range makes the group Invalid and creates
nothing; scaling down deletes the highest ids; deleting the group deletes its SPUs. Each
managed SPU takes and gives back its id's index key (``spu_ids``) in its own transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Set as AbstractSet
from dataclasses import dataclass

from controller.reconcile import actions, faults as faults_module, spu_ids
from store import local, models, spu_index

RESERVED, INVALID = models.SpuGroupResolution.RESERVED, models.SpuGroupResolution.INVALID


def desired_spus(group: models.SpuGroup) -> list[models.Spu]:
    spec = group.spec
    spus = []
    for index in range(spec.replicas):
        spu_id = spec.min_id + index
        spus.append(
            models.Spu(
                name=managed_spu_name(group.name, index),
                spec=models.SpuSpec(
                    id=spu_id,
                    spu_type=models.SpuType.MANAGED,
                    rack=spec.rack,
                    public_endpoint=models.Endpoint(host=spec.host, port=spec.public_port_base + spu_id),
                    private_endpoint=models.Endpoint(host=spec.host, port=spec.private_port_base + spu_id),
                ),
            )
        )
    return spus


def managed_spu_name(group: str, index: int) -> str:
    return f"{group}-{index}"


def owning_group(spu: models.Spu) -> str | None:
    """The group a managed SPU belongs to (from its name), None for custom SPUs."""
    if spu.spec.spu_type is not models.SpuType.MANAGED:
        return None
    group, _, index = spu.name.rpartition("-")
    return group if group and index.isdigit() else None


@dataclass(frozen=True, slots=True)
class Inputs:
    """Nothing beyond the snapshot (every pass decides from the groups and SPUs it holds) but
    where a group or SPU whose decision raised goes (faults.py)."""

    faults: faults_module.Faults = faults_module.RAISE


def decide(snapshot: local.Snapshot, inputs: Inputs) -> list[actions.Action]:
    spus: Mapping[str, local.Entry[models.Spu]] = snapshot.entries("spus")
    groups: Mapping[str, local.Entry[models.SpuGroup]] = snapshot.entries("spu-groups")
    ids = {name: entry.obj.spec.id for name, entry in spus.items()}
    decided: list[actions.Action] = []
    # Ranges are reserved oldest group first: of two groups that want one free id, the one created
    # first gets it, in every pass (two groups created at once must not take alternate ids).
    reserved: dict[int, str] = {}
    for entry in sorted(groups.values(), key=lambda entry: (entry.create_revision, entry.name)):
        try:
            decided += _reconcile_group(entry, spus, ids, reserved, snapshot.meta, snapshot.unreadable("spus"))
        except Exception as error:  # this group only (faults.py); a range it reserved stays its own
            inputs.faults.record("spu-groups", entry.name, error)
    # SPUs of deleted groups, and SPUs above a group's replica count (scale down).
    for spu_entry in spus.values():
        try:
            decided += _orphaned(spu_entry, groups, snapshot)
        except Exception as error:  # this SPU only (faults.py)
            inputs.faults.record("spus", spu_entry.name, error)
    return decided


def _orphaned(
    spu_entry: local.Entry[models.Spu], groups: Mapping[str, local.Entry[models.SpuGroup]], snapshot: local.Snapshot
) -> list[actions.Action]:
    """A managed SPU's deletion when its group was deleted or scaled down below it."""
    spu: models.Spu = spu_entry.obj
    group_name = owning_group(spu)
    if group_name is None:
        return []
    group_entry = groups.get(group_name)
    if group_entry is None:
        if group_name in snapshot.unreadable("spu-groups"):
            return []  # the group is there, in a value this SC cannot read: not deleted
        return [_delete(spu_entry, snapshot.meta, f"SPU group {group_name} was deleted")]
    group: models.SpuGroup = group_entry.obj
    index = int(spu.name.rpartition("-")[2])
    if group.status.resolution is RESERVED and index >= group.spec.replicas:
        return [_delete(spu_entry, snapshot.meta, f"SPU group {group.name} scaled down to {group.spec.replicas}")]
    return []


def _delete(entry: local.Entry[models.Spu], meta: spu_index.MetaReader, reason: str) -> actions.Action:
    """Delete a managed SPU and, in the same transaction, give its id back."""
    spu: models.Spu = entry.obj
    released = spu_ids.release(spu.name, spu.spec.id, meta(spu_index.index_key(spu.spec.id)))
    return actions.delete("spus", spu.name, entry.mod_revision, reason, also=() if released is None else (released,))


def _reconcile_group(
    entry: local.Entry[models.SpuGroup],
    spus: Mapping[str, local.Entry[models.Spu]],
    ids: Mapping[str, int],
    reserved: dict[int, str],
    meta: spu_index.MetaReader,
    unreadable: AbstractSet[str],
) -> list[actions.Action]:
    group: models.SpuGroup = entry.obj
    wanted = desired_spus(group)
    wanted_names = {spu.name for spu in wanted}
    wanted_ids = {spu.spec.id: spu.name for spu in wanted}
    collisions = []
    for other_entry in spus.values():
        other: models.Spu = other_entry.obj
        owner = owning_group(other)
        if owner == group.name:
            continue
        if other.spec.id in wanted_ids and owner is not None and reserved.get(other.spec.id) == owner:
            continue  # said once for the whole range below, before and after that group's SPUs exist
        if other.spec.id in wanted_ids:
            collisions.append(f"SPU id {other.spec.id} is already used by SPU {other.name}")
        elif other.name in wanted_names:
            collisions.append(f"SPU name {other.name} is already used by SPU id {other.spec.id}")
    overlapping = sorted({reserved[spu_id] for spu_id in wanted_ids if spu_id in reserved})
    for other_group in overlapping:
        ids_taken = sorted(spu_id for spu_id in wanted_ids if reserved.get(spu_id) == other_group)
        which = f"id {ids_taken[0]} is" if len(ids_taken) == 1 else f"ids {ids_taken[0]}..{ids_taken[-1]} are"
        collisions.append(f"{which} in the id range of SPU group {other_group}, created earlier")
    if collisions:
        reason = f"id range {group.spec.min_id}..{group.spec.min_id + group.spec.replicas - 1} collides: " + "; ".join(
            collisions
        )
        return _status(entry, INVALID, reason)
    reserved.update((spu_id, group.name) for spu_id in wanted_ids)
    decided = _status(entry, RESERVED, "")
    if group.status.resolution is not RESERVED:
        return decided  # SPUs are created once the range is reserved
    for spu in wanted:
        current = spus.get(spu.name)
        if current is not None and current.obj.spec == spu.spec:
            continue
        if current is None and spu.name in unreadable:
            continue  # its key holds a value this SC cannot read: a create would only lose its compare
        # The id's index key goes in the same transaction as the SPU; an id still held by another
        # of the group's SPUs (its ids are being moved, a hand edit) waits for that one to move.
        stored_index = meta(spu_index.index_key(spu.spec.id))
        try:
            taken = spu_ids.claim(spu.name, spu.spec.id, stored_index, ids)
        except spu_ids.IdInUse:
            continue
        claims = () if taken is None else (taken,)
        if current is None:
            decided.append(actions.create(spu, f"SPU group {group.name} has {group.spec.replicas} replicas", also=claims))
            continue
        # A drain and a decommission are the operator's, not the group's: kept whatever the group says.
        spec = spu.spec.model_copy(update={"drain": current.obj.spec.drain, "decommission": current.obj.spec.decommission})
        if current.obj.spec == spec:
            continue
        old_id = current.obj.spec.id
        released = None if old_id == spu.spec.id else spu_ids.release(spu.name, old_id, meta(spu_index.index_key(old_id)))
        decided.append(
            actions.update_spec(
                current.obj,
                spec,
                current.mod_revision,
                f"SPU group {group.name} changed",
                also=claims + (() if released is None else (released,)),
            )
        )
    return decided


def _status(entry: local.Entry[models.SpuGroup], resolution: models.SpuGroupResolution, reason: str) -> list[actions.Action]:
    group: models.SpuGroup = entry.obj
    status = models.SpuGroupStatus(resolution=resolution, reason=reason)
    if group.status == status:
        return []
    return [actions.update_status(group, status, entry.mod_revision, reason or f"SPU group {resolution.value}")]
