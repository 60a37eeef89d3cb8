"""Every hex example of fluvio-wire.md: decoded to the values the spec states, re-encoded byte for byte."""

from __future__ import annotations

import pytest

from controller.api.fluvio import messages, objects, primitives

V = 19
TOPIC_ITEM = (
    "0007612d746f706963"  # "a-topic"
    "01 00000001 00000001 01 00 00 04 00 00"  # Computed(1, 1, ignore rack), no cleanup/storage, Any, no dedup, not system
    "04 0001 00000000 00000001 00001389 0000 0000"  # Provisioned, {0: [5001]}, no mirror map, reason ""
)
PARTITION_ITEM = (
    "0009612d746f7069632d30"
    "00001389 00000001 00001389 00 00 04 00 00 00"
    "01 00001389 0000000000000000 0000000000000000 00000000 00000000 fffffffffffffffe 00 0000000000000000"
)
SPU_ITEM = (
    "000f637573746f6d2d7370752d35303031"
    "00001389 01 2332 00000001 00 01 00093132372e302e302e31 00 2333 00093132372e302e302e31 00 00 00"
    "00"
)
SPU_GROUP_ITEM = "00046d61696e 0003 00001388 00 00 00 00000000 02 00"


def unhex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def object_frame(api_key: int, correlation_id: int, label: str, payload: str, client_id: str = "fluvio") -> bytes:
    """A v19 request frame assembled by hand (not by the codec) around a payload from the spec."""
    raw_payload = unhex(payload)
    message = (
        api_key.to_bytes(2, "big")
        + V.to_bytes(2, "big")
        + correlation_id.to_bytes(4, "big")
        + len(client_id).to_bytes(2, "big")
        + client_id.encode()
        + len(label).to_bytes(2, "big")
        + label.encode()
        + len(raw_payload).to_bytes(4, "big")
        + raw_payload
    )
    return len(message).to_bytes(4, "big") + message


def round_trip_request(wire: bytes) -> messages.Request:
    assert messages.frame_length(wire[:4]) == len(wire) - 4
    request = messages.decode_request(wire[4:])
    assert messages.encode_request(request.header, request.body) == wire
    return request


def round_trip_response(wire: bytes, api_key: int) -> tuple[int, messages.Response]:
    correlation_id, body = messages.decode_response(wire[4:], api_key, V)
    assert messages.response_frame(correlation_id, messages.encode_response_body(body, V)) == wire
    return correlation_id, body


def round_trip_item(label: str, hex_item: str) -> objects.Metadata:
    raw = unhex(hex_item)
    item = objects.decode_metadata(label, raw, V)
    assert objects.encode_metadata(label, item, V) == raw
    return item


# ---------------------------------------------------------------------------- requests


def test_the_clients_first_frame_is_api_versions_v2() -> None:
    request = round_trip_request(
        unhex("0000002700120002000000010006666c7576696f0006302e31352e3200056c696e757800067838365f3634")
    )
    assert request.header == messages.RequestHeader(messages.API_VERSIONS, 2, 1, "fluvio")
    assert request.body == messages.ApiVersionsRequest("0.15.2", "linux", "x86_64")


def test_api_versions_v0_has_an_empty_body() -> None:
    wire = unhex("00000010 0012 0000 00000001 0006666c7576696f")
    request = round_trip_request(wire)
    assert request.body == messages.ApiVersionsRequest()


def test_list_topics_without_filters() -> None:
    request = round_trip_request(
        unhex("0000002103eb0013000000040006666c7576696f0005546f70696300000006 000000000000")
    )
    assert request.header == messages.RequestHeader(messages.LIST, 19, 4, "fluvio")
    assert request.body == messages.ListRequest("Topic", [], summary=False, system=False)


def test_list_topics_with_the_filter_b() -> None:
    request = round_trip_request(object_frame(messages.LIST, 5, "Topic", "00000001 0001 62 00 00"))
    assert request.body == messages.ListRequest("Topic", ["b"])


