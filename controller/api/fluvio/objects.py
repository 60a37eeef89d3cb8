"""The objects of Fluvio's admin protocol (../shared/fluvio-wire.md): the spec and status of a topic,
a partition, an SPU, a custom SPU and an SPU group, and the Metadata items List and Watch carry.

Each type is declared once: its dataclass names every field's wire layout (primitives.struct).
Purely computational and sans-I/O: functions of bytes only, no asyncio, aiohttp, structlog or logging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Annotated, Any

from controller.api.fluvio import primitives
from controller.api.fluvio.primitives import (
    BOOL,
    I32,
    I64,
    STRING,
    U8,
    U16,
    U32,
    U64,
    EnumU8,
    MapOf,
    OptionOf,
    Since,
    Struct,
    Tagged,
    VecOf,
    struct,
)
from store import models

TOPIC = "Topic"
PARTITION = "Partition"
SPU = "SPU"
CUSTOM_SPU = "CustomSpu"
SPU_GROUP = "SpuGroup"

# Lists a request carries are refused by their count above what any object may hold: a topic's
# partitions and replicas (as store.models caps them), and lists a person writes out (ingress
# addresses, environment variables, a mirror's SPUs).
MAX_PARTITIONS = models.MAX_PARTITIONS
MAX_REPLICATION_FACTOR = models.MAX_REPLICATION_FACTOR
MAX_WRITTEN_OUT = 256


# ---------------------------------------------------------------------------- topic


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ANY = 4
    ZSTD = 5


COMPRESSION = EnumU8(Compression)


@dataclass(frozen=True, slots=True)
class SegmentCleanup:
    time_in_seconds: Annotated[int, U32]


CLEANUP_POLICY = Tagged("CleanupPolicy", U8, {0: struct(SegmentCleanup)})


@dataclass(frozen=True, slots=True)
class TopicStorageConfig:
    segment_size: Annotated[int | None, OptionOf(U32)] = None
    max_partition_size: Annotated[int | None, OptionOf(U64)] = None


TOPIC_STORAGE = struct(TopicStorageConfig)


@dataclass(frozen=True, slots=True)
class Duration:
    seconds: Annotated[int, U64]
    nanos: Annotated[int, U32] = 0


@dataclass(frozen=True, slots=True)
class Bounds:
    count: Annotated[int, U64]
    age: Annotated[Duration | None, OptionOf(struct(Duration))] = None


@dataclass(frozen=True, slots=True)
class Transform:
    uses: Annotated[str, STRING]
    with_params: Annotated[dict[str, str], MapOf(STRING, STRING)] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filter:
    transform: Annotated[Transform, struct(Transform)]


@dataclass(frozen=True, slots=True)
class Deduplication:
    bounds: Annotated[Bounds, struct(Bounds)]
    filter: Annotated[Filter, struct(Filter)]


DEDUPLICATION = struct(Deduplication)


@dataclass(frozen=True, slots=True)
class RemotePartitionConfig:
    home_cluster: Annotated[str, STRING]
    home_spu_key: Annotated[str, STRING]
    home_spu_id: Annotated[int, I32]
    home_spu_endpoint: Annotated[str, STRING]
    target: Annotated[bool, BOOL, Since(18)] = False


@dataclass(frozen=True, slots=True)
class HomePartitionConfig:
    remote_cluster: Annotated[str, STRING]
    remote_replica: Annotated[str, STRING]
    source: Annotated[bool, BOOL, Since(18)] = False


PartitionMirrorConfig = RemotePartitionConfig | HomePartitionConfig
HOME_PARTITION_CONFIG = struct(HomePartitionConfig)
PARTITION_MIRROR = Tagged("PartitionMirrorConfig", U8, {0: struct(RemotePartitionConfig), 1: HOME_PARTITION_CONFIG})


@dataclass(frozen=True, slots=True)
class SpuMirrorConfig:
    id: Annotated[int, I32]
    key: Annotated[str, STRING]
    endpoint: Annotated[str, STRING]


@dataclass(frozen=True, slots=True)
class RemoteMirrorConfig:
    home_cluster: Annotated[str, STRING]
    home_spus: Annotated[list[SpuMirrorConfig], VecOf(struct(SpuMirrorConfig), MAX_WRITTEN_OUT)]
    target: Annotated[bool, BOOL, Since(18)] = False


@dataclass(frozen=True, slots=True)
class HomeMirrorConfig:
    partitions: Annotated[list[HomePartitionConfig], VecOf(HOME_PARTITION_CONFIG, MAX_PARTITIONS)]
    source: Annotated[bool, BOOL, Since(18)] = False


MIRROR_CONFIG = Tagged("MirrorConfig", U8, {0: struct(RemoteMirrorConfig), 1: struct(HomeMirrorConfig)})


@dataclass(frozen=True, slots=True)
class PartitionMap:
    id: Annotated[int, U32]
    replicas: Annotated[list[int], VecOf(I32, MAX_REPLICATION_FACTOR)]
    mirror: Annotated[PartitionMirrorConfig | None, OptionOf(PARTITION_MIRROR), Since(14)] = None


@dataclass(frozen=True, slots=True)
class AssignedReplicas:
    maps: Annotated[list[PartitionMap], VecOf(struct(PartitionMap), MAX_PARTITIONS)]


@dataclass(frozen=True, slots=True)
class ComputedReplicas:
    partitions: Annotated[int, U32]
    replication_factor: Annotated[int, U32]
    ignore_rack_assignment: Annotated[bool, BOOL] = False


@dataclass(frozen=True, slots=True)
class MirrorReplicas:
    config: Annotated[RemoteMirrorConfig | HomeMirrorConfig, MIRROR_CONFIG]


ReplicaSpec = AssignedReplicas | ComputedReplicas | MirrorReplicas
REPLICA_SPEC = Tagged(
    "ReplicaSpec", U8, {0: struct(AssignedReplicas), 1: struct(ComputedReplicas), 2: struct(MirrorReplicas)}
)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    replicas: Annotated[ReplicaSpec, REPLICA_SPEC]
    cleanup_policy: Annotated[SegmentCleanup | None, OptionOf(CLEANUP_POLICY), Since(3)] = None
    storage: Annotated[TopicStorageConfig | None, OptionOf(TOPIC_STORAGE), Since(4)] = None
    compression_type: Annotated[Compression, COMPRESSION, Since(6)] = Compression.ANY
    deduplication: Annotated[Deduplication | None, OptionOf(DEDUPLICATION), Since(12)] = None
    system: Annotated[bool, BOOL, Since(13)] = False


TOPIC_SPEC = struct(TopicSpec)


class TopicResolution(enum.IntEnum):
    INIT = 0
    PENDING = 1
    INSUFFICIENT_RESOURCES = 2
    INVALID_CONFIG = 3
    PROVISIONED = 4
    DELETING = 5


@dataclass(frozen=True, slots=True)
class TopicStatus:
    resolution: Annotated[TopicResolution, EnumU8(TopicResolution)] = TopicResolution.INIT
    replica_map: Annotated[dict[int, list[int]], MapOf(U32, VecOf(I32))] = field(default_factory=dict)
    mirror_map: Annotated[dict[int, PartitionMirrorConfig], MapOf(U32, PARTITION_MIRROR), Since(14)] = field(
        default_factory=dict
    )
    reason: Annotated[str, STRING] = ""


TOPIC_STATUS = struct(TopicStatus)


# ---------------------------------------------------------------------------- partition


class PartitionResolution(enum.IntEnum):
    OFFLINE = 0
    ONLINE = 1
    LEADER_OFFLINE = 2
    ELECTION_LEADER_FOUND = 3
    OUT_OF_STORAGE = 4


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    leader: Annotated[int, I32]
    replicas: Annotated[list[int], VecOf(I32)]
    cleanup_policy: Annotated[SegmentCleanup | None, OptionOf(CLEANUP_POLICY), Since(4)] = None
    storage: Annotated[TopicStorageConfig | None, OptionOf(TOPIC_STORAGE), Since(4)] = None
    compression_type: Annotated[Compression, COMPRESSION, Since(6)] = Compression.ANY
    deduplication: Annotated[Deduplication | None, OptionOf(DEDUPLICATION), Since(12)] = None
    system: Annotated[bool, BOOL, Since(13)] = False
    mirror: Annotated[PartitionMirrorConfig | None, OptionOf(PARTITION_MIRROR), Since(14)] = None


PARTITION_SPEC = struct(PartitionSpec)


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    spu: Annotated[int, I32]
    hw: Annotated[int, I64] = -1
    leo: Annotated[int, I64] = -1


REPLICA_STATUS = struct(ReplicaStatus)
SIZE_NOT_SUPPORTED = -2


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionStatus:
    """Keyword-only: its wire layout starts with the resolution, which has a default, not the leader."""

    resolution: Annotated[PartitionResolution, EnumU8(PartitionResolution)] = PartitionResolution.OFFLINE
    leader: Annotated[ReplicaStatus, REPLICA_STATUS]
    lrs: Annotated[int, U32] = 0
    replicas: Annotated[list[ReplicaStatus], VecOf(REPLICA_STATUS)] = field(default_factory=list)
    size: Annotated[int, I64, Since(5)] = SIZE_NOT_SUPPORTED
    is_being_deleted: Annotated[bool, BOOL] = False
    base_offset: Annotated[int, I64, Since(16)] = 0


PARTITION_STATUS = struct(PartitionStatus)


# ---------------------------------------------------------------------------- SPU and custom SPU


class Encryption(enum.IntEnum):
    PLAINTEXT = 0
    SSL = 1


ENCRYPTION = EnumU8(Encryption)


class SpuType(enum.IntEnum):
    MANAGED = 0
    CUSTOM = 1


class SpuResolution(enum.IntEnum):
    """Note the order: not the partition enum's."""

    ONLINE = 0
    OFFLINE = 1
    INIT = 2


