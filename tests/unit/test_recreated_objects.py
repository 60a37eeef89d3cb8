"""An object deleted and created again under the same name is a new object for the connection
manager, however soon it comes back (within one push): a partition inherits neither its
predecessor's leadership confirmation, nor its offsets, nor a held proposal, and its SPUs are told
the old replica is gone and the new one assigned; a session accepted for an SPU registration that
is gone is closed, even if another SPU object holds the id now ("An id deleted and registered
again is a new SPU", docs/replication.md)."""

from __future__ import annotations

import asyncio
from unittest import mock

from connection_manager import health, lrs, reports, server, wire
from store import local, models
from tests import builders
from tests.builders import partition


def manager() -> tuple[server.ConnectionManager, local.Listener[models.Spu], local.Listener[models.Partition]]:
    store = local.LocalStore()
    cm = server.ConnectionManager(store, health.HealthView(0.0), lrs.LiveReplicas())
    return cm, store["spus"].listener(local.Part.SPEC), store["partitions"].listener(local.Part.ALL)


def connected(cm: server.ConnectionManager, spu_id: int, name: str, registered_at: int) -> server.Session:
    """A ready session of ``spu_id``, accepted for the registration ``(name, registered_at)``."""
    session = server.Session(spu_id, name, 1, mock.Mock(closed=False), registered_at=registered_at)
    session.ready = True
    cm.sessions[spu_id] = session
    return session


async def test_a_partition_deleted_and_created_again_within_one_push_starts_from_nothing() -> None:
    cm, spus, partitions = manager()
    store = cm.local_store
    store["spus"].apply(builders.spu(0), 1)
    store["partitions"].apply(partition("t-0", [0], resolution="Online", uid=2_000), 2)
    session = connected(cm, 0, "spu-0", 1)
    cm.push(spus.changes(), partitions.changes())
    told = session.hosted["t-0"]
    # The old partition: confirmed by its leader, offsets reported, a proposal held.
    cm.confirmed["t-0"] = (0, 0)
    cm.live.merge(0, wire.PartitionOffsets(partition="t-0", leader_epoch=0, hw=1000, leo=1000), 1.0)
    cm.proposals["t-0"] = reports.Proposal("t-0", 0, session.number, 0, 0, (0,), ())
    sent: list[wire.Message] = []
    session.send = sent.append  # type: ignore[method-assign, assignment]  # what it is told, unencoded

    store["partitions"].delete("t-0", 3)
    store["partitions"].apply(partition("t-0", [0], uid=4_000), 4)  # the same name, replicas and epochs
    cm.push(spus.changes(), partitions.changes())

    assert "t-0" not in cm.confirmed
    assert cm.live.get("t-0") is None and cm.live.max_hw("t-0") == lrs.UNKNOWN_OFFSET
    assert "t-0" not in cm.proposals
    # Told that the replica it held is gone and a new one of the name assigned, in one Update.
    assert len(sent) == 1 and isinstance(sent[0], wire.Update)
    assert sent[0].deleted_replicas == ["t-0"] and [info.partition for info in sent[0].replicas] == ["t-0"]
    # The same state but for which partition of the name it is: its uid.
    assert (told.uid, session.hosted["t-0"]) == (2_000, told.model_copy(update={"uid": 4_000}))