def test_list_spus() -> None:
    request = round_trip_request(unhex("0000001f03eb00130000000a0006666c7576696f000353505500000006000000000000"))
    assert (request.header.correlation_id, request.body) == (10, messages.ListRequest("SPU", []))


def test_watch_spus_at_connect() -> None:
    request = round_trip_request(
        unhex("0000002103ec001300000001000564756d6d79000353505500000009 0000000000000000 00")
    )
    assert request.header == messages.RequestHeader(messages.WATCH, 19, 1, "dummy")
    assert request.body == messages.WatchRequest("SPU", epoch=0, summary=False)


def test_create_topic_with_the_python_default_spec() -> None:
    request = round_trip_request(
        unhex(
            "0000003503e90013000000040006666c7576696f0005546f7069630000001a"
            "0007612d746f706963 00 00 01 00000001 00000001 01 00 00 04 00 00"
        )
    )
    assert request.body == messages.CreateRequest(
        "Topic",
        "a-topic",
        spec=objects.TopicSpec(objects.ComputedReplicas(1, 1, ignore_rack_assignment=True)),
        dry_run=False,
        timeout_ms=None,
    )


def test_topic_spec_with_retention_and_segment_size() -> None:
    raw = unhex("01 00000003 00000001 01 01 00 00000e10 01 01 00989680 00 04 00 00")
    spec = objects.TOPIC_SPEC.decode(primitives.Reader(raw), V)
    assert spec == objects.TopicSpec(
        objects.ComputedReplicas(3, 1, True),
        cleanup_policy=objects.SegmentCleanup(3600),
        storage=objects.TopicStorageConfig(segment_size=10_000_000, max_partition_size=None),
    )
    out = bytearray()
    objects.TOPIC_SPEC.encode(out, spec, V)
    assert bytes(out) == raw


def test_delete_topic() -> None:
    request = round_trip_request(object_frame(messages.DELETE, 6, "Topic", "0007612d746f706963 00"))
    assert request.body == messages.DeleteRequest("Topic", "a-topic", force=False)


def test_add_two_partitions() -> None:
    request = round_trip_request(
        unhex("0000002903ee0013000000090006666c7576696f0005546f7069630000000e0007612d746f7069630000000002")
    )
    assert request.header.correlation_id == 9
    assert request.body == messages.UpdateRequest("Topic", "a-topic", messages.AddPartition(2))


def test_register_a_custom_spu() -> None:
    request = round_trip_request(
        unhex(
            "0000005a03e90013000000050006666c7576696f0009437573746f6d5370750000003b000f637573746f6d2d7370752d35303031"
            "000000001389233200000001000100093132372e302e302e3100233300093132372e302e302e31000000"
        )
    )
    assert request.body == messages.CreateRequest(
        "CustomSpu",
        "custom-spu-5001",
        spec=objects.CustomSpuSpec(
            5001,
            objects.IngressPort(9010, [objects.IngressAddr(ip="127.0.0.1")]),
            objects.Endpoint(9011, "127.0.0.1"),
        ),
    )


def test_unregister_a_custom_spu_by_id() -> None:
    request = round_trip_request(
        unhex("0000002803ea0013000000060006666c7576696f0009437573746f6d53707500000009000249640000138900")
    )
    assert request.body == messages.DeleteRequest("CustomSpu", messages.SpuKeyId(5001))


def test_unregister_a_custom_spu_by_name() -> None:
    request = round_trip_request(
        unhex(
            "0000003703ea0013000000060006666c7576696f0009437573746f6d5370750000001800044e616d65"
            "000f637573746f6d2d7370752d3530303100"
        )
    )
    assert request.body == messages.DeleteRequest("CustomSpu", messages.SpuKeyName("custom-spu-5001"))


def test_create_an_spu_group() -> None:
    request = round_trip_request(
        unhex("0000003303e90013000000070006666c7576696f000853707547726f75700000001500046d61696e000000030000138800000000000000")
    )
    assert request.body == messages.CreateRequest("SpuGroup", "main", spec=objects.SpuGroupSpec(3, 5000, objects.SpuConfig()))


