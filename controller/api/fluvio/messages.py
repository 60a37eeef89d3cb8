"""Fluvio's admin wire protocol, the subset of ../shared/fluvio-wire.md: primitives, version-gated
structs, tagged enums, request/response headers, ApiVersions and the type-labelled object API.

Purely computational and sans-I/O: functions of bytes only, no asyncio, aiohttp, structlog or logging.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------------------- constants

API_VERSIONS = 18
CREATE = 1001
DELETE = 1002
LIST = 1003
WATCH = 1004
UPDATE = 1006
API_NAMES = {API_VERSIONS: "ApiVersions", CREATE: "Create", DELETE: "Delete", LIST: "List", WATCH: "Watch", UPDATE: "Update"}
OBJECT_APIS = (CREATE, DELETE, LIST, WATCH, UPDATE)

# The type-labelled layout (label, u32 length, payload) starts at 11; below is the "classic"
# layout, which the 0.21 client never sends to a server advertising 19.
OBJECT_MIN_VERSION = 11
OBJECT_MAX_VERSION = 19

TOPIC = "Topic"
PARTITION = "Partition"
SPU = "SPU"
CUSTOM_SPU = "CustomSpu"
SPU_GROUP = "SpuGroup"
LABELS = (TOPIC, PARTITION, SPU, CUSTOM_SPU, SPU_GROUP)

# fluvio-protocol's own MAX_BYTES; servers may cap lower.
MAX_FRAME_BYTES = 52_428_800
# Version 0 encodes only the ungated fields; the request header's version reaches every nested struct.
ANY_VERSION = 2**15 - 1


class CodecError(ValueError):
    """Bytes that are not a valid message, or a value the protocol cannot carry."""


class DecodeError(CodecError):
    pass


class EncodeError(CodecError):
    pass


# ---------------------------------------------------------------------------- reading and codecs


class Reader:
    """A cursor over one message's bytes."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise DecodeError(f"{what} needs {size} bytes at offset {self.pos}, only {self.remaining} left")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk


class Codec:
    """Encodes a value into a bytearray and decodes it back, both at a protocol version."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        raise NotImplementedError

    def decode(self, reader: Reader, version: int) -> Any:
        raise NotImplementedError


class Int(Codec):
    __slots__ = ("packer", "name", "low", "high")

    def __init__(self, fmt: str, name: str) -> None:
        self.packer = struct.Struct(">" + fmt)
        self.name = name
        bits = self.packer.size * 8
        signed = fmt.islower()
        self.low = -(2 ** (bits - 1)) if signed else 0
        self.high = 2 ** (bits - 1) - 1 if signed else 2**bits - 1

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        try:
            if type(value) is bool:
                raise struct.error("a bool is not a number")
            out += self.packer.pack(value)
        except struct.error:
            raise EncodeError(f"{self.name} must be a whole number in [{self.low}, {self.high}], got {value!r}") from None

    def decode(self, reader: Reader, version: int) -> int:
        pos = reader.pos
        end = pos + self.packer.size
        if end > len(reader.data):
            raise DecodeError(f"{self.name} needs {self.packer.size} bytes at offset {pos}, only {reader.remaining} left")
        reader.pos = end
        return self.packer.unpack_from(reader.data, pos)[0]  # type: ignore[no-any-return]


I8, U8, I16, U16 = Int("b", "i8"), Int("B", "u8"), Int("h", "i16"), Int("H", "u16")
I32, U32, I64, U64 = Int("i", "i32"), Int("I", "u32"), Int("q", "i64"), Int("Q", "u64")


class _Bool(Codec):
    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if type(value) is not bool:
            raise EncodeError(f"bool must be True or False, got {value!r}")
        out.append(1 if value else 0)

    def decode(self, reader: Reader, version: int) -> bool:
        byte = reader.take(1, "bool")[0]
        if byte > 1:
            raise DecodeError(f"bool at offset {reader.pos - 1} is 0x{byte:02x}, not 00 or 01")
        return byte == 1


BOOL = _Bool()
MAX_STRING_BYTES = 2**15 - 1


class _String(Codec):
    """u16 byte length then UTF-8; Fluvio's decoder reads the length as i16 (<= 0 is "")."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, str):
            raise EncodeError(f"string expected, got {value!r}")
        raw = value.encode()
        if len(raw) > MAX_STRING_BYTES:
            raise EncodeError(f"string of {len(raw)} bytes is longer than the protocol's {MAX_STRING_BYTES} ({value[:40]!r}...)")
        out += len(raw).to_bytes(2, "big")
        out += raw

    def decode(self, reader: Reader, version: int) -> str:
        length = I16.decode(reader, version)
        if length <= 0:
            return ""
        raw = reader.take(length, "string")
        try:
            return raw.decode()
        except UnicodeDecodeError as error:
            raise DecodeError(f"string at offset {reader.pos - length} is not UTF-8: {error}") from None


STRING = _String()


