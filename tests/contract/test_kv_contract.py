"""The KV contract, run against the memory backend AND a real etcd, each bare and through the
active-SC guard (which turns every write into a transaction fenced on the SC's claim: the contract
must not change for its callers).

Revisions are compared relative to each other: on etcd the tests share one server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from store import active_sc, kv
from tests import builders

PUT, DELETE = kv.EventType.PUT, kv.EventType.DELETE


async def guarded(backend: kv.KVStore) -> AsyncIterator[kv.KVStore]:
    active = active_sc.ActiveSc(backend, ttl=10)
    await active.acquire("contract-test:0")
    try:
        yield active_sc.GuardedStore(backend, active)
    finally:
        await active.release()


@pytest.fixture
async def guarded_memory_store(memory_store: kv.KVStore) -> AsyncIterator[kv.KVStore]:
    async for store in guarded(memory_store):
        yield store


@pytest.fixture
async def guarded_etcd_store(etcd_store: kv.KVStore) -> AsyncIterator[kv.KVStore]:
    async for store in guarded(etcd_store):
        yield store


@pytest.fixture(
    params=[
        "memory_store",
        pytest.param("etcd_store", marks=pytest.mark.etcd),
        "guarded_memory_store",
        pytest.param("guarded_etcd_store", marks=pytest.mark.etcd),
    ]
)
def kv_store(request: pytest.FixtureRequest) -> kv.KVStore:
    store: kv.KVStore = request.getfixturevalue(request.param)
    return store


async def take(events: AsyncIterator[kv.WatchEvent], count: int, timeout: float = 10.0) -> list[kv.WatchEvent]:
    taken: list[kv.WatchEvent] = []
    if count == 0:
        return taken
    async with asyncio.timeout(timeout):
        async for event in events:
            taken.append(event)
            if len(taken) == count:
                break
    return taken


def summary(events: list[kv.WatchEvent]) -> list[tuple[str, str, bytes | None]]:
    return [(event.type.value, event.key, event.value) for event in events]


async def test_get_absent_key_is_none(kv_store: kv.KVStore) -> None:
    assert await kv_store.get("topics/absent") is None


async def test_create_then_get(kv_store: kv.KVStore) -> None:
    revision = await kv_store.create("topics/a", b"one")
    assert await kv_store.get("topics/a") == kv.KeyValue("topics/a", b"one", revision, revision)
    assert await kv_store.revision() == revision


async def test_create_fails_if_the_key_exists(kv_store: kv.KVStore) -> None:
    revision = await kv_store.create("topics/a", b"one")
    with pytest.raises(kv.AlreadyExists) as raised:
        await kv_store.create("topics/a", b"two")
    assert (raised.value.key, raised.value.mod_revision) == ("topics/a", revision)
    assert "topics/a" in str(raised.value)
    assert (await builders.present(kv_store, "topics/a")).value == b"one"


async def test_concurrent_creates_each_succeed_or_fail_on_their_own(kv_store: kv.KVStore) -> None:
    """A burst of creates (etcd sends them together, through the active-SC guard too): an existing
    key and a key created twice in the burst fail only their own create (one of the two); every
    other create is applied once."""
    existing = await kv_store.create("topics/t-3", b"before")
    names = [f"topics/t-{index}" for index in range(150)] + ["topics/t-7", "topics/t-140"]
    results = await asyncio.gather(
        *(kv_store.create(name, f"{name}#{position}".encode()) for position, name in enumerate(names)),
        return_exceptions=True,
    )
    failed = {names[position]: result for position, result in enumerate(results) if isinstance(result, BaseException)}
    assert sorted(failed) == ["topics/t-140", "topics/t-3", "topics/t-7"]
    assert all(isinstance(error, kv.AlreadyExists) for error in failed.values())
    assert failed["topics/t-3"].mod_revision == existing  # type: ignore[attr-defined]  # an AlreadyExists (checked above): it has the key's revision
    listed = {item.key: item for item in (await kv_store.list("topics/")).items}
    assert len(listed) == 150
    assert listed["topics/t-3"].value == b"before"
    for position, name in enumerate(names):
        if name != "topics/t-3" and not isinstance(results[position], BaseException):
            item = listed[name]
            assert (item.value, item.mod_revision) == (f"{name}#{position}".encode(), results[position])


async def test_update_is_compare_and_swap_on_the_mod_revision(kv_store: kv.KVStore) -> None:
    first = await kv_store.create("topics/a", b"one")
    second = await kv_store.update("topics/a", b"two", first)
    assert second > first
    with pytest.raises(kv.Conflict) as raised:
        await kv_store.update("topics/a", b"stale", first)
    assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/a", first, second)
    assert await kv_store.get("topics/a") == kv.KeyValue("topics/a", b"two", second, first)


async def test_update_of_an_absent_key_is_not_found(kv_store: kv.KVStore) -> None:
    with pytest.raises(kv.NotFound) as raised:
        await kv_store.update("topics/absent", b"x", 5)
    assert raised.value.key == "topics/absent"
    assert await kv_store.get("topics/absent") is None


async def test_delete_with_and_without_revision(kv_store: kv.KVStore) -> None:
    first = await kv_store.create("topics/a", b"one")
    second = await kv_store.update("topics/a", b"two", first)
    with pytest.raises(kv.Conflict):
        await kv_store.delete("topics/a", first)
    assert (await builders.present(kv_store, "topics/a")).value == b"two"
    deleted_at = await kv_store.delete("topics/a", second)
    assert deleted_at > second
    assert await kv_store.get("topics/a") is None
    with pytest.raises(kv.NotFound):
        await kv_store.delete("topics/a")
    await kv_store.create("topics/b", b"x")
    await kv_store.delete("topics/b")
    assert await kv_store.get("topics/b") is None


async def test_a_key_deleted_and_created_again_lists_and_watches_under_its_new_create_revision(kv_store: kv.KVStore) -> None:
    """How the SC tells a new object from an update of the old one of the same name, whether the
    watch brings it or a relist finds it (store/local.py): both backends must give the new key's
    creation, also when its value is the very same."""
    first = await kv_store.create("topics/a", b"same")
    await kv_store.update("topics/a", b"same", first)
    updated = await builders.present(kv_store, "topics/a")
    assert updated.create_revision == first
    deleted_at = await kv_store.delete("topics/a")
    again = await kv_store.create("topics/a", b"same")
    [listed] = (await kv_store.list("topics/")).items
    assert (listed.create_revision, listed.mod_revision) == (again, again)
    async with contextlib.aclosing(kv_store.watch("topics/", deleted_at)) as watch:
        events = await take(watch, 2)
    assert [(event.type, event.revision, event.create_revision) for event in events] == [
        (DELETE, deleted_at, 0),
        (PUT, again, again),
    ]


async def test_list_by_prefix_is_sorted_and_bounded(kv_store: kv.KVStore) -> None:
    for key in ["topics/b", "topics/a", "topicsx/c", "spus/z", "topics/c"]:
        await kv_store.create(key, key.encode())
    listed = await kv_store.list("topics/")
    assert [item.key for item in listed.items] == ["topics/a", "topics/b", "topics/c"]
    assert [item.value for item in listed.items] == [b"topics/a", b"topics/b", b"topics/c"]
    assert listed.revision == await kv_store.revision()
    assert (await kv_store.list("partitions/")).items == []


async def test_transaction_applies_everything_at_one_revision(kv_store: kv.KVStore) -> None:
    existing = await kv_store.create("topics/t", b"v1")
    await kv_store.create("partitions/old", b"gone soon")
    revision = await kv_store.txn(
        [kv.Compare("topics/t", existing), kv.Compare("partitions/t-0", 0)],
        [
            kv.Put("topics/t", b"v2"),
            kv.Put("partitions/t-0", b"p0"),
            kv.Put("partitions/t-1", b"p1"),
            kv.Delete("partitions/old"),
        ],
    )
    assert (await kv_store.get("topics/t")) == kv.KeyValue("topics/t", b"v2", revision, existing)
    assert (await kv_store.get("partitions/t-0")) == kv.KeyValue("partitions/t-0", b"p0", revision, revision)
    assert (await builders.present(kv_store, "partitions/t-1")).mod_revision == revision
    assert await kv_store.get("partitions/old") is None
    assert await kv_store.revision() == revision


async def test_transaction_is_all_or_nothing(kv_store: kv.KVStore) -> None:
    existing = await kv_store.create("topics/t", b"v1")
    moved = await kv_store.update("topics/t", b"v2", existing)
    before = await kv_store.revision()
    with pytest.raises(kv.Conflict) as raised:
        await kv_store.txn(
            [kv.Compare("partitions/t-0", 0), kv.Compare("topics/t", existing)],
            [kv.Put("topics/t", b"v3"), kv.Put("partitions/t-0", b"p0")],
        )
    assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/t", existing, moved)
    assert await kv_store.revision() == before
    assert await kv_store.get("partitions/t-0") is None
    assert (await builders.present(kv_store, "topics/t")).value == b"v2"


async def test_a_conflict_names_every_compare_that_failed(kv_store: kv.KVStore) -> None:
    """A transaction whose compares fail on several keys names each of them, in compare order (the
    first is also the Conflict's own key): a caller that batched many writes sends every stale one
    back at once, instead of one per round."""
    revisions = [await kv_store.create(f"topics/f{index}", b"v") for index in range(6)]
    moved = {index: await kv_store.update(f"topics/f{index}", b"v2", revisions[index]) for index in (1, 4)}
    compares = [kv.Compare(f"topics/f{index}", revision) for index, revision in enumerate(revisions)]
    compares.append(kv.Compare("topics/f-new", 0))
    compares.append(kv.Compare("topics/f5-absent", 9))
    for operations in ([kv.Put("topics/f-new", b"x")], []):
        with pytest.raises(kv.Conflict) as raised:
            await kv_store.txn(compares, operations)
        assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/f1", revisions[1], moved[1])
        assert raised.value.failed == (
            ("topics/f1", revisions[1], moved[1]),
            ("topics/f4", revisions[4], moved[4]),
            ("topics/f5-absent", 9, 0),
        )
        assert raised.value.keys == {"topics/f1", "topics/f4", "topics/f5-absent"}
    assert await kv_store.get("topics/f-new") is None


async def test_a_guarded_create_applies_only_while_its_guards_hold(kv_store: kv.KVStore) -> None:
    """``create(..., guards=...)``: the create and compares on other keys, in one step (the
    active-SC guard sends its creates this way, with its fence). A guard that fails is the Conflict,
    whether the key exists or not; the key existing under guards that hold is AlreadyExists."""
    marker = await kv_store.create("meta/marker", b"m")
    first = await kv_store.create("topics/g", b"first", guards=[kv.Compare("meta/marker", marker)])
    assert (await builders.present(kv_store, "topics/g")).value == b"first"
    with pytest.raises(kv.AlreadyExists) as exists:
        await kv_store.create("topics/g", b"second", guards=[kv.Compare("meta/marker", marker)])
    assert (exists.value.key, exists.value.mod_revision) == ("topics/g", first)
    moved = await kv_store.update("meta/marker", b"m2", marker)
    before = await kv_store.revision()
    for key in ("topics/h", "topics/g"):
        with pytest.raises(kv.Conflict) as raised:
            await kv_store.create(key, b"after", guards=[kv.Compare("meta/marker", marker)])
        assert (raised.value.key, raised.value.expected, raised.value.actual) == ("meta/marker", marker, moved)
    with pytest.raises(kv.Conflict) as absent:
        await kv_store.create("topics/h", b"after", guards=[kv.Compare("meta/gone", 7)])
    assert (absent.value.key, absent.value.actual) == ("meta/gone", 0)
    assert await kv_store.revision() == before
    assert await kv_store.get("topics/h") is None


async def test_a_transaction_of_only_compares_checks_them_at_one_revision_and_writes_nothing(kv_store: kv.KVStore) -> None:
    """A transaction with no operations is a check: the current revision if every compare holds,
    else the Conflict of the first that does not. On etcd it is sent as Ranges at one revision,
    never as a read-only transaction (see tests/fixtures/etcd.no_read_only_txns); many keys too."""
    revisions = [await kv_store.create(f"topics/c{index}", b"v") for index in range(kv.MAX_TXN_OPS - 1)]
    compares = [*(kv.Compare(f"topics/c{index}", revision) for index, revision in enumerate(revisions)), kv.Compare("topics/none", 0)]
    now = await kv_store.revision()
    assert await kv_store.txn(compares, []) == now
    assert await kv_store.txn([], []) == now
    moved = await kv_store.update("topics/c5", b"v2", revisions[5])
    with pytest.raises(kv.Conflict) as raised:
        await kv_store.txn(compares, [])
    assert (raised.value.key, raised.value.expected, raised.value.actual) == ("topics/c5", revisions[5], moved)
    with pytest.raises(kv.Conflict) as absent:
        await kv_store.txn([kv.Compare("topics/c0", revisions[0]), kv.Compare("topics/c1", 0)], [])
    assert (absent.value.key, absent.value.expected, absent.value.actual) == ("topics/c1", 0, revisions[1])
    assert await kv_store.revision() == moved


async def test_transaction_create_if_absent_guard(kv_store: kv.KVStore) -> None:
    await kv_store.txn([kv.Compare("topics/n", 0)], [kv.Put("topics/n", b"first")])
    with pytest.raises(kv.Conflict) as raised:
        await kv_store.txn([kv.Compare("topics/n", 0)], [kv.Put("topics/n", b"second")])
    assert raised.value.expected == 0 and raised.value.actual > 0
    assert (await builders.present(kv_store, "topics/n")).value == b"first"


async def test_watch_delivers_every_event_in_revision_order_from_a_past_revision(kv_store: kv.KVStore) -> None:
    start = await kv_store.create("topics/a", b"1")
    second = await kv_store.update("topics/a", b"2", start)
    await kv_store.create("spus/ignored", b"not under the prefix")
    multi = await kv_store.txn([], [kv.Put("topics/b", b"b1"), kv.Put("topics/c", b"c1")])
    deleted = await kv_store.delete("topics/a")
    async with contextlib.aclosing(kv_store.watch("topics/", start)) as events:
        past = await take(events, 5)
        assert summary(past) == [
            ("PUT", "topics/a", b"1"),
            ("PUT", "topics/a", b"2"),
            ("PUT", "topics/b", b"b1"),
            ("PUT", "topics/c", b"c1"),
            ("DELETE", "topics/a", None),
        ]
        assert [event.revision for event in past] == [start, second, multi, multi, deleted]
        # Then live events, still in order.
        live_writes = [await kv_store.create(f"topics/live-{index}", b"x") for index in range(20)]
        live = await take(events, 20)
        assert [event.revision for event in live] == live_writes
        assert [event.key for event in live] == [f"topics/live-{index}" for index in range(20)]


async def test_watch_from_the_middle_of_history(kv_store: kv.KVStore) -> None:
    revisions = [await kv_store.create(f"topics/k{index}", b"x") for index in range(6)]
    async with contextlib.aclosing(kv_store.watch("topics/", revisions[3])) as events:
        assert [event.key for event in await take(events, 3)] == ["topics/k3", "topics/k4", "topics/k5"]


async def test_watch_of_compacted_history_raises_compacted(kv_store: kv.KVStore) -> None:
    first = await kv_store.create("topics/a", b"1")
    await kv_store.update("topics/a", b"2", first)
    kept = await kv_store.create("topics/b", b"x")
    await kv_store.compact(kept)
    with pytest.raises(kv.Compacted) as raised:
        async with contextlib.aclosing(kv_store.watch("topics/", first)) as events:
            await take(events, 1)
    assert raised.value.requested == first
    assert raised.value.revision == kept
    # The compaction revision itself is still available.
    async with contextlib.aclosing(kv_store.watch("topics/", kept)) as events:
        assert summary(await take(events, 1)) == [("PUT", "topics/b", b"x")]
    await kv_store.compact(first)  # compacting an older revision again is harmless


async def test_concurrent_writers_never_lose_an_update(kv_store: kv.KVStore) -> None:
    await kv_store.create("counter/value", b"0")

    async def increment(times: int) -> int:
        conflicts = 0
        for _ in range(times):
            while True:
                current = await kv_store.get("counter/value")
                assert current is not None
                try:
                    await kv_store.update("counter/value", str(int(current.value) + 1).encode(), current.mod_revision)
                    break
                except kv.Conflict:
                    conflicts += 1
        return conflicts

    await asyncio.gather(*(increment(15) for _ in range(8)))
    final = await kv_store.get("counter/value")
    assert final is not None and final.value == b"120"


async def test_many_watchers_see_the_same_sequence(kv_store: kv.KVStore) -> None:
    start = await kv_store.revision() + 1
    watchers = [kv_store.watch("topics/", start) for _ in range(3)]
    try:
        readers = [asyncio.ensure_future(take(watcher, 10)) for watcher in watchers]
        for index in range(10):
            await kv_store.create(f"topics/w{index}", str(index).encode())
        results = await asyncio.gather(*readers)
        expected = [f"topics/w{index}" for index in range(10)]
        assert [[event.key for event in result] for result in results] == [expected] * 3
    finally:
        for watcher in watchers:
            await watcher.aclose()


async def test_transaction_limit_is_enforced(kv_store: kv.KVStore) -> None:
    operations = [kv.Put(f"topics/t{index}", b"x") for index in range(kv.MAX_TXN_OPS)]
    await kv_store.txn([], operations)
    assert len((await kv_store.list("topics/")).items) == kv.MAX_TXN_OPS


def value_filling(kv_store: kv.KVStore, key: str, spare: int = 0) -> bytes:
    """A value whose transaction (a compare and a put of ``key``) is exactly ``spare`` bytes under
    the store's limit, as etcd counts it."""
    size = kv.request_size(kv_store)
    length = size.budget - spare - size.txn_bytes([kv.Compare(key, 0)], [kv.Put(key, b"")])
    # The value's own length prefix grows with it: shrink until the whole request is on the mark.
    while size.txn_bytes([kv.Compare(key, 0)], [kv.Put(key, b"x" * length)]) > size.budget - spare:
        length -= 1
    return b"x" * length


async def test_a_transaction_at_the_request_limit_is_applied(kv_store: kv.KVStore) -> None:
    """Exactly at the limit the store (and a real etcd at its default --max-request-bytes) accepts it."""
    value = value_filling(kv_store, "topics/big")
    size = kv.request_size(kv_store)
    assert size.txn_bytes([kv.Compare("topics/big", 0)], [kv.Put("topics/big", value)]) == size.budget
    await kv_store.txn([kv.Compare("topics/big", 0)], [kv.Put("topics/big", value)])
    assert (await builders.present(kv_store, "topics/big")).value == value


async def test_a_transaction_above_the_request_limit_is_refused_and_writes_nothing(kv_store: kv.KVStore) -> None:
    before = await kv_store.revision()
    value = value_filling(kv_store, "topics/big") + b"x"
    small = kv.Put("topics/small", b"fits")
    with pytest.raises(kv.TooLarge) as raised:
        await kv_store.txn([kv.Compare("topics/big", 0)], [small, kv.Put("topics/big", value)])
    assert isinstance(raised.value, ValueError)  # terminal, like any malformed request
    size = kv.request_size(kv_store)
    assert raised.value.size == size.txn_bytes([kv.Compare("topics/big", 0)], [small, kv.Put("topics/big", value)])
    assert raised.value.limit == kv_store.max_request_bytes == kv.DEFAULT_MAX_REQUEST_BYTES
    assert str(raised.value).startswith(
        f"a request of {raised.value.size} bytes is too large: the store takes at most {size.budget} "
        f"(its limit of {kv.DEFAULT_MAX_REQUEST_BYTES} bytes"
    )
    assert await kv_store.get("topics/small") is None
    assert await kv_store.revision() == before


async def test_a_create_above_the_request_limit_fails_alone(kv_store: kv.KVStore) -> None:
    """Creates sent together (etcd's group commit) are split by size: the one too large fails on
    its own, the others are applied."""
    too_large = b"x" * kv.DEFAULT_MAX_REQUEST_BYTES
    halves = [b"y" * (kv.DEFAULT_MAX_REQUEST_BYTES // 2)] * 3  # fit one by one, not two together
    results = await asyncio.gather(
        kv_store.create("topics/huge", too_large),
        *(kv_store.create(f"topics/half-{index}", value) for index, value in enumerate(halves)),
        return_exceptions=True,
    )
    assert isinstance(results[0], kv.TooLarge)
    assert all(isinstance(result, int) for result in results[1:]), results
    assert await kv_store.get("topics/huge") is None
    assert len((await kv_store.list("topics/half-")).items) == 3
