"""What an SPU's frames can do on the SC, from its first frame on, read as the connection manager
reads them (``_read_register``, ``_read_hosted``, ``_take_frame``; the WebSocket a stand-in): a
refused frame is answered with a short error, logged once per kind, and changes nothing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import structlog.testing

from connection_manager import health, lrs, ratelimit, reports, server, wire
from store import local, models
from tests.builders import partition


def uid_created_at(revision: int) -> int:
    """The uid the tests give a partition created at ``revision`` (another number: a uid is no revision)."""
    return 1_000 + revision


def manager_with(*names: str) -> tuple[server.ConnectionManager, server.Session, list[set[str]]]:
    """A connection manager whose SPU 0 is connected and was told it leads ``names`` (replicas 0, 1,
    2, Online at leader epoch 0), and the partition sets the controllers were told of (on_news)."""
    store = local.LocalStore()
    for revision, name in enumerate(names, start=1):
        store["partitions"].apply(partition(name, [0, 1, 2], resolution="Online", uid=uid_created_at(revision)), revision)
    news: list[set[str]] = []
    cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas(), on_news=news.append)
    session = server.Session(0, "spu-0", 1, None)  # type: ignore[arg-type]  # frames only go to its outbox
    session.hosted = {entry.name: server._replica_info(entry, session.incarnation) for entry in cm.replicas_of(0)}
    session.ready = True
    cm.sessions[0] = session
    return cm, session, news


def sent(session: server.Session) -> list[wire.ScMessages]:
    frames = []
    while not session.outbox.empty():
        frame = session.outbox.get_nowait()
        assert frame is not None
        frames.append(wire.parse_sc_message(frame))
    return frames


async def test_a_refused_frame_is_answered_and_logged_short_and_once_per_kind() -> None:
    """A frame may quote anything at any length (a field name, a type tag): its refusal quotes an
    excerpt, and an SPU repeating it is logged once an interval, as a bad first frame is. A 3 MB
    field name was sent back whole, logged whole at every frame, and queued whole for an SPU that
    does not read (up to a thousand of them: gigabytes)."""
    cm, session, _ = manager_with("orders-0")
    name = "A" * 3_000_000
    excerpt = ratelimit.excerpt(f"field 'heartbeat.{name}': Extra inputs are not permitted (got 1)", server.FRAME_ERROR_CHARS)
    assert excerpt.endswith("... (3000058 characters)") and len(excerpt) < 200
    frame = b'{"v": 2, "type": "heartbeat", "' + name.encode() + b'": 1}'
    with structlog.testing.capture_logs() as logged:
        for _ in range(3):
            assert cm._take_frame(session, frame) == "unreadable"
    errors = sent(session)
    assert [error.type for error in errors] == ["error"] * 3
    assert {(error.code, error.message) for error in errors if isinstance(error, wire.Error)} == {
        ("invalid", excerpt)
    }
    lines = [entry for entry in logged if entry["event"] == "frame refused"]
    assert len(lines) == 1 and lines[0]["error"] == excerpt
    assert cm.stats.frame_errors == {"invalid": 3}
    assert cm.log.suppressed_total == 2


async def test_a_leading_frame_with_an_entry_it_does_not_host_changes_nothing() -> None:
    """The frame is refused whole: the confirmation before the bad entry was kept without the
    controllers being told, and the same confirmation sent again then told them nothing either
    (an Offline partition stayed so until something else woke the controllers for it, at the
    latest the periodic resync)."""
    cm, session, news = manager_with("orders-0")
    frame = wire.Leading(
        partitions=[
            wire.Leadership(partition="orders-0", leader_epoch=0),
            wire.Leadership(partition="other-0", leader_epoch=0),
        ]
    )
    cm._take_frame(session, wire.encode(frame))
    assert [(error.type, getattr(error, "code", None)) for error in sent(session)] == [("error", "not-hosted")]
    assert (cm.confirmed, news) == ({}, [])
    cm._take_frame(session, wire.encode(wire.Leading(partitions=[wire.Leadership(partition="orders-0", leader_epoch=0)])))
    assert (cm.confirmed, news) == ({"orders-0": (0, 0)}, [{"orders-0"}])


async def test_a_leading_frame_of_many_stale_leaderships_is_answered_in_a_few_frames() -> None:
    """An SPU that confirms thousands of leaderships the SC has since moved (it was paused while a
    failover moved them: 2,000 per SPU at 100,000 partitions on 50 SPUs) stays connected, and the
    first few are refused one by one; the rest in one frame naming how many. One refusal per
    entry made a 4 MB frame of 90,000 stale entries cost the SC 2.2 s of its loop and 90,001
    frames back (20 MB), beyond what the SPU's byte budget bounds."""
    names = [f"orders-{index}" for index in range(2_000)]
    cm, session, news = manager_with(*names)
    frame = wire.Leading(partitions=[wire.Leadership(partition=name, leader_epoch=1) for name in names])
    cm._take_frame(session, wire.encode(frame))
    assert session.closing is None
    errors = sent(session)
    first = names[: server.STALE_ANSWERS_PER_FRAME]
    assert [(error.type, getattr(error, "partition", None)) for error in errors] == [("error", name) for name in first] + [
        ("error", None)
    ]
    rest = errors[-1]
    assert isinstance(rest, wire.Error) and rest.code == "stale-leaderships", rest
    assert rest.message.startswith(f"SPU 0 does not lead {2_000 - len(first)} more partitions of this frame "), rest.message
    assert (cm.confirmed, news, cm.stats.stale_entries) == ({}, [], 2_000)


