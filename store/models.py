"""The four cluster objects (SPU, SPU group, Topic, Partition): pydantic spec/status models.

JSON is camelCase and round-trips exactly; every model is immutable (copy with
``model_copy(update=...)``). Validation only, no I/O.
"""

from __future__ import annotations

import enum
import operator
import re
import secrets
import unicodedata
import weakref
from typing import Annotated, Any, ClassVar, Generic, Literal, Self, TypeAlias, TypeVar, overload

import pydantic
import pydantic_core
from pydantic import Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

NAME_MAX_LENGTH = 63
# Also the OpenAPI document's patterns: keep them valid JSON Schema (ECMA 262) regular expressions.
NAME_REGEX = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"
PLUGIN_REFERENCE_REGEX = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
_NAME_PATTERN = re.compile(NAME_REGEX)
_PARTITION_NAME = re.compile(r"^(?P<topic>.+)-(?P<index>0|[1-9][0-9]*)$")
# The common case in one match: a valid topic name, '-', an index (partition names are hot: 100k per startup).
_VALID_PARTITION_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-(?:0|[1-9][0-9]*)$")
# How plug-ins were once named in a spec. The SC no longer imports what a spec names, but topics
# stored that way must still load, so that the controller can mark them InvalidConfig and say why.
_MODULE_REFERENCE = re.compile(PLUGIN_REFERENCE_REGEX)

PLACEMENT_STRATEGIES = ("computed", "kafka", "least-loaded", "multi-level", "policies")

# Largest partition count one topic may ask for; a typo like 1e9 partitions must not
# make the SC build a billion-entry replica map.
MAX_PARTITIONS = 100_000
MAX_REPLICATION_FACTOR = 128
# The largest partition id (a manual partition's, a replica map's key, the index in a partition's
# name): 32-bit unsigned, as Fluvio's wire carries it and its clients parse it from the name. A
# stored object with a larger one could not be listed to a Fluvio client.
MAX_PARTITION_ID = 2**32 - 1
PartitionId: TypeAlias = Annotated[int, Field(ge=0, le=MAX_PARTITION_ID)]
# An index of more digits than this is compared with MAX_PARTITION_ID; one of fewer is below it.
_SHORT_INDEX_DIGITS = len(str(MAX_PARTITION_ID)) - 1


def validate_plugin_name(name: str) -> str:
    """A placement plug-in's name, as the operator configures it and a topic's placement.strategy
    names it: written like an object name, and not the name of a built-in strategy."""
    validate_name(name, "placement plug-in name")
    if name in PLACEMENT_STRATEGIES or name == "manual":
        raise ValueError(f"placement plug-in name {name!r} is the name of a built-in strategy: choose another")
    return name


def is_module_reference(strategy: str) -> bool:
    """``module:Class``: what a spec could name before plug-ins were configured by the operator."""
    return bool(_MODULE_REFERENCE.match(strategy))


def validate_name(name: str, what: str = "name") -> str:
    """Object names: at most 63 characters of a-z, 0-9 and '-', not starting or ending with '-'."""
    if not isinstance(name, str):
        raise ValueError(f"{what} must be a string, got {name!r}")
    if len(name) > NAME_MAX_LENGTH:
        raise ValueError(
            f"{what} {name!r} is {len(name)} characters long; at most {NAME_MAX_LENGTH} are allowed"
        )
    if not _NAME_PATTERN.match(name):
        raise ValueError(
            f"{what} {name!r} is invalid: use only lowercase letters, digits and '-', "
            "and do not start or end with '-'"
        )
    return name


class Model(pydantic.BaseModel):
    """Base of every object model: camelCase JSON, unknown fields rejected, immutable."""

    model_config = pydantic.ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------- SPU

# The largest SPU id: 32-bit, as Fluvio's and 9004's wire carry it. Every SPU id an object holds
# (a partition's replicas, leader and in-sync set, a replica map, a move) is bounded alike, so a
# stored object the SC reads is one it can tell its SPUs about.
MAX_SPU_ID = 2**31 - 1
SpuId: TypeAlias = Annotated[int, Field(ge=0, le=MAX_SPU_ID)]


class SpuType(str, enum.Enum):
    CUSTOM = "Custom"
    MANAGED = "Managed"


