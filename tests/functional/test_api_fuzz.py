"""The whole public HTTP API fuzzed from its OpenAPI document (schemathesis) against real daemons on
127.0.0.1, one empty and one holding SPUs, an SPU group and topics: never a 5xx, every answer
documented, of the documented content type and shape, and every input the document rules out refused.

Every operation of the document is fuzzed: a route added to the document is fuzzed with no change
here. Inputs that fit the schemas (positive: answers must conform) and inputs that do not (negative:
they must be refused with a 4xx). Bounded and repeatable: EXAMPLES inputs per operation and mode,
derandomized; waits forced short (?timeout= at most 100 ms), counts kept small in inputs that fit
(a fuzzed topic has a few partitions, not 100,000; inputs that do not fit are fuzzed from the
document as served), a streaming answer read up to its first event.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from schemathesis import GenerationMode
from schemathesis.core.errors import InvalidSchema
from schemathesis.core.result import Err, Ok
from schemathesis.schemas import APIOperation
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from connection_manager import health as health_module
from controller import config, daemon as daemon_module
from controller.api import openapi
from tests.fixtures import certs

# Inputs per operation and mode: about 25 s for both daemons on a two-core machine.
EXAMPLES = 25
# The same over TLS with a token: fewer, since what differs is the transport, not the inputs.
TLS_EXAMPLES = 8
ADMIN_TOKEN = "fuzzing-admin-token-0123456789"
# The longest wait a fuzzed request may ask for, in milliseconds (long-poll routes wait that long).
LONGEST_WAIT_MS = 100
# Sizes the fuzzer may ask for: the document allows 100,000 partitions, which is work, not fuzzing.
SMALL = {"partitions": 4, "replicationFactor": 3, "count": 4, "replicas": 3}
CHECKS = {
    GenerationMode.POSITIVE: [
        not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
    ],
    GenerationMode.NEGATIVE: [not_a_server_error, status_code_conformance, negative_data_rejection],
}
DOCUMENT = openapi.document()


def operations() -> Iterator[Any]:
    """Every (operation, mode) of the document; negative only where some input can be invalid."""
    for path, methods in DOCUMENT["paths"].items():
        for method, operation in methods.items():
            label = f"{method.upper()} {path}"
            yield pytest.param(label, GenerationMode.POSITIVE, id=f"{label} positive")
            if operation.get("parameters") or operation.get("requestBody"):
                yield pytest.param(label, GenerationMode.NEGATIVE, id=f"{label} negative")


# The schemas of request bodies only: answers are checked against the document as it is (a topic
# grown by the fuzzer's add-partitions past SMALL is still a valid topic).
REQUEST_SCHEMAS = ("NewTopic", "NewSpuGroup", "AddPartitions", "Scale", "PlacementRequest")


@functools.cache
def served_schema() -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_dict(DOCUMENT)


@functools.cache
def fuzzed_schema() -> schemathesis.BaseSchema:
    """The document with the sizes above clamped in request bodies (nothing else changed)."""
    document = copy.deepcopy(DOCUMENT)

    def clamp(node: Any) -> None:
        if isinstance(node, dict):
            properties = node.get("properties", {})
            for name, value in list(properties.items()):
                if name in SMALL and isinstance(value, dict):
                    # A copy: the document shares property schemas between request and answer schemas.
                    value = properties[name] = copy.deepcopy(value)
                    for option in value.get("anyOf", [value]):
                        if option.get("type") == "integer":
                            option["maximum"] = min(option.get("maximum", SMALL[name]), SMALL[name])
            for value in node.values():
                clamp(value)
        elif isinstance(node, list):
            for value in node:
                clamp(value)

    for name in REQUEST_SCHEMAS:
        clamp(document["components"]["schemas"][name])
    for methods in document["paths"].values():
        for operation in methods.values():
            clamp(operation.get("requestBody", {}))
    return schemathesis.openapi.from_dict(document)


# ---------------------------------------------------------------------------- the daemons


@dataclass
class Cluster:
    url: str
    names: dict[str, list[str]]  # objects that exist, by kind: fuzzed paths name them too
    session: requests.Session
    examples: int = EXAMPLES
    secured: bool = False  # over TLS, the fuzzer holding an admin token


@pytest.fixture(scope="module", params=["empty", "populated", "populated-tls"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A daemon (memory store) on its own event loop in a thread: the fuzzer's client is synchronous.
    ``populated-tls``: over TLS, with credentials required (the fuzzer holds an admin token)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzzed-daemon", daemon=True)
    thread.start()
    secured: dict[str, Any] = {}
    session = requests.Session()
    if request.param.endswith("-tls"):
        directory = tmp_path_factory.mktemp("fuzz-tls")
        authority = certs.Authority(directory)
        server = authority.server()
        (directory / "tokens").write_text(f"fuzzer admin {ADMIN_TOKEN}\n")
        secured = {"tls_cert": server.cert, "tls_key": server.key, "auth_tokens": directory / "tokens"}
        session.verify = str(authority.path)
        session.trust_env = False  # else REQUESTS_CA_BUNDLE, if set, replaces verify
        session.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    settings_ = config.Settings(
        store=config.StoreKind.MEMORY, bind_host="127.0.0.1", public_port=0, private_port=0, record_history=False,
        spu_offline_grace=3600.0, log_level="critical", **secured,
    )
    daemon = daemon_module.Daemon(settings_)
    asyncio.run_coroutine_threadsafe(daemon.start(), loop).result(30)
    scheme = "https" if secured else "http"
    cluster = Cluster(f"{scheme}://127.0.0.1:{daemon.public_port}", {}, session, TLS_EXAMPLES if secured else EXAMPLES, bool(secured))
    try:
        if request.param.startswith("populated"):
            populate(cluster, daemon, loop)
        yield cluster
    finally:
        session.close()
        asyncio.run_coroutine_threadsafe(daemon.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def populate(cluster: Cluster, daemon: daemon_module.Daemon, loop: asyncio.AbstractEventLoop) -> None:
    """Three SPUs online in three racks, an SPU group, a computed and a manual topic."""
    assert daemon.pipeline is not None
    for spu_id in range(3):
        spec: dict[str, Any] = {
            "id": spu_id, "rack": f"r{spu_id}", "publicEndpoint": {"host": "127.0.0.1", "port": 9005 + spu_id},
            "privateEndpoint": {"host": "127.0.0.1", "port": 9105 + spu_id},
        }
        answer = cluster.session.post(f"{cluster.url}/v1/spus", json={"name": f"spu-{spu_id}", "spec": spec})
        assert answer.status_code == 201, answer.text
        loop.call_soon_threadsafe(daemon.pipeline.health.set, spu_id, health_module.Health.ONLINE, loop.time())
    until(lambda: all(spu["status"]["resolution"] == "Online" for spu in listed(cluster, "spus")))
    topics: list[dict[str, Any]] = [
        {"name": "orders", "spec": {"partitions": 2, "replicationFactor": 2}},
        {"name": "manual", "spec": {"replicaAssignment": [{"id": 0, "replicas": [2, 0]}]}},
    ]
    for body in topics:
        answer = cluster.session.post(f"{cluster.url}/v1/topics", json=body)
        assert answer.status_code == 201, answer.text
    answer = cluster.session.post(f"{cluster.url}/v1/spu-groups", json={"name": "group", "spec": {"replicas": 1, "minId": 10}})
    assert answer.status_code == 201, answer.text
    until(lambda: len(listed(cluster, "partitions")) == 3 and len(listed(cluster, "spus")) == 4)
    cluster.names = {kind: [obj["name"] for obj in listed(cluster, kind)] for kind in ("spus", "spu-groups", "topics", "partitions")}


def listed(cluster: Cluster, kind: str) -> list[dict[str, Any]]:
    answer = cluster.session.get(f"{cluster.url}/v1/{kind}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the daemon did not get there in time"
        time.sleep(0.02)


# ---------------------------------------------------------------------------- the fuzzing


@pytest.mark.parametrize(("label", "mode"), list(operations()))
def test_no_input_makes_the_api_answer_5xx_or_off_its_document(cluster: Cluster, label: str, mode: GenerationMode) -> None:
    # Inputs that fit: from the clamped document. Inputs that do not: from the served one, since a
    # size between a clamp and the document's limit (a scale to 4 SPUs) is one the API rightly takes.
    schema = fuzzed_schema() if mode is GenerationMode.POSITIVE else served_schema()
    operation = schema.find_operation_by_label(label)
    assert operation is not None, label
    streams = "application/x-ndjson" in json.dumps(operation.definition.raw.get("responses", {}).get("200", {}))

    @settings(
        max_examples=cluster.examples, derandomize=True, database=None, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def fuzz(case: schemathesis.Case, data: st.DataObject) -> None:
        aim(case, data, cluster, mode)
        if streams:
            check_stream(case, cluster, mode)
            return
        # verify given: schemathesis would otherwise pass its own default, not the session's CA.
        response = case.call(base_url=cluster.url, session=cluster.session, timeout=30, verify=cluster.session.verify)
        case.validate_response(response, checks=CHECKS[mode])
        if cluster.secured:
            # The admin token opens every operation: the fuzzer reaches the handlers, not only the gate.
            assert response.status_code not in (401, 403), response.text

    fuzz()


def aim(case: schemathesis.Case, data: st.DataObject, cluster: Cluster, mode: GenerationMode) -> None:
    """Short waits always; with inputs that fit the schemas, name existing objects half the time."""
    query = case.query if isinstance(case.query, dict) else {}
    if any(parameter.name == "timeout" for parameter in case.operation.query):
        timeout = query.get("timeout")
        if timeout is None:
            case.query = {**query, "timeout": LONGEST_WAIT_MS // 2}
        elif type(timeout) is int and 0 <= timeout:
            # Above the document's maximum it is the input a negative case is about: left as it is.
            case.query = {**query, "timeout": min(timeout, LONGEST_WAIT_MS) if timeout <= 600_000 else timeout}
    parameters = case.path_parameters or {}
    if mode is GenerationMode.POSITIVE and "name" in parameters and cluster.names and data.draw(st.booleans()):
        kind = parameters.get("kind") or case.path.split("/")[2]
        if cluster.names.get(kind):
            parameters["name"] = data.draw(st.sampled_from(cluster.names[kind]))


def check_stream(case: schemathesis.Case, cluster: Cluster, mode: GenerationMode) -> None:
    """A streaming answer: the checks of the others on what it sends first (an error, or the first
    event line, which must also match the document's event schema)."""
    arguments = {**case.as_transport_kwargs(base_url=cluster.url), "verify": cluster.session.verify}
    with cluster.session.request(**arguments, stream=True, timeout=30) as response:
        if response.status_code == 200:
            first = next(response.iter_lines())
            jsonschema.validate(
                json.loads(first),
                {**documented_schema(case, "application/x-ndjson"), "components": DOCUMENT["components"]},
            )
            # What the checks see: the stream cut after its first event (they read a body to its end).
            response._content = first  # noqa: SLF001 (requests has no other way to hand over a read body)
        checks = [check for check in CHECKS[mode] if check is not response_schema_conformance]
        case.validate_response(response, checks=checks)


def documented_schema(case: schemathesis.Case, media_type: str) -> dict[str, Any]:
    return case.operation.definition.raw["responses"]["200"]["content"][media_type]["schema"]


def _label(operation: Ok[APIOperation] | Err[InvalidSchema]) -> str:
    """An operation's label; a route the document could not describe fails the test."""
    assert isinstance(operation, Ok), operation.err()
    label: str = operation.ok().label
    return label


def test_the_fuzzed_document_differs_from_the_served_one_only_in_the_clamped_sizes() -> None:
    """The clamps must not hide a route or loosen anything but the sizes they name."""
    served = {_label(operation) for operation in served_schema().get_all_operations()}
    fuzzed = {_label(operation) for operation in fuzzed_schema().get_all_operations()}
    assert fuzzed == served
    assert fuzzed_schema().raw_schema["components"]["schemas"]["AddPartitions"]["properties"]["count"]["maximum"] == SMALL["count"]