@dataclass(frozen=True, slots=True)
class IngressAddr:
    hostname: Annotated[str | None, OptionOf(STRING)] = None
    ip: Annotated[str | None, OptionOf(STRING)] = None


@dataclass(frozen=True, slots=True)
class IngressPort:
    port: Annotated[int, U16]
    ingress: Annotated[list[IngressAddr], VecOf(struct(IngressAddr), MAX_WRITTEN_OUT)] = field(default_factory=list)
    encryption: Annotated[Encryption, ENCRYPTION] = Encryption.PLAINTEXT


INGRESS_PORT = struct(IngressPort)


@dataclass(frozen=True, slots=True)
class Endpoint:
    port: Annotated[int, U16]
    host: Annotated[str, STRING]
    encryption: Annotated[Encryption, ENCRYPTION] = Encryption.PLAINTEXT


ENDPOINT = struct(Endpoint)


@dataclass(frozen=True, slots=True)
class SpuSpec:
    id: Annotated[int, I32]
    spu_type: Annotated[SpuType, EnumU8(SpuType)]
    public_endpoint: Annotated[IngressPort, INGRESS_PORT]
    private_endpoint: Annotated[Endpoint, ENDPOINT]
    rack: Annotated[str | None, OptionOf(STRING)] = None
    public_endpoint_local: Annotated[Endpoint | None, OptionOf(ENDPOINT), Since(1)] = None


