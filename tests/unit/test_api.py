"""The public HTTP API against a real server on 127.0.0.1: every route, every error code with its exact
message, the watch stream (JSON lines and WebSocket), the OpenAPI document, and fuzzing that bad
input never reaches a 500. Tests play the controllers by writing statuses to the KV store.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import io
import json
import pathlib
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from hypothesis import HealthCheck, given, settings, strategies as st

from connection_manager import transport
from controller import config, placement
from controller.api import admin_ops, json_input, routes as api
from controller.reconcile import topic as topic_controller, topic_size
from store import active_sc, kv, memory, models
from tests import builders
from tests.unit import api_server
from tests.builders import partition, topic
from tests.unit.api_server import server, spu  # noqa: F401 (server is a fixture)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECRET_TOKEN = b"QzX9tokenWm4Lp7Vb2Ns"
SPU_BODY: dict[str, Any] = {
    "name": "s1",
    "spec": {"id": 1, "publicEndpoint": {"host": "h1", "port": 9005}, "privateEndpoint": {"host": "h1", "port": 9006}},
}


def error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


# ---------------------------------------------------------------------------- health, metrics, openapi


async def test_healthz_and_reads_are_503_until_the_store_is_synced() -> None:
    server = api_server.ApiServer()
    await server.start(sync=False)
    try:
        assert await server.call("GET", "/healthz") == (
            503,
            {
                "status": "starting",
                "reason": "the SC is still loading its store (not synced yet: spus, spu-groups, topics, partitions, meta)",
            },
        )
        assert await server.call("GET", "/v1/topics") == (
            503,
            error("NotSynced", "the SC is still loading its store; retry shortly (see /healthz)"),
        )
        await server.sync()
        assert await server.call("GET", "/healthz") == (200, {"status": "ok"})
        assert await server.call("GET", "/v1/topics") == (200, [])
    finally:
        await server.stop()


async def test_metrics_are_prometheus_text_with_the_object_gauges(server: api_server.ApiServer) -> None:
    await server.put(topic("a"), spu(0))
    assert server.session is not None
    async with server.session.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = await response.text()
    assert 'sc_objects{kind="topics",resolution="Init"} 1.0' in text
    assert 'sc_objects{kind="spus",resolution="Online"} 1.0' in text
    assert "sc_store_synced 1.0" in text


async def test_openapi_document_equals_the_repo_copy_and_documents_exactly_the_app_routes(
    server: api_server.ApiServer,
) -> None:
    status, served = await server.call("GET", "/openapi.json")
    assert status == 200
    assert served == json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert served["openapi"] == "3.1.0"
    routes = {
        (route.resource.canonical, route.method.lower())  # type: ignore[union-attr]  # every route of the app has its resource
        for route in server.app.router.routes()
        if route.method != "HEAD"
    }
    documented = {(path, method) for path, operations in served["paths"].items() for method in operations}
    assert documented == routes
    # Every $ref points at a schema that exists.
    refs = set()

    def collect(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].removeprefix("#/components/schemas/"))
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(served)
    assert refs <= set(served["components"]["schemas"])


# ---------------------------------------------------------------------------- reads


async def test_lists_are_sorted_and_partitions_filter_by_topic(server: api_server.ApiServer) -> None:
    await server.put(
        spu(10, "b"),
        spu(2, "a"),
        topic("zeta"),
        topic("alpha"),
        partition("alpha-10", [2]),
        partition("alpha-2", [2, 10]),
        partition("al-1", [2]),
    )
    status, spus = await server.call("GET", "/v1/spus")
    assert status == 200
    assert spus == [spu(2, "a").to_json_dict(), spu(10, "b").to_json_dict()]
    assert [obj["name"] for obj in (await server.call("GET", "/v1/topics"))[1]] == ["alpha", "zeta"]
    assert [obj["name"] for obj in (await server.call("GET", "/v1/partitions"))[1]] == ["al-1", "alpha-2", "alpha-10"]
    assert [obj["name"] for obj in (await server.call("GET", "/v1/partitions?topic=alpha"))[1]] == [
        "alpha-2",
        "alpha-10",
    ]
    assert await server.call("GET", "/v1/partitions?topic=nothing") == (200, [])
    assert await server.call("GET", "/v1/spu-groups") == (200, [])


async def test_list_errors(server: api_server.ApiServer) -> None:
    assert await server.call("GET", "/v1/brokers") == (
        404,
        error("NotFound", "unknown kind 'brokers': use one of spus, spu-groups, topics, partitions"),
    )
    assert await server.call("GET", "/v1/topics?topic=x") == (
        422,
        error("InvalidRequest", "query parameter topic filters partitions only, not topics"),
    )


@pytest.mark.parametrize("route", ["/v1/partitions", "/v1/watch/partitions"])
@pytest.mark.parametrize(
    ("topic_name", "reason"),
    [
        ("", "name '' is invalid: use only lowercase letters, digits and '-', and do not start or end with '-'"),
        ("Bad", "name 'Bad' is invalid: use only lowercase letters, digits and '-', and do not start or end with '-'"),
        ("t" * 64, f"name '{'t' * 64}' is 64 characters long; at most 63 are allowed"),
    ],
)
async def test_a_topic_filter_that_is_no_topic_name_is_400(
    server: api_server.ApiServer, route: str, topic_name: str, reason: str
) -> None:
    """Found by the fuzzer: the document says the filter is a topic name; an empty one listed nothing."""
    assert await server.call("GET", f"{route}?topic={topic_name}") == (
        400, error("MalformedRequest", f"query parameter topic must be a topic name: {reason}")
    )


async def test_get_one_object_or_404(server: api_server.ApiServer) -> None:
    await server.put(topic("alpha", 3, 2), partition("alpha-0", [1, 2]))
    assert await server.call("GET", "/v1/topics/alpha") == (200, topic("alpha", 3, 2).to_json_dict())
    assert await server.call("GET", "/v1/partitions/alpha-0") == (200, partition("alpha-0", [1, 2]).to_json_dict())
    assert await server.call("GET", "/v1/topics/nope") == (404, error("NotFound", "topic 'nope' not found"))
    assert await server.call("GET", "/v1/spu-groups/nope") == (404, error("NotFound", "SPU group 'nope' not found"))
    assert await server.call("GET", "/v1/brokers/x") == (
        404,
        error("NotFound", "unknown kind 'brokers': use one of spus, spu-groups, topics, partitions"),
    )


# ---------------------------------------------------------------------------- SPUs


async def test_register_spu_writes_the_spec_with_the_default_status(server: api_server.ApiServer) -> None:
    expected = {
        "name": "s1",
        "spec": {
            "id": 1,
            "spuType": "Custom",
            "publicEndpoint": {"host": "h1", "port": 9005},
            "privateEndpoint": {"host": "h1", "port": 9006},
        },
        "status": {"resolution": "Init"},
    }
    assert await server.call("POST", "/v1/spus", SPU_BODY) == (201, expected)
    stored = await server.read("spus", "s1")
    assert stored is not None and stored.to_json_dict() == expected


async def test_register_spu_conflicts_name_the_other_spu(server: api_server.ApiServer) -> None:
    await server.put(spu(1, "s1"), spu(7, "other"))
    assert await server.call("POST", "/v1/spus", SPU_BODY) == (409, error("AlreadyExists", "SPU 's1' already exists"))
    body = {**SPU_BODY, "name": "s2", "spec": {**SPU_BODY["spec"], "id": 7}}
    assert await server.call("POST", "/v1/spus", body) == (
        409,
        error("SpuIdInUse", "SPU id 7 is already used by SPU 'other'; choose another id"),
    )
    assert await server.read("spus", "s2") is None


async def test_register_spu_refuses_a_name_an_spu_group_manages(server: api_server.ApiServer) -> None:
    group = models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 2, "minId": 100}})
    await server.put(group)
    body = {**SPU_BODY, "name": "g-1"}
    assert await server.call("POST", "/v1/spus", body) == (
        409,
        error(
            "AlreadyExists",
            "SPU name 'g-1' belongs to SPU group 'g' (its managed SPUs are named g-N); choose another name",
        ),
    )
    assert (await server.call("POST", "/v1/spus", {**SPU_BODY, "name": "g-2"}))[0] == 201  # beyond its replicas


@pytest.mark.parametrize(
    ("spec_change", "status", "expected"),
    [
        (
            {"spuType": "Managed"},
            422,
            error(
                "InvalidObject",
                "spec.spuType: only Custom SPUs can be registered; Managed SPUs are created by SPU groups (got 'Managed')",
            ),
        ),
        ({"id": "1"}, 400, error("MalformedRequest", "spec.id: Input should be a valid integer (got '1')")),
        (
            {"publicEndpoint": {"host": "h", "port": 70000}},
            422,
            error(
                "InvalidObject",
                "spec.publicEndpoint.port: Input should be less than or equal to 65535 (got 70000)",
            ),
        ),
        ({"rack": 5}, 400, error("MalformedRequest", "spec.rack: Input should be a valid string (got 5)")),
        ({"color": "red"}, 422, error("InvalidObject", "spec.color: unknown field (value 'red')")),
    ],
)
async def test_register_spu_rejects_bad_specs(
    server: api_server.ApiServer, spec_change: dict[str, Any], status: int, expected: dict[str, Any]
) -> None:
    body = {"name": "s1", "spec": {**SPU_BODY["spec"], **spec_change}}
    assert await server.call("POST", "/v1/spus", body) == (status, expected)
    assert await server.read("spus", "s1") is None


async def test_users_write_specs_only(server: api_server.ApiServer) -> None:
    body = {**SPU_BODY, "status": {"resolution": "Online"}}
    assert await server.call("POST", "/v1/spus", body) == (
        422,
        error("InvalidObject", "status: is written by the SC, not by users; send only name and spec"),
    )
    assert await server.call("POST", "/v1/topics", {"name": "t"}) == (422, error("InvalidObject", "spec: field required"))
    assert await server.call("POST", "/v1/topics", {"name": "Bad_Name", "spec": {"partitions": 1, "replicationFactor": 1}}) == (
        422,
        error(
            "InvalidObject",
            "name: name 'Bad_Name' is invalid: use only lowercase letters, digits and '-', and do not start or end "
            "with '-' (got 'Bad_Name')",
        ),
    )


@pytest.mark.parametrize("path", ["/v1/spus", "/v1/spu-groups", "/v1/topics"])
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", 'the request body is empty: send a JSON object {"name": ..., "spec": {...}}'),
        (b"  \n", 'the request body is empty: send a JSON object {"name": ..., "spec": {...}}'),
        (b"{", "the request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (b"[1]", 'the request body must be a JSON object {"name": ..., "spec": {...}}, got an array'),
        (b'"x"', 'the request body must be a JSON object {"name": ..., "spec": {...}}, got a string'),
        (b"\xff\xfe\x00", "the request body is not valid JSON: 'utf-16-le' codec can't decode byte 0x00 in position 2: truncated data"),
        (b"[" * 50_000, "the request body is nested too deeply"),
    ],
)
async def test_malformed_bodies_are_400(server: api_server.ApiServer, path: str, raw: bytes, message: str) -> None:
    assert await server.call("POST", path, raw=raw) == (400, error("MalformedRequest", message))


# ---------------------------------------------------------------------------- SPU groups


GROUP_BODY = {"name": "g", "spec": {"replicas": 3, "minId": 10, "rack": "r1"}}


async def test_spu_group_create_waits_for_reserved(server: api_server.ApiServer) -> None:
    deciding = server.decide_later("spu-groups", "g", {"resolution": "Reserved"})
    status, body = await server.call("POST", "/v1/spu-groups", GROUP_BODY)
    await deciding
    assert (status, body["status"]) == (201, {"resolution": "Reserved", "reason": ""})
    stored = await server.read("spu-groups", "g")
    assert stored is not None and stored.to_json_dict() == body


async def test_spu_group_invalid_is_422_and_kept(server: api_server.ApiServer) -> None:
    reason = "id range 10..12 collides: SPU id 11 is already used by SPU spu-11"
    deciding = server.decide_later("spu-groups", "g", {"resolution": "Invalid", "reason": reason})
    status, body = await server.call("POST", "/v1/spu-groups", GROUP_BODY)
    await deciding
    stored = await server.read("spu-groups", "g")
    assert stored is not None and stored.status.resolution is models.SpuGroupResolution.INVALID
    assert (status, body) == (
        422,
        {
            **error(
                "SpuGroupInvalid",
                f"SPU group 'g' is Invalid: {reason}; it is kept, and reserves its range by itself once nothing collides: unregister the SPUs named, or delete the group and create it with another minId",
            ),
            "object": stored.to_json_dict(),
        },
    )


async def test_spu_group_without_a_verdict_is_202_and_409_when_it_exists(server: api_server.ApiServer) -> None:
    status, body = await server.call("POST", "/v1/spu-groups?timeout=0", GROUP_BODY)
    assert (status, body["status"]) == (202, {"resolution": "Init", "reason": ""})
    assert await server.call("POST", "/v1/spu-groups", GROUP_BODY) == (
        409,
        error("AlreadyExists", "SPU group 'g' already exists"),
    )
    bad = {"name": "h", "spec": {"replicas": 2, "minId": 2**31 - 1}}
    assert await server.call("POST", "/v1/spu-groups", bad) == (
        422,
        error(
            "InvalidObject",
            f"spec: minId {2**31 - 1} with 2 replicas would need id {2**31}, above the largest SPU id {2**31 - 1} "
            f"(got {{'replicas': 2, 'minId': {2**31 - 1}}})",
        ),
    )


async def test_scale_spu_group_sets_the_replica_count_and_keeps_the_status(server: api_server.ApiServer) -> None:
    group = models.SpuGroup.model_validate(
        {"name": "g", "spec": {"replicas": 2, "minId": 10}, "status": {"resolution": "Reserved"}}
    )
    await server.put(group)
    status, body = await server.call("POST", "/v1/spu-groups/g/scale", {"replicas": 4})
    stored = await server.read("spu-groups", "g")
    assert stored is not None and (status, body) == (202, {**stored.to_json_dict(), "warnings": []})
    assert (stored.spec.replicas, stored.spec.min_id, stored.status) == (4, 10, group.status)


async def test_scaling_a_group_down_or_deleting_it_names_the_spus_it_deletes_that_hold_replicas(
    server: api_server.ApiServer,
) -> None:
    """As explicit as deleting one SPU: the group is changed, and the answer warns of each SPU it
    will delete that partitions still use."""
    group = models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 3, "minId": 10}, "status": {"resolution": "Reserved"}})
    managed = [spu(10 + index, f"g-{index}", spu_type="Managed") for index in range(3)]
    await server.put(group, *managed, partition("t-0", [10, 12]), partition("t-1", [12, 11]), partition("u-0", [11]), partition("t-10", [12]))
    status, body = await server.call("POST", "/v1/spu-groups/g/scale", {"replicas": 1})
    stored = await server.read("spu-groups", "g")
    assert stored is not None and stored.spec.replicas == 1
    assert (status, body) == (
        202,
        {
            **stored.to_json_dict(),
            "warnings": [
                "scaling SPU group 'g' down to 1 deletes SPU 11 ('g-1'), which still holds replicas of 2 partitions: "
                "t-1, u-0; they stay assigned to id 11 until an SPU with that id is registered again or a rebalance moves them",
                "scaling SPU group 'g' down to 1 deletes SPU 12 ('g-2'), which still holds replicas of 3 partitions: "
                "t-0, t-1, t-10; they stay assigned to id 12 until an SPU with that id is registered again or a rebalance moves them",
            ],
        },
    )
    # Up again: nothing is deleted, nothing to say.
    status, body = await server.call("POST", "/v1/spu-groups/g/scale", {"replicas": 3})
    assert (status, body["warnings"]) == (202, [])
    status, body = await server.call("DELETE", "/v1/spu-groups/g")
    assert (status, body["warnings"]) == (
        200,
        [
            "deleting SPU group 'g' deletes SPU 10 ('g-0'), which still holds replicas of 1 partition: t-0; they stay "
            "assigned to id 10 until an SPU with that id is registered again or a rebalance moves them",
            "deleting SPU group 'g' deletes SPU 11 ('g-1'), which still holds replicas of 2 partitions: t-1, u-0; they "
            "stay assigned to id 11 until an SPU with that id is registered again or a rebalance moves them",
            "deleting SPU group 'g' deletes SPU 12 ('g-2'), which still holds replicas of 3 partitions: t-0, t-1, t-10; "
            "they stay assigned to id 12 until an SPU with that id is registered again or a rebalance moves them",
        ],
    )


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"replicas": -1}, 422, error("InvalidRequest", "replicas: Input should be greater than or equal to 0 (got -1)")),
        ({"replicas": 10_001}, 422, error("InvalidRequest", "replicas: Input should be less than or equal to 10000 (got 10001)")),
        ({"replicas": "2"}, 400, error("MalformedRequest", "replicas: must be a whole number (got '2')")),
        ({}, 422, error("InvalidRequest", "replicas: field required (the number of SPUs the group should have)")),
    ],
)
async def test_scale_spu_group_errors(
    server: api_server.ApiServer, body: Any, status: int, expected: dict[str, Any]
) -> None:
    group = models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 2, "minId": 10}})
    await server.put(group)
    assert await server.call("POST", "/v1/spu-groups/g/scale", body) == (status, expected)
    assert await server.read("spu-groups", "g") == group
    assert await server.call("POST", "/v1/spu-groups/nope/scale", {"replicas": 1}) == (
        404,
        error("NotFound", "SPU group 'nope' not found"),
    )


# ---------------------------------------------------------------------------- topics


TOPIC_BODY = {"name": "orders", "spec": {"partitions": 3, "replicationFactor": 2}}
REPLICA_MAP = {"0": [0, 1], "1": [1, 2], "2": [2, 0]}


async def test_topic_create_waits_until_provisioned(server: api_server.ApiServer) -> None:
    deciding = server.decide_later("topics", "orders", {"resolution": "Provisioned", "replicaMap": REPLICA_MAP})
    status, body = await server.call("POST", "/v1/topics", TOPIC_BODY)
    await deciding
    assert (status, body) == (
        201,
        {
            "name": "orders",
            "spec": {"partitions": 3, "replicationFactor": 2, "ignoreRackAssignment": False},
            "status": {"resolution": "Provisioned", "replicaMap": REPLICA_MAP, "reason": ""},
        },
    )


async def test_topic_create_with_timeout_0_answers_at_once_with_the_default_status(server: api_server.ApiServer) -> None:
    status, body = await server.call("POST", "/v1/topics?timeout=0", TOPIC_BODY)
    written = {
        "name": "orders",
        "spec": {"partitions": 3, "replicationFactor": 2, "ignoreRackAssignment": False},
        "status": {"resolution": "Init", "replicaMap": {}, "reason": ""},
    }
    assert (status, body) == (202, written)
    stored = await server.read("topics", "orders")
    assert stored is not None and stored.to_json_dict() == written
    assert await server.call("POST", "/v1/topics", TOPIC_BODY) == (
        409,
        error("AlreadyExists", "topic 'orders' already exists"),
    )


async def test_topic_create_timeout_and_pending_states_are_202(server: api_server.ApiServer) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, body = await server.call("POST", "/v1/topics?timeout=50", TOPIC_BODY)
    assert (status, body["status"]["resolution"]) == (202, "Init")
    # It waited its 50 ms, and not the default 30 s (a generous ceiling: the machine may be busy).
    assert 0.05 <= loop.time() - started < 10
    # Pending is not a verdict: the request keeps waiting through it.
    reason = "replication factor 2 needs 2 online SPUs, none is online: 2 more needed"
    deciding = server.decide_later("topics", "second", {"resolution": "InsufficientResources", "reason": reason})
    status, body = await server.call("POST", "/v1/topics", {**TOPIC_BODY, "name": "second"})
    await deciding
    assert (status, body["status"]) == (202, {"resolution": "InsufficientResources", "replicaMap": {}, "reason": reason})


async def test_topic_invalid_config_from_the_controller_is_422_and_kept(server: api_server.ApiServer) -> None:
    # The controller's reason says what to do (here: nothing but wait); the API adds no advice of its own.
    reason = (
        "rack-aware placement needs a rack on every online SPU, but SPU 2 has none; "
        "the topic stays and is placed by itself once the SPUs allow it"
    )
    deciding = server.decide_later("topics", "orders", {"resolution": "InvalidConfig", "reason": reason})
    status, body = await server.call("POST", "/v1/topics", TOPIC_BODY)
    await deciding
    stored = await server.read("topics", "orders")
    assert stored is not None
    assert (status, body) == (
        422,
        {
            **error(
                "InvalidConfig",
                f"topic 'orders' is InvalidConfig: {reason}",
            ),
            "object": stored.to_json_dict(),
        },
    )


async def test_topic_invalid_config_is_refused_before_writing(server: api_server.ApiServer) -> None:
    await server.put(spu(0), spu(1))
    body = {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 9]}]}}
    expected = topic_controller.validate(
        models.Topic.model_validate(body), topic_controller.spu_infos(server.context.local_store.snapshot())
    )
    assert expected is not None and "9" in expected.message
    assert await server.call("POST", "/v1/topics", body) == (422, error("InvalidConfig", expected.message))
    assert await server.read("topics", "manual") is None


async def test_manual_partition_ids_out_of_order_are_refused_before_writing(server: api_server.ApiServer) -> None:
    await server.put(spu(0), spu(1))
    body = {"name": "manual", "spec": {"replicaAssignment": [{"id": 1, "replicas": [0]}, {"id": 0, "replicas": [1]}]}}
    assert await server.call("POST", "/v1/topics", body) == (
        422,
        error(
            "InvalidConfig",
            "invalid replica assignment: assigned partition ids must be in sequence and without gaps: "
            "1, 0 are out of order (ids given: 1, 0)",
        ),
    )
    assert await server.read("topics", "manual") is None


async def test_a_manual_row_longer_than_the_largest_replication_factor_is_refused(server: api_server.ApiServer) -> None:
    await server.put(*(spu(index) for index in range(130)))
    rule = "at most 128 are allowed (the largest replication factor)"
    body = {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": list(range(129))}]}}
    status, answer = await server.call("POST", "/v1/topics", body)
    assert (status, answer["error"]["message"].split(" (got ")[0]) == (
        422,
        f"spec.replicaAssignment: partition 0 lists 129 replicas; {rule}",
    ), answer
    assert await server.read("topics", "manual") is None
    # The placement dry run has no topic model in front of its manual check.
    placement_body = {"replicaAssignment": [{"id": 0, "replicas": list(range(129))}]}
    assert await server.call("POST", "/v1/placement", placement_body) == (
        422,
        error("InvalidConfig", f"invalid replica assignment: partition 0: replicas lists 129 SPUs; {rule}"),
    )


async def test_a_manual_topic_has_at_most_the_partitions_a_computed_one_may_have(server: api_server.ApiServer) -> None:
    """A computed topic stops at 100,000 partitions; a manual one, and the placement dry run's
    manual rows, were bounded only by the body's size."""
    await server.put(spu(0))
    rows = [{"id": index, "replicas": [0]} for index in range(models.MAX_PARTITIONS + 1)]
    body = {"name": "manual", "spec": {"replicaAssignment": rows}}
    # On etcd's default request limit such a body is refused unparsed (2.8 MB besides whitespace);
    # on a store of 8 MiB requests it is parsed, and the model refuses it.
    status, answer = await server.call("POST", "/v1/topics", raw=json.dumps(body).encode())
    assert (status, answer["error"]["code"]) == (413, "RequestTooLarge"), answer
    large_requests = api_server.ApiServer(memory.MemoryStore(max_request_bytes=8 * 1024 * 1024))
    await large_requests.start()
    try:
        status, answer = await large_requests.call("POST", "/v1/topics", raw=json.dumps(body).encode())
        assert (status, answer["error"]["message"].split(" (got ")[0]) == (
            422,
            "spec.replicaAssignment: List should have at most 100000 items after validation, not 100001",
        ), answer
        assert await large_requests.read("topics", "manual") is None
    finally:
        await large_requests.stop()
    assert await server.call("POST", "/v1/placement", raw=json.dumps({"replicaAssignment": rows}).encode()) == (
        422,
        error(
            "InvalidConfig",
            "replicaAssignment lists 100001 partitions, above the limit of 100000 partitions a topic may have",
        ),
    )
    status, answer = await server.call("POST", "/v1/placement", raw=json.dumps({"replicaAssignment": rows[:-1]}).encode())
    assert status == 200 and len(answer["replicaMap"]) == models.MAX_PARTITIONS, status


