"""Messages between the SC and its SPUs on the private port: pydantic models, one JSON object a frame.

Purely computational, no I/O: ``parse_*`` turns a frame's bytes into a message or raises
``FrameError`` naming what was wrong; ``encode`` turns a message into bytes.
Every message carries a ``type`` tag and the protocol version ``v``.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias, TypeVar

from typing_extensions import NotRequired, TypedDict

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel

from store import models

PROTOCOL_VERSION: Final = 2
# Largest frame either side accepts, by default; an SPU's full sync of thousands of replicas fits.
MAX_FRAME_BYTES = 4 * 1024 * 1024
# The WebSocket path on the SC's private port.
SPU_PATH = "/v1/spu"


class FrameError(ValueError):
    """A frame that cannot be accepted; ``code`` is stable for scripts, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Message(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )
    v: Literal[2] = PROTOCOL_VERSION


# 64-bit, as offsets are everywhere (Fluvio's wire, Kafka's): a larger one could not be passed on.
Offset = Annotated[int, Field(ge=0, le=2**63 - 1)]
# Epochs only grow by one per change, but a frame may carry anything: bounded like offsets.
Epoch = Annotated[int, Field(ge=0, le=2**63 - 1)]
SpuId = Annotated[int, Field(ge=0, le=2**31 - 1)]
# A partition's identity: its uid (store/models.py), drawn at random by the SC that created it,
# stored in the partition, the same for every SC of the store and for any copy of the store.
Uid = Annotated[int, Field(ge=1, le=2**63 - 1)]


def absent_when_none(value: object) -> bool:
    """For ``Field(exclude_if=...)``: a field added to a frame is left out while unset, so a peer
    older than the field (which refuses extra fields) still reads the frame."""
    return value is None
# An SPU connection's number (Accepted): positive, and within the wire's integer limit. An SC
# numbers its connections from a random base below 2**53 (connection_manager/server.py), so that
# two SC processes of one store hardly ever give out the same number.
IncarnationNumber = Annotated[int, Field(ge=1, le=2**63 - 1)]
PartitionName = Annotated[str, Field(min_length=3, max_length=200)]
# SPUs of one partition (distinct replicas): no more than a partition may have. Refused beyond,
# before anything holds them: a proposal's refusal quotes its set.
MAX_PARTITION_SPUS = models.MAX_REPLICATION_FACTOR
Item = TypeVar("Item")
# A list an SPU sends, validated up to its first bad entry only: the frame is refused anyway, and
# an error collected for each of the 1.4 million entries "[]" a 4 MB frame holds took the SC's
# event loop 7 s and 1.5 GB (the first frame of any client, before its registration, too).
Entries: TypeAlias = Annotated[list[Item], Field(fail_fast=True)]


# ----------------------------------------------------------------- shared pieces


class Endpoint(Message):
    v: Literal[2] = Field(default=PROTOCOL_VERSION, exclude=True)
    host: str
    port: int


class SpuInfo(Message):
    """What an SPU needs to know of another SPU: where to fetch from, and its rack."""

    v: Literal[2] = Field(default=PROTOCOL_VERSION, exclude=True)
    id: SpuId
    name: str
    rack: str | None = None
    public_endpoint: Endpoint
    private_endpoint: Endpoint


class ReplicaInfo(Message):
    """A partition this SPU hosts, as the SC committed it: who leads at which leader epoch, the
    committed in-sync set at which partition epoch, and the replica list (preferred leader first).
    ``uid``: which partition of that name (a partition deleted and created again is another one,
    with its own log); None for a partition created before SCs gave partitions an identity (or
    from an SC older than it): the SPU keeps the log it has of that name."""

    v: Literal[2] = Field(default=PROTOCOL_VERSION, exclude=True)
    partition: PartitionName
    # Left out when None, so an SPU older than the field reads what the SC says of such partitions.
    uid: Uid | None = Field(None, exclude_if=absent_when_none)
    leader: SpuId | None  # None while the partition has no leader the SPU may follow (LeaderOffline)
    leader_epoch: Epoch = 0
    partition_epoch: Epoch = 0
    isr: list[SpuId] = []
    replicas: list[SpuId]


# The entries of the frames that list partitions are TypedDicts, validated by pydantic like the
# models but built as plain dicts: an SPU hosting thousands of partitions lists thousands of them,
# and building a model instance for each would cost the SC twice the parsing time.
# Their keys are camelCase on the wire like the models' (``leaderEpoch``), snake_case in Python.
# ``uid`` in an entry about a partition: the one the SPU was told (ReplicaInfo) for the
# partition it speaks of; optional (an SPU older than it names none, and is read as before).
_ENTRY = pydantic.ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


@pydantic.with_config(_ENTRY)
class ReplicaOffsets(TypedDict):
    """A follower's offsets, as its leader tracks them at the current leader epoch."""

    spu: SpuId
    hw: Offset
    leo: Offset