SPU_SPEC = struct(SpuSpec)


@dataclass(frozen=True, slots=True)
class CustomSpuSpec:
    id: Annotated[int, I32]
    public_endpoint: Annotated[IngressPort, INGRESS_PORT]
    private_endpoint: Annotated[Endpoint, ENDPOINT]
    rack: Annotated[str | None, OptionOf(STRING)] = None
    public_endpoint_local: Annotated[Endpoint | None, OptionOf(ENDPOINT)] = None


CUSTOM_SPU_SPEC = struct(CustomSpuSpec)


@dataclass(frozen=True, slots=True)
class SpuStatus:
    resolution: Annotated[SpuResolution, EnumU8(SpuResolution)] = SpuResolution.INIT


SPU_STATUS = struct(SpuStatus)


# ---------------------------------------------------------------------------- SPU group


class SpuGroupResolution(enum.IntEnum):
    INIT = 0
    INVALID = 1
    RESERVED = 2


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    in_sync_replica_min: Annotated[int | None, OptionOf(U16)] = None


@dataclass(frozen=True, slots=True)
class SpuStorageConfig:
    log_dir: Annotated[str | None, OptionOf(STRING)] = None
    size: Annotated[str | None, OptionOf(STRING)] = None


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: Annotated[str, STRING]
    value: Annotated[str, STRING]


