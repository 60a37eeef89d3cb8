"""SC<->SPU frames: every malformed case gets a stable code and a message naming the value."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connection_manager import lrs, wire


@pytest.mark.parametrize(
    ("frame", "code", "message"),
    [
        (b"", "malformed", "frame is not valid JSON"),
        (b"{", "malformed", "frame is not valid JSON"),
        (b'{"type": "register", "spuId": 1', "malformed", "frame is not valid JSON"),  # truncated
        (b"[1, 2]", "malformed", "frame must be a JSON object, got [1, 2]"),
        (b'"register"', "malformed", "frame must be a JSON object"),
        (b"{}", "unknown-type", "message has no 'type' field"),
        (b'{"type": "gossip"}', "unknown-type", "unknown message type 'gossip'"),
        (b'{"type": "accepted", "spuId": 1, "heartbeatTimeout": 1}', "unknown-type", "unknown message type 'accepted'"),
        (b'{"type": "register", "v": 2, "spuId": 1}', "unsupported-version", "protocol version 2 is not supported"),
        (b'{"type": "register"}', "invalid", "field 'register.spuId': Field required"),
        (b'{"type": "register", "spuId": "one"}', "invalid", "field 'register.spuId'"),
        (b'{"type": "register", "spuId": -1}', "invalid", "greater than or equal to 0 (got -1)"),
        (b'{"type": "register", "spuId": 1, "extra": true}', "invalid", "field 'register.extra': Extra inputs"),
        (b'{"type": "lrs", "leaders": [{"partition": "t-0", "hw": 1}]}', "invalid", "field 'lrs.leaders.0.leo': Field required"),
        (
            b'{"type": "lrs", "leaders": [{"partition": "t-0", "hw": 1, "leo": 1, "followers": [{"spu": 2, "hw": 0, "leo": -3}]}]}',
            "invalid",
            "field 'lrs.leaders.0.followers.0.leo'",
        ),
        (b'{"type": "lrs", "leaders": [{"partition": "", "hw": 1, "leo": 1}]}', "invalid", "lrs.leaders.0.partition"),
        # Numbers past Python's int digit limit, or just below it: a frame error, never a ValueError.
        (b'{"type": "register", "spuId": ' + b"9" * 5000 + b"}", "malformed", "number out of range"),
        (b'{"type": "lrs", "leaders": [{"partition": "t-0", "hw": ' + b"9" * 4299 + b', "leo": 1}]}', "invalid", "(got 9999999999"),
        (b'{"type": "lrs", "leaders": [{"partition": "t-0", "hw": 1, "leo": 9223372036854775808}]}', "invalid", "less than or equal to 9223372036854775807"),
        (b'{"type": "register", "spuId": 1e400}', "invalid", "finite number"),
    ],
)
def test_malformed_frames_are_refused_with_a_code_and_the_value(frame: bytes, code: str, message: str) -> None:
    with pytest.raises(wire.FrameError) as raised:
        wire.parse_spu_message(frame)
    assert (raised.value.code, message in str(raised.value)) == (code, True), str(raised.value)


def test_an_oversized_frame_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(wire.FrameError, match="frame of 2001 bytes is over the limit of 2000 bytes") as raised:
        wire.parse_spu_message(b"x" * 2001, max_bytes=2000)
    assert raised.value.code == "frame-too-large"


def test_register_and_lrs_round_trip_in_camel_case() -> None:
    register = wire.Register(spu_id=5, token="t")
    assert wire.encode(register) == b'{"v":1,"type":"register","spuId":5,"token":"t"}'
    assert wire.parse_spu_message(wire.encode(register)) == register
    report = wire.LiveReplicas(
        leaders=[wire.LeaderReport(partition="t-0", hw=3, leo=4, followers=[wire.ReplicaOffsets(spu=2, hw=3, leo=3)])]
    )
    assert wire.parse_spu_message(wire.encode(report)) == report


def test_sc_messages_round_trip() -> None:
    endpoint = wire.Endpoint(host="10.0.0.1", port=9005)
    messages: list[wire.Message] = [
        wire.Accepted(spu_id=1, heartbeat_timeout=10.0),
        wire.Rejected(code="unregistered", reason="no"),
        wire.Sync(
            epoch=7,
            spus=[wire.SpuInfo(id=1, name="spu-1", rack="r1", public_endpoint=endpoint, private_endpoint=endpoint)],
            replicas=[wire.ReplicaInfo(partition="t-0", leader=None, replicas=[1, 2])],
        ),
        wire.Update(epoch=8, deleted_spus=[3], deleted_replicas=["t-1"]),
        wire.Error(code="not-hosted", message="x"),
    ]
    for message in messages:
        assert wire.parse_sc_message(wire.encode(message)) == message


@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_a_frame_error(frame: bytes) -> None:
    try:
        wire.parse_spu_message(frame)
    except wire.FrameError as error:
        assert error.code in {"malformed", "unknown-type", "unsupported-version", "invalid", "frame-too-large"}


@given(st.integers(0, 200))
def test_every_truncation_of_a_valid_frame_is_refused_cleanly(cut: int) -> None:
    frame = wire.encode(
        wire.LiveReplicas(leaders=[wire.LeaderReport(partition="orders-7", hw=10, leo=12, followers=[wire.ReplicaOffsets(spu=1, hw=10, leo=11)])])
    )
    if cut >= len(frame):
        return
    with pytest.raises(wire.FrameError):
        wire.parse_spu_message(frame[:cut])


# ---------------------------------------------------------------------------- the LRS merge


def report(partition: str, hw: int, leo: int, **followers: int) -> wire.LeaderReport:
    return wire.LeaderReport(
        partition=partition,
        hw=hw,
        leo=leo,
        followers=[wire.ReplicaOffsets(spu=int(spu[1:]), hw=min(hw, f_leo), leo=f_leo) for spu, f_leo in followers.items()],
    )


def test_lrs_merge_reports_only_meaningful_changes() -> None:
    live = lrs.LiveReplicas()
    steps = [
        (0, report("t-0", 10, 12, s1=10, s2=9), True),  # first report
        (0, report("t-0", 20, 22, s1=21, s2=9), False),  # offsets move, in-sync set {1} unchanged
        (0, report("t-0", 20, 25, s1=21, s2=20), True),  # SPU 2 catches up to the HW
        (0, report("t-0", 30, 31, s1=30, s2=30), False),
        (1, report("t-0", 30, 30, s0=30, s2=30), True),  # a new leader reports
        (1, report("t-0", 30, 40, s0=29, s2=35), True),  # SPU 0 falls below the HW
    ]
    outcomes = [live.merge(reporter, item, now=float(step)) for step, (reporter, item, _) in enumerate(steps)]
    assert outcomes == [expected for _, _, expected in steps]
    status = live.get("t-0")
    assert status == lrs.LiveStatus(
        leader=1, hw=30, leo=40, followers=(lrs.ReplicaOffsets(0, 29, 29), lrs.ReplicaOffsets(2, 30, 35)), reported_at=5.0
    )
    assert status.in_sync() == {2}
    assert live.reports == 6
    live.forget("t-0")
    assert live.get("t-0") is None
