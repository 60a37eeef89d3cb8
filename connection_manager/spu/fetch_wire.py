"""The fetch protocol between SPUs: a follower asks its leader for records (offsets and epochs only).

Purely computational, no I/O. A frame: a 4-byte big-endian length, then a JSON object tagged like
``wire``'s (version 2). ``fetch`` requests, one in flight a connection; ``fetched`` answers, or
``error`` and close. Every partition of a fetch carries the follower's leader epoch and the epoch
of its last record; docs/replication.md gives the leader's rules.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal

import pydantic
from pydantic import Field

from connection_manager import wire

HEADER_BYTES = 4
_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = wire.MAX_FRAME_BYTES


class PartitionFetch(wire.Message):
    v: Literal[2] = Field(default=wire.PROTOCOL_VERSION, exclude=True)
    partition: wire.PartitionName
    offset: wire.Offset  # the follower's LEO: it has every record below this offset
    hw: wire.Offset
    leader_epoch: wire.Epoch  # the epoch the SC told the follower: the leader refuses any other
    last_fetched_epoch: Annotated[int, Field(ge=-1)]  # the epoch of its record at offset - 1; -1: empty log
    # Which partition of the name, as the SC told the follower: the leader refuses another one. Left
    # out when None (told none), so a leader older than the field reads the frame.
    uid: wire.Uid | None = Field(None, exclude_if=wire.absent_when_none)


class FetchRequest(wire.Message):
    """One fetch round of follower ``spu``: every partition it follows from this leader.

    ``incarnation``: the number of the follower's current connection to the SC (its Accepted):
    which process of the follower fetches. The leader keeps what it learns of a follower per
    incarnation, and names it when it proposes the follower into the in-sync set (KIP-903).
    None (left out): a follower older than the field, which its leader never proposes in."""

    type: Literal["fetch"] = "fetch"
    spu: wire.SpuId
    incarnation: wire.IncarnationNumber | None = None
    max_records: Annotated[int, Field(ge=0)]
    partitions: list[PartitionFetch]


class PartitionFetched(wire.Message):
    """The leader's answer for one partition: ``records`` records from ``offset``, whose leader
    epochs are ``epochs`` (``[epoch, start offset]`` runs, the first at ``offset``).

    ``divergingEpoch``/``divergingEndOffset`` (no records) when the follower's log parts from the
    leader's: the largest epoch <= its last one the leader holds, and where that epoch ends in the
    leader's log; it truncates there (or at its own end of that epoch, if smaller).
    ``error`` is set, and the offsets are 0, when the leader cannot serve this partition:
    ``not-leader`` (it does not lead it now), ``not-a-replica`` (the follower is not in its replica
    list), ``fenced-leader-epoch`` (the follower's epoch is older than the leader's: it waits for
    the SC's update), ``unknown-leader-epoch`` (newer: this leader was replaced and has not heard
    yet; the follower waits for its new leader), ``inconsistent-partition`` (the leader holds
    another partition of that name than the fetch's uid: deleted and created again,
    and one of the two has not read the SC's update yet; only to a fetch that names one).
    """

    v: Literal[2] = Field(default=wire.PROTOCOL_VERSION, exclude=True)
    partition: wire.PartitionName
    offset: wire.Offset
    leo: wire.Offset = 0
    hw: wire.Offset = 0
    records: wire.Offset = 0
    epochs: list[tuple[wire.Epoch, wire.Offset]] = []
    diverging_epoch: Annotated[int, Field(ge=-1)] | None = None
    diverging_end_offset: wire.Offset | None = None
    error: Literal["not-leader", "not-a-replica", "fenced-leader-epoch", "unknown-leader-epoch", "inconsistent-partition"] | None = None


class FetchResponse(wire.Message):
    type: Literal["fetched"] = "fetched"
    partitions: list[PartitionFetched]


class FetchError(wire.Message):
    """Sent before the leader closes a connection whose frame it could not accept."""

    type: Literal["error"] = "error"
    code: str
    message: str


# Tagged like wire's unions, so a frame without its ``type`` is refused rather than defaulted.
_REQUESTS: pydantic.TypeAdapter[FetchRequest] = pydantic.TypeAdapter(Annotated[FetchRequest, Field(discriminator="type")])
_RESPONSES: pydantic.TypeAdapter[FetchResponse | FetchError] = pydantic.TypeAdapter(
    Annotated[FetchResponse | FetchError, Field(discriminator="type")]
)


def encode(message: wire.Message) -> bytes:
    """The whole frame: length header and JSON body."""
    body = wire.encode(message)
    return _HEADER.pack(len(body)) + body


def body_length(header: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """The body length a frame header announces; raises wire.FrameError when it is over ``max_bytes``."""
    if len(header) != HEADER_BYTES:
        raise wire.FrameError("malformed", f"a frame header is {HEADER_BYTES} bytes, got {len(header)}")
    (length,) = _HEADER.unpack(header)
    if length > max_bytes:
        raise wire.FrameError("frame-too-large", f"frame of {length} bytes is over the limit of {max_bytes} bytes")
    return int(length)


def parse_request(body: bytes, max_bytes: int = MAX_FRAME_BYTES) -> FetchRequest:
    """A follower's frame body, validated; raises wire.FrameError naming what was wrong."""
    return wire.parse_with(_REQUESTS, body, max_bytes)


def parse_response(body: bytes, max_bytes: int = MAX_FRAME_BYTES) -> FetchResponse | FetchError:
    """A leader's frame body, validated; raises wire.FrameError naming what was wrong."""
    return wire.parse_with(_RESPONSES, body, max_bytes)
