"""The active-SC claim on the memory store, on a fast-forwarded loop clock: writes allowed only
while the claim is known to be held, an unreachable store pausing them, a lost lease claimed again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from store import active_sc, kv, memory


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
        # The store's lease ended at 16 too (its key went with it): the renewal at 18 finds it
        # gone, and the one at 20 claims the store again.
        await asyncio.sleep(2.0)  # 18.1
        assert active.state is active_sc.State.LOST
        await asyncio.sleep(2.0)  # 20.1
        assert active.state is active_sc.State.ACTIVE and active.problem() is None
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
    ],
)
def test_a_claim_value_no_sc_wrote_is_not_an_identity(value: bytes) -> None:
    assert active_sc.Identity.decode(value) is None


def test_an_identity_reads_back_as_written() -> None:
    identity = active_sc.Identity("abc123", "host-1", 4242, "10.0.0.1:9003", "2026-11-27T00:00:00+00:00")
    assert active_sc.Identity.decode(identity.encode()) == identity