async def test_a_manual_partition_id_past_32_bits_is_refused_with_the_limit(server: api_server.ApiServer) -> None:
    """Fluvio's partition ids are u32: a larger one was refused only as a gap in the sequence over
    HTTP, and a stored one kept its topic out of every Fluvio List."""
    await server.put(spu(0))
    body = {"name": "manual", "spec": {"replicaAssignment": [{"id": 2**32, "replicas": [0]}]}}
    status, answer = await server.call("POST", "/v1/topics", body)
    assert (status, answer["error"]["message"]) == (
        422,
        "spec.replicaAssignment.0.id: Input should be less than or equal to 4294967295 (got 4294967296)",
    )
    assert await server.read("topics", "manual") is None


async def test_topic_deleted_while_waiting_is_409(server: api_server.ApiServer) -> None:
    async def delete_when_written() -> None:
        while (stored := await server.kv_store.get("topics/orders")) is None:
            await asyncio.sleep(0.001)
        await server.kv_store.delete("topics/orders", stored.mod_revision)

    deleting = asyncio.create_task(delete_when_written())
    assert await server.call("POST", "/v1/topics", TOPIC_BODY) == (
        409,
        error("Conflict", "topic 'orders' was deleted while waiting for it"),
    )
    await deleting


@pytest.mark.parametrize(
    ("query", "status", "expected"),
    [
        ("timeout=abc", 400, error("MalformedRequest", "query parameter timeout must be a whole number, got 'abc'")),
        ("timeout=-1", 400, error("MalformedRequest", "query parameter timeout must be a whole number, got '-1'")),
        ("timeout=600001", 400, error("MalformedRequest", "query parameter timeout is at most 600000, got 600001")),
        ("timeout=" + "9" * 5000, 400, error("MalformedRequest", "query parameter timeout is at most 600000, got 99999999999999999999... (5000 characters)")),
        ("timeout=" + "0" * 5000 + "30000", 201, None),  # leading zeros are the same number
        ("timeout=%C2%B2", 400, error("MalformedRequest", "query parameter timeout must be a whole number, got '\\xb2'")),
        ("dryRun=maybe", 400, error("MalformedRequest", "query parameter dryRun must be true or false, got 'maybe'")),
    ],
)
async def test_topic_create_query_errors(
    server: api_server.ApiServer, query: str, status: int, expected: dict[str, Any] | None
) -> None:
    if expected is None:  # accepted: the controller's verdict comes within the timeout
        await server.put(spu(0), spu(1))
        deciding = server.decide_later("topics", "orders", {"resolution": "Provisioned", "replicaMap": REPLICA_MAP})
        answer = await server.call("POST", f"/v1/topics?{query}", TOPIC_BODY)
        await deciding
        assert answer[0] == status, answer
        return
    assert await server.call("POST", f"/v1/topics?{query}", TOPIC_BODY) == (status, expected)
    assert await server.read("topics", "orders") is None


