"""Object models: camelCase round trip, every validation rule, messages naming field and value."""

from __future__ import annotations

import gc
import json
import re
import sys
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import models

SPU: dict[str, Any] = {
    "name": "spu-5001",
    "spec": {
        "id": 5001,
        "spuType": "Custom",
        "rack": "/dc1/r2",
        "publicEndpoint": {"host": "10.0.0.1", "port": 9005},
        "privateEndpoint": {"host": "10.0.0.1", "port": 9006},
    },
    "status": {"resolution": "Online"},
}
SPU_GROUP = {
    "name": "main",
    "spec": {"replicas": 3, "minId": 11, "rack": "zone-a", "storage": {"logDir": "/var/fluvio", "size": "2Gi"}, "host": "127.0.0.1", "publicPortBase": 10000, "privatePortBase": 30000},
    "status": {"resolution": "Invalid", "reason": "id 12 is taken by SPU custom-12"},
}
TOPIC = {
    "name": "orders",
    "spec": {
        "partitions": 6,
        "replicationFactor": 3,
        "ignoreRackAssignment": False,
        "placement": {"strategy": "policies", "policies": "node=exclusive"},
    },
    "status": {"resolution": "Provisioned", "replicaMap": {"0": [0, 1, 2], "1": [1, 2, 0]}, "reason": ""},
}
MANUAL_TOPIC = {
    "name": "custom-topic",
    "spec": {"ignoreRackAssignment": False, "replicaAssignment": [{"id": 0, "replicas": [0, 1, 2]}, {"id": 1, "replicas": [1, 2, 0]}]},
    "status": {"resolution": "Init", "replicaMap": {}, "reason": ""},
}
PARTITION = {
    "name": "orders-7",
    "spec": {"leader": 101, "replicas": [101, 102]},
    "status": {
        "resolution": "Online",
        "leaderEpoch": 3,
        "partitionEpoch": 5,
        "isr": [101, 102],
        "leader": {"spu": 101, "hw": 10, "leo": 12},
        "replicas": [{"spu": 102, "hw": 10, "leo": 11}],
        "lrs": 1,
    },
}


@pytest.mark.parametrize(
    ("model", "document"),
    [(models.Spu, SPU), (models.SpuGroup, SPU_GROUP), (models.Topic, TOPIC), (models.Topic, MANUAL_TOPIC), (models.Partition, PARTITION)],
)
def test_camel_case_round_trip_is_exact(model: type[models.AnyObject], document: dict[str, Any]) -> None:
    obj = model.model_validate(document)
    assert json.loads(models.encode(obj)) == document
    assert models.decode(model.kind, models.encode(obj)) == obj
    assert obj.to_json_dict() == document


def test_a_drain_is_stored_only_while_it_is_on() -> None:
    """spec.drain is omitted when false: SPUs never drained keep their exact stored bytes."""
    plain = models.Spu.model_validate(SPU)
    assert "drain" not in models.encode(plain).decode()
    assert models.Spu.model_validate({**SPU, "spec": {**SPU["spec"], "drain": False}}) == plain
    draining = {
        **SPU,
        "spec": {**SPU["spec"], "drain": True},
        "status": {"resolution": "Online", "drain": "Draining", "reason": "1 of the 1 partition(s) it leads cannot move: solo-0 (it has no other replica)"},
    }
    obj = models.Spu.model_validate(draining)
    assert json.loads(models.encode(obj)) == draining and obj.to_json_dict() == draining
    assert models.decode("spus", models.encode(obj)) == obj
    undrained = obj.model_copy(update={"spec": obj.spec.model_copy(update={"drain": False}), "status": plain.status})
    assert models.encode(undrained) == models.encode(plain)


def test_defaults_are_filled_in_canonical_form() -> None:
    topic = models.Topic.model_validate({"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}})
    assert topic.to_json_dict() == {
        "name": "t",
        "spec": {"partitions": 1, "replicationFactor": 1, "ignoreRackAssignment": False},
        "status": {"resolution": "Init", "replicaMap": {}, "reason": ""},
    }
    assert topic.key == "topics/t"


def error_of(model: type[pydantic.BaseModel], document: dict[str, Any]) -> str:
    with pytest.raises(pydantic.ValidationError) as raised:
        model.model_validate(document)
    return models.describe_validation_error(raised.value)


def with_spec(document: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**document, "spec": {**document["spec"], **changes}}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Orders", "name: name 'Orders' is invalid: use only lowercase letters, digits and '-', and do not start or end with '-' (got 'Orders')"),
        ("-orders", "name: name '-orders' is invalid"),
        ("orders-", "name: name 'orders-' is invalid"),
        ("or_ders", "name: name 'or_ders' is invalid"),
        ("", "name: name '' is invalid"),
        ("a" * 64, f"name: name '{'a' * 64}' is 64 characters long; at most 63 are allowed"),
    ],
)
def test_topic_names(name: str, message: str) -> None:
    assert error_of(models.Topic, {**TOPIC, "name": name}).startswith(message)


