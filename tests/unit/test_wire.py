"""SC<->SPU frames: every malformed case gets a stable code and a message naming the value."""

from __future__ import annotations

import json
import re
import tracemalloc

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connection_manager import lrs, wire
from store import models


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
        (b'{"type": "register", "v": 1, "spuId": 1}', "unsupported-version", "protocol version 1 is not supported; this SC speaks version 2"),
        (b'{"type": "register"}', "invalid", "field 'register.spuId': Field required"),
        (b'{"type": "register", "spuId": "one"}', "invalid", "field 'register.spuId'"),
        (b'{"type": "register", "spuId": -1}', "invalid", "greater than or equal to 0 (got -1)"),
        (b'{"type": "register", "spuId": 1, "extra": true}', "invalid", "field 'register.extra': Extra inputs"),
        (b'{"type": "lrs", "leaders": []}', "unknown-type", "unknown message type 'lrs'"),  # protocol 1's report
        (
            b'{"type": "offsets", "partitions": [{"partition": "t-0", "leaderEpoch": 1, "hw": 1}]}',
            "invalid",
            "field 'offsets.partitions.0.leo': Field required",
        ),
        (
            b'{"type": "offsets", "partitions": [{"partition": "t-0", "hw": 1, "leo": 1}]}',
            "invalid",
            "field 'offsets.partitions.0.leaderEpoch': Field required",
        ),
        (
            b'{"type": "offsets", "partitions": [{"partition": "t-0", "leaderEpoch": 0, "hw": 1, "leo": 1, "followers": [{"spu": 2, "hw": 0, "leo": -3}]}]}',
            "invalid",
            "field 'offsets.partitions.0.followers.0.leo'",
        ),
        (b'{"type": "offsets", "partitions": [{"partition": "", "leaderEpoch": 0, "hw": 1, "leo": 1}]}', "invalid", "offsets.partitions.0.partition"),
        (b'{"type": "alterIsr", "partition": "t-0", "leaderEpoch": -1, "partitionEpoch": 0, "isr": [0]}', "invalid", "alterIsr.leaderEpoch"),
        (
            b'{"type": "alterIsr", "partition": "t-0", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [0, 1], "incarnations": [{"spu": 1, "incarnation": 0}]}',
            "invalid",
            "field 'alterIsr.incarnations.0.incarnation': Input should be greater than or equal to 1 (got 0)",
        ),
        (
            b'{"type": "alterIsr", "partition": "t-0", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [0, 1], "incarnations": [{"spu": 1, "incarnation": 9223372036854775808}]}',
            "invalid",
            "alterIsr.incarnations.0.incarnation': Input should be less than or equal to 9223372036854775807",
        ),
        (
            b'{"type": "alterIsr", "partition": "t-0", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [0, 1], "incarnations": [{"spu": 1}]}',
            "invalid",
            "field 'alterIsr.incarnations.0.incarnation': Field required",
        ),
        (b'{"type": "hosted", "partitions": [{"partition": "t-0", "leo": 1}]}', "invalid", "hosted.partitions.0.leaderEpoch"),
        (b'{"type": "leading", "partitions": [{"partition": "t-0", "leaderEpoch": 1, "x": 1}]}', "invalid", "leading.partitions.0.x"),
        # Numbers past Python's int digit limit, or just below it: a frame error, never a ValueError.
        # (Main's protocol-1 cases, carried to protocol 2's offsets message.)
        (b'{"type": "register", "spuId": ' + b"9" * 5000 + b"}", "malformed", "number out of range"),
        (b'{"type": "offsets", "partitions": [{"partition": "t-0", "leaderEpoch": 0, "hw": ' + b"9" * 4299 + b', "leo": 1}]}', "invalid", "(got 9999999999"),
        (b'{"type": "offsets", "partitions": [{"partition": "t-0", "leaderEpoch": 0, "hw": 1, "leo": 9223372036854775808}]}', "invalid", "less than or equal to 9223372036854775807"),
        (b'{"type": "leading", "partitions": [{"partition": "t-0", "leaderEpoch": 9223372036854775808}]}', "invalid", "less than or equal to 9223372036854775807"),
        (b'{"type": "register", "spuId": 1e400}', "invalid", "register.spuId': Input should be a valid integer (got inf)"),
        # Integers are JSON integers: not strings, booleans or floats that happen to hold one (the
        # protocol says integers; a lax reading would let two SPUs' frames mean one thing two ways).
        (b'{"type": "register", "spuId": "3"}', "invalid", "register.spuId': Input should be a valid integer"),
        (b'{"type": "register", "spuId": true}', "invalid", "register.spuId': Input should be a valid integer"),
        (b'{"type": "register", "spuId": 3.0}', "invalid", "register.spuId': Input should be a valid integer"),
        (b'{"type": "offsets", "partitions": [{"partition": "t-0", "leaderEpoch": "0", "hw": 1, "leo": 1}]}', "invalid", "offsets.partitions.0.leaderEpoch"),
        (b'{"type": "leading", "partitions": [{"partition": "t-0", "leaderEpoch": false}]}', "invalid", "leading.partitions.0.leaderEpoch"),
    ],
)
def test_malformed_frames_are_refused_with_a_code_and_the_value(frame: bytes, code: str, message: str) -> None:
    with pytest.raises(wire.FrameError) as raised:
        wire.parse_spu_message(frame)
    assert (raised.value.code, message in str(raised.value)) == (code, True), str(raised.value)