async def test_the_answer_to_a_frame_of_stale_leaderships_is_bounded_whatever_its_entries() -> None:
    """The frames and bytes sent back for one `leading` frame do not grow with its stale entries
    (90,000: nearly the most a 4 MiB frame holds): an SPU gets a few kilobytes back."""
    entries = 90_000
    cm, session, _ = manager_with("orders-0")
    frame = wire.Leading(partitions=[wire.Leadership(partition="orders-0", leader_epoch=7)] * entries)
    cm._take_frame(session, wire.encode(frame))
    assert session.closing is None
    assert session.outbox.qsize() <= 20 and session.queued_bytes <= 16 * 1024, (session.outbox.qsize(), session.queued_bytes)
    errors = sent(session)
    assert all(isinstance(error, wire.Error) for error in errors)
    assert f"{entries - (len(errors) - 1)} more" in errors[-1].message  # type: ignore[union-attr]  # every one is a wire.Error (checked just above)
    assert cm.stats.stale_entries == entries


async def test_an_spu_that_does_not_read_is_closed_once_its_outbox_holds_too_many_bytes() -> None:
    """What waits for an SPU is bounded in bytes (small frames counted with their overhead): past
    SEND_QUEUE_BYTES it is closed as `too-slow`, and nothing more is queued for it."""
    cm, session, _ = manager_with("orders-0")
    message = wire.Error(code="invalid", message="x" * 1_000_000)
    frame_bytes = len(wire.encode(message)) + server.FRAME_OVERHEAD_BYTES
    fits = server.SEND_QUEUE_BYTES // frame_bytes
    for _ in range(fits):
        session.send(message)
    assert session.closing is None and session.queued_bytes == fits * frame_bytes
    session.send(message)
    assert session.closing is not None and session.closing[0] == "too-slow"
    assert f"{server.SEND_QUEUE_BYTES} bytes" in session.closing[1], session.closing
    queued = session.outbox.qsize()
    session.send(message)
    assert session.outbox.qsize() == queued  # closed: nothing more is queued