def test_delete_an_spu_group() -> None:
    request = round_trip_request(
        unhex("0000002503ea0013000000080006666c7576696f000853707547726f75700000000700046d61696e00")
    )
    assert request.body == messages.DeleteRequest("SpuGroup", "main")


# ---------------------------------------------------------------------------- responses


def test_the_recommended_api_versions_answer() -> None:
    correlation_id, body = round_trip_response(
        unhex(
            "00000030 00000001 0000 00000005"
            "03e9 0009 0013 03ea 0001 0013 03eb 000f 0013 03ec 000f 0013 03ee 0001 0013"
            "0006 302e31372e33"
        ),
        messages.API_VERSIONS,
    )
    assert correlation_id == 1
    assert body == messages.ApiVersionsResponse(
        api_keys=[
            messages.ApiVersionKey(1001, 9, 19),
            messages.ApiVersionKey(1002, 1, 19),
            messages.ApiVersionKey(1003, 15, 19),
            messages.ApiVersionKey(1004, 15, 19),
            messages.ApiVersionKey(1006, 1, 19),
        ],
        platform_version="0.17.3",
    )


def test_the_six_key_api_versions_answer_with_mirroring() -> None:
    _, body = round_trip_response(
        unhex(
            "00000036 00000001 0000 00000006"
            "03e9 0009 0013 03ea 0001 0013 03eb 000f 0013 03ec 000f 0013 03ed 000e 0013 03ee 0001 0013"
            "0006 302e31372e33"
        ),
        messages.API_VERSIONS,
    )
    assert isinstance(body, messages.ApiVersionsResponse) and body.api_keys[4] == messages.ApiVersionKey(1005, 14, 19)


def test_status_ok() -> None:
    assert round_trip_response(unhex("00000010000000040007612d746f706963000000"), messages.CREATE) == (
        4,
        messages.Status("a-topic"),
    )


def test_status_topic_already_exists() -> None:
    wire = unhex(
        "00000030000000060007612d746f70696307d201001e546f7069632027612d746f7069632720616c726561647920657869737473"
    )
    assert round_trip_response(wire, messages.CREATE) == (
        6,
        messages.Status("a-topic", messages.ErrorCode(messages.Error.TOPIC_ALREADY_EXISTS), "Topic 'a-topic' already exists"),
    )


A_TOPIC = objects.Metadata(
    "a-topic",
    objects.TopicSpec(objects.ComputedReplicas(1, 1, True)),
    objects.TopicStatus(objects.TopicResolution.PROVISIONED, {0: [5001]}),
)


def test_list_answer_with_one_topic() -> None:
    wire = unhex("0000003e000000040005546f7069630000002f00000001" + TOPIC_ITEM)
    assert round_trip_response(wire, messages.LIST) == (4, messages.ListResponse("Topic", [A_TOPIC]))


def test_empty_list_of_an_unserved_label() -> None:
    wire = unhex("000000190000000b000b536d6172744d6f64756c650000000400000000")
    assert round_trip_response(wire, messages.LIST) == (11, messages.ListResponse("SmartModule", []))


def test_watch_snapshot() -> None:
    wire = unhex("0000004a000000030005546f7069630000003b 0000000000000001 00000000 00000001" + TOPIC_ITEM)
    assert round_trip_response(wire, messages.WATCH) == (
        3,
        messages.WatchResponse("Topic", messages.MetadataUpdate(1, [], [A_TOPIC])),
    )


def test_watch_delete_change() -> None:
    wire = unhex("0000004b000000030005546f7069630000003c 0000000000000002 00000001 01" + TOPIC_ITEM + "00000000")
    delete = messages.Message(messages.MessageType.DELETE, A_TOPIC)
    assert round_trip_response(wire, messages.WATCH) == (3, messages.WatchResponse("Topic", messages.MetadataUpdate(2, [delete], [])))


# ---------------------------------------------------------------------------- metadata items


def test_topic_item() -> None:
    assert round_trip_item(objects.TOPIC, TOPIC_ITEM) == A_TOPIC