@pytest.mark.parametrize("token", ['["the-secret-token-xyz"]', '{"t": "the-secret-token-xyz"}', "12345678901234567890"])
def test_a_token_of_the_wrong_type_is_refused_without_quoting_it(token: str) -> None:
    """The reason is logged and sent back: a token, even of the wrong type, is never in it."""
    with pytest.raises(wire.FrameError) as raised:
        wire.parse_spu_message(b'{"type": "register", "spuId": 1, "token": ' + token.encode() + b"}")
    assert raised.value.code == "invalid" and "'register.token'" in str(raised.value), str(raised.value)
    assert "secret" not in str(raised.value) and "1234567890" not in str(raised.value)


def test_an_oversized_frame_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(wire.FrameError, match="frame of 2001 bytes is over the limit of 2000 bytes") as raised:
        wire.parse_spu_message(b"x" * 2001, max_bytes=2000)
    assert raised.value.code == "frame-too-large"


BAD_ENTRIES = 1_000


@pytest.mark.parametrize(
    ("frame", "first"),
    [
        ({"type": "hosted", "partitions": [[]] * BAD_ENTRIES}, "field 'hosted.partitions.0': Input should be an object"),
        ({"type": "leading", "partitions": [[]] * BAD_ENTRIES}, "field 'leading.partitions.0': Input should be an object"),
        ({"type": "offsets", "partitions": [[]] * BAD_ENTRIES}, "field 'offsets.partitions.0': Input should be an object"),
        (
            {"type": "offsets", "partitions": [{"partition": "t-0", "leaderEpoch": 0, "hw": 1, "leo": 1, "followers": [[]] * BAD_ENTRIES}]},
            "field 'offsets.partitions.0.followers.0': Input should be an object",
        ),
        (
            {"type": "alterIsr", "partition": "t-0", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [-1] * 100},
            "field 'alterIsr.isr.0': Input should be greater than or equal to 0",
        ),
        (
            {"type": "alterIsr", "partition": "t-0", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [0], "incarnations": [[]] * 100},
            "field 'alterIsr.incarnations.0': Input should be an object",
        ),
    ],
)
def test_a_list_of_bad_entries_is_refused_at_its_first_one(frame: dict[str, object], first: str) -> None:
    """Validation stops at a list's first bad entry: the frame is refused anyway, and an error
    collected for each of the 1.4 million entries "[]" a 4 MB frame holds held the SC's event loop
    for 7 s and 1.5 GB (before registration too: the first frame of any client)."""
    with pytest.raises(pydantic.ValidationError) as raised:
        wire._SPU_MESSAGES.validate_json(json.dumps({"v": 2, **frame}))
    errors = raised.value.error_count()
    assert errors == 1
    with pytest.raises(wire.FrameError, match=re.escape(first)):
        wire.parse_spu_message(json.dumps({"v": 2, **frame}))