@pytest.mark.parametrize("path", ["/v1/topics?timeout=0", "/v1/topics?dryRun=true", "/v1/placement"])
@pytest.mark.parametrize("spu_id", ["²", "9" * 5000])
async def test_a_preferred_spu_that_is_no_id_is_422_not_500(server: api_server.ApiServer, path: str, spu_id: str) -> None:
    await server.put(spu(0))
    policies = f"preferred_nodes={spu_id}"
    sizes = {"partitions": 1, "replicationFactor": 1}
    spec = {**sizes, "placement": {"strategy": "policies", "policies": policies}}
    body = {"name": "t", "spec": spec} if path.startswith("/v1/topics") else {**sizes, "strategy": "policies", "policies": policies}
    status, answer = await server.call("POST", path, body)
    assert (status, answer["error"]["code"]) == (422, "InvalidConfig"), answer
    assert answer["error"]["message"].endswith(" is not an SPU id")


@pytest.mark.parametrize("path", ["/v1/topics?timeout=0", "/v1/topics?dryRun=true", "/v1/placement"])
async def test_policies_longer_than_the_limit_are_refused_naming_it(server: api_server.ApiServer, path: str) -> None:
    """Valid policies repeated until they are megabytes long were stored as they were sent and
    parsed again at every placement of the topic: policies are a few settings, bounded."""
    await server.put(spu(0))
    policies = "node=balanced;" * (models.MAX_POLICIES_LENGTH // 14 + 1)
    sizes = {"partitions": 1, "replicationFactor": 1}
    spec = {**sizes, "placement": {"strategy": "policies", "policies": policies}}
    body = {"name": "t", "spec": spec} if path.startswith("/v1/topics") else {**sizes, "strategy": "policies", "policies": policies}
    status, answer = await server.call("POST", path, body)
    assert status == 422, answer
    message = answer["error"]["message"]
    assert f"{len(policies)} characters" in message and f"at most {models.MAX_POLICIES_LENGTH}" in message, message
    assert len(message) < 400
    assert await server.read("topics", "t") is None


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        (
            "/v1/topics",
            b'{"name": "t", "spec": {"partitions": ' + b"9" * 5000 + b', "replicationFactor": 1}}',
            "the request body holds a number of 5000 digits at spec.partitions (999999999999...): no value here has more than 20 digits",
        ),
        (
            "/v1/spus",
            b'{"name": "s", "spec": {"id": -' + b"1" * 30 + b"}}",
            "the request body holds a number of 30 digits at spec.id (-11111111111...): no value here has more than 20 digits",
        ),
        (
            "/v1/topics/orders/partitions",
            b'{"count": ' + b"7" * 4301 + b"}",
            "the request body holds a number of 4301 digits at count (777777777777...): no value here has more than 20 digits",
        ),
        (
            "/v1/placement",
            b'{"partitions": 1, "replicationFactor": 1, "spus": [{"id": 0}, {"id": ' + b"5" * 9000 + b"}]}",
            "the request body holds a number of 9000 digits at spus[1].id (555555555555...): no value here has more than 20 digits",
        ),
    ],
)
async def test_a_json_number_too_long_for_any_field_is_400_naming_where(
    server: api_server.ApiServer, path: str, body: bytes, expected: str
) -> None:
    await server.put(topic("orders"))
    assert await server.call("POST", path, raw=body) == (400, error("MalformedRequest", expected))