class SpuResolution(str, enum.Enum):
    INIT = "Init"
    ONLINE = "Online"
    OFFLINE = "Offline"


# The longest rack and SPU-group log directory: what a Fluvio client is shown must fit its strings
# (32,767 bytes; 4 bytes a character at most), and a rack is a label, not a document.
MAX_RACK_LENGTH = 255
MAX_LOG_DIR_LENGTH = 4096
Rack: TypeAlias = Annotated[str, Field(max_length=MAX_RACK_LENGTH)]


def check_host(host: str) -> str:
    """An endpoint's host (an SPU's, or the one an SPU group gives its SPUs): no whitespace, and
    none of the characters a rack may not hold (it is shown in the same places)."""
    if any(char.isspace() for char in host):
        raise ValueError(f"host {host!r} must not contain whitespace")
    check_characters("host", host)
    return host


# Unicode categories a rack or a host may not hold: controls (a newline, NUL, ESC and the terminal sequences
# it starts), invisible format characters (bidirectional overrides that reorder what a reader sees,
# zero-width ones that make two racks look alike), and the line and paragraph separators (line
# breaks to many viewers). A rack is shown in logs, on the live page and in the audits. Surrogates
# never get here: pydantic refuses a string that is not valid Unicode.
UNPRINTABLE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def unprintable_character(text: str) -> str | None:
    """The first character of ``text`` in UNPRINTABLE_CATEGORIES, described as ``'\\n' (U+000A,
    Cc)`` (None if there is none)."""
    # The common case, in C: isprintable() is false for every character of those categories (and
    # for some a rack may hold: other spaces than ' ', private-use and unassigned ones).
    if text.isprintable():
        return None
    for char in text:
        category = unicodedata.category(char)
        if category in UNPRINTABLE_CATEGORIES:
            return f"{char!r} (U+{ord(char):04X}, {category})"
    return None


def check_characters(what: str, text: str) -> None:
    """Refuse ``text`` (a rack, a host: ``what``) holding a character of UNPRINTABLE_CATEGORIES,
    naming it and the value (repr: escaped, so it is visible and harmless wherever the message goes)."""
    character = unprintable_character(text)
    if character is not None:
        raise ValueError(
            f"{what} {text!r} holds the character {character}: a {what} may hold no control, format or "
            "line-separator character"
        )


def check_rack(rack: str | None) -> str | None:
    """An SPU's rack (its own, or the one its SPU group gives it): a label, or a path such as /dc1/r1."""
    if rack is None:
        return None
    check_characters("rack", rack)
    if not rack or rack.strip() != rack:
        raise ValueError(f"rack {rack!r} must be non-empty with no leading or trailing spaces")
    if rack.startswith("/"):
        levels = rack.split("/")[1:]
        if any(level == "" for level in levels):
            raise ValueError(
                f"rack path {rack!r} has an empty level; write it as /dc1/r1 (no trailing or double '/')"
            )
    return rack


class Endpoint(Model):
    host: Annotated[str, Field(min_length=1, max_length=253)]
    port: Annotated[int, Field(ge=1, le=65535)]

    @field_validator("host")
    @classmethod
    def _host_has_no_spaces(cls, host: str) -> str:
        return check_host(host)

    def address(self) -> str:
        return f"{self.host}:{self.port}"


class SpuDrain(str, enum.Enum):
    DRAINING = "Draining"  # it still leads some partitions
    DRAINED = "Drained"  # it leads none


class SpuDecommission(str, enum.Enum):
    IN_PROGRESS = "InProgress"  # some partition still lists it among its replicas
    DONE = "Done"  # none does: it may be deleted with nothing lost


