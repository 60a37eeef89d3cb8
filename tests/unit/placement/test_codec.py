"""The JSON request and answer shared by `sc placement compute` and POST /v1/placement."""

from __future__ import annotations

import pytest

from controller import placement


def test_full_request() -> None:
    request = placement.request_from_json(
        {
            "spus": [{"id": 1, "rack": "r1"}, {"id": 0, "rack": "r2", "online": False}],
            "partitions": 4,
            "replicationFactor": 2,
            "strategy": "kafka",
            "startIndex": 3,
            "ignoreRackAssignment": True,
            "existing": [{"topic": "t", "partition": 0, "replicas": [1, 0]}],
            "currentReplicaMap": [[1, 0]],
            "plugin": "pkg.mod:Placer",
        }
    )
    assert request == placement.PlacementRequest(
        spus=(placement.SpuInfo(1, "r1"), placement.SpuInfo(0, "r2", online=False)),
        partitions=4,
        replication_factor=2,
        strategy="kafka",
        start_index=3,
        ignore_rack_assignment=True,
        existing=(placement.ExistingPartition("t", 0, (1, 0)),),
        current_replica_map=((1, 0),),
        plugin="pkg.mod:Placer",
    )


def test_minimal_request_defaults() -> None:
    request = placement.request_from_json({"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1})
    assert request == placement.PlacementRequest(spus=(placement.SpuInfo(0),), partitions=1, replication_factor=1)


def test_strategy_is_inferred_from_assignment_or_policies() -> None:
    manual = placement.request_from_json({"spus": [{"id": 0}], "replicaAssignment": [{"id": 0, "replicas": [0]}]})
    assert manual.strategy == "manual"
    assert manual.replica_assignment == (placement.ManualPartition(0, [0]),)
    assert (manual.partitions, manual.replication_factor) == (0, 0)
    policies = placement.request_from_json(
        {"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1, "policies": "shard=balanced"}
    )
    assert policies.strategy == "policies"


def test_registered_ids_for_manual_checks() -> None:
    request = placement.request_from_json(
        {"spus": [{"id": 0}], "replicaAssignment": [{"id": 0, "replicas": [3]}], "registeredSpuIds": [0, 3]}
    )
    assert request.registered_spu_ids == (0, 3)
    assert placement.compute(request).replica_map == [[3]]


def test_default_spus_stand_in_when_the_request_has_none() -> None:
    live = [placement.SpuInfo(7)]
    request = placement.request_from_json({"partitions": 1, "replicationFactor": 1}, default_spus=live)
    assert request.spus == (placement.SpuInfo(7),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "request must be an object, got []"),
        ({"partitions": 1, "replicationFactor": 1}, "request has no spus: list the SPUs as [{id, rack, online}]"),
        ({"spus": [], "replicationFactor": 1}, "request has no partitions"),
        ({"spus": [], "partitions": 1}, "request has no replicationFactor"),
        ({"spus": {}, "partitions": 1, "replicationFactor": 1}, "spus must be an array, got {}"),
        ({"spus": [{"id": "0"}], "partitions": 1, "replicationFactor": 1}, 'spus[0].id must be an integer of at least 0, got "0"'),
        ({"spus": [{"rack": "r"}], "partitions": 1, "replicationFactor": 1}, "spus[0] has no id"),
        ({"spus": [{"id": 0, "online": "yes"}], "partitions": 1, "replicationFactor": 1}, 'spus[0].online must be true or false, got "yes"'),
        ({"spus": [{"id": 0, "rack": ""}], "partitions": 1, "replicationFactor": 1}, 'spus[0].rack must be a non-empty string or null, got ""'),
        ({"spus": [{"id": 0, "zone": "a"}], "partitions": 1, "replicationFactor": 1}, "spus[0] has unknown field 'zone' (known: id, rack, online)"),
        ({"spus": [], "partitions": 0, "replicationFactor": 1}, "partitions must be an integer of at least 1, got 0"),
        ({"spus": [], "partitions": 2.5, "replicationFactor": 1}, "partitions must be an integer of at least 1, got 2.5"),
        ({"spus": [], "partitions": 1, "replicationFactor": True}, "replicationFactor must be an integer of at least 1, got true"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "startIndex": -1}, "startIndex must be an integer of at least 0, got -1"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "strategy": 3}, "strategy must be a string, got 3"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "ignoreRackAssignment": 1}, "ignoreRackAssignment must be true or false, got 1"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "policies": None, "replication_factor": 3}, "request has unknown field 'replication_factor' (known: spus, partitions, replicationFactor, strategy, startIndex, ignoreRackAssignment, policies, existing, replicaAssignment, currentReplicaMap, registeredSpuIds, plugin)"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "existing": [{"topic": "t", "partition": 0}]}, "existing[0] has no replicas"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "existing": [{"topic": "t", "partition": 0, "replicas": [1, None]}]}, "existing[0].replicas[1] must be an integer of at least 0, got null"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "currentReplicaMap": [[0], "1"]}, 'currentReplicaMap[1] must be an array, got "1"'),
        ({"spus": [], "replicaAssignment": [{"id": 0, "replica": [0]}]}, "replicaAssignment[0] has unknown field 'replica' (known: id, replicas)"),
    ],
)  # fmt: skip
def test_malformed_requests_name_the_field_and_value(body: object, message: str) -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.request_from_json(body)
    assert str(caught.value) == message


def test_manual_values_are_left_for_the_manual_checks() -> None:
    request = placement.request_from_json({"spus": [{"id": 0}], "replicaAssignment": [{"id": "x", "replicas": [0]}]})
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.compute(request)
    assert str(caught.value).startswith("invalid replica assignment: entry 0: partition id 'x' is not a non-negative integer")


def test_result_and_error_to_json() -> None:
    spus = [placement.SpuInfo(0), placement.SpuInfo(1)]
    result = placement.PlacementResult(replica_map=[[0, 1], [1, 0]], next_start_index=2)
    assert placement.result_to_json(result, spus) == {
        "replicaMap": [[0, 1], [1, 0]],
        "nextStartIndex": 2,
        "balance": {
            "replicas": {"perSpu": {"0": 2, "1": 2}, "min": 2, "max": 2, "spread": 0},
            "leaders": {"perSpu": {"0": 1, "1": 1}, "min": 1, "max": 1, "spread": 0},
            "rackReplicas": None,
            "rackLeaders": None,
            "rackViolations": {"count": 0, "partitions": []},
            "failover": {"perSpu": {"0": 1, "1": 1}, "max": 1, "worstSpu": 0},
        },
    }
    error = placement.InvalidConfig("bad thing")
    assert placement.error_to_json(error) == {"error": {"code": "InvalidConfig", "message": "bad thing"}}