async def test_dry_run_answers_the_placement_and_writes_nothing(server: api_server.ApiServer) -> None:
    await server.put(spu(0), spu(1), spu(2), spu(3, resolution="Offline"))
    revision = await server.kv_store.revision()
    status, body = await server.call("POST", "/v1/topics?dryRun=true", TOPIC_BODY)
    assert status == 200
    assert (body["replicaMap"], body["nextStartIndex"]) == ([[0, 1], [1, 2], [2, 0]], 3)
    assert "balance" in body
    assert await server.kv_store.revision() == revision


async def test_dry_run_errors(server: api_server.ApiServer) -> None:
    await server.put(spu(0))
    status, body = await server.call("POST", "/v1/topics?dryRun=true", TOPIC_BODY)
    assert (status, body["error"]["code"]) == (422, "InsufficientResources")
    assert body["error"]["message"].startswith("replication factor 2 needs 2 online SPUs")
    manual = {"name": "m", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0, 0]}]}}
    status, body = await server.call("POST", "/v1/topics?dryRun=1", manual)
    assert (status, body["error"]["code"]) == (422, "InvalidConfig")
    await server.put(topic("orders"))
    assert await server.call("POST", "/v1/topics?dryRun=true", TOPIC_BODY) == (
        409,
        error("AlreadyExists", "topic 'orders' already exists"),
    )


# ---------------------------------------------------------------------------- add partitions


async def test_add_partitions_grows_the_spec_and_waits_for_the_new_map(server: api_server.ApiServer) -> None:
    provisioned = topic("orders", 3, 2, resolution="Provisioned", replica_map=REPLICA_MAP)
    await server.put(provisioned)
    grown_map = {**REPLICA_MAP, "3": [0, 2], "4": [1, 0]}
    grown = provisioned.model_copy(update={"spec": provisioned.spec.model_copy(update={"partitions": 5})})
    deciding = server.decide_later("topics", "orders", {"resolution": "Provisioned", "replicaMap": grown_map}, after=provisioned)
    status, body = await server.call("POST", "/v1/topics/orders/partitions", {"count": 2})
    await deciding
    assert (status, body["spec"]["partitions"], body["status"]["replicaMap"]) == (200, 5, grown_map)
    stored = await server.read("topics", "orders")
    assert stored is not None and stored.spec == grown.spec


async def test_add_partitions_with_timeout_0_keeps_the_status_it_had(server: api_server.ApiServer) -> None:
    provisioned = topic("orders", 3, 2, resolution="Provisioned", replica_map=REPLICA_MAP)
    await server.put(provisioned)
    status, body = await server.call("POST", "/v1/topics/orders/partitions?timeout=0", {"count": 1})
    assert (status, body["spec"]["partitions"], body["status"]) == (
        202,
        4,
        {"resolution": "Provisioned", "replicaMap": REPLICA_MAP, "reason": ""},
    )


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"count": 0}, 422, error("InvalidRequest", "count: the number of partitions to add must be at least 1 (got 0)")),
        ({"count": -3}, 422, error("InvalidRequest", "count: the number of partitions to add must be at least 1 (got -3)")),
        ({"count": "2"}, 400, error("MalformedRequest", "count: must be a whole number (got '2')")),
        ({"count": True}, 400, error("MalformedRequest", "count: must be a whole number (got True)")),
        ({"count": 1.5}, 400, error("MalformedRequest", "count: must be a whole number (got 1.5)")),
        ({}, 422, error("InvalidRequest", "count: field required (the number of partitions to add)")),
        ({"count": 1, "total": 4}, 422, error("InvalidRequest", 'total: unknown field (the body is {"count": N})')),
        (
            {"count": models.MAX_PARTITIONS},
            422,
            error(
                "InvalidRequest",
                f"count: topic 'orders' has 3 partitions; adding {models.MAX_PARTITIONS} would make "
                f"{models.MAX_PARTITIONS + 3}, above the limit of {models.MAX_PARTITIONS}",
            ),
        ),
        ([2], 400, error("MalformedRequest", 'the request body must be a JSON object {"count": N}, got an array')),
    ],
)
async def test_add_partitions_rejects_bad_counts(
    server: api_server.ApiServer, body: Any, status: int, expected: dict[str, Any]
) -> None:
    original = topic("orders", 3, 2)
    await server.put(original)
    assert await server.call("POST", "/v1/topics/orders/partitions", body) == (status, expected)
    assert await server.read("topics", "orders") == original


async def test_add_partitions_to_a_missing_or_manual_topic(server: api_server.ApiServer) -> None:
    assert await server.call("POST", "/v1/topics/nope/partitions", {"count": 1}) == (
        404,
        error("NotFound", "topic 'nope' not found"),
    )
    manual = models.Topic.model_validate({"name": "m", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0]}]}})
    await server.put(manual)
    assert await server.call("POST", "/v1/topics/m/partitions", {"count": 1}) == (
        422,
        error("ManualTopic", "topic 'm' has a manual replicaAssignment: partitions cannot be added to it"),
    )