class _Rest(Codec):
    """The remaining bytes of a TypeBuffer payload, kept raw (an object type this SC does not serve)."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        out += value

    def decode(self, reader: Reader, version: int) -> bytes:
        return reader.take(reader.remaining, "payload")


REST = _Rest()


class OptionOf(Codec):
    __slots__ = ("inner",)

    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.encode(out, value, version)

    def decode(self, reader: Reader, version: int) -> Any:
        flag = reader.take(1, "option flag")[0]
        if flag == 0:
            return None
        if flag != 1:
            raise DecodeError(f"option flag at offset {reader.pos - 1} is 0x{flag:02x}, not 00 or 01")
        return self.inner.decode(reader, version)


class VecOf(Codec):
    """Count written as u32 and read as i32 (< 1 is empty), then the elements."""

    __slots__ = ("inner",)

    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, (list, tuple)):
            raise EncodeError(f"list expected, got {value!r}")
        out += len(value).to_bytes(4, "big")
        for item in value:
            self.inner.encode(out, item, version)

    def decode(self, reader: Reader, version: int) -> list[Any]:
        count = I32.decode(reader, version)
        if count < 1:
            return []
        # Every element takes at least one byte: a count beyond the bytes left is a lie.
        if count > reader.remaining:
            raise DecodeError(f"list of {count} elements at offset {reader.pos - 4}, only {reader.remaining} bytes left")
        inner = self.inner
        return [inner.decode(reader, version) for _ in range(count)]


class MapOf(Codec):
    """BTreeMap: u16 count, then key/value pairs in ascending key order."""

    __slots__ = ("key", "value")

    def __init__(self, key: Codec, value: Codec) -> None:
        self.key = key
        self.value = value

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, Mapping):
            raise EncodeError(f"mapping expected, got {value!r}")
        if len(value) > 0xFFFF:
            raise EncodeError(f"a map holds at most 65535 entries on the wire, got {len(value)}")
        out += len(value).to_bytes(2, "big")
        for key in sorted(value):
            self.key.encode(out, key, version)
            self.value.encode(out, value[key], version)

    def decode(self, reader: Reader, version: int) -> dict[Any, Any]:
        count = U16.decode(reader, version)
        decoded = {}
        for _ in range(count):
            key = self.key.decode(reader, version)
            decoded[key] = self.value.decode(reader, version)
        return decoded


@dataclass(frozen=True, slots=True)
class Field:
    """One struct field; present on the wire only when min_version <= version <= max_version."""

    name: str
    codec: Codec
    min_version: int = 0
    max_version: int = ANY_VERSION


class Struct(Codec):
    """Fields in declaration order, no framing; an absent (version-gated) field takes its default."""

    def __init__(self, cls: type, *fields: Field) -> None:
        self.cls = cls
        self.fields = fields
        # Per version: the present fields' (name, bound encoder), so encoding tests no gates.
        self._encoders: dict[int, tuple[tuple[str, Callable[[bytearray, Any, int], None]], ...]] = {}

    def _present(self, version: int) -> tuple[tuple[str, Callable[[bytearray, Any, int], None]], ...]:
        present = tuple(
            (spec.name, spec.codec.encode) for spec in self.fields if spec.min_version <= version <= spec.max_version
        )
        self._encoders[version] = present
        return present

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, self.cls):
            raise EncodeError(f"{self.cls.__name__} expected, got {value!r}")
        present = self._encoders.get(version) or self._present(version)
        for name, encode in present:
            try:
                encode(out, getattr(value, name), version)
            except EncodeError as error:
                raise EncodeError(f"{self.cls.__name__}.{name}: {error}") from None

    def decode_fields(self, reader: Reader, version: int) -> dict[str, Any]:
        values = {}
        for spec in self.fields:
            if spec.min_version <= version <= spec.max_version:
                try:
                    values[spec.name] = spec.codec.decode(reader, version)
                except DecodeError as error:
                    raise DecodeError(f"{self.cls.__name__}.{spec.name}: {error}") from None
        return values

    def decode(self, reader: Reader, version: int) -> Any:
        return self.cls(**self.decode_fields(reader, version))


class Tagged(Codec):
    """An enum with payloads: the tag, then the variant's fields (never version-gated themselves)."""

    def __init__(self, name: str, tag: Int, variants: Mapping[int, Struct]) -> None:
        self.name = name
        self.tag = tag
        self.by_tag = dict(variants)
        self.by_type = {variant.cls: (number, variant) for number, variant in variants.items()}

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        found = self.by_type.get(type(value))
        if found is None:
            raise EncodeError(f"{self.name} cannot be {value!r}")
        number, variant = found
        self.tag.encode(out, number, version)
        variant.encode(out, value, version)

    def decode(self, reader: Reader, version: int) -> Any:
        number = self.tag.decode(reader, version)
        variant = self.by_tag.get(number)
        if variant is None:
            raise DecodeError(f"{self.name} has no variant with tag {number} (known: {sorted(self.by_tag)})")
        return variant.decode(reader, version)


class EnumU8(Codec):
    """A unit-only enum carried as its u8 tag."""

    def __init__(self, cls: type[enum.IntEnum]) -> None:
        self.cls = cls

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, self.cls):
            raise EncodeError(f"{self.cls.__name__} expected, got {value!r}")
        out.append(int(value))

    def decode(self, reader: Reader, version: int) -> enum.IntEnum:
        number = reader.take(1, self.cls.__name__)[0]
        try:
            return self.cls(number)
        except ValueError:
            raise DecodeError(f"{self.cls.__name__} has no value {number} (known: {[int(v) for v in self.cls]})") from None