async def test_a_partition_deleted_and_created_again_while_the_watch_was_down_starts_from_nothing() -> None:
    """The same, learnt from a relist (the watch broke meanwhile): the listing holds the name under
    a new create revision. Before, the relist was taken for an update: the new partition kept the
    old one's confirmation, offsets and proposal, and its SPU was told nothing (the state told is
    the same), so it kept the old replica's log."""
    cm, spus, partitions = manager()
    store = cm.local_store
    store["spus"].apply(builders.spu(0), 1)
    store["partitions"].apply(partition("t-0", [0], resolution="Online"), 2)
    session = connected(cm, 0, "spu-0", 1)
    cm.push(spus.changes(), partitions.changes())
    told = session.hosted["t-0"]
    cm.confirmed["t-0"] = (0, 0)
    cm.live.merge(0, wire.PartitionOffsets(partition="t-0", leader_epoch=0, hw=1000, leo=1000), 1.0)
    cm.proposals["t-0"] = reports.Proposal("t-0", 0, session.number, 0, 0, (0,), ())
    sent: list[wire.Message] = []
    session.send = sent.append  # type: ignore[method-assign, assignment]  # what it is told, unencoded

    # Deleted at 3 and created again at 4, the same name, replicas and epochs: a relist at 5.
    store["spus"].resync([(builders.spu(0), 1, 1)], 5)
    store["partitions"].resync([(partition("t-0", [0]), 4, 4)], 5)
    cm.push(spus.changes(), partitions.changes())

    assert "t-0" not in cm.confirmed
    assert cm.live.get("t-0") is None and cm.live.max_hw("t-0") == lrs.UNKNOWN_OFFSET
    assert "t-0" not in cm.proposals
    assert len(sent) == 1 and isinstance(sent[0], wire.Update)
    assert sent[0].deleted_replicas == ["t-0"] and [info.partition for info in sent[0].replicas] == ["t-0"]
    # No uid (written by an SC older than the field): the same state, told as a new replica.
    assert session.hosted["t-0"] == told


async def test_a_session_of_an_spu_deleted_and_registered_again_within_one_push_is_closed() -> None:
    cm, spus, partitions = manager()
    store = cm.local_store
    store["spus"].apply(builders.spu(1), 1)
    store["spus"].apply(builders.spu(2), 2)
    old, other = connected(cm, 1, "spu-1", 1), connected(cm, 2, "spu-2", 2)
    cm.push(spus.changes(), partitions.changes())
    assert old.closing is None

    store["spus"].delete("spu-1", 3)
    store["spus"].apply(builders.spu(1, name="spu-1-new", host="127.0.0.2"), 4)
    cm.push(spus.changes(), partitions.changes())
    assert old.closing is not None and old.closing[0] == "unregistered"
    assert "registered again" in old.closing[1]
    assert other.closing is None

    # Under the very same name too.
    again = connected(cm, 1, "spu-1-new", 4)
    store["spus"].delete("spu-1-new", 5)
    store["spus"].apply(builders.spu(1, name="spu-1-new"), 6)
    cm.push(spus.changes(), partitions.changes())
    assert again.closing is not None and again.closing[0] == "unregistered"


async def test_a_session_stays_through_updates_of_its_registration() -> None:
    cm, spus, partitions = manager()
    store = cm.local_store
    store["spus"].apply(builders.spu(1), 1)
    session = connected(cm, 1, "spu-1", 1)
    cm.push(spus.changes(), partitions.changes())
    store["spus"].apply(builders.spu(1, rack="r2"), 2)  # an update: the same registration
    cm.push(spus.changes(), partitions.changes())
    assert session.closing is None


async def test_what_a_process_held_of_a_partition_deleted_since_says_nothing_of_a_new_one() -> None:
    """An SPU connected holding t-0's log up to 1,000, and was not told of its role at the
    partition epoch (restarted). t-0 was then deleted and created again: the SC still read the
    old log's end as what the process holds of the new partition (it may lead as 'returned', an
    unclean election ranks it first), and the restart fact held for the new one at that partition
    epoch (its leadership withheld from a process that had never heard of it). Both go with the
    partition."""
    cm, spus, partitions = manager()
    store = cm.local_store
    store["spus"].apply(builders.spu(0), 1)
    store["partitions"].apply(partition("t-0", [0], resolution="Online"), 2)
    session = connected(cm, 0, "spu-0", 1)
    session.incarnation = reports.Incarnation(0, 1, {"t-0": (1_000, None)}, {"t-0": 0})
    cm.push(spus.changes(), partitions.changes())
    assert session.incarnation.restarted_at("t-0", 0) and session.incarnation.leo("t-0") == 1_000

    store["partitions"].delete("t-0", 3)
    store["partitions"].apply(partition("t-0", [0]), 4)  # the same name, replicas and epochs
    cm.push(spus.changes(), partitions.changes())
    assert not session.incarnation.restarted_at("t-0", 0) and session.incarnation.leo("t-0") is None


