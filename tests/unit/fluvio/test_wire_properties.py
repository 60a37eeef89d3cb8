"""Property tests of the codec: decoding what was encoded gives the object back, at every version the
SC speaks (fields a version does not carry come back as their defaults), and no byte string makes
the request decoder fail any other way than DecodeError."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.api.fluvio import messages, objects, primitives

VERSIONS = st.integers(messages.OBJECT_MIN_VERSION, messages.OBJECT_MAX_VERSION)
TEXT = st.text(max_size=12)
NAMES = st.text(alphabet="abz09-", max_size=12)
I32 = st.integers(-(2**31), 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
U16 = st.integers(0, 2**16 - 1)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def small_lists(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(strategy, max_size=4)


PARTITION_MIRROR = st.builds(objects.RemotePartitionConfig, TEXT, TEXT, I32, TEXT, st.booleans()) | st.builds(
    objects.HomePartitionConfig, TEXT, TEXT, st.booleans()
)
MIRROR_CONFIG = st.builds(
    objects.RemoteMirrorConfig, TEXT, small_lists(st.builds(objects.SpuMirrorConfig, I32, TEXT, TEXT)), st.booleans()
) | st.builds(objects.HomeMirrorConfig, small_lists(st.builds(objects.HomePartitionConfig, TEXT, TEXT, st.booleans())), st.booleans())
REPLICAS = (
    st.builds(objects.AssignedReplicas, small_lists(st.builds(objects.PartitionMap, U32, small_lists(I32), optional(PARTITION_MIRROR))))
    | st.builds(objects.ComputedReplicas, U32, U32, st.booleans())
    | st.builds(objects.MirrorReplicas, MIRROR_CONFIG)
)
CLEANUP = optional(st.builds(objects.SegmentCleanup, U32))
STORAGE = optional(st.builds(objects.TopicStorageConfig, optional(U32), optional(U64)))
DEDUP = optional(
    st.builds(
        objects.Deduplication,
        st.builds(objects.Bounds, U64, optional(st.builds(objects.Duration, U64, U32))),
        st.builds(objects.Filter, st.builds(objects.Transform, TEXT, st.dictionaries(TEXT, TEXT, max_size=3))),
    )
)
COMPRESSION = st.sampled_from(objects.Compression)
TOPIC = st.builds(
    objects.Metadata,
    NAMES,
    st.builds(objects.TopicSpec, REPLICAS, CLEANUP, STORAGE, COMPRESSION, DEDUP, st.booleans()),
    st.builds(
        objects.TopicStatus,
        st.sampled_from(objects.TopicResolution),
        st.dictionaries(U32, small_lists(I32), max_size=4),
        st.dictionaries(U32, PARTITION_MIRROR, max_size=2),
        TEXT,
    ),
)
REPLICA_STATUS = st.builds(objects.ReplicaStatus, I32, I64, I64)
PARTITION = st.builds(
    objects.Metadata,
    NAMES,
    st.builds(objects.PartitionSpec, I32, small_lists(I32), CLEANUP, STORAGE, COMPRESSION, DEDUP, st.booleans(), optional(PARTITION_MIRROR)),
    st.builds(
        objects.PartitionStatus,
        leader=REPLICA_STATUS,
        resolution=st.sampled_from(objects.PartitionResolution),
        lrs=U32,
        replicas=small_lists(REPLICA_STATUS),
        size=I64,
        is_being_deleted=st.booleans(),
        base_offset=I64,
    ),
)
ENCRYPTION = st.sampled_from(objects.Encryption)
INGRESS = st.builds(objects.IngressPort, U16, small_lists(st.builds(objects.IngressAddr, optional(TEXT), optional(TEXT))), ENCRYPTION)
ENDPOINT = st.builds(objects.Endpoint, U16, TEXT, ENCRYPTION)
SPU_STATUS = st.builds(objects.SpuStatus, st.sampled_from(objects.SpuResolution))
SPU = st.builds(
    objects.Metadata,
    NAMES,
    st.builds(objects.SpuSpec, I32, st.sampled_from(objects.SpuType), INGRESS, ENDPOINT, optional(TEXT), optional(ENDPOINT)),
    SPU_STATUS,
)
CUSTOM_SPU_SPEC = st.builds(objects.CustomSpuSpec, I32, INGRESS, ENDPOINT, optional(TEXT), optional(ENDPOINT))
CUSTOM_SPU = st.builds(objects.Metadata, NAMES, CUSTOM_SPU_SPEC, SPU_STATUS)
SPU_GROUP_SPEC = st.builds(
    objects.SpuGroupSpec,
    U16,
    I32,
    st.builds(
        objects.SpuConfig,
        optional(TEXT),
        optional(st.builds(objects.ReplicationConfig, optional(U16))),
        optional(st.builds(objects.SpuStorageConfig, optional(TEXT), optional(TEXT))),
        small_lists(st.builds(objects.EnvVar, TEXT, TEXT)),
    ),
)
SPU_GROUP = st.builds(
    objects.Metadata, NAMES, SPU_GROUP_SPEC, st.builds(objects.SpuGroupStatus, st.sampled_from(objects.SpuGroupResolution), optional(TEXT))
)
ITEMS = {
    objects.TOPIC: TOPIC,
    objects.PARTITION: PARTITION,
    objects.SPU: SPU,
    objects.CUSTOM_SPU: CUSTOM_SPU,
    objects.SPU_GROUP: SPU_GROUP,
}
LABELLED_ITEM = st.sampled_from(sorted(ITEMS)).flatmap(lambda label: st.tuples(st.just(label), ITEMS[label]))


def projected(schema: primitives.Codec, value: Any, version: int) -> Any:
    """``value`` as a decoder at ``version`` sees it: every field the version lacks at its default."""
    if isinstance(schema, primitives.Struct):
        changes = {}
        defaults = {spec.name: spec for spec in dataclasses.fields(schema.cls)}
        for spec in schema.fields:
            current = getattr(value, spec.name)
            if spec.min_version <= version <= spec.max_version:
                changes[spec.name] = projected(spec.codec, current, version)
            else:
                default = defaults[spec.name]
                changes[spec.name] = default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default
        return dataclasses.replace(value, **changes)
    if isinstance(schema, primitives.Tagged):
        return projected(schema.by_type[type(value)][1], value, version)
    if isinstance(schema, primitives.OptionOf):
        return None if value is None else projected(schema.inner, value, version)
    if isinstance(schema, primitives.VecOf):
        return [projected(schema.inner, item, version) for item in value]
    if isinstance(schema, primitives.MapOf):
        return {key: projected(schema.value, item, version) for key, item in value.items()}
    return value


@settings(max_examples=300, deadline=None)
@given(labelled=LABELLED_ITEM, version=VERSIONS)
def test_items_decode_to_what_was_encoded(labelled: tuple[str, objects.Metadata], version: int) -> None:
    label, item = labelled
    encoded = objects.encode_metadata(label, item, version)
    assert objects.decode_metadata(label, encoded, version) == projected(objects.METADATA[label], item, version)


@settings(max_examples=100, deadline=None)
@given(labelled=LABELLED_ITEM)
def test_at_version_19_the_round_trip_is_the_identity(labelled: tuple[str, objects.Metadata]) -> None:
    label, item = labelled
    assert objects.decode_metadata(label, objects.encode_metadata(label, item, 19), 19) == item


HEADERS = st.builds(messages.RequestHeader, st.just(0), VERSIONS, I32, TEXT)
OBJECT_REQUESTS = st.one_of(
    st.builds(messages.ListRequest, st.sampled_from(objects.LABELS + ("SmartModule",)), small_lists(TEXT), st.booleans(), st.booleans()),
    st.builds(messages.WatchRequest, st.sampled_from(objects.LABELS), I64, st.booleans()),
    st.builds(messages.CreateRequest, st.just(objects.TOPIC), NAMES, spec=TOPIC.map(lambda item: item.spec), dry_run=st.booleans(), timeout_ms=optional(U32)),
    st.builds(messages.CreateRequest, st.just(objects.CUSTOM_SPU), NAMES, spec=CUSTOM_SPU_SPEC, dry_run=st.booleans(), timeout_ms=optional(U32)),
    st.builds(messages.CreateRequest, st.just(objects.SPU_GROUP), NAMES, spec=SPU_GROUP_SPEC, dry_run=st.booleans(), timeout_ms=optional(U32)),
    st.builds(messages.CreateRequest, st.just("SmartModule"), NAMES, spec=st.binary(max_size=8), dry_run=st.booleans(), timeout_ms=optional(U32)),
    st.builds(messages.DeleteRequest, st.sampled_from([objects.TOPIC, objects.SPU_GROUP]), NAMES, st.booleans()),
    st.builds(
        messages.DeleteRequest,
        st.just(objects.CUSTOM_SPU),
        st.builds(messages.SpuKeyName, TEXT) | st.builds(messages.SpuKeyId, I32),
        st.booleans(),
    ),
    st.builds(
        messages.UpdateRequest,
        st.just(objects.TOPIC),
        NAMES,
        st.builds(messages.AddPartition, U32) | st.builds(messages.AddMirror, TEXT, st.booleans()),
    ),
)
API_KEYS = {
    messages.ListRequest: messages.LIST,
    messages.WatchRequest: messages.WATCH,
    messages.CreateRequest: messages.CREATE,
    messages.DeleteRequest: messages.DELETE,
    messages.UpdateRequest: messages.UPDATE,
}


def request_projected(body: Any, version: int) -> Any:
    """A request as decoded at ``version``: gated request fields and nested specs at their defaults."""
    if isinstance(body, messages.ListRequest):
        return dataclasses.replace(body, summary=body.summary and version >= 10, system=body.system and version >= 13)
    if isinstance(body, messages.WatchRequest):
        return dataclasses.replace(body, summary=body.summary and version >= 10)
    if isinstance(body, messages.DeleteRequest):
        return dataclasses.replace(body, force=body.force and version >= 13)
    if isinstance(body, messages.CreateRequest) and body.label in objects.CREATE_SPECS:
        return dataclasses.replace(body, spec=projected(objects.CREATE_SPECS[body.label], body.spec, version))
    return body


@settings(max_examples=300, deadline=None)
@given(header=HEADERS, body=OBJECT_REQUESTS)
def test_requests_decode_to_what_was_encoded(header: messages.RequestHeader, body: Any) -> None:
    header = dataclasses.replace(header, api_key=API_KEYS[type(body)])
    wire = messages.encode_request(header, body)
    decoded = messages.decode_request(wire[4:])
    assert decoded == messages.Request(header, request_projected(body, header.api_version))


@settings(max_examples=100, deadline=None)
@given(
    name=TEXT,
    code=st.sampled_from(messages.Error),
    strings=st.tuples(TEXT, TEXT),
    message=optional(TEXT),
    correlation_id=I32,
)
def test_statuses_decode_to_what_was_encoded(name: str, code: messages.Error, strings: tuple[str, str], message: str | None, correlation_id: int) -> None:
    arity = {messages.Error.OTHER: 1, messages.Error.SYSTEM_SPEC_DELETION_ATTEMPT: 2, messages.Error.SYSTEM_SPEC_UPDATING_ATTEMPT: 2}.get(code, 0)
    status = messages.Status(name, messages.ErrorCode(code, strings[:arity]), message)
    wire = messages.response_frame(correlation_id, messages.encode_response_body(status, 19))
    assert messages.decode_response(wire[4:], messages.CREATE, 19) == (correlation_id, status)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        messages.decode_request(data)
    except primitives.DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(header=HEADERS, body=OBJECT_REQUESTS, cut=st.integers(min_value=1))
def test_truncated_requests_raise_decode_error(header: messages.RequestHeader, body: Any, cut: int) -> None:
    header = dataclasses.replace(header, api_key=API_KEYS[type(body)])
    message = messages.encode_request(header, body)[4:]
    truncated = message[: max(0, len(message) - cut)]
    with pytest.raises(primitives.DecodeError):
        messages.decode_request(truncated)
