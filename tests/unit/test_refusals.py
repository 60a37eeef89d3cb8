"""The connection manager's pure helpers for refused SPU connections: log hygiene, loopback peers."""

from __future__ import annotations

from pathlib import Path

import pytest

from connection_manager import health, lrs, server, wire
from controller import daemon
from store import local


def test_a_refusal_is_logged_once_per_cause_and_peer_per_interval_with_the_repeats_counted() -> None:
    refusals = server.RefusalLog(interval=60.0)
    assert refusals.due("already-connected", "127.0.0.1", 0.0) == 0
    assert [refusals.due("already-connected", "127.0.0.1", at) for at in (1.0, 30.0, 59.9)] == [None, None, None]
    # Another cause, or another peer, is news of its own.
    assert refusals.due("unauthorized", "127.0.0.1", 2.0) == 0
    assert refusals.due("already-connected", "127.0.0.2", 3.0) == 0
    # The interval is over: logged again, with the three repeats not logged.
    assert refusals.due("already-connected", "127.0.0.1", 60.0) == 3
    assert refusals.due("already-connected", "127.0.0.1", 61.0) is None
    assert refusals.due("already-connected", "127.0.0.1", 125.0) == 1


def test_refusals_from_many_peers_are_remembered_up_to_a_bound() -> None:
    refusals = server.RefusalLog(interval=60.0, max_keys=3)
    for index in range(5):
        assert refusals.due("unauthorized", f"10.0.0.{index}", float(index)) == 0
    # The oldest were forgotten (so they are logged again), the newest are still quiet.
    assert refusals.due("unauthorized", "10.0.0.0", 6.0) == 0
    assert refusals.due("unauthorized", "10.0.0.4", 6.0) is None


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.7", False),
        ("::ffff:192.0.2.7", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # a name is not an address: refused rather than resolved
        ("", False),
        (None, False),
    ],
)
def test_only_loopback_addresses_count_as_this_host(peer: str | None, loopback: bool) -> None:
    assert server.is_loopback(peer) is loopback


@pytest.mark.parametrize("presented", [None, "short", "s" * 31, "s" * 33, "s" * 32, "t" * 500])
def test_a_wrong_spu_token_is_refused_comparing_equal_lengths_whatever_its_length(
    presented: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compare_digest returns at once on inputs of different lengths: comparing the token itself
    would tell a client how long the SPU token is. Digests are compared instead, as on the public port."""
    compared: list[tuple[int, int]] = []
    real_compare = server.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real_compare(a, b)

    monkeypatch.setattr(server.hmac, "compare_digest", recording)
    manager = server.ConnectionManager(local.LocalStore(), health.HealthView(0.0), lrs.LiveReplicas(), tokens=("k" * 32,))
    refusal = manager._token_refusal(wire.Register(spu_id=1, token=presented))
    assert refusal is not None and refusal[0] == "unauthorized"
    assert compared and all(first == second for first, second in compared)


NEW_TOKEN, OLD_TOKEN = "new-token-0123456789", "old-token-0123456789"


@pytest.mark.parametrize("presented", [NEW_TOKEN, OLD_TOKEN, "wrong-token-0123456", None])
def test_any_listed_spu_token_is_accepted_each_compared_whichever_matches(
    presented: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a rotation two tokens are listed: every one is compared, so how long the check takes
    does not tell which one matched (nor that the first did)."""
    compared: list[bytes] = []
    real_compare = server.hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real_compare(a, b)

    monkeypatch.setattr(server.hmac, "compare_digest", recording)
    manager = server.ConnectionManager(
        local.LocalStore(), health.HealthView(0.0), lrs.LiveReplicas(), tokens=(NEW_TOKEN, OLD_TOKEN)
    )
    refusal = manager._token_refusal(wire.Register(spu_id=1, token=presented))
    assert (refusal is None) is (presented in (NEW_TOKEN, OLD_TOKEN)), refusal
    assert refusal is None or refusal[0] == "unauthorized"
    assert len(compared) == 2 and len(set(compared)) == 2


def test_new_spu_tokens_apply_to_the_next_registration() -> None:
    manager = server.ConnectionManager(local.LocalStore(), health.HealthView(0.0), lrs.LiveReplicas(), tokens=(OLD_TOKEN,))
    manager.set_tokens((NEW_TOKEN, OLD_TOKEN))
    assert manager._token_refusal(wire.Register(spu_id=1, token=OLD_TOKEN)) is None
    assert manager._token_refusal(wire.Register(spu_id=1, token=NEW_TOKEN)) is None
    manager.set_tokens((NEW_TOKEN,))
    refusal = manager._token_refusal(wire.Register(spu_id=1, token=OLD_TOKEN))
    assert refusal is not None and refusal[0] == "unauthorized"
    assert manager._token_refusal(wire.Register(spu_id=1, token=NEW_TOKEN)) is None


async def test_a_spu_token_file_that_does_not_load_again_keeps_the_tokens_loaded_before(tmp_path: Path) -> None:
    token_file = tmp_path / "spu-token"
    token_file.write_text(f"{NEW_TOKEN}\n{OLD_TOKEN}\n")
    manager = server.ConnectionManager(local.LocalStore(), health.HealthView(0.0), lrs.LiveReplicas(), tokens=(OLD_TOKEN,))
    reloadable = daemon.SpuTokenFile(token_file, manager)
    assert await reloadable.reload() and manager.tokens == (NEW_TOKEN, OLD_TOKEN)
    # Seventeen tokens (a file pasted into by mistake): refused, the two before stay.
    token_file.write_text("".join(f"token-{index:02}-0123456789\n" for index in range(17)))
    assert not await reloadable.reload() and reloadable.failures == 1
    assert manager.tokens == (NEW_TOKEN, OLD_TOKEN)
    assert manager._token_refusal(wire.Register(spu_id=1, token=OLD_TOKEN)) is None
    refusal = manager._token_refusal(wire.Register(spu_id=1, token="token-00-0123456789"))
    assert refusal is not None and refusal[0] == "unauthorized"