def committed(uid: int | None) -> models.Partition:
    """t-0 on SPUs 0 and 1, led by 0 at leader epoch 2, both in its committed in-sync set."""
    return models.Partition.model_validate({
        "name": "t-0", "uid": uid, "spec": {"leader": 0, "replicas": [0, 1]},
        "status": {"resolution": "Online", "leaderEpoch": 2, "partitionEpoch": 3, "isr": [0, 1]},
    })  # fmt: skip


def told_on_two_spus() -> tuple[
    server.ConnectionManager, local.Listener[models.Spu], local.Listener[models.Partition], list[server.Session], list[set[str]]
]:
    """``committed(uid=2_000)`` told to the connected SPUs 0 and 1, whose processes hold its log:
    the manager, its listeners, the two sessions, and the news the manager gives (none yet)."""
    cm, spus, partitions = manager()
    news: list[set[str]] = []
    cm.on_news = news.append
    store = cm.local_store
    for spu_id in (0, 1):
        store["spus"].apply(builders.spu(spu_id), 1 + spu_id)
    store["partitions"].apply(committed(uid=2_000), 3)
    sessions = [connected(cm, spu_id, f"spu-{spu_id}", 1 + spu_id) for spu_id in (0, 1)]
    for session in sessions:
        session.incarnation = reports.Incarnation(session.spu_id, 1, {"t-0": (1_000, 2)})
    cm.push(spus.changes(), partitions.changes())
    return cm, spus, partitions, sessions, news


async def test_a_partition_back_with_its_committed_state_counts_on_no_log_its_spus_dropped() -> None:
    """t-0 is deleted and written back as it was (its committed state: Online, both SPUs in its
    in-sync set), or its uid is written over in place: either way its SPUs are told to drop the
    log they held of it (told it is gone, and a new one of the name assigned). Before, the SC
    merely forgot what their processes held of it: its leader was still taken for a member holding
    every committed record, told it leads at the same epoch, and the partition controller kept it
    and its in-sync set though no replica held a record any more. Now each SPU the committed state
    counts on is taken for a process that restarted without them (its leadership withheld, the
    partition decided again), and the SC says why; also when it learns of it by relisting, and
    when the uid was removed first (told none, the SPUs keep the log of the uid they hold)."""
    rewrites = ("deleted and written back", "uid written over", "uid written over, relisted", "uid removed, then another")
    for rewrite in rewrites:
        cm, spus, partitions, sessions, news = told_on_two_spus()
        store = cm.local_store
        assert sessions[0].hosted["t-0"].leader == 0 and not news
        if rewrite == "uid removed, then another":
            store["partitions"].apply(committed(uid=None), 4)
            cm.push(spus.changes(), partitions.changes())
            # Told none, each SPU keeps its log (of uid 2000): nothing is lost yet.
            assert sessions[0].hosted["t-0"].uid is None and not news, rewrite
            assert not sessions[0].incarnation.restarted_at("t-0", 3), rewrite
        sent: list[wire.Message] = []
        sessions[0].send = sent.append  # type: ignore[method-assign, assignment]  # what it is told, unencoded

        if rewrite == "deleted and written back":
            store["partitions"].delete("t-0", 4)
            store["partitions"].apply(committed(uid=2_000), 5)
        elif rewrite == "uid written over":
            store["partitions"].apply(committed(uid=4_000), 4)
        elif rewrite == "uid removed, then another":
            store["partitions"].apply(committed(uid=4_000), 5)
        else:
            store["partitions"].resync([(committed(uid=4_000), 4, 3)], revision=4)  # the key created at 3 still
        with mock.patch.object(server.log, "error") as logged:
            cm.push(spus.changes(), partitions.changes())

        assert len(sent) == 1 and isinstance(sent[0], wire.Update), rewrite
        assert sent[0].deleted_replicas == ["t-0"] and [info.leader for info in sent[0].replicas] == [None], rewrite
        for session in sessions:
            assert session.incarnation.restarted_at("t-0", 3) and session.incarnation.leo("t-0") is None, rewrite
        assert news == [{"t-0"}], rewrite
        (message,), fields = logged.call_args
        assert "SPUs [0, 1]" in message and fields == {"partition": "t-0"}, message
        assert ("from 2000 to 4000" in message) is rewrite.startswith("uid "), message


