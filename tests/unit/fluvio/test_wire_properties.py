"""Property tests of the codec: decoding what was encoded gives the object back, at every version the
SC speaks (fields a version does not carry come back as their defaults), and no byte string makes
the request decoder fail any other way than DecodeError."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.api.fluvio import messages as codec

VERSIONS = st.integers(codec.OBJECT_MIN_VERSION, codec.OBJECT_MAX_VERSION)
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


PARTITION_MIRROR = st.builds(codec.RemotePartitionConfig, TEXT, TEXT, I32, TEXT, st.booleans()) | st.builds(
    codec.HomePartitionConfig, TEXT, TEXT, st.booleans()
)
MIRROR_CONFIG = st.builds(
    codec.RemoteMirrorConfig, TEXT, small_lists(st.builds(codec.SpuMirrorConfig, I32, TEXT, TEXT)), st.booleans()
) | st.builds(codec.HomeMirrorConfig, small_lists(st.builds(codec.HomePartitionConfig, TEXT, TEXT, st.booleans())), st.booleans())
REPLICAS = (
    st.builds(codec.AssignedReplicas, small_lists(st.builds(codec.PartitionMap, U32, small_lists(I32), optional(PARTITION_MIRROR))))
    | st.builds(codec.ComputedReplicas, U32, U32, st.booleans())
    | st.builds(codec.MirrorReplicas, MIRROR_CONFIG)
)
CLEANUP = optional(st.builds(codec.SegmentCleanup, U32))
STORAGE = optional(st.builds(codec.TopicStorageConfig, optional(U32), optional(U64)))
DEDUP = optional(
    st.builds(
        codec.Deduplication,
        st.builds(codec.Bounds, U64, optional(st.builds(codec.Duration, U64, U32))),
        st.builds(codec.Filter, st.builds(codec.Transform, TEXT, st.dictionaries(TEXT, TEXT, max_size=3))),
    )
)
COMPRESSION = st.sampled_from(codec.Compression)
TOPIC = st.builds(
    codec.Metadata,
    NAMES,
    st.builds(codec.TopicSpec, REPLICAS, CLEANUP, STORAGE, COMPRESSION, DEDUP, st.booleans()),
    st.builds(
        codec.TopicStatus,
        st.sampled_from(codec.TopicResolution),
        st.dictionaries(U32, small_lists(I32), max_size=4),
        st.dictionaries(U32, PARTITION_MIRROR, max_size=2),
        TEXT,
    ),
)
REPLICA_STATUS = st.builds(codec.ReplicaStatus, I32, I64, I64)
PARTITION = st.builds(
    codec.Metadata,
    NAMES,
    st.builds(codec.PartitionSpec, I32, small_lists(I32), CLEANUP, STORAGE, COMPRESSION, DEDUP, st.booleans(), optional(PARTITION_MIRROR)),
    st.builds(
        codec.PartitionStatus,
        REPLICA_STATUS,
        st.sampled_from(codec.PartitionResolution),
        U32,
        small_lists(REPLICA_STATUS),
        I64,
        st.booleans(),
        I64,
    ),
)
ENCRYPTION = st.sampled_from(codec.Encryption)
INGRESS = st.builds(codec.IngressPort, U16, small_lists(st.builds(codec.IngressAddr, optional(TEXT), optional(TEXT))), ENCRYPTION)
ENDPOINT = st.builds(codec.Endpoint, U16, TEXT, ENCRYPTION)
SPU_STATUS = st.builds(codec.SpuStatus, st.sampled_from(codec.SpuResolution))
SPU = st.builds(
    codec.Metadata,
    NAMES,
    st.builds(codec.SpuSpec, I32, st.sampled_from(codec.SpuType), INGRESS, ENDPOINT, optional(TEXT), optional(ENDPOINT)),
    SPU_STATUS,
)
CUSTOM_SPU_SPEC = st.builds(codec.CustomSpuSpec, I32, INGRESS, ENDPOINT, optional(TEXT), optional(ENDPOINT))
CUSTOM_SPU = st.builds(codec.Metadata, NAMES, CUSTOM_SPU_SPEC, SPU_STATUS)
SPU_GROUP_SPEC = st.builds(
    codec.SpuGroupSpec,
    U16,
    I32,
    st.builds(
        codec.SpuConfig,
        optional(TEXT),
        optional(st.builds(codec.ReplicationConfig, optional(U16))),
        optional(st.builds(codec.SpuStorageConfig, optional(TEXT), optional(TEXT))),
        small_lists(st.builds(codec.EnvVar, TEXT, TEXT)),
    ),
)
SPU_GROUP = st.builds(
    codec.Metadata, NAMES, SPU_GROUP_SPEC, st.builds(codec.SpuGroupStatus, st.sampled_from(codec.SpuGroupResolution), optional(TEXT))
)
ITEMS = {
    codec.TOPIC: TOPIC,
    codec.PARTITION: PARTITION,
    codec.SPU: SPU,
    codec.CUSTOM_SPU: CUSTOM_SPU,
    codec.SPU_GROUP: SPU_GROUP,
}
LABELLED_ITEM = st.sampled_from(sorted(ITEMS)).flatmap(lambda label: st.tuples(st.just(label), ITEMS[label]))


def projected(schema: codec.Codec, value: Any, version: int) -> Any:
    """``value`` as a decoder at ``version`` sees it: every field the version lacks at its default."""
    if isinstance(schema, codec.Struct):
        changes = {}
        defaults = {spec.name: spec for spec in dataclasses.fields(schema.cls)}
        for spec in schema.fields:
            current = getattr(value, spec.name)
            if spec.min_version <= version <= spec.max_version:
                changes[spec.name] = projected(spec.codec, current, version)
            else:
                default = defaults[spec.name]
                changes[spec.name] = default.default_factory() if default.default_factory is not dataclasses.MISSING else default.default  # type: ignore[misc]
        return dataclasses.replace(value, **changes)
    if isinstance(schema, codec.Tagged):
        return projected(schema.by_type[type(value)][1], value, version)
    if isinstance(schema, codec.OptionOf):
        return None if value is None else projected(schema.inner, value, version)
    if isinstance(schema, codec.VecOf):
        return [projected(schema.inner, item, version) for item in value]
    if isinstance(schema, codec.MapOf):
        return {key: projected(schema.value, item, version) for key, item in value.items()}
    return value


@settings(max_examples=300, deadline=None)
@given(labelled=LABELLED_ITEM, version=VERSIONS)
def test_items_decode_to_what_was_encoded(labelled: tuple[str, codec.Metadata], version: int) -> None:
    label, item = labelled
    encoded = codec.encode_metadata(label, item, version)
    assert codec.decode_metadata(label, encoded, version) == projected(codec.METADATA[label], item, version)


@settings(max_examples=100, deadline=None)
@given(labelled=LABELLED_ITEM)
def test_at_version_19_the_round_trip_is_the_identity(labelled: tuple[str, codec.Metadata]) -> None:
    label, item = labelled
    assert codec.decode_metadata(label, codec.encode_metadata(label, item, 19), 19) == item


HEADERS = st.builds(codec.RequestHeader, st.just(0), VERSIONS, I32, TEXT)
OBJECT_REQUESTS = st.one_of(
    st.builds(codec.ListRequest, st.sampled_from(codec.LABELS + ("SmartModule",)), small_lists(TEXT), st.booleans(), st.booleans()),
    st.builds(codec.WatchRequest, st.sampled_from(codec.LABELS), I64, st.booleans()),
    st.builds(codec.CreateRequest, st.just(codec.TOPIC), NAMES, TOPIC.map(lambda item: item.spec), st.booleans(), optional(U32)),
    st.builds(codec.CreateRequest, st.just(codec.CUSTOM_SPU), NAMES, CUSTOM_SPU_SPEC, st.booleans(), optional(U32)),
    st.builds(codec.CreateRequest, st.just(codec.SPU_GROUP), NAMES, SPU_GROUP_SPEC, st.booleans(), optional(U32)),
    st.builds(codec.CreateRequest, st.just("SmartModule"), NAMES, st.binary(max_size=8), st.booleans(), optional(U32)),
    st.builds(codec.DeleteRequest, st.sampled_from([codec.TOPIC, codec.SPU_GROUP]), NAMES, st.booleans()),
    st.builds(
        codec.DeleteRequest,
        st.just(codec.CUSTOM_SPU),
        st.builds(codec.SpuKeyName, TEXT) | st.builds(codec.SpuKeyId, I32),
        st.booleans(),
    ),
    st.builds(
        codec.UpdateRequest,
        st.just(codec.TOPIC),
        NAMES,
        st.builds(codec.AddPartition, U32) | st.builds(codec.AddMirror, TEXT, st.booleans()),
    ),
)
API_KEYS = {
    codec.ListRequest: codec.LIST,
    codec.WatchRequest: codec.WATCH,
    codec.CreateRequest: codec.CREATE,
    codec.DeleteRequest: codec.DELETE,
    codec.UpdateRequest: codec.UPDATE,
}


def request_projected(body: Any, version: int) -> Any:
    """A request as decoded at ``version``: gated request fields and nested specs at their defaults."""
    if isinstance(body, codec.ListRequest):
        return dataclasses.replace(body, summary=body.summary and version >= 10, system=body.system and version >= 13)
    if isinstance(body, codec.WatchRequest):
        return dataclasses.replace(body, summary=body.summary and version >= 10)
    if isinstance(body, codec.DeleteRequest):
        return dataclasses.replace(body, force=body.force and version >= 13)
    if isinstance(body, codec.CreateRequest) and body.label in codec.CREATE_SPECS:
        return dataclasses.replace(body, spec=projected(codec.CREATE_SPECS[body.label], body.spec, version))
    return body


@settings(max_examples=300, deadline=None)
@given(header=HEADERS, body=OBJECT_REQUESTS)
def test_requests_decode_to_what_was_encoded(header: codec.RequestHeader, body: Any) -> None:
    header = dataclasses.replace(header, api_key=API_KEYS[type(body)])
    wire = codec.encode_request(header, body)
    decoded = codec.decode_request(wire[4:])
    assert decoded == codec.Request(header, request_projected(body, header.api_version))


@settings(max_examples=100, deadline=None)
@given(
    name=TEXT,
    code=st.sampled_from(codec.Error),
    strings=st.tuples(TEXT, TEXT),
    message=optional(TEXT),
    correlation_id=I32,
)
def test_statuses_decode_to_what_was_encoded(name: str, code: codec.Error, strings: tuple[str, str], message: str | None, correlation_id: int) -> None:
    arity = {codec.Error.OTHER: 1, codec.Error.SYSTEM_SPEC_DELETION_ATTEMPT: 2, codec.Error.SYSTEM_SPEC_UPDATING_ATTEMPT: 2}.get(code, 0)
    status = codec.Status(name, codec.ErrorCode(code, strings[:arity]), message)
    wire = codec.response_frame(correlation_id, codec.encode_response_body(status, 19))
    assert codec.decode_response(wire[4:], codec.CREATE, 19) == (correlation_id, status)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        codec.decode_request(data)
    except codec.DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(header=HEADERS, body=OBJECT_REQUESTS, cut=st.integers(min_value=1))
def test_truncated_requests_raise_decode_error(header: codec.RequestHeader, body: Any, cut: int) -> None:
    header = dataclasses.replace(header, api_key=API_KEYS[type(body)])
    message = codec.encode_request(header, body)[4:]
    truncated = message[: max(0, len(message) - cut)]
    with pytest.raises(codec.DecodeError):
        codec.decode_request(truncated)
