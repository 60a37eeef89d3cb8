"""Our objects (store.models) as Fluvio Metadata items, and Fluvio create requests as our objects.

Purely computational, no I/O. What our models cannot hold is refused with the Fluvio error code and a
message naming the value; a topic's storage settings (retention, segment and partition sizes,
compression) are checked as Fluvio checks them but not kept: our topics have no such fields yet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pydantic

from controller.api.fluvio import messages, objects
from store import models

# Fluvio's own limits on a topic's storage settings (fluvio-wire.md §6).
MIN_RETENTION_SECONDS = 10
MIN_SEGMENT_BYTES = 1024
MIN_PARTITION_BYTES = 2048
DEFAULT_SEGMENT_BYTES = 1024**3
# TopicStatus.replica_map is a BTreeMap with a u16 count on the wire.
MAX_WIRE_PARTITIONS = 0xFFFF


class Refused(Exception):
    """A request our models cannot represent, as the Fluvio error the client should see."""

    def __init__(self, code: messages.Error, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_TOPIC_RESOLUTION = {resolution: objects.TopicResolution[resolution.name] for resolution in models.TopicResolution}
_PARTITION_RESOLUTION = {resolution: objects.PartitionResolution[resolution.name] for resolution in models.PartitionResolution}
_SPU_RESOLUTION = {resolution: objects.SpuResolution[resolution.name] for resolution in models.SpuResolution}
_GROUP_RESOLUTION = {resolution: objects.SpuGroupResolution[resolution.name] for resolution in models.SpuGroupResolution}


# ---------------------------------------------------------------------------- our objects -> items


def topic_item(topic: models.Topic) -> objects.Metadata:
    spec = topic.spec
    replicas: objects.ReplicaSpec
    if spec.replica_assignment is not None:
        replicas = objects.AssignedReplicas([objects.PartitionMap(row.id, list(row.replicas)) for row in spec.replica_assignment])
    else:
        assert spec.partitions is not None and spec.replication_factor is not None
        replicas = objects.ComputedReplicas(spec.partitions, spec.replication_factor, spec.ignore_rack_assignment)
    status = topic.status
    return objects.Metadata(
        topic.name,
        objects.TopicSpec(replicas),
        objects.TopicStatus(
            _TOPIC_RESOLUTION[status.resolution],
            {index: list(spus) for index, spus in status.replica_map.items()},
            {},
            status.reason,
        ),
    )


def partition_item(partition: models.Partition) -> objects.Metadata:
    status = partition.status
    leader = (
        _replica_status(status.leader) if status.leader is not None else objects.ReplicaStatus(partition.spec.leader)
    )
    return objects.Metadata(
        partition.name,
        objects.PartitionSpec(partition.spec.leader, list(partition.spec.replicas)),
        objects.PartitionStatus(
            leader=leader,
            resolution=_PARTITION_RESOLUTION[status.resolution],
            lrs=status.lrs,
            replicas=[_replica_status(replica) for replica in status.replicas],
        ),
    )


def _replica_status(replica: models.ReplicaStatus) -> objects.ReplicaStatus:
    return objects.ReplicaStatus(replica.spu, replica.hw, replica.leo)


def _ingress(endpoint: models.Endpoint) -> objects.IngressPort:
    try:
        ipaddress.ip_address(endpoint.host)
    except ValueError:
        address = objects.IngressAddr(hostname=endpoint.host)
    else:
        address = objects.IngressAddr(ip=endpoint.host)
    return objects.IngressPort(endpoint.port, [address])


def spu_item(spu: models.Spu) -> objects.Metadata:
    spec = spu.spec
    spu_type = objects.SpuType.CUSTOM if spec.spu_type is models.SpuType.CUSTOM else objects.SpuType.MANAGED
    return objects.Metadata(
        spu.name,
        objects.SpuSpec(
            spec.id,
            spu_type,
            _ingress(spec.public_endpoint),
            objects.Endpoint(spec.private_endpoint.port, spec.private_endpoint.host),
            spec.rack,
        ),
        objects.SpuStatus(_SPU_RESOLUTION[spu.status.resolution]),
    )


def custom_spu_item(spu: models.Spu) -> objects.Metadata:
    spec = spu.spec
    return objects.Metadata(
        spu.name,
        objects.CustomSpuSpec(
            spec.id,
            _ingress(spec.public_endpoint),
            objects.Endpoint(spec.private_endpoint.port, spec.private_endpoint.host),
            spec.rack,
        ),
        objects.SpuStatus(_SPU_RESOLUTION[spu.status.resolution]),
    )


def spu_group_item(group: models.SpuGroup) -> objects.Metadata:
    spec = group.spec
    return objects.Metadata(
        group.name,
        objects.SpuGroupSpec(
            spec.replicas,
            spec.min_id,
            objects.SpuConfig(rack=spec.rack, storage=objects.SpuStorageConfig(spec.storage.log_dir, spec.storage.size)),
        ),
        objects.SpuGroupStatus(_GROUP_RESOLUTION[group.status.resolution], group.status.reason or None),
    )


def is_custom(obj: models.AnyObject) -> bool:
    return obj.spec.spu_type is models.SpuType.CUSTOM


# label -> (the kind it lists, which objects of the kind it shows (None: all), the item)
ITEMS: dict[str, tuple[str, Callable[[models.AnyObject], bool] | None, Callable[..., objects.Metadata]]] = {
    objects.TOPIC: ("topics", None, topic_item),
    objects.PARTITION: ("partitions", None, partition_item),
    objects.SPU: ("spus", None, spu_item),
    objects.CUSTOM_SPU: ("spus", is_custom, custom_spu_item),
    objects.SPU_GROUP: ("spu-groups", None, spu_group_item),
}


# ---------------------------------------------------------------------------- create requests -> our objects


def check_topic_name(name: str) -> None:
    try:
        models.validate_name(name, "topic name")
    except ValueError as error:
        raise Refused(messages.Error.TOPIC_INVALID_NAME, str(error)) from None


def check_topic_config(spec: objects.TopicSpec) -> None:
    """Fluvio's checks of the storage settings, in its order (TopicInvalidConfiguration)."""
    invalid = messages.Error.TOPIC_INVALID_CONFIGURATION
    if spec.cleanup_policy is not None and spec.cleanup_policy.time_in_seconds < MIN_RETENTION_SECONDS:
        raise Refused(
            invalid,
            f"retention time {spec.cleanup_policy.time_in_seconds} s is below the minimum of {MIN_RETENTION_SECONDS} s",
        )
    storage = spec.storage
    if storage is not None:
        if storage.segment_size is not None and storage.segment_size < MIN_SEGMENT_BYTES:
            raise Refused(invalid, f"segment size {storage.segment_size} bytes is below the minimum of {MIN_SEGMENT_BYTES} bytes")
        if storage.max_partition_size is not None:
            segment = storage.segment_size if storage.segment_size is not None else DEFAULT_SEGMENT_BYTES
            if storage.max_partition_size < MIN_PARTITION_BYTES:
                raise Refused(
                    invalid,
                    f"max partition size {storage.max_partition_size} bytes is below the minimum of {MIN_PARTITION_BYTES} bytes",
                )
            if storage.max_partition_size < segment:
                raise Refused(
                    invalid,
                    f"max partition size {storage.max_partition_size} bytes is below the segment size of {segment} bytes",
                )
    if spec.deduplication is not None:
        raise Refused(invalid, "deduplication runs a SmartModule, and this SC does not run SmartModules: create the topic without it")
    if spec.system:
        raise Refused(invalid, "system topics are the cluster's own; create the topic with system = false")