def test_partition_item() -> None:
    assert round_trip_item(objects.PARTITION, PARTITION_ITEM) == objects.Metadata(
        "a-topic-0",
        objects.PartitionSpec(5001, [5001]),
        objects.PartitionStatus(
            leader=objects.ReplicaStatus(5001, 0, 0), resolution=objects.PartitionResolution.ONLINE, lrs=0, replicas=[], size=-2, base_offset=0
        ),
    )


def test_spu_item() -> None:
    assert round_trip_item(objects.SPU, SPU_ITEM) == objects.Metadata(
        "custom-spu-5001",
        objects.SpuSpec(
            5001,
            objects.SpuType.CUSTOM,
            objects.IngressPort(9010, [objects.IngressAddr(ip="127.0.0.1")]),
            objects.Endpoint(9011, "127.0.0.1"),
        ),
        objects.SpuStatus(objects.SpuResolution.ONLINE),
    )


def test_spu_group_item() -> None:
    assert round_trip_item(objects.SPU_GROUP, SPU_GROUP_ITEM) == objects.Metadata(
        "main", objects.SpuGroupSpec(3, 5000), objects.SpuGroupStatus(objects.SpuGroupResolution.RESERVED, None)
    )


# ---------------------------------------------------------------------------- what must not decode


@pytest.mark.parametrize(
    ("wire", "problem"),
    # Messages without their length prefix.
    [
        # A bool of 02 in the list's summary flag.
        (object_frame(messages.LIST, 1, "Topic", "00000000 02 00")[4:], "not 00 or 01"),
        # ReplicaSpec tag 7.
        (object_frame(messages.CREATE, 1, "Topic", "0001 61 00 00 07")[4:], "ReplicaSpec has no variant with tag 7"),
        # The payload says 9 bytes but the frame ends after 2.
        (unhex("03eb 0013 00000001 0000 0005546f706963 00000009 0000"), "payload needs 9 bytes"),
        # Mirroring (1005) is not served.
        (unhex("03ed 0013 00000001 0000"), "API key 1005 is not one this SC serves"),
        # The classic (< 11) layout.
        (unhex("03eb 000a 00000001 0000 0005546f706963 00000000"), "outside 11..19"),
        # A custom SPU key that is neither Name nor Id.
        (object_frame(messages.DELETE, 1, "CustomSpu", "0003 4b6579 00000001 00")[4:], "neither 'Name' nor 'Id'"),
        # A list claiming more elements than bytes left.
        (object_frame(messages.LIST, 1, "Topic", "7fffffff 00 00")[4:], "only 2 bytes left"),
    ],
)
def test_undecodable_requests_name_the_problem(wire: bytes, problem: str) -> None:
    with pytest.raises(primitives.DecodeError, match=problem):
        messages.decode_request(wire)


@pytest.mark.parametrize(
    ("prefix", "problem"), [("ffffffff", "negative"), ("7fffffff", "above the limit of 52428800 bytes"), ("0000", "4 bytes")]
)
def test_frame_lengths_are_capped(prefix: str, problem: str) -> None:
    with pytest.raises(primitives.DecodeError, match=problem):
        messages.frame_length(unhex(prefix))


@pytest.mark.parametrize(
    ("head", "length", "problem"),
    [
        ("03eb", 65_537, "List frame of 65537 bytes is above the limit of 65536 bytes for that API"),
        ("0012", 65_537, "ApiVersions frame of 65537 bytes is above the limit of 65536 bytes for that API"),
        ("03e9", 1_000_001, "Create frame of 1000001 bytes is above the limit of 1000000 bytes for that API"),
        ("03ed", 10, r"API key 1005 is not one this SC serves \(known: \[18, 1001, 1002, 1003, 1004, 1006\]\)"),
        ("00", 1, "a frame of 1 bytes cannot hold a request header"),
    ],
)
def test_request_frames_are_judged_by_their_api_key_before_they_are_read(head: str, length: int, problem: str) -> None:
    with pytest.raises(primitives.DecodeError, match=f"^{problem}$"):
        messages.check_request_size(unhex(head), length, create_limit=1_000_000)