# ---------------------------------------------------------------------------- error codes and Status


class Error(enum.IntEnum):
    """The ErrorCode tags an admin SC emits (i16). OTHER carries a message; SYSTEM_* a kind and a name."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OTHER = 2
    PERMISSION_DENIED = 13
    INVALID_CREATE_REQUEST = 60
    INVALID_DELETE_REQUEST = 61
    SPU_ERROR = 1000
    SPU_NOT_FOUND = 1003
    SPU_ALREADY_EXISTS = 1004
    TOPIC_ERROR = 2000
    TOPIC_NOT_FOUND = 2001
    TOPIC_ALREADY_EXISTS = 2002
    TOPIC_INVALID_CONFIGURATION = 2004
    TOPIC_NOT_PROVISIONED = 2005
    TOPIC_INVALID_NAME = 2006
    TOPIC_INVALID_REPLICA_TYPE = 2008
    SYSTEM_SPEC_DELETION_ATTEMPT = 12001
    SYSTEM_SPEC_UPDATING_ATTEMPT = 12002


# How many String fields each tag's payload has.
_ERROR_PAYLOAD_STRINGS = {Error.OTHER: 1, Error.SYSTEM_SPEC_DELETION_ATTEMPT: 2, Error.SYSTEM_SPEC_UPDATING_ATTEMPT: 2}


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: Error = Error.NONE
    args: tuple[str, ...] = ()


class _ErrorCodec(Codec):
    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if not isinstance(value, ErrorCode) or not isinstance(value.code, Error):
            raise EncodeError(f"ErrorCode with a known tag expected, got {value!r}")
        expected = _ERROR_PAYLOAD_STRINGS.get(value.code, 0)
        if len(value.args) != expected:
            raise EncodeError(f"error {value.code.name} carries {expected} strings, got {value.args!r}")
        I16.encode(out, int(value.code), version)
        for arg in value.args:
            STRING.encode(out, arg, version)

    def decode(self, reader: Reader, version: int) -> ErrorCode:
        number = I16.decode(reader, version)
        try:
            code = Error(number)
        except ValueError:
            raise DecodeError(f"error code {number} is not one this SC knows") from None
        args = tuple(STRING.decode(reader, version) for _ in range(_ERROR_PAYLOAD_STRINGS.get(code, 0)))
        return ErrorCode(code, args)


ERROR_CODE = _ErrorCodec()
OK = ErrorCode()


@dataclass(frozen=True, slots=True)
class Status:
    """The answer to Create, Delete and Update."""

    name: str
    error_code: ErrorCode = OK
    error_message: str | None = None


STATUS = Struct(Status, Field("name", STRING), Field("error_code", ERROR_CODE), Field("error_message", OptionOf(STRING)))


# ---------------------------------------------------------------------------- topic


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ANY = 4
    ZSTD = 5


@dataclass(frozen=True, slots=True)
class SegmentCleanup:
    time_in_seconds: int


@dataclass(frozen=True, slots=True)
class TopicStorageConfig:
    segment_size: int | None = None
    max_partition_size: int | None = None


@dataclass(frozen=True, slots=True)
class Duration:
    seconds: int
    nanos: int = 0


@dataclass(frozen=True, slots=True)
class Bounds:
    count: int
    age: Duration | None = None


@dataclass(frozen=True, slots=True)
class Transform:
    uses: str
    with_params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filter:
    transform: Transform


@dataclass(frozen=True, slots=True)
class Deduplication:
    bounds: Bounds
    filter: Filter


@dataclass(frozen=True, slots=True)
class RemotePartitionConfig:
    home_cluster: str
    home_spu_key: str
    home_spu_id: int
    home_spu_endpoint: str
    target: bool = False


@dataclass(frozen=True, slots=True)
class HomePartitionConfig:
    remote_cluster: str
    remote_replica: str
    source: bool = False


PartitionMirrorConfig = RemotePartitionConfig | HomePartitionConfig


@dataclass(frozen=True, slots=True)
class SpuMirrorConfig:
    id: int
    key: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class RemoteMirrorConfig:
    home_cluster: str
    home_spus: list[SpuMirrorConfig]
    target: bool = False


@dataclass(frozen=True, slots=True)
class HomeMirrorConfig:
    partitions: list[HomePartitionConfig]
    source: bool = False


@dataclass(frozen=True, slots=True)
class PartitionMap:
    id: int
    replicas: list[int]
    mirror: PartitionMirrorConfig | None = None


@dataclass(frozen=True, slots=True)
class AssignedReplicas:
    maps: list[PartitionMap]


@dataclass(frozen=True, slots=True)
class ComputedReplicas:
    partitions: int
    replication_factor: int
    ignore_rack_assignment: bool = False


@dataclass(frozen=True, slots=True)
class MirrorReplicas:
    config: RemoteMirrorConfig | HomeMirrorConfig


ReplicaSpec = AssignedReplicas | ComputedReplicas | MirrorReplicas


@dataclass(frozen=True, slots=True)
class TopicSpec:
    replicas: ReplicaSpec
    cleanup_policy: SegmentCleanup | None = None
    storage: TopicStorageConfig | None = None
    compression_type: Compression = Compression.ANY
    deduplication: Deduplication | None = None
    system: bool = False


class TopicResolution(enum.IntEnum):
    INIT = 0
    PENDING = 1
    INSUFFICIENT_RESOURCES = 2
    INVALID_CONFIG = 3
    PROVISIONED = 4
    DELETING = 5


@dataclass(frozen=True, slots=True)
class TopicStatus:
    resolution: TopicResolution = TopicResolution.INIT
    replica_map: dict[int, list[int]] = field(default_factory=dict)
    mirror_map: dict[int, PartitionMirrorConfig] = field(default_factory=dict)
    reason: str = ""


PARTITION_MIRROR = Tagged(
    "PartitionMirrorConfig",
    U8,
    {
        0: Struct(
            RemotePartitionConfig,
            Field("home_cluster", STRING),
            Field("home_spu_key", STRING),
            Field("home_spu_id", I32),
            Field("home_spu_endpoint", STRING),
            Field("target", BOOL, min_version=18),
        ),
        1: Struct(
            HomePartitionConfig, Field("remote_cluster", STRING), Field("remote_replica", STRING), Field("source", BOOL, min_version=18)
        ),
    },
)
MIRROR_CONFIG = Tagged(
    "MirrorConfig",
    U8,
    {
        0: Struct(
            RemoteMirrorConfig,
            Field("home_cluster", STRING),
            Field("home_spus", VecOf(Struct(SpuMirrorConfig, Field("id", I32), Field("key", STRING), Field("endpoint", STRING)))),
            Field("target", BOOL, min_version=18),
        ),
        1: Struct(HomeMirrorConfig, Field("partitions", VecOf(PARTITION_MIRROR.by_tag[1])), Field("source", BOOL, min_version=18)),
    },
)
PARTITION_MAP = Struct(
    PartitionMap, Field("id", U32), Field("replicas", VecOf(I32)), Field("mirror", OptionOf(PARTITION_MIRROR), min_version=14)
)
REPLICA_SPEC = Tagged(
    "ReplicaSpec",
    U8,
    {
        0: Struct(AssignedReplicas, Field("maps", VecOf(PARTITION_MAP))),
        1: Struct(ComputedReplicas, Field("partitions", U32), Field("replication_factor", U32), Field("ignore_rack_assignment", BOOL)),
        2: Struct(MirrorReplicas, Field("config", MIRROR_CONFIG)),
    },
)
CLEANUP_POLICY = Tagged("CleanupPolicy", U8, {0: Struct(SegmentCleanup, Field("time_in_seconds", U32))})
TOPIC_STORAGE = Struct(TopicStorageConfig, Field("segment_size", OptionOf(U32)), Field("max_partition_size", OptionOf(U64)))
DEDUPLICATION = Struct(
    Deduplication,
    Field("bounds", Struct(Bounds, Field("count", U64), Field("age", OptionOf(Struct(Duration, Field("seconds", U64), Field("nanos", U32)))))),
    Field("filter", Struct(Filter, Field("transform", Struct(Transform, Field("uses", STRING), Field("with_params", MapOf(STRING, STRING)))))),
)
COMPRESSION = EnumU8(Compression)
TOPIC_SPEC = Struct(
    TopicSpec,
    Field("replicas", REPLICA_SPEC),
    Field("cleanup_policy", OptionOf(CLEANUP_POLICY), min_version=3),
    Field("storage", OptionOf(TOPIC_STORAGE), min_version=4),
    Field("compression_type", COMPRESSION, min_version=6),
    Field("deduplication", OptionOf(DEDUPLICATION), min_version=12),
    Field("system", BOOL, min_version=13),
)
TOPIC_STATUS = Struct(
    TopicStatus,
    Field("resolution", EnumU8(TopicResolution)),
    Field("replica_map", MapOf(U32, VecOf(I32))),
    Field("mirror_map", MapOf(U32, PARTITION_MIRROR), min_version=14),
    Field("reason", STRING),
)


# ---------------------------------------------------------------------------- partition


class PartitionResolution(enum.IntEnum):
    OFFLINE = 0
    ONLINE = 1
    LEADER_OFFLINE = 2
    ELECTION_LEADER_FOUND = 3
    OUT_OF_STORAGE = 4


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    leader: int
    replicas: list[int]
    cleanup_policy: SegmentCleanup | None = None
    storage: TopicStorageConfig | None = None
    compression_type: Compression = Compression.ANY
    deduplication: Deduplication | None = None
    system: bool = False
    mirror: PartitionMirrorConfig | None = None


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    spu: int
    hw: int = -1
    leo: int = -1


SIZE_NOT_SUPPORTED = -2


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    leader: ReplicaStatus
    resolution: PartitionResolution = PartitionResolution.OFFLINE
    lrs: int = 0
    replicas: list[ReplicaStatus] = field(default_factory=list)
    size: int = SIZE_NOT_SUPPORTED
    is_being_deleted: bool = False
    base_offset: int = 0


REPLICA_STATUS = Struct(ReplicaStatus, Field("spu", I32), Field("hw", I64), Field("leo", I64))
PARTITION_SPEC = Struct(
    PartitionSpec,
    Field("leader", I32),
    Field("replicas", VecOf(I32)),
    Field("cleanup_policy", OptionOf(CLEANUP_POLICY), min_version=4),
    Field("storage", OptionOf(TOPIC_STORAGE), min_version=4),
    Field("compression_type", COMPRESSION, min_version=6),
    Field("deduplication", OptionOf(DEDUPLICATION), min_version=12),
    Field("system", BOOL, min_version=13),
    Field("mirror", OptionOf(PARTITION_MIRROR), min_version=14),
)
PARTITION_STATUS = Struct(
    PartitionStatus,
    Field("resolution", EnumU8(PartitionResolution)),
    Field("leader", REPLICA_STATUS),
    Field("lrs", U32),
    Field("replicas", VecOf(REPLICA_STATUS)),
    Field("size", I64, min_version=5),
    Field("is_being_deleted", BOOL),
    Field("base_offset", I64, min_version=16),
)


# ---------------------------------------------------------------------------- SPU and custom SPU


class Encryption(enum.IntEnum):
    PLAINTEXT = 0
    SSL = 1


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
    hostname: str | None = None
    ip: str | None = None


@dataclass(frozen=True, slots=True)
class IngressPort:
    port: int
    ingress: list[IngressAddr] = field(default_factory=list)
    encryption: Encryption = Encryption.PLAINTEXT


@dataclass(frozen=True, slots=True)
class Endpoint:
    port: int
    host: str
    encryption: Encryption = Encryption.PLAINTEXT


@dataclass(frozen=True, slots=True)
class SpuSpec:
    id: int
    spu_type: SpuType
    public_endpoint: IngressPort
    private_endpoint: Endpoint
    rack: str | None = None
    public_endpoint_local: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class CustomSpuSpec:
    id: int
    public_endpoint: IngressPort
    private_endpoint: Endpoint
    rack: str | None = None
    public_endpoint_local: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class SpuStatus:
    resolution: SpuResolution = SpuResolution.INIT


ENCRYPTION = EnumU8(Encryption)
INGRESS_PORT = Struct(
    IngressPort,
    Field("port", U16),
    Field("ingress", VecOf(Struct(IngressAddr, Field("hostname", OptionOf(STRING)), Field("ip", OptionOf(STRING))))),
    Field("encryption", ENCRYPTION),
)
ENDPOINT = Struct(Endpoint, Field("port", U16), Field("host", STRING), Field("encryption", ENCRYPTION))
SPU_SPEC = Struct(
    SpuSpec,
    Field("id", I32),
    Field("spu_type", EnumU8(SpuType)),
    Field("public_endpoint", INGRESS_PORT),
    Field("private_endpoint", ENDPOINT),
    Field("rack", OptionOf(STRING)),
    Field("public_endpoint_local", OptionOf(ENDPOINT), min_version=1),
)
CUSTOM_SPU_SPEC = Struct(
    CustomSpuSpec,
    Field("id", I32),
    Field("public_endpoint", INGRESS_PORT),
    Field("private_endpoint", ENDPOINT),
    Field("rack", OptionOf(STRING)),
    Field("public_endpoint_local", OptionOf(ENDPOINT)),
)
SPU_STATUS = Struct(SpuStatus, Field("resolution", EnumU8(SpuResolution)))


# ---------------------------------------------------------------------------- SPU group


class SpuGroupResolution(enum.IntEnum):
    INIT = 0
    INVALID = 1
    RESERVED = 2


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    in_sync_replica_min: int | None = None


@dataclass(frozen=True, slots=True)
class SpuStorageConfig:
    log_dir: str | None = None
    size: str | None = None


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class SpuConfig:
    rack: str | None = None
    replication: ReplicationConfig | None = None
    storage: SpuStorageConfig | None = None
    env: list[EnvVar] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SpuGroupSpec:
    replicas: int
    min_id: int
    spu_config: SpuConfig = field(default_factory=SpuConfig)


@dataclass(frozen=True, slots=True)
class SpuGroupStatus:
    resolution: SpuGroupResolution = SpuGroupResolution.INIT
    reason: str | None = None


SPU_GROUP_SPEC = Struct(
    SpuGroupSpec,
    Field("replicas", U16),
    Field("min_id", I32),
    Field(
        "spu_config",
        Struct(
            SpuConfig,
            Field("rack", OptionOf(STRING)),
            Field("replication", OptionOf(Struct(ReplicationConfig, Field("in_sync_replica_min", OptionOf(U16))))),
            Field("storage", OptionOf(Struct(SpuStorageConfig, Field("log_dir", OptionOf(STRING)), Field("size", OptionOf(STRING))))),
            Field("env", VecOf(Struct(EnvVar, Field("name", STRING), Field("value", STRING)))),
        ),
    ),
)
SPU_GROUP_STATUS = Struct(SpuGroupStatus, Field("resolution", EnumU8(SpuGroupResolution)), Field("reason", OptionOf(STRING)))


# ---------------------------------------------------------------------------- metadata items


@dataclass(frozen=True, slots=True)
class Metadata:
    """One object as the client sees it; ``name`` is the SC's key (a partition's is ``<topic>-<index>``)."""

    name: str
    spec: Any
    status: Any


class MessageType(enum.IntEnum):
    UPDATE = 0
    DELETE = 1


@dataclass(frozen=True, slots=True)
class Message:
    header: MessageType
    content: Metadata


@dataclass(frozen=True, slots=True)
class MetadataUpdate:
    epoch: int
    changes: list[Message] = field(default_factory=list)
    all: list[Metadata] = field(default_factory=list)


def _metadata(spec: Codec, status: Codec) -> Struct:
    return Struct(Metadata, Field("name", STRING), Field("spec", spec), Field("status", status))


METADATA = {
    TOPIC: _metadata(TOPIC_SPEC, TOPIC_STATUS),
    PARTITION: _metadata(PARTITION_SPEC, PARTITION_STATUS),
    SPU: _metadata(SPU_SPEC, SPU_STATUS),
    CUSTOM_SPU: _metadata(CUSTOM_SPU_SPEC, SPU_STATUS),
    SPU_GROUP: _metadata(SPU_GROUP_SPEC, SPU_GROUP_STATUS),
}


def encode_metadata(label: str, item: Metadata, version: int) -> bytes:
    """One List/Watch item; the server caches these, so lists and watches share one encoding."""
    out = bytearray()
    _metadata_codec(label).encode(out, item, version)
    return bytes(out)


def decode_metadata(label: str, data: bytes, version: int) -> Metadata:
    return _metadata_codec(label).decode(Reader(data), version)  # type: ignore[no-any-return]


def _metadata_codec(label: str) -> Struct:
    try:
        return METADATA[label]
    except KeyError:
        raise CodecError(f"no metadata layout for type label {label!r} (known: {', '.join(LABELS)})") from None


# ---------------------------------------------------------------------------- headers and framing


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str = "fluvio"


REQUEST_HEADER = Struct(
    RequestHeader, Field("api_key", U16), Field("api_version", I16), Field("correlation_id", I32), Field("client_id", STRING)
)


def frame(message: bytes | bytearray) -> bytes:
    """``i32`` length, then the message."""
    return len(message).to_bytes(4, "big") + bytes(message)


def frame_length(prefix: bytes, limit: int = MAX_FRAME_BYTES) -> int:
    """The length announced by a frame's 4-byte prefix; DecodeError if negative or above ``limit``."""
    if len(prefix) != 4:
        raise DecodeError(f"a frame length is 4 bytes, got {len(prefix)}")
    length = int.from_bytes(prefix, "big", signed=True)
    if length < 0:
        raise DecodeError(f"frame length {length} is negative")
    if length > limit:
        raise DecodeError(f"frame of {length} bytes is above the limit of {limit} bytes")
    return length


