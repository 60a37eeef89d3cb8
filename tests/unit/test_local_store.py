"""Local store: exact epochs, idempotent apply, deletes, resync fences, listener wake-ups."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from store import local, models
from tests.builders import partition, topic


def epochs(table: local.KindStore) -> dict[str, tuple[int, int]]:
    return {entry.name: (entry.spec_epoch, entry.status_epoch) for entry in table}


def test_exact_epochs_after_apply_apply_again_delete_and_resync() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    assert table.apply(topic("a"), 10) == local.Part.ALL
    assert (table.epoch, epochs(table)) == (1, {"a": (1, 1)})

    assert table.apply(topic("a"), 10) is None  # same object again: nothing changes
    assert (table.epoch, epochs(table)) == (1, {"a": (1, 1)})

    assert table.apply(topic("a", resolution="Pending"), 11) == local.Part.STATUS
    assert (table.epoch, epochs(table)) == (2, {"a": (1, 2)})

    assert table.apply(topic("a", partitions=2, resolution="Pending"), 12) == local.Part.SPEC
    assert (table.epoch, epochs(table)) == (3, {"a": (3, 2)})

    table.apply(topic("b"), 13)
    assert table.delete("a", 14) is True
    assert table.delete("a", 14) is False  # deleting twice is a no-op
    assert (table.epoch, epochs(table)) == (5, {"b": (4, 4)})

    table.resync([(topic("b"), 13, 13), (topic("c"), 15, 15)], revision=15)
    assert (table.epoch, table.fence, epochs(table)) == (6, 6, {"b": (4, 4), "c": (6, 6)})
    assert table.revision == 15 and table.synced


def test_same_content_with_a_new_revision_keeps_epochs_but_records_the_revision() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 10)
    assert table.apply(topic("a"), 17) is None
    entry = table.get("a")
    assert entry is not None and (entry.mod_revision, entry.spec_epoch, entry.status_epoch) == (17, 1, 1)


def test_a_partition_whose_uid_alone_was_written_over_is_changed_for_its_listeners() -> None:
    """The SC never changes a uid: one written over in place (a hand edit, with the same spec and
    status) makes the partition another one to its SPUs. Before, the mirror took it for the same
    value written again and woke nobody: the SPUs heard of the new uid at the partition's next
    change, whatever that was, and dropped their logs then, with nothing to show why."""
    table: local.KindStore[models.Partition] = local.KindStore("partitions")
    table.apply(partition("t-0", [0, 1], resolution="Online", uid=5), 10)
    spec_listener = table.listener(local.Part.SPEC)
    spec_listener.changes()
    for uid in (6, None, 7):
        assert table.apply(partition("t-0", [0, 1], resolution="Online", uid=uid), 11) == local.Part.SPEC
        assert [entry.obj.uid for entry in spec_listener.changes().updated] == [uid]
    entry = table.get("t-0")
    assert entry is not None and entry.create_revision == 10  # the same key: not created again


def test_apply_of_the_wrong_kind_is_refused() -> None:
    table: local.KindStore[Any] = local.KindStore("spus")  # any object: the wrong kind is what is tried
    with pytest.raises(ValueError, match="cannot apply a topics object to the spus store"):
        table.apply(topic("a"), 1)


def test_listener_gets_full_set_first_then_deltas() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 1)
    table.apply(topic("b"), 2)
    listener = table.listener()
    first = listener.changes()
    assert (first.full, [entry.name for entry in first.updated], first.deleted) == (True, ["a", "b"], [])
    assert listener.changes().empty

    table.apply(topic("a", resolution="Pending"), 3)
    table.delete("b", 4)
    table.apply(topic("c"), 5)
    delta = listener.changes()
    assert (delta.full, [entry.name for entry in delta.updated], delta.deleted) == (False, ["a", "c"], ["b"])
    assert listener.changes().empty


def test_spec_only_and_status_only_listeners() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 1)
    spec_listener = table.listener(local.Part.SPEC)
    status_listener = table.listener(local.Part.STATUS)
    spec_listener.changes()
    status_listener.changes()

    table.apply(topic("a", resolution="Pending"), 2)  # status only
    assert not spec_listener.has_changes()
    assert [entry.name for entry in status_listener.changes().updated] == ["a"]

    table.apply(topic("a", partitions=3, resolution="Pending"), 3)  # spec only
    assert [entry.name for entry in spec_listener.changes().updated] == ["a"]
    assert status_listener.changes().empty


def test_resync_fences_listeners_that_then_get_the_full_set() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 1)
    listener = table.listener()
    listener.changes()
    table.resync([(topic("a"), 1, 1), (topic("z"), 7, 7)], revision=7)
    after = listener.changes()
    assert (after.full, [entry.name for entry in after.updated]) == (True, ["a", "z"])
    assert listener.changes().empty


def test_a_listener_older_than_forgotten_tombstones_gets_the_full_set() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics", tombstone_limit=2)
    for name in "abcd":
        table.apply(topic(name), 1)
    listener = table.listener()
    listener.changes()
    for name in "abc":
        table.delete(name, 2)
    changes = listener.changes()
    assert (changes.full, [entry.name for entry in changes.updated]) == (True, ["d"])


async def test_listener_wakes_on_a_change_and_not_on_a_repeat() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    listener = table.listener(local.Part.SPEC)
    listener.changes()
    waiter = asyncio.ensure_future(listener.wait())
    await asyncio.sleep(0)
    assert not waiter.done()

    table.apply(topic("a"), 1)
    await asyncio.wait_for(waiter, 1)
    listener.changes()

    waiter = asyncio.ensure_future(listener.wait())
    table.apply(topic("a"), 1)  # no change
    table.apply(topic("a", resolution="Pending"), 2)  # status change: a spec listener sleeps on
    await asyncio.sleep(0.01)
    assert not waiter.done()
    table.delete("a", 3)
    await asyncio.wait_for(waiter, 1)
    assert listener.changes().deleted == ["a"]
    listener.close()


def test_snapshot_reads_every_kind() -> None:
    store = local.LocalStore()
    store["topics"].apply(topic("a"), 1)
    snapshot = store.snapshot()
    assert snapshot.get("topics", "a") == topic("a")
    assert snapshot.get("spus", "a") is None
    assert [obj.name for obj in snapshot.objects("topics")] == ["a"]
    assert snapshot.epochs == {"spus": 0, "spu-groups": 0, "topics": 1, "partitions": 0}
    assert not store.synced
    for table in store.tables.values():
        table.resync([], revision=1)
    assert not store.synced  # the meta keys are not listed yet
    store.meta.resync([], revision=1)
    assert store.synced
    with pytest.raises(ValueError, match="unknown kind 'widgets'"):
        store["widgets"]


def test_a_skipping_listener_sees_only_what_changed_after_the_skip() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    listener = table.listener()
    table.apply(topic("a"), 1)
    listener.skip()
    assert listener.changes().empty
    table.apply(topic("b"), 2)
    assert [entry.name for entry in listener.changes().updated] == ["b"]


def test_echoes_give_back_only_the_exact_bytes_written_once() -> None:
    echoes = local.Echoes(limit=2)
    written = topic("a")
    echoes.expect("topics/a", b"value-a", written)
    assert echoes.take("topics/a", b"other bytes") is None  # somebody else's write: decoded
    assert echoes.take("topics/a", b"value-a") is None  # a miss consumed the entry
    echoes.expect("topics/a", b"value-a", written)
    assert echoes.take("topics/a", b"value-a") is written
    assert echoes.take("topics/a", b"value-a") is None
    for name in ("a", "b", "c"):
        echoes.expect(f"topics/{name}", b"v", topic(name))
    assert len(echoes) == 2 and echoes.take("topics/a", b"v") is None  # the oldest was dropped
    echoes.forget("topics/b")
    assert echoes.take("topics/b", b"v") is None and echoes.take("topics/c", b"v") is not None


def test_an_index_follows_every_write_in_the_order_of_last_change() -> None:
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a", resolution="Pending"), 1)
    table.apply(topic("b"), 2)
    table.apply(topic("c", resolution="Pending"), 3)
    pending = lambda obj: obj.status.resolution is models.TopicResolution.PENDING  # noqa: E731
    assert list(table.index("pending", pending)) == ["a", "c"]  # built on first use
    table.apply(topic("b", resolution="Pending"), 4)  # joins
    table.apply(topic("a", resolution="Pending"), 5)  # same content: no move
    assert list(table.index("pending", pending)) == ["a", "c", "b"]
    table.apply(topic("a", resolution="Provisioned"), 6)  # leaves
    table.apply(topic("c", partitions=2, resolution="Pending"), 7)  # changed, still in: moves last
    assert list(table.index("pending", pending)) == ["b", "c"]
    table.delete("b", 8)
    assert list(table.index("pending", pending)) == ["c"]
    # A resync rebuilds it from the listing, oldest change first.
    table.resync([(topic("z", resolution="Pending"), 9, 9), (topic("c", resolution="Pending"), 10, 3), (topic("a"), 2, 1)], 10)
    assert list(table.index("pending", pending)) == ["z", "c"]
    snapshot = local.Snapshot({"topics": table})
    assert [entry.name for entry in snapshot.indexed("topics", "pending", pending)] == ["z", "c"]


def test_the_meta_table_wakes_whoever_acts_on_a_key_when_it_changes() -> None:
    woken: list[str] = []
    meta = local.MetaTable()
    stop = meta.on_change("meta/rebalance", lambda: woken.append("rebalance"))
    meta.resync([("meta/other", b"1", 3)], 3)
    assert woken == ["rebalance"]  # a relist may have changed it: look again
    meta.apply("meta/other", b"2", 4)
    assert woken == ["rebalance"]
    meta.apply("meta/rebalance", b"{}", 5)
    meta.delete("meta/rebalance", 6)
    assert woken == ["rebalance", "rebalance", "rebalance"]
    stop()
    stop()  # twice is once
    meta.apply("meta/rebalance", b"{}", 7)
    assert woken == ["rebalance", "rebalance", "rebalance"]


def test_a_name_is_unreadable_until_a_readable_version_or_its_deletion_comes() -> None:
    """The Reader marks the names whose stored value it cannot decode: a relist lists them, a
    malformed write of a name not mirrored adds it (one of a mirrored name keeps the version
    mirrored), and a readable write or a delete ends it."""
    table = local.LocalStore()["topics"]
    table.resync([], 5, unreadable=["a", "b"])
    assert set(table.unreadable) == {"a", "b"}
    table.apply(topic("a"), 6)
    table.delete("b", 7)
    assert set(table.unreadable) == set()
    table.mark_unreadable("c", 8)
    table.mark_unreadable("a", 9)  # mirrored: its readable version stays, as the Reader keeps it
    assert set(table.unreadable) == {"c"} and table.get("a") is not None and table.revision == 9
    table.resync([(topic("a"), 6, 6)], 10)
    assert set(table.unreadable) == set()


def test_a_name_deleted_and_created_again_between_two_reads_is_both_deleted_and_updated() -> None:
    """A listener that did not read the delete must still see it: the object created again under
    the name is a new one (its partition's confirmation, offsets and SPU sessions are not the old
    one's), not an update of the old one. Before, the re-creation dropped the tombstone."""
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 1)
    behind, caught_up = table.listener(), table.listener()
    behind.changes()
    caught_up.changes()
    table.delete("a", 2)
    assert caught_up.changes().deleted == ["a"]
    table.apply(topic("a"), 3)  # the very same content, created again
    changes = behind.changes()
    assert (changes.deleted, [entry.name for entry in changes.updated]) == (["a"], ["a"])
    entry = table.get("a")
    assert entry is not None and entry.create_revision == 3
    # One that saw the delete sees a plain create.
    after = caught_up.changes()
    assert (after.deleted, [entry.name for entry in after.updated]) == ([], ["a"])
    # An update since is an update.
    table.apply(topic("a", resolution="Pending"), 4)
    assert (behind.changes().deleted, caught_up.changes().deleted) == ([], [])


