"""The JSON shapes of placement and rebalance requests and answers (`sc placement compute|rebalance`,
POST /v1/placement, POST /v1/cluster/rebalance).

Purely computational, no I/O: dicts in, dataclasses out (and back); malformed input is an
InvalidConfig naming the field and the value.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.placement import model, rebalance, report
from store import models

_FIELDS = (
    "spus",
    "partitions",
    "replicationFactor",
    "strategy",
    "startIndex",
    "ignoreRackAssignment",
    "policies",
    "existing",
    "replicaAssignment",
    "currentReplicaMap",
    "registeredSpuIds",
    "plugin",
)


def _bad(field: str, value: object, wanted: str) -> model.InvalidConfig:
    return model.InvalidConfig(f"{field} must be {wanted}, got {_show(value)}")


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    if value is None:
        text = "null"
    elif value is True or value is False:
        text = "true" if value else "false"
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(field: str, value: object, lowest: int = 0, highest: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        wanted = f"an integer of at least {lowest}" if highest is None else f"an integer from {lowest} to {highest}"
        raise _bad(field, value, wanted)
    if highest is not None and value > highest:
        raise _bad(field, value, f"an integer from {lowest} to {highest}")
    return value


def _boolean(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _bad(field, value, "true or false")
    return value


def _string(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise _bad(field, value, "a string")
    return value


def _array(field: str, value: object) -> list[object]:
    if not isinstance(value, list):
        raise _bad(field, value, "an array")
    return value


def _object(field: str, value: object, allowed: Sequence[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise _bad(field, value, "an object")
    unknown = [key for key in value if key not in allowed]
    if unknown:
        raise model.InvalidConfig(f"{field} has unknown field {unknown[0]!r} (known: {', '.join(allowed)})")
    return value


def _ids(field: str, value: object) -> tuple[int, ...]:
    """SPU ids: within the stored SPUs' range."""
    return tuple(_integer(f"{field}[{index}]", item, 0, models.MAX_SPU_ID) for index, item in enumerate(_array(field, value)))


def _spu(index: int, value: object, allowed: Sequence[str] = ("id", "rack", "online")) -> model.SpuInfo:
    field = f"spus[{index}]"
    spu = _object(field, value, allowed)
    if "id" not in spu:
        raise model.InvalidConfig(f"{field} has no id")
    rack = spu.get("rack")
    if rack is not None and (not isinstance(rack, str) or not rack.strip()):
        raise _bad(f"{field}.rack", rack, "a non-empty string or null")
    if rack is not None:
        try:
            models.check_characters("rack", rack)  # the stored SPUs' rule: a rack is logged and shown
        except ValueError as error:
            raise model.InvalidConfig(f"{field}.rack: {error}") from None
    return model.SpuInfo(
        id=_integer(f"{field}.id", spu["id"], 0, models.MAX_SPU_ID),
        rack=rack,
        online=_boolean(f"{field}.online", spu.get("online", True)),
    )


def _existing(index: int, value: object) -> model.ExistingPartition:
    field = f"existing[{index}]"
    entry = _object(field, value, ("topic", "partition", "replicas"))
    for key in ("topic", "partition", "replicas"):
        if key not in entry:
            raise model.InvalidConfig(f"{field} has no {key}")
    return model.ExistingPartition(
        topic=_string(f"{field}.topic", entry["topic"]),
        partition=_integer(f"{field}.partition", entry["partition"], 0, models.MAX_PARTITION_ID),
        replicas=_ids(f"{field}.replicas", entry["replicas"]),
    )


def _manual(index: int, value: object) -> model.ManualPartition:
    # Values stay as written: the manual strategy checks them and names partition and value.
    entry = _object(f"replicaAssignment[{index}]", value, ("id", "replicas"))
    return model.ManualPartition(id=entry.get("id"), replicas=entry.get("replicas"))


def _manual_rows(value: object) -> tuple[model.ManualPartition, ...]:
    """A manual topic's rows: one per partition, so at most a topic's partitions."""
    rows = _array("replicaAssignment", value)
    if len(rows) > models.MAX_PARTITIONS:
        raise model.InvalidConfig(
            f"replicaAssignment lists {len(rows)} partitions, above the limit of {models.MAX_PARTITIONS} partitions a topic may have"
        )
    return tuple(_manual(index, entry) for index, entry in enumerate(rows))


def request_from_json(
    obj: object, *, default_spus: Sequence[model.SpuInfo] | None = None
) -> model.PlacementRequest:
    """Build a PlacementRequest from the API.md request object.

    `default_spus` stands in when the object has no `spus` (POST /v1/placement passes the
    cluster's live SPUs). Without `strategy`, a `replicaAssignment` means manual and
    `policies` means policies; otherwise computed.
    """
    body = _object("request", obj, _FIELDS)
    if "spus" in body:
        spus = tuple(_spu(index, spu) for index, spu in enumerate(_array("spus", body["spus"])))
    elif default_spus is not None:
        spus = tuple(default_spus)
    else:
        raise model.InvalidConfig("request has no spus: list the SPUs as [{id, rack, online}]")
    policies = body.get("policies")
    if policies is not None:
        policies = _string("policies", policies)
    assignment = body.get("replicaAssignment")
    if "strategy" in body:
        strategy = _string("strategy", body["strategy"])
    elif assignment is not None:
        strategy = "manual"
    elif policies is not None:
        strategy = "policies"
    else:
        strategy = "computed"
    manual = strategy == "manual"
    counts: dict[str, int] = {}
    for key in ("partitions", "replicationFactor"):
        if key in body:
            counts[key] = _integer(key, body[key], 0 if manual else 1)
        elif not manual:
            raise model.InvalidConfig(f"request has no {key}")
    plugin = body.get("plugin")
    registered = body.get("registeredSpuIds")
    return model.PlacementRequest(
        spus=spus,
        partitions=counts.get("partitions", 0),
        replication_factor=counts.get("replicationFactor", 0),
        strategy=strategy,
        start_index=_integer("startIndex", body.get("startIndex", 0), 0, model.MAX_START_INDEX),
        ignore_rack_assignment=_boolean("ignoreRackAssignment", body.get("ignoreRackAssignment", False)),
        policies=policies,
        existing=tuple(
            _existing(index, entry) for index, entry in enumerate(_array("existing", body.get("existing", [])))
        ),
        current_replica_map=tuple(
            _ids(f"currentReplicaMap[{index}]", row)
            for index, row in enumerate(_array("currentReplicaMap", body.get("currentReplicaMap", [])))
        ),
        replica_assignment=None if assignment is None else _manual_rows(assignment),
        registered_spu_ids=None if registered is None else _ids("registeredSpuIds", registered),
        plugin=None if plugin is None else _string("plugin", plugin),
    )


