"""The JSON requests and answers of `sc placement compute|rebalance`, POST /v1/placement and /v1/cluster/rebalance."""

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
        ({"spus": [{"id": "0"}], "partitions": 1, "replicationFactor": 1}, 'spus[0].id must be an integer from 0 to 2147483647, got "0"'),
        ({"spus": [{"rack": "r"}], "partitions": 1, "replicationFactor": 1}, "spus[0] has no id"),
        ({"spus": [{"id": 0, "online": "yes"}], "partitions": 1, "replicationFactor": 1}, 'spus[0].online must be true or false, got "yes"'),
        ({"spus": [{"id": 0, "rack": ""}], "partitions": 1, "replicationFactor": 1}, 'spus[0].rack must be a non-empty string or null, got ""'),
        ({"spus": [{"id": 0, "zone": "a"}], "partitions": 1, "replicationFactor": 1}, "spus[0] has unknown field 'zone' (known: id, rack, online)"),
        ({"spus": [{"id": 0, "rack": "/dc1/r\n1"}], "partitions": 1, "replicationFactor": 1}, "spus[0].rack: rack '/dc1/r\\n1' holds the character '\\n' (U+000A, Cc): a rack may hold no control, format or line-separator character"),
        ({"spus": [], "partitions": 0, "replicationFactor": 1}, "partitions must be an integer of at least 1, got 0"),
        ({"spus": [], "partitions": 2.5, "replicationFactor": 1}, "partitions must be an integer of at least 1, got 2.5"),
        ({"spus": [], "partitions": 1, "replicationFactor": True}, "replicationFactor must be an integer of at least 1, got true"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "startIndex": -1}, "startIndex must be an integer from 0 to 9223372036854775807, got -1"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "strategy": 3}, "strategy must be a string, got 3"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "ignoreRackAssignment": 1}, "ignoreRackAssignment must be true or false, got 1"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "policies": None, "replication_factor": 3}, "request has unknown field 'replication_factor' (known: spus, partitions, replicationFactor, strategy, startIndex, ignoreRackAssignment, policies, existing, replicaAssignment, currentReplicaMap, registeredSpuIds, plugin)"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "existing": [{"topic": "t", "partition": 0}]}, "existing[0] has no replicas"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "existing": [{"topic": "t", "partition": 2**32, "replicas": [0]}]}, "existing[0].partition must be an integer from 0 to 4294967295, got 4294967296"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "existing": [{"topic": "t", "partition": 0, "replicas": [1, None]}]}, "existing[0].replicas[1] must be an integer from 0 to 2147483647, got null"),
        # SPU ids within the stored SPUs' range, the start index within the stored one's.
        ({"spus": [{"id": 2**31}], "partitions": 1, "replicationFactor": 1}, "spus[0].id must be an integer from 0 to 2147483647, got 2147483648"),
        ({"spus": [{"id": 2**63 - 1}], "partitions": 1, "replicationFactor": 1}, "spus[0].id must be an integer from 0 to 2147483647, got 9223372036854775807"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "startIndex": 10**19}, "startIndex must be an integer from 0 to 9223372036854775807, got 10000000000000000000"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "currentReplicaMap": [[0, 2**31]]}, "currentReplicaMap[0][1] must be an integer from 0 to 2147483647, got 2147483648"),
        ({"spus": [], "partitions": 1, "replicationFactor": 1, "registeredSpuIds": [2**40]}, "registeredSpuIds[0] must be an integer from 0 to 2147483647, got 1099511627776"),
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


# --------------------------------------------------------------------------- rebalance


def test_rebalance_request() -> None:
    request = placement.rebalance_request_from_json(
        {
            "spus": [{"id": 0, "rack": "a"}, {"id": 1, "rack": "b", "online": False}, {"id": 2, "decommissioning": True}],
            "partitions": [{"partition": "t-0", "replicas": [0, 1]}, {"partition": "t-1", "replicas": [2]}],
            "maxMovesPerSpu": 3,
        }
    )
    assert request == placement.RebalanceRequest(
        spus=(placement.SpuInfo(0, "a"), placement.SpuInfo(1, "b", online=False), placement.SpuInfo(2)),
        partitions=(placement.PartitionReplicas("t-0", (0, 1)), placement.PartitionReplicas("t-1", (2,))),
        decommissioning=(2,),
        max_moves_per_spu=3,
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "request must be an object, got []"),
        ({"partitions": []}, "request has no spus: list the SPUs as [{id, rack, online, decommissioning}]"),
        ({"spus": []}, 'request has no partitions: list them as [{"partition": "t-0", "replicas": [..]}]'),
        ({"spus": [], "partitions": [], "dryRun": True},
         "request has unknown field 'dryRun' (known: spus, partitions, maxMovesPerSpu)"),
        ({"spus": [{"id": 0, "decommissioning": "yes"}], "partitions": []},
         'spus[0].decommissioning must be true or false, got "yes"'),
        ({"spus": [{"id": 0, "zone": "a"}], "partitions": []},
         "spus[0] has unknown field 'zone' (known: id, rack, online, decommissioning)"),
        ({"spus": [], "partitions": [{"replicas": [0]}]}, "partitions[0] has no partition"),
        ({"spus": [], "partitions": [{"partition": 7, "replicas": [0]}]}, "partitions[0].partition must be a string, got 7"),
        ({"spus": [], "partitions": [{"partition": "t-0", "replicas": [0, -1]}]},
         "partitions[0].replicas[1] must be an integer from 0 to 2147483647, got -1"),
        ({"spus": [], "partitions": [], "maxMovesPerSpu": 0}, "maxMovesPerSpu must be an integer of at least 1, got 0"),
    ],
)  # fmt: skip
def test_malformed_rebalance_requests_name_the_field_and_value(body: object, message: str) -> None:
    with pytest.raises(placement.InvalidConfig) as caught:
        placement.rebalance_request_from_json(body)
    assert str(caught.value) == message


def test_plan_to_json_is_the_api_answer() -> None:
    request = placement.rebalance_request_from_json(
        {
            "spus": [{"id": 0}, {"id": 1}, {"id": 2}],
            "partitions": [{"partition": "t-0", "replicas": [0, 1]}, {"partition": "t-1", "replicas": [0, 1]}],
        }
    )
    # 4 replicas on 3 SPUs: SPU 0 keeps the ceiling (2; ties go to the lowest id), SPU 1 gives
    # one to SPU 2, and SPU 0 hands one of its two leaderships to SPU 1.
    assert placement.plan_to_json(placement.plan_rebalance(request)) == {
        "replicaMoves": 1,
        "lowerBound": 1,
        "leaderChanges": 1,
        "moves": [{"partition": "t-0", "from": [0, 1], "to": [0, 2]}, {"partition": "t-1", "from": [0, 1], "to": [1, 0]}],
        "before": {"replicasPerSpu": {"0": 2, "1": 2, "2": 0}, "leadersPerSpu": {"0": 2, "1": 0, "2": 0}},
        "after": {"replicasPerSpu": {"0": 2, "1": 1, "2": 1}, "leadersPerSpu": {"0": 1, "1": 1, "2": 0}},
        "targets": {"replicas": {"floor": 1, "ceiling": 2}, "leaders": {"floor": 0, "ceiling": 1}},
        "balanced": True,
        "unreachable": [],
        "notes": [],
    }
