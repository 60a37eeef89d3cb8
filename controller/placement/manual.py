"""Manual replica assignment: every rule of the seed's replica assignment file, checked at once.

Purely computational, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from controller.placement import model
from store import models

_SHOWN_PROBLEMS = 10


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(entry: object) -> tuple[object, object]:
    if isinstance(entry, Mapping):
        return entry.get("id"), entry.get("replicas")
    if isinstance(entry, tuple | list) and len(entry) == 2:
        return entry[0], entry[1]
    if hasattr(entry, "id") and hasattr(entry, "replicas"):
        return entry.id, entry.replicas
    return None, None


def validate_manual(replica_assignment: Iterable[object], registered_spu_ids: Iterable[int]) -> list[list[int]]:
    """Check an assignment (`(id, replicas)` pairs or `{"id", "replicas"}` objects); return the replica map.

    Rules: at least one partition; ids are non-negative integers listed 0, 1, 2, ... in order,
    without gaps or repeats (as Fluvio, which refuses rather than re-sorts them); each partition has at least one replica,
    all the same number, unique, non-negative integer SPU ids, every one registered. All
    problems are reported together in one InvalidConfig, each naming the partition and value.
    """
    entries = [_entry(entry) for entry in replica_assignment]
    registered = set(registered_spu_ids)
    problems: list[str] = []
    unregistered: list[str] = []  # the problems that registering SPUs would fix
    if not entries:
        raise model.InvalidConfig("replica assignment is empty: it needs at least one partition")
    by_id: dict[int, list[int]] = {}
    for position, (partition_id, replicas) in enumerate(entries):
        if not _is_index(partition_id):
            problems.append(f"entry {position}: partition id {partition_id!r} is not a non-negative integer")
            continue
        assert isinstance(partition_id, int)
        if partition_id > models.MAX_PARTITION_ID:
            problems.append(
                f"entry {position}: partition id {partition_id} is above {models.MAX_PARTITION_ID}, "
                "the largest partition id (Fluvio's are 32-bit)"
            )
            continue
        if partition_id in by_id:
            problems.append(f"partition {partition_id}: the id appears more than once")
            continue
        by_id[partition_id] = _replicas(partition_id, replicas, registered, problems, unregistered)
    given = list(by_id)  # in the order written
    missing = sorted(set(range(len(entries))) - set(by_id))
    misplaced = [partition_id for position, partition_id in enumerate(given) if partition_id != position]
    if given and (missing or misplaced):
        wrong = (
            f"{model.format_ids(missing)} {'are' if len(missing) > 1 else 'is'} missing"
            if missing
            else f"{model.format_ids(misplaced)} {'are' if len(misplaced) > 1 else 'is'} out of order"
        )
        problems.append(
            f"assigned partition ids must be in sequence and without gaps: {wrong} (ids given: {model.format_ids(given)})"
        )
    sizes = {partition_id: len(replicas) for partition_id, replicas in by_id.items() if replicas}
    if sizes:
        reference = min(sizes)
        for partition_id in sorted(sizes):
            if sizes[partition_id] != sizes[reference]:
                problems.append(
                    f"partition {partition_id} has {sizes[partition_id]} replicas but partition {reference} has "
                    f"{sizes[reference]}: every partition needs the same number of replicas"
                )
    if problems:
        shown = "; ".join(problems[:_SHOWN_PROBLEMS])
        more = f"; and {len(problems) - _SHOWN_PROBLEMS} more" if len(problems) > _SHOWN_PROBLEMS else ""
        fix = model.Fix.CLUSTER if len(unregistered) == len(problems) else model.Fix.SPEC
        raise model.InvalidConfig(f"invalid replica assignment: {shown}{more}", problems=problems, fix=fix)
    return [by_id[partition_id] for partition_id in range(len(entries))]


def _replicas(
    partition_id: int, replicas: object, registered: set[int], problems: list[str], unregistered: list[str]
) -> list[int]:
    if not isinstance(replicas, Sequence) or isinstance(replicas, str | bytes):
        problems.append(f"partition {partition_id}: replicas {replicas!r} is not a list of SPU ids")
        return []
    if not replicas:
        problems.append(f"partition {partition_id}: replicas is empty, it needs at least one SPU")
        return []
    if len(replicas) > models.MAX_REPLICATION_FACTOR:
        # Before looking at each id: a row of a million ids is not checked one by one (nor its
        # size compared with the others': it is wrong already).
        problems.append(
            f"partition {partition_id}: replicas lists {len(replicas)} SPUs; at most "
            f"{models.MAX_REPLICATION_FACTOR} are allowed (the largest replication factor)"
        )
        return []
    seen: list[int] = []
    for spu_id in replicas:
        if not _is_index(spu_id):
            problems.append(f"partition {partition_id}: replica {spu_id!r} is not a non-negative integer SPU id")
            continue
        assert isinstance(spu_id, int)
        if spu_id in seen:
            problems.append(f"partition {partition_id}: SPU {spu_id} is listed more than once")
            continue
        seen.append(spu_id)
        if spu_id not in registered:
            unregistered.append(
                f"partition {partition_id}: SPU {spu_id} is not registered "
                f"(registered: {model.format_ids(sorted(registered)) or 'none'})"
            )
            problems.append(unregistered[-1])
    # As given, even when invalid: the replica count is still compared across partitions.
    return list(replicas)


def place(request: model.PlacementRequest) -> model.PlacementResult:
    """The replica map a valid assignment defines; the start index is not consumed.

    The assignment defines every partition, so `current_replica_map` plays no part here.
    """
    if request.replica_assignment is None:
        raise model.InvalidConfig("strategy manual needs a replicaAssignment")
    registered = request.registered_spu_ids
    if registered is None:
        registered = tuple(spu.id for spu in request.spus)
    replica_map = validate_manual(request.replica_assignment, registered)
    if request.partitions and request.partitions != len(replica_map):
        raise model.InvalidConfig(
            f"partitions is {request.partitions} but the replica assignment defines {len(replica_map)}"
        )
    if request.replication_factor and request.replication_factor != len(replica_map[0]):
        raise model.InvalidConfig(
            f"replication factor is {request.replication_factor} but the replica assignment gives "
            f"{len(replica_map[0])} replicas per partition"
        )
    return model.PlacementResult(replica_map=replica_map, next_start_index=request.start_index)
