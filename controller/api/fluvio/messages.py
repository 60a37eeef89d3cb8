"""Fluvio's admin messages, the subset of ../shared/fluvio-wire.md this SC speaks: request and response
headers and framing, ApiVersions, the type-labelled object API (List, Watch, Create, Delete, Update)
and the Status answer. Each message is declared once: its dataclass names every field's wire layout,
and each API is one entry of APIS.

Purely computational and sans-I/O: functions of bytes only, no asyncio, aiohttp, structlog or logging.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Annotated, Any

from controller.api.fluvio import objects
from controller.api.fluvio.objects import Metadata
from controller.api.fluvio.primitives import (
    BOOL,
    I16,
    I32,
    I64,
    REST,
    STRING,
    U8,
    U16,
    U32,
    Codec,
    CodecError,
    DecodeError,
    EncodeError,
    EnumU8,
    OptionOf,
    Reader,
    Since,
    Struct,
    Tagged,
    VecOf,
    struct,
)

# ---------------------------------------------------------------------------- constants

API_VERSIONS = 18
CREATE = 1001
DELETE = 1002
LIST = 1003
WATCH = 1004
UPDATE = 1006

# The type-labelled layout (label, u32 length, payload) starts at 11; below is the "classic"
# layout, which the 0.21 client never sends to a server advertising 19.
OBJECT_MIN_VERSION = 11
OBJECT_MAX_VERSION = 19

# fluvio-protocol's own MAX_BYTES; servers may cap lower.
MAX_FRAME_BYTES = 52_428_800
# The largest length a frame's i32 prefix can announce.
LARGEST_FRAME_LENGTH = 2**31 - 1
# A request's header starts with its API key (u16): read ahead of the rest of its frame, it says how
# large that frame may be.
API_KEY_BYTES = 2
# The largest frame of a request other than a Create, refused above it before it is read. They carry
# a few names and numbers: the largest a client sends, a List of MAX_NAME_FILTERS filters as long as
# the longest name (63 characters), is under 5 KiB, and one String at Fluvio's longest (32,767
# bytes) fits besides; a larger frame is only work for the event loop (a Create is bounded by what
# the store could hold instead: check_request_size).
MAX_SMALL_REQUEST_BYTES = 64 * 1024
# Name filters of one List (the real client sends one or none); a List with more is undecodable,
# which closes the connection: each filter is tried on every object, on the event loop (two million
# of them in a 16 MiB frame held it two minutes against 1,000 topics).
MAX_NAME_FILTERS = 64


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

    name: Annotated[str, STRING]
    error_code: Annotated[ErrorCode, ERROR_CODE] = OK
    error_message: Annotated[str | None, OptionOf(STRING)] = None


STATUS = struct(Status)


# ---------------------------------------------------------------------------- headers and framing


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: Annotated[int, U16]
    api_version: Annotated[int, I16]
    correlation_id: Annotated[int, I32]
    client_id: Annotated[str, STRING] = "fluvio"


REQUEST_HEADER = struct(RequestHeader)


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


class FrameTooLarge(DecodeError):
    """A request frame larger than its API allows, known from its length and API key alone."""

    def __init__(self, api_key: int, length: int, limit: int) -> None:
        super().__init__(f"{API_NAMES[api_key]} frame of {length} bytes is above the limit of {limit} bytes for that API")
        self.api_key = api_key
        self.length = length
        self.limit = limit


def check_request_size(
    head: bytes, length: int, create_limit: int, small_limit: int = MAX_SMALL_REQUEST_BYTES
) -> None:
    """Judge a request frame of ``length`` bytes by its first bytes ``head`` (its API key, the rest
    unread): DecodeError if it cannot hold an API key or its API is not served, FrameTooLarge above
    its API's limit, ``create_limit`` for a Create and ``small_limit`` for the others."""
    if len(head) < API_KEY_BYTES:
        raise DecodeError(f"a frame of {length} bytes cannot hold a request header")
    api_key = int.from_bytes(head[:API_KEY_BYTES], "big")
    if api_key not in API_NAMES:
        raise _unserved(api_key)
    limit = create_limit if api_key == CREATE else small_limit
    if length > limit:
        raise FrameTooLarge(api_key, length, limit)


# ---------------------------------------------------------------------------- ApiVersions


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    client_version: Annotated[str, STRING, Since(1)] = ""
    client_os: Annotated[str, STRING, Since(1)] = ""
    client_arch: Annotated[str, STRING, Since(1)] = ""


@dataclass(frozen=True, slots=True)
class ApiVersionKey:
    api_key: Annotated[int, I16]
    min_version: Annotated[int, I16]
    max_version: Annotated[int, I16]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersionsResponse:
    """Keyword-only: its wire layout starts with the error code, which has a default."""

    error_code: Annotated[ErrorCode, ERROR_CODE] = OK
    api_keys: Annotated[list[ApiVersionKey], VecOf(struct(ApiVersionKey))]
    platform_version: Annotated[str, STRING]


API_VERSIONS_REQUEST = struct(ApiVersionsRequest)
API_VERSIONS_RESPONSE = struct(ApiVersionsResponse)


# ---------------------------------------------------------------------------- object requests
# A request's ``label`` travels in front of its payload (the TypeBuffer), not in it.


