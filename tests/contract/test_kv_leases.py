"""The KV contract's leases, run against the memory backend AND a real etcd (the `kv_store` fixture):
claim, keep alive, revoke, expiry, and a key detached by a later write."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from store import kv
from tests import builders
from tests.contract.test_kv_contract import summary, take


async def test_the_first_claim_wins_and_a_second_one_is_told_the_holder(kv_store: kv.KVStore) -> None:
    first = await kv_store.grant_lease(10)
    second = await kv_store.grant_lease(10)
    assert first.id != second.id and first.ttl >= 10 and second.ttl >= 10
    won = await kv_store.claim("meta/active-sc", b"first", first.id)
    revision = won.current.mod_revision
    assert won == kv.Claim(True, kv.KeyValue("meta/active-sc", b"first", revision, revision, first.id))
    assert await kv_store.get("meta/active-sc") == won.current
    lost = await kv_store.claim("meta/active-sc", b"second", second.id)
    assert lost == kv.Claim(False, won.current)
    # The winner claiming again (a retry) does not rewrite it, and sees it as its own.
    assert await kv_store.claim("meta/active-sc", b"first", first.id) == kv.Claim(True, won.current)
    assert await kv_store.revision() == revision
    await kv_store.revoke_lease(first.id)
    await kv_store.revoke_lease(second.id)


async def test_revoking_deletes_the_claimed_keys_at_one_revision_and_ends_the_lease(kv_store: kv.KVStore) -> None:
    lease = await kv_store.grant_lease(10)
    first = (await kv_store.claim("meta/a", b"x", lease.id)).current.mod_revision
    await kv_store.claim("meta/b", b"y", lease.id)
    async with contextlib.aclosing(kv_store.watch("meta/", first)) as events:
        assert summary(await take(events, 2)) == [("PUT", "meta/a", b"x"), ("PUT", "meta/b", b"y")]
        await kv_store.revoke_lease(lease.id)
        deleted = await take(events, 2)
    assert summary(deleted) == [("DELETE", "meta/a", None), ("DELETE", "meta/b", None)]
    assert deleted[0].revision == deleted[1].revision
    assert (await kv_store.list("meta/")).items == []
    with pytest.raises(kv.LeaseExpired) as raised:
        await kv_store.keep_alive(lease.id)
    assert raised.value.lease == lease.id and str(raised.value) == f"lease {lease.id:x} has expired or was revoked"
    await kv_store.revoke_lease(lease.id)  # already gone: no error


async def test_a_claim_under_a_lease_that_is_gone_raises_and_writes_nothing(kv_store: kv.KVStore) -> None:
    lease = await kv_store.grant_lease(10)
    await kv_store.revoke_lease(lease.id)
    before = await kv_store.revision()
    with pytest.raises(kv.LeaseExpired):
        await kv_store.claim("meta/active-sc", b"late", lease.id)
    assert await kv_store.get("meta/active-sc") is None and await kv_store.revision() == before


async def test_keeping_a_lease_alive_answers_its_ttl(kv_store: kv.KVStore) -> None:
    lease = await kv_store.grant_lease(10)
    await kv_store.claim("meta/active-sc", b"kept", lease.id)
    assert [await kv_store.keep_alive(lease.id) for _ in range(3)] == [lease.ttl] * 3
    assert (await builders.present(kv_store, "meta/active-sc")).value == b"kept"
    await kv_store.revoke_lease(lease.id)


async def test_a_lease_not_kept_alive_expires_and_takes_its_key_with_it(kv_store: kv.KVStore) -> None:
    lease = await kv_store.grant_lease(1)  # etcd may grant a little more (its minimum TTL)
    claimed = await kv_store.claim("meta/active-sc", b"gone soon", lease.id)
    async with contextlib.aclosing(kv_store.watch("meta/", claimed.current.mod_revision + 1)) as events:
        assert summary(await take(events, 1, timeout=30)) == [("DELETE", "meta/active-sc", None)]
    with pytest.raises(kv.LeaseExpired):
        await kv_store.keep_alive(lease.id)
    with pytest.raises(kv.LeaseExpired):
        await kv_store.claim("meta/active-sc", b"again", lease.id)


async def test_a_write_of_the_key_without_the_lease_detaches_it(kv_store: kv.KVStore) -> None:
    lease = await kv_store.grant_lease(10)
    claimed = await kv_store.claim("meta/active-sc", b"leased", lease.id)
    rewritten = await kv_store.update("meta/active-sc", b"plain", claimed.current.mod_revision)
    await kv_store.revoke_lease(lease.id)
    assert await kv_store.get("meta/active-sc") == kv.KeyValue(
        "meta/active-sc", b"plain", rewritten, claimed.current.create_revision
    )


async def test_a_read_names_the_lease_a_key_is_held_under(kv_store: kv.KVStore) -> None:
    """0 for a key no lease holds: what tells an SC's claim or candidacy (always leased) from an
    identity written there by hand or copied without its lease, which would never go away."""
    lease = await kv_store.grant_lease(10)
    await kv_store.claim("meta/leased", b"x", lease.id)
    await kv_store.create("meta/plain", b"y")
    assert (await builders.present(kv_store, "meta/leased")).lease == lease.id
    assert (await builders.present(kv_store, "meta/plain")).lease == 0
    assert [(item.key, item.lease) for item in (await kv_store.list("meta/")).items] == [("meta/leased", lease.id), ("meta/plain", 0)]
    await kv_store.revoke_lease(lease.id)


async def test_a_lease_shorter_than_a_second_is_refused(kv_store: kv.KVStore) -> None:
    with pytest.raises(ValueError, match="a lease lasts at least 1 second, got a TTL of 0"):
        await kv_store.grant_lease(0)


async def test_many_claimants_one_winner(kv_store: kv.KVStore) -> None:
    leases = [await kv_store.grant_lease(10) for _ in range(5)]
    claims = await asyncio.gather(
        *(kv_store.claim("meta/leader", f"sc-{index}".encode(), lease.id) for index, lease in enumerate(leases))
    )
    winners = [claim for claim in claims if claim.won]
    assert len(winners) == 1
    assert all(claim.current == winners[0].current for claim in claims)
    for lease in leases:
        await kv_store.revoke_lease(lease.id)