class ConflictingStore(memory.MemoryStore):
    """Loses the next ``conflicts`` compare-and-swaps, as if a controller had written first."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0

    def _maybe_conflict(self, key: str) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise kv.Conflict(key, 1, 2)

    async def update(self, key: str, value: bytes, mod_revision: int) -> int:
        self._maybe_conflict(key)
        return await super().update(key, value, mod_revision)

    async def delete(self, key: str, mod_revision: int | None = None) -> int:
        self._maybe_conflict(key)
        return await super().delete(key, mod_revision)


@pytest.fixture
async def conflicting() -> AsyncIterator[tuple[api_server.ApiServer, ConflictingStore]]:
    store = ConflictingStore()
    running = api_server.ApiServer(store)
    await running.start()
    yield running, store
    await running.stop()


async def test_writes_retry_a_lost_compare_and_swap_then_give_up_with_409(
    conflicting: tuple[api_server.ApiServer, ConflictingStore],
) -> None:
    server, store = conflicting
    await server.put(topic("orders", 3, 2), topic("other"))
    store.conflicts = api.CAS_ATTEMPTS - 1
    status, body = await server.call("POST", "/v1/topics/orders/partitions?timeout=0", {"count": 1})
    assert (status, body["spec"]["partitions"]) == (202, 4)
    store.conflicts = api.CAS_ATTEMPTS
    assert await server.call("POST", "/v1/topics/orders/partitions?timeout=0", {"count": 1}) == (
        409,
        error("Conflict", "topic 'orders' kept changing while adding partitions (5 attempts); retry"),
    )
    store.conflicts = api.CAS_ATTEMPTS
    assert await server.call("DELETE", "/v1/topics/other") == (
        409,
        error("Conflict", "topic 'other' kept changing while deleting it (5 attempts); retry"),
    )
    store.conflicts = 1
    assert (await server.call("DELETE", "/v1/topics/other"))[0] == 200
    assert await server.read("topics", "other") is None


# ---------------------------------------------------------------------------- delete


async def test_delete_topic_deletes_only_the_topic_key(server: api_server.ApiServer) -> None:
    provisioned = topic("orders", 1, 1, resolution="Provisioned", replica_map={"0": [0]})
    await server.put(provisioned, partition("orders-0", [0]))
    assert await server.call("DELETE", "/v1/topics/orders") == (
        200,
        {"deleted": provisioned.to_json_dict(), "warnings": []},
    )
    assert await server.read("topics", "orders") is None
    assert await server.read("partitions", "orders-0") is not None  # the topic controller's job
    assert await server.call("DELETE", "/v1/topics/orders") == (404, error("NotFound", "topic 'orders' not found"))
    assert await server.call("DELETE", "/v1/brokers/x") == (
        404,
        error("NotFound", "unknown kind 'brokers': use one of spus, spu-groups, topics, partitions"),
    )


async def test_partitions_cannot_be_deleted_alone(server: api_server.ApiServer) -> None:
    await server.put(partition("orders-0", [0]))
    assert await server.call("DELETE", "/v1/partitions/orders-0") == (
        422,
        error(
            "PartitionOwnedByTopic",
            "partition 'orders-0' belongs to topic 'orders': partitions go with their topic (delete the topic instead)",
        ),
    )
    assert await server.read("partitions", "orders-0") is not None


async def test_delete_spu_still_used_is_allowed_with_a_warning(server: api_server.ApiServer) -> None:
    await server.put(spu(3, "s3"), *(partition(f"t-{index}", [3, 1]) for index in range(12)), partition("u-0", [1]))
    status, body = await server.call("DELETE", "/v1/spus/s3")
    assert (status, body["warnings"]) == (
        200,
        [
            "SPU 3 ('s3') still holds replicas of 12 partitions: t-0, t-1, t-2, t-3, t-4, t-5, t-6, t-7, t-8, t-9 "
            "and 2 more; they stay assigned to id 3 until an SPU with that id is registered again or a rebalance moves them"
        ],
    )
    assert await server.read("spus", "s3") is None


async def test_set_an_spus_rack_and_remove_it(server: api_server.ApiServer) -> None:
    registered = spu(1, "s1")
    await server.put(registered)
    status, body = await server.call("POST", "/v1/spus/s1/rack", {"rack": "/dc1/r2"})
    stored = await server.read("spus", "s1")
    assert stored is not None and (status, body) == (200, stored.to_json_dict())
    assert stored.spec == registered.spec.model_copy(update={"rack": "/dc1/r2"})
    assert stored.status == registered.status  # the status is the controllers', untouched
    # The same rack again writes nothing.
    revision = await server.kv_store.revision()
    assert await server.call("POST", "/v1/spus/s1/rack", {"rack": "/dc1/r2"}) == (200, stored.to_json_dict())
    assert await server.kv_store.revision() == revision
    status, body = await server.call("POST", "/v1/spus/s1/rack", {"rack": None})
    assert (status, "rack" in body["spec"]) == (200, False)
    stored = await server.read("spus", "s1")
    assert stored is not None and stored.spec == registered.spec


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ({"rack": " r1"}, 422, error("InvalidRequest", "rack: rack ' r1' must be non-empty with no leading or trailing spaces (got ' r1')")),
        ({"rack": "/dc1//r1"}, 422, error("InvalidRequest", "rack: rack path '/dc1//r1' has an empty level; write it as /dc1/r1 (no trailing or double '/') (got '/dc1//r1')")),
        ({"rack": 5}, 400, error("MalformedRequest", "rack: must be a string, or null for no rack (got 5)")),
        (
            {"rack": "r1\n2026-11-28 level=info msg=forged"},
            422,
            error("InvalidRequest", "rack: rack 'r1\\n2026-11-28 level=info msg=forged' holds the character '\\n' (U+000A, Cc): a rack may hold no control, format or line-separator character (got 'r1\\n2026-11-28 level=info msg=forged')"),
        ),
        ({}, 422, error("InvalidRequest", "rack: field required (the SPU's rack, or null for none)")),
        ({"rack": "r1", "id": 3}, 422, error("InvalidRequest", 'id: unknown field (the body is {"rack": R})')),
    ],
)  # fmt: skip
async def test_set_rack_errors(server: api_server.ApiServer, body: Any, status: int, expected: dict[str, Any]) -> None:
    registered = spu(1, "s1", rack="r0")
    await server.put(registered)
    assert await server.call("POST", "/v1/spus/s1/rack", body) == (status, expected)
    assert await server.read("spus", "s1") == registered
    assert await server.call("POST", "/v1/spus/nope/rack", {"rack": "r1"}) == (404, error("NotFound", "SPU 'nope' not found"))


async def test_a_managed_spus_rack_is_its_groups(server: api_server.ApiServer) -> None:
    group = models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 1, "minId": 5, "rack": "r1"}})
    managed = spu(5, "g-0", rack="r1", spu_type="Managed")
    await server.put(group, managed)
    assert await server.call("POST", "/v1/spus/g-0/rack", {"rack": "r2"}) == (
        409,
        error("ManagedSpu", "SPU 'g-0' is managed by SPU group 'g', whose SPUs all have its rack ('r1'): it cannot be set on one of them"),
    )
    assert await server.read("spus", "g-0") == managed


async def test_delete_managed_spu_is_refused_while_its_group_exists(server: api_server.ApiServer) -> None:
    group = models.SpuGroup.model_validate({"name": "g", "spec": {"replicas": 1, "minId": 5}})
    await server.put(group, spu(5, "g-0", spu_type="Managed"), spu(6, "h-0", spu_type="Managed"))
    assert await server.call("DELETE", "/v1/spus/g-0") == (
        409,
        error("ManagedSpu", "SPU 'g-0' is managed by SPU group 'g': scale the group down or delete it instead"),
    )
    # A managed SPU whose group is gone may be removed by hand.
    assert (await server.call("DELETE", "/v1/spus/h-0"))[0] == 200
    assert (await server.call("DELETE", "/v1/spu-groups/g"))[0] == 200
    assert await server.read("spu-groups", "g") is None


# ---------------------------------------------------------------------------- placement


async def test_placement_with_explicit_spus(server: api_server.ApiServer) -> None:
    request = {"spus": [{"id": 0}, {"id": 1}, {"id": 2}], "partitions": 3, "replicationFactor": 2}
    status, body = await server.call("POST", "/v1/placement", request)
    assert (status, body["replicaMap"], body["nextStartIndex"]) == (200, [[0, 1], [1, 2], [2, 0]], 3)


async def test_placements_on_many_distinct_large_spu_lists_keep_none_of_them() -> None:
    # Placement remembers its checks for the last few SPU lists (a controller pass places every
    # topic on one cluster); lists sent with POST /v1/placement (a read) must not stay behind:
    # eight of 1.3 million SPUs each (16 MiB bodies) held gigabytes for the life of the process.
    size = 2 * placement.CACHED_SPUS_LIMIT
    running = api_server.ApiServer()
    await running.start()
    try:
        for number in range(10):
            spus = [{"id": number * size + index} for index in range(size)]
            status, body = await running.call("POST", "/v1/placement", {"spus": spus, "partitions": 1, "replicationFactor": 1})
            assert (status, body["replicaMap"]) == (200, [[number * size]])
    finally:
        await running.stop()
    gc.collect()
    assert sum(1 for obj in gc.get_objects() if type(obj) is placement.SpuInfo) < size


async def test_placement_defaults_to_the_online_spus(server: api_server.ApiServer) -> None:
    await server.put(spu(0), spu(4), spu(2, resolution="Offline"), spu(9, resolution="Init"))
    status, body = await server.call("POST", "/v1/placement", {"partitions": 2, "replicationFactor": 2})
    assert (status, body["replicaMap"], body["nextStartIndex"]) == (200, [[0, 4], [4, 0]], 2)
    status, body = await server.call("POST", "/v1/placement", {"partitions": 2, "replicationFactor": 3})
    assert (status, body["error"]["code"]) == (422, "InsufficientResources")


@pytest.mark.parametrize(
    ("request_body", "expected"),
    [
        (
            {"spus": [{"id": 0}], "partitions": 10**9, "replicationFactor": 1},
            error("InvalidConfig", f"partitions must be at most {models.MAX_PARTITIONS}, got 1000000000"),
        ),
        (
            {"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 129},
            error("InvalidConfig", "replicationFactor must be at most 128, got 129"),
        ),
        (
            {"spus": [{"id": 0}], "partitions": "x", "replicationFactor": 1},
            error("InvalidConfig", 'partitions must be an integer of at least 1, got "x"'),
        ),
    ],
)
async def test_placement_errors(server: api_server.ApiServer, request_body: Any, expected: dict[str, Any]) -> None:
    assert await server.call("POST", "/v1/placement", request_body) == (422, expected)


MEGABYTE = 1024 * 1024


@pytest.mark.parametrize(
    ("path", "request_body", "start", "end"),
    [
        (
            "/v1/placement",
            # Policies are at most 64 KiB (past that the refusal names only the length).
            {"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1, "policies": "x" * 60_000},
            "placement policy 'xxx",
            "' is not key=value",
        ),
        (
            "/v1/placement",
            {"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1, "currentReplicaMap": [[0] * MEGABYTE]},
            "current partition 0 repeats an SPU: [0, 0, 0",
            "0, 0, 0]",
        ),
        (
            "/v1/placement",
            {"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1, "strategy": "s" * MEGABYTE},
            "placement strategy 'sss",
            "",
        ),
        ("/v1/placement", {"z" * MEGABYTE: 1}, "request has unknown field 'zzz", ""),
        # Routes whose body is a few fields take 64 KiB.
        ("/v1/cluster/rebalance?dryRun=true", {"z" * 60_000: 1}, "zzz", "(the body is {\"maxMovesPerSpu\": N}, or empty)"),
        ("/v1/spus/s/rack", {"rack": "r", "z" * 60_000: 1}, "zzz", 'unknown field (the body is {"rack": R})'),
    ],
)
async def test_a_refusal_quotes_a_megabyte_value_in_a_few_kilobytes(
    server: api_server.ApiServer, path: str, request_body: Any, start: str, end: str
) -> None:
    """An answer is kept whole until the client takes it: a refusal that quoted a value whole would
    keep three times the body (repr) for a client that does not read it."""
    await server.put(spu(0, "s"))
    status, body = await server.call("POST", path, raw=json.dumps(request_body).encode())
    assert status == 422, body
    message = body["error"]["message"]
    assert len(message) <= api.MAX_ERROR_MESSAGE_CHARS, len(message)
    assert message.startswith(start) and message.endswith(end), (message[:100], message[-100:])
    assert "characters left out" in message


# ---------------------------------------------------------------------------- watch


async def next_event(stream: aiohttp.ClientResponse) -> dict[str, Any]:
    line = await asyncio.wait_for(stream.content.readline(), 5)
    assert line.endswith(b"\n"), line
    return json.loads(line)


async def revision_of(server: api_server.ApiServer, kind: str, name: str) -> int:
    stored = await server.kv_store.get(models.object_key(kind, name))
    assert stored is not None
    return stored.mod_revision


async def test_watch_streams_every_object_then_sync_then_each_change(server: api_server.ApiServer) -> None:
    await server.put(topic("a"), topic("b"))
    assert server.session is not None
    async with server.session.get("/v1/watch/topics") as stream:
        assert (stream.status, stream.headers["Content-Type"]) == (200, "application/x-ndjson")
        revision_a, revision_b = await revision_of(server, "topics", "a"), await revision_of(server, "topics", "b")
        assert await next_event(stream) == {"type": "ADDED", "revision": revision_a, "object": topic("a").to_json_dict()}
        assert await next_event(stream) == {"type": "ADDED", "revision": revision_b, "object": topic("b").to_json_dict()}
        assert await next_event(stream) == {"type": "SYNC", "revision": revision_b, "object": None}

        pending = topic("a", resolution="Pending")
        await server.put(pending)
        modified = await revision_of(server, "topics", "a")
        assert await next_event(stream) == {"type": "MODIFIED", "revision": modified, "object": pending.to_json_dict()}

        deleted = await server.kv_store.delete("topics/b")
        assert await next_event(stream) == {"type": "DELETED", "revision": deleted, "object": topic("b").to_json_dict()}

        await server.put(topic("c"))
        assert await next_event(stream) == {
            "type": "ADDED",
            "revision": await revision_of(server, "topics", "c"),
            "object": topic("c").to_json_dict(),
        }


async def test_watch_partitions_of_one_topic(server: api_server.ApiServer) -> None:
    await server.put(partition("a-0", [1]), partition("b-0", [1]))
    assert server.session is not None
    async with server.session.get("/v1/watch/partitions?topic=b") as stream:
        assert (await next_event(stream))["object"]["name"] == "b-0"
        assert (await next_event(stream))["type"] == "SYNC"
        await server.put(partition("a-1", [1]), partition("b-1", [1]))
        assert (await next_event(stream))["object"]["name"] == "b-1"


async def test_watch_over_websocket(server: api_server.ApiServer) -> None:
    await server.put(spu(1, "s1"))
    assert server.session is not None
    async with server.session.ws_connect("/v1/watch/spus") as websocket:
        first = await asyncio.wait_for(websocket.receive_json(), 5)
        assert (first["type"], first["object"]) == ("ADDED", spu(1, "s1").to_json_dict())
        assert (await asyncio.wait_for(websocket.receive_json(), 5))["type"] == "SYNC"
        offline = spu(1, "s1", resolution="Offline")
        await server.put(offline)
        event = await asyncio.wait_for(websocket.receive_json(), 5)
        assert (event["type"], event["object"]) == ("MODIFIED", offline.to_json_dict())


async def test_a_watch_websocket_takes_no_large_message_from_its_client(server: api_server.ApiServer) -> None:
    """A watcher has nothing to say, but aiohttp takes messages of up to 4 MiB by default, kept
    whole until their last byte: 40 watchers each a byte short of one held 158 MB (and a client
    may open max_watchers_per_address of them)."""
    await server.put(spu(1, "s1"))
    assert server.session is not None
    async with server.session.ws_connect("/v1/watch/spus") as websocket:
        assert (await asyncio.wait_for(websocket.receive_json(), 5))["type"] == "ADDED"
        assert (await asyncio.wait_for(websocket.receive_json(), 5))["type"] == "SYNC"
        await websocket.send_str("x" * (api.WATCH_MAX_CLIENT_MESSAGE_BYTES + 1))
        await server.put(spu(1, "s1", resolution="Offline"))  # a change it would otherwise get
        closing = await asyncio.wait_for(websocket.receive(), 5)
        assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, aiohttp.WSCloseCode.MESSAGE_TOO_BIG), closing
    assert server.context.watchers.total == 0


async def test_watch_errors(server: api_server.ApiServer) -> None:
    assert await server.call("GET", "/v1/watch/brokers") == (
        404,
        error("NotFound", "unknown kind 'brokers': use one of spus, spu-groups, topics, partitions"),
    )
    assert await server.call("GET", "/v1/watch/topics?topic=x") == (
        422,
        error("InvalidRequest", "query parameter topic filters partitions only, not topics"),
    )


async def test_a_client_that_does_not_read_never_holds_up_the_store() -> None:
    server = api_server.ApiServer(settings=config.Settings(watch_buffer_bytes=1024 * 1024))
    await server.start()
    try:
        await server.put(topic("a"))
        table = server.context.local_store["topics"]
        listeners = len(table._listeners)
        assert server.session is not None
        async with server.session.get("/v1/watch/topics") as stream:
            # The client reads nothing while the topic changes 300 times with 20 KB reasons (6 MB):
            # far more than the socket buffers and its 1 MB in the SC hold. The writes go on; the
            # stream is dropped, not queued without end.
            for version in range(300):
                await server.put(topic("a", reason=f"{version:03d}" + "x" * 20_000))
            with pytest.raises(aiohttp.ClientPayloadError):
                while True:
                    await next_event(stream)
        assert server.context.watchers.dropped == {("http", "overflow"): 1}
        assert len(table._listeners) == listeners
    finally:
        await server.stop()


async def test_closing_a_client_or_the_server_ends_the_stream(server: api_server.ApiServer) -> None:
    table = server.context.local_store["topics"]
    listeners = len(table._listeners)
    assert server.session is not None
    async with server.session.get("/v1/watch/topics") as stream:
        assert (await next_event(stream))["type"] == "SYNC"
        assert len(table._listeners) == listeners + 1
    for _ in range(1000):  # the server notices within WATCH_DISCONNECT_POLL_SECONDS (10 s of patience)
        if len(table._listeners) == listeners:
            break
        await asyncio.sleep(0.01)
    assert len(table._listeners) == listeners

    async with server.session.get("/v1/watch/topics") as stream:
        assert (await next_event(stream))["type"] == "SYNC"
        await server.runner.shutdown()  # what AppRunner.cleanup() calls first
        # Ended by the shutdown itself: without it the stream would never end (10 s is patience).
        assert await asyncio.wait_for(stream.content.read(), 10) == b""


# ---------------------------------------------------------------------------- error handling


async def test_unexpected_errors_are_a_logged_500_with_a_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    server = api_server.ApiServer()

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    server.app.router.add_get("/broken", broken)
    await server.start()
    try:
        assert server.session is not None
        async with server.session.get("/broken") as response:
            request_id = response.headers["X-Request-Id"]
            assert (response.status, await response.json()) == (
                500,
                error("InternalError", f"internal error (request id {request_id}); the SC log has the details"),
            )
        logged = capsys.readouterr().out
        assert request_id in logged and "RuntimeError: a bug" in logged
    finally:
        await server.stop()


async def test_routing_errors_are_json(server: api_server.ApiServer) -> None:
    assert await server.call("GET", "/v2/topics") == (404, error("NotFound", "no route for GET /v2/topics; see /openapi.json"))
    assert await server.call("PUT", "/v1/topics/x") == (
        405,
        error("MethodNotAllowed", "PUT is not allowed on /v1/topics/x (allowed: DELETE, GET, HEAD)"),
    )
    assert await server.call("POST", "/v1/partitions", {}) == (
        405,
        error("MethodNotAllowed", "POST is not allowed on /v1/partitions (allowed: GET, HEAD)"),
    )
    too_large = b"[" + b" " * api.MAX_BODY_BYTES + b"]"
    assert await server.call("POST", "/v1/placement", raw=too_large) == (
        413,
        error(
            "RequestTooLarge",
            f"the request body is {api.MAX_BODY_BYTES + 2} bytes (Content-Length); the limit is {api.MAX_BODY_BYTES} bytes",
        ),
    )


async def test_a_compressed_body_holds_the_buffered_bytes_it_may_grow_to_not_its_content_length(
    server: api_server.ApiServer,
) -> None:
    """aiohttp decompresses a body sent with Content-Encoding: 15 KB of gzip are 15 MiB read. Counted
    at its Content-Length, it held nothing of max_buffered_request_bytes (bodies of 64 KiB or less
    hold none): forty such requests held 600 MB."""
    raw = b'{"spus": [{"id": 0}], "partitions": 1, "replicationFactor": 1' + b" " * (15 * 1024 * 1024) + b"}"
    compressed = gzip.compress(raw)
    assert len(compressed) <= transport.SMALL_BODY_BYTES
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST /v1/placement HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Encoding: gzip\r\n"
            + f"Content-Length: {len(compressed)}\r\n\r\n".encode()
            + compressed[:-8]
        )
        await writer.drain()
        assert server.runner.server is not None
        budget = None
        for _ in range(500):  # until the server has read what was sent
            guards = [transport.guard_of(handler.transport) for handler in server.runner.server.connections]
            budget = next((guard.port.budget for guard in guards if guard is not None), None)
            if budget is not None and budget.held:
                break
            await asyncio.sleep(0.01)
        assert budget is not None and budget.held == api.MAX_BODY_BYTES
        writer.write(compressed[-8:])
        await writer.drain()
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
    assert budget.held == 0


@pytest.mark.parametrize(
    "path",
    [
        "/v1/cluster/rebalance?dryRun=true",
        "/v1/spus/s/decommission?dryRun=true",
        "/v1/spus",
        "/v1/spu-groups",
        "/v1/spus/s/rack",
        "/v1/topics/t/partitions",
        "/v1/spu-groups/g/scale",
    ],
)
@pytest.mark.parametrize("declared", [True, False])
async def test_a_route_whose_body_is_a_few_fields_refuses_a_large_one_unread(
    server: api_server.ApiServer, monkeypatch: pytest.MonkeyPatch, path: str, declared: bool
) -> None:
    """Parsing 16 MB of JSON is 2.6 s of CPU on the event loop, before any field is looked at: a
    route whose body is a few fields (the read role may post to the first two) takes no more than
    MAX_SMALL_BODY_BYTES."""
    parsed: list[int] = []
    real = json_input.loads

    def counted(text: bytes | str, max_digits: int | None = json_input.MAX_INTEGER_DIGITS) -> Any:
        parsed.append(len(text))
        return real(text, max_digits)

    monkeypatch.setattr(json_input, "loads", counted)
    large = b'{"a": [' + b"1," * (api.MAX_SMALL_BODY_BYTES // 2) + b"1]}"

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length
        for start in range(0, len(large), 4096):
            yield large[start : start + 4096]

    assert server.session is not None
    async with server.session.post(path, data=io.BytesIO(large) if declared else chunked()) as response:
        status, body = response.status, await response.json()
    limit = f" {api.MAX_SMALL_BODY_BYTES} bytes"
    assert (status, body["error"]["code"], body["error"]["message"].endswith(limit)) == (413, "RequestTooLarge", True), body
    assert parsed == []


SMALL_STORE_REQUEST_BYTES = 64 * 1024
# Twice the store's request limit and 64 KiB: what a topic body may take on a store of 64 KiB requests.
SMALL_STORE_TOPIC_BODY_BYTES = 2 * SMALL_STORE_REQUEST_BYTES + 64 * 1024


def _topic_body_refusal(received: str) -> dict[str, Any]:
    return error(
        "RequestTooLarge",
        f"the request body is {received} bytes for a topic: a topic is stored in one etcd request of at most "
        f"{SMALL_STORE_REQUEST_BYTES} bytes (etcd_max_request_bytes), and its body may take twice that and 65536 bytes "
        "more; send it without indentation, or raise etcd_max_request_bytes for a larger topic",
    )


@pytest.mark.parametrize("path", ["/v1/topics?timeout=0", "/v1/topics?dryRun=true"])
@pytest.mark.parametrize("declared", [True, False])
async def test_a_topic_body_larger_than_the_store_holds_is_refused_unread(path: str, declared: bool) -> None:
    """A topic is one etcd request: a create (or a dry run, open to the read role) of 16 MiB was
    parsed and validated for seconds on the event loop before TopicTooLarge refused it. The body is
    bounded by the store's request limit, before a byte of it is parsed."""
    server = api_server.ApiServer(memory.MemoryStore(max_request_bytes=SMALL_STORE_REQUEST_BYTES))
    await server.start()
    try:
        await server.put(spu(0))
        valid = json.dumps({"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0]}]}}).encode()
        at_limit = valid[:-1] + b" " * (SMALL_STORE_TOPIC_BODY_BYTES - len(valid)) + b"}"
        over = at_limit[:-1] + b" }"

        async def chunked(raw: bytes) -> AsyncIterator[bytes]:  # no Content-Length
            for start in range(0, len(raw), 4096):
                yield raw[start : start + 4096]

        assert server.session is not None
        async with server.session.post(path, data=io.BytesIO(over) if declared else chunked(over)) as response:
            refused = (response.status, await response.json())
        received = (
            f"{len(over)} bytes (Content-Length); the limit is {SMALL_STORE_TOPIC_BODY_BYTES}"
            if declared
            else f"larger than {SMALL_STORE_TOPIC_BODY_BYTES}"
        )
        assert refused == (413, _topic_body_refusal(received))
        async with server.session.post(path, data=io.BytesIO(at_limit) if declared else chunked(at_limit)) as response:
            assert response.status == (200 if "dryRun" in path else 202), await response.text()
    finally:
        await server.stop()


@pytest.mark.parametrize("replication_factor", [1, 3, 8, 32, 128])
def test_the_largest_topic_the_store_holds_fits_its_body_limit(replication_factor: int) -> None:
    """The bound refuses no topic the store could hold, as clients send it (json.dumps' separators,
    SPU ids of as few digits as there are distinct SPUs)."""
    store = memory.MemoryStore()
    request_size = kv.request_size(store)
    probe = models.Topic.model_validate({"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": [0]}]}})
    digits = len(str(replication_factor - 1))
    largest = topic_size.max_topic_bytes(request_size, "t", topic_controller.CHAIN_KEY)
    count = topic_size.largest_count(probe, replication_factor, digits, largest)
    rows = [{"id": index, "replicas": list(range(replication_factor))} for index in range(count)]
    body = json.dumps({"name": "t", "spec": {"replicaAssignment": rows}}).encode()
    content = len(json.dumps({"name": "t", "spec": {"replicaAssignment": rows}}, separators=(",", ":")))
    limit, content_limit = api.topic_body_limit(store), admin_ops.topic_content_limit(store)
    assert (count > 0, len(body) * 2 <= limit, content <= content_limit) == (True, True, True), (count, len(body), content)