@dataclass(frozen=True, slots=True)
class ListRequest:
    label: str
    name_filters: Annotated[list[str], VecOf(STRING, MAX_NAME_FILTERS)] = field(default_factory=list)
    summary: Annotated[bool, BOOL, Since(10)] = False
    system: Annotated[bool, BOOL, Since(13)] = False


@dataclass(frozen=True, slots=True)
class WatchRequest:
    label: str
    epoch: Annotated[int, I64] = 0
    summary: Annotated[bool, BOOL, Since(10)] = False


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """``spec`` is a TopicSpec, CustomSpuSpec or SpuGroupSpec; raw bytes for labels this SC does not
    serve. Keyword-only from ``dry_run``: the spec comes last on the wire."""

    label: str
    name: Annotated[str, STRING]
    _: KW_ONLY
    dry_run: Annotated[bool, BOOL] = False
    timeout_ms: Annotated[int | None, OptionOf(U32), Since(7)] = None
    spec: Any


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
    force: Annotated[bool, BOOL, Since(13)] = False


@dataclass(frozen=True, slots=True)
class AddPartition:
    count: Annotated[int, U32]


@dataclass(frozen=True, slots=True)
class AddMirror:
    remote_cluster: Annotated[str, STRING]
    home_to_mirror: Annotated[bool, BOOL] = False


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """``action`` is AddPartition or AddMirror for the label Topic; raw bytes for other labels."""

    label: str
    key: Annotated[str, STRING]
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


UPDATE_ACTION = Tagged("UpdateTopicAction", U8, {0: struct(AddPartition), 1: struct(AddMirror)})
LIST_PAYLOAD = struct(ListRequest)
WATCH_PAYLOAD = struct(WatchRequest)
_CREATE_PAYLOADS = {label: struct(CreateRequest, spec=spec) for label, spec in objects.CREATE_SPECS.items()}
_CREATE_RAW = struct(CreateRequest, spec=REST)
_DELETE_BY_NAME = struct(DeleteRequest, key=STRING)
_DELETE_CUSTOM_SPU = struct(DeleteRequest, key=_CustomSpuKey())
_UPDATE_TOPIC = struct(UpdateRequest, action=UPDATE_ACTION)
_UPDATE_RAW = struct(UpdateRequest, action=REST)

ObjectRequest = ListRequest | WatchRequest | CreateRequest | DeleteRequest | UpdateRequest


@dataclass(frozen=True, slots=True)
class Api:
    """One API of the admin protocol, declared once: its key, its name, its request type and, for
    the object APIs, the payload layout for a type label."""

    key: int
    name: str
    request: type
    payload: Callable[[str], Struct] | None = None


APIS = (
    Api(API_VERSIONS, "ApiVersions", ApiVersionsRequest),
    Api(CREATE, "Create", CreateRequest, lambda label: _CREATE_PAYLOADS.get(label, _CREATE_RAW)),
    Api(DELETE, "Delete", DeleteRequest, lambda label: _DELETE_CUSTOM_SPU if label == objects.CUSTOM_SPU else _DELETE_BY_NAME),
    Api(LIST, "List", ListRequest, lambda label: LIST_PAYLOAD),
    Api(WATCH, "Watch", WatchRequest, lambda label: WATCH_PAYLOAD),
    Api(UPDATE, "Update", UpdateRequest, lambda label: _UPDATE_TOPIC if label == objects.TOPIC else _UPDATE_RAW),
)
# Views of APIS.
API_NAMES = {api.key: api.name for api in APIS}
OBJECT_APIS = tuple(api.key for api in APIS if api.payload is not None)
_BY_KEY = {api.key: api for api in APIS}
_REQUEST_TYPES = {api.request: api.key for api in APIS}


def _unserved(api_key: int) -> DecodeError:
    return DecodeError(f"API key {api_key} is not one this SC serves (known: {sorted(API_NAMES)})")


def _payload(api_key: int, label: str) -> Struct:
    api = _BY_KEY.get(api_key)
    if api is None or api.payload is None:
        raise CodecError(f"API key {api_key} is not an object API")
    return api.payload(label)


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
        raise _unserved(header.api_key)
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
    return Request(header, _BY_KEY[header.api_key].request(label=label, **body))


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
        return list_body(response.label, [objects.encode_metadata(response.label, item, version) for item in response.items])
    elif isinstance(response, WatchResponse):
        update = response.update
        return watch_body(
            response.label,
            update.epoch,
            [(message.header, objects.encode_metadata(response.label, message.content, version)) for message in update.changes],
            [objects.encode_metadata(response.label, item, version) for item in update.all],
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
        if count > 0 and label not in objects.METADATA:
            raise DecodeError(f"a List answer of {count} {label!r} items, a type this codec does not know")
        items = [objects.METADATA[label].decode(payload, version) for _ in range(max(count, 0))]
        return correlation_id, ListResponse(label, items)
    epoch = I64.decode(payload, version)
    changes = []
    for _ in range(max(I32.decode(payload, version), 0)):
        header = EnumU8(MessageType).decode(payload, version)
        changes.append(Message(header, objects.metadata_codec(label).decode(payload, version)))
    snapshot = [objects.metadata_codec(label).decode(payload, version) for _ in range(max(I32.decode(payload, version), 0))]
    return correlation_id, WatchResponse(label, MetadataUpdate(epoch, changes, snapshot))