# ---------------------------------------------------------------------------- ApiVersions


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    client_version: str = ""
    client_os: str = ""
    client_arch: str = ""


@dataclass(frozen=True, slots=True)
class ApiVersionKey:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse:
    api_keys: list[ApiVersionKey]
    platform_version: str
    error_code: ErrorCode = OK


API_VERSIONS_REQUEST = Struct(
    ApiVersionsRequest,
    Field("client_version", STRING, min_version=1),
    Field("client_os", STRING, min_version=1),
    Field("client_arch", STRING, min_version=1),
)
API_VERSIONS_RESPONSE = Struct(
    ApiVersionsResponse,
    Field("error_code", ERROR_CODE),
    Field("api_keys", VecOf(Struct(ApiVersionKey, Field("api_key", I16), Field("min_version", I16), Field("max_version", I16)))),
    Field("platform_version", STRING),
)


# ---------------------------------------------------------------------------- object requests


@dataclass(frozen=True, slots=True)
class ListRequest:
    label: str
    name_filters: list[str] = field(default_factory=list)
    summary: bool = False
    system: bool = False


@dataclass(frozen=True, slots=True)
class WatchRequest:
    label: str
    epoch: int = 0
    summary: bool = False


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """``spec`` is a TopicSpec, CustomSpuSpec or SpuGroupSpec; raw bytes for labels this SC does not serve."""

    label: str
    name: str
    spec: Any
    dry_run: bool = False
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SpuKeyName:
    name: str


