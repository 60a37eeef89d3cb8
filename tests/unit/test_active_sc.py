"""The active-SC claim on the memory store, on a fast-forwarded loop clock: writes allowed only
while the claim is known to be held, an unreachable store pausing them, a lost lease claimed again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from store import active_sc, kv, memory
from tests import builders


class Flaky(kv.ForwardingStore):
    """The memory store, its lease calls unreachable while ``down``."""

    def __init__(self, inner: memory.MemoryStore) -> None:
        super().__init__(inner)
        self.down = False
        # Keep-alives that take this long and then fail, as etcd's do when its answer does not
        # come within the request budget (5 s by default).
        self.slow_failures = 0
        self.slow_seconds = 5.0
        self.keep_alives: list[float] = []  # when each was asked (loop time)

    def _reach(self) -> None:
        if self.down:
            raise kv.Unavailable("the store is unreachable (the test says so)")

    async def grant_lease(self, ttl: int) -> kv.Lease:
        self._reach()
        return await self.inner.grant_lease(ttl)

    async def keep_alive(self, lease: int) -> int:
        self.keep_alives.append(asyncio.get_running_loop().time())
        self._reach()
        if self.slow_failures:
            self.slow_failures -= 1
            await asyncio.sleep(self.slow_seconds)
            raise kv.Unavailable(f"lease keep-alive failed within {self.slow_seconds} s (the test says so)")
        return await self.inner.keep_alive(lease)

    async def revoke_lease(self, lease: int) -> None:
        self._reach()
        await self.inner.revoke_lease(lease)

    async def claim(self, key: str, value: bytes, lease: int) -> kv.Claim:
        self._reach()
        return await self.inner.claim(key, value, lease)

    async def get(self, key: str) -> kv.KeyValue | None:
        self._reach()
        return await self.inner.get(key)


@pytest.fixture
async def store() -> AsyncIterator[Flaky]:
    flaky = Flaky(memory.MemoryStore())
    yield flaky
    await flaky.close()


async def write(guarded: kv.KVStore, name: str) -> None:
    await guarded.create(f"topics/{name}", b"{}")


@pytest.mark.looptime(start=0)
async def test_writes_pass_only_once_claimed_and_stop_after_release(store: Flaky) -> None:
    active = active_sc.ActiveSc(store, ttl=6)
    guarded = active_sc.GuardedStore(store, active)
    with pytest.raises(kv.Unavailable) as raised:
        await write(guarded, "early")
    assert str(raised.value) == "this SC may not write: it does not hold /sc/meta/active-sc (not claimed yet, or stopping)"
    await active.acquire("127.0.0.1:9003")
    await write(guarded, "claimed")
    held = await store.get(active_sc.KEY)
    assert held is not None and active.identity is not None and held.value == active.identity.encode()
    await active.release()
    assert await store.get(active_sc.KEY) is None
    with pytest.raises(kv.Unavailable):
        await write(guarded, "released")
    assert [item.key for item in (await store.list("topics/")).items] == ["topics/claimed"]


@pytest.mark.looptime(start=0)
async def test_an_unreachable_store_pauses_writes_once_the_lease_may_have_lapsed(store: Flaky) -> None:
    active = active_sc.ActiveSc(store, ttl=6)
    guarded = active_sc.GuardedStore(store, active)
    await active.acquire("127.0.0.1:9003")
    keeper = asyncio.create_task(active.run())
    try:
        await asyncio.sleep(11.0)  # renewed at 2, 4, 6, 8 and 10
        assert active.problem() is None
        store.down = True  # the renewals at 12, 14 and 16 fail
        await asyncio.sleep(4.9)  # 15.9: the lease renewed at 10 is good until 16
        await write(guarded, "before-16")
        await asyncio.sleep(0.2)  # 16.1
        assert active.problem() == (
            "its claim on /sc/meta/active-sc could not be renewed within its 6 s lease (the store is unreachable); "
            "writes are paused until it is renewed"
        )
        with pytest.raises(kv.Unavailable):
            await write(guarded, "after-16")
        store.down = False
        # The store's lease ended at 16 too (its keys went with it): the renewal at 18 finds it
        # gone; the SC steps down, joins the queue again, is first in it and claims the store again.
        epoch = active.epoch
        await asyncio.sleep(2.0)  # 18.1
        assert active.state is active_sc.State.ACTIVE and active.problem() is None
        assert (active.losses, active.step_down_cause, active.term) == (1, "lease-lost", 2)
        assert active.epoch > epoch
        await write(guarded, "again")
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
    assert [item.key for item in (await store.list("topics/")).items] == ["topics/again", "topics/before-16"]


def test_a_holder_is_described_whatever_was_stored() -> None:
    identity = active_sc.Identity("abc", "host-1", 7, "10.0.0.1:9003", "2026-01-05T10:00:00+00:00")
    assert active_sc.describe_holder(identity.encode()) == (
        "SC abc (pid 7 on host host-1, public address 10.0.0.1:9003, active since 2026-01-05T10:00:00+00:00)"
    )
    garbage = b"\xff" * 300
    assert active_sc.describe_holder(garbage) == f"an unknown holder (value {garbage[:60]!r})"
    assert active_sc.describe_holder(b"[1, 2]") == "an unknown holder (value b'[1, 2]')"
    assert active_sc.describe_holder(b'{"id": "x"}') == "an unknown holder (value b'{\"id\": \"x\"}')"


def test_a_lease_shorter_than_two_seconds_is_refused() -> None:
    with pytest.raises(ValueError, match="the active-SC lease must last at least 2 s, got 1"):
        active_sc.ActiveSc(memory.MemoryStore(), ttl=1)


@pytest.mark.looptime(start=0)
async def test_a_keep_alive_that_hangs_is_given_up_and_sent_again_within_the_lease(store: Flaky) -> None:
    """Seen at 100,000 partitions under an offsets flood: one keep-alive took the whole 5 s request
    budget and failed, the next came 3.3 s later, and the 10 s lease had lapsed by then. A renewal
    gets a share of the lease, and is sent again at once while the lease may still be alive."""
    active = active_sc.ActiveSc(store, ttl=6)
    guarded = active_sc.GuardedStore(store, active)
    await active.acquire("127.0.0.1:9003")
    claimed = await store.get(active_sc.KEY)
    keeper = asyncio.create_task(active.run())
    try:
        store.slow_failures = 1  # the renewal at 2 would hang until 7, past the lease's end at 6
        await asyncio.sleep(7.0)
        assert active.state is active_sc.State.ACTIVE and active.problem() is None
        await write(guarded, "still-active")
        assert store.keep_alives[0] == 2.0 and 2.0 < store.keep_alives[1] < 6.0, store.keep_alives
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
    held = await store.get(active_sc.KEY)
    assert held is not None and claimed is not None and held.create_revision == claimed.create_revision


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[]",
        b'{"id": "a", "host": "h", "pid": 1, "address": "x:1"}',  # a field missing
        b'{"id": "a", "host": "h", "pid": 1, "address": "x:1", "started": "t", "more": 1}',  # one too many
        b'{"id": 7, "host": "h", "pid": 1, "address": "x:1", "started": "t"}',  # a number for a text
        b'{"id": "a", "host": "h", "pid": true, "address": "x:1", "started": "t"}',  # a boolean for the pid
        b'{"id": "a", "host": "h", "pid": -1, "address": "x:1", "started": "t"}',
        b'{"id": "' + b"a" * 301 + b'", "host": "h", "pid": 1, "address": "x:1", "started": "t"}',  # too long to show
        b"[" * 100_000 + b"]" * 100_000,  # nested deeper than the JSON parser recurses
        b"\xff\xfe",  # not UTF-8
    ],
)
def test_a_claim_value_no_sc_wrote_is_not_an_identity(value: bytes) -> None:
    assert active_sc.Identity.decode(value) is None
    assert active_sc.describe_holder(value)  # described for a person, whatever it is, without raising


def test_an_identity_reads_back_as_written() -> None:
    identity = active_sc.Identity("abc123", "host-1", 4242, "10.0.0.1:9003", "2026-11-27T00:00:00+00:00")
    assert active_sc.Identity.decode(identity.encode()) == identity


async def test_a_deposed_sc_s_writes_are_refused_by_the_store_whatever_it_believes(kv_store: kv.KVStore) -> None:
    """SC A holds the claim and believes it still does (a pause or a partition kept it from
    hearing otherwise: its lease is not checked again here); meanwhile its claim went and SC B
    claimed the store. Every kind of write A sends is refused by the store itself, counted, and
    changes nothing; A knows it lost the claim. B writes as usual."""
    backend = kv_store
    a, b = active_sc.ActiveSc(backend, ttl=10), active_sc.ActiveSc(backend, ttl=10)
    await a.acquire("sc-a:9003")
    as_a, as_b = active_sc.GuardedStore(backend, a), active_sc.GuardedStore(backend, b)
    kept = await as_a.create("topics/kept", b"A's, while it led")
    # A's claim goes behind its back (its lease revoked, as an expiry would), and B claims the store.
    assert a._lease is not None
    await backend.revoke_lease(a._lease)
    await b.acquire("sc-b:9003")
    try:
        assert a.state is active_sc.State.ACTIVE and a.leading  # A has not noticed anything
        before = await backend.revision()
        writes = [
            lambda: as_a.create("topics/new", b"A's"),
            lambda: as_a.update("topics/kept", b"A's again", kept),
            lambda: as_a.delete("topics/kept", kept),
            lambda: as_a.delete("topics/kept"),
            lambda: as_a.txn([kv.Compare("topics/kept", kept)], [kv.Put("topics/kept", b"A's"), kv.Delete("topics/other")]),
        ]
        with pytest.raises(active_sc.Fenced, match="is not its own any more"):
            await writes[0]()
        assert (a.state, a.leading, a.fenced_writes, a.losses) == (active_sc.State.LOST, False, 1, 1)
        # Once A knows, it refuses its writes itself (plain Unavailable), without asking the store.
        for write in writes[1:]:
            with pytest.raises(kv.Unavailable):
                await write()
        assert await backend.revision() == before
        assert (await builders.present(backend, "topics/kept")).value == b"A's, while it led"
        # B, the store's active SC now, writes.
        assert await as_b.update("topics/kept", b"B's", kept) > before
    finally:
        await b.release()
        await a.release()


async def test_each_kind_of_write_carries_the_fence(kv_store: kv.KVStore) -> None:
    """Refused by the store, not by A's own belief: A never learns of the loss before each write."""
    backend = kv_store
    kept = await backend.create("topics/kept", b"before")
    writes = {
        "create": lambda guarded: guarded.create("topics/new", b"x"),
        "update": lambda guarded: guarded.update("topics/kept", b"x", kept),
        "delete at a revision": lambda guarded: guarded.delete("topics/kept", kept),
        "delete": lambda guarded: guarded.delete("topics/kept"),
        "txn": lambda guarded: guarded.txn([], [kv.Put("topics/new", b"x")]),
    }
    for name, write in writes.items():
        a = active_sc.ActiveSc(backend, ttl=10)
        await a.acquire(f"sc-{name}:9003")
        assert a._lease is not None
        await backend.revoke_lease(a._lease)  # the claim is gone; A believes it holds it
        before = await backend.revision()
        with pytest.raises(active_sc.Fenced):
            await write(active_sc.GuardedStore(backend, a))
        assert (await backend.revision(), a.fenced_writes) == (before, 1), name
        await a.release()