class SpuSpec(Model):
    id: SpuId
    spu_type: SpuType = SpuType.CUSTOM
    rack: Rack | None = None
    public_endpoint: Endpoint
    private_endpoint: Endpoint
    # The operator's intent (like `kubectl cordon`): its leaderships move to other in-sync
    # replicas, and it leads again only where no other replica can. Only an undrain ends it.
    drain: bool = False
    # The operator's intent to retire it (POST /v1/spus/{name}/decommission): a run moves every
    # replica off it, and every later plan keeps it empty. Only deleting the SPU ends it.
    decommission: bool = False

    @pydantic.model_serializer(mode="wrap")
    def _omit_drain_when_false(self, handler: pydantic.SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Absent unless true: the stored and served form of an SPU never drained stays as it was.
        data: dict[str, Any] = handler(self)
        if not self.drain:
            data.pop("drain", None)
        if not self.decommission:
            data.pop("decommission", None)
        return data

    @field_validator("rack")
    @classmethod
    def _rack_is_label_or_path(cls, rack: str | None) -> str | None:
        return check_rack(rack)


class SpuStatus(Model):
    resolution: SpuResolution = SpuResolution.INIT
    # Absent unless spec.drain is set; written by the SPU controller.
    drain: SpuDrain | None = None
    # Why a drain cannot finish: the partitions still led, each with what keeps it there.
    reason: str | None = None
    # Absent unless spec.decommission is set; written by the SPU controller.
    decommission: SpuDecommission | None = None


# ---------------------------------------------------------------------------- SPU group


class SpuGroupResolution(str, enum.Enum):
    INIT = "Init"
    INVALID = "Invalid"
    RESERVED = "Reserved"


class StorageConfig(Model):
    log_dir: Annotated[str, Field(max_length=MAX_LOG_DIR_LENGTH)] = "/tmp/fluvio"
    size: Annotated[str, Field(max_length=24, pattern=r"^[1-9][0-9]*(Ki|Mi|Gi|Ti)?$")] = "1Gi"


class SpuGroupSpec(Model):
    """Managed SPUs ``<group>-0 .. <group>-(replicas-1)`` with ids ``minId ..``.

    SPU id N of the group listens on ``host``, ports ``publicPortBase + N`` and
    ``privatePortBase + N`` (unique per host because ids are unique).
    """

    replicas: Annotated[int, Field(ge=0, le=10_000)]
    min_id: Annotated[int, Field(ge=0, le=MAX_SPU_ID)] = 0
    rack: Rack | None = None
    storage: StorageConfig = StorageConfig()
    host: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    public_port_base: Annotated[int, Field(ge=1, le=65535)] = 10000
    private_port_base: Annotated[int, Field(ge=1, le=65535)] = 30000

    # Given to every SPU of the group: a value an SPU refuses would stop the group controller at it.
    @field_validator("rack")
    @classmethod
    def _rack_is_label_or_path(cls, rack: str | None) -> str | None:
        return check_rack(rack)

    @field_validator("host")
    @classmethod
    def _host_has_no_spaces(cls, host: str) -> str:
        return check_host(host)

    @model_validator(mode="after")
    def _ids_fit(self) -> Self:
        last_id = self.min_id + self.replicas - 1
        if last_id > MAX_SPU_ID:
            raise ValueError(
                f"minId {self.min_id} with {self.replicas} replicas would need id {last_id}, "
                f"above the largest SPU id {MAX_SPU_ID}"
            )
        if self.replicas:
            for field_name, base in (("publicPortBase", self.public_port_base), ("privatePortBase", self.private_port_base)):
                if base + last_id > 65535:
                    raise ValueError(
                        f"{field_name} {base} + SPU id {last_id} = {base + last_id} is above the largest port 65535"
                    )
        return self


class SpuGroupStatus(Model):
    resolution: SpuGroupResolution = SpuGroupResolution.INIT
    reason: str = ""


# ---------------------------------------------------------------------------- Topic


class TopicResolution(str, enum.Enum):
    INIT = "Init"
    PENDING = "Pending"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    INVALID_CONFIG = "InvalidConfig"
    PROVISIONED = "Provisioned"
    DELETING = "Deleting"


class PartitionAssignment(Model):
    """One partition of a manual topic: its id and its replicas, preferred leader first."""

    id: PartitionId
    # At most a computed topic's largest replication factor (the schema says so; TopicSpec checks
    # it over all rows at once, naming the partition).
    replicas: Annotated[list[SpuId], Field(json_schema_extra={"maxItems": MAX_REPLICATION_FACTOR})]


# The longest placement policies (`key=value;...`): a few settings and a list of preferred SPUs,
# stored with the topic and parsed at each of its placements.
MAX_POLICIES_LENGTH = 65_536


class PlacementSpec(Model):
    strategy: str = "computed"
    policies: Annotated[str, Field(max_length=MAX_POLICIES_LENGTH)] | None = None

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, strategy: str) -> str:
        """A built-in strategy or a well-formed plug-in name; whether that plug-in is configured is
        the controller's and the API's check (the model knows no configuration)."""
        if strategy in PLACEMENT_STRATEGIES or is_module_reference(strategy):
            return strategy
        if strategy == "manual":
            raise ValueError("placement strategy 'manual' is chosen by giving replicaAssignment instead of partitions")
        try:
            return validate_plugin_name(strategy)
        except ValueError:
            raise ValueError(
                f"placement strategy {strategy!r} is unknown: use one of {', '.join(PLACEMENT_STRATEGIES)}, "
                "or the name of a placement plug-in configured on the SC (lowercase letters, digits and '-')"
            ) from None