def test_a_long_offending_value_is_quoted_shortened() -> None:
    name = "x" * 100_000
    rule = f"name '{name}' is 100000 characters long; at most 63 are allowed"
    assert error_of(models.Topic, {**TOPIC, "name": name}) == (
        f"name: {rule[:200]}... ({len(rule)} characters) (got '{'x' * 200}'... (100000 characters))"
    )


def test_only_the_first_problems_are_described() -> None:
    assignment = [{"id": index, "replicas": ["x"]} for index in range(15)]
    message = error_of(models.Topic, {**TOPIC, "spec": {"replicaAssignment": assignment}})
    problems = message.split("; ")
    assert len(problems) == models.MAX_PROBLEMS_DESCRIBED + 1 and problems[-1] == "and 5 more problems", message


def test_longest_valid_topic_name() -> None:
    assert models.Topic.model_validate({**TOPIC, "name": "a" * 63}).name == "a" * 63


@pytest.mark.parametrize(
    ("spec_changes", "message"),
    [
        ({"partitions": 0}, "spec.partitions: Input should be greater than or equal to 1 (got 0)"),
        ({"partitions": 100_001}, "spec.partitions: Input should be less than or equal to 100000 (got 100001)"),
        ({"replicationFactor": 0}, "spec.replicationFactor: Input should be greater than or equal to 1 (got 0)"),
        ({"partitions": "many"}, "spec.partitions: Input should be a valid integer, unable to parse string as an integer (got 'many')"),
        ({"replicationfactor": 2}, "spec.replicationfactor: unknown field (value 2)"),
        ({"placement": {"strategy": "Random"}}, "spec.placement.strategy: placement strategy 'Random' is unknown"),
        ({"replicaAssignment": [{"id": 0, "replicas": [1]}]}, "spec: a topic is either computed or manual: replicaAssignment cannot be combined with partitions, replicationFactor, placement"),
    ],
)
def test_topic_spec_rules(spec_changes: dict[str, Any], message: str) -> None:
    assert error_of(models.Topic, with_spec(TOPIC, **spec_changes)).startswith(message)


def test_topic_spec_needs_a_mode() -> None:
    assert error_of(models.Topic, {"name": "t", "spec": {"partitions": 2}}).startswith(
        "spec: a computed topic needs replicationFactor (or give replicaAssignment instead)"
    )
    assert error_of(models.Topic, {"name": "t", "spec": {}}).startswith(
        "spec: a computed topic needs partitions and replicationFactor"
    )
    assert error_of(models.Topic, {"name": "t", "spec": {"replicaAssignment": []}}).startswith(
        "spec: replicaAssignment must list at least one partition"
    )
    assert error_of(models.Topic, {"name": "t", "spec": {"replicaAssignment": [{"id": -1, "replicas": [0]}]}}).startswith(
        "spec.replicaAssignment.0.id: Input should be greater than or equal to 0 (got -1)"
    )


def test_a_manual_row_has_at_most_the_largest_replication_factor() -> None:
    """A computed topic has at most 128 replicas a partition; a manual row had no limit (200 SPU
    ids, or a million, were accepted and stored)."""
    longest = list(range(models.MAX_REPLICATION_FACTOR))
    assignment = [{"id": 0, "replicas": longest}, {"id": 1, "replicas": list(range(200))}]
    message = error_of(models.Topic, {"name": "t", "spec": {"replicaAssignment": assignment}})
    assert message.startswith(
        "spec.replicaAssignment: partition 1 lists 200 replicas; at most 128 are allowed (the largest replication factor)"
    ), message
    topic = models.Topic.model_validate({"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": longest}]}})
    assert topic.spec.replica_assignment is not None and topic.spec.replica_assignment[0].replicas == longest
    # A long assignment is quoted by its start and its length, not written out whole.
    rows = [{"id": index, "replicas": [0]} for index in range(299)] + [{"id": 299, "replicas": list(range(129))}]
    assert error_of(models.Topic, {"name": "t", "spec": {"replicaAssignment": rows}}) == (
        "spec.replicaAssignment: partition 299 lists 129 replicas; at most 128 are allowed (the largest replication "
        f"factor) (got {repr(rows)[:200]}... (300 items))"
    )