@dataclass(frozen=True, slots=True)
class SpuConfig:
    rack: Annotated[str | None, OptionOf(STRING)] = None
    replication: Annotated[ReplicationConfig | None, OptionOf(struct(ReplicationConfig))] = None
    storage: Annotated[SpuStorageConfig | None, OptionOf(struct(SpuStorageConfig))] = None
    env: Annotated[list[EnvVar], VecOf(struct(EnvVar), MAX_WRITTEN_OUT)] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SpuGroupSpec:
    replicas: Annotated[int, U16]
    min_id: Annotated[int, I32]
    spu_config: Annotated[SpuConfig, struct(SpuConfig)] = field(default_factory=SpuConfig)


SPU_GROUP_SPEC = struct(SpuGroupSpec)


@dataclass(frozen=True, slots=True)
class SpuGroupStatus:
    resolution: Annotated[SpuGroupResolution, EnumU8(SpuGroupResolution)] = SpuGroupResolution.INIT
    reason: Annotated[str | None, OptionOf(STRING)] = None


SPU_GROUP_STATUS = struct(SpuGroupStatus)


# ---------------------------------------------------------------------------- metadata items and type labels


@dataclass(frozen=True, slots=True)
class Metadata:
    """One object as the client sees it; ``name`` is the SC's key (a partition's is ``<topic>-<index>``).
    The layout of ``spec`` and ``status`` is its type label's."""

    name: Annotated[str, STRING]
    spec: Any
    status: Any


@dataclass(frozen=True, slots=True)
class ObjectType:
    """One type label of the object API, declared once: the layout of its Metadata items, and of
    the spec a Create of it carries (None: it cannot be created over this protocol)."""

    label: str
    item: Struct
    create: Struct | None = None


def _object_type(label: str, spec: Struct, status: Struct, creatable: bool = False) -> ObjectType:
    return ObjectType(label, struct(Metadata, spec=spec, status=status), spec if creatable else None)


TYPES = {
    object_type.label: object_type
    for object_type in (
        _object_type(TOPIC, TOPIC_SPEC, TOPIC_STATUS, creatable=True),
        _object_type(PARTITION, PARTITION_SPEC, PARTITION_STATUS),
        _object_type(SPU, SPU_SPEC, SPU_STATUS),
        _object_type(CUSTOM_SPU, CUSTOM_SPU_SPEC, SPU_STATUS, creatable=True),
        _object_type(SPU_GROUP, SPU_GROUP_SPEC, SPU_GROUP_STATUS, creatable=True),
    )
}
LABELS = tuple(TYPES)
# Views of TYPES: the item layout per label, and the create spec of the labels a Create accepts.
METADATA = {label: object_type.item for label, object_type in TYPES.items()}
CREATE_SPECS = {label: object_type.create for label, object_type in TYPES.items() if object_type.create is not None}


def encode_metadata(label: str, item: Metadata, version: int) -> bytes:
    """One List/Watch item; the server caches these, so lists and watches share one encoding."""
    out = bytearray()
    metadata_codec(label).encode(out, item, version)
    return bytes(out)


def decode_metadata(label: str, data: bytes, version: int) -> Metadata:
    return metadata_codec(label).decode(primitives.Reader(data), version)


def metadata_codec(label: str) -> Struct:
    try:
        return METADATA[label]
    except KeyError:
        raise primitives.CodecError(f"no metadata layout for type label {label!r} (known: {', '.join(LABELS)})") from None