def test_every_spu_frame_round_trips_in_camel_case() -> None:
    register = wire.Register(spu_id=5, token="t")
    assert wire.encode(register) == b'{"v":2,"type":"register","spuId":5,"token":"t"}'
    offsets = wire.Offsets(
        partitions=[
            wire.PartitionOffsets(
                partition="t-0", leader_epoch=3, hw=3, leo=4, followers=[wire.ReplicaOffsets(spu=2, hw=3, leo=3)]
            )
        ]
    )
    assert wire.encode(offsets) == (
        b'{"v":2,"type":"offsets","partitions":[{"partition":"t-0","leaderEpoch":3,"hw":3,"leo":4,'
        b'"followers":[{"spu":2,"hw":3,"leo":3}]}]}'
    )
    messages: list[wire.Message] = [
        register,
        offsets,
        wire.Hosted(partitions=[wire.HostedReplica(partition="t-0", leo=9, leader_epoch=None)]),
        wire.Heartbeat(),
        wire.Leading(partitions=[wire.Leadership(partition="t-0", leader_epoch=4)]),
        wire.AlterIsr(partition="t-0", leader_epoch=4, partition_epoch=7, isr=[0, 2]),
        wire.AlterIsr(
            partition="t-0", leader_epoch=4, partition_epoch=7, isr=[0, 2], hw=5,
            incarnations=[wire.MemberIncarnation(spu=2, incarnation=2**53 - 1)],
        ),
    ]
    for message in messages:
        assert wire.parse_spu_message(wire.encode(message)) == message
    assert wire.encode(messages[-1]) == (
        b'{"v":2,"type":"alterIsr","partition":"t-0","leaderEpoch":4,"partitionEpoch":7,"isr":[0,2],"hw":5,'
        b'"incarnations":[{"spu":2,"incarnation":9007199254740991}]}'
    )
    assert wire.encode_json({"v": 2, "type": "heartbeat"}) == wire.encode(wire.Heartbeat())


def test_sc_messages_round_trip() -> None:
    endpoint = wire.Endpoint(host="10.0.0.1", port=9005)
    messages: list[wire.Message] = [
        wire.Accepted(spu_id=1, incarnation=3, heartbeat_timeout=10.0, offsets_interval=1.0),
        wire.Accepted(spu_id=1, incarnation=2**63 - 1, heartbeat_timeout=10.0, offsets_interval=1.0),
        wire.Rejected(code="unregistered", reason="no"),
        wire.Sync(
            epoch=7,
            spus=[wire.SpuInfo(id=1, name="spu-1", rack="r1", public_endpoint=endpoint, private_endpoint=endpoint)],
            replicas=[wire.ReplicaInfo(partition="t-0", leader=None, leader_epoch=2, partition_epoch=5, isr=[1], replicas=[1, 2])],
        ),
        wire.Update(epoch=8, deleted_spus=[3], deleted_replicas=["t-1"]),
        wire.AlterIsrResult(partition="t-0", error="stale-epoch", message="m", leader_epoch=2, partition_epoch=5, isr=[1]),
        wire.Error(code="not-hosted", message="x"),
        wire.Error(code="stale-epoch", message="x", partition="t-0", leader_epoch=4),
    ]
    for message in messages:
        assert wire.parse_sc_message(wire.encode(message)) == message


@pytest.mark.parametrize("seconds", [0, -1, "NaN", "Infinity"])
def test_an_accepted_with_a_timeout_or_interval_that_is_no_duration_is_refused(seconds: object) -> None:
    """An SPU paces its heartbeats and offsets by them, and waits the heartbeat timeout for the SC's
    answer to a ping: none of them may be zero (a busy loop), negative or endless."""
    for field in ("heartbeatTimeout", "offsetsInterval"):
        accepted: dict[str, object] = {"type": "accepted", "spuId": 1, "incarnation": 3, "heartbeatTimeout": 10.0, "offsetsInterval": 1.0}
        accepted[field] = seconds
        text = json.dumps(accepted) if not isinstance(seconds, str) else json.dumps(accepted).replace(f'"{seconds}"', seconds)
        with pytest.raises(wire.FrameError, match=field):
            wire.parse_sc_message(text.encode())


