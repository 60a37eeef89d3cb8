"""Our objects as Fluvio items, and Fluvio create requests as our objects (or the error the client sees)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from controller.api.fluvio import mapping, messages, objects as fluvio_objects, primitives
from store import models
from tests import builders

Error = messages.Error


def refused(call: Callable[..., object], *args: object) -> mapping.Refused:
    with pytest.raises(mapping.Refused) as caught:
        call(*args)
    return caught.value


# ---------------------------------------------------------------------------- items


def test_a_computed_topic_item() -> None:
    topic = models.Topic.model_validate(
        {
            "name": "orders",
            "spec": {"partitions": 2, "replicationFactor": 2, "ignoreRackAssignment": True, "placement": {"strategy": "kafka"}},
            "status": {"resolution": "Provisioned", "replicaMap": {"1": [2, 0], "0": [0, 1]}},
        }
    )
    assert mapping.topic_item(topic) == fluvio_objects.Metadata(
        "orders",
        fluvio_objects.TopicSpec(fluvio_objects.ComputedReplicas(2, 2, True)),
        fluvio_objects.TopicStatus(fluvio_objects.TopicResolution.PROVISIONED, {0: [0, 1], 1: [2, 0]}, {}, ""),
    )


def test_a_manual_topic_item_with_its_reason() -> None:
    topic = models.Topic.model_validate(
        {
            "name": "manual",
            "spec": {"replicaAssignment": [{"id": 0, "replicas": [3, 1]}]},
            "status": {"resolution": "InvalidConfig", "reason": "SPU 3 is not registered"},
        }
    )
    assert mapping.topic_item(topic) == fluvio_objects.Metadata(
        "manual",
        fluvio_objects.TopicSpec(fluvio_objects.AssignedReplicas([fluvio_objects.PartitionMap(0, [3, 1])])),
        fluvio_objects.TopicStatus(fluvio_objects.TopicResolution.INVALID_CONFIG, {}, {}, "SPU 3 is not registered"),
    )


def test_partition_items_with_and_without_a_leader_status() -> None:
    fresh = models.Partition.model_validate({"name": "orders-3", "spec": {"leader": 2, "replicas": [2, 0]}})
    assert mapping.partition_item(fresh) == fluvio_objects.Metadata(
        "orders-3",
        fluvio_objects.PartitionSpec(2, [2, 0]),
        fluvio_objects.PartitionStatus(leader=fluvio_objects.ReplicaStatus(2, -1, -1), resolution=fluvio_objects.PartitionResolution.OFFLINE, lrs=0, replicas=[]),
    )
    serving = models.Partition.model_validate(
        {
            "name": "orders-3",
            "spec": {"leader": 2, "replicas": [2, 0]},
            "status": {
                "resolution": "Online",
                "leader": {"spu": 2, "hw": 7, "leo": 9},
                "replicas": [{"spu": 0, "hw": 7, "leo": 7}],
                "lrs": 2,
            },
        }
    )
    assert mapping.partition_item(serving).status == fluvio_objects.PartitionStatus(
        leader=fluvio_objects.ReplicaStatus(2, 7, 9),
        resolution=fluvio_objects.PartitionResolution.ONLINE,
        lrs=2,
        replicas=[fluvio_objects.ReplicaStatus(0, 7, 7)],
    )


def test_spu_items_advertise_an_ip_or_a_hostname() -> None:
    by_ip = builders.spu(5001, resolution="Offline", rack="r1", host="10.0.0.1")
    assert mapping.spu_item(by_ip) == fluvio_objects.Metadata(
        "spu-5001",
        fluvio_objects.SpuSpec(
            5001, fluvio_objects.SpuType.CUSTOM, fluvio_objects.IngressPort(9005, [fluvio_objects.IngressAddr(ip="10.0.0.1")]), fluvio_objects.Endpoint(9006, "10.0.0.1"), "r1"
        ),
        fluvio_objects.SpuStatus(fluvio_objects.SpuResolution.OFFLINE),
    )
    by_name = builders.spu(7, resolution="Init", host="spu-7.cluster.local", spu_type="Managed")
    item = mapping.spu_item(by_name)
    assert item.spec.spu_type is fluvio_objects.SpuType.MANAGED
    assert item.spec.public_endpoint.ingress == [fluvio_objects.IngressAddr(hostname="spu-7.cluster.local")]
    assert item.status == fluvio_objects.SpuStatus(fluvio_objects.SpuResolution.INIT)


def test_custom_spu_items_and_which_spus_they_show() -> None:
    custom = builders.spu(5001)
    assert mapping.custom_spu_item(custom) == fluvio_objects.Metadata(
        "spu-5001",
        fluvio_objects.CustomSpuSpec(5001, fluvio_objects.IngressPort(9005, [fluvio_objects.IngressAddr(ip="127.0.0.1")]), fluvio_objects.Endpoint(9006, "127.0.0.1")),
        fluvio_objects.SpuStatus(fluvio_objects.SpuResolution.ONLINE),
    )
    kind, keep, _ = mapping.ITEMS[fluvio_objects.CUSTOM_SPU]
    assert kind == "spus" and keep is not None
    assert (keep(custom), keep(builders.spu(1, spu_type="Managed"))) == (True, False)


def test_an_spu_group_item() -> None:
    group = models.SpuGroup.model_validate(
        {
            "name": "main",
            "spec": {"replicas": 3, "minId": 5000, "rack": "r2", "storage": {"logDir": "/data", "size": "2Gi"}},
            "status": {"resolution": "Invalid", "reason": "id 5001 is taken"},
        }
    )
    assert mapping.spu_group_item(group) == fluvio_objects.Metadata(
        "main",
        fluvio_objects.SpuGroupSpec(3, 5000, fluvio_objects.SpuConfig(rack="r2", storage=fluvio_objects.SpuStorageConfig("/data", "2Gi"))),
        fluvio_objects.SpuGroupStatus(fluvio_objects.SpuGroupResolution.INVALID, "id 5001 is taken"),
    )
    reserved = group.model_copy(update={"status": models.SpuGroupStatus(resolution=models.SpuGroupResolution.RESERVED)})
    assert mapping.spu_group_item(reserved).status == fluvio_objects.SpuGroupStatus(fluvio_objects.SpuGroupResolution.RESERVED, None)


# ---------------------------------------------------------------------------- topic creates


COMPUTED = fluvio_objects.TopicSpec(fluvio_objects.ComputedReplicas(3, 2, False))


def test_a_computed_topic_create() -> None:
    assert mapping.topic_from_create("orders", COMPUTED) == models.Topic.model_validate(
        {"name": "orders", "spec": {"partitions": 3, "replicationFactor": 2}}
    )


def test_an_assigned_topic_create() -> None:
    spec = fluvio_objects.TopicSpec(fluvio_objects.AssignedReplicas([fluvio_objects.PartitionMap(0, [1, 2]), fluvio_objects.PartitionMap(1, [2, 1])]))
    assert mapping.topic_from_create("manual", spec).spec.replica_assignment == [
        models.PartitionAssignment(id=0, replicas=[1, 2]),
        models.PartitionAssignment(id=1, replicas=[2, 1]),
    ]


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (
            fluvio_objects.TopicSpec(fluvio_objects.ComputedReplicas(0, 1)),
            Error.TOPIC_ERROR,
            "spec.partitions: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            fluvio_objects.TopicSpec(fluvio_objects.ComputedReplicas(70_000, 1)),
            Error.TOPIC_ERROR,
            "70000 partitions cannot be described over Fluvio's protocol (its replica map holds at most 65535); "
            "create the topic through the HTTP API instead",
        ),
        (
            fluvio_objects.TopicSpec(fluvio_objects.AssignedReplicas([fluvio_objects.PartitionMap(0, [-1])])),
            Error.TOPIC_ERROR,
            "spec.replicaAssignment.0.replicas.0: Input should be greater than or equal to 0 (got -1)",
        ),
        (
            # A row longer than the largest replication factor, as over HTTP.
            fluvio_objects.TopicSpec(fluvio_objects.AssignedReplicas([fluvio_objects.PartitionMap(0, list(range(129)))])),
            Error.TOPIC_ERROR,
            "spec.replicaAssignment: partition 0 lists 129 replicas; at most 128 are allowed (the largest replication factor) "
            "(got [{'id': 0, 'replicas': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46... (560 characters))",
        ),
        (
            fluvio_objects.TopicSpec(fluvio_objects.MirrorReplicas(fluvio_objects.HomeMirrorConfig([]))),
            Error.TOPIC_INVALID_REPLICA_TYPE,
            "mirror topics are not supported by this SC: use computed or assigned replicas",
        ),
        (
            fluvio_objects.TopicSpec(fluvio_objects.AssignedReplicas([fluvio_objects.PartitionMap(0, [1], fluvio_objects.HomePartitionConfig("c", "r"))])),
            Error.TOPIC_INVALID_REPLICA_TYPE,
            "partitions [0] carry a mirror configuration, which this SC does not support",
        ),
    ],
)
def test_topic_creates_our_models_cannot_hold(spec: fluvio_objects.TopicSpec, code: Error, message: str) -> None:
    failure = refused(mapping.topic_from_create, "t", spec)
    assert (failure.code, failure.message) == (code, message)


@pytest.mark.parametrize("name", ["Orders", "-orders", "a" * 64, "orders_1", ""])
def test_invalid_topic_names(name: str) -> None:
    failure = refused(mapping.check_topic_name, name)
    assert failure.code is Error.TOPIC_INVALID_NAME and repr(name) in failure.message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cleanup_policy": fluvio_objects.SegmentCleanup(9)}, "retention time 9 s is below the minimum of 10 s"),
        ({"storage": fluvio_objects.TopicStorageConfig(segment_size=1023)}, "segment size 1023 bytes is below the minimum of 1024 bytes"),
        (
            {"storage": fluvio_objects.TopicStorageConfig(segment_size=4096, max_partition_size=2047)},
            "max partition size 2047 bytes is below the minimum of 2048 bytes",
        ),
        (
            {"storage": fluvio_objects.TopicStorageConfig(max_partition_size=1_000_000)},
            "max partition size 1000000 bytes is below the segment size of 1073741824 bytes",
        ),
        (
            {"deduplication": fluvio_objects.Deduplication(fluvio_objects.Bounds(5), fluvio_objects.Filter(fluvio_objects.Transform("dedup-filter")))},
            "deduplication runs a SmartModule, and this SC does not run SmartModules: create the topic without it",
        ),
        ({"system": True}, "system topics are the cluster's own; create the topic with system = false"),
    ],
)
def test_storage_settings_are_checked_as_fluvio_checks_them(change: dict[str, Any], message: str) -> None:
    import dataclasses

    failure = refused(mapping.check_topic_config, dataclasses.replace(COMPUTED, **change))
    assert (failure.code, failure.message) == (Error.TOPIC_INVALID_CONFIGURATION, message)


def test_acceptable_storage_settings_pass() -> None:
    spec = fluvio_objects.TopicSpec(
        fluvio_objects.ComputedReplicas(3, 1, True),
        cleanup_policy=fluvio_objects.SegmentCleanup(3600),
        storage=fluvio_objects.TopicStorageConfig(segment_size=10_000_000, max_partition_size=10_000_000),
        compression_type=fluvio_objects.Compression.ZSTD,
    )
    mapping.check_topic_config(spec)  # raises if refused
    assert mapping.topic_from_create("b-topic", spec).spec.partitions == 3


# ---------------------------------------------------------------------------- SPU and SPU group creates


def custom_spec(**change: Any) -> fluvio_objects.CustomSpuSpec:
    import dataclasses

    spec = fluvio_objects.CustomSpuSpec(
        5001, fluvio_objects.IngressPort(9010, [fluvio_objects.IngressAddr(ip="127.0.0.1")]), fluvio_objects.Endpoint(9011, "127.0.0.1"), rack="r1"
    )
    return dataclasses.replace(spec, **change)


def test_a_custom_spu_register() -> None:
    assert mapping.spu_from_create("custom-spu-5001", custom_spec()) == models.Spu.model_validate(
        {
            "name": "custom-spu-5001",
            "spec": {
                "id": 5001,
                "spuType": "Custom",
                "rack": "r1",
                "publicEndpoint": {"host": "127.0.0.1", "port": 9010},
                "privateEndpoint": {"host": "127.0.0.1", "port": 9011},
            },
        }
    )
    by_hostname = custom_spec(public_endpoint=fluvio_objects.IngressPort(9010, [fluvio_objects.IngressAddr(hostname="spu.example")]))
    assert mapping.spu_from_create("s", by_hostname).spec.public_endpoint == models.Endpoint(host="spu.example", port=9010)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"public_endpoint_local": fluvio_objects.Endpoint(1, "h")}, "publicEndpointLocal is not supported by this SC: register the SPU without it"),
        (
            {"private_endpoint": fluvio_objects.Endpoint(9011, "127.0.0.1", fluvio_objects.Encryption.SSL)},
            "the private endpoint asks for SSL encryption; this SC supports PLAINTEXT only",
        ),
        (
            {"public_endpoint": fluvio_objects.IngressPort(9010, [fluvio_objects.IngressAddr(ip="a"), fluvio_objects.IngressAddr(ip="b")])},
            "the public endpoint must have exactly one ingress address (ip or hostname), got 2",
        ),
        ({"public_endpoint": fluvio_objects.IngressPort(9010, [fluvio_objects.IngressAddr()])}, "the public endpoint's ingress address has neither an ip nor a hostname"),
        ({"id": -1}, "spec.id: Input should be greater than or equal to 0 (got -1)"),
        ({"private_endpoint": fluvio_objects.Endpoint(0, "127.0.0.1")}, "spec.privateEndpoint.port: Input should be greater than or equal to 1 (got 0)"),
    ],
)
def test_custom_spus_our_models_cannot_hold(change: dict[str, object], message: str) -> None:
    failure = refused(mapping.spu_from_create, "custom-spu-5001", custom_spec(**change))
    assert (failure.code, failure.message) == (Error.SPU_ERROR, message)


def test_an_spu_group_create() -> None:
    spec = fluvio_objects.SpuGroupSpec(3, 5000, fluvio_objects.SpuConfig(rack="r1", storage=fluvio_objects.SpuStorageConfig(size="10Gi")))
    assert mapping.spu_group_from_create("main", spec) == models.SpuGroup.model_validate(
        {"name": "main", "spec": {"replicas": 3, "minId": 5000, "rack": "r1", "storage": {"size": "10Gi"}}}
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (fluvio_objects.SpuConfig(env=[fluvio_objects.EnvVar("RUST_LOG", "debug")]), "environment variables (RUST_LOG) are not supported by this SC: leave env empty"),
        (
            fluvio_objects.SpuConfig(replication=fluvio_objects.ReplicationConfig(2)),
            "replication.inSyncReplicaMin 2 is not supported by this SC: leave it unset",
        ),
        (
            fluvio_objects.SpuConfig(storage=fluvio_objects.SpuStorageConfig(size="10G")),
            "spec.storage.size: String should match pattern '^[1-9][0-9]*(Ki|Mi|Gi|Ti)?$' (got '10G')",
        ),
    ],
)
def test_spu_groups_our_models_cannot_hold(config: fluvio_objects.SpuConfig, message: str) -> None:
    failure = refused(mapping.spu_group_from_create, "main", fluvio_objects.SpuGroupSpec(3, 5000, config))
    assert (failure.code, failure.message) == (Error.SPU_ERROR, message)


def test_the_longest_strings_an_spu_or_group_may_hold_fit_fluvio_s_strings() -> None:
    """Racks and log directories are bounded so that every stored SPU and group can be listed: an
    object with a longer string than the protocol's (32,767 bytes) used to be left out of answers."""
    wide = "\U0001f600"  # four bytes of UTF-8
    longest_rack = wide * models.MAX_RACK_LENGTH
    spu = builders.spu(1, rack=longest_rack)
    group = models.SpuGroup.model_validate(
        {
            "name": "main",
            "spec": {
                "replicas": 1,
                "rack": longest_rack,
                "storage": {"logDir": wide * models.MAX_LOG_DIR_LENGTH, "size": "9" * 22 + "Gi"},
            },
        }
    )
    for label, obj in ((fluvio_objects.SPU, spu), (fluvio_objects.CUSTOM_SPU, spu), (fluvio_objects.SPU_GROUP, group)):
        _, _, item = mapping.ITEMS[label]
        assert fluvio_objects.encode_metadata(label, item(obj), messages.OBJECT_MAX_VERSION)