def python_calls(work: Callable[[], object]) -> int:
    """How many Python functions ``work`` calls (pydantic-core calling a validator written in Python
    counts; its own Rust code does not)."""
    calls = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    # A collection during ``work`` would run finalizers of other tests' objects: counted, not its.
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return calls


def test_a_manual_topic_is_validated_without_a_python_call_per_row() -> None:
    """A validator on each row was one Python call per partition, on the event loop: 100,000 rows
    took 1.0 s of model_validate_json. The rows are checked in pydantic-core, the topic once."""

    def calls_for(rows: int) -> int:
        assignment = [{"id": index, "replicas": [index % 7, 7 + index % 5, 12 + index % 3]} for index in range(rows)]
        raw = json.dumps({"name": "t", "spec": {"replicaAssignment": assignment}}).encode()
        return python_calls(lambda: models.Topic.model_validate_json(raw, strict=True))

    assert calls_for(1000) == calls_for(1)


def test_a_stored_manual_topic_with_a_longer_row_is_unreadable() -> None:
    stored = {"name": "t", "spec": {"replicaAssignment": [{"id": 0, "replicas": list(range(129))}]}}
    with pytest.raises(pydantic.ValidationError, match="partition 0 lists 129 replicas; at most 128 are allowed"):
        models.decode("topics", json.dumps(stored).encode())


def test_a_stored_manual_topic_with_more_partitions_than_a_topic_may_have_is_unreadable() -> None:
    rows = [{"id": index, "replicas": [0]} for index in range(models.MAX_PARTITIONS + 1)]
    stored = {"name": "t", "spec": {"replicaAssignment": rows}}
    with pytest.raises(pydantic.ValidationError, match="should have at most 100000 items after validation, not 100001"):
        models.decode("topics", json.dumps(stored).encode())
    assert models.Topic.model_validate({"name": "t", "spec": {"replicaAssignment": rows[:-1]}}).spec.partition_count() == models.MAX_PARTITIONS


# Fluvio's partition ids are u32 (a manual PartitionMap's id, a replica map's keys, the index a
# client parses from a partition's name): a larger one could not be shown to a Fluvio client.
LARGEST_PARTITION_ID = 2**32 - 1