_REPLICAS = operator.attrgetter("replicas")


class TopicSpec(Model):
    """Either computed (partitions + replicationFactor) or manual (replicaAssignment)."""

    partitions: Annotated[int, Field(ge=1, le=MAX_PARTITIONS)] | None = None
    replication_factor: Annotated[int, Field(ge=1, le=MAX_REPLICATION_FACTOR)] | None = None
    ignore_rack_assignment: bool = False
    placement: PlacementSpec | None = None
    # One row per partition: at most MAX_PARTITIONS, as a computed topic.
    replica_assignment: Annotated[list[PartitionAssignment], Field(max_length=MAX_PARTITIONS)] | None = None

    @field_validator("replica_assignment")
    @classmethod
    def _rows_fit(cls, rows: list[PartitionAssignment] | None) -> list[PartitionAssignment] | None:
        """Every row within the largest replication factor: one call for the topic, the lengths
        taken in C (a validator per row was one Python call per partition, 0.5 s for 100,000)."""
        if not rows or max(map(len, map(_REPLICAS, rows))) <= MAX_REPLICATION_FACTOR:
            return rows
        row = next(row for row in rows if len(row.replicas) > MAX_REPLICATION_FACTOR)
        raise ValueError(
            f"partition {row.id} lists {len(row.replicas)} replicas; at most {MAX_REPLICATION_FACTOR} "
            "are allowed (the largest replication factor)"
        )

    @model_validator(mode="after")
    def _one_mode(self) -> Self:
        if self.replica_assignment is not None:
            computed_fields = [
                name
                for name, value in (
                    ("partitions", self.partitions),
                    ("replicationFactor", self.replication_factor),
                    ("placement", self.placement),
                )
                if value is not None
            ]
            if computed_fields:
                raise ValueError(
                    "a topic is either computed or manual: replicaAssignment cannot be combined with "
                    + ", ".join(computed_fields)
                )
            if not self.replica_assignment:
                raise ValueError("replicaAssignment must list at least one partition")
            return self
        missing = [
            name
            for name, value in (
                ("partitions", self.partitions),
                ("replicationFactor", self.replication_factor),
            )
            if value is None
        ]
        if missing:
            raise ValueError(
                f"a computed topic needs {' and '.join(missing)} (or give replicaAssignment instead)"
            )
        return self

    @property
    def is_manual(self) -> bool:
        return self.replica_assignment is not None

    def partition_count(self) -> int:
        if self.replica_assignment is not None:
            return len(self.replica_assignment)
        assert self.partitions is not None
        return self.partitions


class TopicStatus(Model):
    resolution: TopicResolution = TopicResolution.INIT
    # Partition index -> its replicas, preferred leader first: each row can be a partition.
    replica_map: dict[PartitionId, list[SpuId]] = Field(default_factory=dict)
    reason: str = ""

    @field_validator("replica_map")
    @classmethod
    def _rows_are_partitions(cls, replica_map: dict[int, list[int]]) -> dict[int, list[int]]:
        for index, replicas in replica_map.items():
            if len(set(replicas)) != len(replicas) or not replicas:
                if not replicas:
                    raise ValueError(f"replicaMap row {index} lists no SPU")
                twice = next(spu for spu in replicas if replicas.count(spu) > 1)
                raise ValueError(f"replicaMap row {index} lists SPU {twice} more than once: {replicas}")
        return replica_map


# ---------------------------------------------------------------------------- Partition


class PartitionResolution(str, enum.Enum):
    OFFLINE = "Offline"
    ONLINE = "Online"
    LEADER_OFFLINE = "LeaderOffline"