def test_a_name_deleted_and_created_again_while_the_watch_was_down_is_both_deleted_and_updated() -> None:
    """A relist finds the name under a new create revision: the object there is a new one, as
    when the watch brings the delete and the create. A listener behind the fence gets the full set
    and the name as deleted too (what else is gone the full set says by leaving it out). Before,
    the relist took the new object for an update of the old one."""
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 1)
    table.apply(topic("b"), 2)
    table.apply(topic("c"), 3)
    listener = table.listener()
    listener.changes()
    # "a" deleted and created again (the very same content), "b" untouched, "c" deleted.
    table.resync([(topic("a"), 7, 7), (topic("b"), 2, 2)], revision=7)
    changes = listener.changes()
    # The new "a" is the last change.
    assert (changes.full, [entry.name for entry in changes.updated], changes.deleted) == (True, ["b", "a"], ["a"])
    entry = table.get("a")
    assert entry is not None and entry.create_revision == 7
    assert listener.changes().empty
    # Another relist that finds the same objects: nothing was deleted.
    table.resync([(topic("a"), 7, 7), (topic("b"), 2, 2)], revision=8)
    assert listener.changes().deleted == []
    # A listener that never read knew no old object: nothing deleted for it.
    assert table.listener().changes().deleted == []


def test_a_delete_the_watch_brought_is_still_seen_through_a_relist_that_follows() -> None:
    """A listener that had not read a delete and the re-creation after it when the watch broke:
    the relist's full set still tells it the name was deleted (before, the relist dropped every
    tombstone). One that had read the delete is not told again."""
    table: local.KindStore[models.Topic] = local.KindStore("topics")
    table.apply(topic("a"), 1)
    behind, caught_up = table.listener(), table.listener()
    behind.changes()
    caught_up.changes()
    table.delete("a", 2)
    assert caught_up.changes().deleted == ["a"]
    table.apply(topic("a"), 3)
    table.resync([(topic("a"), 3, 3)], revision=5)
    assert (behind.changes().deleted, caught_up.changes().deleted) == (["a"], [])