@pytest.mark.parametrize("path", ["/v1/topics?timeout=0", "/v1/topics?dryRun=true"])
async def test_a_topic_body_holding_more_than_the_store_holds_besides_whitespace_is_refused_unparsed(path: str) -> None:
    """What a body holds besides JSON's whitespace is what a stored topic holds at least (its
    assignment is stored twice, in the spec and as the replica map): above the store's request
    limit and 64 KiB it can never be stored, and is refused before it is parsed."""
    server = api_server.ApiServer(memory.MemoryStore(max_request_bytes=SMALL_STORE_REQUEST_BYTES))
    await server.start()
    try:
        rows = [{"id": index, "replicas": [0]} for index in range(5_600)]
        raw = json.dumps({"name": "t", "spec": {"replicaAssignment": rows}}).encode()
        content = len(raw) - sum(raw.count(space) for space in (b" ", b"\n", b"\r", b"\t"))
        assert SMALL_STORE_REQUEST_BYTES + 64 * 1024 < content < len(raw) <= SMALL_STORE_TOPIC_BODY_BYTES
        assert await server.call("POST", path, raw=raw) == (
            413,
            error(
                "RequestTooLarge",
                f"the request body holds {content} bytes besides whitespace; the limit is "
                f"{SMALL_STORE_REQUEST_BYTES + 64 * 1024} bytes for a topic: a topic is stored in one etcd request of "
                f"at most {SMALL_STORE_REQUEST_BYTES} bytes (etcd_max_request_bytes), its replica assignment twice; "
                "raise etcd_max_request_bytes for a larger topic",
            ),
        )
    finally:
        await server.stop()