@dataclass(frozen=True, slots=True)
class SpuKeyId:
    id: int


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    """``key`` is a name, or for the label CustomSpu a SpuKeyName or SpuKeyId."""

    label: str
    key: Any
    force: bool = False


@dataclass(frozen=True, slots=True)
class AddPartition:
    count: int


@dataclass(frozen=True, slots=True)
class AddMirror:
    remote_cluster: str
    home_to_mirror: bool = False


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """``action`` is AddPartition or AddMirror for the label Topic; raw bytes for other labels."""

    label: str
    key: str
    action: Any


class _CustomSpuKey(Codec):
    """A String naming the variant ("Name" or "Id"), then its value."""

    def encode(self, out: bytearray, value: Any, version: int) -> None:
        if isinstance(value, SpuKeyName):
            STRING.encode(out, "Name", version)
            STRING.encode(out, value.name, version)
        elif isinstance(value, SpuKeyId):
            STRING.encode(out, "Id", version)
            I32.encode(out, value.id, version)
        else:
            raise EncodeError(f"CustomSpuKey must be SpuKeyName or SpuKeyId, got {value!r}")

    def decode(self, reader: Reader, version: int) -> SpuKeyName | SpuKeyId:
        variant = STRING.decode(reader, version)
        if variant == "Name":
            return SpuKeyName(STRING.decode(reader, version))
        if variant == "Id":
            return SpuKeyId(I32.decode(reader, version))
        raise DecodeError(f"CustomSpuKey variant {variant!r} is neither 'Name' nor 'Id'")