def assigned_rows(spec: objects.TopicSpec) -> list[objects.PartitionMap] | None:
    """The rows of an assigned create (None for a computed one), after the refusals that need no
    model: mirrors, and more partitions than Fluvio's wire describes."""
    replicas = spec.replicas
    if isinstance(replicas, objects.MirrorReplicas):
        raise Refused(messages.Error.TOPIC_INVALID_REPLICA_TYPE, "mirror topics are not supported by this SC: use computed or assigned replicas")
    if isinstance(replicas, objects.AssignedReplicas):
        mirrored = [row.id for row in replicas.maps if row.mirror is not None]
        if mirrored:
            raise Refused(
                messages.Error.TOPIC_INVALID_REPLICA_TYPE,
                f"partitions {mirrored} carry a mirror configuration, which this SC does not support",
            )
        if len(replicas.maps) > MAX_WIRE_PARTITIONS:
            raise Refused(messages.Error.TOPIC_ERROR, _too_many_partitions(len(replicas.maps)))
        return replicas.maps
    if replicas.partitions > MAX_WIRE_PARTITIONS:
        raise Refused(messages.Error.TOPIC_ERROR, _too_many_partitions(replicas.partitions))
    return None


def topic_from_create(name: str, spec: objects.TopicSpec) -> models.Topic:
    """Our topic for a Fluvio create (after check_topic_name and check_topic_config)."""
    rows = assigned_rows(spec)
    fields: dict[str, object]
    if rows is not None:
        fields = {"replicaAssignment": [{"id": row.id, "replicas": list(row.replicas)} for row in rows]}
    else:
        assert isinstance(spec.replicas, objects.ComputedReplicas)
        fields = {
            "partitions": spec.replicas.partitions,
            "replicationFactor": spec.replicas.replication_factor,
            "ignoreRackAssignment": spec.replicas.ignore_rack_assignment,
        }
    try:
        return models.Topic.model_validate({"name": name, "spec": fields})
    except pydantic.ValidationError as error:
        raise Refused(messages.Error.TOPIC_ERROR, models.describe_validation_error(error)) from None