@pydantic.with_config(_ENTRY)
class PartitionOffsets(TypedDict):
    """One partition a reporting SPU leads at ``leaderEpoch``: its own offsets and each follower's."""

    partition: PartitionName
    leader_epoch: Epoch
    hw: Offset
    leo: Offset
    followers: NotRequired[Entries[ReplicaOffsets]]
    uid: NotRequired[Uid]


@pydantic.with_config(_ENTRY)
class HostedReplica(TypedDict):
    """A replica the reporting SPU's process holds: its log end, and the leader epoch this process
    was last told for it (None: not told since the process started, e.g. just restored from disk)."""

    partition: PartitionName
    leo: Offset
    leader_epoch: Epoch | None
    uid: NotRequired[Uid]


@pydantic.with_config(_ENTRY)
class MemberIncarnation(TypedDict):
    """A follower a leader proposes into the in-sync set, and the incarnation (its connection to
    the SC, as its fetches said) under which the leader saw it catch up."""

    spu: SpuId
    incarnation: IncarnationNumber


@pydantic.with_config(_ENTRY)
class Leadership(TypedDict):
    partition: PartitionName
    leader_epoch: Epoch
    uid: NotRequired[Uid]


# ----------------------------------------------------------------- SPU -> SC


class Register(Message):
    """First frame of a connection: the SPU's id and, if the SC requires one, the shared token.

    ``unreachable_leader``: the leader (its private HOST:PORT, as a standby named it) this SPU
    could not reach since a standby sent it there: a standby that would name that one again holds
    the registration a moment instead (see ConnectionManager), and takes the SPU at once if it
    leads meanwhile. Left out of the frame when None, so an SC that predates it reads the frame."""

    type: Literal["register"] = "register"
    spu_id: SpuId
    token: str | None = None
    unreachable_leader: str | None = Field(default=None, max_length=300, exclude_if=absent_when_none)


class Hosted(Message):
    """Second frame of a connection, once: what this SPU process holds. The SC counts the SPU
    online only from here, and compares each replica's leader epoch with the committed state: a
    role (leader, in-sync member) this process was not told of is a restart."""

    type: Literal["hosted"] = "hosted"
    partitions: Entries[HostedReplica] = []


class Heartbeat(Message):
    """Sent every heartbeat interval; no per-partition payload."""

    type: Literal["heartbeat"] = "heartbeat"


class Leading(Message):
    """The SPU leads these partitions at these epochs (on change, and after each Sync)."""

    type: Literal["leading"] = "leading"
    partitions: Entries[Leadership]


class AlterIsr(Message):
    """A leader's proposal of a new committed in-sync set, made at the epochs it holds. ``hw``: its
    high watermark when it proposed (absent from older SPUs): a replica it proposes into the set
    holds every record below it, and once the SC commits the set it knows that much committed,
    even before the leader's next Offsets frame (the write that commits the set records it, a
    move's caught-up write too); a refused proposal's counts for nothing. ``incarnations``: for
    every SPU it adds to the committed set, the incarnation its fetches carried when it caught up
    (KIP-903): the SC adds it only if that is still its current connection (a new process may have
    lost records). Entries for members it keeps are allowed and not checked. ``uid``: the
    partition's it was told (left out of the frame when None, so an SC older than it reads it)."""

    type: Literal["alterIsr"] = "alterIsr"
    partition: PartitionName
    leader_epoch: Epoch
    partition_epoch: Epoch
    isr: Annotated[Entries[SpuId], Field(max_length=MAX_PARTITION_SPUS)]
    hw: Offset | None = None
    incarnations: Annotated[Entries[MemberIncarnation], Field(max_length=MAX_PARTITION_SPUS)] = []
    uid: Uid | None = Field(None, exclude_if=absent_when_none)


class Offsets(Message):
    """Live offsets of partitions this SPU leads: only those that changed since its previous
    Offsets frame, at most one frame per offsets interval, none while nothing changes."""

    type: Literal["offsets"] = "offsets"
    partitions: Entries[PartitionOffsets]


SpuMessage = Annotated[Register | Hosted | Heartbeat | Leading | AlterIsr | Offsets, Field(discriminator="type")]
SpuMessages = Register | Hosted | Heartbeat | Leading | AlterIsr | Offsets


# ----------------------------------------------------------------- SC -> SPU


class Accepted(Message):
    type: Literal["accepted"] = "accepted"
    spu_id: SpuId
    incarnation: IncarnationNumber  # this connection's number: every connection is a new one
    # Seconds of silence after which the SC marks the SPU offline (the SPU waits as long for the SC).
    heartbeat_timeout: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    offsets_interval: Annotated[float, Field(gt=0, allow_inf_nan=False)]  # the SPU sends at most one Offsets frame this often


class Rejected(Message):
    """Sent before the SC closes a connection it refuses; ``code`` is stable, ``reason`` readable."""

    type: Literal["rejected"] = "rejected"
    code: str
    reason: str
    # With code "not-leader": the private port (HOST:PORT) of the SC that leads, when known.
    leader: str | None = Field(default=None, max_length=300)


