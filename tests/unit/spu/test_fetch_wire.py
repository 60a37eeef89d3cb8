"""The SPU<->SPU fetch frames: exact bytes out, and every malformed frame refused with a code and a reason."""

from __future__ import annotations

import pytest

from connection_manager import wire
from connection_manager.spu import fetch_wire


def test_a_frame_is_a_big_endian_length_then_the_json_body() -> None:
    request = fetch_wire.FetchRequest(
        spu=2, max_records=500, partitions=[fetch_wire.PartitionFetch(partition="t-0", offset=70, hw=60)]
    )
    body = b'{"v":1,"type":"fetch","spu":2,"maxRecords":500,"partitions":[{"partition":"t-0","offset":70,"hw":60}]}'
    assert fetch_wire.encode(request) == len(body).to_bytes(4, "big") + body
    assert fetch_wire.body_length(len(body).to_bytes(4, "big")) == len(body)
    assert fetch_wire.parse_request(body) == request


def test_answers_and_refusals_round_trip() -> None:
    response = fetch_wire.FetchResponse(
        partitions=[
            fetch_wire.PartitionFetched(partition="t-0", offset=70, leo=100, hw=60, records=30),
            fetch_wire.PartitionFetched(partition="t-1", offset=5, error="not-leader"),
        ]
    )
    assert fetch_wire.encode(response)[4:] == (
        b'{"v":1,"type":"fetched","partitions":[{"partition":"t-0","offset":70,"leo":100,"hw":60,"records":30,"error":null},'
        b'{"partition":"t-1","offset":5,"leo":0,"hw":0,"records":0,"error":"not-leader"}]}'
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
        (b'{"v":1,"spu":1,"maxRecords":1,"partitions":[]}', "unknown-type", "message has no 'type' field"),
        (b'{"v":1,"type":"fetched","partitions":[]}', "unknown-type", "unknown message type 'fetched'"),
        (
            b'{"v":2,"type":"fetch","spu":1,"maxRecords":1,"partitions":[]}',
            "unsupported-version",
            "protocol version 2 is not supported; this SC speaks version 1",
        ),
        (
            b'{"v":1,"type":"fetch","spu":1,"maxRecords":1,"partitions":[{"partition":"t-0","offset":-1,"hw":0}]}',
            "invalid",
            "field 'fetch.partitions.0.offset': Input should be greater than or equal to 0 (got -1)",
        ),
    ],
)
def test_a_malformed_request_is_refused_with_a_code_and_the_offending_value(body: bytes, code: str, message: str) -> None:
    with pytest.raises(wire.FrameError) as refused:
        fetch_wire.parse_request(body)
    assert (refused.value.code, str(refused.value)) == (code, message)


def test_an_answer_with_an_unknown_error_code_is_refused() -> None:
    body = b'{"v":1,"type":"fetched","partitions":[{"partition":"t-0","offset":0,"error":"on-fire"}]}'
    with pytest.raises(wire.FrameError) as refused:
        fetch_wire.parse_response(body)
    assert refused.value.code == "invalid"
    assert str(refused.value).startswith("field 'fetched.partitions.0.error': Input should be 'not-leader' or 'not-a-replica'")
