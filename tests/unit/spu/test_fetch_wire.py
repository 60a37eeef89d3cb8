"""The SPU<->SPU fetch frames: exact bytes out, and every malformed frame refused with a code and a reason."""

from __future__ import annotations

import pytest

from connection_manager import wire
from connection_manager.spu import fetch_wire


def test_a_frame_is_a_big_endian_length_then_the_json_body() -> None:
    request = fetch_wire.FetchRequest(
        spu=2,
        incarnation=17,
        max_records=500,
        partitions=[fetch_wire.PartitionFetch(partition="t-0", offset=70, hw=60, leader_epoch=3, last_fetched_epoch=2)],
    )
    body = (
        b'{"v":2,"type":"fetch","spu":2,"incarnation":17,"maxRecords":500,"partitions":[{"partition":"t-0","offset":70,"hw":60,'
        b'"leaderEpoch":3,"lastFetchedEpoch":2}]}'
    )
    assert fetch_wire.encode(request) == len(body).to_bytes(4, "big") + body
    assert fetch_wire.body_length(len(body).to_bytes(4, "big")) == len(body)
    assert fetch_wire.parse_request(body) == request
    # A follower older than the field says no incarnation: read as None (its leader never proposes it in).
    older = b'{"v":2,"type":"fetch","spu":2,"maxRecords":500,"partitions":[]}'
    assert fetch_wire.parse_request(older).incarnation is None


def test_answers_and_refusals_round_trip() -> None:
    response = fetch_wire.FetchResponse(
        partitions=[
            fetch_wire.PartitionFetched(partition="t-0", offset=70, leo=100, hw=60, records=30, epochs=[(2, 70), (3, 90)]),
            fetch_wire.PartitionFetched(partition="t-1", offset=5, error="fenced-leader-epoch"),
            fetch_wire.PartitionFetched(partition="t-2", offset=9, leo=8, hw=8, diverging_epoch=1, diverging_end_offset=6),
        ]
    )
    assert fetch_wire.encode(response)[4:] == (
        b'{"v":2,"type":"fetched","partitions":[{"partition":"t-0","offset":70,"leo":100,"hw":60,"records":30,'
        b'"epochs":[[2,70],[3,90]],"divergingEpoch":null,"divergingEndOffset":null,"error":null},'
        b'{"partition":"t-1","offset":5,"leo":0,"hw":0,"records":0,"epochs":[],"divergingEpoch":null,"divergingEndOffset":null,'
        b'"error":"fenced-leader-epoch"},'
        b'{"partition":"t-2","offset":9,"leo":8,"hw":8,"records":0,"epochs":[],"divergingEpoch":1,"divergingEndOffset":6,"error":null}]}'
    )
    assert fetch_wire.parse_response(fetch_wire.encode(response)[4:]) == response
    refusal = fetch_wire.FetchError(code="malformed", message="frame is not valid JSON")
    assert fetch_wire.parse_response(fetch_wire.encode(refusal)[4:]) == refusal


@pytest.mark.parametrize(
    ("header", "code", "message"),
    [
        ((4 * 1024 * 1024 + 1).to_bytes(4, "big"), "frame-too-large", "frame of 4194305 bytes is over the limit of 4194304 bytes"),
        (b"\x00\x01", "malformed", "a frame header is 4 bytes, got 2"),
    ],
)
def test_a_header_announcing_an_oversized_frame_is_refused(header: bytes, code: str, message: str) -> None:
    with pytest.raises(wire.FrameError) as refused:
        fetch_wire.body_length(header)
    assert (refused.value.code, str(refused.value)) == (code, message)


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (b"{not json", "malformed", "frame is not valid JSON: Invalid JSON: key must be a string at line 1 column 2"),
        (b"[1]", "malformed", "frame must be a JSON object, got [1]"),
        (b'{"v":2,"spu":1,"maxRecords":1,"partitions":[]}', "unknown-type", "message has no 'type' field"),
        (b'{"v":2,"type":"fetched","partitions":[]}', "unknown-type", "unknown message type 'fetched'"),
        (
            b'{"v":1,"type":"fetch","spu":1,"maxRecords":1,"partitions":[]}',
            "unsupported-version",
            "protocol version 1 is not supported; this SC speaks version 2",
        ),
        (
            b'{"v":2,"type":"fetch","spu":1,"maxRecords":1,"partitions":[{"partition":"t-0","offset":-1,"hw":0,'
            b'"leaderEpoch":0,"lastFetchedEpoch":-1}]}',
            "invalid",
            "field 'fetch.partitions.0.offset': Input should be greater than or equal to 0 (got -1)",
        ),
        (
            b'{"v":2,"type":"fetch","spu":1,"incarnation":0,"maxRecords":1,"partitions":[]}',
            "invalid",
            "field 'fetch.incarnation': Input should be greater than or equal to 1 (got 0)",
        ),
        (
            b'{"v":2,"type":"fetch","spu":1,"incarnation":9223372036854775808,"maxRecords":1,"partitions":[]}',
            "invalid",
            "field 'fetch.incarnation': Input should be less than or equal to 9223372036854775807 (got 9223372036854775808)",
        ),
        (
            b'{"v":2,"type":"fetch","spu":1,"incarnation":7.5,"maxRecords":1,"partitions":[]}',
            "invalid",
            "field 'fetch.incarnation': Input should be a valid integer (got 7.5)",
        ),
        (
            b'{"v":2,"type":"fetch","spu":1,"maxRecords":1,"partitions":[{"partition":"t-0","offset":1,"hw":0}]}',
            "invalid",
            "field 'fetch.partitions.0.leaderEpoch': Field required (got {'partition': 't-0', 'offset': 1, 'hw': 0})",
        ),
    ],
)
def test_a_malformed_request_is_refused_with_a_code_and_the_offending_value(body: bytes, code: str, message: str) -> None:
    with pytest.raises(wire.FrameError) as refused:
        fetch_wire.parse_request(body)
    assert (refused.value.code, str(refused.value)) == (code, message)


def test_an_answer_with_an_unknown_error_code_is_refused() -> None:
    body = b'{"v":2,"type":"fetched","partitions":[{"partition":"t-0","offset":0,"error":"on-fire"}]}'
    with pytest.raises(wire.FrameError) as refused:
        fetch_wire.parse_response(body)
    assert refused.value.code == "invalid"
    assert str(refused.value).startswith(
        "field 'fetched.partitions.0.error': Input should be 'not-leader', 'not-a-replica', 'fenced-leader-epoch', "
        "'unknown-leader-epoch' or 'inconsistent-partition'"
    )


def test_a_fetch_names_the_uid_only_when_the_follower_was_told_one() -> None:
    """A leader older than the field refuses a key it does not know: a follower told none sends none."""
    told = fetch_wire.PartitionFetch(partition="t-0", offset=3, hw=3, leader_epoch=0, last_fetched_epoch=0, uid=9)
    request = fetch_wire.FetchRequest(spu=1, incarnation=4, max_records=10, partitions=[told, told.model_copy(update={"uid": None})])
    body = fetch_wire.encode(request)[fetch_wire.HEADER_BYTES :]
    assert body.count(b'"uid":9') == 1 and body.count(b"uid") == 1
    assert fetch_wire.parse_request(body) == request