class Sync(Message):
    """The full picture for this SPU: every SPU's endpoint, and the replicas this SPU hosts."""

    type: Literal["sync"] = "sync"
    epoch: int
    spus: list[SpuInfo]
    replicas: list[ReplicaInfo]


class Update(Message):
    """A delta since the previous epoch: changed or new entries, and names/ids that are gone."""

    type: Literal["update"] = "update"
    epoch: int
    spus: list[SpuInfo] = []
    deleted_spus: list[SpuId] = []
    replicas: list[ReplicaInfo] = []
    deleted_replicas: list[PartitionName] = []
    # A new offsets interval for this SPU (seconds), when the SC changes it (the partitions grew).
    offsets_interval: float | None = Field(default=None, gt=0, le=3600)


class AlterIsrResult(Message):
    """The SC's answer to an AlterIsr: ``error`` None when the proposed set is committed. Either
    way, the partition's committed state: the leader adopts it (a newer partition epoch wins)."""

    type: Literal["alterIsrResult"] = "alterIsrResult"
    partition: PartitionName
    error: str | None = None
    message: str = ""
    leader_epoch: Epoch
    partition_epoch: Epoch
    isr: list[SpuId]


class Error(Message):
    """A frame the SC refused; the connection stays open and nothing changed. ``partition`` and
    ``leaderEpoch`` (the committed one) when it was about one partition at a stale epoch: an SPU
    leading it at an older epoch stops at once."""

    type: Literal["error"] = "error"
    code: str
    message: str
    partition: PartitionName | None = None
    leader_epoch: Epoch | None = None


ScMessage = Annotated[Accepted | Rejected | Sync | Update | AlterIsrResult | Error, Field(discriminator="type")]
ScMessages = Accepted | Rejected | Sync | Update | AlterIsrResult | Error

_SPU_MESSAGES: pydantic.TypeAdapter[SpuMessages] = pydantic.TypeAdapter(SpuMessage)
_SC_MESSAGES: pydantic.TypeAdapter[ScMessages] = pydantic.TypeAdapter(ScMessage)


def encode(message: Message) -> bytes:
    return message.model_dump_json(by_alias=True).encode()


def encode_json(value: object) -> bytes:
    """A frame built as plain data (the hot path of an SPU's reports), in the same JSON form."""
    return _ANY.dump_json(value)


_ANY: pydantic.TypeAdapter[object] = pydantic.TypeAdapter(object)
Parsed = TypeVar("Parsed")


def parse_spu_message(frame: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> SpuMessages:
    """A frame an SPU sent, validated; raises FrameError (oversized, not JSON, bad version, bad field)."""
    return parse_with(_SPU_MESSAGES, frame, max_bytes)


def parse_sc_message(frame: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> ScMessages:
    """A frame the SC sent, validated (the SPU side of the same checks)."""
    return parse_with(_SC_MESSAGES, frame, max_bytes)


def parse_with(adapter: pydantic.TypeAdapter[Parsed], frame: bytes | str, max_bytes: int) -> Parsed:
    """``frame`` validated by ``adapter`` under the size limit; FrameError names what is wrong.

    The one frame validator of the package: the SPU-to-SPU fetch protocol uses it too."""
    size = len(frame.encode() if isinstance(frame, str) else frame)
    if size > max_bytes:
        raise FrameError("frame-too-large", f"frame of {size} bytes is over the limit of {max_bytes} bytes")
    try:
        # Strict: an integer is a JSON integer, not "3", true or 3.0 (the protocol's types as
        # written, one reading of a frame whoever sent it).
        return adapter.validate_json(frame, strict=True)
    except pydantic.ValidationError as error:
        raise FrameError(*_describe(error)) from None


def _describe(error: pydantic.ValidationError) -> tuple[str, str]:
    problems = models.validation_problems(error)  # not all read out past models.MAX_PROBLEMS_READ
    if problems is None:
        return "invalid", (
            f"frame has {error.error_count()} problems, more than the {models.MAX_PROBLEMS_READ} a refusal names "
            "(unknown fields in one object, each a problem)"
        )
    first = problems[0]
    kind, location = first["type"], ".".join(str(part) for part in first["loc"])
    if kind == "json_invalid":
        return "malformed", f"frame is not valid JSON: {first['msg']}"
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        tag = first.get("ctx", {}).get("tag")
        return "unknown-type", f"unknown message type {tag!r}" if tag else "message has no 'type' field"
    if not first["loc"]:
        return "malformed", f"frame must be a JSON object, got {first['input']!r:.80}"
    if location.endswith("v") and kind == "literal_error":
        return "unsupported-version", (
            f"protocol version {first['input']!r} is not supported; this SC speaks version {PROTOCOL_VERSION}"
        )
    if any(part in _SECRET_FIELDS for part in first["loc"]):
        return "invalid", f"field {location!r}: {first['msg']} (its value is not shown: it may be a credential)"
    return "invalid", f"field {location!r}: {first['msg']} (got {first['input']!r:.80})"


# Fields whose value a refusal never quotes (it is logged and sent back), whatever its type.
_SECRET_FIELDS = frozenset({"token"})