class ReplicaStatus(Model):
    spu: SpuId
    # 64-bit, as on Fluvio's wire (a larger offset could not be listed to a Fluvio client).
    hw: Annotated[int, Field(ge=-1, le=2**63 - 1)] = -1
    leo: Annotated[int, Field(ge=-1, le=2**63 - 1)] = -1


class Reassignment(Model):
    """A replica move in progress (Kafka's KIP-455): the replicas before it and the ones it ends with,
    preferred leader first. Written by the SC's rebalance controller; carried out by the partition
    controller (docs/replication.md, "Moving replicas"). A cancelled move has ``target`` = ``previous``."""

    previous: Annotated[list[SpuId], Field(min_length=1)] = Field(
        description="the replicas when the move started; spec.replicas holds all of them until it ends"
    )
    target: Annotated[list[SpuId], Field(min_length=1)] = Field(
        description="the replicas the move ends with, preferred leader first"
    )

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        for field_name, spus in (("previous", self.previous), ("target", self.target)):
            if len(set(spus)) != len(spus):
                raise ValueError(f"reassignment {field_name} {spus} lists an SPU more than once")
        return self

    @property
    def adding(self) -> list[int]:
        """The SPUs that receive a replica: they must be in the committed in-sync set before any leaves."""
        previous = set(self.previous)
        return [spu for spu in self.target if spu not in previous]

    @property
    def cancelled(self) -> bool:
        return self.target == self.previous


# A partition's identity (``Partition.uid``): drawn at random by the SC that creates the partition,
# and kept by every rewrite of it. Stored in the object, it survives any copy of the store (a
# snapshot restored, or every key written anew into another store, as `etcdctl make-mirror` does),
# where a key's create revision does not. Object metadata (Kubernetes' ``metadata.uid``), beside
# the name: not in the spec, which the local store shares between partitions of one replica list
# (an identity there made every spec its own, 280 bytes a partition). 63 bits, at least 1: a
# positive 64-bit integer, as on 9004's wire.
MAX_PARTITION_UID = 2**63 - 1
PartitionUid: TypeAlias = Annotated[int, Field(ge=1, le=MAX_PARTITION_UID, strict=True)]


def new_partition_uid() -> int:
    return secrets.randbelow(MAX_PARTITION_UID) + 1


class PartitionSpec(Model):
    leader: SpuId
    replicas: Annotated[list[SpuId], Field(min_length=1)]
    # While a move is in progress: replicas is previous, then previous + the SPUs target adds (in
    # target's order), then target once the move ends (and this is gone).
    reassignment: Reassignment | None = None

    @model_validator(mode="after")
    def _leader_is_a_replica(self) -> Self:
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas {self.replicas} list an SPU more than once")
        if self.leader not in self.replicas:
            raise ValueError(f"leader {self.leader} is not one of the replicas {self.replicas}")
        if self.reassignment is not None and not set(self.reassignment.previous) <= set(self.replicas):
            raise ValueError(
                f"reassignment previous {self.reassignment.previous} must be among the replicas {self.replicas}"
            )
        return self


# The largest leader or partition epoch: 64-bit, as on 9004's wire (an epoch past it could not be
# told to an SPU). A partition at it cannot change leader or in-sync set any more.
MAX_EPOCH = 2**63 - 1


class PartitionStatus(Model):
    """A partition's state, written by the SC's partition controller only. leaderEpoch, partitionEpoch
    and isr change in the same compare-and-swap write as spec.leader; elections decide from them
    alone (docs/replication.md)."""

    resolution: PartitionResolution = PartitionResolution.OFFLINE
    leader_epoch: Annotated[int, Field(ge=0, le=MAX_EPOCH)] = Field(
        0, description="+1 at every leader change (to no leader too), in the same write as spec.leader; never decreases"
    )
    partition_epoch: Annotated[int, Field(ge=0, le=MAX_EPOCH)] = Field(
        0, description="+1 at every change of the leader or of isr; 0 while the partition is as created"
    )
    # Empty at partitionEpoch 0 (every replica is in sync: nothing is committed yet), and after a
    # member that lost records was removed with nobody left (only an unclean election helps then).
    isr: list[SpuId] = Field(
        default_factory=list,
        description=(
            "the committed in-sync set (SPU ids): every member holds every committed record; written by the SC "
            "only. At partitionEpoch 0 it is empty and every replica counts as in sync"
        ),
    )
    leader: ReplicaStatus | None = None
    replicas: list[ReplicaStatus] = Field(default_factory=list)
    lrs: Annotated[int, Field(ge=0)] = 0

    @field_validator("isr")
    @classmethod
    def _isr_lists_each_spu_once(cls, isr: list[int]) -> list[int]:
        if len(set(isr)) != len(isr):
            raise ValueError(f"isr {isr} lists an SPU more than once")
        return isr