def test_request_frames_up_to_their_apis_limit_pass() -> None:
    for api_key in (messages.API_VERSIONS, messages.DELETE, messages.LIST, messages.WATCH, messages.UPDATE):
        messages.check_request_size(api_key.to_bytes(2, "big"), messages.MAX_SMALL_REQUEST_BYTES, create_limit=0)
    messages.check_request_size(messages.CREATE.to_bytes(2, "big"), 1_000_000, create_limit=1_000_000)


def test_values_the_wire_cannot_carry_are_refused_with_their_path() -> None:
    too_many = objects.Metadata("t", A_TOPIC.spec, objects.TopicStatus(replica_map={index: [0] for index in range(65_536)}))
    with pytest.raises(primitives.EncodeError, match="TopicStatus.replica_map: a map holds at most 65535 entries"):
        objects.encode_metadata(objects.TOPIC, too_many, V)
    negative_port = objects.Metadata("s", objects.SpuSpec(1, objects.SpuType.CUSTOM, objects.IngressPort(-1), objects.Endpoint(1, "h")), objects.SpuStatus())
    with pytest.raises(primitives.EncodeError, match=r"IngressPort.port: u16 must be a whole number in \[0, 65535\], got -1"):
        objects.encode_metadata(objects.SPU, negative_port, V)


def create_topic_assigned(maps: int, replicas: int) -> bytes:
    """A Create of topic "a" with ``maps`` partition rows of ``replicas`` SPU ids each, without its length prefix."""
    row = "00000000" + f"{replicas:08x}" + "00001389" * replicas + "00"
    return object_frame(messages.CREATE, 1, "Topic", "0001 61 00 00 00" + f"{maps:08x}" + row * maps + "00 00 04 00 00")[4:]


def create_spu_group_with_env(variables: int) -> bytes:
    return object_frame(messages.CREATE, 1, "SpuGroup", "0004 6d61696e 00 00 0003 00001388 00 00 00" + f"{variables:08x}" + "0000 0000" * variables)[4:]


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        # A topic has at most 100,000 partitions, each of at most 128 replicas (store.models).
        (create_topic_assigned(100_001, 0), r"TopicSpec.replicas: AssignedReplicas.maps: list of 100001 elements at offset 6 is above the limit of 100000"),
        (create_topic_assigned(1, 129), r"AssignedReplicas.maps: PartitionMap.replicas: list of 129 elements at offset 14 is above the limit of 128"),
        # No client sends more than a name filter, nor SPU groups with more than a few variables.
        (object_frame(messages.LIST, 1, "Topic", "00000041" + "0000" * 65 + "00 00")[4:], r"ListRequest.name_filters: list of 65 elements at offset 0 is above the limit of 64"),
        (create_spu_group_with_env(257), r"SpuGroupSpec.spu_config: SpuConfig.env: list of 257 elements at offset 17 is above the limit of 256"),
    ],
)
def test_lists_longer_than_any_request_needs_are_refused_before_their_elements_are_decoded(wire: bytes, problem: str) -> None:
    """Decoding is ten to forty times the frame in memory and runs on the event loop: 16 MiB of
    empty partition rows or environment variables held it 8 to 11 s and took 360 MB."""
    with pytest.raises(primitives.DecodeError, match=problem):
        messages.decode_request(wire)


def test_lists_at_their_limit_decode() -> None:
    topic = messages.decode_request(create_topic_assigned(1, 128)).body
    assert topic == messages.CreateRequest(
        "Topic", "a", spec=objects.TopicSpec(objects.AssignedReplicas([objects.PartitionMap(0, [5001] * 128)]))
    )
    group = messages.decode_request(create_spu_group_with_env(256)).body
    assert group == messages.CreateRequest(
        "SpuGroup", "main", spec=objects.SpuGroupSpec(3, 5000, objects.SpuConfig(env=[objects.EnvVar("", "")] * 256))
    )