async def test_a_uid_written_over_while_the_pusher_restarts_counts_on_no_log_its_spus_dropped() -> None:
    """The pusher (restarted by its supervisor after a crash) starts with a Sync to every SPU,
    from the store as it is then: a uid written over meanwhile reaches the SPUs there, and they
    drop their log of the partition. Before, the Sync replaced what they had been told without a
    look, so the committed state still counted on those logs (leader kept, in-sync set kept). The
    same for a uid removed meanwhile (told none, the SPUs keep their log) and another given later."""
    for rewrite in ("written over", "removed, then another"):
        cm, spus, partitions, sessions, news = told_on_two_spus()
        store = cm.local_store
        sent: list[wire.Message] = []
        sessions[0].send = sent.append  # type: ignore[method-assign, assignment]  # what it is told, unencoded

        # While no pusher runs: the uid written over, or removed.
        store["partitions"].apply(committed(uid=4_000 if rewrite == "written over" else None), 4)
        with mock.patch.object(server.log, "error") as logged:
            pusher = asyncio.ensure_future(cm._push_changes())
            await asyncio.sleep(0)
            if rewrite == "removed, then another":
                assert isinstance(sent[0], wire.Sync) and [info.uid for info in sent[0].replicas] == [None], rewrite
                assert not news, rewrite  # told none, the SPUs keep their logs
                store["partitions"].apply(committed(uid=4_000), 5)
                await asyncio.sleep(cm.push_linger + 0.05)
            pusher.cancel()
            await asyncio.gather(pusher, return_exceptions=True)

        assert isinstance(sent[-1], wire.Sync | wire.Update), rewrite
        assert [(info.uid, info.leader) for info in sent[-1].replicas] == [(4_000, None)], rewrite
        for session in sessions:
            assert session.incarnation.restarted_at("t-0", 3), (rewrite, session.spu_id)
        assert news == [{"t-0"}], rewrite
        (message,), _ = logged.call_args
        assert "from 2000 to 4000" in message and "SPUs [0, 1]" in message, message


async def test_a_uid_removed_is_the_same_partition_to_its_spus_whether_seen_live_or_relisted() -> None:
    """A uid removed by hand leaves a partition the SC cannot tell from the one its SPUs hold:
    told none, they keep their log (docs/replication.md), so the committed state still holds.
    Seen by a relist, it was taken for a partition deleted and created again before: the SPUs
    were told to drop the log they held of it, for nothing, and the partition lost its leader."""
    for seen in ("live", "relisted"):
        cm, spus, partitions = manager()
        news: list[set[str]] = []
        cm.on_news = news.append
        store = cm.local_store
        store["spus"].apply(builders.spu(0), 1)
        store["spus"].apply(builders.spu(1), 2)
        store["partitions"].apply(committed(uid=2_000), 3)
        session = connected(cm, 0, "spu-0", 1)
        cm.push(spus.changes(), partitions.changes())
        sent: list[wire.Message] = []
        session.send = sent.append  # type: ignore[method-assign, assignment]  # what it is told, unencoded

        if seen == "live":
            store["partitions"].apply(committed(uid=None), 4)
        else:
            store["partitions"].resync([(committed(uid=None), 4, 3)], revision=4)  # the key created at 3 still
        cm.push(spus.changes(), partitions.changes())

        assert len(sent) == 1 and isinstance(sent[0], wire.Update), seen
        assert sent[0].deleted_replicas == [], seen
        assert [(info.uid, info.leader) for info in sent[0].replicas] == [(None, 0)], seen
        assert not session.incarnation.restarted_at("t-0", 3) and not news, seen
        assert session.kept_uids == {"t-0": 2_000}, seen
        # Taken away from the SPU, the partition is forgotten there: its kept uid too.
        moved = committed(uid=None).model_copy(update={"spec": models.PartitionSpec(leader=1, replicas=[1])})
        store["partitions"].apply(moved, 5)
        cm.push(spus.changes(), partitions.changes())
        assert isinstance(sent[-1], wire.Update) and sent[-1].deleted_replicas == ["t-0"], seen
        assert session.kept_uids == {}, seen