_DEFAULT_SPU_STATUS = SpuStatus()
_DEFAULT_SPUGROUP_STATUS = SpuGroupStatus()
_DEFAULT_TOPIC_STATUS = TopicStatus()
_DEFAULT_PARTITION_STATUS = PartitionStatus()


def partition_name(topic: str, index: int) -> str:
    return f"{topic}-{index}"


def new_partition(topic: Topic, index: int, replicas: list[int]) -> Partition:
    """Partition ``index`` of the stored ``topic``: leader = first replica, status Offline, and an
    identity of its own (``uid``, drawn here).

    Equal to ``Partition(name=..., spec=PartitionSpec(...))`` but built without pydantic's
    validation, which is most of the cost of provisioning (one per partition). The topic's
    name is already valid and the index is an int, so only the replicas are checked here,
    with the same message as the validator.
    """
    replicas = list(replicas)
    uid = new_partition_uid()
    plain = all(type(replica) is int and replica >= 0 for replica in replicas)
    if not replicas or not plain or len(set(replicas)) != len(replicas):
        # The validated path: raises with the model's own message (or coerces, as it would).
        spec = PartitionSpec(leader=replicas[0] if replicas else 0, replicas=replicas)
        return Partition(name=partition_name(topic.name, index), uid=uid, spec=spec)
    if type(index) is not int or not 0 <= index <= MAX_PARTITION_ID:
        raise ValueError(f"partition index {index!r} is not an integer from 0 to {MAX_PARTITION_ID}")
    spec = PartitionSpec.model_construct(leader=replicas[0], replicas=replicas)
    return Partition.model_construct(
        name=partition_name(topic.name, index), uid=uid, spec=spec, status=_DEFAULT_PARTITION_STATUS
    )


def split_partition_name(name: str) -> tuple[str, int]:
    """``orders-7`` -> (``orders``, 7). Raises ValueError naming the value if malformed."""
    match = _PARTITION_NAME.match(name)
    if not match:
        raise ValueError(f"partition name {name!r} is not of the form <topic>-<index>")
    digits = match["index"]
    # Its length first: int() of thousands of digits is slow, and refused past 4,300.
    if len(digits) > _SHORT_INDEX_DIGITS + 1 or int(digits) > MAX_PARTITION_ID:
        raise ValueError(
            f"partition name {name!r} has index {digits}, above {MAX_PARTITION_ID}, the largest partition id "
            "(Fluvio's are 32-bit)"
        )
    return match["topic"], int(digits)


# ---------------------------------------------------------------------------- objects


SpecT = TypeVar("SpecT", bound=Model)
StatusT = TypeVar("StatusT", bound=Model)


class ClusterObject(Model, Generic[SpecT, StatusT]):
    """``{"name", "spec", "status"}``; each kind's subclass fixes the spec and status types, so
    ``topic.spec`` is a ``TopicSpec`` to the type checker as it is at run time."""

    kind: ClassVar[str]
    name: str
    spec: SpecT
    status: StatusT

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_name(name)

    @property
    def key(self) -> str:
        return object_key(self.kind, self.name)


class Spu(ClusterObject[SpuSpec, SpuStatus]):
    kind: ClassVar[str] = "spus"
    # One shared default: statuses are immutable, and copying a default per object costs time and memory.
    status: SpuStatus = Field(default_factory=lambda: _DEFAULT_SPU_STATUS)


class SpuGroup(ClusterObject[SpuGroupSpec, SpuGroupStatus]):
    kind: ClassVar[str] = "spu-groups"
    # One shared default: statuses are immutable, and copying a default per object costs time and memory.
    status: SpuGroupStatus = Field(default_factory=lambda: _DEFAULT_SPUGROUP_STATUS)