def _too_many_partitions(count: int) -> str:
    return (
        f"{count} partitions cannot be described over Fluvio's protocol (its replica map holds at most "
        f"{MAX_WIRE_PARTITIONS}); create the topic through the HTTP API instead"
    )


def spu_from_create(name: str, spec: objects.CustomSpuSpec) -> models.Spu:
    """Our custom SPU for a Fluvio register request."""
    error = messages.Error.SPU_ERROR
    if spec.public_endpoint_local is not None:
        raise Refused(error, "publicEndpointLocal is not supported by this SC: register the SPU without it")
    for which, encryption in (("public", spec.public_endpoint.encryption), ("private", spec.private_endpoint.encryption)):
        if encryption is not objects.Encryption.PLAINTEXT:
            raise Refused(error, f"the {which} endpoint asks for {encryption.name} encryption; this SC supports PLAINTEXT only")
    ingress = spec.public_endpoint.ingress
    if len(ingress) != 1:
        raise Refused(error, f"the public endpoint must have exactly one ingress address (ip or hostname), got {len(ingress)}")
    host = ingress[0].ip or ingress[0].hostname
    if not host:
        raise Refused(error, "the public endpoint's ingress address has neither an ip nor a hostname")
    try:
        return models.Spu.model_validate(
            {
                "name": name,
                "spec": {
                    "id": spec.id,
                    "spuType": models.SpuType.CUSTOM,
                    "rack": spec.rack,
                    "publicEndpoint": {"host": host, "port": spec.public_endpoint.port},
                    "privateEndpoint": {"host": spec.private_endpoint.host, "port": spec.private_endpoint.port},
                },
            }
        )
    except pydantic.ValidationError as failure:
        raise Refused(error, models.describe_validation_error(failure)) from None


def spu_group_from_create(name: str, spec: objects.SpuGroupSpec) -> models.SpuGroup:
    """Our SPU group for a Fluvio create request."""
    error = messages.Error.SPU_ERROR
    config = spec.spu_config
    if config.replication is not None and config.replication.in_sync_replica_min is not None:
        raise Refused(
            error,
            f"replication.inSyncReplicaMin {config.replication.in_sync_replica_min} is not supported by this SC: leave it unset",
        )
    if config.env:
        names = ", ".join(variable.name for variable in config.env)
        raise Refused(error, f"environment variables ({names}) are not supported by this SC: leave env empty")
    fields: dict[str, object] = {"replicas": spec.replicas, "minId": spec.min_id, "rack": config.rack}
    if config.storage is not None:
        storage = {
            key: value for key, value in (("logDir", config.storage.log_dir), ("size", config.storage.size)) if value is not None
        }
        fields["storage"] = storage
    try:
        return models.SpuGroup.model_validate({"name": name, "spec": fields})
    except pydantic.ValidationError as failure:
        raise Refused(error, models.describe_validation_error(failure)) from None