RACK_RULE = "a rack may hold no control, format or line-separator character"


def test_an_spu_or_group_with_an_unprintable_rack_is_refused() -> None:
    """A rack is logged and shown: a control or invisible character in it is refused, escaped."""
    failure = refused(mapping.spu_from_create, "custom-spu-5001", custom_spec(rack="r1\x1b[2J"))
    assert (failure.code, failure.message) == (
        Error.SPU_ERROR,
        f"spec.rack: rack 'r1\\x1b[2J' holds the character '\\x1b' (U+001B, Cc): {RACK_RULE} (got 'r1\\x1b[2J')",
    )
    spec = fluvio_objects.SpuGroupSpec(3, 5000, fluvio_objects.SpuConfig(rack="/dc1/\u202er1"))
    failure = refused(mapping.spu_group_from_create, "main", spec)
    assert (failure.code, failure.message) == (
        Error.SPU_ERROR,
        f"spec.rack: rack '/dc1/\\u202er1' holds the character '\\u202e' (U+202E, Cf): {RACK_RULE} (got '/dc1/\\u202er1')",
    )


def test_the_largest_partition_id_can_be_shown_to_a_fluvio_client_and_no_larger_one_can() -> None:
    """Fluvio carries partition ids as u32 (a PartitionMap's id, a replica map's key) and its client
    parses a partition's name's index as one: the models stop there."""
    largest = models.MAX_PARTITION_ID
    topic = models.Topic.model_validate(
        {
            "name": "t",
            "spec": {"replicaAssignment": [{"id": largest, "replicas": [1]}]},
            "status": {"resolution": "InvalidConfig", "replicaMap": {str(largest): [1]}},
        }
    )
    partition = models.Partition.model_validate({"name": f"t-{largest}", "spec": {"leader": 1, "replicas": [1]}})
    for label, obj in ((fluvio_objects.TOPIC, topic), (fluvio_objects.PARTITION, partition)):
        _, _, item = mapping.ITEMS[label]
        assert fluvio_objects.encode_metadata(label, item(obj), messages.OBJECT_MAX_VERSION)
    too_large = topic.model_copy(
        update={"spec": topic.spec.model_copy(update={"replica_assignment": [models.PartitionAssignment.model_construct(id=largest + 1, replicas=[1])]})}
    )
    with pytest.raises(primitives.EncodeError, match="u32 must be a whole number in \\[0, 4294967295\\], got 4294967296"):
        fluvio_objects.encode_metadata(fluvio_objects.TOPIC, mapping.topic_item(too_large), messages.OBJECT_MAX_VERSION)