def result_to_json(result: model.PlacementResult, spus: Sequence[model.SpuInfo]) -> dict[str, object]:
    """`{"replicaMap": [...], "nextStartIndex": N, "balance": {...}}`."""
    return {
        "replicaMap": [list(row) for row in result.replica_map],
        "nextStartIndex": result.next_start_index,
        "balance": report.balance(result.replica_map, spus),
    }


def error_to_json(error: model.PlacementError) -> dict[str, object]:
    """`{"error": {"code": ..., "message": ...}}`, the body of a failed answer."""
    return {"error": {"code": error.code, "message": error.message}}


_REBALANCE_FIELDS = ("spus", "partitions", "maxMovesPerSpu")


def rebalance_request_from_json(obj: object) -> rebalance.RebalanceRequest:
    """Build a RebalanceRequest from `{"spus": [{id, rack, online, decommissioning}],
    "partitions": [{"partition": "t-0", "replicas": [..]}], "maxMovesPerSpu": N}`."""
    body = _object("request", obj, _REBALANCE_FIELDS)
    if "spus" not in body:
        raise model.InvalidConfig("request has no spus: list the SPUs as [{id, rack, online, decommissioning}]")
    if "partitions" not in body:
        raise model.InvalidConfig('request has no partitions: list them as [{"partition": "t-0", "replicas": [..]}]')
    spus = []
    decommissioning = []
    allowed = ("id", "rack", "online", "decommissioning")
    for index, value in enumerate(_array("spus", body["spus"])):
        fields = _object(f"spus[{index}]", value, allowed)
        spu = _spu(index, fields, allowed)
        spus.append(spu)
        if _boolean(f"spus[{index}].decommissioning", fields.get("decommissioning", False)):
            decommissioning.append(spu.id)
    partitions = []
    for index, value in enumerate(_array("partitions", body["partitions"])):
        field = f"partitions[{index}]"
        entry = _object(field, value, ("partition", "replicas"))
        for key in ("partition", "replicas"):
            if key not in entry:
                raise model.InvalidConfig(f"{field} has no {key}")
        partitions.append(
            rebalance.PartitionReplicas(
                name=_string(f"{field}.partition", entry["partition"]),
                replicas=_ids(f"{field}.replicas", entry["replicas"]),
            )
        )
    limit = body.get("maxMovesPerSpu")
    return rebalance.RebalanceRequest(
        spus=spus,
        partitions=partitions,
        decommissioning=decommissioning,
        max_moves_per_spu=None if limit is None else _integer("maxMovesPerSpu", limit, 1),
    )


def plan_to_json(plan: rebalance.RebalancePlan) -> dict[str, object]:
    """The API.md answer of POST /v1/cluster/rebalance (and `sc placement rebalance`).

    `replicaMoves`, `lowerBound`, `moves` (`from` / `to`: the whole replica list, preferred
    leader first), `before` and `after` as API.md has them; besides: `leaderChanges`,
    `targets`, `balanced`, `unreachable` (each SPU left outside its targets, with the reason)
    and `notes` (why the plan moves more than the lower bound, when it does).
    """
    return {
        "replicaMoves": plan.replica_moves,
        "lowerBound": plan.lower_bound,
        "leaderChanges": plan.leader_changes,
        "moves": [
            {"partition": move.partition, "from": list(move.before), "to": list(move.after)} for move in plan.moves
        ],
        "before": _load_to_json(plan.before),
        "after": _load_to_json(plan.after),
        "targets": {
            "replicas": {"floor": plan.replica_targets.floor, "ceiling": plan.replica_targets.ceiling},
            "leaders": {"floor": plan.leader_targets.floor, "ceiling": plan.leader_targets.ceiling},
        },
        "balanced": plan.balanced,
        "unreachable": [
            {
                "spu": shortfall.spu,
                "kind": shortfall.kind,
                "count": shortfall.count,
                "floor": shortfall.floor,
                "ceiling": shortfall.ceiling,
                "reason": shortfall.reason,
            }
            for shortfall in plan.unreachable
        ],
        "notes": list(plan.notes),
    }


def _load_to_json(load: rebalance.Load) -> dict[str, object]:
    return {
        "replicasPerSpu": {str(spu_id): count for spu_id, count in load.replicas.items()},
        "leadersPerSpu": {str(spu_id): count for spu_id, count in load.leaders.items()},
    }