UPDATE_ACTION = Tagged(
    "UpdateTopicAction",
    U8,
    {
        0: Struct(AddPartition, Field("count", U32)),
        1: Struct(AddMirror, Field("remote_cluster", STRING), Field("home_to_mirror", BOOL)),
    },
)
LIST_PAYLOAD = Struct(
    ListRequest, Field("name_filters", VecOf(STRING)), Field("summary", BOOL, min_version=10), Field("system", BOOL, min_version=13)
)
WATCH_PAYLOAD = Struct(WatchRequest, Field("epoch", I64), Field("summary", BOOL, min_version=10))
CREATE_SPECS: dict[str, Codec] = {TOPIC: TOPIC_SPEC, CUSTOM_SPU: CUSTOM_SPU_SPEC, SPU_GROUP: SPU_GROUP_SPEC}


def _create_payload(spec: Codec) -> Struct:
    return Struct(
        CreateRequest,
        Field("name", STRING),
        Field("dry_run", BOOL),
        Field("timeout_ms", OptionOf(U32), min_version=7),
        Field("spec", spec),
    )


def _payload(api_key: int, label: str) -> Struct:
    if api_key == LIST:
        return LIST_PAYLOAD
    if api_key == WATCH:
        return WATCH_PAYLOAD
    if api_key == CREATE:
        return _CREATE_PAYLOADS.get(label, _CREATE_RAW)
    if api_key == DELETE:
        return _DELETE_CUSTOM_SPU if label == CUSTOM_SPU else _DELETE_BY_NAME
    if api_key == UPDATE:
        return _UPDATE_TOPIC if label == TOPIC else _UPDATE_RAW
    raise CodecError(f"API key {api_key} is not an object API")