class Topic(ClusterObject[TopicSpec, TopicStatus]):
    kind: ClassVar[str] = "topics"
    # One shared default: statuses are immutable, and copying a default per object costs time and memory.
    status: TopicStatus = Field(default_factory=lambda: _DEFAULT_TOPIC_STATUS)


class Partition(ClusterObject[PartitionSpec, PartitionStatus]):
    kind: ClassVar[str] = "partitions"
    uid: PartitionUid | None = Field(
        None,
        description=(
            "the partition's identity, read-only: chosen at random by the SC when it creates the partition and kept "
            "by every change of it, so a partition deleted and created again under its name is another one to its "
            "SPUs. Absent from partitions created before SC versions that set it: those have no identity"
        ),
    )
    # One shared default: statuses are immutable, and copying a default per object costs time and memory.
    status: PartitionStatus = Field(default_factory=lambda: _DEFAULT_PARTITION_STATUS)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if (
            _VALID_PARTITION_NAME.match(name)
            and (dash := name.rindex("-")) <= NAME_MAX_LENGTH
            and len(name) - dash - 1 <= _SHORT_INDEX_DIGITS
        ):
            return name
        # The slow path only to say exactly what is wrong.
        topic, _ = split_partition_name(name)
        validate_name(topic, "partition's topic name")
        return name

    # The name was validated at construction: a plain split is enough (hot in controllers).
    @property
    def topic(self) -> str:
        return self.name.rpartition("-")[0]

    @property
    def index(self) -> int:
        return int(self.name.rpartition("-")[2])

    def in_sync(self) -> list[int]:
        """The committed in-sync set: ``status.isr``, or every replica while the partition is as
        created (partition epoch 0: nothing is committed, so every replica holds all of it). Only
        replicas are members: SPUs a stored set lists beside them (anyone may have written it) are
        not, and leave it at the SC's next write."""
        status = self.status
        replicas = self.spec.replicas
        if status.partition_epoch == 0:
            return list(replicas)
        isr = status.isr
        return isr if all(spu in replicas for spu in isr) else [spu for spu in isr if spu in replicas]


# Any kind of object, where the kind is only known at run time (a key read from the store, a route's
# parameter). A string, so that no parametrised model class is made at import.
AnyObject: TypeAlias = "ClusterObject[Any, Any]"

KINDS: dict[str, type[AnyObject]] = {
    model.kind: model for model in (Spu, SpuGroup, Topic, Partition)
}
KindName = Literal["spus", "spu-groups", "topics", "partitions"]


def object_key(kind: str, name: str) -> str:
    """The object's key relative to the store prefix: ``topics/orders``."""
    return f"{kind}/{name}"


def model_for_kind(kind: str) -> type[AnyObject]:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}") from None


def encode(obj: AnyObject) -> bytes:
    """The value stored in the KV store: the object's canonical camelCase JSON."""
    return obj.model_dump_json(by_alias=True, exclude_none=True).encode()


@overload
def decode(kind: Literal["spus"], value: bytes) -> Spu: ...
@overload
def decode(kind: Literal["spu-groups"], value: bytes) -> SpuGroup: ...
@overload
def decode(kind: Literal["topics"], value: bytes) -> Topic: ...
@overload
def decode(kind: Literal["partitions"], value: bytes) -> Partition: ...
@overload
def decode(kind: str, value: bytes) -> AnyObject: ...
def decode(kind: str, value: bytes) -> AnyObject:
    return model_for_kind(kind).model_validate_json(value)


# Problems described at most, and characters of a field's path or of a message (both may quote
# what a client sent: an unknown key, a validator's "name '...' is not valid").
MAX_PROBLEMS_DESCRIBED = 10
MAX_PROBLEM_CHARS = 200
# Problems read out of a validation error at most. pydantic stops a list at its first bad entry
# (fail_fast) but reports every unknown field of an object, and hands its problems out only all at
# once: the 1.3 million of a 15 MB body took seconds and gigabytes to list.
MAX_PROBLEMS_READ = 1_000


def validation_problems(error: pydantic.ValidationError) -> list[pydantic_core.ErrorDetails] | None:
    """``error``'s problems, or None when it has more than MAX_PROBLEMS_READ."""
    if error.error_count() > MAX_PROBLEMS_READ:
        return None
    return error.errors(include_url=False)