async def test_an_unavailable_store_is_503(server: api_server.ApiServer) -> None:
    await server.kv_store.close()
    assert await server.call("POST", "/v1/topics", TOPIC_BODY) == (
        503,
        error("Unavailable", "the KV store is unavailable (the memory store is closed); retry shortly"),
    )
    assert (await server.call("POST", "/v1/spus", SPU_BODY))[0] == 503
    assert (await server.call("DELETE", "/v1/topics/x"))[0] == 503


# ---------------------------------------------------------------------------- fuzzing: never a 500

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
SPEC_FIELDS = [
    "id", "spuType", "rack", "publicEndpoint", "privateEndpoint", "replicas", "minId", "storage", "partitions",
    "replicationFactor", "ignoreRackAssignment", "placement", "replicaAssignment", "host", "port", "strategy",
    "policies", "count", "spus", "startIndex", "existing",
]  # fmt: skip
NEAR_VALID = st.fixed_dictionaries(
    {"name": st.sampled_from(["t", "x-1", "", "Bad", 5]) | st.text(max_size=5)},
    optional={"spec": st.dictionaries(st.sampled_from(SPEC_FIELDS), JSON | st.integers(-2, 200_000), max_size=6)},
)
FLAT = st.dictionaries(st.sampled_from(SPEC_FIELDS), JSON | st.integers(-2, 200_000), max_size=6)