@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_a_frame_error(frame: bytes) -> None:
    try:
        wire.parse_spu_message(frame)
    except wire.FrameError as error:
        assert error.code in {"malformed", "unknown-type", "unsupported-version", "invalid", "frame-too-large"}


@given(st.integers(0, 200))
def test_every_truncation_of_a_valid_frame_is_refused_cleanly(cut: int) -> None:
    frame = wire.encode(
        wire.Offsets(
            partitions=[
                wire.PartitionOffsets(
                    partition="orders-7", leader_epoch=2, hw=10, leo=12, followers=[wire.ReplicaOffsets(spu=1, hw=10, leo=11)]
                )
            ]
        )
    )
    if cut >= len(frame):
        return
    with pytest.raises(wire.FrameError):
        wire.parse_spu_message(frame[:cut])


# ---------------------------------------------------------------------------- the live offsets


def entry(partition: str, epoch: int, hw: int, leo: int, **followers: int) -> wire.PartitionOffsets:
    return wire.PartitionOffsets(
        partition=partition,
        leader_epoch=epoch,
        hw=hw,
        leo=leo,
        followers=[wire.ReplicaOffsets(spu=int(spu[1:]), hw=min(hw, f_leo), leo=f_leo) for spu, f_leo in followers.items()],
    )


def test_live_offsets_keep_the_last_report_and_the_highest_hw_ever_reported() -> None:
    live = lrs.LiveReplicas()
    live.merge(0, entry("t-0", 1, 10, 12, s1=10, s2=9), now=0.0)
    live.merge(0, entry("t-0", 1, 50, 52, s1=50, s2=49), now=1.0)
    live.merge(1, entry("t-0", 2, 30, 40, s0=29, s2=35), now=2.0)  # a new leader, behind what was committed
    assert live.get("t-0") == lrs.LiveStatus(
        leader=1, leader_epoch=2, hw=30, leo=40, followers=(lrs.ReplicaOffsets(0, 29, 29), lrs.ReplicaOffsets(2, 30, 35)),
        reported_at=2.0,
    )
    assert (live.max_hw("t-0"), live.max_hw("other-0"), live.reports) == (50, -1, 3)
    live.forget("t-0")
    assert (live.get("t-0"), live.max_hw("t-0")) == (None, -1)


def test_a_frame_of_many_problems_is_refused_without_describing_each() -> None:
    """A field is refused at each place it is not allowed, and pydantic reports every extra field of
    an object (lists stop at their first bad entry, objects do not): 320,000 of them in a 4 MB frame.
    Turning them all into Python to name the first took 1.3 s and 220 MB of the SC's event loop for
    each such frame, before registration too. Past models.MAX_PROBLEMS_READ problems, the refusal says
    how many and names none."""
    extras = ",".join(f"\"x{index}\":1" for index in range(320_000))
    frame = ('{"v": 2, "type": "heartbeat", ' + extras + "}").encode()
    assert len(frame) <= wire.MAX_FRAME_BYTES
    tracemalloc.start()
    try:
        with pytest.raises(wire.FrameError) as raised:
            wire.parse_spu_message(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raised.value.code == "invalid"
    assert str(raised.value) == (
        f"frame has 320000 problems, more than the {models.MAX_PROBLEMS_READ} a refusal names (unknown fields "
        "in one object, each a problem)"
    )
    assert peak < 32 * 1024 * 1024, peak
    # Below the bound, the first problem is still named.
    few = ('{"v": 2, "type": "heartbeat", ' + ", ".join(f'"x{index}": 1' for index in range(models.MAX_PROBLEMS_READ)) + "}").encode()
    with pytest.raises(wire.FrameError, match=re.escape("field 'heartbeat.x0': Extra inputs are not permitted (got 1)")):
        wire.parse_spu_message(few)