def describe_validation_error(error: pydantic.ValidationError) -> str:
    """One line per problem (the first few), each naming the field (camelCase path) and the
    offending value, a long one shortened; only their count past MAX_PROBLEMS_READ."""
    lines = []
    problems = validation_problems(error)
    if problems is None:
        return (
            f"the object has {error.error_count()} problems, more than the {MAX_PROBLEMS_READ} described one by "
            "one (unknown fields are a problem each)"
        )
    for problem in problems[:MAX_PROBLEMS_DESCRIBED]:
        location = _clip(".".join(str(part) for part in problem["loc"]) or "(object)")
        message = _clip(problem["msg"].removeprefix("Value error, "))
        if problem["type"] in ("missing",):
            lines.append(f"{location}: field required")
        elif problem["type"] == "extra_forbidden":
            lines.append(f"{location}: unknown field (value {_quoted(problem['input'])})")
        elif problem["type"] == "value_error" and not problem["loc"]:
            lines.append(message)
        else:
            lines.append(f"{location}: {message} (got {_quoted(problem['input'])})")
    if len(problems) > MAX_PROBLEMS_DESCRIBED:
        lines.append(f"and {len(problems) - MAX_PROBLEMS_DESCRIBED} more problems")
    return "; ".join(lines)


def _quoted(value: Any) -> str:
    """``repr(value)``, shortened when long: a 16 MiB name is not sent back whole, and a list of
    100,000 rows is not written out (0.2 s) to show its start."""
    if isinstance(value, str) and len(value) > MAX_PROBLEM_CHARS:
        return f"{value[:MAX_PROBLEM_CHARS]!r}... ({len(value)} characters)"
    if isinstance(value, list) and len(value) > MAX_PROBLEM_CHARS:
        # Each item takes at least a character and a comma: the first ones fill the excerpt.
        return f"{repr(value[:MAX_PROBLEM_CHARS])[:MAX_PROBLEM_CHARS]}... ({len(value)} items)"
    return _clip(repr(value))


def _clip(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else f"{text[:MAX_PROBLEM_CHARS]}... ({len(text)} characters)"


class Interner:
    """Shares equal partition specs and offset-free statuses between partition objects.

    A cluster of 100,000 partitions has a few thousand distinct replica lists and a handful of
    distinct fresh statuses; sharing them (they are immutable) more than halves the local
    store's memory. Use only on objects nobody else holds yet (just decoded).

    The tables hold their parts weakly: a part no object uses any more leaves them, so a
    long-running SC does not keep every replica list and every leaderless epoch it ever saw (a
    weak table costs about 0.5 µs more an object than a plain one: 50 ms at 100,000 partitions).
    """

    def __init__(self) -> None:
        self._specs: weakref.WeakValueDictionary[tuple[int, tuple[int, ...]], PartitionSpec] = weakref.WeakValueDictionary()
        self._statuses: weakref.WeakValueDictionary[
            tuple[PartitionResolution, int, int, int, tuple[int, ...]], PartitionStatus
        ] = weakref.WeakValueDictionary()
        self._all_fields = {"name", "spec", "status"}
        self._all_fields_with_uid = {"name", "uid", "spec", "status"}  # a partition with an identity

    def __len__(self) -> int:
        """The shared parts held, specs and statuses together."""
        return len(self._specs) + len(self._statuses)

    def intern(self, obj: AnyObject) -> AnyObject:
        if not isinstance(obj, Partition):
            return obj
        fields = obj.__dict__  # frozen for users; the values put back here are equal
        spec = obj.spec
        if spec.reassignment is None:  # a move in progress is rare, and not shared
            fields["spec"] = self._specs.setdefault((spec.leader, tuple(spec.replicas)), spec)
        status = obj.status
        if status.leader is None and not status.replicas:
            key = (status.resolution, status.lrs, status.leader_epoch, status.partition_epoch, tuple(status.isr))
            fields["status"] = self._statuses.setdefault(key, status)
        # pydantic copies this set before changing it (model_copy): sharing it is safe.
        if obj.__pydantic_fields_set__ == self._all_fields:
            object.__setattr__(obj, "__pydantic_fields_set__", self._all_fields)
        elif obj.__pydantic_fields_set__ == self._all_fields_with_uid:
            object.__setattr__(obj, "__pydantic_fields_set__", self._all_fields_with_uid)
        return obj