_CREATE_PAYLOADS = {label: _create_payload(spec) for label, spec in CREATE_SPECS.items()}
_CREATE_RAW = _create_payload(REST)
_DELETE_BY_NAME = Struct(DeleteRequest, Field("key", STRING), Field("force", BOOL, min_version=13))
_DELETE_CUSTOM_SPU = Struct(DeleteRequest, Field("key", _CustomSpuKey()), Field("force", BOOL, min_version=13))
_UPDATE_TOPIC = Struct(UpdateRequest, Field("key", STRING), Field("action", UPDATE_ACTION))
_UPDATE_RAW = Struct(UpdateRequest, Field("key", STRING), Field("action", REST))

ObjectRequest = ListRequest | WatchRequest | CreateRequest | DeleteRequest | UpdateRequest
_REQUEST_TYPES: dict[type, int] = {
    ApiVersionsRequest: API_VERSIONS,
    ListRequest: LIST,
    WatchRequest: WATCH,
    CreateRequest: CREATE,
    DeleteRequest: DELETE,
    UpdateRequest: UPDATE,
}


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    body: ApiVersionsRequest | ObjectRequest


def decode_request(message: bytes) -> Request:
    """A request from one frame's bytes (without the length prefix)."""
    reader = Reader(message)
    header: RequestHeader = REQUEST_HEADER.decode(reader, 0)
    version = header.api_version
    if header.api_key == API_VERSIONS:
        if version < 0:
            raise DecodeError(f"ApiVersions version {version} is negative")
        return Request(header, API_VERSIONS_REQUEST.decode(reader, version))
    if header.api_key not in OBJECT_APIS:
        raise DecodeError(f"API key {header.api_key} is not one this SC serves (known: {sorted(API_NAMES)})")
    if not OBJECT_MIN_VERSION <= version <= OBJECT_MAX_VERSION:
        raise DecodeError(
            f"{API_NAMES[header.api_key]} version {version} is outside {OBJECT_MIN_VERSION}..{OBJECT_MAX_VERSION}, "
            "the type-labelled layout this SC speaks"
        )
    label = STRING.decode(reader, version)
    length = U32.decode(reader, version)
    payload = Reader(reader.take(length, f"{label} payload"))
    body = _payload(header.api_key, label).decode_fields(payload, version)
    # Trailing bytes after a complete body are ignored, as Fluvio's decoder does.
    return Request(header, _object_request(header.api_key)(label=label, **body))