@pytest.mark.parametrize("kind", ["spus", "spu-groups", "topics"])
@settings(max_examples=100, deadline=None)
@given(body=JSON | NEAR_VALID)
def test_parsing_any_json_gives_an_object_or_a_400_or_422(kind: str, body: Any) -> None:
    try:
        obj = api.parse_object(models.model_for_kind(kind), json.dumps(body).encode())
    except api.ApiError as failure:
        assert failure.status in (400, 422) and failure.message
    else:
        assert obj.kind == kind


@pytest.mark.parametrize(
    "path",
    [
        "/v1/spus",
        "/v1/spu-groups?timeout=0",
        "/v1/spu-groups/g/scale",
        "/v1/spus/s/rack",
        "/v1/topics?timeout=0",
        "/v1/topics?dryRun=true",
        "/v1/placement",
        "/v1/topics/t/partitions?timeout=0",
    ],
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=JSON | NEAR_VALID | FLAT)
async def test_no_body_makes_a_route_answer_500(server: api_server.ApiServer, path: str, body: Any) -> None:
    status, answer = await server.call("POST", path, body)
    assert status in (200, 201, 202, 400, 404, 409, 422), (status, answer)


@pytest.mark.parametrize("length", [b"9" * 5000, b"\xc2\xb2", b"-1"])
async def test_a_content_length_that_is_no_number_in_range_is_400(server: api_server.ApiServer, length: bytes) -> None:
    """aiohttp's parser answers before the API: never a 500, whatever the header holds."""
    answer = await raw_request(server, b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + length + b"\r\n\r\n{}")
    assert answer.split(b" ")[1] == b"400"


async def raw_request(server: api_server.ApiServer, request: bytes) -> bytes:
    """``request`` as bytes on a connection of its own (what no HTTP client would send), and the
    answer until the server closes the connection."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "header",
    [
        b"Authorization: Bearer " + SECRET_TOKEN + b"\x01",  # a control character in the value
        b"Authorization : Bearer " + SECRET_TOKEN,  # a space before the colon
        b"authorization: bearer " + SECRET_TOKEN + b"\nX-Next: 1",  # a bare LF ending it
        b"Sec-WebSocket-Protocol: sc.v1, bearer." + SECRET_TOKEN + b"\x7f",
    ],
)
async def test_a_malformed_credential_header_is_quoted_neither_in_the_log_nor_in_the_answer(
    server: api_server.ApiServer, header: bytes
) -> None:
    """aiohttp's parser quotes the line it refuses: a token on it must not reach the SC's log."""
    with structlog.testing.capture_logs() as logged:
        answer = await raw_request(server, b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header + b"\r\n\r\n")
    assert answer.split(b" ")[1] == b"400"
    refused = [line for line in logged if line.get("status") == 400]
    assert refused, logged
    # Not even its first characters: 16 are enough for a token.
    assert SECRET_TOKEN[:4] not in answer
    assert SECRET_TOKEN[:4].decode() not in repr(refused)


def test_every_operation_with_a_query_parameter_documents_its_400() -> None:
    """Found by the fuzzer: POST /v1/spus/{name}/drain answered 400 for ?timeout=-1 undocumented."""
    from controller.api import openapi

    lacking = [
        f"{method.upper()} {path}"
        for path, methods in openapi.document()["paths"].items()
        for method, operation in methods.items()
        if any(parameter["in"] == "query" for parameter in operation.get("parameters", []))
        and "400" not in operation["responses"]
    ]
    assert lacking == []


# ---------------------------------------------------------------------------- the SCs of the store


async def test_cluster_names_this_sc_and_the_active_one_from_the_claim(server: api_server.ApiServer) -> None:
    # Nothing claims the store yet: no leader, and this SC is not one.
    assert await server.call("GET", "/v1/cluster") == (
        200, {"self": {"id": None, "role": "standby", "address": None}, "leader": None, "standbys": []}
    )  # fmt: skip
    claim = active_sc.ActiveSc(server.kv_store, ttl=5)
    await claim.acquire("sc-a.example:9003")
    server.context.active = claim
    try:
        identity = claim.identity
        assert identity is not None
        stored = await builders.present(server.kv_store, active_sc.KEY)

        async def claimed() -> None:
            status, body = await server.call("GET", "/v1/cluster")
            assert (status, body["leader"] is not None) == (200, True), body
            assert body == {
                "self": {"id": identity.id, "role": "leader", "address": "sc-a.example:9003"},
                "leader": {"id": identity.id, "address": "sc-a.example:9003", "since": identity.started, "epoch": stored.mod_revision},
                "standbys": [],
            }

        await builders.eventually(claimed)
        # Anyone who can write the store can write the claim: a value no SC wrote shows as unknown.
        revision = await server.kv_store.update(active_sc.KEY, b'{"id": 7, "address": "<script>"}', stored.mod_revision)

        async def unknown_holder() -> None:
            assert (await server.call("GET", "/v1/cluster"))[1]["leader"] == {"id": None, "address": None, "since": None, "epoch": revision}

        await builders.eventually(unknown_holder)
    finally:
        await claim.release()


async def test_a_standby_lists_the_queue_serves_reads_and_sends_writes_to_the_leader(server: api_server.ApiServer) -> None:
    leader = active_sc.ActiveSc(server.kv_store, ttl=5)
    await leader.acquire("sc-a.example:9003")
    standby = active_sc.ActiveSc(server.kv_store, ttl=5)
    await standby.join("sc-b.example:9003")
    server.context.active = standby  # this SC
    try:
        assert leader.identity is not None and standby.identity is not None
        identity = standby.identity

        async def listed() -> None:
            status, body = await server.call("GET", "/v1/cluster")
            assert status == 200 and body["self"] == {"id": identity.id, "role": "standby", "address": "sc-b.example:9003"}
            assert body["standbys"] == [{"id": identity.id, "address": "sc-b.example:9003"}]

        await builders.eventually(listed)
        assert await server.call("GET", "/v1/topics") == (200, [])
        assert (await server.call("POST", "/v1/topics?dryRun=true", {"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}}))[0] != 307
        assert server.session is not None
        for method, path in [("POST", "/v1/topics?timeout=0"), ("DELETE", "/v1/topics/t"), ("POST", "/v1/spus/spu-1/drain")]:
            async with server.session.request(method, path, json={}, allow_redirects=False) as response:
                body = await response.json()
                assert (response.status, response.headers["Location"]) == (307, f"http://sc-a.example:9003{path}"), body
                assert body["error"]["code"] == "NotLeader" and body["leader"] == {"id": leader.identity.id, "address": "sc-a.example:9003"}
        await leader.release()

        async def no_leader() -> None:
            status, body = await server.call("POST", "/v1/topics", {"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}})
            assert (status, body["error"]["code"]) == (503, "NoLeader"), body

        await builders.eventually(no_leader)
        assert await server.kv_store.get("topics/t") is None
    finally:
        await standby.release()
        await leader.release()


@pytest.mark.parametrize(
    ("model", "spec"),
    [
        (models.Topic, {"partitions": 1, "replicationFactor": 1}),
        (models.SpuGroup, {"replicas": 1}),
    ],
)
def test_a_body_of_many_problems_is_refused_without_describing_each(model: type[models.Model], spec: dict[str, Any]) -> None:
    """pydantic reports every unknown field of an object, and hands its problems out only all at
    once: a 15 MB body of 1.3 million unknown fields held the event loop for 23 s and took 2.3 GB
    to list them (twice) and describe the first ten. Past MAX_PROBLEMS_READ problems the refusal
    says how many, and lists none."""
    extras = ",".join(f'"x{index}":1' for index in range(50_000))
    raw = ('{"name": "t", "spec": ' + json.dumps(spec) + ", " + extras + "}").encode()
    tracemalloc.start()
    try:
        with pytest.raises(api.ApiError) as raised:
            api.parse_object(model, raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (raised.value.status, raised.value.code) == (422, "InvalidObject")
    assert raised.value.message == (
        f"the object has 50000 problems, more than the {models.MAX_PROBLEMS_READ} described one by one "
        "(unknown fields are a problem each)"
    )
    assert peak < 24 * 1024 * 1024, peak
