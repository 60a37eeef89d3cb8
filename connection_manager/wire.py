"""Messages between the SC and its SPUs on the private port: pydantic models, one JSON object a frame.

Purely computational, no I/O: ``parse_*`` turns a frame's bytes into a message or raises
``FrameError`` naming what was wrong; ``encode`` turns a message into bytes.
Every message carries a ``type`` tag and the protocol version ``v``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from typing_extensions import NotRequired, TypedDict

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel

PROTOCOL_VERSION = 1
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
    v: Literal[1] = PROTOCOL_VERSION


# 64-bit, as offsets are everywhere (Fluvio's wire, Kafka's): a larger one could not be passed on.
Offset = Annotated[int, Field(ge=0, le=2**63 - 1)]
SpuId = Annotated[int, Field(ge=0, le=2**31 - 1)]
PartitionName = Annotated[str, Field(min_length=3, max_length=200)]


# ----------------------------------------------------------------- shared pieces


class Endpoint(Message):
    v: Literal[1] = Field(default=PROTOCOL_VERSION, exclude=True)
    host: str
    port: int


class SpuInfo(Message):
    """What an SPU needs to know of another SPU: where to fetch from, and its rack."""

    v: Literal[1] = Field(default=PROTOCOL_VERSION, exclude=True)
    id: SpuId
    name: str
    rack: str | None = None
    public_endpoint: Endpoint
    private_endpoint: Endpoint


class ReplicaInfo(Message):
    """A partition this SPU hosts: who leads it and the full replica list (preferred leader first)."""

    v: Literal[1] = Field(default=PROTOCOL_VERSION, exclude=True)
    partition: PartitionName
    leader: SpuId | None  # None while the partition has no leader (LeaderOffline)
    replicas: list[SpuId]


# The entries of a live-replica report are TypedDicts, validated by pydantic like the models but
# built as plain dicts: an SPU leading thousands of partitions sends thousands of them every
# 400 ms, and building a model instance for each would cost the SC twice the parsing time.
_ENTRY = pydantic.ConfigDict(extra="forbid")


@pydantic.with_config(_ENTRY)
class ReplicaOffsets(TypedDict):
    """A follower's offsets, as its leader tracks them."""

    spu: SpuId
    hw: Offset
    leo: Offset


@pydantic.with_config(_ENTRY)
class LeaderReport(TypedDict):
    """One partition a reporting SPU leads: its own offsets and each follower's, as it tracks them."""

    partition: PartitionName
    hw: Offset
    leo: Offset
    followers: NotRequired[list[ReplicaOffsets]]


# ----------------------------------------------------------------- SPU -> SC


class Register(Message):
    """First frame of a connection: the SPU's id and, if the SC requires one, the shared token."""

    type: Literal["register"] = "register"
    spu_id: SpuId
    token: str | None = None


class LiveReplicas(Message):
    """Live-replica status (LRS): every partition this SPU leads. Also the heartbeat (may be empty).

    Each frame is a complete snapshot, so a newer frame supersedes an older one: an SC that is
    behind takes the newest frame of an SPU and skips the ones it replaces."""

    type: Literal["lrs"] = "lrs"
    leaders: list[LeaderReport] = []


SpuMessage = Annotated[Register | LiveReplicas, Field(discriminator="type")]


# ----------------------------------------------------------------- SC -> SPU


class Accepted(Message):
    type: Literal["accepted"] = "accepted"
    spu_id: SpuId
    heartbeat_timeout: float  # seconds of silence after which the SC marks the SPU offline


class Rejected(Message):
    """Sent before the SC closes a connection it refuses; ``code`` is stable, ``reason`` readable."""

    type: Literal["rejected"] = "rejected"
    code: str
    reason: str


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


class Error(Message):
    """A frame the SC refused; the connection stays open and nothing changed."""

    type: Literal["error"] = "error"
    code: str
    message: str


ScMessage = Annotated[Accepted | Rejected | Sync | Update | Error, Field(discriminator="type")]

_SPU_MESSAGES: pydantic.TypeAdapter[Register | LiveReplicas] = pydantic.TypeAdapter(SpuMessage)
_SC_MESSAGES: pydantic.TypeAdapter[Accepted | Rejected | Sync | Update | Error] = pydantic.TypeAdapter(ScMessage)


def encode(message: Message) -> bytes:
    return message.model_dump_json(by_alias=True).encode()


def parse_spu_message(frame: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> Register | LiveReplicas:
    """A frame an SPU sent, validated; raises FrameError (oversized, not JSON, bad version, bad field)."""
    return parse_with(_SPU_MESSAGES, frame, max_bytes)


def parse_sc_message(frame: bytes | str, max_bytes: int = MAX_FRAME_BYTES) -> Accepted | Rejected | Sync | Update | Error:
    """A frame the SC sent, validated (the SPU side of the same checks)."""
    return parse_with(_SC_MESSAGES, frame, max_bytes)


def parse_with(adapter: pydantic.TypeAdapter, frame: bytes | str, max_bytes: int):  # type: ignore[no-untyped-def]
    """``frame`` validated by ``adapter`` under the size limit; FrameError names what is wrong.

    The one frame validator of the package: the SPU-to-SPU fetch protocol uses it too."""
    size = len(frame.encode() if isinstance(frame, str) else frame)
    if size > max_bytes:
        raise FrameError("frame-too-large", f"frame of {size} bytes is over the limit of {max_bytes} bytes")
    try:
        return adapter.validate_json(frame)
    except pydantic.ValidationError as error:
        raise FrameError(*_describe(error)) from None


def _describe(error: pydantic.ValidationError) -> tuple[str, str]:
    first = error.errors(include_url=False)[0]
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
    return "invalid", f"field {location!r}: {first['msg']} (got {first['input']!r:.80})"