def _object_request(api_key: int) -> Callable[..., ObjectRequest]:
    return {LIST: ListRequest, WATCH: WatchRequest, CREATE: CreateRequest, DELETE: DeleteRequest, UPDATE: UpdateRequest}[api_key]


def encode_request(header: RequestHeader, body: ApiVersionsRequest | ObjectRequest) -> bytes:
    """A whole request frame, length prefix included (what a client sends)."""
    expected = _REQUEST_TYPES.get(type(body))
    if expected != header.api_key:
        raise EncodeError(f"a {type(body).__name__} cannot be sent with API key {header.api_key}")
    out = bytearray()
    REQUEST_HEADER.encode(out, header, 0)
    if isinstance(body, ApiVersionsRequest):
        API_VERSIONS_REQUEST.encode(out, body, header.api_version)
    else:
        payload = bytearray()
        _payload(header.api_key, body.label).encode(payload, body, header.api_version)
        _type_buffer(out, body.label, payload, header.api_version)
    return frame(out)


def _type_buffer(out: bytearray, label: str, payload: bytes | bytearray, version: int) -> None:
    STRING.encode(out, label, version)
    out += len(payload).to_bytes(4, "big")
    out += payload


# ---------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class ListResponse:
    label: str
    items: list[Metadata] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WatchResponse:
    label: str
    update: MetadataUpdate


Response = ApiVersionsResponse | Status | ListResponse | WatchResponse


def response_frame(correlation_id: int, body: bytes | bytearray) -> bytes:
    """A whole response frame: length, correlation id, body."""
    return response_header(correlation_id, len(body)) + bytes(body)


def response_header(correlation_id: int, body_length: int) -> bytes:
    """A response frame's length and correlation id, for a body sent right after it."""
    return (body_length + 4).to_bytes(4, "big") + correlation_id.to_bytes(4, "big", signed=True)


def list_body(label: str, items: Sequence[bytes]) -> bytes:
    """A List answer's body from already-encoded items."""
    payload = bytearray(len(items).to_bytes(4, "big"))
    for item in items:
        payload += item
    out = bytearray()
    _type_buffer(out, label, payload, 0)
    return bytes(out)


def watch_body(label: str, epoch: int, changes: Sequence[tuple[MessageType, bytes]], all_items: Sequence[bytes]) -> bytes:
    """One Watch frame's body from already-encoded items: UPDATE/DELETE changes, or a full snapshot."""
    payload = bytearray()
    I64.encode(payload, epoch, 0)
    payload += len(changes).to_bytes(4, "big")
    for header, item in changes:
        payload.append(int(header))
        payload += item
    payload += len(all_items).to_bytes(4, "big")
    for item in all_items:
        payload += item
    out = bytearray()
    _type_buffer(out, label, payload, 0)
    return bytes(out)


def encode_response_body(response: Response, version: int) -> bytes:
    """A response body at the request's version (List and Watch items need a known label)."""
    out = bytearray()
    if isinstance(response, ApiVersionsResponse):
        API_VERSIONS_RESPONSE.encode(out, response, version)
    elif isinstance(response, Status):
        STATUS.encode(out, response, version)
    elif isinstance(response, ListResponse):
        return list_body(response.label, [encode_metadata(response.label, item, version) for item in response.items])
    elif isinstance(response, WatchResponse):
        update = response.update
        return watch_body(
            response.label,
            update.epoch,
            [(message.header, encode_metadata(response.label, message.content, version)) for message in update.changes],
            [encode_metadata(response.label, item, version) for item in update.all],
        )
    else:
        raise EncodeError(f"not a response: {response!r}")
    return bytes(out)


def decode_response(message: bytes, api_key: int, version: int) -> tuple[int, Response]:
    """(correlation id, body) from one frame's bytes (without the length prefix), for the API asked."""
    reader = Reader(message)
    correlation_id = I32.decode(reader, version)
    if api_key == API_VERSIONS:
        return correlation_id, API_VERSIONS_RESPONSE.decode(reader, version)
    if api_key in (CREATE, DELETE, UPDATE):
        return correlation_id, STATUS.decode(reader, version)
    if api_key not in (LIST, WATCH):
        raise DecodeError(f"API key {api_key} has no response this codec knows")
    label = STRING.decode(reader, version)
    length = U32.decode(reader, version)
    payload = Reader(reader.take(length, f"{label} payload"))
    if api_key == LIST:
        count = I32.decode(payload, version)
        if count > 0 and label not in METADATA:
            raise DecodeError(f"a List answer of {count} {label!r} items, a type this codec does not know")
        items = [METADATA[label].decode(payload, version) for _ in range(max(count, 0))]
        return correlation_id, ListResponse(label, items)
    epoch = I64.decode(payload, version)
    changes = []
    for _ in range(max(I32.decode(payload, version), 0)):
        header = EnumU8(MessageType).decode(payload, version)
        changes.append(Message(header, _metadata_codec(label).decode(payload, version)))  # type: ignore[arg-type]
    snapshot = [_metadata_codec(label).decode(payload, version) for _ in range(max(I32.decode(payload, version), 0))]
    return correlation_id, WatchResponse(label, MetadataUpdate(epoch, changes, snapshot))