def test_a_partition_id_fits_fluvio_s_32_bits() -> None:
    assert models.MAX_PARTITION_ID == LARGEST_PARTITION_ID
    too_large = LARGEST_PARTITION_ID + 1
    assert error_of(models.Topic, {"name": "t", "spec": {"replicaAssignment": [{"id": too_large, "replicas": [0]}]}}) == (
        "spec.replicaAssignment.0.id: Input should be less than or equal to 4294967295 (got 4294967296)"
    )
    assert error_of(
        models.Topic,
        {"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}, "status": {"replicaMap": {str(too_large): [0]}}},
    ).startswith("status.replicaMap.4294967296.[key]: Input should be less than or equal to 4294967295")
    message = error_of(models.Partition, {**PARTITION, "name": f"orders-{too_large}"})
    assert message.startswith(
        "name: partition name 'orders-4294967296' has index 4294967296, above 4294967295, the largest partition id "
        "(Fluvio's are 32-bit)"
    ), message
    for index in (10**10, 10**30):
        assert error_of(models.Partition, {**PARTITION, "name": f"orders-{index}"}).startswith(
            f"name: partition name 'orders-{index}' has index {index}, above 4294967295"
        )
    with pytest.raises(ValueError, match="has index 4294967296, above 4294967295"):
        models.split_partition_name(f"orders-{too_large}")
    # The largest is kept, in every place.
    assert models.Partition.model_validate({**PARTITION, "name": f"orders-{LARGEST_PARTITION_ID}"}).index == LARGEST_PARTITION_ID
    assert models.split_partition_name(f"orders-{LARGEST_PARTITION_ID}") == ("orders", LARGEST_PARTITION_ID)
    models.Topic.model_validate({"name": "t", "spec": {"replicaAssignment": [{"id": LARGEST_PARTITION_ID, "replicas": [0]}]}})
    models.Topic.model_validate(
        {"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}, "status": {"replicaMap": {str(LARGEST_PARTITION_ID): [0]}}}
    )


@pytest.mark.parametrize(
    ("kind", "document"),
    [
        ("partitions", {"name": "orders-4294967296", "spec": {"leader": 1, "replicas": [1]}}),
        ("topics", {"name": "t", "spec": {"replicaAssignment": [{"id": 2**32, "replicas": [0]}]}}),
        ("topics", {"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}, "status": {"replicaMap": {"4294967296": [0]}}}),
    ],
)
def test_a_stored_object_with_a_partition_id_past_32_bits_is_unreadable(kind: str, document: dict[str, Any]) -> None:
    """As an SPU id past 2^31 - 1 is: the Reader keeps the name as unreadable (deleting nothing),
    rather than hold an object it could not list to a Fluvio client."""
    with pytest.raises(pydantic.ValidationError, match="4294967295"):
        models.decode(kind, json.dumps(document).encode())


@pytest.mark.parametrize("strategy", ["kafka", "zoned", "my-placer-2", "my_pkg.placers:Zoned"])
def test_placement_strategy_is_built_in_a_plugin_name_or_a_stored_module_reference(strategy: str) -> None:
    """Whether a plug-in name is configured is not the model's to know; a module reference still
    loads (topics stored before plug-ins were configured by name) so the controller can refuse it."""
    topic = models.Topic.model_validate(with_spec(TOPIC, placement={"strategy": strategy}))
    assert topic.spec.placement is not None and topic.spec.placement.strategy == strategy


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ("manual", "spec.placement.strategy: placement strategy 'manual' is chosen by giving replicaAssignment instead of partitions"),
        ("My Placer", "spec.placement.strategy: placement strategy 'My Placer' is unknown: use one of computed, kafka, least-loaded, multi-level, policies, or the name of a placement plug-in configured on the SC (lowercase letters, digits and '-')"),
        ("-x", "spec.placement.strategy: placement strategy '-x' is unknown"),
    ],
)  # fmt: skip
def test_placement_strategy_rules(strategy: str, message: str) -> None:
    assert error_of(models.Topic, with_spec(TOPIC, placement={"strategy": strategy})).startswith(message)


def test_plugin_names_are_object_names_other_than_the_built_in_strategies() -> None:
    assert models.validate_plugin_name("zoned-2") == "zoned-2"
    for built_in in ("computed", "kafka", "least-loaded", "multi-level", "policies", "manual"):
        with pytest.raises(ValueError, match=f"placement plug-in name '{built_in}' is the name of a built-in strategy"):
            models.validate_plugin_name(built_in)
    with pytest.raises(ValueError, match="placement plug-in name 'a:B' is invalid"):
        models.validate_plugin_name("a:B")


@pytest.mark.parametrize(
    ("spec_changes", "message"),
    [
        ({"id": -1}, "spec.id: Input should be greater than or equal to 0 (got -1)"),
        ({"spuType": "Virtual"}, "spec.spuType: Input should be 'Custom' or 'Managed' (got 'Virtual')"),
        ({"publicEndpoint": {"host": "h", "port": 0}}, "spec.publicEndpoint.port: Input should be greater than or equal to 1 (got 0)"),
        ({"privateEndpoint": {"host": "", "port": 9006}}, "spec.privateEndpoint.host: String should have at least 1 character (got '')"),
        ({"rack": "/dc1//r1"}, "spec.rack: rack path '/dc1//r1' has an empty level"),
        ({"rack": " a"}, "spec.rack: rack ' a' must be non-empty"),
    ],
)
def test_spu_spec_rules(spec_changes: dict[str, Any], message: str) -> None:
    assert error_of(models.Spu, with_spec(SPU, **spec_changes)).startswith(message)


@pytest.mark.parametrize(
    ("model", "document", "message"),
    [
        (models.Spu, with_spec(SPU, rack="r" * 256), "spec.rack: String should have at most 255 characters"),
        (models.SpuGroup, with_spec(SPU_GROUP, rack="r" * 256), "spec.rack: String should have at most 255 characters"),
        (
            models.SpuGroup,
            with_spec(SPU_GROUP, storage={"logDir": "/" + "d" * 4096}),
            "spec.storage.logDir: String should have at most 4096 characters",
        ),
        (
            models.SpuGroup,
            with_spec(SPU_GROUP, storage={"size": "1" + "0" * 24}),
            "spec.storage.size: String should have at most 24 characters",
        ),
    ],
)
def test_strings_a_fluvio_client_is_shown_are_bounded(model: type[models.AnyObject], document: dict[str, Any], message: str) -> None:
    """An object with a string longer than Fluvio's (32,767 bytes) could be stored, but never listed
    to a Fluvio client: it was left out of every answer."""
    assert error_of(model, document).startswith(message)


# Characters a rack must not hold: controls (Cc: a newline, NUL, ESC and its terminal sequences),
# invisible format characters (Cf: bidirectional overrides, zero-width ones) and the line and
# paragraph separators (Zl, Zp), all of which reach logs, the live page and the audits.
UNPRINTABLE_RACKS = [
    ("r1\nr2", "'\\n' (U+000A, Cc)"),
    ("r\x00", "'\\x00' (U+0000, Cc)"),
    ("\x1b[31mred", "'\\x1b' (U+001B, Cc)"),
    ("r\x7f", "'\\x7f' (U+007F, Cc)"),
    ("r\x85", "'\\x85' (U+0085, Cc)"),
    ("/dc1/\u202er1", "'\\u202e' (U+202E, Cf)"),
    ("r\u200b1", "'\\u200b' (U+200B, Cf)"),
    ("r\u2028", "'\\u2028' (U+2028, Zl)"),
    ("r\u2029", "'\\u2029' (U+2029, Zp)"),
]


@pytest.mark.parametrize(("rack", "character"), UNPRINTABLE_RACKS)
@pytest.mark.parametrize(("model", "document"), [(models.Spu, SPU), (models.SpuGroup, SPU_GROUP)])
def test_a_rack_is_printable(model: type[models.AnyObject], document: dict[str, Any], rack: str, character: str) -> None:
    """A rack ends up in logs, the live page and the audits: a control or invisible character in it
    is refused, the value quoted with repr (so the character shows, escaped) with the rule."""
    message = error_of(model, with_spec(document, rack=rack))
    assert message.startswith(
        f"spec.rack: rack {rack!r} holds the character {character}: a rack may hold no control, "
        "format or line-separator character"
    )
    assert rack not in message  # only escaped


@pytest.mark.parametrize("rack", ["r1 r2", "zone-\u00e9", "/dc\u00a01/r1", "\U0001f600", "\ue000"])
def test_a_rack_may_hold_any_printable_character(rack: str) -> None:
    assert models.Spu.model_validate(with_spec(SPU, rack=rack)).spec.rack == rack


@pytest.mark.parametrize("kind", ["spus", "spu-groups"])
def test_a_stored_object_with_an_unprintable_rack_is_unreadable(kind: str) -> None:
    """As over the MAX_RACK_LENGTH: the Reader keeps such a name as unreadable (nothing it owns is
    deleted), and says why."""
    document = with_spec(SPU if kind == "spus" else SPU_GROUP, rack="r1\x1b[2J")
    with pytest.raises(pydantic.ValidationError) as raised:
        models.decode(kind, json.dumps(document).encode())
    assert "rack 'r1\\x1b[2J' holds the character" in models.describe_validation_error(raised.value)


def test_spu_requires_endpoints() -> None:
    document = {"name": "s", "spec": {"id": 1}}
    assert error_of(models.Spu, document) == "spec.publicEndpoint: field required; spec.privateEndpoint: field required"


@pytest.mark.parametrize(
    ("spec_changes", "message"),
    [
        ({"replicas": -1}, "spec.replicas: Input should be greater than or equal to 0 (got -1)"),
        ({"minId": -5}, "spec.minId: Input should be greater than or equal to 0 (got -5)"),
        ({"minId": 2**31 - 2, "replicas": 3}, "spec: minId 2147483646 with 3 replicas would need id 2147483648"),
        ({"storage": {"size": "lots"}}, "spec.storage.size: String should match pattern"),
    ],
)
def test_spu_group_spec_rules(spec_changes: dict[str, Any], message: str) -> None:
    assert error_of(models.SpuGroup, with_spec(SPU_GROUP, **spec_changes)).startswith(message)


@pytest.mark.parametrize(
    ("spec_changes", "message"),
    [
        ({"rack": ""}, "spec.rack: rack '' must be non-empty"),
        ({"rack": " a"}, "spec.rack: rack ' a' must be non-empty"),
        ({"rack": "/"}, "spec.rack: rack path '/' has an empty level"),
        ({"rack": "/dc1//r1"}, "spec.rack: rack path '/dc1//r1' has an empty level"),
        ({"host": "a b"}, "spec.host: host 'a b' must not contain whitespace"),
        # A host is shown in logs, on the live page and in SPU lists, as a rack is.
        ({"host": "spu\x1b[2Jx"}, "spec.host: host 'spu\\x1b[2Jx' holds the character '\\x1b' (U+001B, Cc)"),
        ({"host": "spu\u202eevil"}, "spec.host: host 'spu\\u202eevil' holds the character '\\u202e' (U+202E, Cf)"),
    ],
)
def test_spu_group_rack_and_host_follow_the_rules_of_the_spus_it_makes(spec_changes: dict[str, Any], message: str) -> None:
    """The group's rack and host become its SPUs': a value an SPU refuses, stored on a group, would
    make the group controller raise at every pass and the group never get its SPUs."""
    assert error_of(models.SpuGroup, with_spec(SPU_GROUP, **spec_changes)).startswith(message)


@pytest.mark.parametrize(
    ("document_changes", "message"),
    [
        ({"spec": {"leader": 3, "replicas": [1, 2]}}, "spec: leader 3 is not one of the replicas [1, 2]"),
        ({"spec": {"leader": 1, "replicas": [1, 1]}}, "spec: replicas [1, 1] list an SPU more than once"),
        ({"spec": {"leader": 1, "replicas": []}}, "spec.replicas: List should have at least 1 item after validation, not 0 (got [])"),
        ({"name": "orders"}, "name: partition name 'orders' is not of the form <topic>-<index>"),
        ({"name": "Orders-1"}, "name: partition's topic name 'Orders' is invalid"),
        ({"name": "orders-01"}, "name: partition name 'orders-01' is not of the form <topic>-<index>"),
        ({"status": {"resolution": "Online", "lrs": -1}}, "status.lrs: Input should be greater than or equal to 0 (got -1)"),
        ({"status": {"resolution": "Gone"}}, "status.resolution: Input should be 'Offline', 'Online' or 'LeaderOffline' (got 'Gone')"),
        # Offsets are 64-bit, as on Fluvio's wire: a larger one could not be listed to a Fluvio client.
        (
            {"status": {"leader": {"spu": 1, "hw": 2**63, "leo": 2**63}}},
            "status.leader.hw: Input should be less than or equal to 9223372036854775807 (got 9223372036854775808)",
        ),
        ({"status": {"isr": [1, 1]}}, "status.isr: isr [1, 1] lists an SPU more than once (got [1, 1])"),
        ({"status": {"leaderEpoch": -1}}, "status.leaderEpoch: Input should be greater than or equal to 0 (got -1)"),
        (
            {"status": {"leaderEpoch": 2**63}},
            "status.leaderEpoch: Input should be less than or equal to 9223372036854775807 (got 9223372036854775808)",
        ),
    ],
)
def test_partition_rules(document_changes: dict[str, Any], message: str) -> None:
    assert error_of(models.Partition, {**PARTITION, **document_changes}).startswith(message)


def test_partition_name_parts() -> None:
    partition = models.Partition.model_validate({**PARTITION, "name": "my-topic-12"})
    assert (partition.topic, partition.index) == ("my-topic", 12)
    assert models.partition_name("my-topic", 12) == "my-topic-12"


def test_unknown_kind_is_named() -> None:
    with pytest.raises(ValueError, match="unknown kind 'widgets': use one of spus, spu-groups, topics, partitions"):
        models.model_for_kind("widgets")


def test_models_are_immutable() -> None:
    topic = models.Topic.model_validate(TOPIC)
    with pytest.raises(pydantic.ValidationError):
        topic.name = "other"  # type: ignore[misc]  # the assignment is the test: a frozen model refuses it
    changed = topic.model_copy(update={"status": models.TopicStatus(resolution=models.TopicResolution.PENDING)})
    assert (topic.status.resolution, changed.status.resolution) == ("Provisioned", "Pending")


names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
replica_lists = st.lists(st.integers(0, 10_000), min_size=1, max_size=5, unique=True)


@given(
    name=names,
    replicas=replica_lists,
    hw=st.integers(-1, 2**40),
    resolution=st.sampled_from(list(models.PartitionResolution)),
)
def test_partition_round_trip_property(name: str, replicas: list[int], hw: int, resolution: models.PartitionResolution) -> None:
    partition = models.Partition(
        name=models.partition_name(name, len(replicas)),
        spec=models.PartitionSpec(leader=replicas[-1], replicas=replicas),
        status=models.PartitionStatus(
            resolution=resolution,
            leader=models.ReplicaStatus(spu=replicas[-1], hw=hw, leo=hw),
            replicas=[models.ReplicaStatus(spu=spu) for spu in replicas[:-1]],
            lrs=len(replicas) - 1,
        ),
    )
    assert models.decode("partitions", models.encode(partition)) == partition


@given(
    name=names,
    partitions=st.integers(1, 1000),
    replication_factor=st.integers(1, 10),
    replica_map=st.dictionaries(st.integers(0, 1000), replica_lists, max_size=5),
)
def test_topic_round_trip_property(name: str, partitions: int, replication_factor: int, replica_map: dict[int, list[int]]) -> None:
    topic = models.Topic(
        name=name,
        spec=models.TopicSpec(partitions=partitions, replication_factor=replication_factor),
        status=models.TopicStatus(resolution=models.TopicResolution.PROVISIONED, replica_map=replica_map),
    )
    encoded = models.encode(topic)
    assert models.decode("topics", encoded) == topic
    assert models.encode(models.decode("topics", encoded)) == encoded


def test_the_interner_shares_equal_parts_without_changing_any_value() -> None:
    interner = models.Interner()
    encoded = [
        models.encode(models.Partition(name=f"orders-{index}", spec=models.PartitionSpec(leader=1, replicas=[1, 2, 3])))
        for index in range(3)
    ]
    first, second, third = (interner.intern(models.decode("partitions", value)) for value in encoded)
    assert first.spec is second.spec is third.spec
    assert first.status is second.status
    assert [models.encode(obj) for obj in (first, second, third)] == encoded
    # Copies made from an interned object are independent of the shared parts.
    online = first.model_copy(update={"status": models.PartitionStatus(resolution=models.PartitionResolution.ONLINE)})
    assert second.status.resolution is models.PartitionResolution.OFFLINE
    assert online.model_fields_set == {"name", "spec", "status"}
    assert second.model_fields_set == {"name", "spec", "status"}
    # A status with offsets is kept as it is; other kinds pass through untouched.
    reported = models.Partition(
        name="orders-9",
        spec=models.PartitionSpec(leader=1, replicas=[1]),
        status=models.PartitionStatus(resolution=models.PartitionResolution.ONLINE, leader=models.ReplicaStatus(spu=1, hw=3, leo=4)),
    )
    assert interner.intern(reported).status is reported.status
    topic = models.Topic(name="orders", spec=models.TopicSpec(partitions=1, replication_factor=1))
    assert interner.intern(topic) is topic


def test_the_interner_keeps_nothing_its_objects_no_longer_use() -> None:
    """Partitions come and go (topics deleted, leaders elected at ever higher epochs): the shared
    parts of those gone must not stay in the interner's tables, or a long-running SC grows with
    every replica list and every leaderless epoch it ever saw."""
    interner = models.Interner()
    kept = []
    for index in range(2000):
        gone = interner.intern(
            models.decode(
                "partitions",
                models.encode(
                    models.Partition(
                        name=f"t-{index}",
                        spec=models.PartitionSpec(leader=index, replicas=[index, index + 1]),
                        status=models.PartitionStatus(resolution=models.PartitionResolution.OFFLINE, leader_epoch=index + 1),
                    )
                ),
            )
        )
        if index % 500 == 0:
            kept.append(gone)
        del gone
    gc.collect()
    assert len(interner) == 2 * len(kept)  # a spec and a status each, for the four still held
    # What is still held is still shared.
    assert all(interner.intern(models.decode("partitions", models.encode(obj))).spec is obj.spec for obj in kept)


@given(
    index=st.integers(min_value=0, max_value=10_000),
    replicas=st.lists(st.integers(min_value=0, max_value=1_000), min_size=1, max_size=7, unique=True),
)
def test_new_partition_is_the_validated_partition(index: int, replicas: list[int]) -> None:
    topic = models.Topic(name="orders", spec=models.TopicSpec(partitions=1, replication_factor=1))
    built = models.new_partition(topic, index, replicas)
    assert built.uid is not None and 1 <= built.uid <= models.MAX_PARTITION_UID
    validated = models.Partition(
        name=f"orders-{index}", uid=built.uid, spec=models.PartitionSpec(leader=replicas[0], replicas=replicas)
    )
    assert built == validated
    assert models.encode(built) == models.encode(validated)
    assert models.decode("partitions", models.encode(built)) == built


@pytest.mark.parametrize(
    ("replicas", "message"),
    [([], "replicas"), ([1, 1], "replicas [1, 1] list an SPU more than once"), ([-1], "replicas.0")],
)
def test_new_partition_rejects_what_the_model_rejects(replicas: list[int], message: str) -> None:
    topic = models.Topic(name="orders", spec=models.TopicSpec(partitions=1, replication_factor=1))
    with pytest.raises(pydantic.ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        models.new_partition(topic, 0, replicas)


def test_new_partition_refuses_an_index_past_32_bits() -> None:
    """Its fast path builds the name unchecked: the index is bounded as the name's is."""
    topic = models.Topic(name="orders", spec=models.TopicSpec(partitions=1, replication_factor=1))
    assert models.new_partition(topic, models.MAX_PARTITION_ID, [1]).index == models.MAX_PARTITION_ID
    with pytest.raises(ValueError, match="partition index 4294967296 is not an integer from 0 to 4294967295"):
        models.new_partition(topic, 2**32, [1])


@pytest.mark.parametrize(
    ("replica_map", "message"),
    [
        ({"0": []}, "replicaMap row 0 lists no SPU"),
        ({"0": [1, 1]}, "replicaMap row 0 lists SPU 1 more than once"),
        ({"-1": [1]}, "replicaMap.-1"),
        ({"0": [-2]}, "replicaMap.0.0"),
    ],
)
def test_a_replica_map_row_that_cannot_be_a_partition_is_refused_with_the_value(replica_map: dict[str, list[int]], message: str) -> None:
    """The topic controller creates a partition per row: a row no partition can have (stored by
    hand) would make it fail on every pass. The topic is refused as malformed instead, and an SC
    that cannot read a topic deletes nothing it owns."""
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        models.Topic.model_validate(
            {"name": "t", "spec": {"partitions": 1, "replicationFactor": 1}, "status": {"resolution": "Provisioned", "replicaMap": replica_map}}
        )


def test_a_stored_topic_with_policies_past_the_limit_is_unreadable() -> None:
    """Policies are parsed at each placement of the topic: a stored topic may not carry megabytes
    of them (the Reader keeps it as unreadable, saying why)."""
    policies = "node=balanced;" * (models.MAX_POLICIES_LENGTH // 14 + 1)
    document = with_spec(TOPIC, placement={"strategy": "policies", "policies": policies})
    with pytest.raises(pydantic.ValidationError) as raised:
        models.decode("topics", json.dumps(document).encode())
    message = models.describe_validation_error(raised.value)
    assert f"at most {models.MAX_POLICIES_LENGTH} characters" in message and len(message) < 400, message


def test_each_partition_created_has_an_identity_of_its_own() -> None:
    """Drawn at random when the SC creates the partition: a partition deleted and created again
    under its name is another one, and any copy of the store keeps each one's (it is in the object)."""
    topic = models.Topic(name="orders", spec=models.TopicSpec(partitions=1, replication_factor=1))
    uids = [models.new_partition(topic, 0, [1, 2]).uid for _ in range(1000)]
    assert len(set(uids)) == 1000 and all(uid is not None and 1 <= uid <= 2**63 - 1 for uid in uids)
    # The validated path (replicas the fast path does not take) draws one too.
    assert models.new_partition(topic, 0, [True, 2]).uid is not None  # coerced, as the model does
    partition = models.new_partition(topic, 3, [1, 2])
    assert models.decode("partitions", models.encode(partition)).uid == partition.uid
    assert b'"uid":' in models.encode(partition)


def test_a_partition_without_a_uid_is_read_as_one_without_an_identity() -> None:
    """Written by an SC older than the field (or by anyone): valid, with no identity, and written
    back as it was."""
    raw = b'{"name":"orders-0","spec":{"leader":1,"replicas":[1,2]}}'
    partition = models.decode("partitions", raw)
    assert partition.uid is None
    assert b"uid" not in models.encode(partition)


@pytest.mark.parametrize(
    ("uid", "problem"),
    [
        ("0", "greater than or equal to 1"),
        ("-5", "greater than or equal to 1"),
        (str(2**63), "less than or equal to 9223372036854775807"),
        ('"12"', "valid integer"),
        ("1.5", "valid integer"),
        ("true", "valid integer"),
    ],
)
def test_a_stored_partition_with_an_odd_uid_is_refused_like_any_invalid_object(uid: str, problem: str) -> None:
    raw = b'{"name":"orders-0","uid":%s,"spec":{"leader":1,"replicas":[1,2]}}' % uid.encode()
    with pytest.raises(pydantic.ValidationError, match=problem):
        models.decode("partitions", raw)


def test_the_interner_shares_no_identity() -> None:
    """Partitions of one replica list share their spec (the identity is beside it, not in it):
    each keeps its own uid."""
    interner = models.Interner()
    topic = models.Topic(name="orders", spec=models.TopicSpec(partitions=3, replication_factor=2))
    created = [models.new_partition(topic, index, [1, 2]) for index in range(3)]
    read = [interner.intern(models.decode("partitions", models.encode(partition))) for partition in created]
    assert [partition.uid for partition in read] == [partition.uid for partition in created]  # type: ignore[attr-defined]  # decode is typed for any kind: these are partitions
    assert read[0].spec is read[1].spec is read[2].spec
    assert [models.encode(partition) for partition in read] == [models.encode(partition) for partition in created]