# ---------------------------------------------------------------------------- the election


async def until(condition: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    """Wait for ``condition`` (checked at each change of the loop), failing after ``limit`` seconds."""
    deadline = asyncio.get_running_loop().time() + limit
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {limit} s: {what}"
        await asyncio.sleep(0.02)


class Candidates:
    """SCs on one store, each joined and running its claim's task (stopped with kill or release)."""

    def __init__(self, backend: kv.KVStore) -> None:
        self.backend = backend
        self.scs: list[active_sc.ActiveSc] = []
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def start(self, name: str) -> active_sc.ActiveSc:
        sc = active_sc.ActiveSc(self.backend, ttl=2)
        await sc.join(f"{name}:9003", f"{name}:9004")
        self.scs.append(sc)
        self.tasks[id(sc)] = asyncio.create_task(sc.run())
        return sc

    async def kill(self, sc: active_sc.ActiveSc) -> None:
        """Stop its task without giving anything up, as a crash does: its lease lapses on its own."""
        task = self.tasks.pop(id(sc))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def release(self, sc: active_sc.ActiveSc) -> None:
        await self.kill(sc)
        await sc.release()

    async def close(self) -> None:
        for sc in list(self.scs):
            if id(sc) in self.tasks:
                await self.release(sc)

    def leaders(self) -> list[active_sc.ActiveSc]:
        return [sc for sc in self.scs if sc.state is active_sc.State.ACTIVE]


@pytest.fixture
async def candidates(kv_store: kv.KVStore) -> AsyncIterator[Candidates]:
    group = Candidates(kv_store)
    try:
        yield group
    finally:
        await group.close()


async def test_candidates_queue_by_create_revision_and_the_first_in_line_leads(candidates: Candidates) -> None:
    """Three SCs on one store: the first to join leads, the others are standbys in join order; each
    resignation hands the claim to the next in line, which records that its predecessor resigned."""
    a, b, c = [await candidates.start(name) for name in ("sc-a", "sc-b", "sc-c")]
    await until(lambda: candidates.leaders() == [a], "sc-a leads")
    assert (b.state, c.state) == (active_sc.State.STANDBY, active_sc.State.STANDBY)
    listed = await candidates.backend.list(active_sc.CANDIDATES)
    by_revision = sorted(listed.items, key=lambda item: item.create_revision)
    assert [item.key for item in by_revision] == [active_sc.candidate_key(sc.identity.id) for sc in (a, b, c) if sc.identity]
    claim = await builders.present(candidates.backend, active_sc.KEY)
    assert a.identity is not None and claim.value == a.identity.encode() and a.epoch == claim.create_revision
    assert a.takeover is not None and (a.takeover.cause, a.takeover.previous, a.term) == ("unclaimed", None, 1)

    await candidates.release(a)
    await until(lambda: candidates.leaders() == [b], "sc-b leads once sc-a resigned")
    assert c.state is active_sc.State.STANDBY
    assert b.takeover is not None and b.takeover.previous == a.identity
    assert (b.takeover.cause, b.takeover.previous_epoch) == ("resigned", a.epoch)
    assert b.epoch > a.epoch

    await candidates.release(b)
    await until(lambda: candidates.leaders() == [c], "sc-c leads once sc-b resigned")
    assert c.takeover is not None and (c.takeover.cause, c.takeover.previous) == ("resigned", b.identity)


async def test_a_standby_takes_over_when_the_leader_s_lease_expires(candidates: Candidates) -> None:
    a, b = [await candidates.start(name) for name in ("sc-a", "sc-b")]
    await until(lambda: candidates.leaders() == [a], "sc-a leads")
    await candidates.kill(a)  # no keep-alive any more: its claim and candidacy end with its lease
    await until(lambda: b.state is active_sc.State.ACTIVE, "sc-b leads once sc-a's lease expired")
    assert b.takeover is not None and (b.takeover.cause, b.takeover.previous) == ("lease-expired", a.identity)
    assert await candidates.backend.get(active_sc.candidate_key(a.identity.id if a.identity else "")) is None


async def test_a_leader_that_lost_its_claim_steps_down_and_queues_again_behind_the_standby(
    candidates: Candidates,
) -> None:
    """Its claim deleted behind its back: it finds out at its next renewal, steps down (its writes
    refused), and joins the queue at its end; the standby, first now, takes over."""
    a, b = [await candidates.start(name) for name in ("sc-a", "sc-b")]
    await until(lambda: candidates.leaders() == [a], "sc-a leads")
    guarded = active_sc.GuardedStore(candidates.backend, a)
    await write(guarded, "while-leading")
    old_epoch = a.epoch
    await candidates.backend.delete(active_sc.KEY)
    await until(lambda: candidates.leaders() == [b], "sc-b leads once sc-a stepped down")
    await until(lambda: a.state is active_sc.State.STANDBY, "sc-a is a standby again")
    assert (a.losses, a.step_down_cause, a.term) == (1, "claim-deleted", 1)
    assert b.takeover is not None and (b.takeover.cause, b.takeover.previous_epoch) == ("claim-deleted", old_epoch)
    with pytest.raises(kv.Unavailable, match="it is a standby"):
        await write(guarded, "after-stepping-down")
    listed = await candidates.backend.list(active_sc.CANDIDATES)
    assert [item.key for item in sorted(listed.items, key=lambda item: item.create_revision)] == [
        active_sc.candidate_key(sc.identity.id) for sc in (b, a) if sc.identity
    ]


async def test_a_candidate_key_no_sc_wrote_does_not_hold_the_queue_up(candidates: Candidates) -> None:
    """Anyone who can write the store can write under meta/sc-candidates/: what is not an identity
    named by its key is no candidate, even first in line."""
    await candidates.backend.create(f"{active_sc.CANDIDATES}zz", b"not an identity")
    impostor = active_sc.Identity("someone", "h", 1, "x:1", "t")
    await candidates.backend.create(f"{active_sc.CANDIDATES}other-name", impostor.encode())
    a = await candidates.start("sc-a")
    await until(lambda: candidates.leaders() == [a], "sc-a leads")
    assert a.identity is not None
    assert [candidate.identity.id for candidate in a.candidates] == [a.identity.id]  # as read before it claimed
    assert active_sc.queue({f"{active_sc.CANDIDATES}zz": (b"[]", 1)}) == []


async def test_an_identity_no_lease_holds_keeps_no_sc_from_leading(candidates: Candidates) -> None:
    """A well-formed identity written without a lease (by hand, or copied from another cluster by a
    tool that does not copy leases, such as `etcdctl make-mirror`) never goes away by itself: as a
    candidate first in line, or as the claim, it kept every SC a standby for good. A candidate no
    lease holds is no candidate; a claim no lease holds is no SC's, and the first candidate deletes
    it (compared on its revision) and claims."""
    ghost = active_sc.Identity("ghost", "old-host", 1, "10.0.0.9:9003", "2020-01-01T00:00:00+00:00")
    await candidates.backend.create(active_sc.candidate_key("ghost"), ghost.encode())
    await candidates.backend.create(active_sc.KEY, ghost.encode())
    a = await candidates.start("sc-a")
    await until(lambda: candidates.leaders() == [a], "sc-a leads")
    assert a.identity is not None and [candidate.identity.id for candidate in a.candidates] == [a.identity.id]
    claim = await builders.present(candidates.backend, active_sc.KEY)
    assert claim.value == a.identity.encode() and claim.lease != 0
    assert a.takeover is not None and (a.takeover.cause, a.takeover.previous) == ("claim-deleted", ghost)
    # The candidacy no lease holds is gone too: it is listed nowhere as a standby.
    assert await candidates.backend.get(active_sc.candidate_key("ghost")) is None


def test_an_identity_with_its_private_address_reads_back_as_written() -> None:
    identity = active_sc.Identity("abc123", "host-1", 4242, "10.0.0.1:9003", "2026-11-27T00:00:00+00:00", "10.0.0.1:9004")
    assert active_sc.Identity.decode(identity.encode()) == identity
    assert b'"private":"10.0.0.1:9004"' in identity.encode()


class LostAnswers(kv.ForwardingStore):
    """The memory store, where the next claims of ``key`` are applied but their answers lost."""

    def __init__(self, inner: kv.KVStore, key: str, lost: int) -> None:
        super().__init__(inner)
        self.key = key
        self.lost = lost

    async def claim(self, key: str, value: bytes, lease: int) -> kv.Claim:
        claimed = await self.inner.claim(key, value, lease)
        if key == self.key and self.lost:
            self.lost -= 1
            raise kv.Unavailable("the claim's answer was lost (the test says so)")
        return claimed


@pytest.mark.looptime(start=0)
async def test_a_claim_whose_answer_was_lost_is_taken_not_waited_on() -> None:
    """etcd may apply a transaction whose answer never came back: the claim is this SC's own, under
    its lease, and would never end while it waits for it to."""
    backend = memory.MemoryStore()
    store = LostAnswers(backend, active_sc.KEY, lost=1)
    sc = active_sc.ActiveSc(store, ttl=3)
    await sc.join("sc-a:9003")
    task = asyncio.create_task(sc.run())
    try:
        await until(lambda: sc.state is active_sc.State.ACTIVE, "sc-a leads")
        claim = await builders.present(backend, active_sc.KEY)
        assert (sc.epoch, sc.term, store.lost) == (claim.create_revision, 1, 0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sc.release()
        await backend.close()


async def test_a_standby_whose_candidate_key_was_deleted_joins_the_queue_again(candidates: Candidates) -> None:
    a, b = [await candidates.start(name) for name in ("sc-a", "sc-b")]
    await until(lambda: candidates.leaders() == [a], "sc-a leads")
    assert b.identity is not None
    first = await builders.present(candidates.backend, active_sc.candidate_key(b.identity.id))
    await candidates.backend.delete(active_sc.candidate_key(b.identity.id))

    async def back() -> None:
        again = await candidates.backend.get(active_sc.candidate_key(b.identity.id if b.identity else ""))
        assert again is not None and again.create_revision > first.create_revision

    await builders.eventually(back)
    await until(lambda: b.state is active_sc.State.STANDBY, "sc-b a standby again")
    assert (a.state, b.losses) == (active_sc.State.ACTIVE, 0)


def test_what_ended_each_claim_is_read_from_the_watch_in_revision_order() -> None:
    """Two claims may come and go between two looks of a standby: the watch's events, one revision
    at a time, still say which claim came last before this SC's and how it ended."""
    sc = active_sc.ActiveSc(memory.MemoryStore(), ttl=2)
    a, b, c = (active_sc.Identity(name, "h", 1, f"{name}:9003", "t") for name in ("a", "b", "c"))
    put, delete = kv.EventType.PUT, kv.EventType.DELETE
    events = [
        kv.WatchEvent(put, active_sc.KEY, a.encode(), 5, 5),
        # a's lease ends: its claim and its candidacy go in one revision.
        kv.WatchEvent(delete, active_sc.KEY, None, 7),
        kv.WatchEvent(delete, active_sc.candidate_key("a"), None, 7),
        kv.WatchEvent(put, active_sc.KEY, b.encode(), 8, 8),
    ]
    for event in events:
        sc._follow_claim(event)
    assert sc._ended is not None and (sc._ended[0].value, sc._ended[0].create_revision, sc._ended[1]) == (a.encode(), 5, "lease-expired")
    # b resigns (its note in the same transaction), c claims.
    for event in [
        kv.WatchEvent(delete, active_sc.KEY, None, 9),
        kv.WatchEvent(delete, active_sc.candidate_key("b"), None, 9),
        kv.WatchEvent(put, active_sc.RESIGNED_KEY, b'{"id":"b","epoch":8}', 9, 9),
        kv.WatchEvent(put, active_sc.KEY, c.encode(), 10, 10),
    ]:
        sc._follow_claim(event)
    assert sc._ended is not None and (sc._ended[0].value, sc._ended[1]) == (b.encode(), "resigned")
    assert sc._seen_revision == 10
    # c's claim deleted by hand, its candidacy still there; a later revision closes it.
    for event in [
        kv.WatchEvent(delete, active_sc.KEY, None, 11),
        kv.WatchEvent(put, f"{active_sc.CANDIDATES}d", b"{}", 12, 12),
    ]:
        sc._follow_claim(event)
    assert sc._ended is not None and (sc._ended[0].value, sc._ended[1]) == (c.encode(), "claim-deleted")


@pytest.mark.etcd
async def test_creates_sent_together_through_the_guard_share_one_etcd_transaction(etcd_store: kv.KVStore) -> None:
    """The API's burst of topic creates is one etcd transaction (group commit) under the fence,
    not one each; and a deposed SC's burst is refused as a whole, counted once per create."""
    active = active_sc.ActiveSc(etcd_store, ttl=10)
    await active.acquire("sc-burst:9003")
    guarded = active_sc.GuardedStore(etcd_store, active)
    try:
        revisions = await asyncio.gather(*(guarded.create(f"topics/together-{index}", b"x") for index in range(20)))
        assert len(set(revisions)) == 1
        assert active._lease is not None
        await etcd_store.revoke_lease(active._lease)  # the claim is gone; this SC believes it holds it
        before = await etcd_store.revision()
        refused = await asyncio.gather(
            *(guarded.create(f"topics/late-{index}", b"x") for index in range(5)), return_exceptions=True
        )
        assert all(isinstance(outcome, active_sc.Fenced) for outcome in refused), refused
        assert (await etcd_store.revision(), active.fenced_writes) == (before, 5)
    finally:
        await active.release()


async def test_the_candidates_watch_after_a_store_lost_what_it_delivered_resumes_from_the_store_s_revision() -> None:
    """HistoryLost (etcd came back without changes the watch delivered): resuming where it was would
    raise it again at every try, and skip the changes etcd gave those revisions to. The watch starts
    again after the store's revision, and the campaign reads everything again."""

    class LosingWatch:
        prefix = "/"

        def __init__(self) -> None:
            self.starts: list[int] = []

        async def watch(self, prefix: str, from_revision: int) -> AsyncIterator[kv.WatchEvent]:
            self.starts.append(from_revision)
            if len(self.starts) == 1:
                raise kv.HistoryLost(delivered=40, revision=30)
            await asyncio.Event().wait()  # nothing more happens
            nothing: tuple[kv.WatchEvent, ...] = ()
            for event in nothing:  # an async generator that yields nothing
                yield event

    store = LosingWatch()
    sc = active_sc.ActiveSc(store)  # type: ignore[arg-type]  # only watch is used here
    changed = asyncio.Event()
    task = asyncio.create_task(sc._watch(41, changed))
    try:
        await until(lambda: len(store.starts) == 2, "the watch started again")
        assert store.starts == [41, 31] and changed.is_set()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.looptime(start=0)
async def test_a_term_s_writes_are_refused_once_another_term_began(store: Flaky) -> None:
    """A term's pipeline writes through ``for_term``: when this SC loses the claim and wins it
    again, a write the old term decided is refused even though the new claim would pass the store's
    fence (it compares this SC's current claim)."""
    active = active_sc.ActiveSc(store, ttl=6)
    guarded = active_sc.GuardedStore(store, active)
    await active.acquire("127.0.0.1:9003")
    first = guarded.for_term(active.term)
    await write(first, "first-term")
    await active.release()
    await active.acquire("127.0.0.1:9003")
    assert active.term == 2
    with pytest.raises(kv.Unavailable) as raised:
        await write(first, "decided-in-the-first-term")
    assert str(raised.value) == "this SC may not write: the write was decided in its term 1, which ended (term 2 now)"
    await write(guarded.for_term(2), "second-term")
    await write(guarded, "the-api")  # not bound to a term
    assert sorted(item.key for item in (await store.list("topics/")).items) == [
        "topics/first-term", "topics/second-term", "topics/the-api"
    ]


@pytest.mark.looptime(start=0)
async def test_a_claim_is_believed_held_only_as_long_as_the_lease_it_is_under(store: Flaky) -> None:
    """A standby's lease runs from its last renewal etcd answered, not from when it claims: one
    whose renewals failed since it joined at 0 claims at 3.2, and its lease (so its claim) ends at
    6, as it then believes too. Before, it believed the claim held until 9.2 (its writes were
    still refused by the store's fence, but it went on answering as the leader)."""
    a, b = active_sc.ActiveSc(store, ttl=6), active_sc.ActiveSc(store, ttl=6)
    await a.acquire("127.0.0.1:9003")
    await b.join("127.0.0.1:9013")  # its lease is granted at 0
    store.slow_failures = 100  # every renewal from now on hangs for 5 s, then fails
    campaign = asyncio.create_task(b.run())
    try:
        await asyncio.sleep(2.5)
        await a.release()
        await asyncio.sleep(1.0)  # b's renewal sent at 2 gives up at 3.2; then it looks, and claims
        assert b.state is active_sc.State.ACTIVE and b.problem() is None
        await asyncio.sleep(6.0 - 3.5 - 0.1)  # 5.9
        assert b.problem() is None
        await asyncio.sleep(0.2)  # 6.1
        assert b.problem() is not None
    finally:
        campaign.cancel()
        await asyncio.gather(campaign, return_exceptions=True)