class Reading:
    """A WebSocket whose SPU reads everything it is sent."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.closed = False

    async def send_bytes(self, frame: bytes) -> None:
        self.frames.append(frame)

    async def close(self, message: bytes = b"") -> None:
        self.closed = True


async def test_what_an_spu_reads_leaves_its_outbox_count() -> None:
    """The bytes counted for an SPU are those still waiting: an SPU that reads everything it is sent
    can be sent more than SEND_QUEUE_BYTES over its connection's life."""
    websocket = Reading()
    session = server.Session(0, "spu-0", 1, websocket)  # type: ignore[arg-type]  # only send_bytes and close are used
    message = wire.Error(code="invalid", message="x" * 1_000_000)
    writer = asyncio.create_task(session.write_loop())
    for _ in range(3 * server.SEND_QUEUE_BYTES // 1_000_000):
        session.send(message)
        await asyncio.sleep(0)
    session.close("closed", "done")
    await writer
    assert session.queued_bytes == 0 and websocket.closed
    assert len(websocket.frames) == 3 * server.SEND_QUEUE_BYTES // 1_000_000 + 1  # and the Rejected
    assert session.closing == ("closed", "done")


async def test_offsets_naming_a_follower_twice_are_refused_and_kept_nowhere() -> None:
    """A partition has at most MAX_REPLICATION_FACTOR replicas, but a follower listed again and
    again filled a whole frame: the SC kept every entry in the partition's live status until the
    partition's next report (16 MB for one 4 MB frame, and as much again for each partition the
    SPU leads)."""
    cm, session, _ = manager_with("orders-0")
    followers = [wire.ReplicaOffsets(spu=1, hw=5, leo=5)] * 1_000 + [wire.ReplicaOffsets(spu=2, hw=5, leo=5)]
    frame = wire.Offsets(partitions=[wire.PartitionOffsets(partition="orders-0", leader_epoch=0, hw=5, leo=5, followers=followers)])
    cm._take_frame(session, wire.encode(frame))
    [error] = sent(session)
    assert isinstance(error, wire.Error) and error.code == "invalid", error
    assert error.message == "SPU 0 reported follower SPU 1 of partition 'orders-0' more than once"
    assert cm.live.get("orders-0") is None


@pytest.mark.parametrize(
    ("leader", "follower", "message"),
    [
        (
            (2**63 - 1, 5), (5, 5),
            "SPU 0 reported hw 9223372036854775807 above its log end (leo 5) for partition 'orders-1'",
        ),
        (
            (5, 5), (2**63 - 1, 0),
            "SPU 0 reported hw 9223372036854775807 above the log end (leo 0) of follower SPU 1 for partition 'orders-1'",
        ),
    ],
    ids=["leader", "follower"],
)
async def test_offsets_with_a_high_watermark_above_the_log_end_are_refused_and_kept_nowhere(
    leader: tuple[int, int], follower: tuple[int, int], message: str
) -> None:
    """A replica's HW never passes its LEO (every committed record is in its log). An entry saying
    so was kept, and its HW counted committed: written with the partition's next status write, never
    to go back, and a replica that restarted with fewer records than that could not lead again (the
    partition stayed leaderless). The frame is refused whole, as for the other malformed entries:
    the good entry before it is not taken either."""
    cm, session, _ = manager_with("orders-0", "orders-1")
    (hw, leo), (follower_hw, follower_leo) = leader, follower
    frame = wire.Offsets(
        partitions=[
            wire.PartitionOffsets(partition="orders-0", leader_epoch=0, hw=5, leo=5, followers=[wire.ReplicaOffsets(spu=1, hw=5, leo=5)]),
            wire.PartitionOffsets(
                partition="orders-1", leader_epoch=0, hw=hw, leo=leo,
                followers=[wire.ReplicaOffsets(spu=1, hw=follower_hw, leo=follower_leo)],
            ),
        ]
    )
    cm._take_frame(session, wire.encode(frame))
    assert (cm.live.max_hw("orders-0"), cm.live.max_hw("orders-1")) == (-1, -1)
    assert (cm.live.get("orders-0"), cm.live.get("orders-1")) == (None, None)
    [error] = sent(session)
    assert isinstance(error, wire.Error) and (error.code, error.message) == ("invalid", message), error


async def test_a_proposals_hw_counts_committed_only_once_its_set_is_committed() -> None:
    """A proposal's HW tells the SC that much is committed only if the SC commits its set (rule 4):
    it is written with the write that commits the set. It counted as soon as the frame came in, so
    a refused proposal (here, naming SPU 5, no replica) still raised the HW the SC writes, for good."""
    cm, session, news = manager_with("orders-0")
    refused = wire.AlterIsr(
        partition="orders-0", leader_epoch=0, partition_epoch=0, isr=[0, 5], hw=2**63 - 1,
        incarnations=[wire.MemberIncarnation(spu=5, incarnation=1)],
    )
    cm._take_frame(session, wire.encode(refused))
    assert cm.live.max_hw("orders-0") == -1
    [proposal] = cm.proposals.values()
    assert (proposal.hw, news) == (2**63 - 1, [{"orders-0"}])
    answer = {"partition": "orders-0", "leader_epoch": 0, "partition_epoch": 0, "isr": [0, 1, 2]}
    cm.answer(proposal, wire.AlterIsrResult(error="invalid", message="SPU 5 is no replica", **answer))
    assert (cm.live.max_hw("orders-0"), cm.proposals) == (-1, {})
    # A committed set's HW counts (also when it is the committed set already: no write carries it).
    cm._take_frame(session, wire.encode(wire.AlterIsr(partition="orders-0", leader_epoch=0, partition_epoch=0, isr=[0, 1, 2], hw=7)))
    [proposal] = cm.proposals.values()
    cm.answer(proposal, wire.AlterIsrResult(error=None, message="committed", **answer))
    assert cm.live.max_hw("orders-0") == 7
    assert [frame.type for frame in sent(session)] == ["alterIsrResult", "alterIsrResult"]


async def test_a_proposal_listing_more_spus_than_a_partition_may_have_is_refused_at_once() -> None:
    """A proposed set lists distinct replicas, at most MAX_REPLICATION_FACTOR of them; one listing
    SPU 0 a million times was held for the partition controller, which refused it quoting the whole
    list: an answer of megabytes per proposal, queued for a leader that need not read them."""
    cm, session, news = manager_with("orders-0")
    limit = models.MAX_REPLICATION_FACTOR
    for field, value in (("isr", [0] * (limit + 1)), ("incarnations", [{"spu": 1, "incarnation": 5}] * (limit + 1))):
        frame = {"v": 2, "type": "alterIsr", "partition": "orders-0", "leaderEpoch": 0, "partitionEpoch": 0, "isr": [0, 1, 2]}
        cm._take_frame(session, json.dumps({**frame, field: value}).encode())
        [error] = sent(session)
        assert isinstance(error, wire.Error) and error.code == "invalid", error
        assert f"field 'alterIsr.{field}': List should have at most {limit} items after validation, not {limit + 1}" in error.message
    assert (cm.proposals, news) == ({}, [])


class FirstFrame:
    """A new connection's client that sends one frame; what the SC answers is recorded."""

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        self.sent: list[wire.ScMessages] = []
        self.closed = False

    async def receive(self, timeout: float) -> aiohttp.WSMessage:
        return aiohttp.WSMessage(aiohttp.WSMsgType.BINARY, self.frame, None)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(wire.parse_sc_message(data))

    async def close(self, message: bytes = b"") -> None:
        self.closed = True


async def test_a_first_frame_larger_than_a_registration_is_refused_unread() -> None:
    """The first frame is read before the client proved anything (its token is in it): it is a
    Register, a few hundred bytes, and one over REGISTER_MAX_BYTES is refused before it is parsed.
    Read up to spu_max_frame_bytes (4 MB), a Register with 350,000 extra fields held the event loop
    for 1 to 2.5 s and took 400 MB to be refused, for every connection of anyone."""
    cm, _, _ = manager_with()
    limit = server.REGISTER_MAX_BYTES
    fits = wire.encode(wire.Register(spu_id=1, token="t" * (limit - 100)))
    registered = await cm._read_register(FirstFrame(fits), "192.0.2.7")  # type: ignore[arg-type]  # a recording stand-in for the WebSocket
    assert len(fits) <= limit and registered == wire.Register(spu_id=1, token="t" * (limit - 100))
    client = FirstFrame(wire.encode(wire.Register(spu_id=1, token="t" * limit)))
    assert await cm._read_register(client, "192.0.2.7") is None  # type: ignore[arg-type]  # a recording stand-in for the WebSocket
    assert client.sent == [
        wire.Rejected(code="frame-too-large", reason=f"frame of {limit + 46} bytes is over the limit of {limit} bytes")
    ]
    assert client.closed and cm.stats.frame_errors == {"frame-too-large": 1}


async def test_a_bad_hosted_frame_closes_the_connection_with_an_excerpt() -> None:
    """The reason a connection closes is sent to the SPU and logged with its end ("SPU
    disconnected"): a refused Hosted frame's reason quoted a field name of 3 MB whole, in one log
    line per connection."""
    cm, _, _ = manager_with()
    name = "A" * 3_000_000
    session = server.Session(0, "spu-0", 2, FirstFrame(b'{"v": 2, "type": "hosted", "' + name.encode() + b'": 1}'))  # type: ignore[arg-type]  # a recording stand-in for the WebSocket
    cm.sessions[0] = session
    assert not await cm._read_hosted(session)
    excerpt = ratelimit.excerpt(f"field 'hosted.{name}': Extra inputs are not permitted (got 1)", server.FRAME_ERROR_CHARS)
    assert session.closing == ("invalid", excerpt)


@pytest.mark.looptime
async def test_an_spus_frames_are_paced_by_their_bytes_only_past_two_of_the_largest() -> None:
    """What an SPU sends at once after connecting (its `hosted` and `leading` frames, each at most
    spu_max_frame_bytes) is read at once; beyond that, the SC reads it no faster than
    spu_frame_bytes_per_second, and the schedule is kept by SPU id: reconnecting refills nothing."""
    cm, session, _ = manager_with("orders-0")
    largest = cm.max_frame_bytes
    cm._spend(0, largest)  # its `hosted` frame
    cm._spend(0, largest)  # its `leading` frame
    assert cm._frames_wait(0) == 0.0 and cm.stats.frames_paced == 0
    cm._spend(0, cm.frame_bytes_per_second)  # a second's worth more
    assert cm._frames_wait(0) == pytest.approx(1.0) and cm.stats.frames_paced == 1
    assert cm._frames_wait(1) == 0.0  # another SPU pays for nothing of it
    # A new connection of SPU 0 finds the same schedule; a second later it is back within.
    assert cm._frames_wait(0) > 0
    await asyncio.sleep(1.0)
    assert cm._frames_wait(0) == 0.0
    # Capped well within the heartbeat timeout: its frames, pings and heartbeats are read again by then.
    cm._spend(0, 100 * cm.frame_bytes_per_second)
    assert cm._frames_wait(0) == cm.heartbeat_timeout / 2


def recreate(cm: server.ConnectionManager, session: server.Session, name: str, revision: int, told: bool = True) -> int:
    """``name`` deleted and created again at ``revision`` as the topic controller creates it (same
    replicas, leader 0, Offline at epochs 0: deterministic placement gives the same; a uid of its
    own), its uid returned; with ``told`` the SC pushed it to ``session`` (deletion first, as push does)."""
    table = cm.local_store["partitions"]
    listener = table.listener()
    listener.changes()
    table.delete(name, revision - 1)
    table.apply(partition(name, [0, 1, 2], uid=uid_created_at(revision)), revision)
    changes = listener.changes()
    if told:
        server._replica_delta(session, changes, table.view)
    entry = table.view[name]
    assert entry.create_revision == revision and entry.obj.uid is not None
    return entry.obj.uid


def about(name: str, uid: int | None, hw: int = 1_000) -> list[wire.Message]:
    """What a leader of ``name`` at leader epoch 0 says of the partition of uid ``uid``
    (None: an SPU older than the field, which names none)."""
    leadership = wire.Leadership(partition=name, leader_epoch=0)
    offsets = wire.PartitionOffsets(partition=name, leader_epoch=0, hw=hw, leo=hw)
    if uid is not None:
        leadership["uid"] = offsets["uid"] = uid
    return [
        wire.Leading(partitions=[leadership]),
        wire.Offsets(partitions=[offsets]),
        wire.AlterIsr(partition=name, leader_epoch=0, partition_epoch=1, isr=[0, 1], hw=hw, uid=uid),
    ]


async def test_frames_about_a_partition_deleted_and_created_again_count_for_nothing_for_the_new_one() -> None:
    """A leader's frames about the old partition, sent before it read the update that deleted it
    and assigned the new one (same name, same leader, same epochs: a topic deleted and created
    again), came in after the SC had told it the new one. They named it by name alone, so the old
    log's HW counted as the new partition's (shown, and written with its next status write, for
    good), the old leadership confirmed the new partition, and the old proposal was held for it.
    Each names the uid of the partition it is about: another than the one the SPU was
    told is stale, dropped or answered `stale-partition` with the state the SPU was told."""
    cm, session, news = manager_with("orders-0")
    old = session.hosted["orders-0"].uid
    new = recreate(cm, session, "orders-0", 3)
    assert (old, session.hosted["orders-0"].uid) == (uid_created_at(1), new)
    for frame in about("orders-0", old):
        cm._take_frame(session, wire.encode(frame))
    assert (cm.live.max_hw("orders-0"), cm.live.get("orders-0"), cm.confirmed, cm.proposals, news) == (-1, None, {}, {}, [])
    assert cm.stats.stale_entries == 3
    leading, proposal = sent(session)
    assert isinstance(leading, wire.Error) and (leading.code, leading.partition) == ("stale-partition", "orders-0"), leading
    assert leading.message == (
        f"SPU 0 named partition 'orders-0' of uid {old}: that partition was deleted; "
        f"the current one has uid {new}"
    )
    assert isinstance(proposal, wire.AlterIsrResult) and proposal.error == "stale-partition", proposal
    assert (proposal.leader_epoch, proposal.partition_epoch, proposal.isr) == (0, 0, [0, 1, 2])
    # The same frames about the new partition count.
    for frame in about("orders-0", new, hw=5):
        cm._take_frame(session, wire.encode(frame))
    assert (cm.live.max_hw("orders-0"), cm.confirmed, list(cm.proposals)) == (5, {"orders-0": (0, 0)}, ["orders-0"])
    assert sent(session) == [] and cm.stats.stale_entries == 3


async def test_frames_about_a_partition_the_sc_created_again_before_telling_the_spu_count_for_nothing() -> None:
    """Between the store's delete and re-create and the push that tells the SPU (PUSH_LINGER, the
    partition controller's pass running first), the SPU's frames are about the partition it was
    told, the old one, whether they name it or not (an SPU older than the field): the SC takes
    in none of them, though they match what it told that SPU. One taken in was forgotten only
    at the push, after a pass of the partition controller may have decided on it."""
    for identity in (uid_created_at(1), None):
        cm, session, news = manager_with("orders-0")
        recreate(cm, session, "orders-0", 3, told=False)
        for frame in about("orders-0", identity):
            cm._take_frame(session, wire.encode(frame))
        assert (cm.live.max_hw("orders-0"), cm.confirmed, cm.proposals, news) == (-1, {}, {}, []), identity
        assert [(frame.type, getattr(frame, "code", None) or getattr(frame, "error", None)) for frame in sent(session)] == [
            ("error", "stale-partition"), ("alterIsrResult", "stale-partition")
        ]
        assert cm.stats.stale_entries == 3


async def test_a_process_holding_another_partition_of_the_name_does_not_hold_the_current_one() -> None:
    """An SPU away while its partition was deleted and created again (same name, leader, epochs)
    came back saying it holds the name at the leader epoch it was told, with the old log's end:
    the SC took it for the same process in the same role (not restarted), holding the new
    partition's records. Its `hosted` entry names the uid of the partition it holds: another one is
    another partition's log, so the role it has in the current one is one it was not told of."""
    cm, _, _ = manager_with("orders-0")
    recreate(cm, cm.sessions[0], "orders-0", 3)
    cm.local_store["partitions"].apply(partition("orders-0", [0, 1, 2], resolution="Online", uid=uid_created_at(3)), 4)  # its leader confirmed
    for identity, restarted in ((uid_created_at(1), {"orders-0": 0}), (uid_created_at(3), {}), (None, {})):
        held = wire.HostedReplica(partition="orders-0", leo=1_000, leader_epoch=0)
        if identity is not None:
            held["uid"] = identity
        session = server.Session(0, "spu-0", 2, FirstFrame(wire.encode(wire.Hosted(partitions=[held]))))  # type: ignore[arg-type]  # a recording stand-in for the WebSocket
        cm.sessions[0] = session
        assert await cm._read_hosted(session), session.closing
        assert session.incarnation.restarted == restarted, identity
        assert session.incarnation.leo("orders-0") == (None if restarted else 1_000), identity


@pytest.mark.parametrize("listed_create_revision", [8, 0])
async def test_a_relist_showing_a_partition_created_again_tells_its_spus_and_forgets_what_the_old_one_said(
    listed_create_revision: int,
) -> None:
    """A relist of the store (the SC's watch was broken meanwhile) names nothing deleted: a
    partition deleted and created again under its name was taken for an update of the old one.
    Its SPUs were told the new state as the old partition's, and the old one's confirmation and HW
    stayed the SC's for the new one. The mirror names it deleted when the listing shows its key's
    new create revision (8), and its uid tells them apart even when it does not (0: unknown): the
    SPUs are told the old one is gone and the new one assigned, and what the old one's leader
    said is forgotten."""
    cm, session, _ = manager_with("orders-0")
    for frame in about("orders-0", uid_created_at(1))[:2]:
        cm._take_frame(session, wire.encode(frame))
    assert (cm.confirmed, cm.live.max_hw("orders-0")) == ({"orders-0": (0, 0)}, 1_000)
    table = cm.local_store["partitions"]
    listener = table.listener()
    listener.changes()
    table.resync([(partition("orders-0", [0, 1, 2], uid=uid_created_at(8)), 8, listed_create_revision)], revision=8)
    changes = listener.changes()
    assert changes.full and changes.deleted == (["orders-0"] if listed_create_revision else [])
    changed, deleted = server._replica_delta(session, changes, table.view)
    assert (deleted, [(info.partition, info.uid) for info in changed]) == (["orders-0"], [("orders-0", uid_created_at(8))])
    cm.forget_recreated(table.view)
    assert (cm.confirmed, cm.live.max_hw("orders-0"), cm.identities) == ({}, -1, {})


async def test_a_partition_without_a_uid_is_told_none_and_its_frames_are_checked_for_no_identity() -> None:
    """A partition created before SCs gave partitions a uid has no identity: its SPUs are told none
    (they keep the log they have of the name), and what its leader says is taken by name, as
    before, whatever uid it names (one it kept from an earlier partition of the name)."""
    for named in (None, 7):
        store = local.LocalStore()
        store["partitions"].apply(partition("orders-0", [0, 1, 2], resolution="Online"), 1)
        news: list[set[str]] = []
        cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas(), on_news=news.append)
        session = server.Session(0, "spu-0", 1, None)  # type: ignore[arg-type]  # frames only go to its outbox
        session.hosted = {entry.name: server._replica_info(entry, session.incarnation) for entry in cm.replicas_of(0)}
        session.ready = True
        cm.sessions[0] = session
        assert session.hosted["orders-0"].uid is None
        assert b"uid" not in wire.encode(wire.Sync(epoch=1, spus=[], replicas=list(session.hosted.values())))
        for frame in about("orders-0", named, hw=5):
            cm._take_frame(session, wire.encode(frame))
        assert (cm.live.max_hw("orders-0"), cm.confirmed, list(cm.proposals)) == (5, {"orders-0": (0, 0)}, ["orders-0"]), named
        assert sent(session) == [] and cm.stats.stale_entries == 0 and cm.identities == {}
        held = wire.HostedReplica(partition="orders-0", leo=1_000, leader_epoch=0)
        if named is not None:
            held["uid"] = named
        assert reports.hosted_map([held], {}) == {"orders-0": (1_000, 0)}
